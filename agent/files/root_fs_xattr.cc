// RootFs's extended attribute calls (root_fs.h).
//
// f*xattr refuse O_PATH fds (EBADF), and opening the object for real could
// act on it (a FIFO, a device, an automount). So the object is resolved in
// the root as O_PATH, O_NOFOLLOW unless the final symlink is to be
// followed, and the path-taking call (getxattr, not lgetxattr) is given the
// agent's own /proc/self/fd/N: that magic link jumps to the very inode
// openat2 resolved, a symlink itself included, and nothing of the target's
// path is looked up again (glibc's fchmodat(AT_SYMLINK_NOFOLLOW) does the
// same; RootFs::chmod before Linux 6.6 too).
#include <fcntl.h>
#include <sys/xattr.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "agent/common/root_path.h"
#include "agent/files/root_fs.h"
#include "siphon/status.h"

namespace siphon::agent::files {
namespace {

std::string what(std::string_view op, std::string_view path, std::string_view name) {
  return name.empty() ? absl::StrCat(asv(op), " ", asv(path))
                      : absl::StrCat(asv(op), " ", asv(path), " ", asv(name));
}

std::string selfFd(int fd) { return absl::StrCat("/proc/self/fd/", fd); }

// The name as the kernel would refuse it, before the call: a NUL would cut
// it short (another attribute); empty or longer than XATTR_NAME_MAX is
// ERANGE.
absl::Status checkName(std::string_view op, std::string_view path, std::string_view name) {
  if (name.find('\0') != std::string_view::npos) return errnoStatus(EINVAL, what(op, path, name));
  if (name.empty() || name.size() > kMaxXattrName) {
    return errnoStatus(ERANGE, what(op, path, name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UniqueFd> RootFs::xattrTarget(std::string_view op, std::string_view path,
                                             bool follow) const {
  UniqueFd fd;
  if (int err = openInRoot(root_fd_, path, O_PATH | (follow ? 0 : O_NOFOLLOW), 0, &fd)) {
    return errnoStatus(err, absl::StrCat(asv(op), " ", asv(path)));
  }
  return fd;
}

absl::StatusOr<std::string> RootFs::getxattr(std::string_view path, std::string_view name,
                                             bool follow) const {
  RETURN_IF_ERROR(checkName("getxattr", path, name));
  ASSIGN_OR_RETURN(UniqueFd fd, xattrTarget("getxattr", path, follow));
  const std::string key(name);
  // No value is larger than XATTR_SIZE_MAX: one call, no size probe that a
  // concurrent change could make stale.
  std::string buf(kMaxXattrValue, '\0');
  const ssize_t n = ::getxattr(selfFd(fd.get()).c_str(), key.c_str(), buf.data(), buf.size());
  if (n < 0) return lastErrnoStatus(what("getxattr", path, name));
  buf.resize(static_cast<size_t>(n));
  return buf;
}

absl::StatusOr<std::vector<std::string>> RootFs::listxattr(std::string_view path,
                                                           bool follow) const {
  ASSIGN_OR_RETURN(UniqueFd fd, xattrTarget("listxattr", path, follow));
  std::string buf(kMaxXattrList, '\0');
  const ssize_t n = ::listxattr(selfFd(fd.get()).c_str(), buf.data(), buf.size());
  if (n < 0) return lastErrnoStatus(what("listxattr", path, ""));
  std::vector<std::string> names;
  size_t start = 0;
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    if (buf[i] != '\0') continue;
    if (i > start) names.emplace_back(buf.data() + start, i - start);
    start = i + 1;
  }
  return names;
}

absl::Status RootFs::setxattr(std::string_view path, std::string_view name, std::string_view value,
                              int flags, bool follow) const {
  RETURN_IF_ERROR(checkName("setxattr", path, name));
  if (value.size() > kMaxXattrValue) return errnoStatus(E2BIG, what("setxattr", path, name));
  ASSIGN_OR_RETURN(UniqueFd fd, xattrTarget("setxattr", path, follow));
  const std::string key(name);
  if (::setxattr(selfFd(fd.get()).c_str(), key.c_str(), value.data(), value.size(), flags) != 0) {
    return lastErrnoStatus(what("setxattr", path, name));
  }
  return absl::OkStatus();
}

absl::Status RootFs::removexattr(std::string_view path, std::string_view name, bool follow) const {
  RETURN_IF_ERROR(checkName("removexattr", path, name));
  ASSIGN_OR_RETURN(UniqueFd fd, xattrTarget("removexattr", path, follow));
  const std::string key(name);
  if (::removexattr(selfFd(fd.get()).c_str(), key.c_str()) != 0) {
    return lastErrnoStatus(what("removexattr", path, name));
  }
  return absl::OkStatus();
}

}  // namespace siphon::agent::files
