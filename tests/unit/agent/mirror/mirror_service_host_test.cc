// The mirror service against fake session hosts and a fake capture source:
// the request checks, the subscription bookkeeping (ownership, the port's
// reference count, the session's end, `siphon sessions`), a connection
// mirrored as a stream the agent opens on the host with its records and
// gaps counted there, and unsubscribe resetting it. No agent server, no
// root.
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/mirror/mirror_service.h"
#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"

namespace siphon::agent::mirror {
namespace {

using fakes::FakePeer;
using fakes::FakeSessionHost;
using fakes::ServiceHarness;

struct Capture {
  std::mutex mu;
  std::vector<std::string> calls;  // "add 80", "remove 80", "stop", "pause", "go"...
  std::function<void(std::vector<MirrorEvent>)> deliver;
  // A handover: what the source exports, and what a new one was given.
  std::vector<ConnectionSnapshot> connections;
  std::shared_ptr<MirrorEngineState> adopted;

  void record(std::string s) {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back(std::move(s));
  }
  size_t count(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    return static_cast<size_t>(std::count(calls.begin(), calls.end(), s));
  }
};

class Source : public MirrorSource {
 public:
  explicit Source(std::shared_ptr<Capture> c) : c_(std::move(c)) {}
  ~Source() override { c_->record("stop"); }
  absl::Status addPort(uint16_t port) override {
    c_->record(absl::StrCat("add ", port));
    return absl::OkStatus();
  }
  absl::Status removePort(uint16_t port) override {
    c_->record(absl::StrCat("remove ", port));
    return absl::OkStatus();
  }
  void released(size_t) override {}
  void pause() override { c_->record("pause"); }
  void resume() override { c_->record("resume"); }
  void go() override { c_->record("go"); }
  absl::StatusOr<MirrorEngineState> exportState() override {
    c_->record("export");
    MirrorEngineState s;
    s.connections = c_->connections;
    s.next_connection_id = 9;
    s.ports = {80};
    s.ring = UniqueFd(::eventfd(0, EFD_CLOEXEC));  // stands for the ring buffer
    return s;
  }

 private:
  std::shared_ptr<Capture> c_;
};

v1::Request mirrorReq(uint64_t id, uint32_t port) {
  v1::Request r;
  r.set_request_id(id);
  r.mutable_mirror()->set_port(port);
  return r;
}
v1::Request unsubscribeReq(uint64_t id, uint64_t subscription) {
  v1::Request r;
  r.set_request_id(id);
  r.mutable_unsubscribe()->set_subscription_id(subscription);
  return r;
}

MirrorEvent opened(uint64_t id, uint16_t server_port) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kOpened;
  e.connection = id;
  e.info.id = id;
  e.info.client = Endpoint{IpAddress::v4(10, 0, 0, 2), 40000};
  e.info.server = Endpoint{IpAddress::v4(10, 0, 0, 1), server_port};
  return e;
}
MirrorEvent data(uint64_t id, std::string_view bytes) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kData;
  e.connection = id;
  e.direction = Direction::kClientToServer;
  e.record.push_back(static_cast<char>(directionByte(e.direction)));
  e.record.append(bytes);
  return e;
}
MirrorEvent gap(uint64_t id, uint64_t bytes) {
  MirrorEvent e;
  e.kind = MirrorEvent::Kind::kGap;
  e.connection = id;
  e.direction = Direction::kClientToServer;
  e.gap_bytes = bytes;
  return e;
}

class MirrorServiceHostTest : public ::testing::Test {
 protected:
  void TearDown() override {
    a_->end();
    b_->end();
    service_->agentStopping();
    harness_.poll();
  }

  v1::Response call(const std::shared_ptr<FakeSessionHost>& host, v1::Request request) {
    const uint64_t id = request.request_id();
    EXPECT_FALSE(host->response(id).has_value()) << "request ids are unique per host";
    service_->handle(host, std::move(request));
    EXPECT_TRUE(harness_.runUntil([&] { return host->response(id).has_value(); }));
    auto r = host->response(id);
    return r ? *r : v1::Response{};
  }
  // Hands `batch` to the service as the engine would (from its thread).
  void push(std::vector<MirrorEvent> batch) {
    std::function<void(std::vector<MirrorEvent>)> d;
    {
      std::lock_guard<std::mutex> l(capture_->mu);
      d = capture_->deliver;
    }
    ASSERT_TRUE(d) << "no source is running";
    d(std::move(batch));
  }

  ServiceHarness harness_;
  std::shared_ptr<Capture> capture_ = std::make_shared<Capture>();
  std::shared_ptr<MirrorService> service_ =
      makeMirrorService(harness_.ctx(),
                        [c = capture_](std::function<void(std::vector<MirrorEvent>)> deliver,
                           std::shared_ptr<MirrorEngineState> adopted)
                            -> absl::StatusOr<std::unique_ptr<MirrorSource>> {
                          {
                            std::lock_guard<std::mutex> l(c->mu);
                            c->deliver = std::move(deliver);
                            c->adopted = std::move(adopted);
                          }
                          return std::make_unique<Source>(c);
                        });
  std::shared_ptr<FakeSessionHost> a_ = std::make_shared<FakeSessionHost>("session-a");
  std::shared_ptr<FakeSessionHost> b_ = std::make_shared<FakeSessionHost>("session-b");
};

