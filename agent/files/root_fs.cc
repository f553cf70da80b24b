#include "agent/files/root_fs.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "agent/common/root_path.h"
#include "siphon/status.h"

// Debian 12's headers predate fchmodat2 (Linux 6.6). Syscall numbers from 424
// on are the same on every architecture.
#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

namespace siphon::agent::files {
namespace {

std::string ctx(std::string_view op, std::string_view path) {
  return absl::StrCat(asv(op), " ", asv(path));
}

int64_t toNs(const struct timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The errno of openat2 of `path` under `root_fd`, 0 on success (`out` set);
// the bounded retry of agent/common/root_path.h.
int openat2Raw(int root_fd, std::string_view path, int flags, mode_t mode, UniqueFd* out) {
  return openInRoot(root_fd, path, flags, mode, out);
}

absl::StatusOr<v1::FileData> finishRead(int fd, std::string buf, ssize_t n, uint32_t size,
                                        int64_t end_offset) {
  buf.resize(static_cast<size_t>(n));
  v1::FileData data;
  bool eof = size > 0 && n == 0;
  if (!eof) {
    struct stat st {};
    // procfs/sysfs files say size 0 yet have content: only an empty read
    // ends them.
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && end_offset >= 0) {
      eof = end_offset >= st.st_size;
    }
  }
  data.set_data(std::move(buf));
  data.set_eof(eof);
  return data;
}

}  // namespace

v1::FileStat toFileStat(const struct stat& st) {
  v1::FileStat s;
  s.set_dev(st.st_dev);
  s.set_ino(st.st_ino);
  s.set_mode(st.st_mode);
  s.set_nlink(st.st_nlink);
  s.set_uid(st.st_uid);
  s.set_gid(st.st_gid);
  s.set_rdev(st.st_rdev);
  s.set_size(st.st_size);
  s.set_blksize(st.st_blksize);
  s.set_blocks(st.st_blocks);
  s.set_atime_ns(toNs(st.st_atim));
  s.set_mtime_ns(toNs(st.st_mtim));
  s.set_ctime_ns(toNs(st.st_ctim));
  return s;
}

absl::StatusOr<UniqueFd> RootFs::resolve(std::string_view path, int flags, mode_t mode) const {
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, flags, mode, &fd))
    return errnoStatus(err, ctx("open", path));
  return fd;
}

absl::StatusOr<UniqueFd> RootFs::open(std::string_view path, int flags, uint32_t mode) const {
  const bool creates = (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
  return resolve(path, flags | O_NOCTTY | O_NONBLOCK, creates ? (mode & 07777) : 0);
}

absl::StatusOr<UniqueFd> RootFs::openDir(std::string_view path) const {
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0, &fd)) {
    return errnoStatus(err, ctx("opendir", path));
  }
  return fd;
}

absl::StatusOr<v1::FileStat> RootFs::stat(std::string_view path, bool follow) const {
  const char* op = follow ? "stat" : "lstat";
  UniqueFd fd;
  // O_PATH|O_NOFOLLOW on a symlink gives an fd of the link itself.
  if (int err = openat2Raw(root_fd_, path, O_PATH | (follow ? 0 : O_NOFOLLOW), 0, &fd)) {
    return errnoStatus(err, ctx(op, path));
  }
  struct stat st {};
  if (::fstatat(fd.get(), "", &st, AT_EMPTY_PATH) != 0) return lastErrnoStatus(ctx(op, path));
  return toFileStat(st);
}

absl::StatusOr<v1::FsStat> RootFs::statfs(std::string_view path) const {
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_PATH, 0, &fd)) {
    return errnoStatus(err, ctx("statfs", path));
  }
  struct statfs sf {};
  if (::fstatfs(fd.get(), &sf) != 0) return lastErrnoStatus(ctx("statfs", path));
  v1::FsStat s;
  s.set_type(static_cast<uint64_t>(sf.f_type));
  s.set_bsize(static_cast<uint64_t>(sf.f_bsize));
  s.set_blocks(sf.f_blocks);
  s.set_bfree(sf.f_bfree);
  s.set_bavail(sf.f_bavail);
  s.set_files(sf.f_files);
  s.set_ffree(sf.f_ffree);
  s.set_namelen(static_cast<uint64_t>(sf.f_namelen));
  s.set_frsize(static_cast<uint64_t>(sf.f_frsize));
  s.set_flags(static_cast<uint64_t>(sf.f_flags));
  return s;
}

