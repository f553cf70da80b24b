// serveHttp2() against real loopback sockets: a fake router that steals
// requests carrying "x-steal", fake sessions on the StolenRequest
// socketpairs (threads speaking HTTP/1.1), an h2c application server
// (http2_test_peer.h), and HTTP/2 clients (ours, nghttp, h2load).
//
// Over 600 lines: one engine's cases sharing the harness below.
#include <gtest/gtest.h>
#include <strings.h>
#include <sys/socket.h>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <future>
#include <random>
#include <sstream>

#include "agent/common/log.h"
#include "agent/outgoing/address.h"
#include "agent/steal/http/http2.h"
#include "tests/fakes/eventually.h"
#include "tests/unit/agent/steal/http/http2_test_peer.h"

namespace siphon::agent::steal::http {
namespace {

namespace asio = net::asio;
namespace bhttp = boost::beast::http;
using testing::H2AppServer;
using testing::H2Client;
using testing::headerValue;
using testing::TestRequest;
using testing::TestResponse;

std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

void writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// A stolen request as the fake session read it.
struct SessionRequest {
  bhttp::request<bhttp::string_body> msg;
  bool chunked = false;
  bool has_length = false;
  bool ok = false;
};

// Reads one HTTP/1.1 request from the session's end (blocking). Trailers
// land in the message's fields (Beast appends them).
SessionRequest readSessionRequest(int fd) {
  SessionRequest out;
  asio::io_context io;
  asio::posix::stream_descriptor sd(io, ::dup(fd));
  boost::beast::flat_buffer buf;
  bhttp::request_parser<bhttp::string_body> p;
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::system::error_code ec;
  bhttp::read_header(sd, buf, p, ec);
  if (ec) return out;
  out.chunked = p.chunked();
  out.has_length = p.content_length().has_value();
  bhttp::read(sd, buf, p, ec);
  if (ec) return out;
  out.msg = p.release();
  out.ok = true;
  return out;
}

// The usual session: echoes the body; tells what it saw in headers; a
// chunked response with a trailer when asked ("x-want-trailers"); a 100
// Continue first when asked ("x-want-100").
void echoSession(int fd, RequestHead) {
  SessionRequest r = readSessionRequest(fd);
  if (!r.ok) return;
  const auto& m = r.msg;
  std::string head = "HTTP/1.1 200 OK\r\nX-Session: yes\r\nConnection: keep-alive, X-Hop\r\n";
  head += "X-Hop: dropped\r\n";
  head += "X-Got-Target: " + std::string(m.target()) + "\r\n";
  head += "X-Got-Host: " + std::string(m[bhttp::field::host]) + "\r\n";
  head += "X-Got-Framing: " +
          std::string(r.chunked      ? "chunked"
                      : r.has_length ? "length"
                                     : "none") +
          "\r\n";
  head += "X-Got-Trailer: " + std::string(m["x-req-trailer"]) + "\r\n";
  head += "X-Got-Cookie: " + std::string(m[bhttp::field::cookie]) + "\r\n";
  std::string out;
  if (m.method() == bhttp::verb::head) {
    // The length a GET would have; no body follows.
    writeAll(fd, head + "Content-Length: 1234\r\n\r\n");
    return;
  }
  if (m.count("x-want-100") > 0) out += "HTTP/1.1 100 Continue\r\n\r\n";
  if (m.count("x-want-trailers") > 0) {
    out += head + "Transfer-Encoding: chunked\r\nTrailer: X-Session-Trailer\r\n\r\n";
    const std::string& b = m.body();
    for (size_t i = 0; i < b.size(); i += 10000) {
      const std::string piece = b.substr(i, 10000);
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
      out += size + piece + "\r\n";
    }
    out += "0\r\nX-Session-Trailer: done\r\n\r\n";
  } else {
    out += head + "Content-Length: " + std::to_string(m.body().size()) + "\r\n\r\n" + m.body();
  }
  writeAll(fd, out);
}

class FakeRouter : public HttpRouter {
 public:
  using Session = std::function<void(int fd, RequestHead head)>;

  ~FakeRouter() override { joinSessions(); }

  std::optional<Route> route(uint16_t, const RequestHead& head) override {
    std::lock_guard lock(mu_);
    routed_.push_back(head);
    if (head.values("x-steal").empty()) return std::nullopt;
    return Route{7, {}};
  }

  absl::StatusOr<std::shared_ptr<StolenStream>> openStolenRequest(
      net::asio::any_io_executor ex, const Route&, const ConnectionInfo&, const RequestHead& head,
      uint64_t n) override {
    if (refuse_sessions) return absl::UnavailableError("no session");
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return absl::InternalError("socketpair");
    }
    ::fcntl(sv[0], F_SETFL, ::fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    std::lock_guard lock(mu_);
    connection_requests_.push_back(n);
    sessions_.emplace_back([fn = session, fd = sv[1], head] {
      fn(fd, head);
      ::close(fd);
    });
    return socketStolenStream(ex, UniqueFd(sv[0]));
  }

  net::awaitable<absl::StatusOr<UniqueFd>> connectApplication(SockAddr destination) override {
    ++app_connects;
    net::tcp::socket s(co_await asio::this_coro::executor);
    net::error_code ec;
    co_await s.async_connect(
        net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), outgoing::portOf(destination)),
        asio::redirect_error(net::use_awaitable, ec));
    if (ec) co_return absl::UnavailableError(ec.message());
    s.non_blocking(true);
    co_return UniqueFd(s.release());
  }

