// Resume: a scripted exchange in both directions (requests, responses, stream
// data, window updates, opens, half-closes) where the transport is cut at
// every possible byte of the frames in flight, partial frames included. Both
// sides keep sending during the cut, resume from the other's receivedCount(),
// and must end with every request answered exactly once and every stream
// holding exactly the bytes sent, in order.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "siphon/protocol/session.h"
#include "siphon/status.h"

namespace siphon::protocol {
namespace {

const TimePoint kT0 = TimePoint() + std::chrono::hours(1);

SessionLimits testLimits() {
  SessionLimits l;
  // Small windows so WindowUpdates are in flight at every cut and senders
  // run out of credit during it.
  l.initial_stream_window = 1024;
  l.max_stream_window = 0;  // and they stay small
  return l;
}

std::string bytesOf(const WriteBatch& batch) {
  std::string out;
  for (std::string_view b : batch.buffers()) out.append(b);
  return out;
}

// One side's application: sends what the script says within its credit
// (resuming only from onStreamAccept/onStreamWritable, never by polling),
// answers every request, accepts every stream, consumes what it receives.
class App : public SessionHandler {
 public:
  App(Role role, const char* name) : session(role, testLimits(), kT0), name_(name) {}

  void request(const std::string& tag) {
    v1::Request r;
    r.mutable_env()->add_include(tag);
    auto id = session.sendRequest(r);
    ASSERT_TRUE(id.ok()) << id.status();
    requests_sent[*id] = tag;
  }

  uint64_t open() {
    v1::StreamOpen o;
    o.mutable_outgoing()->set_port(443);
    auto id = session.openStream(o);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(0);
  }

  // Queues `n` chunks of recognisable bytes on a stream.
  void send(uint64_t id, int n) {
    for (int i = 0; i < n; ++i) {
      std::string chunk = name_ + std::to_string(id) + "#" + std::to_string(next_chunk_[id]++);
      chunk.resize(97, '.');
      outbox_[id] += chunk;
      expected_at_peer[id] += chunk;
    }
    flush(id);
  }

  // Half-closes once everything queued on the stream is sent.
  void closeWhenDone(uint64_t id) {
    close_when_done_[id] = true;
    flush(id);
  }

  void flush(uint64_t id) {
    std::string& out = outbox_[id];
    while (!out.empty()) {
      size_t n = std::min<size_t>({session.sendCredit(id), out.size(), 150});
      if (n == 0) return;  // onStreamWritable() brings us back
      absl::Status st = session.sendData(id, out.substr(0, n));
      ASSERT_TRUE(st.ok()) << st;
      out.erase(0, n);
    }
    if (close_when_done_[id] && !closed_[id] && session.streamOpen(id)) {
      closed_[id] = true;
      absl::Status st = session.halfClose(id);
      ASSERT_TRUE(st.ok()) << st;
    }
  }

  // A handover (docs/CONTINUITY.md): this side's process is replaced by
  // one that knows only the exported state, carried as bytes.
  void handOver() {
    v1::SessionState state;
    absl::Status st = session.exportState(&state);
    ASSERT_TRUE(st.ok()) << st;
    v1::SessionState carried;
    ASSERT_TRUE(carried.ParseFromString(state.SerializeAsString()));
    Session fresh(session.role(), Session::limitsOf(carried), kT0);
    st = fresh.restoreState(carried, kT0);
    ASSERT_TRUE(st.ok()) << st;
    session = std::move(fresh);
  }

  // ---- SessionHandler
  void onRequest(v1::Request r) override {
    v1::Response resp;
    resp.set_request_id(r.request_id());
    resp.mutable_env()->add_vars()->set_name("re:" + r.env().include(0));
    session.sendResponse(resp);
  }
  void onResponse(v1::Response r) override {
    ++responses[r.request_id()];
    response_names[r.request_id()] = r.env().vars_size() ? r.env().vars(0).name() : "";
  }
  void onStreamOpen(v1::StreamOpen o) override {
    ++opens[o.stream_id()];
    v1::StreamAccept a;
    a.set_stream_id(o.stream_id());
    absl::Status st = session.acceptStream(a);
    EXPECT_TRUE(st.ok()) << st;
  }
  void onStreamAccept(v1::StreamAccept a) override {
    ++accepts[a.stream_id()];
    flush(a.stream_id());
  }
  void onStreamData(uint64_t id, std::string_view payload) override {
    received[id].append(payload);
    session.consumed(id, payload.size());
  }
  void onStreamHalfClose(uint64_t id) override { ++half_closes[id]; }
  void onStreamReset(uint64_t id, v1::Error e) override {
    problems.push_back("reset of " + std::to_string(id) + ": " + e.message());
  }
  void onStreamWritable(uint64_t id) override { flush(id); }
  void onGoaway(v1::Goaway g) override { problems.push_back("goaway: " + g.message()); }

