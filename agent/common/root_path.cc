#include "agent/common/root_path.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>

namespace siphon::agent {
namespace {

long realOpenat2(int dirfd, const char* path, const struct open_how* how, size_t size) {
  return ::syscall(SYS_openat2, dirfd, path, how, size);
}

// One openat2 with the bounded EAGAIN/EINTR retry: 0 (`out` set) or the
// errno.
int openOnce(Openat2Fn openat2, int dirfd, const std::string& path, int flags, mode_t mode,
             uint64_t resolve, UniqueFd* out) {
  struct open_how how {};
  how.flags = static_cast<uint64_t>(static_cast<unsigned>(flags)) | O_CLOEXEC;
  how.mode = mode;
  how.resolve = resolve;
  int err = EAGAIN;
  for (int attempt = 0; attempt < kMaxRootPathAttempts; ++attempt) {
    const long fd = openat2(dirfd, path.c_str(), &how, sizeof how);
    if (fd >= 0) {
      out->reset(static_cast<int>(fd));
      return 0;
    }
    err = errno;
    if (err != EAGAIN && err != EINTR) return err;
  }
  return err;
}

constexpr uint64_t kInRoot = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
constexpr uint64_t kBeneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
// The longest string a path argument may be: PATH_MAX counts its NUL.
constexpr size_t kMaxPiece = PATH_MAX - 1;
// The kernel's own bound on the symlinks one walk follows (MAXSYMLINKS).
constexpr int kMaxLinks = 40;

// What makes two directories the same place: its mount and its inode.
struct Place {
  uint64_t mnt = 0, dev = 0, ino = 0;
  bool operator==(const Place&) const = default;
};

// Where `fd` is; nullopt with errno set when that cannot be told.
std::optional<Place> placeOf(int fd) {
  struct statx stx {};
  if (::statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_INO | STATX_MNT_ID, &stx) != 0) {
    return std::nullopt;
  }
  if ((stx.stx_mask & STATX_MNT_ID) == 0) {
    errno = ENOSYS;  // before Linux 5.8
    return std::nullopt;
  }
  return Place{stx.stx_mnt_id, makedev(stx.stx_dev_major, stx.stx_dev_minor), stx.stx_ino};
}

// A path of PATH_MAX bytes or more, which no single openat2 takes (a deep
// tree: a program whose working directory is deep inside a FUSE mount of
// the target names paths relative to it, and the mount sends them from
// the root). It is walked in pieces of fewer than PATH_MAX bytes, each
// from the directory the ones before it reached (`cur`), with the same
// answer a walk of the whole path in the root would give and the same
// guarantee that nothing outside the root is reached:
//  - a piece walked from the root itself is an openat2 RESOLVE_IN_ROOT;
//  - a piece walked from a directory below the root is an openat2
//    RESOLVE_BENEATH of that directory. What it reaches without leaving
//    the directory is what the whole walk reaches; where it would leave
//    it (a ".." above it, an absolute symlink, a relative one that climbs
//    out) the kernel answers EXDEV before it goes there, and that one
//    component is walked by hand:
//  - by hand: ".." is the directory's parent, or the root itself at the
//    root (the root is known by its mount and inode, as the kernel knows
//    it); a symlink's text is read and walked in its place, from the
//    root when it is absolute (at most 40 links by hand, as the kernel);
//    a name is an openat2 RESOLVE_BENEATH of that one name. The walk is
//    never outside the root: it starts there, a name is beneath where it
//    is, and a ".." is above only a directory strictly inside the root.
// Magic links still fail with ELOOP (RESOLVE_NO_MAGICLINKS on every call).
int openLong(int root_fd, std::string_view path, int flags, mode_t mode, UniqueFd* out,
             Openat2Fn openat2) {
  const std::optional<Place> root = placeOf(root_fd);
  if (!root) return errno;
  UniqueFd cur;  // none: the root
  std::string rest(path);
  int links = 0;
  for (;;) {
    const int at = cur ? cur.get() : root_fd;
    if (cur) {
      // Below the root a leading "/" is only a separator (RESOLVE_BENEATH
      // would refuse it as absolute).
      const size_t skip = rest.find_first_not_of('/');
      rest.erase(0, skip == std::string::npos ? rest.size() : skip);
      if (rest.empty()) rest = ".";  // "dir/": the directory itself
    }
    const uint64_t resolve = cur ? kBeneath : kInRoot;
    int err = 0;
    if (rest.size() <= kMaxPiece) {
      err = openOnce(openat2, at, rest, flags, mode, resolve, out);
      if (err != EXDEV || !cur) return err;
    } else {
      // The longest piece that ends at a "/": a directory on the way.
      const size_t cut = rest.rfind('/', kMaxPiece);
      if (cut == std::string::npos || rest.find_first_not_of('/') >= cut) return ENAMETOOLONG;
      UniqueFd dir;
      err = openOnce(openat2, at, rest.substr(0, cut), O_PATH | O_DIRECTORY, 0, resolve, &dir);
      if (err == 0) {
        cur = std::move(dir);
        rest.erase(0, cut);
        continue;
      }
      if (err != EXDEV || !cur) return err;
    }
    // EXDEV below the root: the next component, by hand.
    const size_t end = rest.find('/');
    const std::string name = rest.substr(0, end);
    const std::string after = end == std::string::npos ? "" : rest.substr(end);
    const bool last = after.find_first_not_of('/') == std::string::npos;
    if (name == "." || name == "..") {
      if (name == "..") {
        const std::optional<Place> here = placeOf(cur.get());
        if (!here) return errno;
        if (*here == *root) {
          cur.reset();
        } else {
          // Strictly inside the root: its parent is the root or inside it.
          UniqueFd up;
          if (int e = openOnce(openat2, cur.get(), "..", O_PATH | O_DIRECTORY, 0,
                               RESOLVE_NO_MAGICLINKS, &up)) {
            return e;
          }
          cur = std::move(up);
        }
      }
      rest = last ? "." + after : after;
      continue;
    }
    if (!last) {
      // A directory on the way: into it, unless it is a symlink that
      // leads out of `cur` (EXDEV again).
      UniqueFd dir;
      const int e = openOnce(openat2, cur.get(), name, O_PATH | O_DIRECTORY, 0, kBeneath, &dir);
      if (e == 0) {
        cur = std::move(dir);
        rest = after;
        continue;
      }
      if (e != EXDEV) return e;
    }
    // A symlink that leads out of `cur` (the last name too: the piece that
    // was only it answered EXDEV, so these flags follow it): its text is
    // walked in its place.
    UniqueFd link;
    if (int e = openOnce(openat2, cur.get(), name, O_PATH | O_NOFOLLOW, 0, kBeneath, &link)) {
      return e;
    }
    struct stat st {};
    if (::fstat(link.get(), &st) != 0) return errno;
    if (!S_ISLNK(st.st_mode)) return EXDEV;  // nothing of ours left it: the kernel's answer
    std::string text(PATH_MAX, '\0');
    const ssize_t n = ::readlinkat(link.get(), "", text.data(), text.size());
    if (n < 0) return errno;
    if (n == 0) return ENOENT;
    if (++links > kMaxLinks) return ELOOP;
    text.resize(static_cast<size_t>(n));
    if (text[0] == '/') cur.reset();
    rest = text + after;
  }
}

}  // namespace

int openInRoot(int root_fd, std::string_view path, int flags, mode_t mode, UniqueFd* out,
               Openat2Fn openat2) {
  // A NUL inside would silently cut the path short.
  if (path.find('\0') != std::string_view::npos) return EINVAL;
  if (path.empty()) return ENOENT;
  if (openat2 == nullptr) openat2 = realOpenat2;
  if (path.size() > kMaxPiece) return openLong(root_fd, path, flags, mode, out, openat2);
  return openOnce(openat2, root_fd, std::string(path), flags, mode, kInRoot, out);
}

}  // namespace siphon::agent
