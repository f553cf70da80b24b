// The capture service against a fake session host and an in-memory client
// (FakePeer), with a fake packet source: the refusals (bad spec, too many
// captures, draining, a source that does not open), an accepted capture's
// pcap header, and the bookkeeping of its end. No agent server, no root.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "agent/capture/capture_service.h"
#include "agent/capture/pcap_file.h"
#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"
#include "tests/fakes/fake_packet_source.h"

namespace siphon::agent::capture {
namespace {

using fakes::FakePacketSource;
using fakes::FakePacketSourceState;
using fakes::FakePeer;
using fakes::FakeSessionHost;
using fakes::ServiceHarness;

v1::StreamOpen captureOpen(std::string interface, std::string filter = "") {
  v1::StreamOpen o;
  o.mutable_capture()->set_interface(std::move(interface));
  o.mutable_capture()->set_filter(std::move(filter));
  return o;
}

class CaptureServiceHostTest : public ::testing::Test {
 protected:
  void build(size_t max_captures = 32) {
    CaptureOptions o;
    o.max_captures = max_captures;
    o.stream.finish_delay = std::chrono::milliseconds(0);
    o.compile_filter = [](const std::string& e, int, uint32_t) -> CompiledFilterOr {
      return std::make_shared<const CompiledFilter>(e);
    };
    o.open_source =
        [this](const CaptureSpec& spec) -> absl::StatusOr<std::unique_ptr<PacketSource>> {
      ++opens_;
      if (!open_error_.ok()) return open_error_;
      return std::make_unique<FakePacketSource>(source_, spec.snaplen);
    };
    service_ = makeCaptureService(harness_.ctx(), o);
    host_->on_stream_open = [this](v1::StreamOpen open) { service_->open(host_, std::move(open)); };
  }
  void TearDown() override {
    host_->end();
    harness_.poll();
  }
  bool until(const std::function<bool()>& pred) {
    return harness_.runUntil([&] {
      peer_.pipe();
      return pred();
    });
  }

  ServiceHarness harness_;
  std::shared_ptr<FakePacketSourceState> source_ = std::make_shared<FakePacketSourceState>();
  std::atomic<int> opens_{0};
  absl::Status open_error_;  // set before the open: read on the netns worker
  std::shared_ptr<StreamService> service_;
  std::shared_ptr<FakeSessionHost> host_ = std::make_shared<FakeSessionHost>();
  FakePeer peer_{*host_};
};

TEST_F(CaptureServiceHostTest, AnAcceptedCaptureSendsThePcapHeaderFirst) {
  build();
  const uint64_t id = peer_.open(captureOpen("lo", "tcp port 80"));
  ASSERT_TRUE(until([&] { return !peer_.data[id].empty() || peer_.resets.contains(id); }));
  ASSERT_TRUE(peer_.accepted.contains(id)) << peer_.resets[id].DebugString();
  EXPECT_EQ(peer_.data[id].size(), kGlobalHeaderSize);
  EXPECT_EQ(source_->installedFilter(), "tcp port 80");
  EXPECT_EQ(host_->sent[id], kGlobalHeaderSize) << "counted on the host";
  EXPECT_EQ(opens_, 1);

  source_->push("packet-bytes");
  ASSERT_TRUE(until([&] { return peer_.data[id].size() > kGlobalHeaderSize; }));
  EXPECT_NE(peer_.data[id].find("packet-bytes"), std::string::npos);

  // The client's reset ends it: the source closes, the stream is released.
  peer_.session().resetStream(id, toProtoError(protoError(v1::CANCELLED, "enough")));
  ASSERT_TRUE(until([&] { return source_->closed.load(); }));
  EXPECT_EQ(host_->endpoint(id), nullptr);
}

TEST_F(CaptureServiceHostTest, ABadSpecIsRefusedBeforeAnySourceOpens) {
  build();
  const uint64_t id = peer_.open(captureOpen("not/an interface"));
  auto reset = host_->resetOf(id);
  ASSERT_TRUE(reset.has_value());
  EXPECT_EQ(reset->code(), v1::INVALID_ARGUMENT) << reset->message();
  EXPECT_EQ(opens_, 0);
  EXPECT_TRUE(host_->registered.empty());
}

TEST_F(CaptureServiceHostTest, CapturesPastTheLimitAreRefusedAndAnEndMakesRoom) {
  build(/*max_captures=*/1);
  const uint64_t first = peer_.open(captureOpen("lo"));
  ASSERT_TRUE(until([&] { return peer_.accepted.contains(first); }));
  const uint64_t second = peer_.open(captureOpen("lo"));
  ASSERT_TRUE(host_->resetOf(second).has_value());
  EXPECT_EQ(host_->resetOf(second)->code(), v1::RESOURCE_EXHAUSTED);

  peer_.session().resetStream(first, toProtoError(protoError(v1::CANCELLED, "done")));
  ASSERT_TRUE(until([&] { return source_->closed.load(); }));
  const uint64_t third = peer_.open(captureOpen("lo"));
  EXPECT_TRUE(until([&] { return peer_.accepted.contains(third); }))
      << "the first one's end freed its slot";
}

TEST_F(CaptureServiceHostTest, ASourceThatDoesNotOpenResetsTheStream) {
  build();
  open_error_ = protoError(v1::NOT_FOUND, "no interface eth9 in the target");
  const uint64_t id = peer_.open(captureOpen("eth9"));
  ASSERT_TRUE(until([&] { return peer_.resets.contains(id); }));
  EXPECT_EQ(peer_.resets[id].code(), v1::NOT_FOUND);
  EXPECT_FALSE(peer_.accepted.contains(id));
  EXPECT_EQ(host_->endpoint(id), nullptr) << "released";
}

TEST_F(CaptureServiceHostTest, DrainingEndsCapturesAndRefusesNewOnes) {
  build();
  const uint64_t id = peer_.open(captureOpen("lo"));
  ASSERT_TRUE(until([&] { return peer_.accepted.contains(id); }));
  service_->agentDraining();
  ASSERT_TRUE(until([&] { return peer_.resets.contains(id); }));
  EXPECT_EQ(peer_.resets[id].code(), v1::AGENT_DRAINING);
  const uint64_t late = peer_.open(captureOpen("lo"));
  ASSERT_TRUE(host_->resetOf(late).has_value());
  EXPECT_EQ(host_->resetOf(late)->code(), v1::AGENT_DRAINING);
}

}  // namespace
}  // namespace siphon::agent::capture
