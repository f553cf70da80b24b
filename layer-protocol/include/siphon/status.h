// Status helpers shared by the agent, the protocol library and the CLI.
//
// Debian's abseil 20220623 has no status macros, so they live here, once.
// Protocol-level failures carry a typed siphon.v1.ErrorCode as a status
// payload, so a Status can travel to the peer (Reject, Goaway, Response.error)
// without losing its type.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "siphon/v1/common.pb.h"

namespace siphon {

#define SIPHON_CONCAT_INNER_(a, b) a##b
#define SIPHON_CONCAT_(a, b) SIPHON_CONCAT_INNER_(a, b)

// Returns from the current function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status siphon_status_ = (expr);          \
    if (!siphon_status_.ok()) return siphon_status_; \
  } while (0)

// The same for coroutines, which must co_return.
#define CO_RETURN_IF_ERROR(expr)                        \
  do {                                                  \
    ::absl::Status siphon_status_ = (expr);             \
    if (!siphon_status_.ok()) co_return siphon_status_; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(SIPHON_CONCAT_(siphon_statusor_, __LINE__), lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                           \
  if (!tmp.ok()) return tmp.status();           \
  lhs = std::move(tmp).value()

// The same for coroutines.
#define CO_ASSIGN_OR_RETURN(lhs, rexpr) \
  CO_ASSIGN_OR_RETURN_IMPL_(SIPHON_CONCAT_(siphon_statusor_, __LINE__), lhs, rexpr)
#define CO_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) co_return tmp.status();           \
  lhs = std::move(tmp).value()

// Debian's abseil has its own string_view type: convert at the boundary.
inline std::string_view sv(absl::string_view s) { return std::string_view(s.data(), s.size()); }
inline absl::string_view asv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A Status for a failed system call: "context: strerror(err)", with the
// canonical code that fits the errno (ENOENT -> NotFound, EPERM -> PermissionDenied...)
// and the errno itself kept as code ERRNO, so file operations can hand the
// exact value to the client.
absl::Status errnoStatus(int err, std::string_view context);

// errnoStatus(errno, context) for the errno of the call that just failed.
inline absl::Status lastErrnoStatus(std::string_view context) {
  return errnoStatus(errno, context);
}

// A Status for an errno the agent answers by a rule of its own (a limit,
// --fs-mode ro), not one a system call returned: code ERRNO with `err`, and
// `reason` alone as the message. The reason says why and which flag governs
// it; clients show it after strerror (errnoReason).
absl::Status errnoRefusal(int err, std::string_view reason);

// The reason of an errnoRefusal, also after a trip over the wire; empty for
// any other Status (whose message is "context: strerror(err)").
std::string_view errnoReason(const absl::Status& status);

// A Status with a typed protocol error code.
absl::Status protoError(v1::ErrorCode code, std::string_view message);

// The typed code of a Status: its payload when it has one, else a mapping of
// the canonical code (OK -> OK, NotFound -> NOT_FOUND, ...).
v1::ErrorCode errorCodeOf(const absl::Status& status);

// The errno a Status carries (from errnoStatus), or 0.
int errnoOf(const absl::Status& status);

// The wire form of a Status (code, message, errno).
v1::Error toProtoError(const absl::Status& status);

// A Status from a wire error.
absl::Status fromProtoError(const v1::Error& error);

// "FRAME_TOO_LARGE" and so on.
std::string errorCodeName(v1::ErrorCode code);

}  // namespace siphon