  void joinSessions() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      threads = std::move(sessions_);
    }
    for (auto& t : threads) t.join();
  }
  std::vector<RequestHead> routed() {
    std::lock_guard lock(mu_);
    return routed_;
  }
  std::vector<uint64_t> connectionRequests() {
    std::lock_guard lock(mu_);
    return connection_requests_;
  }

  Session session = echoSession;
  bool refuse_sessions = false;
  std::atomic<int> app_connects{0};

 private:
  std::mutex mu_;
  std::vector<RequestHead> routed_;
  std::vector<uint64_t> connection_requests_;
  std::vector<std::thread> sessions_;
};

class Http2EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // SIPHON_TEST_LOG=debug shows the engine's debug events.
    if (const char* level = std::getenv("SIPHON_TEST_LOG"))
      (void)log::init(log::Format::kText, level);
  }
  // Runs `f` on the loop and waits for its result.
  template <typename F>
  auto onLoop(F f) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    asio::post(io_, [&task] { task(); });
    return fut.get();
  }

  void SetUp() override {
    work_.emplace(io_.get_executor());
    loop_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override {
    if (state_) {
      onLoop([this] {
        state_->stopped = true;
        auto conns = state_->connections;
        for (LiveConnection* c : conns) c->abort();
        net::error_code ec;
        acceptor_->close(ec);
      });
    }
    router_.joinSessions();
    work_.reset();
    io_.stop();
    loop_.join();
  }

  // Serves HTTP/2 on a loopback port; `upgrade`: each connection begins
  // with an HTTP/1.1 h2c upgrade request, read here as the HTTP/1 side would.
  // start(), with sessions that answer (echo) only once `released` is.
  void startWithSessionsHeld(std::shared_future<void> released) {
    router_.session = [released](int fd, RequestHead head) {
      released.wait();
      echoSession(fd, head);
    };
    start();
  }

  void start(HttpOptions options = {}, bool upgrade = false) {
    state_ = std::make_shared<EngineState>(io_.get_executor(), router_, options);
    onLoop([this, upgrade] {
      acceptor_.emplace(io_, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
      port_ = acceptor_->local_endpoint().port();
      asio::co_spawn(
          io_, [this, upgrade]() { return acceptLoop(upgrade); }, asio::detached);
    });
  }

  net::awaitable<void> acceptLoop(bool upgrade) {
    for (;;) {
      net::error_code ec;
      net::tcp::socket s =
          co_await acceptor_->async_accept(asio::redirect_error(net::use_awaitable, ec));
      if (ec) co_return;
      ConnectionInfo info;
      info.source = *outgoing::ipAddress("127.0.0.1", s.remote_endpoint().port());
      info.destination = *outgoing::ipAddress("127.0.0.1", app_.port());
      info.port = app_.port();
      if (!upgrade) {
        serveHttp2(state_, UniqueFd(s.release()), info, "", std::nullopt);
        continue;
      }
      asio::streambuf buf;
      const size_t n = co_await asio::async_read_until(
          s, buf, "\r\n\r\n", asio::redirect_error(net::use_awaitable, ec));
      if (ec) continue;
      std::string all(asio::buffers_begin(buf.data()), asio::buffers_end(buf.data()));
      std::string text = all.substr(0, n);
      H2cUpgrade up;
      std::istringstream lines(text);
      std::string line;
      std::getline(lines, line);
      std::istringstream first(line);
      first >> up.head.method >> up.head.target;
      while (std::getline(lines, line) && line != "\r") {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string name = line.substr(0, colon);
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        if (::strcasecmp(name.c_str(), "http2-settings") == 0) up.settings = value;
        up.head.headers.emplace_back(name, value);
      }
      serveHttp2(state_, UniqueFd(s.release()), info, all.substr(n), std::move(up));
    }
  }

  // After start(): a new listener (port_) instead, whose next connection
  // alone is served, as one to the application at `app_port` rather than
  // app_.
  void serveOneFor(uint16_t app_port) {
    onLoop([&] {
      acceptor_->close();
      acceptor_.emplace(io_, net::tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
      port_ = acceptor_->local_endpoint().port();
      asio::co_spawn(
          io_,
          [this, app_port]() -> net::awaitable<void> {
            net::tcp::socket s = co_await acceptor_->async_accept(net::use_awaitable);
            ConnectionInfo info;
            info.destination = *outgoing::ipAddress("127.0.0.1", app_port);
            info.port = app_port;
            serveHttp2(state_, UniqueFd(s.release()), info, "", std::nullopt);
          },
          asio::detached);
    });
  }

  size_t connectionsNow() {
    return onLoop([this] { return state_->connections.size(); });
  }

  // Waits (bounded: a hang guard) until `pred` holds, checked on the loop.
  bool eventually(std::function<bool()> pred) {
    return fakes::eventually([&] { return onLoop(pred); }, std::chrono::seconds(10),
                             std::chrono::milliseconds(5));
  }

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread loop_;
  H2AppServer app_;
  FakeRouter router_;
  std::shared_ptr<EngineState> state_;
  std::optional<net::tcp::acceptor> acceptor_;
  uint16_t port_ = 0;
};

TestRequest get(std::string path, bool steal) {
  TestRequest r;
  r.path = std::move(path);
  if (steal) r.headers.emplace_back("x-steal", "me");
  return r;
}

TEST_F(Http2EngineTest, RoutesEachStreamOfOneConnection) {
  start();
  H2Client client(port_);
  std::vector<int32_t> ids;
  for (int i = 0; i < 20; ++i)
    ids.push_back(client.submit(get("/r" + std::to_string(i), i % 2 == 0)));
  ASSERT_TRUE(client.run()) << client.error();
  for (int i = 0; i < 20; ++i) {
    TestResponse& r = client.response(ids[i]);
    EXPECT_EQ(r.status, 200) << i;
    EXPECT_EQ(r.error_code, 0u) << i;
    if (i % 2 == 0) {
      EXPECT_EQ(headerValue(r.headers, "x-session"), "yes") << i;
      EXPECT_EQ(headerValue(r.headers, "x-got-target"), "/r" + std::to_string(i));
      EXPECT_EQ(headerValue(r.headers, "x-got-host"), "app.test");
      EXPECT_EQ(headerValue(r.headers, "x-got-framing"), "none");
      // Connection-specific headers of the HTTP/1.1 response are not passed on.
      EXPECT_EQ(headerValue(r.headers, "x-hop"), "");
      EXPECT_EQ(headerValue(r.headers, "connection"), "");
    } else {
      EXPECT_EQ(headerValue(r.headers, "x-app"), "yes") << i;
      EXPECT_EQ(headerValue(r.headers, "x-app-path"), "/r" + std::to_string(i));
    }
  }
  EXPECT_EQ(app_.streams(), 10);
  EXPECT_EQ(router_.app_connects.load(), 1);
  auto routed = router_.routed();
  ASSERT_EQ(routed.size(), 20u);
  EXPECT_EQ(routed[0].version, 20);
  EXPECT_EQ(routed[0].method, "GET");
  EXPECT_EQ(routed[0].target, "/r0");
  ASSERT_FALSE(routed[0].values("host").empty());
  EXPECT_EQ(routed[0].values("host")[0], "app.test");
  for (const auto& [name, value] : routed[0].headers) EXPECT_FALSE(name.starts_with(':'));
  // Positions on the connection: the stolen ones are 1, 3, 5...
  auto positions = router_.connectionRequests();
  std::sort(positions.begin(), positions.end());
  ASSERT_EQ(positions.size(), 10u);
  EXPECT_EQ(positions.front(), 1u);
  EXPECT_EQ(positions.back(), 19u);
}

TEST_F(Http2EngineTest, BodiesLargerThanWindowsAreByteExactBothWays) {
  start();
  H2Client client(port_);
  const std::string big = randomBytes(3 * 1024 * 1024 + 17, 1);
  TestRequest to_session = get("/up", true);
  to_session.method = "POST";
  to_session.body = big;
  TestRequest to_session_len = to_session;
  to_session_len.headers.emplace_back("content-length", std::to_string(big.size()));
  TestRequest to_app = get("/up", false);
  to_app.method = "POST";
  to_app.body = big;
  const int32_t a = client.submit(to_session);
  const int32_t b = client.submit(to_session_len);
  const int32_t c = client.submit(to_app);
  ASSERT_TRUE(client.run(std::chrono::seconds(60))) << client.error();
  EXPECT_EQ(client.response(a).status, 200);
  EXPECT_EQ(headerValue(client.response(a).headers, "x-got-framing"), "chunked");
  EXPECT_TRUE(client.response(a).body == big) << client.response(a).body.size();
  EXPECT_EQ(client.response(b).status, 200);
  EXPECT_EQ(headerValue(client.response(b).headers, "x-got-framing"), "length");
  EXPECT_TRUE(client.response(b).body == big) << client.response(b).body.size();
  EXPECT_EQ(client.response(c).status, 200);
  EXPECT_EQ(headerValue(client.response(c).headers, "x-app"), "yes");
  EXPECT_TRUE(client.response(c).body == big) << client.response(c).body.size();
}

TEST_F(Http2EngineTest, TrailersPassBothWays) {
  start();
  H2Client client(port_);
  TestRequest to_app = get("/grpc", false);
  to_app.method = "POST";
  to_app.headers.emplace_back("te", "trailers");
  to_app.body = "hello";
  to_app.trailers = {{"x-req-trailer", "from-client"}};
  TestRequest to_session = get("/grpc", true);
  to_session.method = "POST";
  to_session.headers.emplace_back("x-want-trailers", "1");
  to_session.body = randomBytes(100000, 2);
  to_session.trailers = {{"x-req-trailer", "to-session"}};
  const int32_t a = client.submit(to_app);
  const int32_t s = client.submit(to_session);
  ASSERT_TRUE(client.run()) << client.error();

  EXPECT_EQ(client.response(a).status, 200);
  EXPECT_EQ(client.response(a).body, "hello");
  EXPECT_EQ(headerValue(client.response(a).trailers, "x-app-trailer"), "from-client");
  auto seen = app_.requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(headerValue(seen[0], "te"), "trailers");

  TestResponse& r = client.response(s);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(headerValue(r.headers, "x-got-trailer"), "to-session");
  EXPECT_EQ(headerValue(r.headers, "x-got-framing"), "chunked");
  EXPECT_EQ(headerValue(r.trailers, "x-session-trailer"), "done");
  EXPECT_TRUE(r.body == *to_session.body);
}

TEST_F(Http2EngineTest, InterimResponsesAreSkippedAndCookiesJoined) {
  start();
  H2Client client(port_);
  TestRequest req = get("/c", true);
  req.headers.emplace_back("x-want-100", "1");
  req.headers.emplace_back("cookie", "a=1");
  req.headers.emplace_back("cookie", "b=2");
  const int32_t id = client.submit(req);
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 200);
  EXPECT_EQ(headerValue(client.response(id).headers, "x-got-cookie"), "a=1; b=2");
}

TEST_F(Http2EngineTest, HeadResponseHasNoBody) {
  start();
  H2Client client(port_);
  TestRequest req = get("/h", true);
  req.method = "HEAD";
  const int32_t id = client.submit(req);
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 200);
  EXPECT_EQ(client.response(id).error_code, 0u);
  EXPECT_EQ(headerValue(client.response(id).headers, "content-length"), "1234");
  EXPECT_EQ(client.response(id).body, "");
}

