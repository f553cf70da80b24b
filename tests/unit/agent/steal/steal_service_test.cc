// The steal service end to end in process and without root: a targetless
// agent whose steering is a fake (the kernel part is tested in
// tests/privileged/steal*). The test connects straight to the service's
// listener; the fake says which port the connection "was meant for". All
// the rest is real: subscriptions, the accept loop, stolen streams to a
// real client with flow control and half-close, passthrough, release of
// ports when a session unsubscribes or ends.
//
// Over 600 lines: one service's cases sharing the in-process agent below,
// and the client's failover and replicas, which need two such agents.
#include "agent/steal/steal_service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent::steal {
namespace {

namespace asio = net::asio;
using fakes::eventually;

constexpr char kToken[] = "steal-test-token";

// Records what the service asks of the kernel.
struct FakeKernel {
  std::mutex mu;
  Listeners listeners;
  std::vector<std::string> calls;          // "add 80", "remove 80", "flush 80", "exempt", "stop"
  std::atomic<uint16_t> original_port{0};  // what originalDestination() reports
  std::atomic<bool> fail_add{false};
  std::atomic<int> throw_destinations{0};  // originalDestination() throws this many times

  void record(std::string s) {
    std::lock_guard<std::mutex> l(mu);
    calls.push_back(std::move(s));
  }
  bool saw(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    return std::find(calls.begin(), calls.end(), s) != calls.end();
  }
  int count(const std::string& s) {
    std::lock_guard<std::mutex> l(mu);
    return static_cast<int>(std::count(calls.begin(), calls.end(), s));
  }
  uint16_t listenerPort() {
    std::lock_guard<std::mutex> l(mu);
    return listeners.v4_port;
  }
};

class FakeSteering : public Steering {
 public:
  explicit FakeSteering(std::shared_ptr<FakeKernel> k) : k_(std::move(k)) {}
  std::string_view name() const override { return "fake"; }
  absl::Status addPort(uint16_t port) override {
    if (k_->fail_add) return protoError(v1::UNAVAILABLE, "the fake kernel says no");
    k_->record(absl::StrCat("add ", port));
    return absl::OkStatus();
  }
  absl::Status removePort(uint16_t port) override {
    k_->record(absl::StrCat("remove ", port));
    return absl::OkStatus();
  }
  absl::Status exempt(int) override {
    k_->record("exempt");
    return absl::OkStatus();
  }
  void unexempt(int) override { k_->record("unexempt"); }
  absl::StatusOr<SockAddr> originalDestination(int fd) override {
    int n = k_->throw_destinations.load();
    if (n > 0 && k_->throw_destinations.compare_exchange_strong(n, n - 1)) {
      throw std::runtime_error("the fake kernel exploded");
    }
    ASSIGN_OR_RETURN(SockAddr a, outgoing::localAddress(fd));
    reinterpret_cast<sockaddr_in*>(&a.storage)->sin_port = htons(k_->original_port);
    return a;
  }
  void stop() override { k_->record("stop"); }

 private:
  std::shared_ptr<FakeKernel> k_;
};

// A blocking loopback TCP client of the service's listener.
int connectTo(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
  return fd;
}

uint16_t localPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

void writeAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    ASSERT_GT(n, 0) << strerror(errno);
    off += static_cast<size_t>(n);
  }
}

// Reads until EOF; error text on a reset.
std::string readAll(int fd, bool* reset = nullptr) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (reset) *reset = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

net::awaitable<absl::StatusOr<uint64_t>> subscribe(const std::shared_ptr<client::Client>& c,
                                                   uint32_t port, bool flush = false) {
  v1::Request r;
  r.mutable_steal()->set_port(port);
  r.mutable_steal()->set_flush_connections(flush);
  auto resp = co_await c->call(r);
  if (!resp.ok()) co_return resp.status();
  EXPECT_EQ(resp->subscribed().backend(), "fake");
  co_return resp->subscribed().subscription_id();
}

net::awaitable<absl::Status> unsubscribe(const std::shared_ptr<client::Client>& c, uint64_t id) {
  v1::Request r;
  r.mutable_unsubscribe()->set_subscription_id(id);
  auto resp = co_await c->call(r);
  co_return resp.status();
}

// Starts a targetless agent whose steal service steers through `kernel`.
void startStealAgent(fakes::InProcessAgent& agent, const std::shared_ptr<FakeKernel>& kernel) {
  AgentConfig config;
  config.token = kToken;
  TargetSpec spec;
  spec.mode = TargetMode::kTargetless;
  agent.start(config, std::make_unique<RealProcFs>(), spec, [kernel](Server& server) {
    auto service = makeStealService(
        server.serviceContext(),
        [kernel](const Listeners& l) -> absl::StatusOr<std::unique_ptr<Steering>> {
          {
            std::lock_guard<std::mutex> lock(kernel->mu);
            kernel->listeners = l;
          }
          return std::make_unique<FakeSteering>(kernel);
        },
        [kernel](uint16_t port) -> absl::StatusOr<int> {
          kernel->record(absl::StrCat("flush ", port));
          return 0;
        });
    server.services().addRequest(v1::Request::kSteal, service);
    server.services().addRequest(v1::Request::kUnsubscribe, service);
  });
}

class StealServiceTest : public testing::Test {
 protected:
  void SetUp() override { startStealAgent(agent_, kernel_); }

  std::shared_ptr<client::Client> newClient(const asio::any_io_executor& ex,
                                            std::string name = "test") {
    client::ClientOptions o;
    o.endpoints = {agent_.address()};
    o.token = kToken;
    o.client_name = std::move(name);
    return client::Client::create(ex, o);
  }

  std::shared_ptr<FakeKernel> kernel_ = std::make_shared<FakeKernel>();
  fakes::InProcessAgent agent_;
};

