// The CLI's exit codes and the one-line messages for failures. Scripts
// depend on the codes: never renumber them.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace siphon::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,        // the request failed, or anything else
  kExitUsage = 2,        // bad flags, no agent address, unreadable token file
  kExitUnreachable = 3,  // no agent answered (UNAVAILABLE, TIMEOUT), or it went away
  kExitRejected = 4,     // the agent refused the session (UNAUTHENTICATED, UNSUPPORTED_VERSION...)
};

// A failure, as the CLI reports it: one line for stderr (without the
// "siphon: " prefix) and the exit code.
struct Failure {
  int exit_code;
  std::string message;
};

// For a failed Client::connect():
//  - UNAVAILABLE, TIMEOUT, AGENT_LOST: kExitUnreachable,
//    "cannot reach the agent: 127.0.0.1:7140: Connection refused";
//  - PROTOCOL_ERROR, FRAME_TOO_LARGE: kExitError (the peer does not speak the
//    protocol: likely not a siphon-agent), "handshake with the agent failed: ...";
//  - any other code is the agent's Reject: kExitRejected,
//    "agent rejected the session: UNAUTHENTICATED: ...".
Failure connectFailure(const absl::Status& status);

// For a failed request `what` ("info", "env"): UNAVAILABLE, TIMEOUT and
// AGENT_LOST are kExitUnreachable, the rest kExitError; the message is
// "<what> failed: CODE: message".
Failure requestFailure(std::string_view what, const absl::Status& status);

}  // namespace siphon::cli
