// What --fs-mode allows, decided per file request before anything touches the
// file system. Pure functions.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "agent/server/config.h"
#include "siphon/v1/files.pb.h"

namespace siphon::agent::files {

// The op's name as errors and logs show it ("open", "pread", "mkdir"...);
// "(none)" for a request without an op.
std::string_view fileOpName(const v1::FileRequest& request);

// What the request acts on, for messages: its path ("/etc/hosts"), "fd 7"
// for a handle, "A to B" for rename.
std::string fileRequestTarget(const v1::FileRequest& request);

// Whether the request may change the file system: open with O_WRONLY,
// O_RDWR (or an access mode of 3), O_CREAT, O_TRUNC, O_APPEND or O_TMPFILE;
// write, pwrite, mkdir, rmdir, unlink, rename, truncate, ftruncate, chmod,
// chown, utimens, symlink, link, mknod, setxattr, removexattr. (fsync is
// not: under ro only read handles exist, and the service answers it OK.)
bool isWriteLike(const v1::FileRequest& request);
// The same decision from the op and (for open) its flags. Exhaustive: an
// op this build does not name is write-like (fails closed under ro).
bool isWriteLikeOp(v1::FileRequest::OpCase op, int open_flags);

// OK when `mode` lets the request run. kOff: PERMISSION_DENIED "file access
// is off (--fs-mode off)" for every request; kReadOnly: a write-like request
// is EROFS (code ERRNO), as on a read-only mount.
absl::Status checkFsMode(FsMode mode, const v1::FileRequest& request);

}  // namespace siphon::agent::files
