// Session limits (docs/SECURITY.md#limits): each limit hit in the protocol
// core gives its typed code, a message naming the limit, its value and the
// agent flag, a call to the limit observer, and the session goes on (or ends,
// for the frame size and a client that reads nothing). Also the validation of
// the agent's limit flags.
#include "siphon/protocol/limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "siphon/protocol/codec.h"
#include "siphon/protocol/session.h"
#include "siphon/status.h"

namespace siphon::protocol {
namespace {

using ::testing::HasSubstr;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

// ------------------------------------------------------------ flag checks

TEST(ValidateAgentLimitsTest, DefaultsAreValid) {
  EXPECT_TRUE(validateAgentLimits(SessionLimits{}).ok());
}

TEST(ValidateAgentLimitsTest, ZeroAndAbsurdValuesNameTheirFlag) {
  struct Case {
    const char* flag;
    void (*set)(SessionLimits&);
  };
  const std::vector<Case> cases = {
      {"--max-streams", [](SessionLimits& l) { l.max_streams = 0; }},
      {"--max-streams", [](SessionLimits& l) { l.max_streams = kMaxStreamsCeiling + 1; }},
      {"--max-pending-requests", [](SessionLimits& l) { l.max_pending_requests = 0; }},
      {"--max-pending-requests",
       [](SessionLimits& l) { l.max_pending_requests = kMaxPendingRequestsCeiling + 1; }},
      {"--max-frame-size", [](SessionLimits& l) { l.max_frame_size = 0; }},
      {"--max-frame-size", [](SessionLimits& l) { l.max_frame_size = kMinFrameSize - 1; }},
      {"--max-frame-size", [](SessionLimits& l) { l.max_frame_size = kMaxFrameSizeCeiling + 1; }},
      {"--max-read-size", [](SessionLimits& l) { l.max_read_size = 0; }},
      // A read's answer travels in one frame.
      {"--max-read-size", [](SessionLimits& l) { l.max_read_size = l.max_frame_size; }},
      {"--keepalive-interval",
       [](SessionLimits& l) { l.keepalive_interval = std::chrono::milliseconds(1); }},
      {"--keepalive-interval",
       [](SessionLimits& l) { l.keepalive_interval = kMaxKeepaliveInterval * 2; }},
      {"--keepalive-timeout", [](SessionLimits& l) { l.keepalive_timeout = l.keepalive_interval; }},
      {"--keepalive-timeout",
       [](SessionLimits& l) { l.keepalive_timeout = kMaxKeepaliveTimeout * 2; }},
      {"--max-session-buffer", [](SessionLimits& l) { l.replay_buffer_bytes = 0; }},
      {"--max-session-buffer",
       [](SessionLimits& l) { l.replay_buffer_bytes = 2ull * l.max_frame_size - 1; }},
      {"--max-session-buffer",
       [](SessionLimits& l) { l.replay_buffer_bytes = kMaxSessionBufferCeiling + 1; }},
  };
  for (const Case& c : cases) {
    SessionLimits l;
    c.set(l);
    absl::Status s = validateAgentLimits(l);
    EXPECT_EQ(errorCodeOf(s), v1::INVALID_ARGUMENT) << c.flag;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.flag)) << s;
  }
}

TEST(ValidateAgentLimitsTest, TheSmallestWorkingValuesAreAccepted) {
  SessionLimits l;
  l.max_streams = 1;
  l.max_pending_requests = 1;
  l.max_frame_size = kMinFrameSize;
  l.max_read_size = kMinFrameSize - kReadSizeHeadroom;
  l.replay_buffer_bytes = 2 * kMinFrameSize;
  l.keepalive_interval = kMinKeepaliveInterval;
  l.keepalive_timeout = 2 * kMinKeepaliveInterval;
  EXPECT_TRUE(validateAgentLimits(l).ok()) << validateAgentLimits(l);
}

// ------------------------------------------------------------ sessions