TEST_F(Http2EngineTest, SessionGoneBeforeItsResponseIs502) {
  router_.session = [](int fd, RequestHead) { readSessionRequest(fd); };
  start();
  H2Client client(port_);
  const int32_t id = client.submit(get("/gone", true));
  const int32_t other = client.submit(get("/fine", false));
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 502);
  EXPECT_NE(client.response(id).body.find("siphon-agent"), std::string::npos)
      << client.response(id).body;
  EXPECT_EQ(headerValue(client.response(id).headers, "content-type"), "text/plain; charset=utf-8");
  EXPECT_EQ(client.response(other).status, 200);
}

TEST_F(Http2EngineTest, SessionGoneMidResponseResetsTheStream) {
  router_.session = [](int fd, RequestHead) {
    readSessionRequest(fd);
    writeAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial");
  };
  start();
  H2Client client(port_);
  const int32_t id = client.submit(get("/half", true));
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 200);
  EXPECT_EQ(client.response(id).error_code, static_cast<uint32_t>(NGHTTP2_INTERNAL_ERROR));
}

TEST_F(Http2EngineTest, NoSessionIs502) {
  router_.refuse_sessions = true;
  start();
  H2Client client(port_);
  const int32_t id = client.submit(get("/x", true));
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 502);
}

