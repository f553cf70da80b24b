// The file helper: the agent's binary re-executed with the target's
// identity and root to do the file work (fs_helper.h, docs/SECURITY.md),
// and the agent side that talks to it. Over 600 lines because both ends of its small
// private protocol (frames, credentials, the served connections) live here
// so they cannot drift apart.
#include "agent/files/fs_helper.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/common/capabilities.h"
#include "agent/common/log.h"
#include "agent/common/unique_fd.h"
#include "agent/files/handles.h"
#include "agent/files/root_fs.h"
#include "agent/services/service.h"
#include "siphon/heap.h"
#include "siphon/status.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace siphon::agent::files {
namespace {

using R = v1::FileRequest;

enum Kind : uint8_t {
  kOpen = 1,      // open/opendir -> handle
  kPath = 2,      // aux: writes_refused
  kFileCall = 3,  // handle, aux: max_read
  kReaddir = 4,   // handle, aux: max_bytes (max_entries in the request)
  kClose = 5,     // handle: the client's close, its error
  kRelease = 6,   // handle: dropped (session ended), no error
  // Handover (docs/CONTINUITY.md): the handle's descriptor comes with the
  // answer (a directory's placed at its next entry not given); the handle
  // stays.
  kExport = 7,
  kAdopt = 8,  // a descriptor came with the request; aux 1: a directory -> handle
  // File watches (file_watches.h): a new inotify instance, made here so
  // that the kernel charges it and its watches to the helper's user, comes
  // with the answer; a watch request brings the session's instance (the
  // agent keeps it and reads its events) and its path is resolved and
  // watched here, aux the mask: the answer's `watched` is the descriptor.
  kWatchInstance = 9,
  kWatch = 10,
};

constexpr size_t kRequestHeader = 1 + 4 + 8;
// An answer: [u32 length][kind][u64 handle], then for kAnswerOk a
// FileResponse, for kAnswerError an Error, for kAnswerRead [u32 m] and a
// FileResponse of m bytes whose FileData.data is left out: those bytes
// are the rest of the frame.
constexpr size_t kAnswerHeader = 1 + 8;
constexpr char kAnswerError = 0;
constexpr char kAnswerOk = 1;
constexpr char kAnswerRead = 2;
// Reads and writes are bounded by --max-frame-size (at most 64 MiB); a
// length past this is a broken peer, not a big file.
constexpr uint32_t kMaxFrame = 80u << 20;
// Answer buffers larger than this are not kept for the next call.
constexpr size_t kSpareMax = 4u << 20;

constexpr int kRootFd = 3;
constexpr int kFirstConnFd = 4;

// The file capabilities (CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER,
// FSETID): the most the helper ever keeps once it took its identity.
constexpr caps::CapSet kFileCaps =
    caps::bit(0) | caps::bit(1) | caps::bit(2) | caps::bit(3) | caps::bit(4);

void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t getLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// head, then bulk, in as few sendmsg calls as the socket takes; `pass`
// (-1: none) goes with the first bytes, as SCM_RIGHTS.
bool writeParts(int fd, std::string_view head, std::string_view bulk, int pass = -1) {
  while (!head.empty() || !bulk.empty()) {
    struct iovec iov[2];
    int n_iov = 0;
    if (!head.empty()) iov[n_iov++] = {const_cast<char*>(head.data()), head.size()};
    if (!bulk.empty()) iov[n_iov++] = {const_cast<char*>(bulk.data()), bulk.size()};
    struct msghdr msg {};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (pass >= 0) {
      std::memset(control, 0, sizeof control);
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass, sizeof(int));
    }
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    pass = -1;  // sent with the first bytes
    auto sent = static_cast<size_t>(n);
    const size_t from_head = std::min(sent, head.size());
    head.remove_prefix(from_head);
    bulk.remove_prefix(sent - from_head);
  }
  return true;
}

