// Session: two Session objects (client and agent) joined by a test pipe that
// moves takeWrites() bytes into the other's onBytes(). Requests, streams,
// flow control, limits, keepalive and the protocol errors a peer can cause.
//
// Over 600 lines: one state machine's cases sharing the session pair below.
#include "siphon/protocol/session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "siphon/protocol/codec.h"
#include "siphon/status.h"
#include "tests/fakes/piped_bytes.h"

namespace siphon::protocol {
namespace {

using std::chrono::milliseconds;

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

// Records every callback; optionally answers like an application would.
class Recorder : public SessionHandler {
 public:
  Session* session = nullptr;
  bool accept_opens = false;   // acceptStream() on every open
  uint32_t accept_window = 0;  // 0: the session's default
  bool consume_all = false;    // consumed() every byte at once
  std::set<uint64_t> consume;  // ... or only on these streams

  std::vector<std::string> log;  // every event in order, for ordering checks
  std::vector<v1::Request> requests;
  std::vector<v1::Response> responses;
  std::vector<v1::StreamOpen> opens;
  std::vector<v1::StreamAccept> accepts;
  std::map<uint64_t, std::string> data;
  std::vector<uint64_t> half_closes;
  std::vector<std::pair<uint64_t, v1::Error>> resets;
  std::vector<uint64_t> writable;
  std::vector<v1::StreamDatagram> datagrams;
  std::vector<v1::StreamGap> gaps;
  std::vector<v1::Draining> drainings;
  std::vector<v1::TargetRestarted> restarts;
  std::vector<v1::Goaway> goaways;

  void onRequest(v1::Request r) override {
    log.push_back("request " + std::to_string(r.request_id()));
    requests.push_back(std::move(r));
  }
  void onResponse(v1::Response r) override {
    log.push_back("response " + std::to_string(r.request_id()));
    responses.push_back(std::move(r));
  }
  void onStreamOpen(v1::StreamOpen open) override {
    log.push_back("open " + std::to_string(open.stream_id()));
    opens.push_back(open);
    if (accept_opens) {
      v1::StreamAccept a;
      a.set_stream_id(open.stream_id());
      a.set_initial_window(accept_window);
      EXPECT_TRUE(session->acceptStream(a).ok());
    }
  }
  void onStreamAccept(v1::StreamAccept a) override {
    log.push_back("accept " + std::to_string(a.stream_id()));
    accepts.push_back(std::move(a));
  }
  void onStreamData(uint64_t id, std::string_view payload) override {
    log.push_back("data " + std::to_string(id) + " " + std::string(payload.substr(0, 16)));
    data[id].append(payload);
    if (consume_all || consume.contains(id)) session->consumed(id, payload.size());
  }
  void onStreamDatagram(v1::StreamDatagram d) override {
    log.push_back("datagram " + std::to_string(d.stream_id()));
    datagrams.push_back(std::move(d));
  }
  void onStreamHalfClose(uint64_t id) override {
    log.push_back("half_close " + std::to_string(id));
    half_closes.push_back(id);
  }
  void onStreamReset(uint64_t id, v1::Error e) override {
    log.push_back("reset " + std::to_string(id));
    resets.emplace_back(id, std::move(e));
  }
  void onStreamGap(v1::StreamGap g) override {
    log.push_back("gap " + std::to_string(g.stream_id()) + " " + std::to_string(g.bytes()));
    gaps.push_back(std::move(g));
  }
  void onStreamWritable(uint64_t id) override {
    log.push_back("writable " + std::to_string(id));
    writable.push_back(id);
  }
  void onDraining(v1::Draining d) override { drainings.push_back(std::move(d)); }
  void onTargetRestarted(v1::TargetRestarted r) override { restarts.push_back(std::move(r)); }
  void onGoaway(v1::Goaway g) override { goaways.push_back(std::move(g)); }
};

std::string bytesOf(const WriteBatch& batch) {
  std::string out;
  for (std::string_view b : batch.buffers()) out.append(b);
  return out;
}

// The frames in a batch, decoded (payloads copied).
struct Frame {
  bool is_data;
  uint64_t stream_id;
  std::string payload;
  v1::Frame frame;
  size_t wire_size;
};
std::vector<Frame> framesOf(const WriteBatch& batch) {
  FrameDecoder dec;
  dec.feed(bytesOf(batch));
  std::vector<Frame> out;
  while (true) {
    auto next = dec.next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    const DecodedFrame& d = **next;
    out.push_back({d.is_data, d.data.stream_id, std::string(d.data.payload), d.frame, d.wire_size});
  }
  return out;
}

SessionLimits smallLimits() {
  SessionLimits l;
  l.initial_stream_window = 4096;
  l.max_stream_window = 0;  // fixed windows, unless a test grows them
  l.keepalive_interval = milliseconds(1000);
  l.keepalive_timeout = milliseconds(3000);
  return l;
}

class Pipe {
 public:
  explicit Pipe(SessionLimits client_limits = smallLimits()) : Pipe(client_limits, client_limits) {}
  Pipe(SessionLimits client_limits, SessionLimits agent_limits)
      : client(Role::kClient, client_limits, kT0), agent(Role::kAgent, agent_limits, kT0) {
    ch.session = &client;
    ah.session = &agent;
  }

  // One batch from `from` into `to`.
  absl::Status step(Session& from, Session& to, Recorder& h) {
    WriteBatch batch = from.takeWrites();
    if (batch.empty()) return absl::OkStatus();
    return to.onBytes(bytesOf(batch), h, now);
  }
  absl::Status toAgent() { return step(client, agent, ah); }
  absl::Status toClient() { return step(agent, client, ch); }

  // Moves bytes both ways until neither side has anything to write.
  absl::Status pump() {
    for (int i = 0; i < 100000; ++i) {
      if (!client.hasWrites() && !agent.hasWrites()) return absl::OkStatus();
      RETURN_IF_ERROR(toAgent());
      RETURN_IF_ERROR(toClient());
    }
    return absl::InternalError("the pipe never settles");
  }
  // pump(), then time passes until the acks held back (kAckDelay) are out.
  absl::Status settle() {
    for (int i = 0; i < 100000; ++i) {
      RETURN_IF_ERROR(pump());
      if (client.nextTick() > now + kAckDelay && agent.nextTick() > now + kAckDelay) {
        return absl::OkStatus();
      }
      now += kAckDelay;
      RETURN_IF_ERROR(client.onTick(now));
      RETURN_IF_ERROR(agent.onTick(now));
      RETURN_IF_ERROR(toAgent());
      RETURN_IF_ERROR(toClient());
    }
    return absl::InternalError("the pipe never settles");
  }

  // A stream opened by `opener` and accepted by the other side.
  uint64_t openAccepted(bool by_client = true, uint32_t window = 0, uint32_t accept_window = 0) {
    Session& opener = by_client ? client : agent;
    Recorder& acceptor = by_client ? ah : ch;
    acceptor.accept_opens = true;
    acceptor.accept_window = accept_window;
    v1::StreamOpen open;
    open.set_initial_window(window);
    open.mutable_outgoing()->set_port(80);
    auto id = opener.openStream(open);
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(settle().ok());
    acceptor.accept_opens = false;
    return id.value_or(0);
  }