  Session session;
  std::map<uint64_t, std::string> requests_sent;  // id -> tag
  std::map<uint64_t, int> responses;              // id -> times answered
  std::map<uint64_t, std::string> response_names;
  std::map<uint64_t, std::string> expected_at_peer;
  std::map<uint64_t, std::string> received;
  std::map<uint64_t, int> opens, accepts, half_closes;
  std::vector<std::string> problems;

 private:
  std::string name_;
  std::map<uint64_t, int> next_chunk_;
  std::map<uint64_t, std::string> outbox_;
  std::map<uint64_t, bool> close_when_done_;
  std::map<uint64_t, bool> closed_;
};

struct World {
  App c{Role::kClient, "c"};
  App a{Role::kAgent, "a"};
  TimePoint now = kT0;

  // Everything each side has to write, delivered in full, until quiet, the
  // acks the sides hold back (kAckDelay) included.
  void pump() {
    for (int i = 0; i < 10000; ++i) {
      if (!c.session.hasWrites() && !a.session.hasWrites()) {
        if (c.session.nextTick() > now + kAckDelay && a.session.nextTick() > now + kAckDelay) {
          return;
        }
        now += kAckDelay;
        ASSERT_TRUE(c.session.onTick(now).ok());
        ASSERT_TRUE(a.session.onTick(now).ok());
        continue;
      }
      deliver(c.session.takeWrites(), a);
      deliver(a.session.takeWrites(), c);
    }
    FAIL() << "the exchange never settles";
  }
  void deliver(const WriteBatch& batch, App& to) { deliverPrefix(bytesOf(batch), to); }
  void deliverPrefix(std::string_view bytes, App& to) {
    if (bytes.empty()) return;
    absl::Status st = to.session.onBytes(bytes, to, now);
    ASSERT_TRUE(st.ok()) << st;
  }

