// The outgoing service against a fake session host and an in-memory client
// (FakePeer): a loopback TCP connect, bytes both ways through the pump, the
// typed resets of a bad request and a refused connect, and the session's
// end closing the socket. No agent server.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <string>

#include "agent/common/unique_fd.h"
#include "agent/outgoing/outgoing_service.h"
#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"
#include "tests/fakes/loopback.h"

namespace siphon::agent::outgoing {
namespace {

using fakes::FakePeer;
using fakes::FakeSessionHost;
using fakes::ServiceHarness;

uint16_t portOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

v1::StreamOpen tcpOpen(const std::string& host, uint32_t port) {
  v1::StreamOpen o;
  o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
  o.mutable_outgoing()->set_host(host);
  o.mutable_outgoing()->set_port(port);
  return o;
}

class OutgoingServiceHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_->on_stream_open = [this](v1::StreamOpen open) { service_->open(host_, std::move(open)); };
  }
  void TearDown() override {
    host_->end();  // closes the pumps
    harness_.poll();
  }

  // Runs the loop and moves frames until `pred` holds (10 s hang guard).
  bool until(const std::function<bool()>& pred) {
    return harness_.runUntil([&] {
      peer_.pipe();
      return pred();
    });
  }

  ServiceHarness harness_;
  std::shared_ptr<StreamService> service_ = makeOutgoingService(harness_.ctx());
  std::shared_ptr<FakeSessionHost> host_ = std::make_shared<FakeSessionHost>();
  FakePeer peer_{*host_};
};

TEST_F(OutgoingServiceHostTest, ATcpConnectIsAcceptedAndPumpsBothWays) {
  UniqueFd listener(fakes::loopbackListener());
  const uint16_t port = portOf(listener.get());
  const uint64_t id = peer_.open(tcpOpen("127.0.0.1", port));
  ASSERT_TRUE(until([&] { return peer_.accepted.contains(id) || peer_.resets.contains(id); }));
  ASSERT_TRUE(peer_.accepted.contains(id)) << peer_.resets[id].message();
  EXPECT_EQ(peer_.accepts[id].remote().port(), port);
  ASSERT_EQ(host_->registered.size(), 1u);
  EXPECT_EQ(host_->registered[0], id) << "the pump is the stream's endpoint";

  UniqueFd app(::accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(app.valid());
  ASSERT_TRUE(peer_.session().sendData(id, "ping").ok());
  peer_.pipe();
  char buf[8] = {};
  ASSERT_EQ(::recv(app.get(), buf, 4, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(buf, 4), "ping");

  ASSERT_EQ(::send(app.get(), "pong", 4, 0), 4);
  ASSERT_TRUE(until([&] { return peer_.data[id] == "pong"; })) << peer_.data[id];
  EXPECT_EQ(host_->sent[id], 4u) << "bytes to the client are counted on the host";

  ::shutdown(app.get(), SHUT_WR);
  EXPECT_TRUE(until([&] { return peer_.half_closed.contains(id); })) << "EOF becomes HalfClose";
}

TEST_F(OutgoingServiceHostTest, AnInvalidRequestIsResetAtOnce) {
  const uint64_t id = peer_.open(tcpOpen("127.0.0.1", 0));
  auto reset = host_->resetOf(id);
  ASSERT_TRUE(reset.has_value()) << "reset through the host, which counts it";
  EXPECT_EQ(reset->code(), v1::INVALID_ARGUMENT);
  EXPECT_NE(reset->message().find("out of range"), std::string::npos) << reset->message();
  EXPECT_TRUE(host_->registered.empty());
  EXPECT_GT(host_->wakes, 0) << "the reset was queued outside a callback: wake";
  peer_.pipe();
  EXPECT_EQ(peer_.resets[id].code(), v1::INVALID_ARGUMENT);

  v1::StreamOpen none;
  none.mutable_outgoing();
  const uint64_t other = peer_.open(none);
  ASSERT_TRUE(host_->resetOf(other).has_value());
  EXPECT_EQ(host_->resetOf(other)->code(), v1::INVALID_ARGUMENT);
}

TEST_F(OutgoingServiceHostTest, ARefusedConnectResetsWithItsErrno) {
  uint16_t closed = 0;
  {
    UniqueFd l(fakes::loopbackListener());
    closed = portOf(l.get());
  }
  const uint64_t id = peer_.open(tcpOpen("127.0.0.1", closed));
  ASSERT_TRUE(until([&] { return peer_.resets.contains(id); }));
  EXPECT_EQ(peer_.resets[id].errno_value(), ECONNREFUSED) << peer_.resets[id].DebugString();
  EXPECT_NE(peer_.resets[id].message().find("127.0.0.1"), std::string::npos);
  EXPECT_FALSE(peer_.accepted.contains(id));
  EXPECT_TRUE(host_->streams.empty()) << "the failed pump let its stream go";
}

TEST_F(OutgoingServiceHostTest, TheSessionsEndClosesTheSocket) {
  UniqueFd listener(fakes::loopbackListener());
  const uint64_t id = peer_.open(tcpOpen("127.0.0.1", portOf(listener.get())));
  ASSERT_TRUE(until([&] { return peer_.accepted.contains(id); }));
  UniqueFd app(::accept(listener.get(), nullptr, nullptr));
  ASSERT_TRUE(app.valid());
  host_->end();
  char c;
  EXPECT_LE(::recv(app.get(), &c, 1, 0), 0) << "the application sees its connection end";
}

}  // namespace
}  // namespace siphon::agent::outgoing