bool readAll(int fd, char* buf, size_t size) {
  while (size > 0) {
    const ssize_t n = ::read(fd, buf, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

enum class FrameRead { kOk, kClosed, kMalformed };

// A frame's length prefix into len; a descriptor that came with its first
// bytes lands in *passed, close-on-exec (more than one: the rest closed).
// A descriptor the receiver cannot take (its limit) is dropped by the
// kernel: the caller sees none.
bool readLength(int fd, char* len, UniqueFd* passed) {
  passed->reset();
  struct iovec iov = {len, 4};
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (i == 0 && !passed->valid()) {
        passed->reset(got);
      } else {
        ::close(got);
      }
    }
  }
  return n == 4 || readAll(fd, len + n, 4 - static_cast<size_t>(n));
}

// One frame (its length prefix stripped) and the descriptor that came
// with it, if any: kClosed on EOF or an error, kMalformed for a length
// past kMaxFrame.
FrameRead readFrameOf(int fd, std::string* out, UniqueFd* passed) {
  char len[4];
  if (!readLength(fd, len, passed)) return FrameRead::kClosed;
  const uint32_t n = static_cast<uint32_t>(getLE(len, 4));
  if (n > kMaxFrame) return FrameRead::kMalformed;
  out->resize(n);
  return readAll(fd, out->data(), n) ? FrameRead::kOk : FrameRead::kClosed;
}

bool readFrame(int fd, std::string* out, UniqueFd* passed) {
  return readFrameOf(fd, out, passed) == FrameRead::kOk;
}

// An answer (its length prefix stripped) into *head; for kAnswerRead the
// head ends with its FileResponse and the read's bytes go to *bulk, read
// there straight from the socket (the string that becomes the answer's
// FileData.data, never copied out of a serialised message).
//
// A descriptor the helper passed with the answer (an open's, see
// HelperServer::run) lands in *passed, close-on-exec; one the agent cannot
// take (its descriptor limit) is dropped by the kernel, and the file is
// then read through the helper.
FrameRead readAnswer(int fd, std::string* head, std::string* bulk, UniqueFd* passed) {
  bulk->clear();
  char len[4];
  if (!readLength(fd, len, passed)) return FrameRead::kClosed;
  const uint32_t n = static_cast<uint32_t>(getLE(len, 4));
  if (n > kMaxFrame) return FrameRead::kMalformed;
  constexpr size_t kReadHead = kAnswerHeader + 4;
  if (n < kReadHead) {
    head->resize(n);
    return readAll(fd, head->data(), n) ? FrameRead::kOk : FrameRead::kClosed;
  }
  head->resize(kReadHead);
  if (!readAll(fd, head->data(), kReadHead)) return FrameRead::kClosed;
  size_t message = n - kReadHead;  // the rest, for other kinds
  if ((*head)[0] == kAnswerRead) {
    message = getLE(head->data() + kAnswerHeader, 4);
    if (message > n - kReadHead) return FrameRead::kMalformed;
  }
  head->resize(kReadHead + message);
  if (!readAll(fd, head->data() + kReadHead, message)) return FrameRead::kClosed;
  if ((*head)[0] == kAnswerRead) {
    bulk->resize(n - kReadHead - message);
    if (!readAll(fd, bulk->data(), bulk->size())) return FrameRead::kClosed;
  }
  return FrameRead::kOk;
}

// `pass` (-1: none) goes with the frame's first bytes.
bool writeFrame(int fd, const std::string& body, int pass = -1) {
  std::string len;
  putU32(len, static_cast<uint32_t>(body.size()));
  return writeParts(fd, len, body, pass);
}

// ============================================================ helper side

// Whether the agent may read an open file itself, on this descriptor (the
// same open file: the same offset), sparing the bytes two copies and a hop
// through the helper. It was opened here, with the target's identity and
// inside its root, so the open's checks are the target's; what must hold
// besides is that reading checks nothing more of whoever reads. So: a
// regular file open for reading on a file system of data (disk, memory,
// overlay, NFS, which use the opener's credentials), never procfs, sysfs
// and the like, whose files check the reader at each read (/proc/PID/stack
// asks ptrace_may_access of the reader: the agent would pass where the
// target does not), nor FUSE, whose server sees each reader.
bool readsInTheAgent(int fd) {
  static constexpr unsigned long kDataFileSystems[] = {
      EXT4_SUPER_MAGIC,  // ext2, ext3, ext4
      XFS_SUPER_MAGIC,       BTRFS_SUPER_MAGIC,  TMPFS_MAGIC,      RAMFS_MAGIC,
      OVERLAYFS_SUPER_MAGIC, F2FS_SUPER_MAGIC,   SQUASHFS_MAGIC,   EROFS_SUPER_MAGIC_V1,
      NFS_SUPER_MAGIC,       MSDOS_SUPER_MAGIC,  EXFAT_SUPER_MAGIC, ISOFS_SUPER_MAGIC,
      0x2fc12fc1,  // zfs (out of tree: not in linux/magic.h)
  };
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_WRONLY || (flags & O_PATH) != 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return false;
  const auto type = static_cast<unsigned long>(fs.f_type);
  return std::find(std::begin(kDataFileSystems), std::end(kDataFileSystems), type) !=
         std::end(kDataFileSystems);
}

class HelperServer {
 public:
  HelperServer(int root_fd, GuardOptions guard) : fs_(root_fd, guard) {}

  // The answer to a request body into *out, length prefix included: the
  // connection's buffer, kept between answers. A read's bytes are left in
  // *bulk, where pread put them, and go to the socket after *out (one
  // sendmsg of both; see writeParts): kRead answers carry them after the
  // message, not in it, so neither side copies them into or out of a
  // serialised FileResponse.
  //
  // `received`: the descriptor that came with the request (kAdopt).
  // *pass: a descriptor to send with the answer (see run()), its number in
  // `fd` (-1: none), held in `owned` until the answer went when it is a
  // copy made for the answer (kExport).
  struct Pass {
    int fd = -1;
    UniqueFd owned;
  };
  void serve(const std::string& frame, UniqueFd received, std::string* out, std::string* bulk,
             Pass* pass) {
    uint64_t handle = 0;
    pass->fd = -1;
    pass->owned.reset();
    absl::StatusOr<v1::FileResponse> r = run(frame, std::move(received), &handle, pass);
    bulk->clear();
    out->assign(4, '\0');
    if (r.ok() && r->has_data() && !r->data().data().empty()) {
      *bulk = std::move(*r->mutable_data()->mutable_data());
      r->mutable_data()->clear_data();
      out->push_back(kAnswerRead);
      putU64(*out, handle);
      putU32(*out, static_cast<uint32_t>(r->ByteSizeLong()));
      r->AppendToString(out);
    } else {
      out->push_back(r.ok() ? kAnswerOk : kAnswerError);
      putU64(*out, handle);
      if (r.ok()) {
        r->AppendToString(out);
      } else {
        toProtoError(r.status()).AppendToString(out);
      }
    }
    const auto n = static_cast<uint32_t>(out->size() - 4 + bulk->size());
    for (int i = 0; i < 4; ++i) (*out)[i] = static_cast<char>(n >> (8 * i));
  }

 private:
  absl::StatusOr<v1::FileResponse> run(const std::string& frame, UniqueFd received,
                                       uint64_t* new_handle, Pass* pass) {
    if (frame.size() < kRequestHeader) return protoError(v1::INVALID_ARGUMENT, "short request");
    const auto kind = static_cast<Kind>(frame[0]);
    const auto aux = static_cast<uint32_t>(getLE(frame.data() + 1, 4));
    const uint64_t handle = getLE(frame.data() + 5, 8);
    R req;
    if (!req.ParseFromArray(frame.data() + kRequestHeader,
                            static_cast<int>(frame.size() - kRequestHeader))) {
      return protoError(v1::INVALID_ARGUMENT, "malformed request");
    }
    switch (kind) {
      case kOpen:
      case kAdopt: {
        absl::StatusOr<Handle> h;
        if (kind == kOpen) {
          h = fs_.open(req);
        } else if (!received.valid()) {
          h = protoError(v1::INVALID_ARGUMENT, "file helper: a handover's file came without its descriptor");
        } else {
          h = fs_.adopt(std::move(received), aux != 0);
        }
        if (!h.ok()) return h.status();
        if (auto* f = std::get_if<std::shared_ptr<FileObject>>(&*h)) {
          if (auto* open = dynamic_cast<OpenFile*>(f->get()); open && readsInTheAgent(open->fd.get())) {
            pass->fd = open->fd.get();
          }
        }
        std::lock_guard<std::mutex> lock(mu_);
        *new_handle = next_++;
        handles_.emplace(*new_handle, *std::move(h));
        v1::FileResponse r;
        r.mutable_opened()->set_fd(*new_handle);
        return r;
      }
      case kPath:
        return fs_.path(req, aux != 0);
      case kFileCall: {
        auto f = find<FileObject>(handle);
        if (!f) return errnoStatus(EBADF, "file helper handle");
        return f->call(req, aux);
      }
      case kReaddir: {
        auto d = find<DirObject>(handle);
        if (!d) return errnoStatus(EBADF, "file helper handle");
        auto entries = d->read(req.readdir().max_entries(), aux, req.readdir().with_stat());
        if (!entries.ok()) return entries.status();
        v1::FileResponse r;
        *r.mutable_entries() = *std::move(entries);
        return r;
      }
      case kExport: {
        absl::StatusOr<UniqueFd> fd = absl::NotFoundError("");
        if (auto f = find<FileObject>(handle)) {
          fd = f->exportFd();
        } else if (auto d = find<DirObject>(handle)) {
          fd = d->exportFd();
        } else {
          return errnoStatus(EBADF, "file helper handle");
        }
        if (!fd.ok()) return fd.status();
        pass->owned = *std::move(fd);
        pass->fd = pass->owned.get();
        return doneResponse();
      }
      case kWatchInstance: {
        absl::StatusOr<UniqueFd> fd = fs_.newWatchInstance();
        if (!fd.ok()) return fd.status();
        pass->owned = *std::move(fd);
        pass->fd = pass->owned.get();
        return doneResponse();
      }
      case kWatch: {
        if (!received.valid()) {
          return protoError(v1::INVALID_ARGUMENT,
                            "file helper: a watch came without its inotify instance");
        }
        absl::StatusOr<int> wd = fs_.addWatch(received.get(), req.watch().path(), aux);
        if (!wd.ok()) return wd.status();
        v1::FileResponse r;
        r.mutable_watched()->set_watch(static_cast<uint64_t>(*wd));
        return r;
      }
      case kClose:
      case kRelease: {
        Handle h;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = handles_.find(handle);
          if (it == handles_.end()) return errnoStatus(EBADF, "file helper handle");
          h = std::move(it->second);
          handles_.erase(it);
        }
        v1::FileResponse r;
        r.mutable_done();
        auto* f = std::get_if<std::shared_ptr<FileObject>>(&h);
        if (kind == kClose && f != nullptr && f->use_count() == 1) {
          if (absl::Status s = (*f)->close(); !s.ok()) return s;
        }
        return r;
      }
    }
    return protoError(v1::INVALID_ARGUMENT, "unknown file helper request");
  }

  template <typename T>
  std::shared_ptr<T> find(uint64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return nullptr;
    auto* p = std::get_if<std::shared_ptr<T>>(&it->second);
    return p == nullptr ? nullptr : *p;
  }

  LocalFileSystem fs_;
  std::mutex mu_;
  uint64_t next_ = 1;
  std::map<uint64_t, Handle> handles_;
};

