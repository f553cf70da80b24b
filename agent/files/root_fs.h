// File operations on paths inside a target's root directory.
//
// Every path is resolved by openat2(root_fd, path, RESOLVE_IN_ROOT |
// RESOLVE_NO_MAGICLINKS): "/" and ".." stop at root_fd, absolute symlinks are
// taken relative to it, and procfs magic links (/proc/self/root,
// /proc/PID/fd/N, ...) fail with ELOOP. The kernel checks this during the
// walk itself, so neither a client's path nor a symlink the target plants
// (even one it swaps while a call runs) reaches anything outside the root.
//
// Operations that are not an open() never hand a path to a plain *at() call
// that would follow the final component on its own:
//   - mkdir, rmdir, unlink, rename, symlink, link, mknod: the PARENT
//     directory is resolved with openat2 (O_PATH|O_DIRECTORY) and the call
//     acts on the final name, which these calls never follow (linkat without
//     AT_SYMLINK_FOLLOW links a final symlink itself);
//   - stat, statfs, access, readlink, chown, utimens, chmod: the object itself
//     is resolved with openat2 as O_PATH (O_NOFOLLOW when the final symlink
//     must not be followed) and the call acts on that fd (AT_EMPTY_PATH);
//   - truncate: openat2(O_WRONLY) then ftruncate;
//   - the xattr calls (root_fs_xattr.cc): the object is resolved as O_PATH
//     (O_NOFOLLOW unless following) and the call names the agent's own
//     /proc/self/fd/N (f*xattr refuse O_PATH fds), a magic link that jumps
//     to that very inode: nothing of the target's path is looked up again.
//
// Errors: the errno of the failing call, as siphon::errnoStatus with the
// operation and path for context ("open /etc/shadow: Permission denied"),
// so errnoOf() gives the exact value for the client.
//
// Threads: every call blocks (it is file-system I/O): run them on the
// blocking pool, never on the event loop. A RootFs holds nothing but the root
// fd, so calls from several threads at once are fine. Needs Linux 5.8
// (openat2: 5.6; faccessat2 and utimensat(AT_EMPTY_PATH): 5.8).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "siphon/protocol/piped_bytes.h"
#include "siphon/v1/files.pb.h"

namespace siphon::agent::files {

// utimens() time values with a special meaning (times before 1970 cannot be
// set through the protocol).
inline constexpr int64_t kTimeOmit = -1;  // leave this time as it is (UTIME_OMIT)
inline constexpr int64_t kTimeNow = -2;   // set this time to now (UTIME_NOW)

// Extended attribute limits, the kernel's own (XATTR_NAME_MAX,
// XATTR_SIZE_MAX, XATTR_LIST_MAX), checked before the call with the errno
// the kernel would give: a longer name ERANGE, a longer value E2BIG.
inline constexpr size_t kMaxXattrName = 255;
inline constexpr size_t kMaxXattrValue = 64 * 1024;
inline constexpr size_t kMaxXattrList = 64 * 1024;

class RootFs {
 public:
  // `root_fd` (an O_PATH directory fd, e.g. /proc/PID/root) is not owned and
  // must outlive the RootFs.
  explicit RootFs(int root_fd) : root_fd_(root_fd) {}

  // openat2 of `path` under the root with `flags` (O_CLOEXEC is added) and
  // `mode`. A path holding a NUL byte is EINVAL; an empty path ENOENT.
  // openat2 answers EAGAIN when a concurrent rename or mount might have
  // moved the walk; that is retried a bounded number of times.
  absl::StatusOr<UniqueFd> resolve(std::string_view path, int flags, mode_t mode = 0) const;

  // open(2) of a client: its flags (Linux O_* values), plus O_CLOEXEC,
  // O_NOCTTY and O_NONBLOCK. O_NONBLOCK keeps a FIFO or a device of the
  // target from parking a pool thread in open() or read() forever (a FIFO
  // with no writer reads as empty; one with no reader fails ENXIO on open for
  // writing); it changes nothing for regular files and directories. `mode`
  // is used only with O_CREAT or O_TMPFILE (openat2 refuses it otherwise).
  absl::StatusOr<UniqueFd> open(std::string_view path, int flags, uint32_t mode) const;
  // A directory for reading entries (O_RDONLY|O_DIRECTORY).
  absl::StatusOr<UniqueFd> openDir(std::string_view path) const;

  // stat (follow = true) or lstat (follow = false: a final symlink is
  // described itself).
  absl::StatusOr<v1::FileStat> stat(std::string_view path, bool follow) const;
  absl::StatusOr<v1::FsStat> statfs(std::string_view path) const;
  // faccessat2 on the resolved object with the caller's credentials (the
  // file helper's: the target's identity, fs_helper.h).
  // With `writes_refused` (--fs-mode ro), W_OK answers EROFS once the path is
  // known to exist, as on a read-only mount.
  absl::Status access(std::string_view path, int mode, bool writes_refused) const;
  // The link's target, raw bytes. EINVAL when the path is not a symlink.
  absl::StatusOr<std::string> readlink(std::string_view path) const;

