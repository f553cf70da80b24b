#include "cli/exit_codes.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::cli {
namespace {

bool unreachable(v1::ErrorCode code) {
  return code == v1::UNAVAILABLE || code == v1::TIMEOUT || code == v1::AGENT_LOST;
}

}  // namespace

Failure connectFailure(const absl::Status& status) {
  const v1::ErrorCode code = errorCodeOf(status);
  const std::string message(status.message());
  constexpr std::string_view kPrefix = "cannot reach the agent";
  if (unreachable(code)) {
    // The client already says "cannot reach the agent: <each endpoint and why>".
    if (absl::StartsWith(message, asv(kPrefix))) return {kExitUnreachable, message};
    return {kExitUnreachable, absl::StrCat(asv(kPrefix), ": ", message)};
  }
  if (code == v1::PROTOCOL_ERROR || code == v1::FRAME_TOO_LARGE) {
    return {kExitError, absl::StrCat("handshake with the agent failed (is it a siphon-agent?): ",
                                     errorCodeName(code), ": ", message)};
  }
  return {kExitRejected,
          absl::StrCat("agent rejected the session: ", errorCodeName(code), ": ", message)};
}

Failure requestFailure(std::string_view what, const absl::Status& status) {
  const v1::ErrorCode code = errorCodeOf(status);
  return {unreachable(code) ? kExitUnreachable : kExitError,
          absl::StrCat(asv(what), " failed: ", errorCodeName(code), ": ", status.message())};
}

}  // namespace siphon::cli