TEST_F(Http2EngineTest, ApplicationUnreachableIs502) {
  start();
  // A port nobody listens on: connect the router to it.
  H2AppServer* gone = new H2AppServer();
  const uint16_t dead_port = gone->port();
  delete gone;
  serveOneFor(dead_port);
  H2Client client(port_);
  const int32_t id = client.submit(get("/x", false));
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 502);
}

TEST_F(Http2EngineTest, RequestBodyLimitIs413) {
  HttpOptions o;
  o.max_request_body = 1000;
  start(o);
  H2Client client(port_);
  TestRequest big = get("/up", true);
  big.method = "POST";
  big.body = std::string(200000, 'x');
  TestRequest declared = get("/up", false);
  declared.method = "POST";
  declared.headers.emplace_back("content-length", "5000");
  declared.body = std::string(5000, 'y');
  TestRequest small = get("/up", false);
  small.method = "POST";
  small.body = std::string(1000, 'z');
  const int32_t a = client.submit(big);
  const int32_t b = client.submit(declared);
  const int32_t c = client.submit(small);
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(a).status, 413);
  EXPECT_EQ(client.response(b).status, 413);
  EXPECT_EQ(client.response(c).status, 200);
  EXPECT_EQ(client.response(c).body, std::string(1000, 'z'));
}

TEST_F(Http2EngineTest, ResponseBodyLimitIs502OrReset) {
  HttpOptions o;
  o.max_response_body = 1000;
  start(o);
  H2Client client(port_);
  TestRequest big = get("/echo", true);
  big.method = "POST";
  big.headers.emplace_back("x-want-trailers", "1");  // chunked: head sent before the body
  big.body = std::string(50000, 'x');
  const int32_t a = client.submit(big);
  ASSERT_TRUE(client.run()) << client.error();
  const TestResponse& r = client.response(a);
  EXPECT_TRUE(r.status == 502 || r.error_code == NGHTTP2_INTERNAL_ERROR)
      << r.status << " " << r.error_code;
  EXPECT_LE(r.body.size(), 1000u);
}