  absl::Status mkdir(std::string_view path, uint32_t mode) const;
  absl::Status rmdir(std::string_view path) const;
  absl::Status unlink(std::string_view path) const;
  // renameat2; `flags` are RENAME_NOREPLACE / RENAME_EXCHANGE / RENAME_WHITEOUT.
  absl::Status rename(std::string_view from, std::string_view to, uint32_t flags) const;
  absl::Status truncate(std::string_view path, int64_t length) const;
  // chmod follows a final symlink (as chmod(2) does; Linux has no lchmod).
  absl::Status chmod(std::string_view path, uint32_t mode) const;
  // uid/gid -1 leaves that id unchanged; other values must fit a uid_t.
  absl::Status chown(std::string_view path, int64_t uid, int64_t gid, bool follow) const;
  // Nanoseconds since the epoch, or kTimeOmit / kTimeNow.
  absl::Status utimens(std::string_view path, int64_t atime_ns, int64_t mtime_ns,
                       bool follow) const;

  // symlinkat: `linkpath` -> `target`, the target text stored as given (a
  // NUL in it is EINVAL). It is only text: when followed later it resolves
  // inside the root like any other link.
  absl::Status symlink(std::string_view target, std::string_view linkpath) const;
  // linkat(2) with flags 0: a hard link `newpath` to the object named by
  // `existing`, whose final symlink (if any) is linked itself, never
  // followed. Both parents resolve in the root.
  absl::Status link(std::string_view existing, std::string_view newpath) const;
  // mknodat for a regular file (type 0 or S_IFREG), S_IFIFO or S_IFSOCK,
  // with `mode`'s permission bits (the process's umask applies: the file
  // helper's is 0); rdev is not used. S_IFCHR and S_IFBLK are refused
  // with EPERM (errnoRefusal: no device node is ever made through the
  // agent), any other type with EINVAL.
  absl::Status mknod(std::string_view path, uint32_t mode, uint64_t rdev) const;

  // Extended attributes (root_fs_xattr.cc). `follow` false acts on a final
  // symlink itself (the l*xattr calls). Errnos are the kernel's: ENODATA
  // (no such attribute), ENOTSUP (the file system has none), EPERM (user.*
  // on a symlink or device), ERANGE, E2BIG, EEXIST / ENODATA for
  // XATTR_CREATE / XATTR_REPLACE.
  absl::StatusOr<std::string> getxattr(std::string_view path, std::string_view name,
                                       bool follow) const;
  // The names, in the kernel's order.
  absl::StatusOr<std::vector<std::string>> listxattr(std::string_view path, bool follow) const;
  absl::Status setxattr(std::string_view path, std::string_view name, std::string_view value,
                        int flags, bool follow) const;
  absl::Status removexattr(std::string_view path, std::string_view name, bool follow) const;

 private:
  struct Parent {
    UniqueFd fd;
    std::string name;  // the final component
    bool trailing_slash = false;
  };
  // The parent directory of `path` (resolved in the root) and its final
  // name. `op` names the call in errors. A final "", "." or ".." (the root
  // itself, "a/.", "a/..") is refused with `refuse_errno`: such names would
  // make the *at() call act on the parent fd's own "..", which is not
  // checked against the root.
  absl::StatusOr<Parent> parent(std::string_view op, std::string_view path, int refuse_errno) const;
  // For calls that create `p`'s name and take no trailing slash (symlink,
  // link, mknod): "name/" is EEXIST when the name exists, else ENOENT, as
  // the kernel answers.
  static absl::Status refuseTrailingSlash(const Parent& p, std::string_view what);
  // The O_PATH fd of `path` for the xattr calls (O_NOFOLLOW unless `follow`).
  absl::StatusOr<UniqueFd> xattrTarget(std::string_view op, std::string_view path,
                                       bool follow) const;

  int root_fd_;
};

// struct stat / statfs to their wire forms.
v1::FileStat toFileStat(const struct stat& st);

// Operations on an fd opened through RootFs (the handles of a session).
// eof: the read returned no bytes, or the fd is a regular file of non-zero
// size and the read reached that size (procfs-like files report size 0:
// for them only an empty read is the end).
absl::StatusOr<v1::FileData> readFd(int fd, uint32_t size);
absl::StatusOr<v1::FileData> preadFd(int fd, uint32_t size, int64_t offset);
// A pread of a regular file into a pipe (splice: the pipe holds the
// file's pages, nothing is copied), for an answer the transport splices on
// (protocol/piped_bytes.h). nullopt when this read cannot go that way (not
// a regular file, a file system without splice, no pipe of the size):
// preadFd then.
struct PipedRead {
  std::shared_ptr<protocol::PipedBytes> bytes;
  bool eof = false;
};
absl::StatusOr<std::optional<PipedRead>> splicePreadFd(int fd, uint32_t size, int64_t offset);
absl::StatusOr<uint64_t> writeFd(int fd, std::string_view data);
absl::StatusOr<uint64_t> pwriteFd(int fd, std::string_view data, int64_t offset);
absl::StatusOr<int64_t> seekFd(int fd, int64_t offset, int whence);
absl::StatusOr<v1::FileStat> fstatFd(int fd);
absl::Status ftruncateFd(int fd, int64_t length);
// fsync(2), or fdatasync(2) with `datasync`.
absl::Status fsyncFd(int fd, bool datasync);

}  // namespace siphon::agent::files