TEST_F(StealServiceTest, SecondSessionGetsPortBusyAndPortsComeBack) {
  fakes::runClient([&](const asio::any_io_executor& io) -> net::awaitable<void> {
    auto a = newClient(io, "alice");
    auto b = newClient(io, "bob");
    EXPECT_TRUE((co_await a->connect()).ok());
    EXPECT_TRUE((co_await b->connect()).ok());
    auto id = co_await subscribe(a, 8080, /*flush=*/true);
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE(kernel_->saw("add 8080"));
    EXPECT_TRUE(kernel_->saw("flush 8080"));

    auto busy = co_await subscribe(b, 8080);
    EXPECT_EQ(errorCodeOf(busy.status()), v1::PORT_BUSY) << busy.status();
    EXPECT_NE(busy.status().message().find("alice"), absl::string_view::npos) << busy.status();
    // Another port is bob's to take; alice cannot unsubscribe it.
    auto other = co_await subscribe(b, 8081);
    EXPECT_TRUE(other.ok()) << other.status();
    EXPECT_EQ(errorCodeOf(co_await unsubscribe(a, *other)), v1::NOT_FOUND);

    // Unsubscribing gives the port back before the answer comes.
    EXPECT_TRUE((co_await unsubscribe(a, *id)).ok());
    EXPECT_TRUE(kernel_->saw("remove 8080"));
    auto taken = co_await subscribe(b, 8080);
    EXPECT_TRUE(taken.ok()) << taken.status();

    // Bob's session ends: both of his ports come back.
    b->close();
    EXPECT_TRUE(co_await eventually([&] { return kernel_->saw("remove 8081"); }));
    v1::Request info;
    info.mutable_info();
    EXPECT_TRUE((co_await a->call(info)).ok());
    a->close();
  });
}

TEST_F(StealServiceTest, BadSubscriptionsAreRefused) {
  fakes::runClient([&](const asio::any_io_executor& io) -> net::awaitable<void> {
    auto c = newClient(io);
    EXPECT_TRUE((co_await c->connect()).ok());
    auto zero = co_await subscribe(c, 0);
    EXPECT_EQ(errorCodeOf(zero.status()), v1::INVALID_ARGUMENT) << zero.status();
    auto big = co_await subscribe(c, 70000);
    EXPECT_EQ(errorCodeOf(big.status()), v1::INVALID_ARGUMENT) << big.status();
    kernel_->fail_add = true;
    auto failed = co_await subscribe(c, 9000);
    EXPECT_EQ(errorCodeOf(failed.status()), v1::UNAVAILABLE) << failed.status();
    EXPECT_NE(failed.status().message().find("steal port 9000"), absl::string_view::npos);
    kernel_->fail_add = false;
    // The failed reservation did not keep the port.
    auto retry = co_await subscribe(c, 9000);
    EXPECT_TRUE(retry.ok()) << retry.status();
    EXPECT_EQ(errorCodeOf(co_await unsubscribe(c, 12345)), v1::NOT_FOUND);
    c->close();
  });
}

// A stolen connection is a stream: data both ways, byte-exact, and a
// client that half-closes still gets the whole answer.
TEST_F(StealServiceTest, StolenConnectionBecomesAStreamWithHalfClose) {
  const std::string request = randomBytes(3 << 20, 1);
  const std::string answer = randomBytes(2 << 20, 2);
  std::thread remote;
  std::string remote_got;
  std::atomic<bool> remote_done{false};
  uint16_t remote_port = 0;
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    struct Got {
      explicit Got(asio::any_io_executor e) : signal(e) {}
      net::Signal signal;
      std::shared_ptr<client::ClientStream> stream;
      v1::StreamOpen open;
    };
    auto got = std::make_shared<Got>(ex);
    c->setStreamAcceptor([got](std::shared_ptr<client::ClientStream> s, v1::StreamOpen open) {
      got->stream = std::move(s);
      got->open = std::move(open);
      got->signal.notify();
    });
    EXPECT_TRUE((co_await c->connect()).ok());
    kernel_->original_port = 80;
    auto id = co_await subscribe(c, 80);
    EXPECT_TRUE(id.ok()) << id.status();

    // The "remote client": sends its request, half-closes, reads the answer.
    const uint16_t listener = kernel_->listenerPort();
    EXPECT_NE(listener, 0);
    int fd = connectTo(listener);
    remote_port = localPort(fd);
    remote = std::thread([fd, &request, &remote_got, &remote_done] {
      writeAll(fd, request);
      ::shutdown(fd, SHUT_WR);
      remote_got = readAll(fd);
      ::close(fd);
      remote_done = true;
    });

    while (!got->stream) co_await got->signal.wait();
    EXPECT_TRUE(got->open.has_stolen());
    EXPECT_EQ(got->open.stolen().subscription_id(), *id);
    EXPECT_EQ(got->open.stolen().destination().port(), 80u);
    EXPECT_EQ(got->open.stolen().source().port(), remote_port);
    EXPECT_EQ(got->open.stolen().source().ip(), "127.0.0.1");
    EXPECT_TRUE(c->acceptStream(*got->stream).ok());
    std::string in;
    while (true) {
      auto chunk = co_await got->stream->read();
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok() || !chunk->has_value()) break;
      in += **chunk;
    }
    EXPECT_TRUE(in == request) << "request differs: " << in.size() << " bytes";
    EXPECT_TRUE((co_await got->stream->write(answer)).ok());
    EXPECT_TRUE(got->stream->halfClose().ok());
    // Unsubscribe with the connection open: it keeps flowing until closed.
    EXPECT_TRUE((co_await unsubscribe(c, *id)).ok());
    // Joining here would block the client's loop: poll instead.
    EXPECT_TRUE(co_await eventually([&] { return remote_done.load(); }));
    remote.join();
    c->close();
  });
  if (remote.joinable()) remote.join();
  EXPECT_TRUE(remote_got == answer) << "answer differs: " << remote_got.size() << " bytes";
}

