// The agent's answer to a client's Hello, as a function without I/O: the
// Hello and what the server knows in, Welcome (new session or resume),
// Reject (typed code and message) or Evict (end a session that holds
// nothing, then welcome a new one) out. Server::handshake() gathers the
// state, calls decideAccept() and carries the decision out (creates or
// resumes the session, writes the frame).
//
// The checks, in order (docs/ARCHITECTURE.md, "Agent sessions"):
//   1. version: a major mismatch is UNSUPPORTED_VERSION;
//   2. token (constant time) unless insecure_no_auth: UNAUTHENTICATED;
//   3. draining and not a resume: AGENT_DRAINING (a resume still gets in:
//      its connections in flight are what the drain waits for);
//   4. a resume: the session must exist (SESSION_EXPIRED) and its resume
//      token match (UNAUTHENTICATED);
//   5. a new session at --max-sessions: Evict the oldest detached session
//      that never received a sequenced frame and has no stream (nothing a
//      resume could save), or TOO_MANY_SESSIONS when there is none.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "siphon/protocol/limits.h"
#include "siphon/v1/handshake.pb.h"

namespace siphon::agent {

// One session as the decision sees it.
struct SessionView {
  std::string_view id;
  std::string_view resume_token;
  // Had a transport and lost it: waiting for a resume within the grace.
  bool detached = false;
  // Sequenced frames the client sent, and streams open: a session with
  // either holds something a resume could save.
  uint64_t received = 0;
  size_t streams = 0;
  std::chrono::steady_clock::time_point created;
};

struct AcceptState {
  v1::Version agent_version;
  bool insecure_no_auth = false;
  std::string_view token;
  bool draining = false;
  uint32_t max_sessions = 0;
  std::chrono::milliseconds session_grace{0};  // named in SESSION_EXPIRED
  protocol::SessionLimits limits;              // the agent's, negotiated down
  size_t session_count = 0;
  // The session Hello.resume names, when the agent has it.
  std::optional<SessionView> resumed;
  // Every session; read only for a new session at max_sessions.
  std::span<const SessionView> sessions;
};

struct AcceptDecision {
  enum class Kind {
    kWelcome,  // a new session (resume false) or the resumed one
    kReject,
    kEvict,  // end evict_session_id, then welcome a new session
  };
  Kind kind = Kind::kReject;
  // kReject: the Reject's code and message, and for a refused resume the
  // siphon_resumes_total outcome ("unknown_session", "bad_token"; else
  // empty).
  v1::ErrorCode code = v1::ERROR_CODE_UNSPECIFIED;
  std::string message;
  std::string_view resume_outcome;
  // kWelcome, kEvict: the negotiated version; a resume (the session is
  // AcceptState::resumed) or a new session with `limits`.
  v1::Version version;
  bool resume = false;
  protocol::SessionLimits limits;
  std::string evict_session_id;  // kEvict
};

AcceptDecision decideAccept(const v1::Hello& hello, const AcceptState& state);

}  // namespace siphon::agent
