#include "siphon/status.h"

#include <cstring>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "siphon/text.h"

namespace siphon {
namespace {

constexpr char kCodeUrl[] = "type.siphon.dev/ErrorCode";
constexpr char kErrnoUrl[] = "type.siphon.dev/errno";

absl::StatusCode canonicalForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ESRCH:
      return absl::StatusCode::kNotFound;
    case EPERM:
    case EACCES:
    case EROFS:
      return absl::StatusCode::kPermissionDenied;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
    case EXDEV:
    case ELOOP:
      return absl::StatusCode::kInvalidArgument;
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC:
      return absl::StatusCode::kResourceExhausted;
    case ETIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EAGAIN:
      return absl::StatusCode::kUnavailable;
    case ENOSYS:
    case EOPNOTSUPP:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode canonicalForCode(v1::ErrorCode code) {
  switch (code) {
    case v1::OK:
      return absl::StatusCode::kOk;
    case v1::INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case v1::NOT_FOUND:
    case v1::SESSION_EXPIRED:
      return absl::StatusCode::kNotFound;
    case v1::PERMISSION_DENIED:
      return absl::StatusCode::kPermissionDenied;
    case v1::UNAUTHENTICATED:
      return absl::StatusCode::kUnauthenticated;
    case v1::RESOURCE_EXHAUSTED:
    case v1::FRAME_TOO_LARGE:
    case v1::TOO_MANY_SESSIONS:
    case v1::TOO_MANY_STREAMS:
    case v1::TOO_MANY_PENDING_REQUESTS:
    case v1::SESSION_BUFFER_FULL:
      return absl::StatusCode::kResourceExhausted;
    case v1::UNIMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case v1::UNSUPPORTED_VERSION:
    case v1::FAILED_PRECONDITION:
    case v1::PORT_BUSY:
      return absl::StatusCode::kFailedPrecondition;
    case v1::AGENT_LOST:
    case v1::AGENT_DRAINING:
    case v1::UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    case v1::TIMEOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case v1::CANCELLED:
      return absl::StatusCode::kCancelled;
    case v1::PROTOCOL_ERROR:
    case v1::STREAM_CLOSED:
    case v1::FLOW_CONTROL_ERROR:
    case v1::RESUME_FAILED:
      return absl::StatusCode::kDataLoss;
    default:
      return absl::StatusCode::kInternal;
  }
}

// Code ERRNO with `err`, under the canonical code that fits it.
absl::Status errnoWithMessage(int err, std::string_view message) {
  absl::Status s(canonicalForErrno(err), asv(message));
  s.SetPayload(kCodeUrl, absl::Cord(absl::StrCat(static_cast<int>(v1::ERRNO))));
  s.SetPayload(kErrnoUrl, absl::Cord(absl::StrCat(err)));
  return s;
}

}  // namespace

absl::Status errnoStatus(int err, std::string_view context) {
  return errnoWithMessage(err, absl::StrCat(asv(context), ": ", std::strerror(err)));
}

absl::Status errnoRefusal(int err, std::string_view reason) {
  return errnoWithMessage(err, reason);
}

std::string_view errnoReason(const absl::Status& status) {
  const int err = errnoOf(status);
  if (err == 0 || errorCodeOf(status) != v1::ERRNO) return {};
  const std::string_view message = sv(status.message());
  // errnoStatus's form, "context: strerror(err)", or just strerror(err).
  const std::string_view plain = std::strerror(err);
  const bool plain_form =
      message == plain || (message.ends_with(plain) &&
                           message.substr(0, message.size() - plain.size()).ends_with(": "));
  if (message.empty() || plain_form) return {};
  return message;
}

absl::Status protoError(v1::ErrorCode code, std::string_view message) {
  absl::StatusCode canonical = canonicalForCode(code);
  if (canonical == absl::StatusCode::kOk) return absl::OkStatus();
  absl::Status s(canonical, absl::string_view(message.data(), message.size()));
  s.SetPayload(kCodeUrl, absl::Cord(absl::StrCat(static_cast<int>(code))));
  return s;
}

v1::ErrorCode errorCodeOf(const absl::Status& status) {
  if (status.ok()) return v1::OK;
  if (auto p = status.GetPayload(kCodeUrl)) {
    int v = 0;
    if (absl::SimpleAtoi(std::string(*p), &v) && v1::ErrorCode_IsValid(v)) {
      return static_cast<v1::ErrorCode>(v);
    }
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return v1::INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return v1::NOT_FOUND;
    case absl::StatusCode::kPermissionDenied:
      return v1::PERMISSION_DENIED;
    case absl::StatusCode::kUnauthenticated:
      return v1::UNAUTHENTICATED;
    case absl::StatusCode::kResourceExhausted:
      return v1::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnimplemented:
      return v1::UNIMPLEMENTED;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return v1::FAILED_PRECONDITION;
    case absl::StatusCode::kUnavailable:
      return v1::UNAVAILABLE;
    case absl::StatusCode::kDeadlineExceeded:
      return v1::TIMEOUT;
    case absl::StatusCode::kCancelled:
      return v1::CANCELLED;
    case absl::StatusCode::kDataLoss:
      return v1::PROTOCOL_ERROR;
    default:
      return v1::INTERNAL;
  }
}

int errnoOf(const absl::Status& status) {
  if (auto p = status.GetPayload(kErrnoUrl)) {
    int v = 0;
    if (absl::SimpleAtoi(std::string(*p), &v)) return v;
  }
  return 0;
}

v1::Error toProtoError(const absl::Status& status) {
  v1::Error e;
  e.set_code(errorCodeOf(status));
  // A message may quote a path, which is bytes: the field is text.
  e.set_message(toUtf8Lossy(sv(status.message())));
  e.set_errno_value(errnoOf(status));
  return e;
}

absl::Status fromProtoError(const v1::Error& error) {
  // The peer's message as it is: "context: strerror" or its reason.
  if (error.code() == v1::ERRNO) return errnoWithMessage(error.errno_value(), error.message());
  return protoError(error.code() == v1::ERROR_CODE_UNSPECIFIED ? v1::INTERNAL : error.code(),
                    error.message());
}

std::string errorCodeName(v1::ErrorCode code) { return v1::ErrorCode_Name(code); }

}  // namespace siphon