  Session client;
  Session agent;
  Recorder ch;  // what the client's handler saw
  Recorder ah;  // what the agent's handler saw
  TimePoint now = kT0;
};

v1::Request envRequest(std::string tag) {
  v1::Request r;
  r.mutable_env()->add_include(std::move(tag));
  return r;
}

v1::Response envResponse(uint64_t id, std::string tag) {
  v1::Response r;
  r.set_request_id(id);
  r.mutable_env()->add_vars()->set_name(std::move(tag));
  return r;
}

v1::Error errorWith(v1::ErrorCode code) {
  v1::Error e;
  e.set_code(code);
  return e;
}

// ------------------------------------------------------------ requests

TEST(SessionTest, RequestsAndResponsesBothWays) {
  Pipe p;
  auto r1 = p.client.sendRequest(envRequest("A"));
  auto r2 = p.client.sendRequest(envRequest("B"));
  auto a1 = p.agent.sendRequest(envRequest("C"));
  ASSERT_TRUE(r1.ok() && r2.ok() && a1.ok());
  EXPECT_EQ(*r1, 1u);
  EXPECT_EQ(*r2, 2u);
  EXPECT_EQ(*a1, 1u);  // ids are per side
  EXPECT_EQ(p.client.pendingRequestIds(), (std::vector<uint64_t>{1, 2}));
  ASSERT_TRUE(p.pump().ok());

  ASSERT_EQ(p.ah.requests.size(), 2u);
  EXPECT_EQ(p.ah.requests[0].request_id(), 1u);
  EXPECT_EQ(p.ah.requests[0].env().include(0), "A");
  EXPECT_EQ(p.ah.requests[1].env().include(0), "B");
  ASSERT_EQ(p.ch.requests.size(), 1u);
  EXPECT_EQ(p.ch.requests[0].env().include(0), "C");

  // Answers in any order.
  p.agent.sendResponse(envResponse(2, "b"));
  p.agent.sendResponse(envResponse(1, "a"));
  p.client.sendResponse(envResponse(1, "c"));
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ch.responses.size(), 2u);
  EXPECT_EQ(p.ch.responses[0].request_id(), 2u);
  EXPECT_EQ(p.ch.responses[0].env().vars(0).name(), "b");
  EXPECT_EQ(p.ch.responses[1].request_id(), 1u);
  ASSERT_EQ(p.ah.responses.size(), 1u);
  EXPECT_EQ(p.client.pendingRequests(), 0u);
  EXPECT_EQ(p.agent.pendingRequests(), 0u);
  EXPECT_EQ(p.client.pendingRequestIds(), std::vector<uint64_t>{});
}

TEST(SessionTest, PendingRequestLimit) {
  SessionLimits l = smallLimits();
  l.max_pending_requests = 2;
  Pipe p(l);
  ASSERT_TRUE(p.client.sendRequest(envRequest("1")).ok());
  ASSERT_TRUE(p.client.sendRequest(envRequest("2")).ok());
  auto third = p.client.sendRequest(envRequest("3"));
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(errorCodeOf(third.status()), v1::TOO_MANY_PENDING_REQUESTS);
  EXPECT_EQ(p.client.pendingRequestIds(), (std::vector<uint64_t>{1, 2}));

  ASSERT_TRUE(p.pump().ok());
  p.agent.sendResponse(envResponse(2, "two"));
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.client.pendingRequestIds(), std::vector<uint64_t>{1});
  auto again = p.client.sendRequest(envRequest("3"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 3u);
}

TEST(SessionTest, PeerPastThePendingRequestLimitIsAnsweredTooManyPendingRequests) {
  SessionLimits lax = smallLimits();
  lax.max_pending_requests = 10;
  SessionLimits strict = smallLimits();
  strict.max_pending_requests = 1;
  Pipe p(lax, strict);
  ASSERT_TRUE(p.client.sendRequest(envRequest("1")).ok());
  ASSERT_TRUE(p.client.sendRequest(envRequest("2")).ok());
  ASSERT_TRUE(p.pump().ok());
  // The agent's handler saw only the first; the second was answered for it.
  ASSERT_EQ(p.ah.requests.size(), 1u);
  EXPECT_EQ(p.ah.requests[0].request_id(), 1u);
  ASSERT_EQ(p.ch.responses.size(), 1u);
  EXPECT_EQ(p.ch.responses[0].request_id(), 2u);
  EXPECT_EQ(p.ch.responses[0].error().code(), v1::TOO_MANY_PENDING_REQUESTS);
  EXPECT_EQ(p.client.pendingRequestIds(), std::vector<uint64_t>{1});
  // Once the first is answered there is room again.
  p.agent.sendResponse(envResponse(1, "one"));
  ASSERT_TRUE(p.client.sendRequest(envRequest("3")).ok());
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ah.requests.size(), 2u);
  EXPECT_EQ(p.ah.requests[1].request_id(), 3u);
}

// ------------------------------------------------------------ streams

TEST(SessionTest, StreamIdsFollowTheRoleParity) {
  Pipe p;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(p.client.openStream(v1::StreamOpen()).ok());
    ASSERT_TRUE(p.agent.openStream(v1::StreamOpen()).ok());
  }
  EXPECT_EQ(p.client.streamIds(), (std::vector<uint64_t>{1, 3, 5}));
  EXPECT_EQ(p.agent.streamIds(), (std::vector<uint64_t>{2, 4, 6}));
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ah.opens.size(), 3u);
  EXPECT_EQ(p.ah.opens[2].stream_id(), 5u);
  // A zero window in the open means the session's default.
  EXPECT_EQ(p.ah.opens[0].initial_window(), smallLimits().initial_stream_window);
  ASSERT_EQ(p.ch.opens.size(), 3u);
  EXPECT_EQ(p.ch.opens[0].stream_id(), 2u);
  EXPECT_EQ(p.client.streamIds(), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.agent.streamCount(), 6u);
}

TEST(SessionTest, AcceptGrantsTheWindowsBothWays) {
  Pipe p;
  uint64_t id = p.openAccepted(/*by_client=*/true, /*window=*/5000, /*accept_window=*/7000);
  ASSERT_EQ(p.ch.accepts.size(), 1u);
  EXPECT_EQ(p.ch.accepts[0].stream_id(), id);
  EXPECT_EQ(p.agent.sendCredit(id), 5000u);   // what the client granted
  EXPECT_EQ(p.client.sendCredit(id), 7000u);  // what the agent granted
}

TEST(SessionTest, AcceptRules) {
  Pipe p;
  auto mine = p.client.openStream(v1::StreamOpen());
  ASSERT_TRUE(mine.ok());
  // Before the accept there is no credit; sending is a flow-control error.
  EXPECT_EQ(p.client.sendCredit(*mine), 0u);
  EXPECT_EQ(errorCodeOf(p.client.sendData(*mine, "x")), v1::FLOW_CONTROL_ERROR);
  ASSERT_TRUE(p.pump().ok());

  v1::StreamAccept a;
  a.set_stream_id(99);
  EXPECT_EQ(errorCodeOf(p.agent.acceptStream(a)), v1::STREAM_CLOSED);  // unknown
  a.set_stream_id(*mine);
  EXPECT_EQ(errorCodeOf(p.client.acceptStream(a)), v1::STREAM_CLOSED);  // our own
  EXPECT_TRUE(p.agent.acceptStream(a).ok());
  EXPECT_EQ(errorCodeOf(p.agent.acceptStream(a)), v1::STREAM_CLOSED);  // twice
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.accepts.size(), 1u);
  EXPECT_GT(p.client.sendCredit(*mine), 0u);
}

// ------------------------------------------------- early data (1.2)

// A Pipe whose agent sends on the streams it opens before the client's
// accept, and whose client takes that (protocol 1.2).
v1::StreamOpen stolenOpen() {
  v1::StreamOpen open;
  open.mutable_stolen()->set_subscription_id(1);
  return open;
}

TEST(SessionTest, EarlyDataGoesWithTheOpenAndCountsTowardTheAcceptersWindow) {
  Pipe p;  // windows of 4096
  p.agent.allowEarlyData(/*send=*/true, /*receive=*/false);
  p.client.allowEarlyData(/*send=*/false, /*receive=*/true);
  auto id = p.agent.openStream(stolenOpen());
  ASSERT_TRUE(id.ok()) << id.status();
  // No accept yet: the initial window may go at once, data and half-close.
  EXPECT_EQ(p.agent.sendCredit(*id), 4096u);
  ASSERT_TRUE(p.agent.sendData(*id, "GET / HTTP/1.1\r\n\r\n").ok());
  ASSERT_TRUE(p.agent.halfClose(*id).ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.log, (std::vector<std::string>{"open 2", "data 2 GET / HTTP/1.1\r\n",
                                                 "half_close 2"}));
  EXPECT_TRUE(p.ch.accepts.empty() && p.ah.accepts.empty());

  // The accept (default window) grants nothing beyond what went early.
  v1::StreamAccept a;
  a.set_stream_id(*id);
  ASSERT_TRUE(p.client.acceptStream(a).ok());
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ah.accepts.size(), 1u);
  EXPECT_TRUE(p.client.streamOpen(*id));
  ASSERT_TRUE(p.client.sendData(*id, "HTTP/1.1 200 OK\r\n\r\n").ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ah.data[*id], "HTTP/1.1 200 OK\r\n\r\n");
}

TEST(SessionTest, EarlyCreditIsTheInitialWindowAndTheAcceptAddsTheRest) {
  Pipe p;  // windows of 4096
  p.agent.allowEarlyData(true, false);
  p.client.allowEarlyData(false, true);
  auto id = p.agent.openStream(stolenOpen());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(p.agent.sendData(*id, std::string(4000, 'a')).ok());
  EXPECT_EQ(p.agent.sendCredit(*id), 96u);
  EXPECT_EQ(errorCodeOf(p.agent.sendData(*id, std::string(97, 'b'))), v1::FLOW_CONTROL_ERROR);
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.data[*id].size(), 4000u);

  // The client accepts with a window of 10000: 5904 more for the agent.
  v1::StreamAccept a;
  a.set_stream_id(*id);
  a.set_initial_window(10000);
  ASSERT_TRUE(p.client.acceptStream(a).ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.agent.sendCredit(*id), 96u + 5904u);
  // What the client consumed returns as usual.
  p.client.consumed(*id, 4000);
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.agent.sendCredit(*id), 10000u);

  // A client that accepts with less than the early credit still grants it.
  auto id2 = p.agent.openStream(stolenOpen());
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE(p.pump().ok());
  a.set_stream_id(*id2);
  a.set_initial_window(100);
  ASSERT_TRUE(p.client.acceptStream(a).ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.agent.sendCredit(*id2), 4096u);
}

