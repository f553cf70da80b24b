#include "agent/server/accept_decision.h"

#include "absl/strings/str_cat.h"
#include "siphon/protocol/handshake.h"

namespace siphon::agent {
namespace {

AcceptDecision reject(v1::ErrorCode code, std::string message,
                      std::string_view resume_outcome = {}) {
  AcceptDecision d;
  d.kind = AcceptDecision::Kind::kReject;
  d.code = code;
  d.message = std::move(message);
  d.resume_outcome = resume_outcome;
  return d;
}

// The oldest detached session whose client never sent a sequenced frame
// and that has no stream: a client that completes handshakes and drops
// them without a word would otherwise fill --max-sessions with detached
// sessions for the whole grace period and lock every other client out.
// Sessions holding anything are never evicted.
const SessionView* evictable(std::span<const SessionView> sessions) {
  const SessionView* oldest = nullptr;
  for (const SessionView& s : sessions) {
    if (!s.detached || s.received != 0 || s.streams != 0) continue;
    if (oldest == nullptr || s.created < oldest->created) oldest = &s;
  }
  return oldest;
}

}  // namespace

AcceptDecision decideAccept(const v1::Hello& hello, const AcceptState& state) {
  auto version = protocol::negotiateVersion(hello.version(), state.agent_version);
  if (!version.ok()) {
    return reject(v1::UNSUPPORTED_VERSION, std::string(version.status().message()));
  }
  if (!state.insecure_no_auth && !protocol::constantTimeEquals(hello.auth_token(), state.token)) {
    return reject(v1::UNAUTHENTICATED, "wrong or missing token");
  }
  if (state.draining && !hello.has_resume()) {
    return reject(v1::AGENT_DRAINING, "the agent is draining; connect to another agent");
  }

  AcceptDecision d;
  d.kind = AcceptDecision::Kind::kWelcome;
  d.version = *version;
  if (hello.has_resume()) {
    if (!state.resumed) {
      return reject(
          v1::SESSION_EXPIRED,
          absl::StrCat("session ", hello.resume().session_id(), " is unknown or expired (grace ",
                       state.session_grace.count(), " ms)"),
          "unknown_session");
    }
    if (!protocol::constantTimeEquals(hello.resume().resume_token(), state.resumed->resume_token)) {
      return reject(v1::UNAUTHENTICATED, "wrong resume token", "bad_token");
    }
    d.resume = true;
    return d;
  }
  if (state.session_count >= state.max_sessions) {
    const SessionView* victim = evictable(state.sessions);
    if (victim == nullptr) {
      return reject(
          v1::TOO_MANY_SESSIONS,
          absl::StrCat(protocol::limitReached("session", state.max_sessions, "--max-sessions"),
                       "; a session that ends makes room"));
    }
    d.kind = AcceptDecision::Kind::kEvict;
    d.evict_session_id = std::string(victim->id);
  }
  d.limits = protocol::negotiateLimits(hello.requested_limits(), state.limits);
  return d;
}

}  // namespace siphon::agent
