// The mount's session and event loop: mount, the /dev/fuse descriptor waited
// on with Asio, the operations in flight counted so that the session goes
// only after their answers. The operations are in fuse_ops.cc.
#include "fuse/fuse_mount.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "fuse/fuse_impl.h"
#include "siphon/status.h"

namespace siphon::fuse {

namespace asio = net::asio;

uint32_t ioSize(uint32_t agent_max_read) {
  constexpr uint32_t kPage = 4096;
  const uint32_t pages = agent_max_read / kPage * kPage;
  return pages >= kPage ? std::min(kMaxIo, pages) : kMaxIo;
}

bool pipeHoldsRead(uint32_t io) {
  // libfuse sizes its pipe to the read plus a page per buffer and header
  // (fuse_send_data_iov); a read comes in two buffers per part, and a
  // part per agent read: 16 pages cover a read of up to 7 parts.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  const bool ok = ::fcntl(fds[0], F_SETPIPE_SZ, static_cast<int>(io + 16 * 4096)) >= 0;
  ::close(fds[0]);
  ::close(fds[1]);
  return ok;
}

// A mount point as /proc/self/mountinfo writes it: space, tab, newline
// and backslash as octal escapes.
std::string mountinfoEscape(std::string_view path) {
  std::string out;
  for (const char c : path) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\\') {
      const auto u = static_cast<unsigned char>(c);
      out += '\\';
      out += static_cast<char>('0' + (u >> 6));
      out += static_cast<char>('0' + ((u >> 3) & 7));
      out += static_cast<char>('0' + (u & 7));
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

// Calls `each(mountpoint, device, fstype)` for every line of
// /proc/self/mountinfo, the mount point as the file escapes it; false
// when the file could not be read.
template <typename Each>
bool forEachMount(Each each) {
  std::ifstream in("/proc/self/mountinfo");
  if (!in) return false;
  std::string line;
  while (std::getline(in, line)) {
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE ...
    std::vector<std::string_view> f;
    for (std::string_view rest = line; !rest.empty();) {
      const size_t sp = rest.find(' ');
      f.push_back(rest.substr(0, sp));
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
    }
    if (f.size() < 5) continue;
    auto dash = std::find(f.begin() + 5, f.end(), "-");
    if (dash == f.end() || dash + 1 == f.end()) continue;
    each(f[4], f[2], *(dash + 1));
  }
  return true;
}

}  // namespace

std::optional<MountEntry> lastMountAt(const std::string& path) {
  const std::string want = mountinfoEscape(path);
  std::optional<MountEntry> last;
  forEachMount([&](std::string_view at, std::string_view device, std::string_view fstype) {
    if (at == want) last = MountEntry{std::string(device), std::string(fstype)};
  });
  return last;
}

bool mountedHere(const std::string& device) {
  bool found = false;
  const bool read =
      forEachMount([&](std::string_view, std::string_view dev, std::string_view fstype) {
        found = found || (dev == device && fstype == "fuse.siphon");
      });
  return found || !read;  // unreadable (no descriptor left, say): not known to be gone
}

namespace {

// `path` made absolute with its directory's symlinks resolved, as
// mountinfo names mount points, without a lookup of `path` itself (a dead
// mount answers that with ENOTCONN). "" when its directory cannot be.
std::string mountPathOf(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  const std::string parent = p.has_parent_path() ? p.parent_path().string() : ".";
  char* real = ::realpath(parent.c_str(), nullptr);
  if (real == nullptr) return "";
  std::string out = real;
  std::free(real);
  if (out.back() != '/') out += '/';
  return out + p.filename().string();
}

}  // namespace

absl::Status detachMount(const std::string& abs) {
  if (geteuid() == 0) {
    if (::umount2(abs.c_str(), MNT_DETACH) != 0) return errnoStatus(errno, "umount " + abs);
    return absl::OkStatus();
  }
  const char* argv[] = {"fusermount3", "-u", "-z", "-q", abs.c_str(), nullptr};
  // 0, 1 and 2 only: siphon's sockets are not close-on-exec (exec/fds.h).
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, "fusermount3", &actions, nullptr,
                                 const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return errnoStatus(err, "running fusermount3 -u -z");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::FailedPreconditionError("fusermount3 -u -z failed");
  }
  return absl::OkStatus();
}

