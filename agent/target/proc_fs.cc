#include "agent/target/proc_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

// Debian 12's headers know it; older build hosts may not.
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace siphon::agent {

RealProcFs::RealProcFs(std::string proc_root, size_t max_environ_bytes)
    : proc_root_(std::move(proc_root)), max_environ_bytes_(max_environ_bytes) {}

std::string RealProcFs::path(pid_t pid, const char* leaf) const {
  if (leaf == nullptr || *leaf == '\0') return absl::StrCat(proc_root_, "/", pid);
  return absl::StrCat(proc_root_, "/", pid, "/", leaf);
}

absl::StatusOr<std::string> RealProcFs::readCapped(const std::string& p, size_t cap,
                                                   std::string_view what) {
  // The ptrace access check happens at open(), so EACCES shows up here.
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return lastErrnoStatus(absl::StrCat("open ", p));

  std::string out;
  char buf[16 * 1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return lastErrnoStatus(absl::StrCat("read ", p));
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > cap) {
      return absl::ResourceExhaustedError(
          absl::StrCat("read ", p, ": ", asv(what), " larger than the ", cap, "-byte limit"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<std::string> RealProcFs::readEnviron(pid_t pid) {
  return readCapped(path(pid, "environ"), max_environ_bytes_, "environment");
}

absl::StatusOr<UniqueFd> RealProcFs::openNetns(pid_t pid) {
  const std::string p = path(pid, "ns/net");
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return lastErrnoStatus(absl::StrCat("open ", p));
  return fd;
}

absl::StatusOr<UniqueFd> RealProcFs::openRoot(pid_t pid) {
  const std::string p = path(pid, "root");
  // O_PATH: the fd only anchors path resolution; it must not need read
  // permission on the container's "/" itself.
  UniqueFd fd(::open(p.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return lastErrnoStatus(absl::StrCat("open ", p));
  return fd;
}

absl::StatusOr<UniqueFd> RealProcFs::openPidfd(pid_t pid) {
  // pidfds are always close-on-exec; flags must be 0.
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOSYS) {
      return absl::UnimplementedError(
          absl::StrCat("pidfd_open(", pid,
                       "): not supported by this kernel (Linux 5.3 or later is needed to "
                       "watch the target process)"));
    }
    return errnoStatus(err, absl::StrCat("pidfd_open(", pid, ")"));
  }
  return UniqueFd(static_cast<int>(fd));
}

absl::StatusOr<uint64_t> RealProcFs::inodeOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return lastErrnoStatus(absl::StrCat("fstat fd ", fd));
  return static_cast<uint64_t>(st.st_ino);
}

absl::StatusOr<bool> RealProcFs::hasExited(int pidfd) {
  struct pollfd pfd {};
  pfd.fd = pidfd;
  pfd.events = POLLIN;
  for (;;) {
    int n = ::poll(&pfd, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return lastErrnoStatus(absl::StrCat("poll pidfd ", pidfd));
    }
    if (n > 0 && (pfd.revents & POLLNVAL)) {
      return errnoStatus(EBADF, absl::StrCat("poll pidfd ", pidfd));
    }
    return n > 0 && (pfd.revents & POLLIN) != 0;
  }
}

bool RealProcFs::processExists(pid_t pid) {
  if (pid <= 0) return false;
  const std::string p = path(pid, nullptr);
  struct stat st {};
  if (::stat(p.c_str(), &st) == 0) return true;
  // Denied is still "there"; only absence means gone.
  return errno == EACCES || errno == EPERM;
}

pid_t RealProcFs::selfPid() { return ::getpid(); }

absl::StatusOr<std::vector<pid_t>> RealProcFs::listPids() {
  DIR* dir = ::opendir(proc_root_.c_str());
  if (dir == nullptr) return lastErrnoStatus(absl::StrCat("opendir ", proc_root_));
  std::vector<pid_t> pids;
  int err = 0;
  for (;;) {
    errno = 0;  // readdir returns NULL both at the end and on error
    const struct dirent* e = ::readdir(dir);
    if (e == nullptr) {
      err = errno;
      break;
    }
    // Only all-digit names are processes ("self", "net", "sys"... are not).
    const char* name = e->d_name;
    const size_t len = std::strlen(name);
    if (len == 0 || len > 9 || std::strspn(name, "0123456789") != len) continue;
    const long pid = std::strtol(name, nullptr, 10);
    if (pid > 0) pids.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  if (err != 0) return errnoStatus(err, absl::StrCat("readdir ", proc_root_));
  std::sort(pids.begin(), pids.end());
  return pids;
}

absl::StatusOr<std::string> RealProcFs::readCgroup(pid_t pid) {
  return readCapped(path(pid, "cgroup"), size_t{64} << 10, "cgroup file");
}

absl::StatusOr<std::string> RealProcFs::readComm(pid_t pid) {
  ASSIGN_OR_RETURN(std::string comm, readCapped(path(pid, "comm"), 64, "comm file"));
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

absl::StatusOr<std::string> RealProcFs::readStatus(pid_t pid) {
  return readCapped(path(pid, "status"), size_t{64} << 10, "status file");
}

absl::StatusOr<NamespaceId> RealProcFs::userNamespace(pid_t pid) {
  const std::string p = path(pid, "ns/user");
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return lastErrnoStatus(absl::StrCat("stat ", p));
  return NamespaceId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

}  // namespace siphon::agent
