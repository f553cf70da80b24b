// The agent's answer to a Hello (agent/server/accept_decision.h), by table:
// each row a Hello and the server's state, and the decision that must come
// of them.
#include "agent/server/accept_decision.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "siphon/protocol/handshake.h"

// Rows name only what they set; the rest keeps its default.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace siphon::agent {
namespace {

using ::testing::HasSubstr;
using Kind = AcceptDecision::Kind;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kToken = "sesame";

// A Hello of the agent's own version with `token`, a resume when
// `resume_id` is given.
v1::Hello hello(std::string_view token, std::string resume_id = "", std::string resume_token = "") {
  v1::Hello h;
  *h.mutable_version() = protocol::currentVersion();
  h.set_client_name("test");
  h.set_auth_token(std::string(token));
  if (!resume_id.empty()) {
    h.mutable_resume()->set_session_id(resume_id);
    h.mutable_resume()->set_resume_token(resume_token);
  }
  return h;
}

struct Row {
  std::string name;
  v1::Hello hello;
  // The state, before the defaults below are applied.
  bool insecure_no_auth = false;
  bool draining = false;
  uint32_t max_sessions = 4;
  std::vector<SessionView> sessions;
  std::string resumed_id;  // the session Hello.resume finds, when not empty
  // What must come out.
  Kind kind;
  v1::ErrorCode code = v1::ERROR_CODE_UNSPECIFIED;
  std::string message;  // a part of the Reject's message
  std::string_view resume_outcome;
  bool resume = false;
  std::string evicted;
};

const Clock::time_point t0 = Clock::time_point() + std::chrono::hours(1);

SessionView session(std::string_view id, bool detached, uint64_t received, size_t streams,
                    int created_s) {
  return SessionView{.id = id,
                     .resume_token = id == "a" ? "rt-a" : "rt-other",
                     .detached = detached,
                     .received = received,
                     .streams = streams,
                     .created = t0 + std::chrono::seconds(created_s)};
}

AcceptDecision decide(const Row& row) {
  AcceptState state{.agent_version = protocol::currentVersion(),
                    .insecure_no_auth = row.insecure_no_auth,
                    .token = kToken,
                    .draining = row.draining,
                    .max_sessions = row.max_sessions,
                    .session_grace = std::chrono::seconds(60),
                    .limits = protocol::SessionLimits(),
                    .session_count = row.sessions.size()};
  for (const SessionView& s : row.sessions) {
    if (!row.resumed_id.empty() && s.id == row.resumed_id) state.resumed = s;
  }
  state.sessions = row.sessions;
  return decideAccept(row.hello, state);
}

TEST(AcceptDecision, Table) {
  v1::Hello old_major = hello(kToken);
  old_major.mutable_version()->set_major(protocol::currentVersion().major() + 1);
  v1::Hello newer_minor = hello(kToken);
  newer_minor.mutable_version()->set_minor(protocol::currentVersion().minor() + 7);

  // Four sessions: "a" detached and empty (the older), "b" detached and
  // empty (newer), "c" detached with a request received, "d" attached.
  const std::vector<SessionView> full = {session("b", true, 0, 0, 20), session("a", true, 0, 0, 10),
                                         session("c", true, 3, 0, 5), session("d", false, 0, 0, 1)};
  const std::vector<SessionView> full_of_holders = {
      session("c", true, 3, 0, 5), session("e", true, 0, 2, 6), session("d", false, 0, 0, 1),
      session("f", false, 1, 1, 2)};

  const std::vector<Row> rows = {
      {.name = "a new session", .hello = hello(kToken), .kind = Kind::kWelcome},
      {.name = "a newer minor version is negotiated down",
       .hello = newer_minor,
       .kind = Kind::kWelcome},
      {.name = "another major version",
       .hello = old_major,
       .kind = Kind::kReject,
       .code = v1::UNSUPPORTED_VERSION,
       .message = "version"},
      {.name = "the version is checked before the token",
       .hello =
           [&] {
             v1::Hello h = old_major;
             h.set_auth_token("wrong");
             return h;
           }(),
       .kind = Kind::kReject,
       .code = v1::UNSUPPORTED_VERSION},
      {.name = "wrong token",
       .hello = hello("sesame!"),
       .kind = Kind::kReject,
       .code = v1::UNAUTHENTICATED,
       .message = "wrong or missing token"},
      {.name = "missing token",
       .hello = hello(""),
       .kind = Kind::kReject,
       .code = v1::UNAUTHENTICATED,
       .message = "wrong or missing token"},
      {.name = "no token needed with --insecure-no-auth",
       .hello = hello(""),
       .insecure_no_auth = true,
       .kind = Kind::kWelcome},
      {.name = "a new session while draining",
       .hello = hello(kToken),
       .draining = true,
       .kind = Kind::kReject,
       .code = v1::AGENT_DRAINING,
       .message = "draining"},
      {.name = "the token is checked before the drain",
       .hello = hello("wrong"),
       .draining = true,
       .kind = Kind::kReject,
       .code = v1::UNAUTHENTICATED},
      {.name = "a resume gets in while draining",
       .hello = hello(kToken, "a", "rt-a"),
       .draining = true,
       .sessions = full,
       .resumed_id = "a",
       .kind = Kind::kWelcome,
       .resume = true},
      {.name = "a resume at the session limit is not a new session",
       .hello = hello(kToken, "a", "rt-a"),
       .max_sessions = 4,
       .sessions = full,
       .resumed_id = "a",
       .kind = Kind::kWelcome,
       .resume = true},
      {.name = "a resume of an unknown session",
       .hello = hello(kToken, "zz", "rt-a"),
       .sessions = full,
       .kind = Kind::kReject,
       .code = v1::SESSION_EXPIRED,
       .message = "session zz is unknown or expired (grace 60000 ms)",
       .resume_outcome = "unknown_session"},
      {.name = "a resume with the wrong resume token",
       .hello = hello(kToken, "a", "rt-other"),
       .sessions = full,
       .resumed_id = "a",
       .kind = Kind::kReject,
       .code = v1::UNAUTHENTICATED,
       .message = "wrong resume token",
       .resume_outcome = "bad_token"},
      {.name = "a resume needs the client token too",
       .hello = hello("wrong", "a", "rt-a"),
       .sessions = full,
       .resumed_id = "a",
       .kind = Kind::kReject,
       .code = v1::UNAUTHENTICATED,
       .message = "wrong or missing token"},
      {.name = "below the limit nothing is evicted",
       .hello = hello(kToken),
       .max_sessions = 5,
       .sessions = full,
       .kind = Kind::kWelcome},
      {.name = "at the limit the oldest detached session that holds nothing goes",
       .hello = hello(kToken),
       .max_sessions = 4,
       .sessions = full,
       .kind = Kind::kEvict,
       .evicted = "a"},
      {.name = "past the limit (lowered) the same",
       .hello = hello(kToken),
       .max_sessions = 2,
       .sessions = full,
       .kind = Kind::kEvict,
       .evicted = "a"},
      {.name = "sessions that hold anything, or are attached, are never evicted",
       .hello = hello(kToken),
       .max_sessions = 4,
       .sessions = full_of_holders,
       .kind = Kind::kReject,
       .code = v1::TOO_MANY_SESSIONS,
       .message = "--max-sessions"},
      {.name = "the drain is told before the limit",
       .hello = hello(kToken),
       .draining = true,
       .max_sessions = 4,
       .sessions = full_of_holders,
       .kind = Kind::kReject,
       .code = v1::AGENT_DRAINING},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    const AcceptDecision d = decide(row);
    EXPECT_EQ(d.kind, row.kind);
    if (row.kind == Kind::kReject) {
      EXPECT_EQ(d.code, row.code) << v1::ErrorCode_Name(d.code) << ": " << d.message;
      EXPECT_THAT(d.message, HasSubstr(row.message));
      EXPECT_EQ(d.resume_outcome, row.resume_outcome);
      continue;
    }
    EXPECT_EQ(d.resume, row.resume);
    EXPECT_EQ(d.version.major(), protocol::currentVersion().major());
    EXPECT_EQ(d.version.minor(), protocol::currentVersion().minor()) << "negotiated down";
    EXPECT_EQ(d.evict_session_id, row.evicted);
  }
}

// A new session's limits are the client's asks, clamped by the agent's.
TEST(AcceptDecision, NewSessionLimitsAreNegotiated) {
  v1::Hello h = hello(kToken);
  h.mutable_requested_limits()->set_max_streams(3);
  protocol::SessionLimits agent;
  agent.max_streams = 100;
  AcceptState state{.agent_version = protocol::currentVersion(),
                    .token = kToken,
                    .max_sessions = 1,
                    .limits = agent};
  AcceptDecision d = decideAccept(h, state);
  ASSERT_EQ(d.kind, Kind::kWelcome) << d.message;
  EXPECT_EQ(d.limits.max_streams, 3u);

  h.mutable_requested_limits()->set_max_streams(1000);
  d = decideAccept(h, state);
  EXPECT_EQ(d.limits.max_streams, 100u) << "a client may ask for less, never more";
}

}  // namespace
}  // namespace siphon::agent