bool parseList(std::string_view text, std::vector<uint64_t>* out, bool hex = false) {
  out->clear();
  if (text.empty()) return true;
  for (absl::string_view part : absl::StrSplit(asv(text), ',')) {
    uint64_t v;
    if (!(hex ? absl::SimpleHexAtoi(part, &v) : absl::SimpleAtoi(part, &v))) return false;
    out->push_back(v);
  }
  return true;
}

// Takes `c` (ids and the capability sets wanted) for good. Single-threaded
// caller: glibc's set*id then only has this thread to change.
absl::Status takeIdentity(const Credentials& c) {
  std::vector<gid_t> groups(c.groups.begin(), c.groups.end());
  if (::setgroups(groups.size(), groups.data()) != 0) return lastErrnoStatus("setgroups");
  if (::setresgid(c.gid[0], c.gid[1], c.gid[2]) != 0) return lastErrnoStatus("setresgid");
  if (::setresuid(c.uid[0], c.uid[1], c.uid[2]) != 0) return lastErrnoStatus("setresuid");
  ::setfsgid(c.gid[3]);
  ::setfsuid(c.uid[3]);
  // With KEEP_CAPS off (the agent's securebits, inherited) a uid other than
  // 0 has already lost every capability; a root target keeps of ours only
  // the file capabilities it has itself. CAP_SETUID/SETGID go here, so the
  // identity cannot be changed back.
  ASSIGN_OR_RETURN(caps::CurrentSets now, caps::currentSets());
  const caps::CapSet want = c.cap_effective & c.cap_permitted & kFileCaps & now.permitted;
  RETURN_IF_ERROR(caps::dropFromAll(~want));
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return lastErrnoStatus("PR_SET_NO_NEW_PRIVS");
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return lastErrnoStatus("PR_SET_DUMPABLE");
  // Checked, not assumed.
  uid_t r, e, s;
  gid_t gr, ge, gs;
  ::getresuid(&r, &e, &s);
  ::getresgid(&gr, &ge, &gs);
  if (r != c.uid[0] || e != c.uid[1] || s != c.uid[2] || gr != c.gid[0] || ge != c.gid[1] ||
      gs != c.gid[2] || static_cast<uint32_t>(::setfsuid(-1)) != c.uid[3] ||
      static_cast<uint32_t>(::setfsgid(-1)) != c.gid[3]) {
    return absl::InternalError("the ids did not change as asked");
  }
  ASSIGN_OR_RETURN(caps::CurrentSets after, caps::currentSets());
  if ((after.permitted | after.effective | after.inheritable) & ~want) {
    return absl::InternalError(
        absl::StrCat("capabilities left: ", caps::formatCapSet(after.permitted & ~want)));
  }
  return absl::OkStatus();
}

