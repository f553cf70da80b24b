// Handshake helpers (version negotiation, token comparison, Hello, the
// client's reading of the agent's answer) and limits negotiation.
#include "siphon/protocol/handshake.h"

#include <gtest/gtest.h>

#include <string>

#include "google/protobuf/util/message_differencer.h"
#include "siphon/protocol/limits.h"
#include "siphon/status.h"

namespace siphon::protocol {
namespace {

using google::protobuf::util::MessageDifferencer;

v1::Version version(uint32_t major, uint32_t minor) {
  v1::Version v;
  v.set_major(major);
  v.set_minor(minor);
  return v;
}

TEST(HandshakeTest, SameMajorTakesTheLowerMinor) {
  for (auto [c, a] : std::vector<std::pair<uint32_t, uint32_t>>{{3, 1}, {1, 3}, {2, 2}, {0, 9}}) {
    auto v = negotiateVersion(version(1, c), version(1, a));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->major(), 1u);
    EXPECT_EQ(v->minor(), std::min(c, a));
  }
}

TEST(HandshakeTest, MajorMismatchNamesBothVersions) {
  auto v = negotiateVersion(version(1, 0), version(2, 3));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(errorCodeOf(v.status()), v1::UNSUPPORTED_VERSION);
  std::string msg(v.status().message());
  EXPECT_NE(msg.find("1.0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2.3"), std::string::npos) << msg;
  // Either way round.
  auto w = negotiateVersion(version(2, 3), version(1, 0));
  EXPECT_EQ(errorCodeOf(w.status()), v1::UNSUPPORTED_VERSION);
  // A Hello without a version (major 0) does not pass as ours.
  EXPECT_FALSE(negotiateVersion(v1::Version(), currentVersion()).ok());
}

TEST(HandshakeTest, CurrentVersionAndItsName) {
  EXPECT_EQ(currentVersion().major(), kProtocolMajor);
  EXPECT_EQ(currentVersion().minor(), kProtocolMinor);
  EXPECT_EQ(versionString(version(1, 12)), "1.12");
  auto self = negotiateVersion(currentVersion(), currentVersion());
  ASSERT_TRUE(self.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(*self, currentVersion()));
}

TEST(HandshakeTest, ConstantTimeEquals) {
  EXPECT_TRUE(constantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(constantTimeEquals("secret-token", "secret-tokeN"));  // last byte
  EXPECT_FALSE(constantTimeEquals("secret-token", "Secret-token"));  // first byte
  EXPECT_FALSE(constantTimeEquals("secret", "secret-token"));        // a prefix
  EXPECT_FALSE(constantTimeEquals("secret-token", "secret"));
  EXPECT_TRUE(constantTimeEquals("", ""));
  EXPECT_FALSE(constantTimeEquals("", "a"));
  EXPECT_FALSE(constantTimeEquals("a", ""));
  // A longer input padded with what the comparison pads with (zero bytes).
  EXPECT_FALSE(constantTimeEquals("ab", std::string("ab\0", 3)));
  EXPECT_TRUE(constantTimeEquals(std::string("a\0b", 3), std::string("a\0b", 3)));
  EXPECT_FALSE(constantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(HandshakeTest, MakeHello) {
  v1::Limits asked;
  asked.set_max_streams(7);
  v1::Frame plain = makeHello("cli", "tok", asked, nullptr);
  ASSERT_TRUE(plain.has_hello());
  EXPECT_TRUE(MessageDifferencer::Equals(plain.hello().version(), currentVersion()));
  EXPECT_EQ(plain.hello().client_name(), "cli");
  EXPECT_EQ(plain.hello().auth_token(), "tok");
  EXPECT_EQ(plain.hello().requested_limits().max_streams(), 7u);
  EXPECT_FALSE(plain.hello().has_resume());

  v1::ResumeRequest resume;
  resume.set_session_id("s-9");
  resume.set_resume_token("rt");
  resume.set_last_seq_received(41);
  v1::Frame again = makeHello("cli", "tok", asked, &resume);
  ASSERT_TRUE(again.hello().has_resume());
  EXPECT_TRUE(MessageDifferencer::Equals(again.hello().resume(), resume));
}

TEST(HandshakeTest, WelcomeIsReturned) {
  v1::Frame f;
  f.mutable_welcome()->set_session_id("s-1");
  f.mutable_welcome()->set_last_seq_received(5);
  auto w = welcomeFrom(f);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->session_id(), "s-1");
  EXPECT_EQ(w->last_seq_received(), 5u);
}

TEST(HandshakeTest, RejectBecomesATypedStatus) {
  for (v1::ErrorCode code : {v1::UNAUTHENTICATED, v1::SESSION_EXPIRED, v1::UNSUPPORTED_VERSION,
                             v1::RESOURCE_EXHAUSTED}) {
    auto w = welcomeFrom(makeReject(code, "why not"));
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(errorCodeOf(w.status()), code);
    EXPECT_EQ(w.status().message(), "why not");
  }
}

TEST(HandshakeTest, RejectWithoutAnErrorCodeIsStillAnError) {
  // A Reject (or Goaway) carrying OK or nothing must not turn into an OK
  // status: a StatusOr cannot hold one.
  for (v1::ErrorCode code : {v1::ERROR_CODE_UNSPECIFIED, v1::OK}) {
    auto w = welcomeFrom(makeReject(code, "odd"));
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(errorCodeOf(w.status()), v1::INTERNAL);
    EXPECT_EQ(w.status().message(), "odd");
    v1::Frame goaway;
    goaway.mutable_goaway()->set_code(code);
    EXPECT_EQ(errorCodeOf(welcomeFrom(goaway).status()), v1::INTERNAL);
  }
}

TEST(HandshakeTest, GoawayBeforeWelcomeCarriesItsCode) {
  v1::Frame f;
  f.mutable_goaway()->set_code(v1::AGENT_DRAINING);
  f.mutable_goaway()->set_message("shutting down");
  auto w = welcomeFrom(f);
  EXPECT_EQ(errorCodeOf(w.status()), v1::AGENT_DRAINING);
}

TEST(HandshakeTest, AnyOtherFrameIsProtocolError) {
  std::vector<v1::Frame> others(4);
  others[0].mutable_ping()->set_nonce(1);
  others[1].mutable_hello()->set_client_name("x");
  others[2].mutable_data()->set_payload("y");
  // others[3]: no body at all.
  for (const v1::Frame& f : others) {
    auto w = welcomeFrom(f);
    ASSERT_FALSE(w.ok()) << f.ShortDebugString();
    EXPECT_EQ(errorCodeOf(w.status()), v1::PROTOCOL_ERROR);
  }
}

TEST(HandshakeTest, MakeReject) {
  v1::Frame f = makeReject(v1::UNAUTHENTICATED, "wrong token");
  ASSERT_TRUE(f.has_reject());
  EXPECT_EQ(f.reject().code(), v1::UNAUTHENTICATED);
  EXPECT_EQ(f.reject().message(), "wrong token");
}

// ------------------------------------------------------------------ limits

SessionLimits agentLimits() {
  SessionLimits l;
  l.max_frame_size = 64 * 1024;
  l.initial_stream_window = 128 * 1024;
  l.max_streams = 100;
  l.max_pending_requests = 50;
  l.replay_buffer_bytes = 4 * 1024 * 1024;
  l.keepalive_interval = std::chrono::milliseconds(5000);
  l.keepalive_timeout = std::chrono::milliseconds(20000);
  l.session_grace = std::chrono::milliseconds(60000);
  l.max_read_size = 32 * 1024;
  return l;
}

TEST(LimitsTest, NothingAskedGivesTheAgentsOwn) {
  SessionLimits l = negotiateLimits(v1::Limits(), agentLimits());
  SessionLimits a = agentLimits();
  EXPECT_EQ(l.max_frame_size, a.max_frame_size);
  EXPECT_EQ(l.initial_stream_window, a.initial_stream_window);
  EXPECT_EQ(l.max_streams, a.max_streams);
  EXPECT_EQ(l.max_pending_requests, a.max_pending_requests);
  EXPECT_EQ(l.replay_buffer_bytes, a.replay_buffer_bytes);
  EXPECT_EQ(l.keepalive_interval, a.keepalive_interval);
  EXPECT_EQ(l.keepalive_timeout, a.keepalive_timeout);
  EXPECT_EQ(l.session_grace, a.session_grace);
  EXPECT_EQ(l.max_read_size, a.max_read_size);
}

TEST(LimitsTest, SmallerAsksWin) {
  v1::Limits asked;
  asked.set_max_frame_size(16 * 1024);
  asked.set_initial_stream_window(32 * 1024);
  asked.set_max_streams(10);
  asked.set_max_pending_requests(5);
  asked.set_replay_buffer_bytes(1024 * 1024);
  asked.set_keepalive_interval_ms(1000);
  asked.set_keepalive_timeout_ms(3000);
  asked.set_session_grace_ms(1);  // the agent's own grace stands
  asked.set_max_read_size(4096);
  SessionLimits l = negotiateLimits(asked, agentLimits());
  EXPECT_EQ(l.max_frame_size, 16u * 1024);
  EXPECT_EQ(l.initial_stream_window, 32u * 1024);
  EXPECT_EQ(l.max_streams, 10u);
  EXPECT_EQ(l.max_pending_requests, 5u);
  EXPECT_EQ(l.replay_buffer_bytes, 1024u * 1024);
  EXPECT_EQ(l.keepalive_interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(l.keepalive_timeout, std::chrono::milliseconds(3000));
  EXPECT_EQ(l.session_grace, std::chrono::milliseconds(60000));
  EXPECT_EQ(l.max_read_size, 4096u);
}

TEST(LimitsTest, LargerAsksGetTheAgentsOwn) {
  v1::Limits asked = toProto(agentLimits());
  asked.set_max_frame_size(asked.max_frame_size() * 2);
  asked.set_initial_stream_window(asked.initial_stream_window() * 2);
  asked.set_max_streams(asked.max_streams() * 2);
  asked.set_max_pending_requests(asked.max_pending_requests() * 2);
  asked.set_replay_buffer_bytes(asked.replay_buffer_bytes() * 2);
  asked.set_keepalive_interval_ms(asked.keepalive_interval_ms() * 2);
  asked.set_keepalive_timeout_ms(asked.keepalive_timeout_ms() * 2);
  asked.set_max_read_size(asked.max_read_size() * 2);
  SessionLimits l = negotiateLimits(asked, agentLimits());
  EXPECT_TRUE(MessageDifferencer::Equals(toProto(l), toProto(agentLimits())))
      << toProto(l).ShortDebugString();
}

TEST(LimitsTest, FloorsKeepTheSessionUsable) {
  v1::Limits asked;
  asked.set_max_frame_size(10);
  asked.set_initial_stream_window(1);
  asked.set_replay_buffer_bytes(1);
  SessionLimits l = negotiateLimits(asked, agentLimits());
  EXPECT_EQ(l.max_frame_size, 4096u);
  EXPECT_EQ(l.initial_stream_window, kMinStreamWindow);
  EXPECT_EQ(l.replay_buffer_bytes, 2u * 4096);
  // A data frame with at least one byte of payload fits.
  EXPECT_GT(l.max_frame_size, kDataFrameOverhead);
}

TEST(LimitsTest, KeepaliveIntervalStaysBelowTheTimeout) {
  // A client that only asks for faster loss detection must not get a timeout
  // shorter than the ping interval: idle sessions would die.
  v1::Limits asked;
  asked.set_keepalive_timeout_ms(3000);
  SessionLimits l = negotiateLimits(asked, agentLimits());
  EXPECT_EQ(l.keepalive_timeout, std::chrono::milliseconds(3000));
  EXPECT_EQ(l.keepalive_interval, std::chrono::milliseconds(1500));
  // When both fit already, nothing moves.
  asked.set_keepalive_interval_ms(500);
  l = negotiateLimits(asked, agentLimits());
  EXPECT_EQ(l.keepalive_interval, std::chrono::milliseconds(500));
}

// A client asking for a 0 or 1 ms keepalive gets the floor: the agent
// would otherwise ping on every turn of its event loop.
TEST(LimitsTest, KeepaliveAsksBelowTheFloorGetTheFloor) {
  v1::Limits asked;
  asked.set_keepalive_interval_ms(1);
  SessionLimits l = negotiateLimits(asked, agentLimits());
  EXPECT_EQ(l.keepalive_interval, kMinKeepaliveInterval);
  EXPECT_EQ(l.keepalive_timeout, agentLimits().keepalive_timeout);
  // A 1 ms timeout too: two intervals at the floor.
  asked.set_keepalive_timeout_ms(1);
  l = negotiateLimits(asked, agentLimits());
  EXPECT_EQ(l.keepalive_interval, kMinKeepaliveInterval);
  EXPECT_EQ(l.keepalive_timeout, 2 * kMinKeepaliveInterval);
  // Only a timeout: the interval comes down to half of it, not below the floor.
  v1::Limits timeout_only;
  timeout_only.set_keepalive_timeout_ms(1);
  l = negotiateLimits(timeout_only, agentLimits());
  EXPECT_EQ(l.keepalive_interval, kMinKeepaliveInterval);
  EXPECT_EQ(l.keepalive_timeout, 2 * kMinKeepaliveInterval);
  EXPECT_EQ(toProto(l).keepalive_interval_ms(), 100u);
}

// The client reads the Welcome's limits through fromProto(): a hostile agent
// gets the same floors and ceilings a hostile client gets from the agent.
TEST(LimitsTest, AWelcomeOutsideTheBoundsIsClampedOnTheClient) {
  v1::Limits hostile;
  hostile.set_keepalive_interval_ms(1);
  hostile.set_keepalive_timeout_ms(1);
  hostile.set_max_frame_size(UINT32_MAX);
  hostile.set_initial_stream_window(1);
  hostile.set_max_streams(UINT32_MAX);
  hostile.set_max_pending_requests(UINT32_MAX);
  hostile.set_replay_buffer_bytes(UINT64_MAX);
  hostile.set_session_grace_ms(UINT32_MAX);
  hostile.set_max_read_size(UINT32_MAX);
  SessionLimits l = fromProto(hostile);
  EXPECT_EQ(l.keepalive_interval, kMinKeepaliveInterval);
  EXPECT_EQ(l.keepalive_timeout, 2 * kMinKeepaliveInterval);
  EXPECT_EQ(l.max_frame_size, kMaxFrameSizeCeiling);
  EXPECT_EQ(l.initial_stream_window, kMinStreamWindow);
  EXPECT_EQ(l.max_streams, kMaxStreamsCeiling);
  EXPECT_EQ(l.max_pending_requests, kMaxPendingRequestsCeiling);
  EXPECT_EQ(l.replay_buffer_bytes, kMaxSessionBufferCeiling);
  EXPECT_EQ(l.session_grace, kMaxSessionGrace);
  EXPECT_EQ(l.max_read_size, kMaxFrameSizeCeiling - kReadSizeHeadroom);
  // And the other way: values above the ceilings from a client are the
  // agent's own (min), which validateAgentLimits bounds; a huge keepalive
  // stays within its ceiling on both sides.
  v1::Limits slow;
  slow.set_keepalive_interval_ms(UINT32_MAX);
  slow.set_keepalive_timeout_ms(UINT32_MAX);
  l = fromProto(slow);
  EXPECT_EQ(l.keepalive_timeout, kMaxKeepaliveTimeout);
  EXPECT_EQ(l.keepalive_interval, kMaxKeepaliveInterval);
  // The same clamp binds the agent's side of the negotiation.
  SessionLimits wild = agentLimits();
  wild.keepalive_interval = std::chrono::milliseconds(1);
  wild.keepalive_timeout = std::chrono::milliseconds(1);
  wild.initial_stream_window = 1;
  l = negotiateLimits(v1::Limits(), wild);
  EXPECT_EQ(l.keepalive_interval, kMinKeepaliveInterval);
  EXPECT_EQ(l.keepalive_timeout, 2 * kMinKeepaliveInterval);
  EXPECT_EQ(l.initial_stream_window, kMinStreamWindow);
}

TEST(LimitsTest, ReadsFitInOneFrame) {
  // A read of max_read_size bytes travels in one Response frame.
  SessionLimits agent = agentLimits();
  agent.max_read_size = agent.max_frame_size;
  SessionLimits l = negotiateLimits(v1::Limits(), agent);
  EXPECT_EQ(l.max_read_size, agent.max_frame_size - kReadSizeHeadroom);

  SessionLimits defaults;
  EXPECT_LE(defaults.max_read_size + kReadSizeHeadroom, defaults.max_frame_size);

  v1::Frame f;
  f.mutable_response()->set_request_id(~uint64_t{0});
  f.mutable_response()->mutable_error()->set_code(v1::ERRNO);
  f.mutable_response()->mutable_error()->set_errno_value(-1);
  f.mutable_response()->mutable_file()->mutable_data()->set_data(
      std::string(defaults.max_read_size, 'r'));
  f.mutable_response()->mutable_file()->mutable_data()->set_eof(true);
  EXPECT_LE(f.ByteSizeLong(), defaults.max_frame_size);
}

TEST(LimitsTest, ProtoRoundTripAndDefaults) {
  SessionLimits a = agentLimits();
  SessionLimits b = fromProto(toProto(a));
  EXPECT_TRUE(MessageDifferencer::Equals(toProto(a), toProto(b)));
  EXPECT_EQ(b.keepalive_timeout, std::chrono::milliseconds(20000));

  // Zero fields take the defaults.
  SessionLimits d = fromProto(v1::Limits());
  EXPECT_TRUE(MessageDifferencer::Equals(toProto(d), toProto(SessionLimits())));
  v1::Limits one;
  one.set_max_streams(3);
  SessionLimits e = fromProto(one);
  EXPECT_EQ(e.max_streams, 3u);
  EXPECT_EQ(e.max_frame_size, SessionLimits().max_frame_size);
}

}  // namespace
}  // namespace siphon::protocol