absl::Status checkMountpoint(const std::string& path, std::string* reclaimed) {
  if (path.empty()) return absl::InvalidArgumentError("no mountpoint given");
  struct statx stx {};
  if (::statx(AT_FDCWD, path.c_str(), 0, STATX_TYPE, &stx) != 0) {
    const int err = errno;
    if (err != ENOTCONN) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(err)));
    }
    const std::string abs = mountPathOf(path);
    const std::optional<MountEntry> entry = abs.empty() ? std::nullopt : lastMountAt(abs);
    const bool ours = entry && entry->fstype == "fuse.siphon";
    absl::Status gone = ours && reclaimed ? detachMount(abs) : absl::OkStatus();
    if (!ours || !reclaimed || !gone.ok() ||
        ::statx(AT_FDCWD, path.c_str(), 0, STATX_TYPE, &stx) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is a FUSE mount whose server is gone: unmount it first (fusermount3 -u ", path,
          ")", gone.ok() ? "" : absl::StrCat(" (", gone.message(), ")")));
    }
    *reclaimed =
        absl::StrCat("unmounted the siphon mount left at ", path, " by a siphon that is gone");
  }
  if (!S_ISDIR(stx.stx_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a directory"));
  }
  if ((stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) != 0 &&
      (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is a mount point already"));
  }
  std::error_code ec;
  std::filesystem::directory_iterator it(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  if (it != std::filesystem::directory_iterator()) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not empty"));
  }
  return absl::OkStatus();
}

namespace {

// What a user's mount needs that is missing here, found before libfuse
// tries (it would print a line of its own, fusermount3 another, and say
// nothing of the fix); OK when nothing is seen missing. A user's mount goes
// through fusermount3 (libfuse runs it for auto_unmount), which opens
// /dev/fuse as the user (it drops its setuid root for that) and mounts only
// on a directory the user may write to.
absl::Status checkUserMount(const std::string& mountpoint) {
  const std::string who = absl::StrCat("uid ", getuid());
  if (::access("/dev/fuse", R_OK | W_OK) != 0) {
    const int err = errno;
    struct stat st {};
    if (err == ENOENT || ::stat("/dev/fuse", &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "there is no /dev/fuse (", std::strerror(err), "): is the fuse module loaded?"));
    }
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return absl::FailedPreconditionError(
        absl::StrCat("/dev/fuse is not open to ", who, " (", std::strerror(err), "; mode ", mode,
                     ", owner ", st.st_uid, ":", st.st_gid,
                     "): a user's mount needs read and write access to it; mount as root, or "
                     "have /dev/fuse opened to this user"));
  }
  // libfuse runs it from its build's directory (/usr/bin on Debian), else
  // from PATH.
  const char* path = std::getenv("PATH");
  bool found = false;
  for (absl::string_view dir :
       absl::StrSplit(absl::StrCat("/usr/bin:", path ? path : ""), ':', absl::SkipEmpty())) {
    found = found || ::access(absl::StrCat(dir, "/fusermount3").c_str(), X_OK) == 0;
  }
  if (!found) {
    return absl::FailedPreconditionError(
        "a user's mount goes through fusermount3, which is not installed (Debian's fuse3)");
  }
  if (::access(mountpoint.c_str(), W_OK) != 0) {
    const int err = errno;
    return absl::FailedPreconditionError(
        absl::StrCat("fusermount3 mounts only on a directory the user may write to, and ", who,
                     " may not write to it (", std::strerror(err), ")"));
  }
  return absl::OkStatus();
}

// The descriptors open now.
std::set<int> openFds() {
  std::set<int> fds;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    if (absl::SimpleAtoi(e.path().filename().string(), &fd)) fds.insert(fd);
  }
  return fds;
}

// auto_unmount's one race, closed. fusermount3 waits on a socket whose
// other end libfuse leaves open in this process (and inheritable); when
// that end closes it unmounts, but only if the mount then answers ENOTCONN,
// that is, if our /dev/fuse descriptor is closed already. A process that
// dies closes its descriptors and the kernel releases the files last
// closed first, so the socket, numbered above the /dev/fuse descriptor
// libfuse received after making it, went first: fusermount3 woke while the
// mount still had its server, found no ENOTCONN, and left a dead mount
// behind (seen under load). A second /dev/fuse descriptor above the socket
// makes the device go first. The socket, found among the descriptors the
// mount opened as the one whose peer is fusermount3, is also made
// close-on-exec, so that no program this process starts keeps the mount
// from going with it.
int holdDeviceAboveSocket(int device, const std::set<int>& before) {
  for (const int fd : openFds()) {
    if (fd == device || before.count(fd) != 0) continue;
    struct ucred peer {};
    socklen_t len = sizeof peer;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.pid <= 0) continue;
    std::ifstream comm(absl::StrCat("/proc/", peer.pid, "/comm"));
    std::string name;
    if (!std::getline(comm, name) || name != "fusermount3") continue;
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (fd < device) return -1;  // the device goes first already
    return ::fcntl(device, F_DUPFD_CLOEXEC, fd + 1);
  }
  return -1;
}

}  // namespace

