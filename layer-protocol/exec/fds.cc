#include "exec/fds.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>

namespace siphon::exec {
namespace {

// The kept descriptors from 3 up, sorted, without repeats (insertion sort
// on the stack: nothing allocated after a fork).
struct Kept {
  int fds[kMaxKeptDescriptors];
  size_t n = 0;
  bool has(int fd) const {
    for (size_t i = 0; i < n; ++i) {
      if (fds[i] == fd) return true;
    }
    return false;
  }
};

bool sortKept(const int* keep, size_t count, Kept* out) {
  if (count > kMaxKeptDescriptors) return false;
  for (size_t i = 0; i < count; ++i) {
    const int fd = keep[i];
    if (fd < 3 || out->has(fd)) continue;
    size_t j = out->n++;
    while (j > 0 && out->fds[j - 1] > fd) {
      out->fds[j] = out->fds[j - 1];
      --j;
    }
    out->fds[j] = fd;
  }
  return true;
}

void act(int fd, FdAction action) {
  if (action == FdAction::kClose) {
    ::close(fd);
    return;
  }
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

// 0, or the errno of close_range (ENOSYS, or EINVAL for a flag the kernel
// does not know): then nothing was done that the next way does not redo.
int byCloseRange(const Kept& kept, FdAction action) {
  const unsigned flags = action == FdAction::kCloseOnExec ? CLOSE_RANGE_CLOEXEC : 0;
  unsigned from = 3;
  for (size_t i = 0; i <= kept.n; ++i) {
    const unsigned to = i < kept.n ? static_cast<unsigned>(kept.fds[i]) - 1 : ~0U;
    if (from <= to && ::syscall(SYS_close_range, from, to, flags) != 0) return errno;
    if (i < kept.n) from = static_cast<unsigned>(kept.fds[i]) + 1;
  }
  return 0;
}

// Each open descriptor, as /proc/self/fd lists them (read with getdents64:
// opendir allocates). Closing entries already read is safe: the directory's
// position is a descriptor number. 0, or the errno of the listing.
int byListing(const Kept& kept, FdAction action) {
  const int dir = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return errno;
  alignas(8) char buf[4096];
  while (true) {
    const long n = ::syscall(SYS_getdents64, dir, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(dir);
      return err;
    }
    if (n == 0) break;
    for (long off = 0; off < n;) {
      const auto* d = reinterpret_cast<const dirent64*>(buf + off);
      off += d->d_reclen;
      int fd = 0;
      bool number = d->d_name[0] != '\0';
      for (const char* p = d->d_name; *p != '\0' && number; ++p) {
        number = *p >= '0' && *p <= '9' && fd < INT_MAX / 10;
        fd = fd * 10 + (*p - '0');
      }
      if (!number || fd < 3 || fd == dir || kept.has(fd)) continue;
      act(fd, action);
    }
  }
  ::close(dir);
  return 0;
}

void byEveryNumber(const Kept& kept, FdAction action) {
  rlimit lim{};
  rlim_t max = 1 << 16;
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) max = lim.rlim_cur;
  if (max > (1u << 20)) max = 1u << 20;  // nr_open's default ceiling
  for (rlim_t fd = 3; fd < max; ++fd) {
    if (!kept.has(static_cast<int>(fd))) act(static_cast<int>(fd), action);
  }
}

int finish(const Kept& kept, FdAction action) {
  if (action != FdAction::kCloseOnExec) return 0;
  for (size_t i = 0; i < kept.n; ++i) {
    const int flags = ::fcntl(kept.fds[i], F_GETFD);
    if (flags < 0 || ::fcntl(kept.fds[i], F_SETFD, flags & ~FD_CLOEXEC) != 0) return errno;
  }
  return 0;
}

}  // namespace

int keepOnlyDescriptors(const int* keep, size_t n, FdAction action) {
  Kept kept;
  if (!sortKept(keep, n, &kept)) return EINVAL;
  if (byCloseRange(kept, action) != 0 && byListing(kept, action) != 0) {
    byEveryNumber(kept, action);
  }
  return finish(kept, action);
}

int keepOnlyDescriptorsForTest(const int* keep, size_t n, FdAction action, FdMethod method) {
  Kept kept;
  if (!sortKept(keep, n, &kept)) return EINVAL;
  switch (method) {
    case FdMethod::kCloseRange:
      if (const int err = byCloseRange(kept, action); err != 0) return err;
      break;
    case FdMethod::kListing:
      if (const int err = byListing(kept, action); err != 0) return err;
      break;
    case FdMethod::kEveryNumber:
      byEveryNumber(kept, action);
      break;
  }
  return finish(kept, action);
}

}  // namespace siphon::exec