// Flow control per connection: a stolen stream the session does not read
// stops the agent reading that socket (its remote writer blocks once the
// window and the socket buffers are full) while another stolen connection
// of the same session flows. Nothing is lost: once read, all of it arrives.
TEST_F(StealServiceTest, SlowStreamBacksUpOnlyItsOwnConnection) {
  constexpr size_t kSlowTotal = 64 << 20;  // far above window + socket buffers
  const std::string slow_data = randomBytes(kSlowTotal, 5);
  const std::string fast_data = randomBytes(4 << 20, 6);
  std::atomic<size_t> slow_written{0};
  std::atomic<bool> slow_done{false};
  std::atomic<bool> fast_done{false};
  std::string fast_echo;
  std::thread slow_writer, fast_client;
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    struct Got {
      explicit Got(asio::any_io_executor e) : signal(e) {}
      net::Signal signal;
      std::vector<std::shared_ptr<client::ClientStream>> streams;
    };
    auto got = std::make_shared<Got>(ex);
    c->setStreamAcceptor([got](std::shared_ptr<client::ClientStream> s, v1::StreamOpen) {
      got->streams.push_back(std::move(s));
      got->signal.notify();
    });
    EXPECT_TRUE((co_await c->connect()).ok());
    kernel_->original_port = 80;
    EXPECT_TRUE((co_await subscribe(c, 80)).ok());
    const uint16_t listener = kernel_->listenerPort();

    // The slow one first: stream 0.
    int slow_fd = connectTo(listener);
    while (got->streams.size() < 1) co_await got->signal.wait();
    auto slow = got->streams[0];
    EXPECT_TRUE(c->acceptStream(*slow).ok());
    slow_writer = std::thread([&, slow_fd] {
      size_t off = 0;
      while (off < slow_data.size()) {
        ssize_t n = ::write(slow_fd, slow_data.data() + off,
                            std::min<size_t>(64 << 10, slow_data.size() - off));
        if (n <= 0) break;
        off += static_cast<size_t>(n);
        slow_written = off;
      }
      ::shutdown(slow_fd, SHUT_WR);
      slow_done = true;
    });

    // The fast one, end to end, while nobody reads the slow one.
    int fast_fd = connectTo(listener);
    fast_client = std::thread([&, fast_fd] {
      writeAll(fast_fd, fast_data);
      ::shutdown(fast_fd, SHUT_WR);
      fast_echo = readAll(fast_fd);
      ::close(fast_fd);
      fast_done = true;
    });
    while (got->streams.size() < 2) co_await got->signal.wait();
    auto fast = got->streams[1];
    EXPECT_TRUE(c->acceptStream(*fast).ok());
    std::string in;
    while (true) {
      auto chunk = co_await fast->read();
      if (!chunk.ok() || !chunk->has_value()) break;
      in += **chunk;
    }
    EXPECT_TRUE(in == fast_data);
    EXPECT_TRUE((co_await fast->write(in)).ok());
    EXPECT_TRUE(fast->halfClose().ok());
    // Joining here would block the client's loop: poll instead.
    EXPECT_TRUE(co_await eventually([&] { return fast_done.load(); }));
    fast_client.join();
    EXPECT_TRUE(fast_echo == fast_data) << "fast echo: " << fast_echo.size() << " bytes";

    // The slow writer is stuck: the agent stopped reading its socket.
    EXPECT_FALSE(slow_done.load());
    EXPECT_LT(slow_written.load(), kSlowTotal / 2) << "no backpressure on the slow connection";

    // Reading it now lets everything through, byte-exact.
    std::string slow_in;
    while (true) {
      auto chunk = co_await slow->read();
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok() || !chunk->has_value()) break;
      slow_in += **chunk;
    }
    EXPECT_TRUE(slow_in == slow_data) << "slow: " << slow_in.size() << " bytes";
    EXPECT_TRUE(co_await eventually([&] { return slow_done.load(); }));
    slow->reset(v1::CANCELLED, "done");
    slow_writer.join();
    ::close(slow_fd);
    c->close();
  });
  if (slow_writer.joinable()) slow_writer.join();
  if (fast_client.joinable()) fast_client.join();
}

// A connection that reaches the listener with no subscription for its port
// (it raced an unsubscribe) goes to the original destination, around the
// steering.
TEST_F(StealServiceTest, UnclaimedConnectionPassesThroughToTheApplication) {
  fakes::EchoServer app(
      [] {
        int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
        EXPECT_EQ(::listen(fd, 16), 0);
        return fd;
      }(),
      fakes::EchoServer::Kind::kStream);
  std::string echoed;
  std::atomic<bool> remote_done{false};
  const std::string data = randomBytes(1 << 20, 3);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    // Start the steering with one port, then give it back.
    auto id = co_await subscribe(c, 81);
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_TRUE((co_await unsubscribe(c, *id)).ok());
    kernel_->original_port = app.port();
    const uint16_t listener = kernel_->listenerPort();
    std::thread remote([&] {
      int fd = connectTo(listener);
      writeAll(fd, data);
      ::shutdown(fd, SHUT_WR);
      echoed = readAll(fd);
      ::close(fd);
      remote_done = true;
    });
    // The loop must keep running while the remote side talks.
    EXPECT_TRUE(co_await eventually([&] { return remote_done.load(); }));
    remote.join();
    EXPECT_TRUE(kernel_->saw("exempt"));
    EXPECT_TRUE(kernel_->saw("unexempt"));
    c->close();
  });
  EXPECT_TRUE(echoed == data) << "echo differs: " << echoed.size() << " bytes";
}

// What net::spawn reported (the agent logs it as coroutine_failed).
std::mutex spawn_reports_mu;
std::vector<std::string> spawn_reports;
void recordSpawnFailure(std::string_view what, std::string_view error) {
  std::lock_guard<std::mutex> l(spawn_reports_mu);
  spawn_reports.push_back(std::string(what) + ": " + std::string(error));
}
std::vector<std::string> spawnReports() {
  std::lock_guard<std::mutex> l(spawn_reports_mu);
  return spawn_reports;
}

// An exception while the agent takes one stolen connection (here from the
// steering) is reported and ends that connection only: the accept loop
// serves the next one, which the session gets. It used to end the accept
// loop without a word, leaving the port stolen with nobody accepting.
TEST_F(StealServiceTest, AnExceptionWithOneConnectionEndsItAloneAndTheNextIsStolen) {
  net::setSpawnFailureReporter(&recordSpawnFailure);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    struct Got {
      explicit Got(asio::any_io_executor e) : signal(e) {}
      net::Signal signal;
      std::shared_ptr<client::ClientStream> stream;
    };
    auto got = std::make_shared<Got>(ex);
    c->setStreamAcceptor([got](std::shared_ptr<client::ClientStream> s, v1::StreamOpen) {
      got->stream = std::move(s);
      got->signal.notify();
    });
    EXPECT_TRUE((co_await c->connect()).ok());
    kernel_->original_port = 80;
    auto id = co_await subscribe(c, 80);
    EXPECT_TRUE(id.ok()) << id.status();
    const uint16_t listener = kernel_->listenerPort();

    kernel_->throw_destinations = 1;
    int first = connectTo(listener);
    bool reset = false;
    EXPECT_EQ(readAll(first, &reset), "") << "the failed connection ends";
    ::close(first);
    EXPECT_TRUE(co_await eventually([&] { return !spawnReports().empty(); }))
        << "the exception was not reported";
    const auto reports = spawnReports();
    if (!reports.empty()) {
      EXPECT_EQ(reports.front(), "steal_connection: the fake kernel exploded");
    }
    EXPECT_FALSE(got->stream) << "the failed connection reached the session";

    int second = connectTo(listener);
    EXPECT_TRUE(co_await eventually([&] { return got->stream != nullptr; }))
        << "the accept loop stopped with the exception";
    if (got->stream) {
      EXPECT_TRUE(c->acceptStream(*got->stream).ok());
    }
    ::close(second);
    c->close();
  });
  net::setSpawnFailureReporter(nullptr);
}