// A stolen request whose session does not read holds only its own stream:
// the others on the connection go on.
TEST_F(Http2EngineTest, StalledStreamDoesNotBlockOthers) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  router_.session = [released](int fd, RequestHead head) {
    if (!head.values("x-stall").empty()) released.wait();
    echoSession(fd, head);
  };
  start();
  H2Client client(port_);
  TestRequest stalled = get("/stall", true);
  stalled.method = "POST";
  stalled.headers.emplace_back("x-stall", "1");
  stalled.body = randomBytes(4 * 1024 * 1024, 3);
  const int32_t s = client.submit(stalled);
  std::vector<int32_t> others;
  for (int i = 0; i < 6; ++i) {
    TestRequest r = get("/other", i % 2 == 0);
    r.method = "POST";
    r.body = randomBytes(300000, 10 + i);
    others.push_back(client.submit(r));
  }
  const bool others_done = client.runUntil([&] {
    for (int32_t id : others) {
      if (!client.response(id).closed) return false;
    }
    return true;
  });
  EXPECT_TRUE(others_done) << client.error();
  EXPECT_FALSE(client.response(s).closed);
  for (int32_t id : others) EXPECT_EQ(client.response(id).status, 200);
  release.set_value();
  ASSERT_TRUE(client.run(std::chrono::seconds(60))) << client.error();
  EXPECT_EQ(client.response(s).status, 200);
  EXPECT_TRUE(client.response(s).body == *stalled.body);
}

TEST_F(Http2EngineTest, DrainSendsGoawayAndFinishesStreamsUnderWay) {
  std::promise<void> release;
  startWithSessionsHeld(release.get_future().share());
  H2Client client(port_);
  const int32_t id = client.submit(get("/slow", true));
  ASSERT_TRUE(client.runUntil([this] { return !router_.connectionRequests().empty(); }));
  ASSERT_TRUE(eventually([this] {
    for (LiveConnection* c : state_->connections) {
      if (c->busy()) return true;
    }
    return false;
  }));
  onLoop([this] {
    state_->draining = true;
    for (LiveConnection* c : state_->connections) c->drain();
  });
  ASSERT_TRUE(client.runUntil([&] { return client.goawayReceived(); })) << client.error();
  EXPECT_FALSE(client.response(id).closed);
  EXPECT_EQ(connectionsNow(), 1u);
  release.set_value();
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 200);
  EXPECT_EQ(client.response(id).error_code, 0u);
  // The agent closes the connection once the stream is done (well before
  // its linger time for the client to close first).
  EXPECT_TRUE(client.waitEof(std::chrono::seconds(1)));
  EXPECT_TRUE(eventually([this] { return state_->connections.empty(); }));
}

// A handover parks the engine's connections: HTTP/2 ones do not move, so
// parking one is a drain: GOAWAY, its stream under way answered, then it
// closes (its client reconnects, to whichever agent accepts). It never
// counts as parked, so the handover waits for it to be gone.
TEST_F(Http2EngineTest, ParkingSendsGoawayFinishesTheStreamAndCloses) {
  std::promise<void> release;
  startWithSessionsHeld(release.get_future().share());
  H2Client client(port_);
  const int32_t id = client.submit(get("/slow", true));
  ASSERT_TRUE(client.runUntil([this] { return !router_.connectionRequests().empty(); }));
  onLoop([this] {
    state_->parking = true;
    for (LiveConnection* c : state_->connections) c->park();
  });
  ASSERT_TRUE(client.runUntil([&] { return client.goawayReceived(); })) << client.error();
  EXPECT_EQ(onLoop([this] {
              size_t parked = 0;
              for (LiveConnection* c : state_->connections) parked += c->parked() ? 1 : 0;
              return parked;
            }),
            0u);
  release.set_value();
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 200);
  EXPECT_EQ(client.response(id).error_code, 0u);
  EXPECT_TRUE(client.waitEof(std::chrono::seconds(1)));
  EXPECT_TRUE(eventually([this] { return state_->connections.empty(); }));
}

