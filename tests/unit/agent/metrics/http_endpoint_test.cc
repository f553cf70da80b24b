// The --metrics HTTP endpoint on its own event loop: routes, methods,
// hostile requests, slow clients, the connection cap. No root.
#include "agent/metrics/http_endpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <thread>

#include "tests/unit/agent/metrics/http_test_util.h"

namespace siphon::agent::metrics {
namespace {

using testing::get;
using ::testing::HasSubstr;
using testing::httpExchange;

class HttpEndpointTest : public ::testing::Test {
 protected:
  void start(HttpEndpoint::Options options = {}) {
    endpoint_ = std::make_unique<HttpEndpoint>(
        io_.get_executor(),
        HttpEndpoint::Handlers{[] { return std::string("siphon_up 1\n"); },
                               [this] {
                                 std::lock_guard lock(mu_);
                                 return not_ready_;
                               }},
        options);
    absl::Status s = endpoint_->listen("127.0.0.1:0");
    ASSERT_TRUE(s.ok()) << s;
    address_ = endpoint_->address();
    endpoint_->start();
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    if (!thread_.joinable()) return;
    net::asio::post(io_, [this] { endpoint_->stop(); });
    thread_.join();
  }
  void setNotReady(std::string why) {
    std::lock_guard lock(mu_);
    not_ready_ = std::move(why);
  }

  net::asio::io_context io_;
  std::unique_ptr<HttpEndpoint> endpoint_;
  std::thread thread_;
  std::string address_;
  std::mutex mu_;
  std::string not_ready_ = "the target is not entered yet";
};

TEST_F(HttpEndpointTest, ServesMetricsHealthAndReadiness) {
  start();
  auto m = get(address_, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_THAT(m.head, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_EQ(m.body, "siphon_up 1\n");
  auto h = get(address_, "/healthz");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.body, "ok\n");

  // Before ready, ready, draining.
  auto before = get(address_, "/readyz");
  EXPECT_EQ(before.status, 503);
  EXPECT_THAT(before.body, HasSubstr("the target is not entered yet"));
  setNotReady("");
  auto ready = get(address_, "/readyz");
  EXPECT_EQ(ready.status, 200);
  setNotReady("draining (SIGTERM)");
  auto draining = get(address_, "/readyz?verbose=1");
  EXPECT_EQ(draining.status, 503);
  EXPECT_THAT(draining.body, HasSubstr("draining (SIGTERM)"));
}

TEST_F(HttpEndpointTest, UnknownPathsAndMethodsAreRefused) {
  start();
  EXPECT_EQ(get(address_, "/").status, 404);
  EXPECT_EQ(get(address_, "/metrics/extra").status, 404);
  auto post = get(address_, "/metrics", "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_THAT(post.head, HasSubstr("Allow: GET, HEAD"));
  EXPECT_EQ(get(address_, "/healthz", "DELETE").status, 405);
  auto head = get(address_, "/healthz", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
}

TEST_F(HttpEndpointTest, GarbageAndOversizedRequestsGetABadRequest) {
  start();
  auto garbage = httpExchange(address_, "\x16\x03\x01 hello there\r\n\r\n");
  EXPECT_EQ(garbage.status, 400);
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(64 << 10, 'a') + "\r\n\r\n";
  auto big = httpExchange(address_, huge);
  EXPECT_EQ(big.status, 400);
  auto body = httpExchange(
      address_, "GET /metrics HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + std::string(5000, 'x'));
  EXPECT_EQ(body.status, 400);
  // The endpoint still serves.
  EXPECT_EQ(get(address_, "/healthz").status, 200);
}

TEST_F(HttpEndpointTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  start();
  int fd = testing::connectTo(address_);
  ASSERT_GE(fd, 0);
  const std::string reqs =
      "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nGET /metrics HTTP/1.1\r\nHost: a\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, reqs.data(), reqs.size(), MSG_NOSIGNAL), static_cast<ssize_t>(reqs.size()));
  const std::string raw = testing::readAll(fd);
  ::close(fd);
  EXPECT_THAT(raw, HasSubstr("ok\n"));
  EXPECT_THAT(raw, HasSubstr("siphon_up 1\n"));
}

TEST_F(HttpEndpointTest, ASlowClientBlocksNobodyAndIsCutOff) {
  HttpEndpoint::Options o;
  o.io_timeout = std::chrono::milliseconds(300);
  start(o);
  int slow = testing::connectTo(address_);
  ASSERT_GE(slow, 0);
  const std::string part = "GET /metr";
  ASSERT_EQ(::send(slow, part.data(), part.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(part.size()));
  // Others are served while it dawdles.
  EXPECT_EQ(get(address_, "/healthz").status, 200);
  // The endpoint closes it at its deadline: EOF without an answer.
  const std::string got = testing::readAll(slow);
  ::close(slow);
  EXPECT_EQ(got, "");
}

TEST_F(HttpEndpointTest, ConnectionsPastTheCapAreClosed) {
  HttpEndpoint::Options o;
  o.max_connections = 1;
  start(o);
  int held = testing::connectTo(address_);
  ASSERT_GE(held, 0);
  // The held connection is served (so it is counted) before the next one.
  const std::string req = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
  ASSERT_EQ(::send(held, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  char buf[512];
  ASSERT_GT(::recv(held, buf, sizeof buf, 0), 0);
  EXPECT_EQ(get(address_, "/healthz").status, 0);  // closed unanswered
  ::close(held);
}

TEST(HttpEndpointListenTest, BadAddressesAreTypedErrors) {
  net::asio::io_context io;
  HttpEndpoint e(io.get_executor(), {});
  EXPECT_EQ(e.listen("localhost:9090").code(), absl::StatusCode::kInvalidArgument);
  HttpEndpoint f(io.get_executor(), {});
  EXPECT_FALSE(f.listen("127.0.0.1:99999").ok());
  HttpEndpoint g(io.get_executor(), {});
  ASSERT_TRUE(g.listen("127.0.0.1:0").ok());
  HttpEndpoint h(io.get_executor(), {});
  absl::Status busy = h.listen(g.address());
  EXPECT_FALSE(busy.ok());
  EXPECT_THAT(std::string(busy.message()), HasSubstr("cannot serve metrics on"));
}

}  // namespace
}  // namespace siphon::agent::metrics