TEST(SessionTest, EarlyDataBeyondTheInitialWindowIsAFlowControlError) {
  Pipe p;
  p.client.allowEarlyData(false, true);
  auto id = p.agent.openStream(stolenOpen());  // the agent itself sends no early data
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(p.agent.sendCredit(*id), 0u);
  ASSERT_TRUE(p.pump().ok());
  ASSERT_TRUE(p.client.onBytes(encodeDataFrame(*id, std::string(4096, 'a')), p.ch, p.now).ok());
  auto st = p.client.onBytes(encodeDataFrame(*id, "b"), p.ch, p.now);
  EXPECT_EQ(errorCodeOf(st), v1::FLOW_CONTROL_ERROR) << st;
}

// A peer of 1.1 takes no data before its accept: without allowEarlyData
// the same frame is refused, and nothing is sent early.
TEST(SessionTest, WithoutEarlyDataNothingMovesBeforeTheAccept) {
  Pipe p;
  auto id = p.agent.openStream(stolenOpen());
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(p.agent.sendCredit(*id), 0u);
  EXPECT_EQ(errorCodeOf(p.agent.sendData(*id, "x")), v1::FLOW_CONTROL_ERROR);
  ASSERT_TRUE(p.pump().ok());
  auto st = p.client.onBytes(encodeDataFrame(*id, "x"), p.ch, p.now);
  EXPECT_EQ(errorCodeOf(st), v1::FLOW_CONTROL_ERROR) << st;
}

TEST(SessionTest, DataAndHalfCloseBothWays) {
  Pipe p;
  uint64_t id = p.openAccepted();
  ASSERT_TRUE(p.client.sendData(id, "hello agent").ok());
  ASSERT_TRUE(p.client.halfClose(id).ok());
  // Our direction is done; the other stays open.
  EXPECT_EQ(errorCodeOf(p.client.sendData(id, "late")), v1::STREAM_CLOSED);
  EXPECT_EQ(errorCodeOf(p.client.halfClose(id)), v1::STREAM_CLOSED);
  EXPECT_EQ(p.client.sendCredit(id), 0u);
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ah.data[id], "hello agent");
  EXPECT_EQ(p.ah.half_closes, std::vector<uint64_t>{id});
  // Data came before the half-close, in that order.
  EXPECT_EQ(p.ah.log, (std::vector<std::string>{"open 1", "data 1 hello agent", "half_close 1"}));

  ASSERT_TRUE(p.agent.sendData(id, "hello client").ok());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.data[id], "hello client");
  EXPECT_TRUE(p.client.streamOpen(id));
  EXPECT_TRUE(p.agent.streamOpen(id));

  ASSERT_TRUE(p.agent.halfClose(id).ok());
  EXPECT_FALSE(p.agent.streamOpen(id));  // closed both ways: gone
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.half_closes, std::vector<uint64_t>{id});
  EXPECT_FALSE(p.client.streamOpen(id));
  EXPECT_EQ(p.client.streamCount(), 0u);
  EXPECT_EQ(p.agent.streamCount(), 0u);
  EXPECT_EQ(errorCodeOf(p.agent.sendData(id, "x")), v1::STREAM_CLOSED);
  EXPECT_TRUE(p.ch.resets.empty());
  EXPECT_TRUE(p.ah.resets.empty());
}

TEST(SessionTest, ResetEndsBothWaysAndDropsDataInFlight) {
  Pipe p;
  uint64_t id = p.openAccepted(/*by_client=*/false);
  EXPECT_EQ(id % 2, 0u);
  ASSERT_TRUE(p.agent.sendData(id, "in flight").ok());
  // The client resets before the data arrives.
  p.client.resetStream(id, errorWith(v1::CANCELLED));
  EXPECT_FALSE(p.client.streamOpen(id));
  ASSERT_TRUE(p.pump().ok());
  EXPECT_FALSE(p.ch.data.contains(id));  // dropped quietly, no error
  ASSERT_EQ(p.ah.resets.size(), 1u);
  EXPECT_EQ(p.ah.resets[0].first, id);
  EXPECT_EQ(p.ah.resets[0].second.code(), v1::CANCELLED);
  EXPECT_FALSE(p.agent.streamOpen(id));
  EXPECT_EQ(errorCodeOf(p.agent.sendData(id, "x")), v1::STREAM_CLOSED);
  // Resetting again (or an unknown stream) sends nothing.
  uint64_t before = p.client.sentCount();
  p.client.resetStream(id, errorWith(v1::CANCELLED));
  EXPECT_EQ(p.client.sentCount(), before);
  EXPECT_FALSE(p.client.hasWrites());
}

TEST(SessionTest, DatagramsGapsDrainingGoaway) {
  Pipe p;
  uint64_t id = p.openAccepted();
  v1::StreamDatagram d;
  d.set_stream_id(id);
  d.set_payload("udp");
  d.mutable_peer()->set_ip("10.1.2.3");
  ASSERT_TRUE(p.client.sendDatagram(d).ok());
  d.set_payload(std::string(5000, 'x'));  // beyond the 4096 credit
  EXPECT_EQ(errorCodeOf(p.client.sendDatagram(d)), v1::FLOW_CONTROL_ERROR);
  d.set_stream_id(77);
  EXPECT_EQ(errorCodeOf(p.client.sendDatagram(d)), v1::STREAM_CLOSED);

  v1::StreamGap gap;
  gap.set_stream_id(id);
  gap.set_bytes(1400);
  gap.set_direction(v1::CLIENT_TO_SERVER);
  ASSERT_TRUE(p.agent.sendGap(gap).ok());
  gap.set_stream_id(77);
  EXPECT_EQ(errorCodeOf(p.agent.sendGap(gap)), v1::STREAM_CLOSED);

  v1::Draining dr;
  dr.set_deadline_unix_ms(123);
  p.agent.sendDraining(dr);
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ah.datagrams.size(), 1u);
  EXPECT_EQ(p.ah.datagrams[0].payload(), "udp");
  EXPECT_EQ(p.ah.datagrams[0].peer().ip(), "10.1.2.3");
  ASSERT_EQ(p.ch.gaps.size(), 1u);
  EXPECT_EQ(p.ch.gaps[0].bytes(), 1400u);
  ASSERT_EQ(p.ch.drainings.size(), 1u);
  EXPECT_EQ(p.ch.drainings[0].deadline_unix_ms(), 123);

  // TargetRestarted (1.1) is sequenced, as every notice from the agent.
  const uint64_t before = p.client.receivedCount();
  v1::TargetRestarted restarted;
  restarted.mutable_target()->set_pid(4301);
  restarted.set_previous_pid(4242);
  p.agent.sendTargetRestarted(restarted);
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ch.restarts.size(), 1u);
  EXPECT_EQ(p.ch.restarts[0].target().pid(), 4301);
  EXPECT_EQ(p.ch.restarts[0].previous_pid(), 4242);
  EXPECT_EQ(p.client.receivedCount(), before + 1);

  // Goaway is a control frame: it takes no sequence number.
  uint64_t received = p.client.receivedCount();
  p.agent.sendGoaway(v1::PROTOCOL_ERROR, "bye");
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ch.goaways.size(), 1u);
  EXPECT_EQ(p.ch.goaways[0].code(), v1::PROTOCOL_ERROR);
  EXPECT_EQ(p.ch.goaways[0].message(), "bye");
  EXPECT_EQ(p.client.receivedCount(), received);
}

TEST(SessionTest, SequencedFramesAreCountedAndAcked) {
  Pipe p;
  uint64_t id = p.openAccepted();
  ASSERT_TRUE(p.client.sendData(id, "a").ok());
  ASSERT_TRUE(p.client.sendRequest(envRequest("x")).ok());
  EXPECT_GT(p.client.unackedBytes(), 0u);
  ASSERT_TRUE(p.settle().ok());
  // open, data, request from the client; accept from the agent.
  EXPECT_EQ(p.client.sentCount(), 3u);
  EXPECT_EQ(p.agent.receivedCount(), 3u);
  EXPECT_EQ(p.agent.sentCount(), 1u);
  EXPECT_EQ(p.client.receivedCount(), 1u);
  EXPECT_EQ(p.client.unackedBytes(), 0u);
  EXPECT_EQ(p.agent.unackedBytes(), 0u);
}