// ------------------------------------------------------------ filtered

net::awaitable<absl::StatusOr<uint64_t>> subscribeFiltered(const std::shared_ptr<client::Client>& c,
                                                           uint32_t port, std::string header,
                                                           std::string regex) {
  v1::Request r;
  r.mutable_steal()->set_port(port);
  v1::HeaderFilter* h = r.mutable_steal()->mutable_http_filter()->add_headers();
  h->set_name(std::move(header));
  h->set_value_regex(std::move(regex));
  auto resp = co_await c->call(r);
  if (!resp.ok()) co_return resp.status();
  co_return resp->subscribed().subscription_id();
}

// A loopback HTTP/1.1 "application": answers every request on a
// keep-alive connection with "app <target>", counting connections.
class AppServer {
 public:
  AppServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    port_ = localPort(fd_);
    thread_ = std::thread([this] {
      while (true) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        ++connections;
        std::thread([c] {
          std::string buf;
          char chunk[4096];
          while (true) {
            size_t end;
            while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
              ssize_t n = ::read(c, chunk, sizeof chunk);
              if (n <= 0) {
                ::close(c);
                return;
              }
              buf.append(chunk, static_cast<size_t>(n));
            }
            const size_t sp1 = buf.find(' ');
            const std::string target = buf.substr(sp1 + 1, buf.find(' ', sp1 + 1) - sp1 - 1);
            buf.erase(0, end + 4);
            const std::string body = "app " + target;
            const std::string resp =
                "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                body;
            if (::write(c, resp.data(), resp.size()) != static_cast<ssize_t>(resp.size())) break;
          }
          ::close(c);
        }).detach();
      }
    });
  }
  ~AppServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }
  std::atomic<int> connections{0};

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

// Reads one HTTP/1.1 response with a Content-Length body from a blocking
// socket; "" on EOF or error.
std::string readResponse(int fd) {
  std::string buf;
  char c;
  while (buf.find("\r\n\r\n") == std::string::npos) {
    if (::read(fd, &c, 1) != 1) return "";
    buf += c;
  }
  const size_t at = buf.find("Content-Length: ");
  if (at == std::string::npos) return buf;
  size_t left = std::stoul(buf.substr(at + 16));
  while (left > 0) {
    if (::read(fd, &c, 1) != 1) return "";
    buf += c;
    --left;
  }
  return buf;
}

// Two sessions hold filters on one port; on one keep-alive connection each
// request goes to the session whose filter matches (the earliest when both
// do, the other told) or to the application.
TEST_F(StealServiceTest, FilteredStealsRouteEachRequestOfOneConnection) {
  AppServer app;
  kernel_->original_port = app.port();
  std::vector<std::string> responses;
  std::atomic<bool> remote_done{false};
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto alice = newClient(ex, "alice");
    auto bob = newClient(ex, "bob");
    EXPECT_TRUE((co_await alice->connect()).ok());
    EXPECT_TRUE((co_await bob->connect()).ok());
    // Each session answers its streams with its name and the target.
    std::vector<v1::SubscriptionNotice> notices;
    bob->setNoticeHandler([&](const v1::SubscriptionNotice& n) { notices.push_back(n); });
    std::vector<std::string> requests_seen;
    for (auto [c, name] : {std::pair{alice, std::string("alice")}, {bob, std::string("bob")}}) {
      c->setStreamAcceptor(
          [&, c = c, name = name](std::shared_ptr<client::ClientStream> s, v1::StreamOpen open) {
            EXPECT_TRUE(open.has_stolen_request());
            EXPECT_TRUE(c->acceptStream(*s).ok());
            asio::co_spawn(
                ex,
                [&, s, open, name]() -> net::awaitable<void> {
                  std::string request;
                  while (true) {
                    auto chunk = co_await s->read();
                    if (!chunk.ok() || !*chunk) break;
                    request += **chunk;
                  }
                  requests_seen.push_back(name + ": " + request);
                  const std::string body = name + " " + open.stolen_request().path();
                  (void)co_await s->write("HTTP/1.1 200 OK\r\nContent-Length: " +
                                          std::to_string(body.size()) + "\r\n\r\n" + body);
                  (void)s->halfClose();
                },
                asio::detached);
          });
    }
    auto a = co_await subscribeFiltered(alice, app.port(), "X-User", "^alice$");
    EXPECT_TRUE(a.ok()) << a.status();
    auto b = co_await subscribeFiltered(bob, app.port(), "x-user", ".");
    EXPECT_TRUE(b.ok()) << b.status();
    // A whole-port steal of it is refused while filters hold it.
    auto whole = co_await subscribe(newClient(ex, "carol"), app.port());
    EXPECT_FALSE(whole.ok());

    const uint16_t listener = kernel_->listenerPort();
    std::thread remote([&] {
      int fd = connectTo(listener);
      for (const char* user : {"alice", "bob", "", "alice"}) {
        std::string req =
            std::string("GET /") + (*user ? user : "none") + " HTTP/1.1\r\nHost: app\r\n";
        if (*user) req += std::string("X-User: ") + user + "\r\n";
        req += "\r\n";
        writeAll(fd, req);
        responses.push_back(readResponse(fd));
      }
      ::close(fd);
      remote_done = true;
    });
    EXPECT_TRUE(co_await eventually([&] { return remote_done.load(); }));
    remote.join();
    // Bob's filter matched alice's two requests too: he is told, coalesced.
    EXPECT_TRUE(co_await eventually([&] {
      uint64_t n = 0;
      for (const auto& x : notices) n += x.overlap().requests();
      return n == 2;
    }));
    if (!notices.empty()) {
      EXPECT_EQ(notices[0].subscription_id(), *b);
      EXPECT_EQ(notices[0].overlap().taken_by_client(), "alice");
      EXPECT_EQ(notices[0].overlap().path(), "/alice");
    }
    EXPECT_EQ(requests_seen.size(), 3u);
    // The session gets the request as HTTP/1.1.
    if (!requests_seen.empty()) {
      EXPECT_EQ(requests_seen[0].rfind("alice: GET /alice HTTP/1.1\r\n", 0), 0u)
          << requests_seen[0];
    }
    alice->close();
    bob->close();
  });
  ASSERT_EQ(responses.size(), 4u);
  EXPECT_NE(responses[0].find("\r\n\r\nalice /alice"), std::string::npos) << responses[0];
  EXPECT_NE(responses[1].find("\r\n\r\nbob /bob"), std::string::npos) << responses[1];
  EXPECT_NE(responses[2].find("\r\n\r\napp /none"), std::string::npos) << responses[2];
  EXPECT_NE(responses[3].find("\r\n\r\nalice /alice"), std::string::npos) << responses[3];
  EXPECT_EQ(app.connections.load(), 1);
}

