// The mirror service against fake session hosts and a fake capture source:
// the request checks, the subscription bookkeeping (ownership, the port's
// reference count, the session's end, `siphon sessions`), a connection
// mirrored as a stream the agent opens on the host with its records and
// gaps counted there, and unsubscribe resetting it. No agent server, no
// root.
#include <gtest/gtest.h>

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
  std::vector<std::string> calls;  // "add 80", "remove 80", "stop"
  std::function<void(std::vector<MirrorEvent>)> deliver;

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
                        [c = capture_](std::function<void(std::vector<MirrorEvent>)> deliver)
                            -> absl::StatusOr<std::unique_ptr<MirrorSource>> {
                          {
                            std::lock_guard<std::mutex> l(c->mu);
                            c->deliver = std::move(deliver);
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

}  // namespace
}  // namespace siphon::agent::mirror