TEST(SessionTest, LargeDataIsCutIntoFramesWithinTheMaximum) {
  SessionLimits l = smallLimits();
  l.max_frame_size = 4096;
  l.initial_stream_window = 100000;
  Pipe p(l);
  uint64_t id = p.openAccepted();
  std::string payload(10000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>('a' + i % 26);
  ASSERT_TRUE(p.client.sendData(id, payload).ok());
  WriteBatch batch = p.client.takeWrites();
  std::vector<Frame> frames = framesOf(batch);
  ASSERT_EQ(frames.size(), 3u);
  for (const Frame& f : frames) {
    EXPECT_TRUE(f.is_data);
    EXPECT_LE(f.wire_size, kLengthPrefixSize + 4096);
  }
  // The agent's decoder (max 4096) takes them all.
  ASSERT_TRUE(p.agent.onBytes(bytesOf(batch), p.ah, p.now).ok());
  EXPECT_EQ(p.ah.data[id], payload);
}

TEST(SessionTest, WriteBatchesAndTheirBuffers) {
  Pipe p;
  uint64_t id = p.openAccepted();
  ASSERT_TRUE(p.client.sendData(id, "payload").ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.client.sendRequest(envRequest("r")).ok());
  // At least one frame, even when it is above max_bytes.
  WriteBatch one = p.client.takeWrites(1);
  ASSERT_EQ(one.frames.size(), 1u);
  // A data frame is two buffers: the hand-written header and the payload.
  std::vector<std::string_view> bufs = one.buffers();
  ASSERT_EQ(bufs.size(), 2u);
  EXPECT_EQ(bufs[1], "payload");
  EXPECT_EQ(bufs[1].data(), one.frames[0]->payload.data());  // not copied
  EXPECT_EQ(bufs[0].size() + bufs[1].size(), one.bytes);
  WriteBatch rest = p.client.takeWrites();
  EXPECT_EQ(rest.frames.size(), 4u);
  EXPECT_EQ(bytesOf(rest).size(), rest.bytes);
  EXPECT_FALSE(p.client.hasWrites());
  ASSERT_TRUE(p.agent.onBytes(bytesOf(one) + bytesOf(rest), p.ah, p.now).ok());
  EXPECT_EQ(p.ah.data[id], "payload");
  EXPECT_EQ(p.ah.requests.size(), 4u);
}

TEST(SessionTest, AFileReadAnswerGoesAsTwoBuffersWithoutACopy) {
  Pipe p;
  ASSERT_TRUE(p.client.sendRequest(envRequest("read")).ok());
  ASSERT_TRUE(p.toAgent().ok());
  ASSERT_EQ(p.ah.requests.size(), 1u);
  for (size_t size : {kDetachedDataMin - 1, kDetachedDataMin, size_t{300000}}) {
    SCOPED_TRACE(size);
    std::string data(size, 'f');
    data[size / 2] = 'x';
    const std::string want = data;
    const char* at = data.data();
    v1::Response r;
    r.set_request_id(p.ah.requests[0].request_id());
    r.mutable_file()->mutable_data()->set_data(std::move(data));
    r.mutable_file()->mutable_data()->set_eof(true);
    p.agent.sendResponse(std::move(r));
    WriteBatch b = p.agent.takeWrites();
    ASSERT_FALSE(b.empty());  // the response (after the ack of the request, the first time)
    const OutFrame& frame = *b.frames.back();
    if (size >= kDetachedDataMin) {
      // The bytes are the very buffer the response held.
      EXPECT_EQ(frame.payload.data(), at);
      EXPECT_EQ(frame.payload.size(), size);
    } else {
      EXPECT_TRUE(frame.payload.empty());
    }
    p.ch.responses.clear();
    ASSERT_TRUE(p.client.onBytes(bytesOf(b), p.ch, p.now).ok());
    ASSERT_EQ(p.ch.responses.size(), 1u);
    EXPECT_TRUE(p.ch.responses[0].file().data().data() == want);
    EXPECT_TRUE(p.ch.responses[0].file().data().eof());
  }
}

// A read the agent spliced: its frame holds the pipe (counted in the
// batch, not in the buffers until materialized); the client, having marked
// the request, takes the bytes after the head from a pipe; and after a cut
// the replay is the same frame with the same bytes.
TEST(SessionTest, APipedReadAnswerIsSentFromItsPipeAndReplayedWhole) {
  Pipe p;
  auto id = p.client.sendRequest(envRequest("read"));
  ASSERT_TRUE(id.ok());
  p.client.expectPiped(*id);
  ASSERT_TRUE(p.toAgent().ok());
  std::string data(200000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i % 253);
  v1::Response r;
  r.set_request_id(*id);
  r.mutable_file()->mutable_data()->set_eof(true);
  p.agent.sendResponse(std::move(r), fakes::pipeHolding(data));
  WriteBatch b = p.agent.takeWrites();
  ASSERT_FALSE(b.empty());
  const OutFrame& frame = *b.frames.back();
  ASSERT_NE(frame.piped, nullptr);
  EXPECT_EQ(frame.size(), frame.head.size() + data.size());
  EXPECT_GE(b.bytes, data.size());
  EXPECT_LT(bytesOf(b).size(), data.size()) << "the pipe's bytes are the transport's to send";
  ASSERT_TRUE(frame.piped->materialize().ok());  // as a TLS transport does
  const std::string wire = bytesOf(b);
  ASSERT_EQ(wire.size(), b.bytes);

  const size_t rest = data.size() - 1000;  // the head and 1000 bytes come in memory
  ASSERT_TRUE(p.client.onBytes(std::string_view(wire).substr(0, wire.size() - rest), p.ch, p.now).ok());
  EXPECT_TRUE(p.ch.responses.empty());
  ASSERT_EQ(p.client.pipeWanted(), rest);
  auto rest_pipe = fakes::pipeHolding(std::string_view(wire).substr(wire.size() - rest));
  ASSERT_TRUE(p.client.onPiped(std::move(rest_pipe), p.ch, p.now).ok());
  ASSERT_EQ(p.ch.responses.size(), 1u);
  EXPECT_TRUE(p.ch.responses[0].file().data().data() == data);
  EXPECT_TRUE(p.ch.responses[0].file().data().eof());

  // The transport is cut before the client's ack: the agent replays it.
  p.agent.onTransportLost();
  ASSERT_TRUE(p.agent.resume(0, p.now).ok());
  std::vector<Frame> replayed = framesOf(p.agent.takeWrites());
  auto it = std::find_if(replayed.begin(), replayed.end(),
                         [](const Frame& f) { return f.frame.has_response(); });
  ASSERT_NE(it, replayed.end());
  EXPECT_TRUE(it->frame.response().file().data().data() == data);
}

TEST(SessionTest, ZeroCopyReadPath) {
  Pipe p;
  ASSERT_TRUE(p.client.sendRequest(envRequest("zc")).ok());
  std::string wire = bytesOf(p.client.takeWrites());
  // Two reads, the first ending inside the frame.
  size_t cut = wire.size() / 2;
  std::span<char> room = p.agent.readBuffer(cut);
  ASSERT_GE(room.size(), cut);
  std::copy_n(wire.data(), cut, room.data());
  ASSERT_TRUE(p.agent.onRead(cut, p.ah, p.now).ok());
  EXPECT_TRUE(p.ah.requests.empty());
  room = p.agent.readBuffer();
  std::copy_n(wire.data() + cut, wire.size() - cut, room.data());
  ASSERT_TRUE(p.agent.onRead(wire.size() - cut, p.ah, p.now).ok());
  ASSERT_EQ(p.ah.requests.size(), 1u);
  EXPECT_EQ(p.ah.requests[0].env().include(0), "zc");
}

// ------------------------------------------------------------ limits

TEST(SessionTest, StreamLimitLocally) {
  SessionLimits l = smallLimits();
  l.max_streams = 2;
  Pipe p(l);
  auto a = p.client.openStream(v1::StreamOpen());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(p.client.openStream(v1::StreamOpen()).ok());
  auto c = p.client.openStream(v1::StreamOpen());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(errorCodeOf(c.status()), v1::TOO_MANY_STREAMS);
  p.client.resetStream(*a, errorWith(v1::CANCELLED));
  EXPECT_TRUE(p.client.openStream(v1::StreamOpen()).ok());
}

TEST(SessionTest, StreamOpenPastThePeersLimitIsReset) {
  SessionLimits lax = smallLimits();
  lax.max_streams = 10;
  SessionLimits strict = smallLimits();
  strict.max_streams = 1;
  Pipe p(lax, strict);
  p.ah.accept_opens = true;
  auto first = p.client.openStream(v1::StreamOpen());
  auto second = p.client.openStream(v1::StreamOpen());
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(p.pump().ok());
  ASSERT_EQ(p.ah.opens.size(), 1u);  // the second never reached the handler
  EXPECT_EQ(p.ah.opens[0].stream_id(), *first);
  ASSERT_EQ(p.ch.resets.size(), 1u);
  EXPECT_EQ(p.ch.resets[0].first, *second);
  EXPECT_EQ(p.ch.resets[0].second.code(), v1::TOO_MANY_STREAMS);
  EXPECT_FALSE(p.client.streamOpen(*second));
  EXPECT_TRUE(p.client.streamOpen(*first));
  EXPECT_GT(p.client.sendCredit(*first), 0u);
  EXPECT_EQ(p.agent.streamIds(), std::vector<uint64_t>{*first});
}

// ------------------------------------------------------------ flow control

TEST(SessionTest, SenderCannotExceedItsCredit) {
  Pipe p;  // windows of 4096
  uint64_t id = p.openAccepted();
  ASSERT_EQ(p.client.sendCredit(id), 4096u);
  auto over = p.client.sendData(id, std::string(4097, 'x'));
  EXPECT_EQ(errorCodeOf(over), v1::FLOW_CONTROL_ERROR);
  EXPECT_FALSE(p.client.hasWrites());  // nothing was queued
  ASSERT_TRUE(p.client.sendData(id, std::string(4000, 'a')).ok());
  EXPECT_EQ(p.client.sendCredit(id), 96u);
  ASSERT_TRUE(p.client.sendData(id, std::string(96, 'b')).ok());
  EXPECT_EQ(p.client.sendCredit(id), 0u);
  EXPECT_EQ(errorCodeOf(p.client.sendData(id, "c")), v1::FLOW_CONTROL_ERROR);
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ah.data[id].size(), 4096u);
  EXPECT_EQ(p.client.sendCredit(id), 0u);  // nothing consumed yet
  EXPECT_TRUE(p.ch.writable.empty());

  // Credit comes back in quarter-window steps.
  p.agent.consumed(id, 1023);
  EXPECT_FALSE(p.agent.hasWrites());
  p.agent.consumed(id, 1);
  EXPECT_TRUE(p.agent.hasWrites());
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.ch.writable, std::vector<uint64_t>{id});
  EXPECT_EQ(p.client.sendCredit(id), 1024u);
  p.agent.consumed(id, 3072);
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(p.client.sendCredit(id), 4096u);
  // Writable fires only for a stream that saw zero credit.
  EXPECT_EQ(p.ch.writable.size(), 1u);
}