TEST_F(StealServiceTest, BadFiltersAreRefusedWithTheReason) {
  fakes::runClient([&](const asio::any_io_executor& io) -> net::awaitable<void> {
    auto c = newClient(io);
    EXPECT_TRUE((co_await c->connect()).ok());
    auto bad = co_await subscribeFiltered(c, 8080, "x-user", "(unclosed");
    EXPECT_EQ(errorCodeOf(bad.status()), v1::INVALID_ARGUMENT) << bad.status();
    EXPECT_NE(bad.status().message().find("(unclosed"), absl::string_view::npos) << bad.status();
    // Nothing was reserved or steered.
    EXPECT_FALSE(kernel_->saw("add 8080"));
    auto ok = co_await subscribe(c, 8080);
    EXPECT_TRUE(ok.ok()) << ok.status();
    c->close();
  });
}

// ------------------------------------------------------------ failover

// Two agents for one target (replicas); the client knows both.
class FailoverTest : public testing::Test {
 protected:
  void SetUp() override {
    startStealAgent(a_, kernel_a_);
    startStealAgent(b_, kernel_b_);
    kernel_a_->original_port = 8080;
    kernel_b_->original_port = 8080;
  }

  std::shared_ptr<client::Client> newClient(const asio::any_io_executor& ex) {
    client::ClientOptions o;
    o.endpoints = {a_.address(), b_.address()};
    o.token = kToken;
    o.client_name = "failover-test";
    o.failover_timeout = std::chrono::milliseconds(500);
    return client::Client::create(ex, o);
  }

  // What the client's handlers saw.
  struct Seen {
    explicit Seen(asio::any_io_executor e) : signal(e) {}
    net::Signal signal;
    std::vector<std::pair<std::shared_ptr<client::ClientStream>, v1::StreamOpen>> streams;
    std::vector<client::FailoverEvent> moves;
  };
  std::shared_ptr<Seen> watch(const std::shared_ptr<client::Client>& c,
                              const asio::any_io_executor& ex) {
    auto seen = std::make_shared<Seen>(ex);
    c->setStreamAcceptor([seen](std::shared_ptr<client::ClientStream> s, v1::StreamOpen open) {
      seen->streams.emplace_back(std::move(s), std::move(open));
    });
    c->setFailoverHandler([seen](const client::FailoverEvent& e) { seen->moves.push_back(e); });
    return seen;
  }

  // Steals port 8080 (its id in *id) and makes one connection through the
  // first agent (the remote end in *fd): the accepted stream, or nullptr
  // (the failure recorded).
  net::awaitable<std::shared_ptr<client::ClientStream>> stealOneOnA(
      std::shared_ptr<client::Client> c, std::shared_ptr<Seen> seen, uint64_t* id, int* fd) {
    auto subscribed = co_await subscribe(c, 8080);
    EXPECT_TRUE(subscribed.ok()) << subscribed.status();
    if (!subscribed.ok()) co_return nullptr;
    *id = *subscribed;
    *fd = connectTo(kernel_a_->listenerPort());
    EXPECT_TRUE(co_await eventually([&] { return seen->streams.size() == 1; }));
    if (seen->streams.size() != 1) co_return nullptr;
    auto stream = seen->streams[0].first;
    EXPECT_TRUE(c->acceptStream(*stream).ok());
    co_return stream;
  }

  std::shared_ptr<FakeKernel> kernel_a_ = std::make_shared<FakeKernel>();
  std::shared_ptr<FakeKernel> kernel_b_ = std::make_shared<FakeKernel>();
  fakes::InProcessAgent a_;
  fakes::InProcessAgent b_;
};

// The agent goes away (its Goaway): the client opens a session on the other
// agent and steals the port there under the same subscription id; the
// connection that was open on the first agent is reset with AGENT_LOST.
TEST_F(FailoverTest, LostAgentMovesTheSubscriptionsToTheNextOne) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    auto seen = watch(c, ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_EQ(c->endpoint(), a_.address());
    uint64_t id = 0;
    int fd_a = -1;
    auto first = co_await stealOneOnA(c, seen, &id, &fd_a);
    if (!first) co_return;

    a_.stop();
    EXPECT_TRUE(co_await eventually([&] { return seen->moves.size() == 1; }));
    if (seen->moves.size() != 1) co_return;
    const client::FailoverEvent& move = seen->moves[0];
    EXPECT_EQ(move.from, a_.address());
    EXPECT_EQ(move.to, b_.address());
    EXPECT_FALSE(move.draining);
    EXPECT_EQ(move.streams, 1u);
    EXPECT_EQ(move.subscriptions.size(), 1u);
    if (move.subscriptions.size() == 1) {
      EXPECT_EQ(move.subscriptions[0].first, id);
      EXPECT_TRUE(move.subscriptions[0].second.ok()) << move.subscriptions[0].second;
    }
    EXPECT_TRUE(c->lostStatus().ok()) << c->lostStatus();
    EXPECT_EQ(c->endpoint(), b_.address());
    EXPECT_TRUE(kernel_b_->saw("add 8080"));

    auto gone = co_await first->read();
    EXPECT_EQ(errorCodeOf(gone.status()), v1::AGENT_LOST) << gone.status();
    ::close(fd_a);

    // A new connection on the second replica is stolen, for the same id.
    int fd_b = connectTo(kernel_b_->listenerPort());
    EXPECT_TRUE(co_await eventually([&] { return seen->streams.size() == 2; }));
    if (seen->streams.size() == 2) {
      auto& [stream, open] = seen->streams[1];
      EXPECT_EQ(open.stolen().subscription_id(), id);
      EXPECT_TRUE(c->acceptStream(*stream).ok());
      writeAll(fd_b, "hello");
      auto chunk = co_await stream->read();
      EXPECT_TRUE(chunk.ok() && chunk->has_value() && **chunk == "hello");
    }
    ::close(fd_b);

    // Unsubscribing the client's id releases the port on the new agent.
    EXPECT_TRUE((co_await unsubscribe(c, id)).ok());
    EXPECT_TRUE(kernel_b_->saw("remove 8080"));
    c->close();
  });
}

