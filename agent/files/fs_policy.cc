#include "agent/files/fs_policy.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::files {

std::string_view fileOpName(const v1::FileRequest& request) {
  if (request.op_case() == v1::FileRequest::OP_NOT_SET) return "(none)";
  const auto* field = request.GetDescriptor()->FindFieldByNumber(request.op_case());
  return field == nullptr ? std::string_view("(unknown)") : std::string_view(field->name());
}

std::string fileRequestTarget(const v1::FileRequest& r) {
  switch (r.op_case()) {
    case v1::FileRequest::kOpen:
      return r.open().path();
    case v1::FileRequest::kRead:
      return absl::StrCat("fd ", r.read().fd());
    case v1::FileRequest::kPread:
      return absl::StrCat("fd ", r.pread().fd());
    case v1::FileRequest::kWrite:
      return absl::StrCat("fd ", r.write().fd());
    case v1::FileRequest::kPwrite:
      return absl::StrCat("fd ", r.pwrite().fd());
    case v1::FileRequest::kSeek:
      return absl::StrCat("fd ", r.seek().fd());
    case v1::FileRequest::kClose:
      return absl::StrCat("fd ", r.close().fd());
    case v1::FileRequest::kStat:
      return r.stat().path();
    case v1::FileRequest::kFstat:
      return absl::StrCat("fd ", r.fstat().fd());
    case v1::FileRequest::kStatfs:
      return r.statfs().path();
    case v1::FileRequest::kAccess:
      return r.access().path();
    case v1::FileRequest::kReadlink:
      return r.readlink().path();
    case v1::FileRequest::kOpendir:
      return r.opendir().path();
    case v1::FileRequest::kReaddir:
      return absl::StrCat("fd ", r.readdir().dir());
    case v1::FileRequest::kClosedir:
      return absl::StrCat("fd ", r.closedir().dir());
    case v1::FileRequest::kMkdir:
      return r.mkdir().path();
    case v1::FileRequest::kRmdir:
      return r.rmdir().path();
    case v1::FileRequest::kUnlink:
      return r.unlink().path();
    case v1::FileRequest::kRename:
      return absl::StrCat(r.rename().from(), " to ", r.rename().to());
    case v1::FileRequest::kTruncate:
      return r.truncate().path();
    case v1::FileRequest::kFtruncate:
      return absl::StrCat("fd ", r.ftruncate().fd());
    case v1::FileRequest::kChmod:
      return r.chmod().path();
    case v1::FileRequest::kChown:
      return r.chown().path();
    case v1::FileRequest::kUtimens:
      return r.utimens().path();
    case v1::FileRequest::kSymlink:
      return absl::StrCat(r.symlink().linkpath(), " -> ", r.symlink().target());
    case v1::FileRequest::kLink:
      return absl::StrCat(r.link().existing(), " to ", r.link().newpath());
    case v1::FileRequest::kMknod:
      return r.mknod().path();
    case v1::FileRequest::kGetxattr:
      return absl::StrCat(r.getxattr().path(), " ", r.getxattr().name());
    case v1::FileRequest::kListxattr:
      return r.listxattr().path();
    case v1::FileRequest::kSetxattr:
      return absl::StrCat(r.setxattr().path(), " ", r.setxattr().name());
    case v1::FileRequest::kRemovexattr:
      return absl::StrCat(r.removexattr().path(), " ", r.removexattr().name());
    case v1::FileRequest::kFsync:
      return absl::StrCat("fd ", r.fsync().fd());
    case v1::FileRequest::kWatch:
      return r.watch().path();
    case v1::FileRequest::kUnwatch:
      return absl::StrCat("watch ", r.unwatch().watch());
    case v1::FileRequest::OP_NOT_SET:
      break;
  }
  return "";
}

bool isWriteLikeOp(v1::FileRequest::OpCase op, int open_flags) {
  // No default: -Wswitch (an error here) names a new op until it is placed
  // on one side, and a value outside the enum (a newer schema) falls
  // through to "write-like": an op this build does not know is refused
  // under --fs-mode ro, never let through.
  switch (op) {
    case v1::FileRequest::kOpen: {
      // O_TMPFILE includes O_DIRECTORY: test its own bit.
      constexpr int kTmpfileBit = O_TMPFILE & ~O_DIRECTORY;
      return (open_flags & O_ACCMODE) != O_RDONLY ||
             (open_flags & (O_CREAT | O_TRUNC | O_APPEND)) != 0 || (open_flags & kTmpfileBit) != 0;
    }
    case v1::FileRequest::kWrite:
    case v1::FileRequest::kPwrite:
    case v1::FileRequest::kMkdir:
    case v1::FileRequest::kRmdir:
    case v1::FileRequest::kUnlink:
    case v1::FileRequest::kRename:
    case v1::FileRequest::kTruncate:
    case v1::FileRequest::kFtruncate:
    case v1::FileRequest::kChmod:
    case v1::FileRequest::kChown:
    case v1::FileRequest::kUtimens:
    case v1::FileRequest::kSymlink:
    case v1::FileRequest::kLink:
    case v1::FileRequest::kMknod:
    case v1::FileRequest::kSetxattr:
    case v1::FileRequest::kRemovexattr:
      return true;
    case v1::FileRequest::kRead:
    case v1::FileRequest::kPread:
    case v1::FileRequest::kSeek:
    case v1::FileRequest::kClose:
    case v1::FileRequest::kStat:
    case v1::FileRequest::kFstat:
    case v1::FileRequest::kStatfs:
    case v1::FileRequest::kAccess:
    case v1::FileRequest::kReadlink:
    case v1::FileRequest::kOpendir:
    case v1::FileRequest::kReaddir:
    case v1::FileRequest::kClosedir:
    case v1::FileRequest::kGetxattr:
    case v1::FileRequest::kListxattr:
    // Under ro every handle is open for reading (a write open is refused),
    // and the service answers an fsync there without calling it
    // (file_service.cc).
    case v1::FileRequest::kFsync:
    // A watch changes nothing; it tells what changes.
    case v1::FileRequest::kWatch:
    case v1::FileRequest::kUnwatch:
    case v1::FileRequest::OP_NOT_SET:
      return false;
  }
  return true;
}

bool isWriteLike(const v1::FileRequest& request) {
  return isWriteLikeOp(request.op_case(),
                       request.op_case() == v1::FileRequest::kOpen ? request.open().flags() : 0);
}

absl::Status checkFsMode(FsMode mode, const v1::FileRequest& request) {
  switch (mode) {
    case FsMode::kOff:
      return protoError(v1::PERMISSION_DENIED, "file access is off (--fs-mode off)");
    case FsMode::kReadOnly:
      if (isWriteLike(request)) {
        return errnoRefusal(EROFS, "the agent serves files read-only (siphon-agent --fs-mode ro)");
      }
      return absl::OkStatus();
    case FsMode::kReadWrite:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace siphon::agent::files