// A bulk stream queues at most kMaxUnsentPerStream in the session, however
// large its window: its other bytes wait in its socket. The transport's
// pollWritable() after each takeWrites() lets it go on.
TEST(SessionTest, ABulkStreamQueuesAtMostItsUnsentBound) {
  SessionLimits big = smallLimits();
  big.initial_stream_window = 4 * 1024 * 1024;
  Pipe p(big);
  const uint64_t cap = Session::kMaxUnsentPerStream;
  uint64_t bulk = p.openAccepted();
  uint64_t small = p.openAccepted();
  EXPECT_EQ(p.client.sendCredit(bulk), cap);
  for (int i = 0; i < 16; ++i) {  // as a pump reads: 16 KiB frames
    ASSERT_TRUE(p.client.sendData(bulk, std::string(cap / 16, 'b')).ok());
  }
  EXPECT_EQ(p.client.sendCredit(bulk), 0u);
  EXPECT_EQ(errorCodeOf(p.client.sendData(bulk, "b")), v1::FLOW_CONTROL_ERROR);
  // Another stream is not held by it.
  EXPECT_GT(p.client.sendCredit(small), 0u);

  // The transport takes 7 of the 16 frames: not yet room enough (half).
  WriteBatch first = p.client.takeWrites(cap / 2 - 20000);
  ASSERT_EQ(first.frames.size(), 7u);
  p.client.pollWritable(p.ch);
  EXPECT_TRUE(p.ch.writable.empty());
  WriteBatch second = p.client.takeWrites();
  p.client.pollWritable(p.ch);
  EXPECT_EQ(p.ch.writable, std::vector<uint64_t>{bulk});
  EXPECT_EQ(p.client.sendCredit(bulk), cap);
  EXPECT_EQ(framesOf(second).size(), 9u);
}

// A capture drops what it cannot queue: its stream's bound is its credit,
// not the unsent bound of streams whose bytes can wait in a socket.
TEST(SessionTest, AnUnboundStreamQueuesUpToItsCredit) {
  SessionLimits big = smallLimits();
  big.initial_stream_window = 4 * 1024 * 1024;
  Pipe p(big);
  const uint64_t cap = Session::kMaxUnsentPerStream;
  uint64_t capture = p.openAccepted();
  p.client.unboundUnsent(capture);
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(p.client.sendData(capture, std::string(cap / 16, 'c')).ok()) << i;
  }
  EXPECT_EQ(p.client.sendCredit(capture), 4u * 1024 * 1024 - 4 * cap);
}

// A small frame of a stream with nothing else waiting goes ahead of the bulk
// data other streams queued before it and no transport took yet: it waits
// behind what is on the wire, not behind the session's queue. Each stream's
// own bytes stay in order; frames that are not data (an open, a close, an
// answer) are not passed.
TEST(SessionTest, ASmallFrameGoesAheadOfBulkDataQueuedBeforeIt) {
  SessionLimits big = smallLimits();
  big.initial_stream_window = 4 * 1024 * 1024;
  Pipe p(big);
  p.ah.consume_all = true;
  const uint64_t cap = Session::kMaxUnsentPerStream;
  uint64_t bulk = p.openAccepted();
  uint64_t small = p.openAccepted();
  std::string bulk_bytes;
  for (int i = 0; i < 16; ++i) {
    std::string chunk(cap / 16, static_cast<char>('a' + i));
    bulk_bytes += chunk;
    ASSERT_TRUE(p.client.sendData(bulk, chunk).ok());
  }
  // The transport takes one frame; the small stream's first bytes come now.
  WriteBatch on_the_wire = p.client.takeWrites(1);
  ASSERT_EQ(on_the_wire.frames.size(), 1u);
  ASSERT_TRUE(p.client.sendData(small, "ping").ok());
  ASSERT_TRUE(p.client.sendData(small, "pong").ok());  // its own: behind "ping"
  WriteBatch next = p.client.takeWrites(1);
  auto frames = framesOf(next);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].stream_id, small);
  EXPECT_EQ(frames[0].payload, "ping");
  // A close of the bulk stream is a barrier: data queued after it stays after it.
  ASSERT_TRUE(p.client.halfClose(bulk).ok());
  ASSERT_TRUE(p.client.sendData(small, "late").ok());
  for (const WriteBatch& b : {on_the_wire, next}) {
    ASSERT_TRUE(p.agent.onBytes(bytesOf(b), p.ah, p.now).ok());
  }
  ASSERT_TRUE(p.settle().ok());
  EXPECT_EQ(p.ah.data[bulk], bulk_bytes);
  EXPECT_EQ(p.ah.data[small], "pingponglate");
  // "pong" went out after the whole bulk queue (the small stream had bytes
  // waiting then), "late" after the close.
  std::vector<std::string> order;
  for (const std::string& e : p.ah.log) {
    if (e.starts_with("data " + std::to_string(small)) || e == "half_close " + std::to_string(bulk)) {
      order.push_back(e.substr(e.rfind(' ') + 1));
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{"ping", "pong", std::to_string(bulk), "late"}));
}

// Frames a transport took may have reached the peer, which counts them: after
// a cut they are replayed in the order they were taken, and a frame queued
// meanwhile goes ahead of the untaken ones only. Every byte arrives once.
TEST(SessionTest, FramesATransportTookKeepTheirPlaceAcrossACut) {
  SessionLimits big = smallLimits();
  big.initial_stream_window = 4 * 1024 * 1024;
  Pipe p(big);
  p.ah.consume_all = true;
  uint64_t bulk = p.openAccepted();
  uint64_t small = p.openAccepted();
  std::string bulk_bytes;
  for (int i = 0; i < 8; ++i) {
    std::string chunk(16 * 1024, static_cast<char>('a' + i));
    bulk_bytes += chunk;
    ASSERT_TRUE(p.client.sendData(bulk, chunk).ok());
  }
  // Three frames taken; the first reaches the agent, two are lost in the cut.
  WriteBatch taken = p.client.takeWrites(40 * 1024);
  ASSERT_EQ(taken.frames.size(), 3u);
  WriteBatch delivered;
  delivered.frames = {taken.frames[0]};
  ASSERT_TRUE(p.agent.onBytes(bytesOf(delivered), p.ah, p.now).ok());
  p.client.onTransportLost();
  p.agent.onTransportLost();
  ASSERT_TRUE(p.client.sendData(small, "ping").ok());
  ASSERT_TRUE(p.client.resume(p.agent.receivedCount(), p.now).ok());
  ASSERT_TRUE(p.agent.resume(p.client.receivedCount(), p.now).ok());
  WriteBatch replay = p.client.takeWrites();
  auto frames = framesOf(replay);
  std::vector<std::string> data_order;
  for (const auto& f : frames) {
    if (f.is_data) data_order.push_back(f.stream_id == small ? "small" : f.payload.substr(0, 1));
  }
  // b and c were taken before the cut: they keep their place; "ping" goes
  // ahead of d..h, which no transport took.
  EXPECT_EQ(data_order,
            (std::vector<std::string>{"b", "c", "small", "d", "e", "f", "g", "h"}));
  ASSERT_TRUE(p.agent.onBytes(bytesOf(replay), p.ah, p.now).ok());
  ASSERT_TRUE(p.settle().ok());
  EXPECT_EQ(p.ah.data[bulk], bulk_bytes);
  EXPECT_EQ(p.ah.data[small], "ping");
}