FuseMount::Impl::Impl(client::Target t, MountOptions o)
    : target(t),
      files(t),
      table(o.remote_dir),
      fd(t.client()->executor()),
      mounts(fd.get_executor()),
      idle(fd.get_executor()) {
  attr_timeout = std::chrono::duration<double>(o.attr_timeout).count();
  mountpoint = o.mountpoint;
  while (mountpoint.size() > 1 && mountpoint.back() == '/') mountpoint.pop_back();
  remote_dir = o.remote_dir;
  while (remote_dir.size() > 1 && remote_dir.back() == '/') remote_dir.pop_back();
  read_only = o.read_only;
}

FuseMount::Impl::~Impl() {
  files.setChangesHandler(nullptr);
  notifier.reset();  // joined while the session it writes to exists
  if (se) {
    if (fd.is_open()) fd.release();
    closeDeviceGuard();
    if (mounted) fuse_session_unmount(se);
    fuse_session_destroy(se);
  }
  std::free(buf.mem);
}

FuseMount::FuseMount(std::unique_ptr<Impl> impl, MountOptions options)
    : impl_(std::move(impl)), options_(std::move(options)) {}

FuseMount::~FuseMount() = default;

absl::StatusOr<std::unique_ptr<FuseMount>> FuseMount::mount(client::Target target,
                                                            MountOptions options) {
  if (absl::Status s = checkMountpoint(options.mountpoint); !s.ok()) return s;
  if (options.remote_dir.empty() || options.remote_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--path ", options.remote_dir, ": must be absolute (inside the target)"));
  }
  auto impl = std::make_unique<Impl>(target, options);
  impl->max_io = ioSize(impl->files.maxReadSize());
  // Reads by splice (fuse_impl.h), at the size a pipe can hold: without
  // CAP_SYS_RESOURCE no pipe is above fs.pipe-max-size (1 MiB by default),
  // and a read of kSpliceIo leaves room for the buffers TCP cuts pages
  // into (a page per segment's end) and libfuse's header.
  if (pipeHoldsRead(impl->max_io)) {
    impl->splice_reads = true;
  } else if (pipeHoldsRead(kSpliceIo)) {
    impl->max_io = std::min(impl->max_io, kSpliceIo);
    impl->splice_reads = true;
  }
  // -o options: the kernel's large requests, the mount's mode, and
  // auto_unmount (fusermount3 unmounts when this process dies, even of
  // SIGKILL: the mount answers ENOTCONN, then goes, and never hangs).
  std::string opts =
      absl::StrCat("fsname=siphon,subtype=siphon,max_read=", impl->max_io, ",auto_unmount");
  if (options.read_only) opts += ",ro";
  std::vector<std::string> argv = {"siphon", "-o", opts};
  if (options.debug) argv.push_back("-d");
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  struct fuse_args args = FUSE_ARGS_INIT(static_cast<int>(cargv.size()), cargv.data());
  impl->se = fuse_session_new(&args, &operations(), sizeof(struct fuse_lowlevel_ops), impl.get());
  fuse_opt_free_args(&args);
  if (!impl->se) return absl::InternalError("libfuse refused the mount options");
  if (absl::Status s = geteuid() == 0 ? absl::OkStatus() : checkUserMount(options.mountpoint);
      !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot mount ", options.mountpoint, ": ", s.message()));
  }
  // Before the mount: afterwards a path walk into it is served by us.
  if (char* real = ::realpath(options.mountpoint.c_str(), nullptr)) {
    impl->mount_path = real;
    std::free(real);
  }
  const std::set<int> before = openFds();
  if (fuse_session_mount(impl->se, options.mountpoint.c_str()) != 0) {
    // What checkUserMount() cannot see: libfuse, or fusermount3 (which
    // auto_unmount goes through, as root too), printed why just before.
    return absl::FailedPreconditionError(
        absl::StrCat("cannot mount ", options.mountpoint,
                     ": refused by libfuse or fusermount3 (the line above says why)"));
  }
  impl->mounted = true;
  // Ours is the last mount at the mount point now.
  if (std::optional<MountEntry> e =
          impl->mount_path.empty() ? std::nullopt : lastMountAt(impl->mount_path);
      e && e->fstype == "fuse.siphon") {
    impl->device = e->device;
    const int info = ::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (info >= 0) impl->mounts.assign(info);
  }
  const int kfd = fuse_session_fd(impl->se);
  impl->device_guard = holdDeviceAboveSocket(kfd, before);
  const int flags = ::fcntl(kfd, F_GETFL);
  if (flags >= 0) ::fcntl(kfd, F_SETFL, flags | O_NONBLOCK);
  impl->fd.assign(kfd);
  impl->notifier = std::make_unique<Notifier>(impl->se);
  impl->files.setChangesHandler(
      [m = impl.get()](const client::FileChanges& changes) { onChanges(*m, changes); });
  return std::unique_ptr<FuseMount>(new FuseMount(std::move(impl), std::move(options)));
}

