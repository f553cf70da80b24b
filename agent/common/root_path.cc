#include "agent/common/root_path.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace siphon::agent {
namespace {

long realOpenat2(int dirfd, const char* path, const struct open_how* how, size_t size) {
  return ::syscall(SYS_openat2, dirfd, path, how, size);
}

}  // namespace

int openInRoot(int root_fd, std::string_view path, int flags, mode_t mode, UniqueFd* out,
               Openat2Fn openat2) {
  // A NUL inside would silently cut the path short.
  if (path.find('\0') != std::string_view::npos) return EINVAL;
  if (path.empty()) return ENOENT;
  if (openat2 == nullptr) openat2 = realOpenat2;
  const std::string p(path);
  struct open_how how {};
  how.flags = static_cast<uint64_t>(static_cast<unsigned>(flags)) | O_CLOEXEC;
  how.mode = mode;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  int err = EAGAIN;
  for (int attempt = 0; attempt < kMaxRootPathAttempts; ++attempt) {
    const long fd = openat2(root_fd, p.c_str(), &how, sizeof how);
    if (fd >= 0) {
      out->reset(static_cast<int>(fd));
      return 0;
    }
    err = errno;
    if (err != EAGAIN && err != EINTR) return err;
  }
  return err;
}

}  // namespace siphon::agent
