// Errors of the typed client API (target.h, files.h, dns.h, ...): every call
// answers an absl::Status; these read what it carries without protobuf.
//  - A system call of the agent failed (file operations, a connect): the
//    status has code kErrno and errnoValue() is the Linux errno (ENOENT,
//    EACCES, EBADF for a handle whose session is lost...).
//  - Anything else: errorCode() is the protocol's typed code (kAgentLost
//    for work lost with the agent, kPortBusy, kTimeout...).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace siphon::client {

// The protocol's codes, numbered as on the wire (siphon.v1.ErrorCode).
enum class ErrorCode : int {
  kUnspecified = 0,
  kOk = 1,
  kInternal = 2,
  kProtocolError = 3,
  kFrameTooLarge = 4,
  kUnsupportedVersion = 5,
  kUnauthenticated = 6,
  kSessionExpired = 7,
  kUnimplemented = 8,
  kInvalidArgument = 9,
  kNotFound = 10,
  kPermissionDenied = 11,
  kResourceExhausted = 12,
  kPortBusy = 13,
  kAgentLost = 14,
  kAgentDraining = 15,
  kStreamClosed = 16,
  kFlowControlError = 17,
  kErrno = 18,
  kTimeout = 19,
  kUnavailable = 20,
  kCancelled = 21,
  kFailedPrecondition = 22,
  kResumeFailed = 23,
  kTooManySessions = 24,
  kTooManyStreams = 25,
  kTooManyPendingRequests = 26,
  kSessionBufferFull = 27,
};

// kOk for an OK status.
ErrorCode errorCode(const absl::Status& status);
// The errno a failed system call of the agent left in `status`, or 0.
int errnoValue(const absl::Status& status);
// "AGENT_LOST", "ERRNO", ...
std::string errorName(ErrorCode code);

}  // namespace siphon::client
