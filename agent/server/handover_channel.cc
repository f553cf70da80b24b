#include "agent/server/handover_channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "siphon/protocol/limits.h"
#include "siphon/protocol/session.h"
#include "siphon/status.h"

namespace siphon::agent::handover {

namespace {

absl::StatusOr<sockaddr_un> unixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("handover socket '", path, "': a path of 1 to ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// Waits until `fd` is readable or `timeout` passes.
absl::Status waitReadable(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (n > 0) return absl::OkStatus();
    if (n == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no message within ", timeout.count(), " ms"));
    }
    if (errno != EINTR) return lastErrnoStatus("poll the handover socket");
  }
}

constexpr char kOwnPlace[] =
    "put the socket in the agent's own file system: in a container its /dev, a tmpfs of its "
    "own (e.g. /dev/siphon-handover.sock)";

}  // namespace

absl::Status checkSocketPlace(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--handover-socket ", path, ": ", why));
  };
  if (path.empty() || path[0] != '/') {
    return bad(
        absl::StrCat("must be an absolute path (a relative one, or an abstract name, is "
                     "no place of the agent's own); ",
                     kOwnPlace));
  }
  RETURN_IF_ERROR(unixAddress(path).status());
  const size_t slash = path.rfind('/');
  const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
  char real[PATH_MAX];
  if (::realpath(dir.c_str(), real) == nullptr) {
    return bad(absl::StrCat("its directory ", dir, ": ", std::strerror(errno)));
  }
  const std::string top(real);
  const std::string shared = absl::StrCat(
      "the pod's /dev/shm, which containerd and CRI-O share between every container of the "
      "pod; ",
      kOwnPlace);
  if (top == "/dev/shm" || top.rfind("/dev/shm/", 0) == 0) {
    return bad(absl::StrCat(top, " is ", shared));
  }
  struct stat shm {
  }, dev{}, here{};
  // /dev/shm bound elsewhere too (/run/shm): the same file system. Only
  // when /dev/shm is a mount of its own (else it is /dev's).
  if (::stat("/dev/shm", &shm) == 0 && ::stat("/dev", &dev) == 0 && shm.st_dev != dev.st_dev &&
      ::stat(top.c_str(), &here) == 0 && here.st_dev == shm.st_dev) {
    return bad(absl::StrCat(top, " is on the file system of ", shared));
  }
  for (std::string cur = top;;) {
    struct stat st {};
    if (::lstat(cur.c_str(), &st) != 0) return bad(absl::StrCat(cur, ": ", std::strerror(errno)));
    if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
      return bad(absl::StrCat(cur, " belongs to uid ", st.st_uid,
                              ", who could put a socket or a file there first; ", kOwnPlace));
    }
    const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (others_write && (cur == top || (st.st_mode & S_ISVTX) == 0)) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return bad(absl::StrCat(cur, " is writable by others (mode ", mode,
                              "; a volume shared with other containers, such as an emptyDir, "
                              "is), who could put a socket or a file there first; ",
                              kOwnPlace));
    }
    if (cur == "/") break;
    const size_t up = cur.rfind('/');
    cur = up == 0 ? "/" : cur.substr(0, up);
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> listen(const std::string& path) {
  ASSIGN_OR_RETURN(sockaddr_un addr, unixAddress(path));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::AlreadyExistsError(
          absl::StrCat("--handover-socket ", path, ": exists and is not a socket"));
    }
    // A socket file nobody listens on (an agent that died): replaced.
    UniqueFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (probe && ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("--handover-socket ", path, ": another agent listens there"));
    }
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return lastErrnoStatus("handover socket");
  // Bound with no permission for anyone else from the first moment.
  const mode_t old = ::umask(0177);
  int rc = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old);
  if (rc != 0) return errnoStatus(bind_errno, absl::StrCat("--handover-socket ", path, ": bind"));
  if (::chmod(path.c_str(), 0600) != 0) {
    return lastErrnoStatus(absl::StrCat("--handover-socket ", path, ": chmod"));
  }
  if (::listen(fd.get(), 4) != 0) {
    return lastErrnoStatus(absl::StrCat("--handover-socket ", path, ": listen"));
  }
  return fd;
}

absl::StatusOr<UniqueFd> connect(const std::string& path, std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(sockaddr_un addr, unixAddress(path));
  // Non-blocking: a unix listener whose queue is full answers EAGAIN
  // instead of holding connect() until it accepts. send() and receive()
  // wait for the socket themselves.
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return lastErrnoStatus("handover socket");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int rc;
  while ((rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr))) != 0 &&
         (errno == EAGAIN || errno == EINTR) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (rc != 0) {
    const int err = errno;
    if (err == EAGAIN) {
      return absl::DeadlineExceededError(absl::StrCat("--take-over ", path,
                                                      ": the listener took no connection within ",
                                                      timeout.count(), " ms"));
    }
    std::string hint;
    if (err == ENOENT || err == ECONNREFUSED) {
      hint = " (is an agent running with --handover-socket there?)";
    }
    return errnoStatus(err, absl::StrCat("--take-over ", path, hint));
  }
  return fd;
}