TEST_F(Http2EngineTest, ApplicationGoawayOpensANewConnection) {
  start();
  // The first app connection answers one stream then sends GOAWAY.
  H2AppServer once(1);
  serveOneFor(once.port());
  H2Client client(port_);
  for (int round = 0; round < 3; ++round) {
    const int32_t id = client.submit(get("/r" + std::to_string(round), false));
    ASSERT_TRUE(client.run()) << client.error();
    EXPECT_EQ(client.response(id).status, 200) << round;
  }
  EXPECT_EQ(once.connections(), 3);
  EXPECT_EQ(router_.app_connects.load(), 3);
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST_F(Http2EngineTest, H2cUpgradeServesTheUpgradeRequestAsStreamOne) {
  start({}, /*upgrade=*/true);
  const std::string url = "http://127.0.0.1:" + std::to_string(port_);
  const std::string stolen = run("nghttp -u -v -H 'x-steal: 1' " + url + "/up-stolen");
  EXPECT_NE(stolen.find("HTTP Upgrade success"), std::string::npos) << stolen;
  EXPECT_NE(stolen.find("x-session: yes"), std::string::npos) << stolen;
  EXPECT_NE(stolen.find("x-got-target: /up-stolen"), std::string::npos) << stolen;
  const std::string passed = run("nghttp -u -v " + url + "/up-app");
  EXPECT_NE(passed.find("HTTP Upgrade success"), std::string::npos) << passed;
  EXPECT_NE(passed.find("x-app-path: /up-app"), std::string::npos) << passed;
  EXPECT_EQ(app_.streams(), 1);
}

TEST_F(Http2EngineTest, CurlPriorKnowledge) {
  start();
  const std::string url = "http://127.0.0.1:" + std::to_string(port_);
  const std::string out = run(
      "curl -sS --http2-prior-knowledge -D - -H 'x-steal: 1' --data-binary hello " + url + "/c");
  EXPECT_NE(out.find("HTTP/2 200"), std::string::npos) << out;
  EXPECT_NE(out.find("x-session: yes"), std::string::npos) << out;
  EXPECT_NE(out.find("hello"), std::string::npos) << out;
}

// h2load's summary line: "requests: N total, N started, N done, N succeeded,
// 0 failed, 0 errored, 0 timeout".
int succeeded(const std::string& out) {
  const size_t at = out.find(" done, ");
  if (at == std::string::npos) return -1;
  return std::atoi(out.c_str() + at + 7);
}

TEST_F(Http2EngineTest, ManyConcurrentStreamsBothWaysWithoutErrors) {
  start();
  const std::string url = "http://127.0.0.1:" + std::to_string(port_) + "/load";
  auto stolen = std::async(std::launch::async,
                           [&] { return run("h2load -n 1000 -c 2 -m 16 -H 'x-steal: 1' " + url); });
  const std::string passed = run("h2load -n 2000 -c 4 -m 16 " + url);
  const std::string s = stolen.get();
  EXPECT_EQ(succeeded(passed), 2000) << passed;
  EXPECT_NE(passed.find("0 failed, 0 errored, 0 timeout"), std::string::npos) << passed;
  EXPECT_NE(passed.find("2000 2xx"), std::string::npos) << passed;
  EXPECT_EQ(succeeded(s), 1000) << s;
  EXPECT_NE(s.find("0 failed, 0 errored, 0 timeout"), std::string::npos) << s;
  EXPECT_NE(s.find("1000 2xx"), std::string::npos) << s;
  EXPECT_EQ(app_.streams(), 2000);
  EXPECT_EQ(router_.connectionRequests().size(), 1000u);
}

// --- What a peer can make the engine hold or do (http2_limits.h).

using testing::hpackGet;
using testing::hpackIndexed;
using testing::hpackLiteral;
using testing::hpackLiteralIndexed;
using testing::RawFrame;
using testing::rawFrame;
using testing::RawH2;
using testing::rstStreamFrame;

constexpr uint8_t kEndStream = NGHTTP2_FLAG_END_STREAM;
constexpr uint8_t kEndHeaders = NGHTTP2_FLAG_END_HEADERS;

// HPACK amplification: one 4000-byte field, added to the dynamic table,
// then referenced `repeats` times by its one-byte index (62). About 5 KB
// on the wire, decoded to repeats x 4 KB.
std::string amplifiedBlock(size_t repeats, std::string_view path = "/big") {
  std::string block = hpackGet(path) + hpackLiteralIndexed("x-big", std::string(4000, 'a'));
  for (size_t i = 0; i < repeats; ++i) block += hpackIndexed(62);
  return block;
}

uint64_t limitCount(const std::array<uint64_t, kHttp2Limits>& counts, Http2Limit l) {
  return counts[static_cast<size_t>(l)];
}

size_t routedHeaderBytes(const std::vector<RequestHead>& routed) {
  size_t most = 0;
  for (const RequestHead& h : routed) {
    size_t n = 0;
    for (const auto& [name, value] : h.headers) n += name.size() + value.size();
    most = std::max(most, n);
  }
  return most;
}

// A 5 KB HEADERS frame that decodes to 4 MB: the stream is reset before
// the header list passes --http-max-head (nothing of it routed, the
// engine never holds more than the limit); the next request on the same
// connection is served.
TEST_F(Http2EngineTest, HpackAmplifiedHeaderListIsResetAndNeverHeld) {
  start();
  std::vector<Http2Limit> heard;
  onLoop([&] { state_->on_h2_limit = [&heard](Http2Limit l) { heard.push_back(l); }; });
  RawH2 raw(port_);
  const std::string block = amplifiedBlock(1000);
  ASSERT_LT(block.size(), 16384u);
  ASSERT_TRUE(raw.send(rawFrame(NGHTTP2_HEADERS, kEndStream | kEndHeaders, 1, block)));
  ASSERT_TRUE(raw.send(
      rawFrame(NGHTTP2_HEADERS, kEndStream | kEndHeaders, 3, hpackGet("/ok") + hpackIndexed(62))));
  ASSERT_TRUE(raw.readUntil([](const RawFrame& f) {
    return f.stream == 3 && f.type == NGHTTP2_DATA && (f.flags & kEndStream);
  }));
  const RawFrame* rst = raw.find(NGHTTP2_RST_STREAM, 1);
  ASSERT_NE(rst, nullptr) << "the amplified request was not reset";
  EXPECT_EQ(rst->errorCode(), uint32_t{NGHTTP2_INTERNAL_ERROR});  // nghttp2's, for a refused block
  EXPECT_EQ(raw.find(NGHTTP2_HEADERS, 1), nullptr) << "the amplified request was answered";
  EXPECT_NE(raw.find(NGHTTP2_HEADERS, 3), nullptr);
  EXPECT_EQ(raw.find(NGHTTP2_GOAWAY), nullptr);

  const auto routed = router_.routed();
  ASSERT_EQ(routed.size(), 1u);
  EXPECT_EQ(routed[0].target, "/ok");
  EXPECT_LE(routedHeaderBytes(routed), 8000u);
  const HttpOptions defaults;
  EXPECT_LE(onLoop([&] { return state_->h2_header_block_high_water; }), defaults.max_head_bytes);
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kHeaderList), 1u);
  EXPECT_EQ(onLoop([&] { return heard; }), std::vector<Http2Limit>{Http2Limit::kHeaderList});
}