void FuseMount::stop() {
  Impl& m = *impl_;
  if (!m.se || m.stopping) return;
  m.stopping = true;
  // The loop goes on answering the kernel until no notice is being sent
  // (one may wait for a read's pages), then ends.
  auto end = [ex = m.fd.get_executor(), mp = &m, life = std::weak_ptr<int>(m.life)] {
    asio::post(ex, [mp, life] {
      if (life.expired()) return;  // serve() ended and the mount went meanwhile
      fuse_session_exit(mp->se);
      net::error_code ignored;
      mp->fd.cancel(ignored);
    });
  };
  if (m.notifier) {
    m.notifier->quiesce(end);
  } else {
    end();
  }
}

net::awaitable<void> FuseMount::watchRoot() {
  Impl& m = *impl_;
  if (!needsWatch(m, InodeTable::kRootId)) co_return;
  m.watching.insert(InodeTable::kRootId);
  co_await watchNow(&m, InodeTable::kRootId, m.remote_dir, m.watch_generation);
}

namespace {

void endServing(FuseMount::Impl& m) {
  fuse_session_exit(m.se);
  net::error_code ignored;
  m.fd.cancel(ignored);
}

// Ends serve() once the mount is gone from this mount namespace (see
// Impl::device): the table is read now and at each change of it (poll on
// /proc/self/mountinfo says EPOLLPRI). A mount moved or bound elsewhere
// here is still ours: it goes with the last place it is mounted.
net::awaitable<void> watchMounts(FuseMount::Impl* m) {
  for (;;) {
    if (m->stopping) co_return;
    if (!mountedHere(m->device)) {
      m->detached = true;
      endIfDetached(*m);
      co_return;
    }
    net::error_code ec;
    co_await m->mounts.async_wait(asio::posix::descriptor_base::wait_error,
                                  asio::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;
  }
}

}  // namespace

void endIfDetached(FuseMount::Impl& m) {
  if (!m.detached || m.stopping || !m.open_files.empty() || !m.open_dirs.empty()) return;
  endServing(m);
}

net::awaitable<absl::Status> FuseMount::serve() {
  Impl& m = *impl_;
  absl::Status why;
  watchNode(m, InodeTable::kRootId);
  if (m.mounts.is_open() && options_.end_on_unmount_here) {
    spawnCounted(m, watchMounts(&m), "fuse_mounts");
  }
  while (!fuse_session_exited(m.se)) {
    net::error_code ec;
    co_await m.fd.async_wait(asio::posix::descriptor_base::wait_read,
                             asio::redirect_error(net::use_awaitable, ec));
    if (ec || fuse_session_exited(m.se)) break;
    // Every request that is there now: one wake-up, many requests.
    for (;;) {
      const int n = fuse_session_receive_buf(m.se, &m.buf);
      if (n == -EAGAIN || n == -EINTR) break;
      if (n <= 0) {
        // 0 or -ENODEV: unmounted (fusermount3 -u, umount) and the
        // connection ended (see Impl::device for an unmount that does
        // not end it); 0 also once fuse_session_exit() was called.
        if (n < 0 && n != -ENODEV) why = errnoStatus(-n, "reading /dev/fuse");
        fuse_session_exit(m.se);
        break;
      }
      fuse_session_process_buf(m.se, &m.buf);
      if (fuse_session_exited(m.se)) break;
    }
  }
  m.stopping = true;
  if (m.notifier) m.notifier->quiesce([] {});
  net::error_code ignored;
  m.mounts.cancel(ignored);
  // The answers still owed: the client's call timeout bounds each.
  while (m.inflight > 0) co_await m.idle.wait();
  m.fd.release();
  m.closeDeviceGuard();
  if (m.mounted) {
    // Not once it is gone from here: libfuse would unmount the mount
    // point's path, and say "failed to unmount: Invalid argument" or,
    // worse, take a newer mount there. (Our descriptor's close, at the
    // session's end, ends the connection: a copy of the mount in another
    // namespace answers ENOTCONN.)
    if (m.device.empty() || mountedHere(m.device)) fuse_session_unmount(m.se);
    m.mounted = false;
  }
  co_return why;
}

}  // namespace siphon::fuse