absl::StatusOr<ucred> checkPeer(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return lastErrnoStatus("SO_PEERCRED");
  }
  if (cred.uid != 0 && cred.uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat("the peer (pid ", cred.pid, ", uid ", cred.uid,
                                                    ") is neither root nor this agent's uid ",
                                                    ::geteuid()));
  }
  return cred;
}

absl::Status send(int sock, const v1::HandoverMessage& message, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerPacket) {
    return absl::InvalidArgumentError("too many descriptors for one handover packet");
  }
  std::string bytes = message.SerializeAsString();
  if (bytes.size() > kMaxPacket) return absl::InvalidArgumentError("handover packet too large");
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  while (true) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return absl::OkStatus();
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      pollfd p{sock, POLLOUT, 0};
      ::poll(&p, 1, 1000);
      continue;
    }
    return lastErrnoStatus("send on the handover socket");
  }
}

absl::StatusOr<v1::HandoverMessage> receive(int sock, std::chrono::milliseconds timeout,
                                            std::vector<UniqueFd>* fds) {
  RETURN_IF_ERROR(waitReadable(sock, timeout));
  std::string buf(kMaxPacket, '\0');
  iovec iov{buf.data(), buf.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return lastErrnoStatus("receive on the handover socket");
  // Descriptors first: they are ours to close whatever else is wrong.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds->emplace_back(fd);
    }
  }
  if (n == 0) return absl::UnavailableError("the other agent closed the handover socket");
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    return absl::DataLossError("a handover packet was cut short");
  }
  v1::HandoverMessage m;
  if (!m.ParseFromArray(buf.data(), static_cast<int>(n))) {
    return absl::DataLossError("a handover packet does not parse");
  }
  return m;
}

absl::StatusOr<UniqueFd> toMemfd(const std::string& bytes) {
  UniqueFd fd(::memfd_create("siphon-handover", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return lastErrnoStatus("memfd_create");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return lastErrnoStatus("write the handover state");
    done += static_cast<size_t>(n);
  }
  // The new agent reads only a sealed state (fromMemfd).
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) !=
      0) {
    return lastErrnoStatus("seal the handover state");
  }
  return fd;
}

absl::StatusOr<std::string> fromMemfd(int fd, uint64_t size, uint64_t max_bytes) {
  if (size > max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the handover state holds ", size,
                                                     " bytes, above --handover-max-state (",
                                                     max_bytes >> 20, " MiB)"));
  }
  // Sealed first, then its size: once sealed it cannot change.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the handover state is not a memfd (F_GET_SEALS: ", std::strerror(errno), ")"));
  }
  constexpr int kNeeded = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
  if ((seals & kNeeded) != kNeeded) {
    return absl::PermissionDeniedError(
        "the handover state's memfd is not sealed against writing, growing and shrinking");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return lastErrnoStatus("fstat the handover state");
  if (!S_ISREG(st.st_mode)) return absl::PermissionDeniedError("the handover state is not a memfd");
  if (static_cast<uint64_t>(st.st_size) != size) {
    return absl::DataLossError(
        absl::StrCat("the handover state holds ", st.st_size, " bytes, not ", size));
  }
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, out.data() + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return lastErrnoStatus("read the handover state");
    if (n == 0) return absl::DataLossError("the handover state ends early");
    done += static_cast<size_t>(n);
  }
  return out;
}

void clampImportedLimits(v1::AgentState* state) {
  for (v1::SessionExport& e : *state->mutable_sessions()) {
    v1::SessionState& p = *e.mutable_protocol();
    protocol::SessionLimits l = protocol::clampLimits(protocol::Session::limitsOf(p));
    l.max_stream_window =
        std::clamp(l.max_stream_window, l.initial_stream_window, protocol::kMaxStreamWindowCeiling);
    l.window_growth_budget =
        std::min(l.window_growth_budget, protocol::SessionLimits{}.window_growth_budget);
    protocol::Session::setLimitsOf(l, &p);
  }
}

size_t descriptorRoom() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  size_t open = 0;
  if (DIR* d = ::opendir("/proc/self/fd"); d != nullptr) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++open;
    }
    ::closedir(d);
  }
  // Room to go on serving: the sockets a resume, a metrics scrape and the
  // helpers' pipes take.
  constexpr size_t kReserve = 64;
  const size_t limit = static_cast<size_t>(rl.rlim_cur);
  return limit > open + kReserve ? limit - open - kReserve : 0;
}

v1::HandoverMessage refusal(std::string reason) {
  v1::HandoverMessage m;
  m.mutable_refused()->set_reason(std::move(reason));
  return m;
}

}  // namespace siphon::agent::handover
