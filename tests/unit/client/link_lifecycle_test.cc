// LinkLifecycle (layer-protocol/src/client/link_lifecycle.h), the client's
// decisions about dialling, handshakes, resumes and moves, with no I/O: each
// test feeds a sequence of outcomes (and times) and checks the steps that
// come back, as a table.
#include "layer-protocol/src/client/link_lifecycle.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "siphon/status.h"

namespace siphon::client {
namespace {

using std::chrono::milliseconds;
using Kind = LinkLifecycle::Step::Kind;

// What happened to the step before (the input of one row).
struct Outcome {
  enum class What { kStart, kDialed, kRefused, kHandshake, kWaited } what;
  absl::Status status = absl::OkStatus();
  milliseconds at{0};  // time since the start
};

// The step expected back (the output of one row).
struct Expect {
  Kind kind;
  std::string endpoint = "";
  milliseconds limit_or_wait{0};
  bool resume = false;
  v1::ErrorCode code = v1::OK;  // kFail
  std::string text = "";        // kFail: a part of the message
};

struct Row {
  Outcome in;
  Expect out;
};

Outcome start() { return {Outcome::What::kStart}; }
Outcome dialed(milliseconds at = milliseconds(0)) {
  return {Outcome::What::kDialed, absl::OkStatus(), at};
}
Outcome dialFailed(absl::Status s, milliseconds at = milliseconds(0)) {
  return {Outcome::What::kDialed, std::move(s), at};
}
Outcome refused(std::string text) {
  return {Outcome::What::kRefused, protoError(v1::UNAVAILABLE, text)};
}
Outcome handshake(absl::Status s = absl::OkStatus(), milliseconds at = milliseconds(0)) {
  return {Outcome::What::kHandshake, std::move(s), at};
}
Outcome waited(milliseconds at) { return {Outcome::What::kWaited, absl::OkStatus(), at}; }

Expect dial(std::string ep, milliseconds limit = milliseconds(0)) {
  return {Kind::kDial, std::move(ep), limit};
}
Expect hello(std::string ep, bool resume = false, milliseconds limit = milliseconds(0)) {
  return {Kind::kHandshake, std::move(ep), limit, resume};
}
Expect wait(milliseconds ms) { return {Kind::kWait, "", ms}; }
Expect done(std::string ep) { return {Kind::kDone, std::move(ep)}; }
Expect fail(v1::ErrorCode code, std::string text) {
  return {Kind::kFail, "", milliseconds(0), false, code, std::move(text)};
}

absl::Status unavailable(std::string text) { return protoError(v1::UNAVAILABLE, text); }

// Feeds the rows in order; every row's step must match.
void play(LinkLifecycle lifecycle, const std::vector<Row>& rows) {
  const protocol::TimePoint t0 = protocol::Clock::now();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Outcome& in = rows[i].in;
    const Expect& want = rows[i].out;
    const protocol::TimePoint now = t0 + in.at;
    LinkLifecycle::Step got;
    switch (in.what) {
      case Outcome::What::kStart:
        got = lifecycle.start(now);
        break;
      case Outcome::What::kDialed:
        got = lifecycle.onDialed(in.status, false, now);
        break;
      case Outcome::What::kRefused:
        got = lifecycle.onDialed(in.status, true, now);
        break;
      case Outcome::What::kHandshake:
        got = lifecycle.onHandshake(in.status, now);
        break;
      case Outcome::What::kWaited:
        got = lifecycle.onWaited(now);
        break;
    }
    SCOPED_TRACE(testing::Message() << "row " << i);
    ASSERT_EQ(static_cast<int>(got.kind), static_cast<int>(want.kind)) << got.status;
    switch (want.kind) {
      case Kind::kDial:
        EXPECT_EQ(got.endpoint, want.endpoint);
        EXPECT_EQ(got.limit, want.limit_or_wait);
        break;
      case Kind::kHandshake:
        EXPECT_EQ(got.endpoint, want.endpoint);
        EXPECT_EQ(got.resume, want.resume);
        EXPECT_EQ(got.limit, want.limit_or_wait);
        break;
      case Kind::kWait:
        EXPECT_EQ(got.wait, want.limit_or_wait);
        break;
      case Kind::kDone:
        EXPECT_EQ(got.endpoint, want.endpoint);
        EXPECT_EQ(lifecycle.state(), LinkLifecycle::State::kDone);
        break;
      case Kind::kFail:
        EXPECT_EQ(errorCodeOf(got.status), want.code) << got.status;
        EXPECT_NE(got.status.message().find(want.text), absl::string_view::npos) << got.status;
        EXPECT_EQ(lifecycle.state(), LinkLifecycle::State::kFailed);
        break;
    }
  }
}

const LinkLifecycle::Backoff kBackoff{milliseconds(100), milliseconds(350)};

// ------------------------------------------------------------- connect

TEST(LinkLifecycleTest, ConnectTakesTheFirstEndpointThatAnswers) {
  play(LinkLifecycle::connect({"a:1", "b:2"}),
       {
           {start(), dial("a:1")},
           {dialFailed(unavailable("a:1: Connection refused")), dial("b:2")},
           {dialed(), hello("b:2")},
           {handshake(), done("b:2")},
       });
}

TEST(LinkLifecycleTest, ConnectWithNoEndpointIsInvalid) {
  play(LinkLifecycle::connect({}),
       {{start(), fail(v1::INVALID_ARGUMENT, "no agent address given")}});
}

TEST(LinkLifecycleTest, ConnectNamesEveryEndpointWhenNoneAnswers) {
  play(LinkLifecycle::connect({"a:1", "b:2"}),
       {
           {start(), dial("a:1")},
           {dialFailed(unavailable("a:1: Connection refused")), dial("b:2")},
           {dialed(), hello("b:2")},
           // A handshake that times out names its agent.
           {handshake(protoError(v1::TIMEOUT, "no Welcome within 5000 ms")),
            fail(v1::UNAVAILABLE,
                 "cannot reach the agent: a:1: Connection refused; b:2: no Welcome within")},
       });
}

TEST(LinkLifecycleTest, ConnectStopsAtAReject) {
  // Another endpoint of the same target would say the same.
  play(LinkLifecycle::connect({"a:1", "b:2"}),
       {
           {start(), dial("a:1")},
           {dialed(), hello("a:1")},
           {handshake(protoError(v1::UNAUTHENTICATED, "bad token")),
            fail(v1::UNAUTHENTICATED, "bad token")},
       });
}

TEST(LinkLifecycleTest, ConnectPassesAFullAgentAndSaysSoWhenAllAre) {
  play(LinkLifecycle::connect({"a:1", "b:2"}),
       {
           {start(), dial("a:1")},
           {dialed(), hello("a:1")},
           {handshake(protoError(v1::TOO_MANY_SESSIONS, "session limit")), dial("b:2")},
           {dialed(), hello("b:2")},
           {handshake(protoError(v1::AGENT_DRAINING, "draining")),
            fail(v1::TOO_MANY_SESSIONS, "no agent took the session: a:1: session limit; b:2")},
       });
  // With one endpoint, full is the answer.
  play(LinkLifecycle::connect({"a:1"}), {
                                            {start(), dial("a:1")},
                                            {dialed(), hello("a:1")},
                                            {handshake(protoError(v1::AGENT_DRAINING, "draining")),
                                             fail(v1::AGENT_DRAINING, "draining")},
                                        });
}

// ------------------------------------------------------------- resume

TEST(LinkLifecycleTest, ResumeRetriesWithBackoffUntilTheGrace) {
  play(LinkLifecycle::resume("a:1", milliseconds(1000), /*bounded=*/false, kBackoff),
       {
           {start(), dial("a:1")},
           {dialFailed(unavailable("a:1: Network is unreachable")), wait(milliseconds(100))},
           {waited(milliseconds(150)), dial("a:1")},
           {dialed(milliseconds(160)), hello("a:1", /*resume=*/true)},
           {handshake(protoError(v1::TIMEOUT, "no Welcome"), milliseconds(400)),
            wait(milliseconds(200))},
           {waited(milliseconds(600)), dial("a:1")},
           {dialFailed(unavailable("a:1: timeout"), milliseconds(700)),
            wait(milliseconds(350))},  // doubled, capped
           {waited(milliseconds(1050)), fail(v1::UNAVAILABLE, "no resume within 1000 ms: a:1")},
       });
}

TEST(LinkLifecycleTest, ResumeSucceeds) {
  play(LinkLifecycle::resume("a:1", milliseconds(1000), false, kBackoff),
       {
           {start(), dial("a:1")},
           {dialed(), hello("a:1", true)},
           {handshake(), done("a:1")},
       });
}

TEST(LinkLifecycleTest, ResumeEndsAtARefusedConnectionOrAFinalAnswer) {
  play(LinkLifecycle::resume("a:1", milliseconds(1000), false, kBackoff),
       {
           {start(), dial("a:1")},
           {refused("a:1: Connection refused"),
            fail(v1::UNAVAILABLE, "Connection refused: the agent is gone")},
       });
  play(LinkLifecycle::resume("a:1", milliseconds(1000), false, kBackoff),
       {
           {start(), dial("a:1")},
           {dialed(), hello("a:1", true)},
           {handshake(protoError(v1::SESSION_EXPIRED, "unknown session")),
            fail(v1::SESSION_EXPIRED, "unknown session")},
       });
}

TEST(LinkLifecycleTest, ABoundedResumeLimitsEachAttemptToWhatIsLeft) {
  // With another agent to move to: each attempt within the keepalive timeout.
  play(LinkLifecycle::resume("a:1", milliseconds(1000), /*bounded=*/true, kBackoff),
       {
           {start(), dial("a:1", milliseconds(1000))},
           {dialed(milliseconds(100)), hello("a:1", true, milliseconds(1000))},
           {handshake(unavailable("cut"), milliseconds(300)), wait(milliseconds(100))},
           {waited(milliseconds(400)), dial("a:1", milliseconds(600))},
           {dialFailed(unavailable("a:1: no answer"), milliseconds(999)), wait(milliseconds(200))},
           {waited(milliseconds(1200)), fail(v1::UNAVAILABLE, "no resume within 1000 ms")},
       });
}

// ------------------------------------------------------------- move

TEST(LinkLifecycleTest, AMoveTriesTheOthersInOrderThenTheOneLeft) {
  auto lifecycle = LinkLifecycle::move({"a:1", "b:2", "c:3"}, "b:2", /*draining=*/false,
                                       milliseconds(1000), kBackoff);
  EXPECT_EQ(lifecycle.order(), (std::vector<std::string>{"c:3", "a:1", "b:2"}));
  play(std::move(lifecycle),
       {
           {start(), dial("c:3")},
           {dialFailed(unavailable("c:3: Connection refused")), dial("a:1")},
           {dialed(), hello("a:1")},
           {handshake(protoError(v1::TOO_MANY_SESSIONS, "full")), dial("b:2")},
           {dialed(), hello("b:2")},
           {handshake(), done("b:2")},
       });
}

TEST(LinkLifecycleTest, AMoveFromADrainingAgentNeverGoesBackToIt) {
  auto lifecycle =
      LinkLifecycle::move({"a:1", "b:2"}, "a:1", /*draining=*/true, milliseconds(1000), kBackoff);
  EXPECT_EQ(lifecycle.order(), (std::vector<std::string>{"b:2"}));
  // Rounds with backoff until the deadline; the last round's failures say why.
  play(std::move(lifecycle),
       {
           {start(), dial("b:2")},
           {dialFailed(unavailable("b:2: Connection refused")), wait(milliseconds(100))},
           {waited(milliseconds(500)), dial("b:2")},
           {dialFailed(unavailable("b:2: no answer within 5000 ms"), milliseconds(900)),
            wait(milliseconds(200))},
           {waited(milliseconds(1100)), fail(v1::UNAVAILABLE, "b:2: no answer within 5000 ms")},
       });
}

TEST(LinkLifecycleTest, AMoveWithNowhereToGoFailsAtOnce) {
  auto lifecycle =
      LinkLifecycle::move({"a:1"}, "a:1", /*draining=*/true, milliseconds(1000), kBackoff);
  EXPECT_TRUE(lifecycle.order().empty());
  play(std::move(lifecycle), {{start(), fail(v1::UNAVAILABLE, "")}});
}

// ------------------------------------------------------ after a transport

TEST(LinkLifecycleTest, AfterATransportEnds) {
  const absl::Status cut = unavailable("connection reset");
  const absl::Status goaway = protoError(v1::CANCELLED, "the agent ended the session");
  struct Case {
    bool closing;
    absl::Status goaway;
    bool reconnect;
    AfterTransport::Kind kind;
    v1::ErrorCode why;
  };
  const std::vector<Case> cases = {
      {true, goaway, true, AfterTransport::Kind::kStop, v1::OK},
      {false, goaway, true, AfterTransport::Kind::kLose, v1::CANCELLED},
      {false, absl::OkStatus(), false, AfterTransport::Kind::kLose, v1::UNAVAILABLE},
      {false, absl::OkStatus(), true, AfterTransport::Kind::kResume, v1::UNAVAILABLE},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    AfterTransport after = afterTransport(c.closing, c.goaway, c.reconnect, cut);
    EXPECT_EQ(static_cast<int>(after.kind), static_cast<int>(c.kind)) << "case " << i;
    EXPECT_EQ(errorCodeOf(after.why), c.why) << "case " << i;
  }
}

TEST(LinkLifecycleTest, ALostLinkIsAgentLostNamingItsCause) {
  absl::Status expired = linkLostStatus("a:1", protoError(v1::SESSION_EXPIRED, "no such session"));
  EXPECT_EQ(errorCodeOf(expired), v1::AGENT_LOST);
  EXPECT_NE(expired.message().find("the session expired (SESSION_EXPIRED): the agent at a:1"),
            absl::string_view::npos)
      << expired;
  absl::Status cut = linkLostStatus("a:1", unavailable("reset"));
  EXPECT_EQ(cut.message(), "session with the agent at a:1 lost: reset");
  absl::Status other = linkLostStatus("a:1", protoError(v1::RESUME_FAILED, "new session"));
  EXPECT_EQ(other.message(), "session with the agent at a:1 lost (RESUME_FAILED): new session");
}

}  // namespace
}  // namespace siphon::client