// Trailers are a header block of their own, under the same limit; and a
// block of many small fields is refused by count.
TEST_F(Http2EngineTest, AmplifiedTrailersAndTooManyFieldsAreReset) {
  HttpOptions o;
  o.max_head_bytes = 16 * 1024;
  start(o);
  RawH2 raw(port_);
  // Stream 1: head, a body, then amplified trailers.
  ASSERT_TRUE(raw.send(rawFrame(NGHTTP2_HEADERS, kEndHeaders, 1, hpackGet("/t"))));
  ASSERT_TRUE(raw.send(rawFrame(NGHTTP2_DATA, 0, 1, "body")));
  std::string trailers = hpackLiteralIndexed("x-big", std::string(4000, 't'));
  for (int i = 0; i < 1000; ++i) trailers += hpackIndexed(62);
  ASSERT_TRUE(raw.send(rawFrame(NGHTTP2_HEADERS, kEndStream | kEndHeaders, 1, trailers)));
  // Stream 3: 300 distinct small fields (under 16 KiB, over the count).
  std::string many = hpackGet("/many");
  for (int i = 0; i < 300; ++i) many += hpackLiteral("x-f" + std::to_string(i), "v");
  ASSERT_LT(many.size() + 300 * 32, 16u * 1024);
  ASSERT_TRUE(raw.send(rawFrame(NGHTTP2_HEADERS, kEndStream | kEndHeaders, 3, many)));
  ASSERT_TRUE(raw.readUntil([&](const RawFrame&) {
    return raw.find(NGHTTP2_RST_STREAM, 1) != nullptr && raw.find(NGHTTP2_RST_STREAM, 3) != nullptr;
  })) << "both streams reset";
  EXPECT_EQ(raw.find(NGHTTP2_HEADERS, 3), nullptr);
  EXPECT_EQ(raw.find(NGHTTP2_GOAWAY), nullptr);
  EXPECT_LE(onLoop([&] { return state_->h2_header_block_high_water; }), o.max_head_bytes);
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kHeaderList), 2u);
  for (const RequestHead& h : router_.routed()) EXPECT_NE(h.target, "/many");
}

// A header list just under the limit is still served.
TEST_F(Http2EngineTest, HeaderListUnderTheLimitIsServed) {
  HttpOptions o;
  o.max_head_bytes = 16 * 1024;
  start(o);
  H2Client client(port_);
  TestRequest r = get("/near", false);
  // 3 x (5 + 4000 + 32) plus the pseudo-headers: about 12.2 KB of 16.
  for (int i = 0; i < 3; ++i)
    r.headers.emplace_back("x-h" + std::to_string(i), std::string(4000, 'n'));
  const int32_t id = client.submit(r);
  ASSERT_TRUE(client.run()) << client.error();
  EXPECT_EQ(client.response(id).status, 200);
  EXPECT_EQ(client.response(id).error_code, 0u);
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kHeaderList), 0u);
}

// A client that keeps sending oversized header blocks loses the
// connection: GOAWAY(ENHANCE_YOUR_CALM), and nothing of it routed.
TEST_F(Http2EngineTest, RepeatedOversizedHeaderBlocksEndWithGoaway) {
  start();
  RawH2 raw(port_);
  std::string flood;
  for (int32_t id = 1; id < 80; id += 2) {
    flood += rawFrame(
        NGHTTP2_HEADERS, kEndStream | kEndHeaders, id,
        id == 1 ? amplifiedBlock(1000) : hpackGet("/big") + [] {
          std::string refs;
          for (int i = 0; i < 1000; ++i) refs += hpackIndexed(62);
          return refs;
        }());
  }
  raw.send(flood);
  ASSERT_TRUE(raw.readUntil([](const RawFrame& f) { return f.type == NGHTTP2_GOAWAY; }));
  EXPECT_EQ(raw.find(NGHTTP2_GOAWAY)->errorCode(), uint32_t{NGHTTP2_ENHANCE_YOUR_CALM});
  EXPECT_TRUE(raw.readToEof()) << "the agent closes the connection";
  EXPECT_TRUE(router_.routed().empty());
  const auto counts = onLoop([&] { return state_->h2_limits; });
  EXPECT_EQ(limitCount(counts, Http2Limit::kHeaderFlood), 1u);
  EXPECT_LE(limitCount(counts, Http2Limit::kHeaderList), 10u);
}

// HEADERS without END_HEADERS, then CONTINUATION frames without end:
// GOAWAY(ENHANCE_YOUR_CALM) after kMaxContinuations, not a silent close.
TEST_F(Http2EngineTest, ContinuationFloodEndsWithGoaway) {
  start();
  RawH2 raw(port_);
  std::string flood = rawFrame(NGHTTP2_HEADERS, kEndStream, 1, hpackGet("/c"));
  for (int i = 0; i < 1000; ++i) flood += rawFrame(NGHTTP2_CONTINUATION, 0, 1);
  raw.send(flood);
  ASSERT_TRUE(raw.readUntil([](const RawFrame& f) { return f.type == NGHTTP2_GOAWAY; }))
      << "closed without GOAWAY";
  EXPECT_EQ(raw.find(NGHTTP2_GOAWAY)->errorCode(), uint32_t{NGHTTP2_ENHANCE_YOUR_CALM});
  EXPECT_TRUE(raw.readToEof());
  EXPECT_TRUE(router_.routed().empty());
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kContinuations), 1u);
}