absl::Status RootFs::access(std::string_view path, int mode, bool writes_refused) const {
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_PATH, 0, &fd)) {
    return errnoStatus(err, ctx("access", path));
  }
  if ((mode & ~(R_OK | W_OK | X_OK)) != 0) return errnoStatus(EINVAL, ctx("access", path));
  if (writes_refused && (mode & W_OK) != 0) return errnoStatus(EROFS, ctx("access", path));
  // faccessat2 (5.8) takes AT_EMPTY_PATH: the check is on the fd's object,
  // with no second path lookup.
  if (::syscall(SYS_faccessat2, fd.get(), "", mode, AT_EMPTY_PATH) != 0) {
    return lastErrnoStatus(ctx("access", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RootFs::readlink(std::string_view path) const {
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_PATH | O_NOFOLLOW, 0, &fd)) {
    return errnoStatus(err, ctx("readlink", path));
  }
  struct stat st {};
  if (::fstatat(fd.get(), "", &st, AT_EMPTY_PATH) != 0) {
    return lastErrnoStatus(ctx("readlink", path));
  }
  if (!S_ISLNK(st.st_mode)) return errnoStatus(EINVAL, ctx("readlink", path));
  // readlinkat(fd, "") reads the link an O_PATH|O_NOFOLLOW fd refers to.
  std::string buf(4096, '\0');
  while (true) {
    const ssize_t n = ::readlinkat(fd.get(), "", buf.data(), buf.size());
    if (n < 0) return lastErrnoStatus(ctx("readlink", path));
    if (static_cast<size_t>(n) < buf.size()) {
      buf.resize(static_cast<size_t>(n));
      return buf;
    }
    if (buf.size() >= (size_t{1} << 20)) return errnoStatus(ENAMETOOLONG, ctx("readlink", path));
    buf.resize(buf.size() * 2);
  }
}

absl::StatusOr<RootFs::Parent> RootFs::parent(std::string_view op, std::string_view path,
                                              int refuse_errno) const {
  if (path.find('\0') != std::string_view::npos) return errnoStatus(EINVAL, ctx(op, path));
  if (path.empty()) return errnoStatus(ENOENT, ctx(op, path));
  size_t end = path.size();
  while (end > 0 && path[end - 1] == '/') --end;
  Parent p;
  p.trailing_slash = end < path.size();
  const size_t slash = end == 0 ? std::string_view::npos : path.rfind('/', end - 1);
  p.name = std::string(slash == std::string_view::npos ? path.substr(0, end)
                                                       : path.substr(slash + 1, end - slash - 1));
  if (p.name.empty() || p.name == "." || p.name == "..") {
    return errnoStatus(refuse_errno, ctx(op, path));
  }
  std::string_view dir = slash == std::string_view::npos ? std::string_view(".")
                         : slash == 0                    ? std::string_view("/")
                                                         : path.substr(0, slash);
  if (int err = openat2Raw(root_fd_, dir, O_PATH | O_DIRECTORY, 0, &p.fd)) {
    return errnoStatus(err, ctx(op, path));
  }
  return p;
}

absl::Status RootFs::mkdir(std::string_view path, uint32_t mode) const {
  auto p = parent("mkdir", path, EEXIST);
  if (!p.ok()) return p.status();
  if (::mkdirat(p->fd.get(), p->name.c_str(), mode & 07777) != 0) {
    return lastErrnoStatus(ctx("mkdir", path));
  }
  return absl::OkStatus();
}

absl::Status RootFs::rmdir(std::string_view path) const {
  auto p = parent("rmdir", path, EBUSY);
  if (!p.ok()) return p.status();
  if (::unlinkat(p->fd.get(), p->name.c_str(), AT_REMOVEDIR) != 0) {
    return lastErrnoStatus(ctx("rmdir", path));
  }
  return absl::OkStatus();
}

absl::Status RootFs::unlink(std::string_view path) const {
  auto p = parent("unlink", path, EISDIR);
  if (!p.ok()) return p.status();
  if (p->trailing_slash) {
    // "file/" names a directory: unlink(2) refuses it either way.
    struct stat st {};
    if (::fstatat(p->fd.get(), p->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return lastErrnoStatus(ctx("unlink", path));
    }
    return errnoStatus(S_ISDIR(st.st_mode) ? EISDIR : ENOTDIR, ctx("unlink", path));
  }
  if (::unlinkat(p->fd.get(), p->name.c_str(), 0) != 0) {
    return lastErrnoStatus(ctx("unlink", path));
  }
  return absl::OkStatus();
}

absl::Status RootFs::rename(std::string_view from, std::string_view to, uint32_t flags) const {
  const std::string what = absl::StrCat("rename ", asv(from), " to ", asv(to));
  auto f = parent("rename", from, EBUSY);
  if (!f.ok()) return f.status();
  auto t = parent("rename", to, EBUSY);
  if (!t.ok()) return t.status();
  if (f->trailing_slash || t->trailing_slash) {
    struct stat st {};
    if (::fstatat(f->fd.get(), f->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return lastErrnoStatus(what);
    }
    if (!S_ISDIR(st.st_mode)) return errnoStatus(ENOTDIR, what);
  }
  // renameat2 follows neither name.
  if (::renameat2(f->fd.get(), f->name.c_str(), t->fd.get(), t->name.c_str(), flags) != 0) {
    return lastErrnoStatus(what);
  }
  return absl::OkStatus();
}

absl::Status RootFs::truncate(std::string_view path, int64_t length) const {
  if (length < 0) return errnoStatus(EINVAL, ctx("truncate", path));
  UniqueFd fd;
  // A directory fails here with EISDIR; O_NONBLOCK keeps a FIFO from
  // blocking the open.
  if (int err = openat2Raw(root_fd_, path, O_WRONLY | O_NOCTTY | O_NONBLOCK, 0, &fd)) {
    return errnoStatus(err, ctx("truncate", path));
  }
  if (::ftruncate(fd.get(), length) != 0) return lastErrnoStatus(ctx("truncate", path));
  return absl::OkStatus();
}

absl::Status RootFs::chmod(std::string_view path, uint32_t mode) const {
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_PATH, 0, &fd)) {
    return errnoStatus(err, ctx("chmod", path));
  }
  // fchmod() refuses O_PATH fds; fchmodat2 (6.6) takes AT_EMPTY_PATH.
  if (::syscall(SYS_fchmodat2, fd.get(), "", mode & 07777, AT_EMPTY_PATH) == 0) {
    return absl::OkStatus();
  }
  if (errno != ENOSYS) return lastErrnoStatus(ctx("chmod", path));
  // Older kernels: chmod through the agent's own /proc/self/fd/N. That magic
  // link names the inode openat2 already resolved inside the root; nothing
  // of the container's path is looked up again (glibc's fchmodat does the
  // same for AT_SYMLINK_NOFOLLOW).
  const std::string self = absl::StrCat("/proc/self/fd/", fd.get());
  if (::chmod(self.c_str(), mode & 07777) != 0) return lastErrnoStatus(ctx("chmod", path));
  return absl::OkStatus();
}

absl::Status RootFs::chown(std::string_view path, int64_t uid, int64_t gid, bool follow) const {
  constexpr int64_t kMaxId = std::numeric_limits<uint32_t>::max() - 1;  // (uid_t)-1 means "keep"
  if (uid < -1 || uid > kMaxId || gid < -1 || gid > kMaxId) {
    return errnoStatus(EINVAL, ctx("chown", path));
  }
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_PATH | (follow ? 0 : O_NOFOLLOW), 0, &fd)) {
    return errnoStatus(err, ctx("chown", path));
  }
  if (::fchownat(fd.get(), "", static_cast<uid_t>(uid), static_cast<gid_t>(gid), AT_EMPTY_PATH) !=
      0) {
    return lastErrnoStatus(ctx("chown", path));
  }
  return absl::OkStatus();
}