// Records what a side's handler saw; the agent side answers each request
// with an env response of `answer_bytes` (0: no answer).
class Recorder : public SessionHandler {
 public:
  Session* session = nullptr;
  bool accept_opens = false;
  size_t answer_bytes = 0;
  std::vector<v1::Request> requests;
  std::vector<v1::Response> responses;
  std::vector<v1::StreamOpen> opens;
  std::vector<std::pair<uint64_t, v1::Error>> resets;

  void onRequest(v1::Request r) override {
    if (answer_bytes > 0) {
      v1::Response a;
      a.set_request_id(r.request_id());
      a.mutable_env()->add_vars()->set_value(std::string(answer_bytes, 'v'));
      session->sendResponse(std::move(a));
    }
    requests.push_back(std::move(r));
  }
  void onResponse(v1::Response r) override { responses.push_back(std::move(r)); }
  void onStreamOpen(v1::StreamOpen open) override {
    opens.push_back(open);
    if (accept_opens) {
      v1::StreamAccept a;
      a.set_stream_id(open.stream_id());
      EXPECT_TRUE(session->acceptStream(a).ok());
    }
  }
  void onStreamReset(uint64_t id, v1::Error e) override { resets.emplace_back(id, std::move(e)); }
};

std::string bytesOf(const WriteBatch& batch) {
  std::string out;
  for (std::string_view b : batch.buffers()) out.append(b);
  return out;
}

// Client and agent sessions joined back to back; the agent's limit hits are
// recorded.
class Pipe {
 public:
  Pipe(SessionLimits client_limits, SessionLimits agent_limits)
      : client(Role::kClient, client_limits, kT0), agent(Role::kAgent, agent_limits, kT0) {
    ch.session = &client;
    ah.session = &agent;
    agent.setLimitObserver([this](const absl::Status& s) { hits.push_back(s); });
  }
  absl::Status toAgent() { return agent.onBytes(bytesOf(client.takeWrites()), ah, kT0); }
  absl::Status toClient() { return client.onBytes(bytesOf(agent.takeWrites()), ch, kT0); }
  absl::Status pump() {
    for (int i = 0; i < 1000; ++i) {
      if (!client.hasWrites() && !agent.hasWrites()) return absl::OkStatus();
      RETURN_IF_ERROR(toAgent());
      RETURN_IF_ERROR(toClient());
    }
    return absl::InternalError("the pipe never settles");
  }

  Session client;
  Session agent;
  Recorder ch, ah;
  std::vector<absl::Status> hits;
};

v1::Request envRequest() {
  v1::Request r;
  r.mutable_env()->add_include("X*");
  return r;
}

SessionLimits lax() {
  SessionLimits l;
  l.max_streams = 100;
  l.max_pending_requests = 100;
  return l;
}

TEST(SessionLimitsTest, OneStreamPastTheLimitIsRefusedAndTheSessionGoesOn) {
  SessionLimits strict = lax();
  strict.max_streams = 2;
  Pipe p(lax(), strict);
  p.ah.accept_opens = true;
  auto a = p.client.openStream(v1::StreamOpen());
  auto b = p.client.openStream(v1::StreamOpen());
  auto c = p.client.openStream(v1::StreamOpen());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ah.opens.size(), 2u);
  ASSERT_EQ(p.ch.resets.size(), 1u);
  EXPECT_EQ(p.ch.resets[0].first, *c);
  EXPECT_EQ(p.ch.resets[0].second.code(), v1::TOO_MANY_STREAMS);
  EXPECT_EQ(p.ch.resets[0].second.message(),
            "stream limit of 2 reached (siphon-agent --max-streams raises it)");
  ASSERT_EQ(p.hits.size(), 1u);
  EXPECT_EQ(errorCodeOf(p.hits[0]), v1::TOO_MANY_STREAMS);

  // The session goes on: requests are served, and a closed stream frees a
  // slot.
  p.ah.answer_bytes = 10;
  ASSERT_TRUE(p.client.sendRequest(envRequest()).ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.responses.size(), 1u);
  v1::Error cancelled;
  cancelled.set_code(v1::CANCELLED);
  p.client.resetStream(*a, cancelled);
  auto d = p.client.openStream(v1::StreamOpen());
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ah.opens.size(), 3u);
  EXPECT_EQ(p.ch.resets.size(), 1u);
  EXPECT_TRUE(p.client.streamOpen(*d));
}