// PING and SETTINGS floods (each frame costs an ACK) end with
// GOAWAY(ENHANCE_YOUR_CALM) once the budget is spent, even from a client
// that reads every ACK.
TEST_F(Http2EngineTest, PingAndSettingsFloodsEndWithGoaway) {
  start();
  for (uint8_t type : {uint8_t{NGHTTP2_PING}, uint8_t{NGHTTP2_SETTINGS}}) {
    RawH2 raw(port_);
    std::string flood;
    for (int i = 0; i < 900; ++i) {
      flood += rawFrame(type, 0, 0, type == NGHTTP2_PING ? std::string_view("12345678", 8) : "");
    }
    raw.send(flood);
    ASSERT_TRUE(raw.readUntil([](const RawFrame& f) { return f.type == NGHTTP2_GOAWAY; }))
        << int{type};
    EXPECT_EQ(raw.find(NGHTTP2_GOAWAY)->errorCode(), uint32_t{NGHTTP2_ENHANCE_YOUR_CALM});
    EXPECT_TRUE(raw.readToEof());
    // ACKs stop at the budget (SETTINGS: one more, for the preface's).
    EXPECT_LE(raw.count(type, NGHTTP2_FLAG_ACK), 202u) << int{type};
  }
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kControlFlood), 2u);
}

// Rapid reset (CVE-2023-44487): HEADERS then RST_STREAM, again and again.
// Each stream is routed for nothing; the connection ends with
// GOAWAY(ENHANCE_YOUR_CALM) long before the flood does (nghttp2's own
// limit, 1000, would not have stopped it).
TEST_F(Http2EngineTest, RapidResetFloodEndsWithGoaway) {
  start();
  RawH2 raw(port_);
  std::string flood;
  for (int32_t id = 1; id < 2 * 600; id += 2) {
    flood += rawFrame(NGHTTP2_HEADERS, kEndStream | kEndHeaders, id, hpackGet("/r"));
    flood += rstStreamFrame(id, NGHTTP2_CANCEL);
  }
  raw.send(flood);
  ASSERT_TRUE(raw.readUntil([](const RawFrame& f) { return f.type == NGHTTP2_GOAWAY; }));
  EXPECT_EQ(raw.find(NGHTTP2_GOAWAY)->errorCode(), uint32_t{NGHTTP2_ENHANCE_YOUR_CALM});
  EXPECT_TRUE(raw.readToEof());
  EXPECT_LT(router_.routed().size(), 300u);
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kResetFlood), 1u);
}

// Streams past SETTINGS_MAX_CONCURRENT_STREAMS are refused (nghttp2
// enforces what we advertise): the engine never holds more than 128.
TEST_F(Http2EngineTest, StreamsPastTheConcurrencyLimitAreRefused) {
  start();
  RawH2 raw(port_);
  std::string open;
  for (int32_t id = 1; id < 2 * 200; id += 2) {
    // No END_STREAM: each waits for a body that never comes.
    open += rawFrame(NGHTTP2_HEADERS, kEndHeaders, id, hpackGet("/open"));
  }
  raw.send(open);
  ASSERT_TRUE(raw.readUntil([&](const RawFrame&) {
    size_t refused = 0;
    for (const RawFrame& f : raw.frames) {
      if (f.type == NGHTTP2_RST_STREAM && f.errorCode() == NGHTTP2_REFUSED_STREAM) ++refused;
    }
    return refused == 200 - 128;
  }));
  EXPECT_EQ(router_.routed().size(), 128u);
}

// The application connection every HTTP/2 client shares takes at most
// 1024 requests at once; past that a request is answered 503 rather than
// queued without bound (9 clients x 128 requests that never end).
TEST_F(Http2EngineTest, RequestsPastTheApplicationConnectionsCapAre503) {
  start();
  std::vector<std::unique_ptr<RawH2>> clients;
  for (int c = 0; c < 9; ++c) {
    clients.push_back(std::make_unique<RawH2>(port_));
    std::string open;
    for (int32_t id = 1; id < 2 * 128; id += 2) {
      open += rawFrame(NGHTTP2_HEADERS, kEndHeaders, id, hpackGet("/wait"));
    }
    ASSERT_TRUE(clients.back()->send(open));
  }
  ASSERT_TRUE(eventually(
      [&] { return state_->h2_limits[static_cast<size_t>(Http2Limit::kPoolFull)] >= 128; }));
  size_t answered = 0;
  for (int round = 0; round < 400 && answered < 128; ++round) {
    answered = 0;
    for (auto& c : clients) {
      c->readUntil([](const RawFrame&) { return false; }, std::chrono::milliseconds(5));
      answered += c->count(NGHTTP2_HEADERS);
    }
  }
  EXPECT_EQ(answered, 128u);
  EXPECT_EQ(limitCount(onLoop([&] { return state_->h2_limits; }), Http2Limit::kPoolFull), 128u);
  EXPECT_EQ(router_.routed().size(), 9u * 128);
}

}  // namespace
}  // namespace siphon::agent::steal::http
