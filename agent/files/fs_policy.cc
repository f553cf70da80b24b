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
    case v1::FileRequest::OP_NOT_SET:
      break;
  }
  return "";
}

bool isWriteLike(const v1::FileRequest& request) {
  switch (request.op_case()) {
    case v1::FileRequest::kOpen: {
      const int flags = request.open().flags();
      // O_TMPFILE includes O_DIRECTORY: test its own bit.
      constexpr int kTmpfileBit = O_TMPFILE & ~O_DIRECTORY;
      return (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC | O_APPEND)) != 0 ||
             (flags & kTmpfileBit) != 0;
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
      return true;
    default:
      return false;
  }
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