// ============================================================ agent side

class Helper : public std::enable_shared_from_this<Helper> {
 public:
  struct Reply {
    uint64_t generation = 0;
    uint64_t handle = 0;
    v1::FileResponse response;
    UniqueFd passed;  // an open's descriptor, when the helper sent one
  };

  explicit Helper(HelperOptions options) : options_(std::move(options)) {
    // Files the agent reads itself hold a descriptor each: at most a
    // quarter of its limit, so that sockets never run short for them.
    struct rlimit lim {};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
      local_budget_ = static_cast<int64_t>(lim.rlim_cur / 4);
    }
  }
  ~Helper() {
    std::lock_guard<std::mutex> lock(mu_);
    stopLocked();
  }

  // One request. `generation` 0: whichever helper runs (started if none);
  // otherwise only the helper that opened `handle`.
  // `send`: a descriptor to pass with the request (kAdopt), or -1.
  absl::StatusOr<Reply> call(uint64_t generation, Kind kind, uint32_t aux, uint64_t handle,
                             const R& req, int send = -1) {
    std::string frame;
    frame.push_back(static_cast<char>(kind));
    putU32(frame, aux);
    putU64(frame, handle);
    req.AppendToString(&frame);

    std::unique_lock<std::mutex> lock(mu_);
    if (generation != 0 && (!running_ || generation != generation_)) {
      return errnoRefusal(EBADF, "the file helper that held this file has exited; open it again");
    }
    if (!running_) {
      if (absl::Status s = startLocked(); !s.ok()) return s;
    }
    const uint64_t gen = generation_;
    cv_.wait(lock, [&] { return !free_.empty() || !running_ || generation_ != gen; });
    if (!running_ || generation_ != gen) return lostError("it exited during the request");
    UniqueFd conn = std::move(free_.back());
    free_.pop_back();
    // A buffer kept between answers (see serve()): at most one per
    // connection, so a read's MiB lands in memory already mapped.
    std::string answer;
    if (!spare_.empty()) {
      answer = std::move(spare_.back());
      spare_.pop_back();
    }
    lock.unlock();

    std::string bulk;
    UniqueFd passed;
    const FrameRead got = writeFrame(conn.get(), frame, send)
                              ? readAnswer(conn.get(), &answer, &bulk, &passed)
                              : FrameRead::kClosed;
    const bool io_ok = got == FrameRead::kOk;
    Reply reply;
    reply.generation = gen;
    bool parsed = false;
    absl::Status error;
    if (io_ok && answer.size() >= kAnswerHeader) {
      reply.handle = getLE(answer.data() + 1, 8);
      const char* body = answer.data() + kAnswerHeader;
      const int size = static_cast<int>(answer.size() - kAnswerHeader);
      if (answer[0] == kAnswerOk) {
        parsed = reply.response.ParseFromArray(body, size);
      } else if (answer[0] == kAnswerRead && answer.size() >= kAnswerHeader + 4) {
        parsed = reply.response.ParseFromArray(body + 4, size - 4) &&
                 reply.response.has_data() && reply.response.data().data().empty();
        if (parsed) *reply.response.mutable_data()->mutable_data() = std::move(bulk);
      } else if (answer[0] == kAnswerError) {
        v1::Error e;
        parsed = e.ParseFromArray(body, size);
        error = fromProtoError(e);
        if (parsed && error.ok()) error = protoError(v1::INTERNAL, "file helper: empty error");
      }
    }
    lock.lock();
    if (spare_.size() < kHelperConnections && answer.capacity() <= kSpareMax) {
      spare_.push_back(std::move(answer));
    }
    if (!parsed) {
      const std::string why =
          got == FrameRead::kClosed ? "its socket closed" : "it answered with a malformed frame";
      loseLocked(gen, why);
      return lostError(why);
    }
    if (running_ && generation_ == gen) {
      free_.push_back(std::move(conn));
      cv_.notify_one();
    }
    if (!error.ok()) return error;
    if (kind == kExport || kind == kWatchInstance) {
      if (!passed.valid()) return errnoRefusal(EMFILE, "file helper: its descriptor did not come");
      reply.passed = std::move(passed);
    } else if ((kind == kOpen || kind == kAdopt) && passed.valid() && pidfd_.valid()) {
      if (local_files_.fetch_add(1) < local_budget_) {
        reply.passed = std::move(passed);
      } else {
        local_files_.fetch_sub(1);  // read through the helper
      }
    }
    return reply;
  }

  // One file the agent read itself is closed (see Reply::passed).
  void localFileClosed() { local_files_.fetch_sub(1); }

  // The target restarted (Target::adopt): the helper running holds the old
  // root and the old process's identity, so it is stopped; the next request
  // starts one with the new root (the same fd number, now naming it) and
  // the identity of `target_pid`, the process adopted (options_.target
  // reads it through that process's pidfd). Files it had open answer
  // EBADF, as after a helper's crash: they were the old container's.
  void retarget(pid_t target_pid) {
    std::lock_guard<std::mutex> lock(mu_);
    if (running_) {
      log::info("fs_helper_retargeted", {{"pid", static_cast<int64_t>(pid_)},
                                         {"generation", generation_},
                                         {"target_pid", static_cast<int64_t>(target_pid)}});
    }
    stopLocked();
  }

  // Whether the helper that opened a file (`generation`) still runs, for a
  // read the agent makes itself on the file's descriptor: the same answers
  // as call() would give (EIO once when it is found gone, EBADF after), so
  // a file outlives its helper no more when read here than through it.
  absl::Status usable(uint64_t generation) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_ || generation != generation_) {
      return errnoRefusal(EBADF, "the file helper that held this file has exited; open it again");
    }
    pollfd p{pidfd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      loseLocked(generation, "it exited");
      return lostError("it exited");
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status lostError(std::string_view why) {
    return errnoRefusal(EIO, absl::StrCat("the file helper was lost (", asv(why),
                                          "); its open files are gone, a new one serves the "
                                          "next request"));
  }

  // Whose identity the helper starts with. The target's is read while its
  // pidfd pins it (Target::identity), never by a pid number alone: a pid
  // reused while the target is down would lend another process's.
  absl::StatusOr<Credentials> identity() {
    std::optional<TargetIdentity> target;
    if (options_.target) {
      ASSIGN_OR_RETURN(target, options_.target());
      // Another user namespace would need its uid_map and a setns into it;
      // root of ours would be more than the target's root.
      if (!target->in_agent_user_namespace) {
        return protoError(v1::UNIMPLEMENTED,
                          "file access to a target in another user namespace is not supported "
                          "yet (the file helper cannot take its identity)");
      }
    }
    if (options_.identity == FsIdentity::kRoot) {
      Credentials c;  // ids 0, no groups
      c.cap_effective = c.cap_permitted = kFileCaps;
      return c;
    }
    if (!target) return ownIdsWithoutCapabilities();
    return target->credentials;
  }

  absl::Status startLocked() {
    ASSIGN_OR_RETURN(Credentials c, identity());
    auto join = [](const auto& v) { return absl::StrJoin(v, ","); };
    std::vector<std::string> argv = {
        options_.exe,
        std::string(kFsHelperCommand),
        absl::StrCat("--conns=", kHelperConnections),
        absl::StrCat("--uid=", join(c.uid)),
        absl::StrCat("--gid=", join(c.gid)),
        absl::StrCat("--groups=", join(c.groups)),
        absl::StrCat("--caps=", absl::Hex(c.cap_effective), ",", absl::Hex(c.cap_permitted)),
        absl::StrCat("--all-processes=", options_.all_processes ? 1 : 0)};
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    char* envp[] = {nullptr};

    std::vector<UniqueFd> ours, theirs;
    for (int i = 0; i < kHelperConnections; ++i) {
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return lastErrnoStatus("file helper: socketpair");
      }
      ours.emplace_back(sv[0]);
      theirs.emplace_back(sv[1]);
    }
    int child_fds[kHelperConnections];
    for (int i = 0; i < kHelperConnections; ++i) child_fds[i] = theirs[i].get();
    const int root_fd = options_.root_fd;

    const pid_t pid = ::fork();
    if (pid < 0) return lastErrnoStatus("file helper: fork");
    if (pid == 0) {
      // Async-signal-safe calls only (the agent has threads). Everything is
      // first moved above the numbers it is then given.
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      int high[kHelperConnections + 1];
      high[0] = fcntl(root_fd, F_DUPFD, 16);
      for (int i = 0; i < kHelperConnections; ++i) high[i + 1] = fcntl(child_fds[i], F_DUPFD, 16);
      int devnull = open("/dev/null", O_RDWR);
      for (int fd : high) {
        if (fd < 0) _exit(126);
      }
      if (devnull < 0) _exit(126);
      dup2(devnull, 0);
      dup2(devnull, 1);
      dup2(high[0], kRootFd);
      for (int i = 0; i < kHelperConnections; ++i) dup2(high[i + 1], kFirstConnFd + i);
      close_range(kFirstConnFd + kHelperConnections, ~0U, 0);
      caps::raiseAmbient(caps::kFsHelperAmbient);
      execve(args[0], args.data(), envp);
      const char msg[] = "Eexec of the file helper failed";
      ssize_t ignored = write(kFirstConnFd, msg, sizeof msg - 1);
      (void)ignored;
      _exit(127);
    }
    theirs.clear();

    // 'R', or 'E' and why.
    pollfd p{ours[0].get(), POLLIN, 0};
    int n;
    do {
      n = ::poll(&p, 1, 10000);
    } while (n < 0 && errno == EINTR);
    char first = 0;
    std::string message;
    if (n > 0 && ::read(ours[0].get(), &first, 1) == 1 && first == 'E') {
      char buf[512];
      ssize_t got;
      while ((got = ::read(ours[0].get(), buf, sizeof buf)) > 0) message.append(buf, got);
    }
    if (first != 'R') {
      ::kill(pid, SIGKILL);
      reap(pid);
      log::warn("fs_helper_failed", {{"error", message}});
      return errnoRefusal(EIO, absl::StrCat("the file helper did not start: ",
                                            message.empty() ? "no answer" : message));
    }
    pid_ = pid;
    // Readable once the helper exits: how reads the agent makes itself see
    // it gone (usable()). None on a kernel before 5.3: files are then read
    // through the helper only.
    pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    running_ = true;
    ++generation_;
    free_ = std::move(ours);
    log::info("fs_helper_started",
              {{"pid", static_cast<int64_t>(pid)},
               {"identity", options_.identity == FsIdentity::kRoot ? "root" : "target"},
               {"uid", static_cast<int64_t>(c.uid[1])},
               {"generation", generation_}});
    return absl::OkStatus();
  }

  static void reap(pid_t pid) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }

  void loseLocked(uint64_t gen, std::string_view why) {
    if (!running_ || generation_ != gen) return;
    log::warn("fs_helper_lost", {{"pid", static_cast<int64_t>(pid_)}, {"reason", why}});
    stopLocked();
  }

  void stopLocked() {
    if (!running_) return;
    ::kill(pid_, SIGKILL);
    reap(pid_);
    pidfd_.reset();
    running_ = false;
    free_.clear();
    cv_.notify_all();
  }

  HelperOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;
  pid_t pid_ = -1;
  UniqueFd pidfd_;  // the running helper's
  uint64_t generation_ = 0;
  std::atomic<int64_t> local_files_{0};  // files with a descriptor here
  int64_t local_budget_ = 1024;
  std::vector<UniqueFd> free_;  // idle connections of the running helper
  std::vector<std::string> spare_;  // answer buffers kept for the next calls
};

