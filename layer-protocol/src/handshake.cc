#include "siphon/protocol/handshake.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::protocol {

v1::Version currentVersion() {
  v1::Version v;
  v.set_major(kProtocolMajor);
  v.set_minor(kProtocolMinor);
  return v;
}

std::string versionString(const v1::Version& v) { return absl::StrCat(v.major(), ".", v.minor()); }

absl::StatusOr<v1::Version> negotiateVersion(const v1::Version& client, const v1::Version& agent) {
  if (client.major() != agent.major()) {
    return protoError(
        v1::UNSUPPORTED_VERSION,
        absl::StrCat("protocol version mismatch: client speaks ", versionString(client),
                     ", agent speaks ", versionString(agent), " (major versions must match)"));
  }
  v1::Version v;
  v.set_major(agent.major());
  v.set_minor(std::min(client.minor(), agent.minor()));
  return v;
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  // Walk the longer input fully so timing does not reveal the prefix match.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  // Keep the compiler from turning the loop into an early exit.
  volatile unsigned char result = diff;
  return result == 0;
}

v1::Frame makeHello(std::string_view client_name, std::string_view token,
                    const v1::Limits& requested, const v1::ResumeRequest* resume) {
  v1::Frame f;
  auto* h = f.mutable_hello();
  *h->mutable_version() = currentVersion();
  h->set_client_name(std::string(client_name));
  h->set_auth_token(std::string(token));
  *h->mutable_requested_limits() = requested;
  if (resume != nullptr) *h->mutable_resume() = *resume;
  return f;
}

namespace {

// The peer's refusal as a status that is never OK: protoError(OK) is an OK
// status, and a StatusOr built from one is an invariant violation (abseil
// aborts in debug builds), so a Reject or Goaway that carries OK or no code
// becomes INTERNAL with the peer's message.
absl::Status refusal(v1::ErrorCode code, const std::string& message) {
  if (code == v1::OK || code == v1::ERROR_CODE_UNSPECIFIED) code = v1::INTERNAL;
  return protoError(code, message);
}

}  // namespace

absl::StatusOr<v1::Welcome> welcomeFrom(const v1::Frame& frame) {
  switch (frame.body_case()) {
    case v1::Frame::kWelcome:
      return frame.welcome();
    case v1::Frame::kReject:
      return refusal(frame.reject().code(), frame.reject().message());
    case v1::Frame::kGoaway:
      return refusal(frame.goaway().code(), frame.goaway().message());
    default:
      return protoError(v1::PROTOCOL_ERROR, "expected Welcome or Reject from the agent");
  }
}

v1::Frame makeReject(v1::ErrorCode code, std::string_view message) {
  v1::Frame f;
  f.mutable_reject()->set_code(code);
  f.mutable_reject()->set_message(std::string(message));
  return f;
}

}  // namespace siphon::protocol