TEST(SessionLimitsTest, LocalOpenPastTheLimitIsRefusedWithTheSameCode) {
  SessionLimits strict = lax();
  strict.max_streams = 1;
  Pipe p(lax(), strict);
  ASSERT_TRUE(p.agent.openStream(v1::StreamOpen()).ok());
  auto second = p.agent.openStream(v1::StreamOpen());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(errorCodeOf(second.status()), v1::TOO_MANY_STREAMS);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("--max-streams"));
  EXPECT_EQ(p.hits.size(), 1u);
}

TEST(SessionLimitsTest, OneRequestPastThePendingLimitIsAnsweredAndTheSessionGoesOn) {
  SessionLimits strict = lax();
  strict.max_pending_requests = 1;
  Pipe p(lax(), strict);
  auto first = p.client.sendRequest(envRequest());
  auto second = p.client.sendRequest(envRequest());
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ah.requests.size(), 1u);  // the second never reached the handler
  ASSERT_EQ(p.ch.responses.size(), 1u);
  EXPECT_EQ(p.ch.responses[0].request_id(), *second);
  EXPECT_EQ(p.ch.responses[0].error().code(), v1::TOO_MANY_PENDING_REQUESTS);
  EXPECT_EQ(p.ch.responses[0].error().message(),
            "pending request limit of 1 reached (siphon-agent --max-pending-requests raises it)");
  EXPECT_EQ(p.hits.size(), 1u);
  // Answered, the first frees its slot.
  v1::Response r;
  r.set_request_id(*first);
  r.mutable_env();
  p.agent.sendResponse(r);
  ASSERT_TRUE(p.client.sendRequest(envRequest()).ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ah.requests.size(), 2u);
}