// The descriptor of the helper's handle `id` (kExport).
absl::StatusOr<UniqueFd> exportHandle(Helper& helper, uint64_t gen, uint64_t id) {
  auto r = helper.call(gen, kExport, 0, id, R());
  if (!r.ok()) return r.status();
  return std::move(r->passed);
}

// A file the helper holds. Reads of a regular file go to `local`, the
// helper's descriptor passed to the agent, when it sent one: read here
// into the string that becomes the answer, they skip the helper's copy
// into its socket and the agent's out of it. Everything else (writes,
// seeks, fstat, truncate, sync, close) goes to the helper.
class RemoteFile : public FileObject {
 public:
  RemoteFile(std::shared_ptr<Helper> h, uint64_t gen, uint64_t id, UniqueFd local)
      : helper_(std::move(h)), gen_(gen), id_(id), local_(std::move(local)) {}
  ~RemoteFile() override {
    dropLocal();
    if (!closed_) (void)helper_->call(gen_, kRelease, 0, id_, R());
  }
  absl::StatusOr<v1::FileResponse> call(const R& req, uint32_t max_read) override {
    if (local_.valid() && (req.op_case() == R::kRead || req.op_case() == R::kPread)) {
      if (absl::Status s = helper_->usable(gen_); !s.ok()) return s;
      absl::StatusOr<v1::FileData> d =
          req.op_case() == R::kRead
              ? readFd(local_.get(), std::min(req.read().size(), max_read))
              : preadFd(local_.get(), std::min(req.pread().size(), max_read),
                        req.pread().offset());
      if (!d.ok()) return d.status();
      v1::FileResponse r;
      *r.mutable_data() = *std::move(d);
      return r;
    }
    auto r = helper_->call(gen_, kFileCall, max_read, id_, req);
    if (!r.ok()) return r.status();
    return std::move(r->response);
  }
  absl::StatusOr<std::optional<PipedRead>> splicePread(int64_t offset, uint32_t size) override {
    if (!local_.valid()) return std::nullopt;
    if (absl::Status s = helper_->usable(gen_); !s.ok()) return s;
    return splicePreadFd(local_.get(), size, offset);
  }
  absl::Status close() override {
    closed_ = true;
    dropLocal();  // first, so that the helper's close is the file's last
    return helper_->call(gen_, kClose, 0, id_, R()).status();
  }
  absl::StatusOr<UniqueFd> exportFd() override { return exportHandle(*helper_, gen_, id_); }

