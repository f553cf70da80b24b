// The steal service against fake session hosts and a fake steering: the
// request checks, the subscription bookkeeping (PORT_BUSY, ownership, the
// session's end giving the port back, `siphon sessions`), the drain's
// refusal, and one stolen connection delivered as a stream the agent opens
// on the host. No agent server, no root.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/unique_fd.h"
#include "agent/outgoing/address.h"
#include "agent/steal/steal_service.h"
#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"

namespace siphon::agent::steal {
namespace {

using fakes::FakePeer;
using fakes::FakeSessionHost;
using fakes::ServiceHarness;

// What the service asked of the kernel (calls come from the blocking pool).
struct Kernel {
  std::mutex mu;
  std::vector<std::string> calls;
  uint16_t listener_port = 0;
  std::atomic<uint16_t> original_port{0};

  void record(std::string s) {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back(std::move(s));
  }
  bool saw(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    return std::find(calls.begin(), calls.end(), s) != calls.end();
  }
};

class RecordingSteering : public Steering {
 public:
  explicit RecordingSteering(std::shared_ptr<Kernel> k) : k_(std::move(k)) {}
  std::string_view name() const override { return "recording"; }
  absl::Status addPort(uint16_t port) override {
    k_->record(absl::StrCat("add ", port));
    return absl::OkStatus();
  }
  absl::Status removePort(uint16_t port) override {
    k_->record(absl::StrCat("remove ", port));
    return absl::OkStatus();
  }
  absl::Status exempt(int) override { return absl::OkStatus(); }
  void unexempt(int) override {}
  absl::StatusOr<SockAddr> originalDestination(int fd) override {
    ASSIGN_OR_RETURN(SockAddr a, outgoing::localAddress(fd));
    reinterpret_cast<sockaddr_in*>(&a.storage)->sin_port = htons(k_->original_port);
    return a;
  }
  void stop() override { k_->record("stop"); }

 private:
  std::shared_ptr<Kernel> k_;
};

v1::Request stealReq(uint64_t id, uint32_t port) {
  v1::Request r;
  r.set_request_id(id);
  r.mutable_steal()->set_port(port);
  return r;
}
v1::Request unsubscribeReq(uint64_t id, uint64_t subscription) {
  v1::Request r;
  r.set_request_id(id);
  r.mutable_unsubscribe()->set_subscription_id(subscription);
  return r;
}

// A steal service on `harness` whose steering records into `kernel` (the
// new agent's, in a handover test).
std::shared_ptr<StealService> recordingStealService(ServiceHarness& harness,
                                                    std::shared_ptr<Kernel> kernel) {
  return makeStealService(
      harness.ctx(),
      [kernel](const Listeners& l) -> absl::StatusOr<std::unique_ptr<Steering>> {
        kernel->listener_port = l.v4_port;  // read once Subscribed is back
        return std::make_unique<RecordingSteering>(kernel);
      },
      [](uint16_t) -> absl::StatusOr<int> { return 0; });
}

class StealServiceHostTest : public ::testing::Test {
 protected:
  void TearDown() override {
    a_->end();
    b_->end();
    service_->agentStopping();
    harness_.poll();
  }

  // `request` from `host`, and its answer once it came (10 s hang guard).
  v1::Response call(const std::shared_ptr<FakeSessionHost>& host, v1::Request request) {
    const uint64_t id = request.request_id();
    EXPECT_FALSE(host->response(id).has_value()) << "request ids are unique per host";
    service_->handle(host, std::move(request));
    EXPECT_TRUE(harness_.runUntil([&] { return host->response(id).has_value(); }));
    auto r = host->response(id);
    return r ? *r : v1::Response{};
  }