TEST(SessionTest, StalledStreamDoesNotBlockAFlowingOne) {
  Pipe p;  // windows of 4096
  uint64_t stalled = p.openAccepted();
  uint64_t flowing = p.openAccepted();
  p.ah.consume = {flowing};  // the agent never consumes `stalled`
  std::map<uint64_t, std::string> content;
  std::map<uint64_t, size_t> sent;
  for (uint64_t id : {stalled, flowing}) {
    for (int i = 0; content[id].size() < 40000; ++i) {
      content[id] += std::to_string(id) + ":" + std::to_string(i) + ";";
    }
  }
  for (int round = 0; round < 1000 && sent[flowing] < content[flowing].size(); ++round) {
    for (uint64_t id : {stalled, flowing}) {
      size_t n = std::min({p.client.sendCredit(id), content[id].size() - sent[id], size_t{1500}});
      if (n == 0) continue;
      ASSERT_TRUE(p.client.sendData(id, content[id].substr(sent[id], n)).ok());
      sent[id] += n;
    }
    ASSERT_TRUE(p.pump().ok());
  }
  // Every byte of the flowing stream arrived, in order.
  EXPECT_EQ(p.ah.data[flowing], content[flowing]);
  // The stalled one moved exactly its window and waits.
  EXPECT_EQ(p.ah.data[stalled], content[stalled].substr(0, 4096));
  EXPECT_EQ(p.client.sendCredit(stalled), 0u);
  EXPECT_EQ(std::count(p.ch.writable.begin(), p.ch.writable.end(), stalled), 0);

  // Consuming it later releases it: the stall was its credit, nothing else.
  p.agent.consumed(stalled, 4096);
  ASSERT_TRUE(p.pump().ok());
  EXPECT_EQ(std::count(p.ch.writable.begin(), p.ch.writable.end(), stalled), 1);
  EXPECT_EQ(p.client.sendCredit(stalled), 4096u);
}

TEST(SessionTest, DataBeyondTheReceiversCreditIsFlowControlError) {
  Pipe p;
  uint64_t id = p.openAccepted(/*by_client=*/true, /*window=*/16);
  // The agent may send 16 bytes; hand-crafted frames send more.
  ASSERT_TRUE(p.client.onBytes(encodeDataFrame(id, std::string(10, 'a')), p.ch, p.now).ok());
  ASSERT_TRUE(p.client.onBytes(encodeDataFrame(id, std::string(6, 'b')), p.ch, p.now).ok());
  auto st = p.client.onBytes(encodeDataFrame(id, "c"), p.ch, p.now);
  EXPECT_EQ(errorCodeOf(st), v1::FLOW_CONTROL_ERROR) << st;
  EXPECT_EQ(p.ch.data[id], std::string(10, 'a') + std::string(6, 'b'));
}

TEST(SessionTest, DatagramBeyondTheReceiversCreditIsFlowControlError) {
  Pipe p;
  uint64_t id = p.openAccepted(/*by_client=*/true, /*window=*/16);
  v1::Frame f;
  f.mutable_datagram()->set_stream_id(id);
  f.mutable_datagram()->set_payload(std::string(17, 'd'));
  EXPECT_EQ(errorCodeOf(p.client.onBytes(encodeFrame(f), p.ch, p.now)), v1::FLOW_CONTROL_ERROR);
}

TEST(SessionTest, ReplayBufferBoundHoldsCreditUntilAcked) {
  SessionLimits l = smallLimits();
  l.max_frame_size = 4096;
  l.replay_buffer_bytes = 8192;
  l.initial_stream_window = 1 << 20;
  Pipe p(l);
  uint64_t id = p.openAccepted();
  ASSERT_EQ(p.client.unackedBytes(), 0u);
  size_t sent = 0;
  while (size_t c = p.client.sendCredit(id)) {
    ASSERT_TRUE(p.client.sendData(id, std::string(std::min<size_t>(c, 1000), 'r')).ok());
    sent += std::min<size_t>(c, 1000);
  }
  // The stream still has most of its credit; the replay buffer is what stops it.
  EXPECT_GE(sent, 8192u - 1000);
  EXPECT_LT(sent, 8192u);
  EXPECT_GE(p.client.unackedBytes(), 8192u);
  EXPECT_LE(p.client.unackedBytes(), 8192u + kMaxDataHeaderSize);
  EXPECT_EQ(errorCodeOf(p.client.sendData(id, "x")), v1::FLOW_CONTROL_ERROR);

  // Delivered but not yet acked: still no credit.
  ASSERT_TRUE(p.toAgent().ok());
  EXPECT_EQ(p.ah.data[id].size(), sent);
  EXPECT_EQ(p.client.sendCredit(id), 0u);
  EXPECT_TRUE(p.ch.writable.empty());
  // The ack frees the buffer and wakes the stream.
  ASSERT_TRUE(p.toClient().ok());
  EXPECT_EQ(p.client.unackedBytes(), 0u);
  EXPECT_EQ(p.ch.writable, std::vector<uint64_t>{id});
  EXPECT_EQ(p.client.sendCredit(id), 8192u);
}

// ------------------------------------------------------------ acks

// An ack the peer is owed, or 0.
uint64_t ackIn(const WriteBatch& batch) {
  uint64_t ack = 0;
  for (const Frame& f : framesOf(batch)) {
    if (!f.is_data && f.frame.has_ack()) ack = f.frame.ack().received();
  }
  return ack;
}

TEST(SessionTest, ALoneAckWaitsForTheAckDelay) {
  Pipe p;
  ASSERT_TRUE(p.client.sendRequest(envRequest("x")).ok());
  ASSERT_TRUE(p.toAgent().ok());
  // The agent has nothing else to send: no write yet, but a tick is due.
  EXPECT_FALSE(p.agent.hasWrites());
  EXPECT_EQ(p.agent.nextTick(), p.now + kAckDelay);
  ASSERT_TRUE(p.agent.onTick(p.now + kAckDelay - milliseconds(1)).ok());
  EXPECT_FALSE(p.agent.hasWrites());
  ASSERT_TRUE(p.agent.onTick(p.now + kAckDelay).ok());
  ASSERT_TRUE(p.agent.hasWrites());
  WriteBatch b = p.agent.takeWrites();
  EXPECT_EQ(ackIn(b), 1u);
  EXPECT_EQ(framesOf(b).size(), 1u);
  ASSERT_TRUE(p.client.onBytes(bytesOf(b), p.ch, p.now).ok());
  EXPECT_EQ(p.client.unackedBytes(), 0u);
  // Nothing owed any more: the next tick is the keepalive's.
  EXPECT_EQ(p.agent.nextTick(), kT0 + smallLimits().keepalive_interval);
}

TEST(SessionTest, AnAckRidesWithWhateverGoesNext) {
  Pipe p;
  ASSERT_TRUE(p.client.sendRequest(envRequest("x")).ok());
  ASSERT_TRUE(p.client.sendRequest(envRequest("y")).ok());
  ASSERT_TRUE(p.toAgent().ok());
  ASSERT_EQ(p.ah.requests.size(), 2u);
  // The answer goes at once, and carries the ack of both requests.
  p.agent.sendResponse(envResponse(p.ah.requests[0].request_id(), "x"));
  WriteBatch b = p.agent.takeWrites();
  EXPECT_EQ(ackIn(b), 2u);
  EXPECT_EQ(framesOf(b).size(), 2u);
  ASSERT_TRUE(p.client.onBytes(bytesOf(b), p.ch, p.now).ok());
  EXPECT_EQ(p.client.unackedBytes(), 0u);
  // Owed nothing now: the agent's delayed-ack timer is off.
  EXPECT_GT(p.agent.nextTick(), p.now + kAckDelay);
}