 private:
  void dropLocal() {
    if (!local_.valid()) return;
    local_.reset();
    helper_->localFileClosed();
  }

  std::shared_ptr<Helper> helper_;
  uint64_t gen_, id_;
  UniqueFd local_;
  bool closed_ = false;
};

class RemoteDir : public DirObject {
 public:
  RemoteDir(std::shared_ptr<Helper> h, uint64_t gen, uint64_t id)
      : helper_(std::move(h)), gen_(gen), id_(id) {}
  ~RemoteDir() override { (void)helper_->call(gen_, kRelease, 0, id_, R()); }
  absl::StatusOr<v1::FileDirEntries> read(uint32_t max_entries, size_t max_bytes,
                                          bool with_stat) override {
    R req;
    req.mutable_readdir()->set_max_entries(max_entries);
    req.mutable_readdir()->set_with_stat(with_stat);
    auto r = helper_->call(gen_, kReaddir, static_cast<uint32_t>(max_bytes), id_, req);
    if (!r.ok()) return r.status();
    if (!r->response.has_entries()) return protoError(v1::INTERNAL, "file helper: not entries");
    return std::move(*r->response.mutable_entries());
  }
  absl::StatusOr<UniqueFd> exportFd() override { return exportHandle(*helper_, gen_, id_); }