  // Cuts the transport after `to_agent` bytes of `wc` and `to_client` bytes
  // of `wa` arrived, lets both applications send during the cut, resumes.
  void cutAndResume(const std::string& wc, size_t to_agent, const std::string& wa, size_t to_client,
                    int round, bool handover = false) {
    deliverPrefix(std::string_view(wc).substr(0, to_agent), a);
    deliverPrefix(std::string_view(wa).substr(0, to_client), c);
    c.session.onTransportLost();
    a.session.onTransportLost();
    EXPECT_FALSE(c.session.hasWrites());
    EXPECT_TRUE(c.session.takeWrites().empty());

    // The applications go on while the transport is down.
    c.request("cut" + std::to_string(round));
    a.request("cut" + std::to_string(round));
    c.send(1, 3);
    c.send(3, 2);
    a.send(2, 3);

    if (handover) {
      ASSERT_NO_FATAL_FAILURE(a.handOver());
    }
    now += std::chrono::seconds(1);
    uint64_t c_has = c.session.receivedCount();
    uint64_t a_has = a.session.receivedCount();
    absl::Status st = c.session.resume(a_has, now);
    ASSERT_TRUE(st.ok()) << st;
    st = a.session.resume(c_has, now);
    ASSERT_TRUE(st.ok()) << st;
  }
};

// The whole script; `cut` picks how much of each in-flight batch arrives.
// With `second_cut`, the replay after the first resume is itself cut halfway.
// With `handover`, the agent side's session is exported and restored into
// a new one at each cut (a new agent process took it over).
void runScript(size_t cut_c, size_t cut_a, bool second_cut, size_t* in_flight_c = nullptr,
               size_t* in_flight_a = nullptr, bool handover = false) {
  World w;
  // Streams 1 (client's), 2 (agent's) open and accepted.
  uint64_t s1 = w.c.open();
  uint64_t s2 = w.a.open();
  ASSERT_EQ(s1, 1u);
  ASSERT_EQ(s2, 2u);
  ASSERT_NO_FATAL_FAILURE(w.pump());

  // Step A, delivered in full: requests and data both ways.
  w.c.request("c1");
  w.c.request("c2");
  w.a.request("a1");
  w.c.send(s1, 5);
  w.a.send(s2, 5);
  WriteBatch ca = w.c.session.takeWrites();
  WriteBatch aa = w.a.session.takeWrites();
  ASSERT_NO_FATAL_FAILURE(w.deliver(ca, w.a));
  ASSERT_NO_FATAL_FAILURE(w.deliver(aa, w.c));

  // Step B, in flight when the transport dies: responses, acks, window
  // updates, a new stream (3) and more data.
  uint64_t s3 = w.c.open();
  ASSERT_EQ(s3, 3u);
  w.c.request("c2b");
  w.c.send(s1, 4);
  w.c.send(s3, 2);  // waits for the accept
  w.a.send(s2, 4);
  w.a.request("a2");
  std::string wc = bytesOf(w.c.session.takeWrites());
  std::string wa = bytesOf(w.a.session.takeWrites());
  if (in_flight_c) *in_flight_c = wc.size();
  if (in_flight_a) *in_flight_a = wa.size();
  ASSERT_NO_FATAL_FAILURE(w.cutAndResume(wc, std::min(cut_c, wc.size()), wa,
                                         std::min(cut_a, wa.size()), 1, handover));

  if (second_cut) {
    // The replay itself is cut halfway through.
    std::string rc = bytesOf(w.c.session.takeWrites());
    std::string ra = bytesOf(w.a.session.takeWrites());
    ASSERT_NO_FATAL_FAILURE(w.cutAndResume(rc, rc.size() / 2, ra, ra.size() / 3, 2, handover));
  }
  ASSERT_NO_FATAL_FAILURE(w.pump());

  // After the resume: more of everything, then every stream closed both ways.
  w.c.request("c3");
  w.a.request("a3");
  w.c.send(s1, 2);
  w.a.send(s2, 2);
  w.a.send(s3, 2);
  for (uint64_t id : {s1, s2, s3}) {
    w.c.closeWhenDone(id);
    w.a.closeWhenDone(id);
  }
  ASSERT_NO_FATAL_FAILURE(w.pump());

  for (App* app : {&w.c, &w.a}) {
    App& peer = app == &w.c ? w.a : w.c;
    SCOPED_TRACE(app == &w.c ? "client" : "agent");
    EXPECT_TRUE(app->problems.empty()) << app->problems.front();
    // Every request answered exactly once, by the answer to it.
    ASSERT_FALSE(app->requests_sent.empty());
    for (const auto& [id, tag] : app->requests_sent) {
      EXPECT_EQ(app->responses[id], 1) << "request " << id << " (" << tag << ")";
      EXPECT_EQ(app->response_names[id], "re:" + tag);
    }
    EXPECT_EQ(app->responses.size(), app->requests_sent.size());
    EXPECT_EQ(app->session.pendingRequests(), 0u);
    // Every stream: exactly the peer's bytes, in order; one open, accept and
    // half-close each.
    for (uint64_t id : {s1, s2, s3}) {
      SCOPED_TRACE(id);
      EXPECT_EQ(app->received[id], peer.expected_at_peer[id]);
      EXPECT_EQ(app->half_closes[id], 1);
    }
    EXPECT_EQ(app->session.streamCount(), 0u);
    // Nothing left to replay, and both counts agree.
    EXPECT_EQ(app->session.unackedBytes(), 0u);
    EXPECT_EQ(app->session.receivedCount(), peer.session.sentCount());
  }
  EXPECT_EQ(w.a.opens, (std::map<uint64_t, int>{{1, 1}, {3, 1}}));
  EXPECT_EQ(w.c.opens, (std::map<uint64_t, int>{{2, 1}}));
  EXPECT_EQ(w.c.accepts, (std::map<uint64_t, int>{{1, 1}, {3, 1}}));
  EXPECT_EQ(w.a.accepts, (std::map<uint64_t, int>{{2, 1}}));
  EXPECT_GT(w.a.received[s1].size(), 1024u);  // more than a window: credit came back
}

TEST(ResumeTest, NoCutAtAll) {
  size_t wc = 0, wa = 0;
  runScript(~size_t{0}, ~size_t{0}, false, &wc, &wa);
  EXPECT_GT(wc, 400u);
  EXPECT_GT(wa, 400u);
}

TEST(ResumeTest, CutAtEveryByteInEachDirection) {
  size_t wc = 0, wa = 0;
  runScript(0, 0, false, &wc, &wa);
  ASSERT_GT(wc, 0u);
  ASSERT_GT(wa, 0u);
  size_t n = std::max(wc, wa);
  for (size_t k = 0; k <= n; ++k) {
    // The same point both ways, and opposite ends (early one way, late the
    // other), so every byte of each batch is a cut point in some pairing.
    runScript(k, k, false);
    runScript(k, n - k, false);
    if (testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failure with a cut at " << k << " of " << wc << "/" << wa;
      return;
    }
  }
}

TEST(ResumeTest, ReplayCutAgain) {
  size_t wc = 0, wa = 0;
  runScript(0, 0, true, &wc, &wa);
  for (size_t k = 0; k <= std::max(wc, wa); k += 7) {
    runScript(k, wa - std::min(k, wa), true);
    if (testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failure with a cut at " << k;
      return;
    }
  }
}

// A handover at every cut point, and again during the replay: the new
// agent process, knowing only the exported state, goes on exactly where
// the old one was (every request answered once, every byte once, in order).
TEST(ResumeTest, HandoverAtEveryCutPointLosesNothing) {
  size_t wc = 0, wa = 0;
  runScript(0, 0, false, &wc, &wa, /*handover=*/true);
  for (size_t k = 0; k <= std::max(wc, wa); k += 3) {
    runScript(k, wa - std::min(k, wa), false, nullptr, nullptr, true);
    runScript(k, k, true, nullptr, nullptr, true);
    if (testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failure with a cut at " << k;
      return;
    }
  }
}

// What cannot be exported says why; a state that does not hold together is
// refused on import.
TEST(ResumeTest, HandoverExportAndImportRefuseWhatDoesNotHold) {
  Session agent(Role::kAgent, testLimits(), kT0);
  v1::SessionState st;
  absl::Status s = agent.exportState(&st);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("transport"), std::string::npos) << s;
  // An unanswered request of the peer.
  Session client(Role::kClient, testLimits(), kT0);
  v1::Request r;
  r.mutable_env();
  ASSERT_TRUE(client.sendRequest(r).ok());
  SessionHandler ignore;
  ASSERT_TRUE(agent.onBytes(bytesOf(client.takeWrites()), ignore, kT0).ok());
  agent.onTransportLost();
  s = agent.exportState(&st);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("not answered"), std::string::npos) << s;
  v1::Response resp;
  resp.set_request_id(1);
  resp.mutable_env();
  agent.sendResponse(resp);
  ASSERT_TRUE(agent.exportState(&st).ok());
  // Counters against frames.
  v1::SessionState bad = st;
  bad.set_sent(bad.sent() + 5);
  Session fresh(Role::kAgent, Session::limitsOf(bad), kT0);
  s = fresh.restoreState(bad, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A client's stream id in an agent's state.
  bad = st;
  bad.set_next_stream_id(3);
  s = fresh.restoreState(bad, kT0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // The good one restores, and resumes against the client.
  Session good(Role::kAgent, Session::limitsOf(st), kT0);
  ASSERT_TRUE(good.restoreState(st, kT0).ok());
  EXPECT_TRUE(good.resume(0, kT0).ok());
  EXPECT_TRUE(good.hasWrites());
}

TEST(ResumeTest, PeerCountOutOfRangeIsResumeFailed) {
  Session s(Role::kClient, testLimits(), kT0);
  Session peer(Role::kAgent, testLimits(), kT0);
  SessionHandler ignore;
  v1::Request r;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.sendRequest(r).ok());
  ASSERT_TRUE(peer.onBytes(bytesOf(s.takeWrites()), ignore, kT0).ok());
  // The peer has nothing else to send: its ack goes alone, kAckDelay later.
  EXPECT_FALSE(peer.hasWrites());
  ASSERT_TRUE(peer.onTick(kT0 + kAckDelay).ok());
  ASSERT_TRUE(s.onBytes(bytesOf(peer.takeWrites()), ignore, kT0).ok());  // ack of 3
  ASSERT_EQ(s.unackedBytes(), 0u);
  ASSERT_TRUE(s.sendRequest(r).ok());  // seq 4, not acked

  s.onTransportLost();
  // Frames 1..3 are acked and gone: a peer claiming 2 cannot be served.
  absl::Status low = s.resume(2, kT0);
  EXPECT_EQ(errorCodeOf(low), v1::RESUME_FAILED) << low;
  // Nor can one claiming a frame never sent.
  absl::Status high = s.resume(5, kT0);
  EXPECT_EQ(errorCodeOf(high), v1::RESUME_FAILED) << high;
  EXPECT_FALSE(s.attached());
  // Both ends of the range work.
  EXPECT_TRUE(s.resume(3, kT0).ok());
  EXPECT_TRUE(s.attached());
  EXPECT_TRUE(s.resume(4, kT0).ok());  // resume while attached: an implicit cut
  EXPECT_EQ(s.unackedBytes(), 0u);
}

TEST(ResumeTest, ReplayFromTheRightFrame) {
  Session s(Role::kClient, testLimits(), kT0);
  for (int i = 0; i < 5; ++i) {
    v1::Request r;
    r.mutable_env()->add_include(std::to_string(i));
    ASSERT_TRUE(s.sendRequest(r).ok());
  }
  std::string all = bytesOf(s.takeWrites());
  s.onTransportLost();
  ASSERT_TRUE(s.resume(2, kT0).ok());
  WriteBatch replay = s.takeWrites();
  // An Ack (our count: 0) first, then requests 3, 4 and 5.
  std::vector<std::string_view> bufs = replay.buffers();
  ASSERT_EQ(replay.frames.size(), 4u);
  EXPECT_FALSE(replay.frames[0]->sequenced);
  for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(replay.frames[i]->sequenced);
  std::string tail;
  for (size_t i = 1; i < bufs.size(); ++i) tail.append(bufs[i]);
  EXPECT_EQ(tail, all.substr(all.size() - tail.size()));
  EXPECT_EQ(s.sentCount(), 5u);
}

TEST(ResumeTest, ControlFramesAreDroppedWhileDetached) {
  Session s(Role::kAgent, testLimits(), kT0);
  s.onTransportLost();
  s.sendGoaway(v1::AGENT_DRAINING, "bye");
  v1::Draining d;
  s.sendDraining(d);  // sequenced: kept for the next transport
  EXPECT_FALSE(s.hasWrites());
  EXPECT_TRUE(s.takeWrites().empty());
  ASSERT_TRUE(s.resume(0, kT0).ok());
  WriteBatch b = s.takeWrites();
  ASSERT_EQ(b.frames.size(), 2u);  // the resume Ack and the Draining
  EXPECT_FALSE(b.frames[0]->sequenced);
  EXPECT_TRUE(b.frames[1]->sequenced);
}

// A stream waiting for replay space when the transport dies must be woken
// once the resume frees that space, though no later Ack carries news.
TEST(ResumeTest, StreamWaitingForReplaySpaceWakesAfterResume) {
  SessionLimits l = testLimits();
  l.replay_buffer_bytes = 4096;
  l.initial_stream_window = 1 << 20;
  World w;
  w.c.session = Session(Role::kClient, l, kT0);
  w.a.session = Session(Role::kAgent, l, kT0);
  uint64_t id = w.c.open();
  ASSERT_NO_FATAL_FAILURE(w.pump());
  w.c.send(id, 100);  // far more than the replay buffer holds
  ASSERT_EQ(w.c.session.sendCredit(id), 0u);
  ASSERT_GT(w.c.session.unackedBytes(), 4000u);
  // Everything arrives; the Ack does not (the transport dies first).
  ASSERT_NO_FATAL_FAILURE(w.deliver(w.c.session.takeWrites(), w.a));
  w.c.session.onTransportLost();
  w.a.session.onTransportLost();
  ASSERT_TRUE(w.c.session.resume(w.a.session.receivedCount(), w.now).ok());
  ASSERT_TRUE(w.a.session.resume(w.c.session.receivedCount(), w.now).ok());
  EXPECT_EQ(w.c.session.unackedBytes(), 0u);
  // Nobody polls sendCredit(): only onStreamWritable() moves the rest.
  ASSERT_NO_FATAL_FAILURE(w.pump());
  EXPECT_EQ(w.a.received[id], w.c.expected_at_peer[id]);
  w.c.closeWhenDone(id);
  w.a.closeWhenDone(id);
  ASSERT_NO_FATAL_FAILURE(w.pump());
  EXPECT_EQ(w.a.half_closes[id], 1);
  EXPECT_EQ(w.c.half_closes[id], 1);
}

// ------------------------------------------------- racing resumes

// The tags of the requests a side received, in order.
class Tags : public SessionHandler {
 public:
  void onRequest(v1::Request r) override { got.push_back(r.env().include(0)); }
  std::vector<std::string> got;
};

// An agent-side session that sent f1..f10, of which its peer received f1..f3
// before the cut; the peer (a client session) is resumed and reads what the
// winning transport writes.
struct RaceWorld {
  RaceWorld() : agent(Role::kAgent, testLimits(), kT0), client(Role::kClient, testLimits(), kT0) {
    for (int i = 1; i <= 10; ++i) {
      send(i);
      if (i == 3) deliver(agent.takeWrites());
    }
    agent.onTransportLost();
    client.onTransportLost();
    EXPECT_TRUE(client.resume(agent.receivedCount(), kT0).ok());
  }
  void send(int i) {
    v1::Request r;
    r.mutable_env()->add_include("f" + std::to_string(i));
    EXPECT_TRUE(agent.sendRequest(r).ok());
  }
  void deliver(const WriteBatch& batch) {
    absl::Status s = client.onBytes(bytesOf(batch), tags, kT0);
    EXPECT_TRUE(s.ok()) << s;
  }
  // A resume as the agent's handshake makes it: resume(), then the number
  // its transport presents to attach().
  uint64_t resume() {
    EXPECT_TRUE(agent.resume(client.receivedCount(), kT0).ok());
    return agent.attachment();
  }
  // The transport of attachment `n` starts: what it writes is lost (its
  // client gave it up). False when it was refused.
  bool runLoser(uint64_t n) {
    if (!agent.attach(n).ok()) return false;
    (void)agent.takeWrites();
    return true;
  }
  static std::vector<std::string> upTo(int n) {
    std::vector<std::string> v;
    for (int i = 1; i <= n; ++i) v.push_back("f" + std::to_string(i));
    return v;
  }