absl::Status RootFs::utimens(std::string_view path, int64_t atime_ns, int64_t mtime_ns,
                             bool follow) const {
  struct timespec ts[2];
  const int64_t in[2] = {atime_ns, mtime_ns};
  for (int i = 0; i < 2; ++i) {
    if (in[i] == kTimeOmit) {
      ts[i] = {0, UTIME_OMIT};
    } else if (in[i] == kTimeNow) {
      ts[i] = {0, UTIME_NOW};
    } else if (in[i] < 0) {
      return errnoStatus(EINVAL, ctx("utimens", path));
    } else {
      ts[i] = {static_cast<time_t>(in[i] / 1000000000), static_cast<long>(in[i] % 1000000000)};
    }
  }
  UniqueFd fd;
  if (int err = openat2Raw(root_fd_, path, O_PATH | (follow ? 0 : O_NOFOLLOW), 0, &fd)) {
    return errnoStatus(err, ctx("utimens", path));
  }
  // utimensat(fd, "", AT_EMPTY_PATH) (5.8) works on O_PATH fds, symlinks
  // included.
  if (::utimensat(fd.get(), "", ts, AT_EMPTY_PATH) != 0) {
    return lastErrnoStatus(ctx("utimens", path));
  }
  return absl::OkStatus();
}

