// Handshake: Hello from the client, Welcome or Reject from the agent. Pure
// functions; the agent's session registry and the transport sit around them.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::protocol {

// The protocol version this build speaks. Minor versions add what a peer of
// a lower minor never sees: 1.1 adds the agent's TargetRestarted frame, 1.2
// early stream data (the agent sends on a stream it opened before the
// client's StreamAccept: Session::allowEarlyData).
inline constexpr uint32_t kProtocolMajor = 1;
inline constexpr uint32_t kProtocolMinor = 2;
inline constexpr uint32_t kEarlyDataMinor = 2;
v1::Version currentVersion();

// Versions are major.minor: the majors must match (else UNSUPPORTED_VERSION
// naming both versions); the minor is the lower of the two.
absl::StatusOr<v1::Version> negotiateVersion(const v1::Version& client, const v1::Version& agent);

std::string versionString(const v1::Version& v);

// Compares in time that depends only on the lengths, not on where the first
// difference is, so a token cannot be guessed byte by byte.
bool constantTimeEquals(std::string_view a, std::string_view b);

// The client's first frame.
v1::Frame makeHello(std::string_view client_name, std::string_view token,
                    const v1::Limits& requested, const v1::ResumeRequest* resume);

// The agent's answer to a Hello as seen by the client: the Welcome, or the
// Reject as a typed status (UNAUTHENTICATED, SESSION_EXPIRED, ...), or
// PROTOCOL_ERROR for any other frame.
absl::StatusOr<v1::Welcome> welcomeFrom(const v1::Frame& frame);

v1::Frame makeReject(v1::ErrorCode code, std::string_view message);

}  // namespace siphon::protocol