 private:
  std::shared_ptr<Helper> helper_;
  uint64_t gen_, id_;
};

class HelperFileSystem : public FileSystem {
 public:
  explicit HelperFileSystem(HelperOptions options)
      : helper_(std::make_shared<Helper>(std::move(options))) {}

  absl::StatusOr<Handle> open(const R& req) override {
    return handleOf(helper_->call(0, kOpen, 0, 0, req), req.op_case() == R::kOpendir);
  }

  absl::StatusOr<Handle> adopt(UniqueFd fd, bool dir) override {
    return handleOf(helper_->call(0, kAdopt, dir ? 1 : 0, 0, R(), fd.get()), dir);
  }

  absl::StatusOr<v1::FileResponse> path(const R& req, bool writes_refused) override {
    auto r = helper_->call(0, kPath, writes_refused ? 1 : 0, 0, req);
    if (!r.ok()) return r.status();
    return std::move(r->response);
  }

  void targetRestarted(pid_t pid) override { helper_->retarget(pid); }

  absl::StatusOr<UniqueFd> newWatchInstance() override {
    auto r = helper_->call(0, kWatchInstance, 0, 0, R());
    if (!r.ok()) return r.status();
    return std::move(r->passed);
  }

  absl::StatusOr<int> addWatch(int instance, const std::string& path, uint32_t mask) override {
    R req;
    req.mutable_watch()->set_path(path);
    auto r = helper_->call(0, kWatch, mask, 0, req, instance);
    if (!r.ok()) return r.status();
    if (!r->response.has_watched() || r->response.watched().watch() == 0 ||
        r->response.watched().watch() > static_cast<uint64_t>(INT32_MAX)) {
      return protoError(v1::INTERNAL, "file helper: not a watch descriptor");
    }
    return static_cast<int>(r->response.watched().watch());
  }