absl::Status RootFs::refuseTrailingSlash(const Parent& p, std::string_view what) {
  struct stat st {};
  const bool exists = ::fstatat(p.fd.get(), p.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  return errnoStatus(exists ? EEXIST : ENOENT, what);
}

absl::Status RootFs::symlink(std::string_view target, std::string_view linkpath) const {
  const std::string what = ctx("symlink", linkpath);
  if (target.find('\0') != std::string_view::npos) return errnoStatus(EINVAL, what);
  auto p = parent("symlink", linkpath, EEXIST);
  if (!p.ok()) return p.status();
  if (p->trailing_slash) return refuseTrailingSlash(*p, what);
  // The target is text the kernel stores without looking at it; only a
  // later walk through the link resolves it (inside the root, RootFs).
  const std::string text(target);
  if (::symlinkat(text.c_str(), p->fd.get(), p->name.c_str()) != 0) return lastErrnoStatus(what);
  return absl::OkStatus();
}

absl::Status RootFs::link(std::string_view existing, std::string_view newpath) const {
  const std::string what = absl::StrCat("link ", asv(existing), " to ", asv(newpath));
  // "dir/." or "/" as the existing name: a directory, which cannot be linked.
  auto from = parent("link", existing, EPERM);
  if (!from.ok()) return from.status();
  auto to = parent("link", newpath, EEXIST);
  if (!to.ok()) return to.status();
  if (from->trailing_slash) {
    struct stat st {};
    if (::fstatat(from->fd.get(), from->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return lastErrnoStatus(what);
    }
    return errnoStatus(S_ISDIR(st.st_mode) ? EPERM : ENOTDIR, what);
  }
  if (to->trailing_slash) return refuseTrailingSlash(*to, what);
  // No AT_SYMLINK_FOLLOW (nor AT_EMPTY_PATH): the name is linked as it is,
  // a symlink included, so nothing is resolved past the parent walk.
  if (::linkat(from->fd.get(), from->name.c_str(), to->fd.get(), to->name.c_str(), 0) != 0) {
    return lastErrnoStatus(what);
  }
  return absl::OkStatus();
}

absl::Status RootFs::mknod(std::string_view path, uint32_t mode, uint64_t rdev) const {
  (void)rdev;  // only for devices, which are never made
  const std::string what = ctx("mknod", path);
  const uint32_t type = mode & S_IFMT;
  if (type == S_IFCHR || type == S_IFBLK) {
    // Whoever serves files is outside the target's devices cgroup: a node
    // made here could open what the target's own processes may not.
    return errnoRefusal(
        EPERM, absl::StrCat("mknod ", asv(path), ": the agent does not create device nodes"));
  }
  if (type != 0 && type != S_IFREG && type != S_IFIFO && type != S_IFSOCK) {
    return errnoStatus(EINVAL, what);
  }
  auto p = parent("mknod", path, EEXIST);
  if (!p.ok()) return p.status();
  if (p->trailing_slash) return refuseTrailingSlash(*p, what);
  if (::mknodat(p->fd.get(), p->name.c_str(), (type == 0 ? S_IFREG : type) | (mode & 07777), 0) !=
      0) {
    return lastErrnoStatus(what);
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ fd operations

absl::StatusOr<v1::FileData> readFd(int fd, uint32_t size) {
  std::string buf(size, '\0');
  ssize_t n;
  do {
    n = ::read(fd, buf.data(), buf.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return lastErrnoStatus("read");
  const off_t pos = ::lseek(fd, 0, SEEK_CUR);  // -1 for pipes: no size check then
  return finishRead(fd, std::move(buf), n, size, pos);
}

absl::StatusOr<v1::FileData> preadFd(int fd, uint32_t size, int64_t offset) {
  if (offset < 0) return errnoStatus(EINVAL, "pread");
  std::string buf(size, '\0');
  ssize_t n;
  do {
    n = ::pread(fd, buf.data(), buf.size(), offset);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return lastErrnoStatus("pread");
  return finishRead(fd, std::move(buf), n, size, offset + n);
}

absl::StatusOr<std::optional<PipedRead>> splicePreadFd(int fd, uint32_t size, int64_t offset) {
  if (offset < 0) return errnoStatus(EINVAL, "pread");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || size == 0) return std::nullopt;
  // The pipe takes a buffer per page (or larger folio) the range touches:
  // room for all of them, so that the splice never waits for a reader.
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (static_cast<uint64_t>(offset) % page + size + page - 1) / page;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  UniqueFd out(fds[0]), in(fds[1]);
  const int capacity = ::fcntl(in.get(), F_GETPIPE_SZ);
  if (capacity < 0 || static_cast<uint64_t>(capacity) < pages * page) {
    if (::fcntl(in.get(), F_SETPIPE_SZ, static_cast<int>(pages * page)) < 0) return std::nullopt;
  }
  loff_t at = offset;
  size_t have = 0;
  while (have < size) {
    const ssize_t n = ::splice(fd, &at, in.get(), nullptr, size - have, SPLICE_F_NONBLOCK);
    if (n > 0) {
      have += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) break;  // the end of the file
    if (errno == EINTR) continue;
    // A file system without splice, or a pipe full before the end (more
    // buffers than pages): the copying read does it.
    if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP || errno == EAGAIN) {
      return std::nullopt;
    }
    return lastErrnoStatus("pread");
  }
  in.reset();
  PipedRead r;
  r.eof = have == 0;
  if (!r.eof && ::fstat(fd, &st) == 0 && st.st_size > 0) {
    r.eof = offset + static_cast<int64_t>(have) >= st.st_size;
  }
  r.bytes = std::make_shared<protocol::PipedBytes>(out.release(), have);
  return r;
}

absl::StatusOr<uint64_t> writeFd(int fd, std::string_view data) {
  ssize_t n;
  do {
    n = ::write(fd, data.data(), data.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return lastErrnoStatus("write");
  return static_cast<uint64_t>(n);
}

absl::StatusOr<uint64_t> pwriteFd(int fd, std::string_view data, int64_t offset) {
  if (offset < 0) return errnoStatus(EINVAL, "pwrite");
  ssize_t n;
  do {
    n = ::pwrite(fd, data.data(), data.size(), offset);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return lastErrnoStatus("pwrite");
  return static_cast<uint64_t>(n);
}

absl::StatusOr<int64_t> seekFd(int fd, int64_t offset, int whence) {
  const off_t r = ::lseek(fd, offset, whence);
  if (r < 0) return lastErrnoStatus("seek");
  return static_cast<int64_t>(r);
}

absl::StatusOr<v1::FileStat> fstatFd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return lastErrnoStatus("fstat");
  return toFileStat(st);
}

absl::Status fsyncFd(int fd, bool datasync) {
  if ((datasync ? ::fdatasync(fd) : ::fsync(fd)) != 0) {
    return lastErrnoStatus(datasync ? "fdatasync" : "fsync");
  }
  return absl::OkStatus();
}

absl::Status ftruncateFd(int fd, int64_t length) {
  if (length < 0) return errnoStatus(EINVAL, "ftruncate");
  if (::ftruncate(fd, length) != 0) return lastErrnoStatus("ftruncate");
  return absl::OkStatus();
}

}  // namespace siphon::agent::files