TEST_F(MirrorServiceHostTest, APortOutOfRangeIsRefused) {
  EXPECT_EQ(call(a_, mirrorReq(1, 0)).error().code(), v1::INVALID_ARGUMENT);
  EXPECT_EQ(call(a_, mirrorReq(2, 65536)).error().code(), v1::INVALID_ARGUMENT);
  EXPECT_EQ(capture_->count("add 0"), 0u);
}

TEST_F(MirrorServiceHostTest, SessionsShareAPortUntilTheLastGoes) {
  v1::Response ra = call(a_, mirrorReq(1, 80));
  v1::Response rb = call(b_, mirrorReq(1, 80));
  ASSERT_TRUE(ra.has_subscribed()) << ra.DebugString();
  ASSERT_TRUE(rb.has_subscribed()) << "a mirror is never exclusive";
  EXPECT_EQ(ra.subscribed().backend(), "tc");
  EXPECT_EQ(capture_->count("add 80"), 1u) << "one port in the source for both";
  const uint64_t sub_a = ra.subscribed().subscription_id();
  EXPECT_TRUE(service_->ownsSubscription(sub_a, "session-a"));
  EXPECT_FALSE(service_->ownsSubscription(sub_a, "session-b"));

  google::protobuf::RepeatedPtrField<v1::SubscriptionSummary> listed;
  service_->describeSubscriptions("session-b", &listed);
  ASSERT_EQ(listed.size(), 1);
  EXPECT_EQ(listed[0].kind(), "mirror");
  EXPECT_EQ(listed[0].port(), 80u);

  EXPECT_EQ(call(b_, unsubscribeReq(2, sub_a)).error().code(), v1::NOT_FOUND)
      << "not bob's subscription";
  a_->end();
  service_->sessionEnded("session-a");
  harness_.poll();
  EXPECT_EQ(capture_->count("remove 80"), 0u) << "bob still mirrors it";
  const uint64_t sub_b = rb.subscribed().subscription_id();
  EXPECT_TRUE(call(b_, unsubscribeReq(3, sub_b)).has_unsubscribed());
  EXPECT_TRUE(harness_.runUntil([&] { return capture_->count("stop") == 1; }))
      << "the last subscription gone, the source stops";
  EXPECT_EQ(capture_->count("remove 80"), 1u);
}

TEST_F(MirrorServiceHostTest, AConnectionIsMirroredAsAStreamOnTheHost) {
  FakePeer peer(*a_);
  ASSERT_TRUE(call(a_, mirrorReq(1, 80)).has_subscribed());
  push({opened(7, 80), data(7, "GET / HTTP/1.1\r\n"), gap(7, 100)});
  ASSERT_TRUE(harness_.runUntil([&] {
    peer.pipe();
    return !peer.opens.empty() && !peer.gaps.empty();
  }));
  ASSERT_EQ(a_->opened.size(), 1u) << "opened through the host";
  const uint64_t stream = peer.opens[0].stream_id();
  EXPECT_EQ(peer.opens[0].mirrored().destination().port(), 80u);
  EXPECT_EQ(peer.data[stream].substr(1), "GET / HTTP/1.1\r\n") << "after the direction byte";
  EXPECT_EQ(a_->sent[stream], 16u) << "payload bytes counted, not the direction byte";
  EXPECT_EQ(a_->gap_bytes[stream], 100u);
  EXPECT_EQ(peer.gaps[0].bytes(), 100u);

  // Another port's connection reaches nobody.
  push({opened(8, 443)});
  harness_.poll();
  peer.pipe();
  EXPECT_EQ(a_->opened.size(), 1u);

  const uint64_t sub = service_->stats().connections;
  EXPECT_EQ(sub, 1u);
}

TEST_F(MirrorServiceHostTest, UnsubscribeResetsTheStreamsAndADrainRefusesNewOnes) {
  FakePeer peer(*a_);
  const uint64_t sub = call(a_, mirrorReq(1, 80)).subscribed().subscription_id();
  push({opened(7, 80)});
  ASSERT_TRUE(harness_.runUntil([&] {
    peer.pipe();
    return !peer.opens.empty();
  }));
  const uint64_t stream = peer.opens[0].stream_id();
  ASSERT_TRUE(call(a_, unsubscribeReq(2, sub)).has_unsubscribed());
  peer.pipe();
  EXPECT_EQ(peer.resets[stream].code(), v1::CANCELLED) << peer.resets[stream].DebugString();
  EXPECT_EQ(a_->endpoint(stream), nullptr) << "unregistered";

  service_->agentDraining();
  EXPECT_EQ(call(a_, mirrorReq(3, 80)).error().code(), v1::AGENT_DRAINING);
}