 private:
  // The object behind the handle an open or an adopt made in the helper.
  absl::StatusOr<Handle> handleOf(absl::StatusOr<Helper::Reply> r, bool dir) {
    if (!r.ok()) return r.status();
    if (dir) {
      return Handle(std::shared_ptr<DirObject>(
          std::make_shared<RemoteDir>(helper_, r->generation, r->handle)));
    }
    return Handle(std::shared_ptr<FileObject>(std::make_shared<RemoteFile>(
        helper_, r->generation, r->handle, std::move(r->passed))));
  }

  std::shared_ptr<Helper> helper_;
};

}  // namespace

std::shared_ptr<FileSystem> makeHelperFileSystem(HelperOptions options) {
  return std::make_shared<HelperFileSystem>(std::move(options));
}

std::shared_ptr<FileSystem> makeFileSystem(ServiceContext& ctx) {
  const bool targetless = ctx.target.mode() == TargetMode::kTargetless;
  GuardOptions guard;
  guard.all_processes = ctx.config.fs_identity == FsIdentity::kRoot || targetless;
  if (ctx.config.fs_helper_exe.empty()) {
    return std::make_shared<LocalFileSystem>(ctx.target.rootFd(), guard);
  }
  HelperOptions o;
  o.exe = ctx.config.fs_helper_exe;
  o.root_fd = ctx.target.rootFd();
  o.identity = ctx.config.fs_identity;
  if (!targetless) {
    o.target = [&target = ctx.target, &procfs = ctx.procfs] { return target.identity(procfs); };
  }
  o.all_processes = guard.all_processes;
  return makeHelperFileSystem(std::move(o));
}

int fsHelperMain(int argc, char** argv) {
  auto fail = [](std::string_view what) {
    std::string msg = absl::StrCat("E", asv(what));
    (void)writeAll(kFirstConnFd, msg);
    std::fprintf(stderr, "siphon-agent fs-helper: %.*s\n", static_cast<int>(what.size()),
                 what.data());
    return 1;
  };
  Credentials c;
  bool all_processes = false;
  int conns = 0;
  for (int i = 2; i < argc; ++i) {
    std::string_view a(argv[i]);
    const size_t eq = a.find('=');
    if (eq == std::string_view::npos) return fail(absl::StrCat("bad argument ", asv(a)));
    const std::string_view key = a.substr(0, eq), value = a.substr(eq + 1);
    std::vector<uint64_t> v;
    if (key == "--uid" || key == "--gid") {
      if (!parseList(value, &v) || v.size() != 4) return fail(absl::StrCat("bad ", asv(key)));
      auto& ids = key == "--uid" ? c.uid : c.gid;
      for (size_t k = 0; k < 4; ++k) ids[k] = static_cast<uint32_t>(v[k]);
    } else if (key == "--groups") {
      if (!parseList(value, &v)) return fail("bad --groups");
      for (uint64_t g : v) c.groups.push_back(static_cast<uint32_t>(g));
    } else if (key == "--caps") {
      if (!parseList(value, &v, true) || v.size() != 2) return fail("bad --caps");
      c.cap_effective = v[0];
      c.cap_permitted = v[1];
    } else if (key == "--all-processes") {
      all_processes = value == "1";
    } else if (key == "--conns") {
      if (!absl::SimpleAtoi(asv(value), &conns) || conns < 1 || conns > 64)
        return fail("bad --conns");
    } else {
      return fail(absl::StrCat("unknown argument ", asv(key)));
    }
  }
  if (conns == 0) return fail("--conns missing");
  struct stat st {};
  if (::fstat(kRootFd, &st) != 0 || !S_ISDIR(st.st_mode)) return fail("no root directory at fd 3");
  if (absl::Status s = takeIdentity(c); !s.ok()) {
    return fail(absl::StrCat("taking the target's identity: ", asv(sv(s.message()))));
  }
  // No umask of our own: a mode asked for is the mode made. The FUSE
  // mount's kernel applied the calling program's umask already, and the
  // agent's (022, say) on top made open(O_CREAT, 0620) under umask 0 a
  // 0600 file.
  ::umask(0);
  GuardOptions guard;
  guard.all_processes = all_processes;
  keepBulkBuffers();
  HelperServer server(kRootFd, guard);
  if (!writeAll(kFirstConnFd, "R")) return 1;
  auto serveConn = [&server](int fd) {
    std::string frame, answer, bulk;
    HelperServer::Pass pass;
    UniqueFd received;
    while (readFrame(fd, &frame, &received)) {
      // An open's descriptor is the handle's own: it stays open here until
      // the handle's release, after this answer went.
      server.serve(frame, std::move(received), &answer, &bulk, &pass);
      if (!writeParts(fd, answer, bulk, pass.fd)) break;
    }
    // The agent closed (or broke) a connection: it is gone or gave up on
    // this helper. Nothing else to serve.
    _exit(0);
  };
  // Threads only now: each has the identity taken above.
  for (int i = 1; i < conns; ++i) std::thread(serveConn, kFirstConnFd + i).detach();
  serveConn(kFirstConnFd);
  return 0;
}

}  // namespace siphon::agent::files