  // A client connection to the steal's listener (as the steering would
  // bring one); invalid when the connect failed.
  UniqueFd connectToTheSteal() {
    UniqueFd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(kernel_->listener_port);
    if (::connect(client.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) return {};
    return client;
  }

  ServiceHarness harness_;
  std::shared_ptr<Kernel> kernel_ = std::make_shared<Kernel>();
  std::shared_ptr<StealService> service_ = recordingStealService(harness_, kernel_);
  std::shared_ptr<FakeSessionHost> a_ = std::make_shared<FakeSessionHost>("session-a", "alice");
  std::shared_ptr<FakeSessionHost> b_ = std::make_shared<FakeSessionHost>("session-b", "bob");
};

TEST_F(StealServiceHostTest, RequestsAreCheckedBeforeTheSteeringStarts) {
  v1::Response zero = call(a_, stealReq(1, 0));
  EXPECT_EQ(zero.error().code(), v1::INVALID_ARGUMENT) << zero.DebugString();
  v1::Response big = call(a_, stealReq(2, 70000));
  EXPECT_EQ(big.error().code(), v1::INVALID_ARGUMENT);

  v1::Request bad_filter = stealReq(3, 8080);
  bad_filter.mutable_steal()->mutable_http_filter();  // no test set
  v1::Response f = call(a_, std::move(bad_filter));
  EXPECT_EQ(f.error().code(), v1::INVALID_ARGUMENT) << f.DebugString();
  EXPECT_EQ(f.error().message().rfind("steal port 8080: ", 0), 0u) << f.error().message();

  std::lock_guard<std::mutex> l(kernel_->mu);
  EXPECT_TRUE(kernel_->calls.empty()) << "nothing reached the kernel";
}

TEST_F(StealServiceHostTest, SubscriptionsAreExclusiveOwnedAndEndWithTheirSession) {
  v1::Response ok = call(a_, stealReq(1, 8080));
  ASSERT_TRUE(ok.has_subscribed()) << ok.DebugString();
  const uint64_t sub = ok.subscribed().subscription_id();
  EXPECT_EQ(ok.subscribed().backend(), "recording");
  EXPECT_TRUE(kernel_->saw("add 8080"));
  EXPECT_TRUE(service_->ownsSubscription(sub, "session-a"));
  EXPECT_FALSE(service_->ownsSubscription(sub, "session-b"));

  v1::Response busy = call(b_, stealReq(1, 8080));
  EXPECT_EQ(busy.error().code(), v1::PORT_BUSY) << busy.DebugString();

  google::protobuf::RepeatedPtrField<v1::SubscriptionSummary> listed;
  service_->describeSubscriptions("session-a", &listed);
  ASSERT_EQ(listed.size(), 1);
  EXPECT_EQ(listed[0].port(), 8080u);
  EXPECT_EQ(listed[0].kind(), "steal");
  EXPECT_EQ(listed[0].backend(), "recording");

  v1::Response not_yours = call(b_, unsubscribeReq(2, sub));
  EXPECT_TRUE(not_yours.has_error()) << "bob cannot give alice's port back";

  a_->end();
  service_->sessionEnded("session-a");
  ASSERT_TRUE(harness_.runUntil([&] { return kernel_->saw("remove 8080"); }));
  EXPECT_FALSE(service_->ownsSubscription(sub, "session-a"));
  v1::Response now = call(b_, stealReq(3, 8080));
  EXPECT_TRUE(now.has_subscribed()) << "the port is free again: " << now.DebugString();
}

TEST_F(StealServiceHostTest, UnsubscribeAnswersOnceThePortIsBack) {
  const uint64_t sub = call(a_, stealReq(1, 9090)).subscribed().subscription_id();
  ASSERT_NE(sub, 0u);
  v1::Response r = call(a_, unsubscribeReq(2, sub));
  EXPECT_TRUE(r.has_unsubscribed()) << r.DebugString();
  EXPECT_TRUE(kernel_->saw("remove 9090")) << "removed before the answer";
  google::protobuf::RepeatedPtrField<v1::SubscriptionSummary> listed;
  service_->describeSubscriptions("session-a", &listed);
  EXPECT_TRUE(listed.empty());
}

TEST_F(StealServiceHostTest, ADrainRefusesNewSubscriptions) {
  service_->agentDraining();
  v1::Response r = call(a_, stealReq(1, 8080));
  EXPECT_EQ(r.error().code(), v1::AGENT_DRAINING) << r.DebugString();
}

TEST_F(StealServiceHostTest, AStolenConnectionBecomesAStreamOnTheHost) {
  FakePeer peer(*a_);
  ASSERT_TRUE(call(a_, stealReq(1, 8080)).has_subscribed());
  kernel_->original_port = 8080;
  UniqueFd client = connectToTheSteal();
  ASSERT_TRUE(client.valid());

  ASSERT_TRUE(harness_.runUntil([&] {
    peer.pipe();
    return !peer.opens.empty();
  }));
  ASSERT_EQ(a_->opened.size(), 1u) << "opened through the host, which counts its kind";
  const v1::StreamOpen& open = peer.opens[0];
  EXPECT_TRUE(open.has_stolen());
  EXPECT_EQ(open.stolen().destination().port(), 8080u);
  EXPECT_NE(a_->endpoint(open.stream_id()), nullptr) << "its pump is registered";

  ASSERT_EQ(::send(client.get(), "GET /", 5, 0), 5);
  EXPECT_TRUE(harness_.runUntil([&] {
    peer.pipe();
    return peer.data[open.stream_id()] == "GET /";
  })) << peer.data[open.stream_id()];
}

// A handover (docs/CONTINUITY.md section 8) of a connection being passed
// through to the application (its session went before it was accepted):
// the application reads nothing for a while, so the splice holds bytes it
// read from the client and could not write; the freeze parks it, the
// export carries both sockets and those bytes, and a new service goes on:
// the application gets every byte in order, its answer reaches the client,
// and both ends' EOFs pass.
TEST_F(StealServiceHostTest, APassthroughMovesWithTheBytesItHeld) {
  UniqueFd app(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof at;
  ASSERT_EQ(::bind(app.get(), reinterpret_cast<sockaddr*>(&at), sizeof at), 0);
  ASSERT_EQ(::listen(app.get(), 4), 0);
  ASSERT_EQ(::getsockname(app.get(), reinterpret_cast<sockaddr*>(&at), &len), 0);

  ASSERT_TRUE(call(a_, stealReq(1, 8080)).has_subscribed());
  a_->end();  // gone, its subscription not yet: the next connection passes through
  kernel_->original_port = ntohs(at.sin_port);
  UniqueFd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in to = at;
  to.sin_port = htons(kernel_->listener_port);
  ASSERT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  UniqueFd upstream;
  ASSERT_TRUE(harness_.runUntil([&] {
    if (!upstream.valid()) upstream.reset(::accept4(app.get(), nullptr, nullptr, SOCK_CLOEXEC));
    return upstream.valid();
  })) << "no passthrough reached the application";
  ::fcntl(client.get(), F_SETFL, O_NONBLOCK);

  // The client writes until nothing more goes: the application's buffer,
  // then the splice's, then the client's are full.
  std::string sent;
  std::string chunk(64 << 10, '\0');
  uint32_t x = 1;
  for (int idle = 0; idle < 20;) {
    for (char& c : chunk) c = static_cast<char>(x = x * 1103515245 + 12345);
    const ssize_t n = ::send(client.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n > 0) {
      sent.append(chunk.data(), static_cast<size_t>(n));
      idle = 0;
    } else {
      ++idle;
    }
    harness_.poll();
  }
  ASSERT_GT(sent.size(), 0u);

  service_->freeze();
  ASSERT_TRUE(harness_.runUntil([&] { return service_->handoverBlocker().empty(); }))
      << service_->handoverBlocker();
  v1::AgentState state;
  std::vector<UniqueFd> fds;
  absl::Status exported = service_->exportState(&state, &fds);
  ASSERT_TRUE(exported.ok()) << exported;
  ASSERT_EQ(state.steal().passthroughs_size(), 1);
  EXPECT_GT(state.steal().passthroughs(0).client_to_application().size(), 0u)
      << "the splice held bytes it had not written";

  ServiceHarness harness;
  auto kernel = std::make_shared<Kernel>();
  auto service = recordingStealService(harness, kernel);
  auto moved = std::make_shared<FakeSessionHost>("session-a", "alice");
  absl::Status imported = service->importState(state, fds, {{"session-a", moved}});
  ASSERT_TRUE(imported.ok()) << imported;
  service_->agentStopping();  // the old agent is gone (it exits)
  harness_.poll();
  service->startAfterHandover();

  // The application reads everything, in order, and answers.
  ::fcntl(upstream.get(), F_SETFL, O_NONBLOCK);
  ::shutdown(client.get(), SHUT_WR);
  std::string got;
  bool eof = false;
  ASSERT_TRUE(harness.runUntil([&] {
    char buf[64 << 10];
    ssize_t n = -1;
    while (!eof && (n = ::recv(upstream.get(), buf, sizeof buf, 0)) > 0) {
      got.append(buf, static_cast<size_t>(n));
    }
    if (!eof && n == 0) eof = true;
    return eof;
  })) << "the application got " << got.size() << " of " << sent.size() << " bytes and no EOF";
  EXPECT_EQ(got.size(), sent.size());
  EXPECT_TRUE(got == sent) << "the bytes differ";
  ASSERT_EQ(::send(upstream.get(), "answer", 6, MSG_NOSIGNAL), 6);
  ::shutdown(upstream.get(), SHUT_WR);
  std::string back;
  bool back_eof = false;
  ASSERT_TRUE(harness.runUntil([&] {
    char buf[64];
    ssize_t n = -1;
    while (!back_eof && (n = ::recv(client.get(), buf, sizeof buf, 0)) > 0) {
      back.append(buf, static_cast<size_t>(n));
    }
    if (n == 0) back_eof = true;
    return back_eof;
  })) << back;
  EXPECT_EQ(back, "answer");
  moved->end();
  service->agentStopping();
  harness.poll();
}

// A handover of a filtered steal: the preparation parks its HTTP
// connection once the stolen request is answered, and waits for the
// request's stream to end (the client's half-close, which follows its
// answer); the export carries the filter and the parked connection with
// what it had read of the next request; a new service routes that request
// by the same filter, on the same connection, counting on from 1.
TEST_F(StealServiceHostTest, AFilteredStealsParkedConnectionMovesWithItsFilter) {
  FakePeer peer(*a_);
  v1::Request subscribe = stealReq(1, 8080);
  subscribe.mutable_steal()->mutable_http_filter()->set_path_regex("^/steal");
  ASSERT_TRUE(call(a_, subscribe).has_subscribed());
  kernel_->original_port = 8080;
  UniqueFd client = connectToTheSteal();
  ASSERT_TRUE(client.valid());
  const std::string first = "GET /steal1 HTTP/1.1\r\nHost: t\r\n\r\n";
  ASSERT_EQ(::send(client.get(), first.data(), first.size(), 0),
            static_cast<ssize_t>(first.size()));
  ASSERT_TRUE(harness_.runUntil([&] {
    peer.pipe();
    return !peer.opens.empty() && peer.half_closed.count(peer.opens[0].stream_id()) > 0;
  }));
  const uint64_t stream = peer.opens[0].stream_id();
  EXPECT_EQ(peer.opens[0].stolen_request().path(), "/steal1");
  const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  ASSERT_TRUE(peer.session().sendData(stream, answer).ok());
  peer.pipe();
  ::fcntl(client.get(), F_SETFL, O_NONBLOCK);
  std::string got;
  ASSERT_TRUE(harness_.runUntil([&] {
    char buf[256];
    const ssize_t n = ::recv(client.get(), buf, sizeof buf, 0);
    if (n > 0) got.append(buf, static_cast<size_t>(n));
    return got.size() >= 40 && got.ends_with("ok");
  })) << got;

  service_->prepareHandover();
  // Parked, but the answered request's stream waits for the client's
  // half-close.
  ASSERT_TRUE(harness_.runUntil([&] {
    return service_->handoverBlocker().find("stolen HTTP requests ending") != std::string::npos;
  })) << service_->handoverBlocker();
  ASSERT_TRUE(peer.session().halfClose(stream).ok());
  peer.pipe();
  ASSERT_TRUE(harness_.runUntil([&] { return service_->handoverBlocker().empty(); }))
      << service_->handoverBlocker();
  // Half of the next request, before the freeze: read now or not, it moves.
  ASSERT_EQ(::send(client.get(), "GET /steal2 HTTP/1.1\r\n", 22, 0), 22);
  harness_.poll();
  service_->freeze();
  ASSERT_TRUE(harness_.runUntil([&] { return service_->handoverBlocker().empty(); }));
  v1::AgentState state;
  std::vector<UniqueFd> fds;
  absl::Status exported = service_->exportState(&state, &fds);
  ASSERT_TRUE(exported.ok()) << exported;
  ASSERT_EQ(state.steal().subscriptions_size(), 1);
  EXPECT_EQ(state.steal().subscriptions(0).http_filter().path_regex(), "^/steal");
  ASSERT_EQ(state.steal().http_connections_size(), 1);
  EXPECT_EQ(state.steal().http_connections(0).requests(), 1u);
  EXPECT_FALSE(state.steal().http_connections(0).detecting());

  ServiceHarness harness;
  auto kernel = std::make_shared<Kernel>();
  kernel->original_port = 8080;
  auto service = recordingStealService(harness, kernel);
  auto moved = std::make_shared<FakeSessionHost>("session-a", "alice");
  FakePeer moved_peer(*moved);
  absl::Status imported = service->importState(state, fds, {{"session-a", moved}});
  ASSERT_TRUE(imported.ok()) << imported;
  service_->agentStopping();  // the old agent is gone (it exits)
  harness_.poll();
  service->startAfterHandover();

  ASSERT_EQ(::send(client.get(), "Host: t\r\n\r\n", 11, 0), 11);
  ASSERT_TRUE(harness.runUntil([&] {
    moved_peer.pipe();
    return !moved_peer.opens.empty();
  }));
  const v1::StolenRequest& second = moved_peer.opens[0].stolen_request();
  EXPECT_EQ(second.path(), "/steal2");
  EXPECT_EQ(second.connection_request(), 2u);
  moved->end();
  service->agentStopping();
  harness.poll();
}

}  // namespace
}  // namespace siphon::agent::steal