// The agent drains: new work (the subscription) moves at once, while the
// stream open on the draining agent goes on there until it ends.
TEST_F(FailoverTest, DrainingAgentKeepsItsOpenStreamsWhileNewOnesMove) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    auto seen = watch(c, ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    uint64_t id = 0;
    int fd_a = -1;
    auto first = co_await stealOneOnA(c, seen, &id, &fd_a);
    if (!first) co_return;

    a_.server().requestDrain("test");
    EXPECT_TRUE(co_await eventually([&] { return seen->moves.size() == 1; }));
    if (seen->moves.size() != 1) co_return;
    EXPECT_TRUE(seen->moves[0].draining);
    EXPECT_EQ(seen->moves[0].streams, 1u);
    EXPECT_EQ(seen->moves[0].to, b_.address());
    EXPECT_TRUE(kernel_a_->saw("remove 8080"));
    EXPECT_TRUE(kernel_b_->saw("add 8080"));

    // The open connection still flows both ways on the draining agent.
    writeAll(fd_a, "ping");
    auto chunk = co_await first->read();
    EXPECT_TRUE(chunk.ok() && chunk->has_value() && **chunk == "ping") << chunk.status();
    EXPECT_TRUE((co_await first->write("pong")).ok());
    EXPECT_TRUE(first->halfClose().ok());
    // Read on a thread of its own: the client's loop must go on to send.
    // The receive timeout turns a lost answer into a failure, not a hang.
    timeval tv{10, 0};
    ::setsockopt(fd_a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string answer;
    std::atomic<bool> answered{false};
    std::thread reader([&] {
      answer = readAll(fd_a);
      answered = true;
    });
    EXPECT_TRUE(co_await eventually([&] { return answered.load(); }));
    reader.join();
    EXPECT_EQ(answer, "pong");
    ::close(fd_a);

    int fd_b = connectTo(kernel_b_->listenerPort());
    EXPECT_TRUE(co_await eventually([&] { return seen->streams.size() == 2; }));
    if (seen->streams.size() == 2) {
      EXPECT_EQ(seen->streams[1].second.stolen().subscription_id(), id);
    }
    ::close(fd_b);
    EXPECT_TRUE(c->lostStatus().ok()) << c->lostStatus();
    c->close();
  });
}

// File handles belong to the session that opened them: after a failover a
// handle of the lost agent is EBADF (never reopened on the new agent, whose
// own handle numbers start again), and new handles work.
TEST_F(FailoverTest, HandlesOfALostAgentStayBad) {
  char path[] = "/tmp/siphon-failover-XXXXXX";
  int tmp = ::mkstemp(path);
  ASSERT_GE(tmp, 0);
  writeAll(tmp, "contents");
  ::close(tmp);
  const std::string file = path;
  auto openFile =
      [&file](
          const std::shared_ptr<client::Client>& c) -> net::awaitable<absl::StatusOr<uint64_t>> {
    v1::Request r;
    r.mutable_file()->mutable_open()->set_path(file);
    auto resp = co_await c->call(r);
    if (!resp.ok()) co_return resp.status();
    co_return resp->file().opened().fd();
  };
  auto readFile = [](const std::shared_ptr<client::Client>& c,
                     uint64_t fd) -> net::awaitable<absl::StatusOr<std::string>> {
    v1::Request r;
    r.mutable_file()->mutable_pread()->set_fd(fd);
    r.mutable_file()->mutable_pread()->set_size(100);
    auto resp = co_await c->call(r);
    if (!resp.ok()) co_return resp.status();
    co_return resp->file().data().data();
  };
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    auto seen = watch(c, ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    auto old_fd = co_await openFile(c);
    EXPECT_TRUE(old_fd.ok()) << old_fd.status();
    if (!old_fd.ok()) co_return;
    auto got = co_await readFile(c, *old_fd);
    EXPECT_EQ(got.value_or("?"), "contents");

    a_.stop();
    EXPECT_TRUE(co_await eventually([&] { return seen->moves.size() == 1; }));
    auto stale = co_await readFile(c, *old_fd);
    EXPECT_EQ(errnoOf(stale.status()), EBADF) << stale.status();
    EXPECT_NE(stale.status().message().find(a_.address()), absl::string_view::npos)
        << stale.status();

    auto new_fd = co_await openFile(c);
    EXPECT_TRUE(new_fd.ok()) << new_fd.status();
    if (new_fd.ok()) {
      EXPECT_NE(*new_fd, *old_fd);
      EXPECT_EQ((co_await readFile(c, *new_fd)).value_or("?"), "contents");
    }
    // The old handle stays bad, and closing it says so.
    EXPECT_EQ(errnoOf((co_await readFile(c, *old_fd)).status()), EBADF);
    v1::Request close_old;
    close_old.mutable_file()->mutable_close()->set_fd(*old_fd);
    EXPECT_EQ(errnoOf((co_await c->call(close_old)).status()), EBADF);
    c->close();
  });
  ::unlink(path);
}