TEST(SessionTest, AQuarterOfTheReplayBufferUnackedIsAckedAtOnce) {
  SessionLimits l = smallLimits();
  l.max_frame_size = 4096;
  l.replay_buffer_bytes = 64 * 1024;
  l.initial_stream_window = 1 << 20;
  Pipe p(l);
  uint64_t id = p.openAccepted();
  // Just below a quarter (16 KiB of frames): held back.
  ASSERT_TRUE(p.client.sendData(id, std::string(12 * 1024, 'a')).ok());
  ASSERT_TRUE(p.toAgent().ok());
  EXPECT_FALSE(p.agent.hasWrites());
  // Past it: the ack goes without waiting, and frees the sender's buffer.
  ASSERT_TRUE(p.client.sendData(id, std::string(8 * 1024, 'b')).ok());
  ASSERT_TRUE(p.toAgent().ok());
  ASSERT_TRUE(p.agent.hasWrites());
  ASSERT_TRUE(p.toClient().ok());
  EXPECT_EQ(p.client.unackedBytes(), 0u);
}

// ------------------------------------------------------------ window growth

SessionLimits growingLimits() {
  SessionLimits l = smallLimits();
  l.initial_stream_window = 4096;
  l.max_stream_window = 32 * 1024;
  l.window_growth_budget = 1 << 20;
  return l;
}

// Sends `n` bytes on `id` from the client in what credit allows, the agent
// consuming everything at once; returns the agent's largest WindowUpdate.
uint32_t flow(Pipe& p, uint64_t id, size_t n, milliseconds step = milliseconds(0)) {
  p.ah.consume_all = true;
  uint32_t largest = 0;
  size_t sent = 0;
  for (int i = 0; i < 100000 && sent < n; ++i) {
    size_t c = std::min(p.client.sendCredit(id), n - sent);
    if (c > 0) {
      EXPECT_TRUE(p.client.sendData(id, std::string(c, 'w')).ok());
      sent += c;
    }
    p.now += step;
    EXPECT_TRUE(p.toAgent().ok());
    WriteBatch b = p.agent.takeWrites();
    for (const Frame& f : framesOf(b)) {
      if (!f.is_data && f.frame.has_window_update()) {
        largest = std::max(largest, f.frame.window_update().increment());
      }
    }
    EXPECT_TRUE(p.client.onBytes(bytesOf(b), p.ch, p.now).ok());
  }
  EXPECT_EQ(sent, n);
  return largest;
}

TEST(SessionTest, AWindowGrowsWhileItsReaderKeepsUp) {
  Pipe p(growingLimits());
  uint64_t id = p.openAccepted();
  // Every quarter window consumed at once (the clock stands still): the
  // window doubles each update until the maximum.
  uint32_t largest = flow(p, id, 1 << 20);
  EXPECT_GT(largest, 4096u);
  EXPECT_LE(largest, 32u * 1024);
  // At the maximum, the sender holds the whole grown window of credit.
  EXPECT_GT(p.client.sendCredit(id), 16u * 1024);
  EXPECT_LE(p.client.sendCredit(id), 32u * 1024);
}

TEST(SessionTest, AWindowStaysWhenItsReaderIsSlow) {
  Pipe p(growingLimits());
  uint64_t id = p.openAccepted();
  // A quarter window per kWindowGrowPeriod or slower: no growth.
  uint32_t largest = flow(p, id, 64 * 1024, kWindowGrowPeriod);
  EXPECT_LE(largest, 4096u);
  EXPECT_LE(p.client.sendCredit(id), 4096u);
}

// Over a long path a window below the bandwidth-delay product comes back a
// quarter at a time more slowly than kWindowGrowPeriod, yet the sender waits
// for it: within two of the path's round trips the window still grows.
TEST(SessionTest, AWindowGrowsOverALongPathWithinTwoRoundTrips) {
  Pipe p(growingLimits());
  uint64_t id = p.openAccepted();
  p.agent.setPathRtt(std::chrono::milliseconds(50));
  EXPECT_EQ(p.agent.pathRtt(), std::chrono::microseconds(50000));
  uint32_t largest = flow(p, id, 1 << 20, std::chrono::milliseconds(25));
  EXPECT_GT(largest, 16u * 1024);
  // Slower than two round trips per quarter window: it stays.
  Pipe q(growingLimits());
  uint64_t slow = q.openAccepted();
  q.agent.setPathRtt(std::chrono::milliseconds(50));
  EXPECT_LE(flow(q, slow, 64 * 1024, std::chrono::milliseconds(100)), 4096u);
}

TEST(SessionTest, WindowGrowthStaysWithinTheBudgetAndReturnsWithTheStream) {
  SessionLimits l = growingLimits();
  l.window_growth_budget = 40 * 1024;  // one stream's growth (28 KiB) and a bit
  Pipe p(l);
  uint64_t a = p.openAccepted();
  uint64_t b = p.openAccepted();
  flow(p, a, 1 << 20);
  flow(p, b, 1 << 20);
  // a took 28 KiB of growth, b what was left (12 KiB).
  EXPECT_LE(p.client.sendCredit(a), 32u * 1024);
  EXPECT_LE(p.client.sendCredit(b), 16u * 1024);
  EXPECT_GT(p.client.sendCredit(b), 4096u);
  // a ends: its growth goes back to the budget, and a new stream grows fully.
  ASSERT_TRUE(p.client.halfClose(a).ok());
  ASSERT_TRUE(p.agent.halfClose(a).ok());
  ASSERT_TRUE(p.pump().ok());
  ASSERT_FALSE(p.agent.streamOpen(a));
  uint64_t c = p.openAccepted();
  flow(p, c, 1 << 20);
  EXPECT_GT(p.client.sendCredit(c), 16u * 1024);
}

// ------------------------------------------------------------ keepalive

TEST(SessionTest, KeepalivePingPongAndSilentPeer) {
  Pipe p;  // interval 1 s, timeout 3 s
  EXPECT_EQ(p.client.nextTick(), kT0 + milliseconds(1000));
  ASSERT_TRUE(p.client.onTick(kT0 + milliseconds(999)).ok());
  EXPECT_FALSE(p.client.hasWrites());
  ASSERT_TRUE(p.client.onTick(kT0 + milliseconds(1000)).ok());
  ASSERT_TRUE(p.client.hasWrites());
  WriteBatch ping = p.client.takeWrites();
  std::vector<Frame> frames = framesOf(ping);
  ASSERT_EQ(frames.size(), 1u);
  ASSERT_TRUE(frames[0].frame.has_ping());
  uint64_t nonce = frames[0].frame.ping().nonce();
  // Not again before the next interval.
  ASSERT_TRUE(p.client.onTick(kT0 + milliseconds(1500)).ok());
  EXPECT_FALSE(p.client.hasWrites());

  // The agent answers with a Pong carrying the nonce.
  ASSERT_TRUE(p.agent.onBytes(bytesOf(ping), p.ah, kT0 + milliseconds(1000)).ok());
  std::vector<Frame> answer = framesOf(p.agent.takeWrites());
  ASSERT_EQ(answer.size(), 1u);
  ASSERT_TRUE(answer[0].frame.has_pong());
  EXPECT_EQ(answer[0].frame.pong().nonce(), nonce);
  // Neither counts as a sequenced frame.
  EXPECT_EQ(p.agent.receivedCount(), 0u);

  // The Pong arrives at 1.5 s: the client hears from its peer then.
  v1::Frame pong = answer[0].frame;
  ASSERT_TRUE(p.client.onBytes(encodeFrame(pong), p.ch, kT0 + milliseconds(1500)).ok());
  EXPECT_EQ(p.client.nextTick(), kT0 + milliseconds(2000));
  ASSERT_TRUE(p.client.onTick(kT0 + milliseconds(4499)).ok());
  // From then on the peer is silent: lost 3 s after the Pong.
  auto lost = p.client.onTick(kT0 + milliseconds(4500));
  EXPECT_EQ(errorCodeOf(lost), v1::UNAVAILABLE) << lost;
  EXPECT_NE(lost.message().find("3000"), std::string::npos) << lost;

  // The agent never heard anything after 1 s.
  EXPECT_TRUE(p.agent.onTick(kT0 + milliseconds(3999)).ok());
  EXPECT_EQ(errorCodeOf(p.agent.onTick(kT0 + milliseconds(4000))), v1::UNAVAILABLE);

  // Without a transport there is nothing to ping and no one to time out.
  p.client.onTransportLost();
  EXPECT_TRUE(p.client.onTick(kT0 + std::chrono::hours(5)).ok());
  EXPECT_FALSE(p.client.hasWrites());
}

TEST(SessionTest, ConstantTrafficKeepsThePeerAlive) {
  Pipe p;  // interval 1 s, timeout 3 s
  for (int s = 1; s <= 10; ++s) {
    p.now = kT0 + std::chrono::seconds(s);
    ASSERT_TRUE(p.client.onTick(p.now).ok());
    ASSERT_TRUE(p.agent.onTick(p.now).ok());
    ASSERT_TRUE(p.pump().ok());
  }
  // Ten seconds in, both heard from each other a moment ago.
  EXPECT_TRUE(p.client.onTick(p.now + milliseconds(2999)).ok());
  EXPECT_TRUE(p.agent.onTick(p.now + milliseconds(2999)).ok());
  EXPECT_EQ(p.client.receivedCount(), 0u);  // pings are not sequenced
}