// A handover: the old service pauses its capture at the freeze and
// exports its subscription, the stream with what it queued (the client has
// not accepted it yet) and the capture's state; a new service imports them
// for the same session, registers the stream on its host, starts a capture
// from that state (reading from go()), and the records it delivers queue
// behind the old ones on the same stream. A thaw resumes the old capture.
TEST_F(MirrorServiceHostTest, AHandoverMovesSubscriptionsStreamsAndTheCapture) {
  const uint64_t sub = call(a_, mirrorReq(1, 80)).subscribed().subscription_id();
  ConnectionSnapshot c;
  c.info = opened(7, 80).info;
  c.client_to_server.started = true;
  c.client_to_server.next_seq = 1000;
  capture_->connections = {c};
  push({opened(7, 80), data(7, "first"), data(7, "second")});
  ASSERT_TRUE(harness_.runUntil([&] { return a_->opened.size() == 1; }));
  const uint64_t stream = a_->registered.at(0);

  service_->freeze();
  EXPECT_EQ(capture_->count("pause"), 1u);
  service_->thaw();
  EXPECT_TRUE(harness_.runUntil([&] { return capture_->count("resume") == 1; }));
  service_->freeze();

  v1::AgentState state;
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(service_->exportState(&state, &fds).ok());
  ASSERT_TRUE(state.has_mirror());
  const v1::MirrorExport& m = state.mirror();
  ASSERT_EQ(m.subscriptions_size(), 1);
  EXPECT_EQ(m.subscriptions(0).id(), sub);
  ASSERT_EQ(m.subscriptions(0).streams_size(), 1);
  EXPECT_EQ(m.subscriptions(0).streams(0).stream_id(), stream);
  EXPECT_EQ(m.subscriptions(0).streams(0).queue_size(), 2) << "not accepted yet: both queued";
  ASSERT_EQ(m.connections_size(), 1);
  EXPECT_TRUE(m.connections(0).in_service());
  EXPECT_EQ(m.connections(0).client_to_server().next_seq(), 1000u);
  ASSERT_GE(m.ring(), 0);
  ASSERT_LT(static_cast<size_t>(m.ring()), fds.size());

  // The new agent: its own harness, capture and host for the same session.
  v1::SessionState protocol;
  a_->session().onTransportLost();  // the freeze cuts the transport
  absl::Status exported = a_->session().exportState(&protocol);
  ASSERT_TRUE(exported.ok()) << exported;
  ServiceHarness harness;
  auto capture = std::make_shared<Capture>();
  auto service = makeMirrorService(
      harness.ctx(),
      [capture](std::function<void(std::vector<MirrorEvent>)> deliver,
                std::shared_ptr<MirrorEngineState> adopted)
          -> absl::StatusOr<std::unique_ptr<MirrorSource>> {
        std::lock_guard<std::mutex> l(capture->mu);
        capture->deliver = std::move(deliver);
        capture->adopted = std::move(adopted);
        return std::make_unique<Source>(capture);
      });
  auto moved = std::make_shared<FakeSessionHost>("session-a");
  ASSERT_TRUE(moved->session().restoreState(protocol, protocol::Clock::now()).ok());
  absl::Status imported = service->importState(state, fds, {{"session-a", moved}});
  ASSERT_TRUE(imported.ok()) << imported;
  ASSERT_TRUE(capture->adopted);
  EXPECT_EQ(capture->adopted->next_connection_id, 9u);
  EXPECT_EQ(capture->adopted->ports, std::set<uint16_t>{80});
  ASSERT_EQ(capture->adopted->connections.size(), 1u);
  EXPECT_EQ(capture->adopted->connections[0].client_to_server.next_seq, 1000u);
  EXPECT_TRUE(capture->adopted->ring.valid());
  EXPECT_EQ(moved->registered, std::vector<uint64_t>{stream}) << "the stream, on the new host";
  EXPECT_TRUE(service->ownsSubscription(sub, "session-a"));
  EXPECT_EQ(capture->count("go"), 0u) << "the capture reads once the old agent let go";
  service->startAfterHandover();
  EXPECT_TRUE(harness.runUntil([&] { return capture->count("go") == 1; }));

  capture->deliver({data(7, "third")});
  harness.poll();
  v1::AgentState again;
  std::vector<UniqueFd> more;
  service->freeze();
  ASSERT_TRUE(service->exportState(&again, &more).ok());
  ASSERT_EQ(again.mirror().subscriptions(0).streams_size(), 1);
  const auto& queue = again.mirror().subscriptions(0).streams(0).queue();
  ASSERT_EQ(queue.size(), 3);
  EXPECT_EQ(queue[0].record().substr(1), "first");
  EXPECT_EQ(queue[1].record().substr(1), "second");
  EXPECT_EQ(queue[2].record().substr(1), "third") << "behind the old ones, on the same stream";
  moved->end();
  service->agentStopping();
  harness.poll();
}

}  // namespace
}  // namespace siphon::agent::mirror