// No other agent answers: a lost session ends the client (the lost
// handler, AGENT_LOST naming both), and a draining one stays where it is
// (the draining handler, not a move).
TEST_F(FailoverTest, WithNoOtherAgentALostSessionEndsAndADrainingOneStays) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newClient(ex);
    auto seen = watch(c, ex);
    int drains = 0;
    c->setDrainingHandler([&drains](const v1::Draining&) { ++drains; });
    std::optional<absl::Status> lost;
    c->setLostHandler([&lost](const absl::Status& s) { lost = s; });
    EXPECT_TRUE((co_await c->connect()).ok());
    b_.stop();
    // A stolen connection keeps the draining agent up.
    uint64_t id = 0;
    int fd = -1;
    auto held = co_await stealOneOnA(c, seen, &id, &fd);
    if (!held) co_return;

    a_.server().requestDrain("test");
    EXPECT_TRUE(co_await eventually([&] { return drains == 1; }));
    EXPECT_TRUE(seen->moves.empty());
    EXPECT_TRUE(c->lostStatus().ok()) << c->lostStatus();
    writeAll(fd, "still");
    auto chunk = co_await held->read();
    EXPECT_TRUE(chunk.ok() && chunk->has_value() && **chunk == "still") << chunk.status();

    // The connection ends, the drained agent exits: now the session is
    // lost and there is nowhere to go.
    ::close(fd);
    held->reset(v1::CANCELLED, "done");
    EXPECT_TRUE(co_await eventually([&] { return lost.has_value(); }));
    if (lost) {
      EXPECT_EQ(errorCodeOf(*lost), v1::AGENT_LOST) << *lost;
      EXPECT_NE(lost->message().find("no other agent answered"), absl::string_view::npos) << *lost;
    }
    EXPECT_TRUE(seen->moves.empty());
    v1::Request info;
    info.mutable_info();
    EXPECT_EQ(errorCodeOf((co_await c->call(info)).status()), v1::AGENT_LOST);
  });
}

// A workload's session (ClientOptions::replicas): one session per pod's
// agent at once, every subscription on each, requests on the current one.
class ReplicaTest : public FailoverTest {
 protected:
  std::shared_ptr<client::Client> newReplicaClient(const asio::any_io_executor& ex,
                                                   bool reopen_files = false) {
    client::ClientOptions o;
    o.endpoints = {a_.address()};
    o.token = kToken;
    o.client_name = "replica-test";
    o.replicas = true;
    o.reopen_files = reopen_files;
    return client::Client::create(ex, o);
  }
  struct Replicas {
    std::vector<client::ReplicaEvent> events;
    size_t count(client::ReplicaEvent::Kind k) const {
      return std::count_if(events.begin(), events.end(),
                           [k](const client::ReplicaEvent& e) { return e.kind == k; });
    }
  };
  std::shared_ptr<Replicas> watchReplicas(const std::shared_ptr<client::Client>& c) {
    auto r = std::make_shared<Replicas>();
    c->setReplicaHandler([r](const client::ReplicaEvent& e) { r->events.push_back(e); });
    return r;
  }
};

// Both replicas steal the port under one id, a connection to either reaches
// the client; the current agent lost, the replica takes its place at once
// (no new subscription: it held it already) and unsubscribing releases it.
TEST_F(ReplicaTest, EveryReplicaStealsAndTheReplicaTakesOverWhenTheCurrentIsLost) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newReplicaClient(ex);
    auto seen = watch(c, ex);
    auto replicas = watchReplicas(c);
    EXPECT_TRUE((co_await c->connect()).ok());
    uint64_t id = 0;
    int fd_a = -1;
    auto first = co_await stealOneOnA(c, seen, &id, &fd_a);
    if (!first) co_return;
    EXPECT_TRUE((co_await c->addReplica(b_.address())).ok());
    EXPECT_TRUE(kernel_b_->saw("add 8080"));
    EXPECT_EQ(replicas->count(client::ReplicaEvent::Kind::kAdded), 1u);
    if (!replicas->events.empty() && replicas->events[0].subscriptions.size() == 1) {
      EXPECT_EQ(replicas->events[0].subscriptions[0].first, id);
      EXPECT_TRUE(replicas->events[0].subscriptions[0].second.ok());
    } else {
      ADD_FAILURE() << "no kAdded event with one subscription";
    }
    EXPECT_EQ(c->replicaEndpoints(), std::vector<std::string>{b_.address()});
    EXPECT_EQ(c->endpoint(), a_.address());  // requests still go to the first

    int fd_b = connectTo(kernel_b_->listenerPort());
    EXPECT_TRUE(co_await eventually([&] { return seen->streams.size() == 2; }));
    if (seen->streams.size() != 2) co_return;
    EXPECT_EQ(seen->streams[1].second.stolen().subscription_id(), id);
    auto on_b = seen->streams[1].first;
    EXPECT_TRUE(c->acceptStream(*on_b).ok());

    a_.stop();
    EXPECT_TRUE(co_await eventually(
        [&] { return replicas->count(client::ReplicaEvent::Kind::kPromoted) == 1; }));
    EXPECT_EQ(c->endpoint(), b_.address());
    EXPECT_TRUE(c->lostStatus().ok()) << c->lostStatus();
    EXPECT_EQ(seen->moves.size(), 1u);  // told as a move too
    EXPECT_EQ(errorCodeOf((co_await first->read()).status()), v1::AGENT_LOST);
    // The replica's connection never noticed.
    writeAll(fd_b, "hello");
    auto chunk = co_await on_b->read();
    EXPECT_TRUE(chunk.ok() && chunk->has_value() && **chunk == "hello") << chunk.status();
    ::close(fd_a);
    ::close(fd_b);
    EXPECT_EQ(kernel_b_->count("add 8080"), 1);  // never made again

    EXPECT_TRUE((co_await unsubscribe(c, id)).ok());
    EXPECT_TRUE(co_await eventually([&] { return kernel_b_->saw("remove 8080"); }));
    c->close();
  });
}

// promote(): the replica becomes the current session and the one before a
// replica, both still stealing; and back again.
TEST_F(ReplicaTest, PromoteSwapsTheCurrentSessionAndAReplica) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newReplicaClient(ex);
    auto replicas = watchReplicas(c);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->addReplica(b_.address())).ok());
    EXPECT_TRUE(c->promote(b_.address(), "test").ok());
    EXPECT_EQ(c->endpoint(), b_.address());
    EXPECT_EQ(c->replicaEndpoints(), std::vector<std::string>{a_.address()});
    EXPECT_EQ(replicas->count(client::ReplicaEvent::Kind::kPromoted), 1u);
    if (!replicas->events.empty()) {
      EXPECT_EQ(replicas->events.back().endpoint, b_.address());
      EXPECT_EQ(replicas->events.back().from, a_.address());
    }
    EXPECT_TRUE(c->promote(a_.address(), "back").ok());
    EXPECT_EQ(c->endpoint(), a_.address());
    EXPECT_EQ(c->replicaEndpoints(), std::vector<std::string>{b_.address()});
    EXPECT_EQ(errorCodeOf(c->promote("127.0.0.1:1", "none")), v1::NOT_FOUND);
    c->close();
  });
}