// ------------------------------------------------------------ bad peers

std::string frameBytes(void (*fill)(v1::Frame&)) {
  v1::Frame f;
  fill(f);
  return encodeFrame(f);
}

TEST(SessionTest, ProtocolViolationsAreTypedErrors) {
  struct Case {
    const char* name;
    std::string bytes;
    v1::ErrorCode want;
  };
  const std::vector<Case> cases = {
      {"hello after handshake",
       frameBytes([](v1::Frame& f) { f.mutable_hello()->set_client_name("x"); }),
       v1::PROTOCOL_ERROR},
      {"welcome after handshake",
       frameBytes([](v1::Frame& f) { f.mutable_welcome()->set_session_id("x"); }),
       v1::PROTOCOL_ERROR},
      {"ack of frames never sent",
       frameBytes([](v1::Frame& f) { f.mutable_ack()->set_received(1); }), v1::PROTOCOL_ERROR},
      {"open with the agent's parity",
       frameBytes([](v1::Frame& f) { f.mutable_open()->set_stream_id(2); }), v1::PROTOCOL_ERROR},
      {"open of stream 0", frameBytes([](v1::Frame& f) { f.mutable_open(); }), v1::PROTOCOL_ERROR},
      {"open twice", frameBytes([](v1::Frame& f) {
                       f.mutable_open()->set_stream_id(1);
                     }) + frameBytes([](v1::Frame& f) { f.mutable_open()->set_stream_id(1); }),
       v1::PROTOCOL_ERROR},
      {"accept of a stream the client opened",
       frameBytes([](v1::Frame& f) { f.mutable_open()->set_stream_id(1); }) +
           frameBytes([](v1::Frame& f) { f.mutable_accept()->set_stream_id(1); }),
       v1::PROTOCOL_ERROR},
      {"request id reused while pending",
       frameBytes([](v1::Frame& f) { f.mutable_request()->set_request_id(4); }) +
           frameBytes([](v1::Frame& f) { f.mutable_request()->set_request_id(4); }),
       v1::PROTOCOL_ERROR},
      // Only an unknown field (100): a newer frame kind we cannot sequence.
      {"frame with no body", std::string("\0\0\0\x03\xa0\x06\x01", 7), v1::PROTOCOL_ERROR},
      {"frame above the maximum", std::string("\x00\x20\x00\x00", 4), v1::FRAME_TOO_LARGE},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Pipe p;
    auto st = p.agent.onBytes(c.bytes, p.ah, p.now);
    EXPECT_EQ(errorCodeOf(st), c.want) << st;
  }
}

TEST(SessionTest, DataAfterHalfCloseIsStreamClosed) {
  Pipe p;
  uint64_t id = p.openAccepted();
  ASSERT_TRUE(p.client.halfClose(id).ok());
  ASSERT_TRUE(p.pump().ok());
  auto st = p.agent.onBytes(encodeDataFrame(id, "late"), p.ah, p.now);
  EXPECT_EQ(errorCodeOf(st), v1::STREAM_CLOSED) << st;
}

TEST(SessionTest, FramesForStreamsThatWereResetAreIgnored) {
  // A stream we reset may still receive frames the peer sent before it
  // learned; they must not end the session.
  Pipe p;
  const uint64_t peer = p.openAccepted();                    // the client's
  const uint64_t own = p.openAccepted(/*by_client=*/false);  // the agent's
  p.agent.resetStream(peer, v1::Error());
  p.agent.resetStream(own, v1::Error());
  p.ah.log.clear();
  const uint64_t before = p.agent.receivedCount();
  std::string bytes;
  for (uint64_t id : {peer, own}) {
    v1::Frame half, update, reset;
    half.mutable_half_close()->set_stream_id(id);
    update.mutable_window_update()->set_stream_id(id);
    update.mutable_window_update()->set_increment(5);
    reset.mutable_reset()->set_stream_id(id);
    bytes +=
        encodeDataFrame(id, "x") + encodeFrame(half) + encodeFrame(update) + encodeFrame(reset);
  }
  v1::Frame accept;
  accept.mutable_accept()->set_stream_id(own);
  bytes += encodeFrame(accept);
  auto st = p.agent.onBytes(bytes, p.ah, p.now);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(p.ah.log.empty());
  EXPECT_EQ(p.agent.receivedCount(), before + 9);
}

TEST(SessionTest, FramesForStreamsNeverOpenedAreProtocolErrors) {
  // No frame was ever in flight for these ids: a peer naming one is out of
  // step (or probing) and the session ends.
  const std::vector<std::string> frames = {
      encodeDataFrame(41, "x"),
      encodeDataFrame(0, "x"),
      frameBytes([](v1::Frame& f) { f.mutable_half_close()->set_stream_id(41); }),
      frameBytes([](v1::Frame& f) {
        f.mutable_window_update()->set_stream_id(41);
        f.mutable_window_update()->set_increment(5);
      }),
      frameBytes([](v1::Frame& f) { f.mutable_reset()->set_stream_id(41); }),
      frameBytes([](v1::Frame& f) { f.mutable_datagram()->set_stream_id(41); }),
      frameBytes([](v1::Frame& f) { f.mutable_gap()->set_stream_id(41); }),
      frameBytes(
          [](v1::Frame& f) { f.mutable_accept()->set_stream_id(42); }),  // the agent's parity
  };
  for (const std::string& bytes : frames) {
    Pipe p;
    p.openAccepted();  // stream 1: a lower id of the peer's is no excuse
    auto st = p.agent.onBytes(bytes, p.ah, p.now);
    EXPECT_EQ(errorCodeOf(st), v1::PROTOCOL_ERROR) << st;
  }
}

TEST(SessionTest, WindowUpdatePastTheLargestWindowIsAFlowControlError) {
  Pipe p;
  const uint64_t id = p.openAccepted(/*by_client=*/true, /*window=*/0xfffffff0u);
  v1::Frame update;
  update.mutable_window_update()->set_stream_id(id);
  update.mutable_window_update()->set_increment(0x0f);  // exactly 2^32-1: fine
  EXPECT_TRUE(p.agent.onBytes(encodeFrame(update), p.ah, p.now).ok());
  update.mutable_window_update()->set_increment(1);
  auto st = p.agent.onBytes(encodeFrame(update), p.ah, p.now);
  EXPECT_EQ(errorCodeOf(st), v1::FLOW_CONTROL_ERROR) << st;
}

// A gap stands for bytes of the stream: it keeps its place among the data,
// and nothing, gaps included, follows the half-close that ends them.
TEST(SessionTest, GapsKeepTheirPlaceAndEndWithTheHalfClose) {
  Pipe p;
  uint64_t id = p.openAccepted(/*by_client=*/false);  // the agent opens, as for a mirror
  p.ch.log.clear();
  v1::StreamGap gap;
  gap.set_stream_id(id);
  gap.set_direction(v1::CLIENT_TO_SERVER);
  gap.set_bytes(1234);
  ASSERT_TRUE(p.agent.sendData(id, "before").ok());
  ASSERT_TRUE(p.agent.sendGap(gap).ok());
  ASSERT_TRUE(p.agent.sendData(id, "after").ok());
  ASSERT_TRUE(p.agent.halfClose(id).ok());
  EXPECT_EQ(errorCodeOf(p.agent.sendGap(gap)), v1::STREAM_CLOSED);
  ASSERT_TRUE(p.pump().ok());
  const std::string sid = std::to_string(id);
  EXPECT_EQ(p.ch.log, (std::vector<std::string>{"data " + sid + " before", "gap " + sid + " 1234",
                                                "data " + sid + " after", "half_close " + sid}));

  // A peer that sends one anyway breaks the protocol, as data would.
  v1::Frame f;
  *f.mutable_gap() = gap;
  auto late = encodeFrame(f);
  auto st = p.client.onBytes(late, p.ch, p.now);
  EXPECT_EQ(errorCodeOf(st), v1::STREAM_CLOSED) << st;
  EXPECT_EQ(p.ch.gaps.size(), 1u);
}

TEST(SessionTest, GapsOfResetStreamsAreIgnored) {
  // A stream we reset may still get the gaps the peer sent before it learned.
  Pipe p;
  const uint64_t id = p.openAccepted(/*by_client=*/false);
  p.client.resetStream(id, v1::Error());
  p.ch.log.clear();
  v1::Frame f;
  f.mutable_gap()->set_stream_id(id);
  f.mutable_gap()->set_bytes(9);
  auto st = p.client.onBytes(encodeFrame(f), p.ch, p.now);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(p.ch.log.empty());
  EXPECT_TRUE(p.ch.gaps.empty());
}

}  // namespace
}  // namespace siphon::protocol