TEST(SessionLimitsTest, AFrameAboveTheLimitIsFrameTooLargeNamingTheFlag) {
  SessionLimits strict = lax();
  strict.max_frame_size = 4096;
  Pipe p(lax(), strict);
  v1::Request big = envRequest();
  big.mutable_env()->add_include(std::string(5000, 'i'));
  ASSERT_TRUE(p.client.sendRequest(big).ok());
  absl::Status s = p.toAgent();
  EXPECT_EQ(errorCodeOf(s), v1::FRAME_TOO_LARGE);
  EXPECT_THAT(std::string(s.message()), HasSubstr("above the maximum of 4096"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--max-frame-size"));
  ASSERT_EQ(p.hits.size(), 1u);
  EXPECT_TRUE(p.ah.requests.empty());
  // The transport says why before it closes (session_transport.cc).
  p.agent.sendGoaway(errorCodeOf(s), sv(s.message()));
  auto frames = bytesOf(p.agent.takeWrites());
  FrameDecoder dec;
  dec.feed(frames);
  auto f = dec.next();
  ASSERT_TRUE(f.ok() && f->has_value());
  EXPECT_EQ((*f)->frame.goaway().code(), v1::FRAME_TOO_LARGE);
}

// ------------------------------------------------------------ buffered bytes

SessionLimits smallBuffer() {
  SessionLimits l = lax();
  l.max_frame_size = 16 * 1024;
  l.max_read_size = l.max_frame_size - kReadSizeHeadroom;
  l.replay_buffer_bytes = 64 * 1024;  // answers may take 128 KiB
  return l;
}

TEST(SessionLimitsTest, ReadsReserveRoomAndAreShortenedThenRefusedWhenTheBufferIsFull) {
  Pipe p(lax(), smallBuffer());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(*p.client.sendRequest(envRequest()));
  ASSERT_TRUE(p.toAgent().ok());
  ASSERT_EQ(p.ah.requests.size(), 12u);
  // Each read asks for 15 KiB; 128 KiB hold 8 of them and a short ninth.
  uint64_t granted = 0;
  size_t i = 0;
  for (; i < ids.size(); ++i) {
    auto room = p.agent.reserveResponse(ids[i], 15 * 1024);
    if (!room.ok()) break;
    EXPECT_GT(*room, 0u);
    granted += *room;
  }
  EXPECT_EQ(i, 9u);
  EXPECT_EQ(granted, 128u * 1024);
  EXPECT_EQ(p.agent.bufferedBytes(), 128u * 1024);
  auto refused = p.agent.reserveResponse(ids[9], 15 * 1024);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(errorCodeOf(refused.status()), v1::SESSION_BUFFER_FULL);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("session buffer limit of 65536 bytes (siphon-agent --max-session-buffer"));
  EXPECT_FALSE(p.hits.empty());

  // The reserved answers go out whole; once the client has read and acked
  // them there is room again.
  for (size_t k = 0; k < 9; ++k) {
    v1::Response r;
    r.set_request_id(ids[k]);
    r.mutable_env()->add_vars()->set_value(std::string(10 * 1024, 'd'));
    p.agent.sendResponse(r);
  }
  for (size_t k = 9; k < ids.size(); ++k) {
    v1::Response r;
    r.set_request_id(ids[k]);
    r.mutable_env();
    p.agent.sendResponse(r);
  }
  ASSERT_TRUE(p.toClient().ok());
  EXPECT_EQ(p.ch.responses.size(), 12u);
  for (size_t k = 0; k < 9; ++k) EXPECT_FALSE(p.ch.responses[k].has_error()) << k;
  // The client's ack reaches the agent with its next request.
  auto next = p.client.sendRequest(envRequest());
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE(p.toAgent().ok());
  EXPECT_LT(p.agent.bufferedBytes(), 4096u);
  auto room = p.agent.reserveResponse(*next, 15 * 1024);
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_EQ(*room, 15u * 1024);
}

TEST(SessionLimitsTest, ALargeAnswerWithNoRoomIsReplacedBySessionBufferFull) {
  Pipe p(lax(), smallBuffer());
  std::vector<uint64_t> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(*p.client.sendRequest(envRequest()));
  ASSERT_TRUE(p.toAgent().ok());
  for (uint64_t id : ids) {  // 12 x 12 KiB, no reservations, the client reads nothing
    v1::Response r;
    r.set_request_id(id);
    r.mutable_env()->add_vars()->set_value(std::string(12 * 1024, 'd'));
    p.agent.sendResponse(r);
  }
  EXPECT_LE(p.agent.bufferedBytes(), 128u * 1024);
  ASSERT_TRUE(p.toClient().ok());
  ASSERT_EQ(p.ch.responses.size(), 12u);
  size_t whole = 0, refused = 0;
  for (const auto& r : p.ch.responses) {
    if (!r.has_error()) {
      ++whole;
      continue;
    }
    ++refused;
    EXPECT_EQ(r.error().code(), v1::SESSION_BUFFER_FULL);
    EXPECT_THAT(r.error().message(), HasSubstr("--max-session-buffer"));
  }
  EXPECT_EQ(whole, 10u);  // 10 x 12 KiB and their frame headers fit in 128 KiB
  EXPECT_EQ(refused, 2u);
}

TEST(SessionLimitsTest, AClientThatAsksAndNeverReadsIsCutOffPastTwiceTheBuffer) {
  Pipe p(lax(), smallBuffer());
  p.ah.answer_bytes = 3000;  // small answers: never refused one by one
  absl::Status cut;
  int sent = 0;
  // The client sends; the agent's answers are never read (nor acked). 44
  // answers of 3 KB fill 128 KiB, well within the 100 pending requests.
  for (; sent < 100 && cut.ok(); ++sent) {
    ASSERT_TRUE(p.client.sendRequest(envRequest()).ok());
    cut = p.toAgent();
  }
  EXPECT_EQ(errorCodeOf(cut), v1::SESSION_BUFFER_FULL) << cut;
  EXPECT_THAT(std::string(cut.message()), HasSubstr("reads no answers"));
  EXPECT_THAT(std::string(cut.message()), HasSubstr("--max-session-buffer"));
  // Bounded: at most one small answer above twice the buffer.
  EXPECT_LE(p.agent.bufferedBytes(), 128u * 1024 + kSmallResponse);
  EXPECT_LT(sent, 100);
}

TEST(SessionLimitsTest, PingsFromAPeerThatReadsNothingKeepOnePong) {
  Pipe p(lax(), lax());
  std::string pings;
  for (uint64_t n = 1; n <= 1000; ++n) {
    v1::Frame ping;
    ping.mutable_ping()->set_nonce(n);
    pings += encodeFrame(ping);
  }
  ASSERT_TRUE(p.agent.onBytes(pings, p.ah, kT0).ok());
  WriteBatch batch = p.agent.takeWrites();
  ASSERT_EQ(batch.frames.size(), 1u);
  FrameDecoder dec;
  dec.feed(bytesOf(batch));
  auto f = dec.next();
  ASSERT_TRUE(f.ok() && f->has_value());
  EXPECT_EQ((*f)->frame.pong().nonce(), 1000u);
  // After the write, the next ping gets its own pong.
  v1::Frame ping;
  ping.mutable_ping()->set_nonce(1001);
  ASSERT_TRUE(p.agent.onBytes(encodeFrame(ping), p.ah, kT0).ok());
  EXPECT_EQ(p.agent.takeWrites().frames.size(), 1u);
}

// ------------------------------------------------------------ keepalive

// The ticker of a transport: waits until nextTick(), calls onTick() and
// writes what is queued when `reads` (the peer reads), over `period` of
// logical time. Returns the pings that went out; fails the test if the
// session asks to be woken at or before the time it was just called (a
// spinning event loop).
int tickFor(Session& s, std::chrono::milliseconds period, bool writes) {
  TimePoint t = kT0;
  int pings = 0;
  int turns = 0;
  while (t < kT0 + period) {
    EXPECT_TRUE(s.onTick(t).ok());
    if (writes) {
      FrameDecoder dec;
      dec.feed(bytesOf(s.takeWrites()));
      for (auto f = dec.next(); f.ok() && f->has_value(); f = dec.next()) {
        if ((*f)->frame.has_ping()) ++pings;
      }
    }
    const TimePoint next = s.nextTick();
    EXPECT_GT(next, t) << "the ticker would spin at turn " << turns;
    if (next <= t) break;
    t = next;
    if (++turns > 1000000) break;
  }
  return pings;
}

// A Hello asking for a 1 ms keepalive gets the floor: over 10 s of the
// session's clock the agent pings at most once per kMinKeepaliveInterval,
// not once per millisecond.
TEST(KeepaliveTest, AOneMillisecondAskPingsAtTheFloorAndDoesNotSpin) {
  v1::Limits asked;
  asked.set_keepalive_interval_ms(1);
  SessionLimits l = negotiateLimits(asked, SessionLimits());
  // The silent peer is not lost within the period: only pings are counted.
  l.keepalive_timeout = std::chrono::hours(1);
  Session agent(Role::kAgent, l, kT0);
  const auto period = std::chrono::seconds(10);
  const int pings = tickFor(agent, period, /*writes=*/true);
  EXPECT_LE(pings, period / kMinKeepaliveInterval);
  EXPECT_GE(pings, period / kMinKeepaliveInterval - 1);
}

// A peer that reads nothing: the ping that has not gone out stands for the
// next ones (one outstanding per interval, none queued per turn).
TEST(KeepaliveTest, APingThatHasNotGoneOutIsNotFollowedByAnother) {
  SessionLimits l;
  l.keepalive_interval = kMinKeepaliveInterval;
  l.keepalive_timeout = std::chrono::hours(1);
  Session agent(Role::kAgent, l, kT0);
  tickFor(agent, std::chrono::minutes(10), /*writes=*/false);
  EXPECT_EQ(agent.pingsSent(), 1u);
  EXPECT_EQ(agent.queuedControlFrames(), 1u);
  // Once it is written, the next interval brings the next one.
  WriteBatch batch = agent.takeWrites();
  EXPECT_EQ(batch.frames.size(), 1u);
  EXPECT_TRUE(agent.onTick(kT0 + std::chrono::minutes(10) + kMinKeepaliveInterval).ok());
  EXPECT_EQ(agent.pingsSent(), 2u);
}

// ------------------------------------------------------ control frames

// A peer that never reads and keeps pinging and sending window updates
// (sequenced, so each batch owes it an ack) cannot grow what the agent
// queues for it: one ack, one ping and one pong at most, and they count in
// bufferedBytes() (the --max-session-buffer accounting).
TEST(SessionLimitsTest, APeerThatNeverReadsCannotGrowTheControlQueue) {
  SessionLimits l = lax();
  l.max_frame_size = 4096;
  l.replay_buffer_bytes = 8192;  // an ack is due every 2 KiB received
  l.keepalive_interval = kMinKeepaliveInterval;
  Pipe p(lax(), l);
  // The agent opens a stream (stolen, say) that the client grants credit to.
  v1::StreamOpen open;
  open.mutable_outgoing()->set_port(80);
  auto id = p.agent.openStream(open);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(p.toClient().ok());
  ASSERT_TRUE(p.toAgent().ok());
  TimePoint t = kT0;
  uint64_t most = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string bytes;
    for (int i = 0; i < 50; ++i) {
      v1::Frame update;
      update.mutable_window_update()->set_stream_id(*id);
      update.mutable_window_update()->set_increment(1);
      bytes += encodeFrame(update);
    }
    v1::Frame ping;
    ping.mutable_ping()->set_nonce(round + 1);
    bytes += encodeFrame(ping);
    t += std::chrono::milliseconds(50);
    absl::Status s = p.agent.onBytes(bytes, p.ah, t);
    ASSERT_TRUE(s.ok() || errorCodeOf(s) == v1::SESSION_BUFFER_FULL) << s;
    ASSERT_TRUE(p.agent.onTick(t).ok());
    most = std::max<uint64_t>(most, p.agent.queuedControlFrames());
    EXPECT_LE(p.agent.bufferedBytes(), 2 * l.replay_buffer_bytes);
    if (!s.ok()) break;
  }
  EXPECT_LE(most, 3u);  // an ack, a ping, a pong
  EXPECT_GT(p.agent.queuedControlBytes(), 0u);
  EXPECT_EQ(p.agent.bufferedBytes(), p.agent.unackedBytes() + p.agent.queuedControlBytes());
  // What is queued still says everything: the latest ack and pong.
  FrameDecoder dec;
  dec.feed(bytesOf(p.agent.takeWrites()));
  uint64_t acked = 0, ponged = 0;
  for (auto f = dec.next(); f.ok() && f->has_value(); f = dec.next()) {
    if ((*f)->frame.has_ack()) acked = (*f)->frame.ack().received();
    if ((*f)->frame.has_pong()) ponged = (*f)->frame.pong().nonce();
  }
  EXPECT_EQ(acked, p.agent.receivedCount());
  EXPECT_EQ(ponged, 2000u);
}

}  // namespace
}  // namespace siphon::protocol