// A subscription made after the replica came is made there too; one ended
// is ended on both.
TEST_F(ReplicaTest, ASubscriptionMadeLaterReachesEveryReplica) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newReplicaClient(ex);
    auto seen = watch(c, ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->addReplica(b_.address())).ok());
    EXPECT_FALSE(kernel_b_->saw("add 8080"));
    auto id = co_await subscribe(c, 8080);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) co_return;
    EXPECT_TRUE(kernel_a_->saw("add 8080"));
    EXPECT_TRUE(kernel_b_->saw("add 8080"));
    int fd_b = connectTo(kernel_b_->listenerPort());
    EXPECT_TRUE(co_await eventually([&] { return seen->streams.size() == 1; }));
    if (seen->streams.size() == 1) {
      EXPECT_EQ(seen->streams[0].second.stolen().subscription_id(), *id);
    }
    ::close(fd_b);
    EXPECT_TRUE((co_await unsubscribe(c, *id)).ok());
    EXPECT_TRUE(kernel_a_->saw("remove 8080"));
    EXPECT_TRUE(co_await eventually([&] { return kernel_b_->saw("remove 8080"); }));
    c->close();
  });
}

// The current agent lost with no replica: calls wait, and the next replica
// added answers them; abandon() then ends the session as lost.
TEST_F(ReplicaTest, WithNoReplicaCallsWaitForTheNextOne) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newReplicaClient(ex);
    std::optional<absl::Status> lost;
    c->setLostHandler([&lost](const absl::Status& s) { lost = s; });
    EXPECT_TRUE((co_await c->connect()).ok());
    a_.stop();
    EXPECT_TRUE(co_await eventually([&] { return c->waitingForAgent(); }));
    EXPECT_TRUE(c->lostStatus().ok());
    bool answered = false;
    absl::Status answer;
    // Named: the coroutine reads its captures through the closure, which
    // must outlive it.
    auto ask = [&]() -> net::awaitable<void> {
      v1::Request r;
      r.mutable_info();
      auto resp = co_await c->call(r, std::chrono::seconds(20));
      answer = resp.status();
      answered = true;
    };
    net::spawn(ex, ask(), "waiting_call");
    asio::steady_timer t(ex);
    t.expires_after(std::chrono::milliseconds(100));
    co_await t.async_wait(net::use_awaitable);
    EXPECT_FALSE(answered);
    EXPECT_TRUE((co_await c->addReplica(b_.address())).ok());
    EXPECT_TRUE(co_await eventually([&] { return answered; }));
    EXPECT_TRUE(answer.ok()) << answer;
    EXPECT_EQ(c->endpoint(), b_.address());
    EXPECT_FALSE(c->waitingForAgent());

    b_.stop();
    EXPECT_TRUE(co_await eventually([&] { return c->waitingForAgent(); }));
    c->abandon(absl::UnavailableError("no pod of deployment/web became Ready within 1 s"));
    EXPECT_TRUE(lost.has_value());
    if (lost) {
      EXPECT_EQ(errorCodeOf(*lost), v1::AGENT_LOST);
      EXPECT_NE(lost->message().find("no pod of deployment/web"), absl::string_view::npos);
    }
    c->close();
  });
}

// reopen_files: a handle of the lost agent is opened again on the new one
// at its next use, at its offset, when the file is the same; a file that
// changed answers ESTALE, and closing it succeeds.
TEST_F(ReplicaTest, HandlesReopenWhenTheFileIsTheSameAndAreStaleWhenNot) {
  char same_path[] = "/tmp/siphon-replica-same-XXXXXX";
  char changed_path[] = "/tmp/siphon-replica-changed-XXXXXX";
  for (char* p : {same_path, changed_path}) {
    int fd = ::mkstemp(p);
    ASSERT_GE(fd, 0);
    writeAll(fd, "contents");
    ::close(fd);
  }
  auto openFile = [](const std::shared_ptr<client::Client>& c,
                     std::string path) -> net::awaitable<absl::StatusOr<uint64_t>> {
    v1::Request r;
    r.mutable_file()->mutable_open()->set_path(path);
    auto resp = co_await c->call(r);
    if (!resp.ok()) co_return resp.status();
    co_return resp->file().opened().fd();
  };
  auto readSome = [](const std::shared_ptr<client::Client>& c, uint64_t fd,
                     uint32_t n) -> net::awaitable<absl::StatusOr<std::string>> {
    v1::Request r;
    r.mutable_file()->mutable_read()->set_fd(fd);
    r.mutable_file()->mutable_read()->set_size(n);
    auto resp = co_await c->call(r);
    if (!resp.ok()) co_return resp.status();
    co_return resp->file().data().data();
  };
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = newReplicaClient(ex, /*reopen_files=*/true);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->addReplica(b_.address())).ok());
    auto same = co_await openFile(c, same_path);
    auto changed = co_await openFile(c, changed_path);
    EXPECT_TRUE(same.ok() && changed.ok());
    if (!same.ok() || !changed.ok()) co_return;
    EXPECT_EQ((co_await readSome(c, *same, 4)).value_or("?"), "cont");
    // The other file changes while the first agent has it open.
    int fd = ::open(changed_path, O_WRONLY | O_APPEND);
    writeAll(fd, " and more");
    ::close(fd);

    a_.stop();
    EXPECT_TRUE(co_await eventually([&] { return c->endpoint() == b_.address(); }));
    EXPECT_EQ((co_await readSome(c, *same, 100)).value_or("?"), "ents");
    auto stale = co_await readSome(c, *changed, 100);
    EXPECT_EQ(errnoOf(stale.status()), ESTALE) << stale.status();
    EXPECT_EQ(errnoOf((co_await readSome(c, *changed, 100)).status()), ESTALE);
    v1::Request close_changed;
    close_changed.mutable_file()->mutable_close()->set_fd(*changed);
    EXPECT_TRUE((co_await c->call(close_changed)).ok());
    v1::Request close_same;
    close_same.mutable_file()->mutable_close()->set_fd(*same);
    EXPECT_TRUE((co_await c->call(close_same)).ok());
    c->close();
  });
  ::unlink(same_path);
  ::unlink(changed_path);
}

}  // namespace
}  // namespace siphon::agent::steal