  Session agent;
  Session client;
  Tags tags;
};

// Two resumes of one session race in the agent's handshake: both pass
// resume() before either transport runs. The later one wins: the earlier
// transport is refused before it takes a frame, and the winner's peer gets
// every frame it lacks exactly once, in order, whichever transport starts
// first.
TEST(ResumeTest, RacingResumesTheLaterWinsWhicheverTransportStartsFirst) {
  {
    SCOPED_TRACE("the earlier transport starts first");
    RaceWorld w;
    const uint64_t earlier = w.resume();
    const uint64_t later = w.resume();
    EXPECT_NE(earlier, later);
    EXPECT_FALSE(w.runLoser(earlier));
    ASSERT_TRUE(w.agent.attach(later).ok());
    w.deliver(w.agent.takeWrites());
    EXPECT_EQ(w.tags.got, RaceWorld::upTo(10));
  }
  {
    SCOPED_TRACE("the later transport starts first");
    RaceWorld w;
    const uint64_t earlier = w.resume();
    const uint64_t later = w.resume();
    ASSERT_TRUE(w.agent.attach(later).ok());
    w.deliver(w.agent.takeWrites());
    EXPECT_FALSE(w.runLoser(earlier));
    // The refusal left the winner alone: what follows reaches it, once.
    EXPECT_FALSE(w.agent.hasWrites());
    w.send(11);
    w.deliver(w.agent.takeWrites());
    EXPECT_EQ(w.tags.got, RaceWorld::upTo(11));
  }
  {
    SCOPED_TRACE("the earlier transport ran before the later resume");
    RaceWorld w;
    EXPECT_TRUE(w.runLoser(w.resume()));  // took f4..f10, all lost
    const uint64_t later = w.resume();
    ASSERT_TRUE(w.agent.attach(later).ok());
    w.deliver(w.agent.takeWrites());
    EXPECT_EQ(w.tags.got, RaceWorld::upTo(10));
  }
  {
    SCOPED_TRACE("three resumes, the middle one's transport first");
    RaceWorld w;
    const uint64_t first = w.resume();
    const uint64_t second = w.resume();
    const uint64_t third = w.resume();
    EXPECT_FALSE(w.runLoser(second));
    EXPECT_FALSE(w.runLoser(first));
    ASSERT_TRUE(w.agent.attach(third).ok());
    w.deliver(w.agent.takeWrites());
    EXPECT_EQ(w.tags.got, RaceWorld::upTo(10));
  }
  {
    SCOPED_TRACE("a detached session attaches nothing");
    RaceWorld w;
    const uint64_t n = w.resume();
    w.agent.onTransportLost();  // the winner's Welcome could not be written
    EXPECT_FALSE(w.agent.attach(n).ok());
  }
}

}  // namespace
}  // namespace siphon::protocol
