// The outgoing service end to end, in process and without root: a
// targetless agent (its own network namespace and root, so loopback echo
// servers of the test are "inside the target") and the real client.
#include "agent/outgoing/outgoing_service.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <random>

#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/fakes/loopback.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using fakes::EchoServer;
using fakes::loopbackSocket;
using fakes::unixListener;

constexpr char kToken[] = "outgoing-test-token";

// A port nobody listens on: a TCP socket bound without listen() keeps the
// port (nobody else gets it), and connects to it are refused.
struct ClosedPort {
  ClosedPort() : fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~ClosedPort() { ::close(fd); }
  int fd;
  uint16_t port;
};

std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

v1::StreamOpen outgoing(v1::OutgoingConnect::Protocol p, std::string host, uint32_t port,
                        std::string path = "") {
  v1::StreamOpen o;
  o.mutable_outgoing()->set_protocol(p);
  o.mutable_outgoing()->set_host(std::move(host));
  o.mutable_outgoing()->set_port(port);
  o.mutable_outgoing()->set_unix_path(std::move(path));
  return o;
}

// Writes `data`, half-closes, and reads until EOF.
net::awaitable<absl::StatusOr<std::string>> echo(std::shared_ptr<client::ClientStream> s,
                                                 std::string data) {
  const auto stream = std::move(s);
  const std::string payload = std::move(data);
  CO_RETURN_IF_ERROR(co_await stream->write(payload));
  CO_RETURN_IF_ERROR(stream->halfClose());
  std::string got;
  while (true) {
    auto chunk = co_await stream->read();
    if (!chunk.ok()) co_return chunk.status();
    if (!chunk->has_value()) co_return got;
    got += **chunk;
  }
}

class OutgoingServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    AgentConfig config;
    config.listen = "127.0.0.1:0";
    config.token = kToken;
    auto procfs = std::make_unique<RealProcFs>();
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::move(procfs), spec);
  }

  // Runs `f(client)` with a connected client on a fresh io_context.
  template <typename F>
  void withClient(F f) {
    fakes::withClient(agent_.address(), kToken, std::move(f));
  }

  fakes::InProcessAgent agent_;
};

TEST_F(OutgoingServiceTest, WelcomeAdvertisesTheFeatures) {
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    const auto& f = c->welcome().features();
    EXPECT_NE(std::find(f.begin(), f.end(), v1::FEATURE_OUTGOING_TCP), f.end());
    EXPECT_NE(std::find(f.begin(), f.end(), v1::FEATURE_OUTGOING_UDP), f.end());
    EXPECT_NE(std::find(f.begin(), f.end(), v1::FEATURE_OUTGOING_UNIX), f.end());
    // One round trip, so the client's transport is up before close() (a
    // close right after connect() does not reach the agent: see the report).
    v1::Request info;
    info.mutable_info();
    EXPECT_TRUE((co_await c->call(info)).ok());
  });
}

TEST_F(OutgoingServiceTest, TcpEchoesAMebibyteByteExact) {
  EchoServer server(loopbackSocket(SOCK_STREAM), EchoServer::Kind::kStream);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto s = co_await c->openStream(outgoing(v1::OutgoingConnect::TCP, "127.0.0.1", server.port()));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) co_return;
    const std::string data = randomBytes(1 << 20, 7);
    auto got = co_await echo(*s, data);
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) {
      EXPECT_TRUE(*got == data) << "echo differs; got " << got->size() << " bytes";
    }
  });
}

// ClientStream::setSink: a consumer that takes some payloads in part, some
// not at all. What it leaves comes out of read(), and the two together are
// the stream's bytes in order; credit keeps flowing (no stall at a window).
TEST_F(OutgoingServiceTest, ASinkThatTakesPartOfTheDataLosesNothing) {
  EchoServer server(loopbackSocket(SOCK_STREAM), EchoServer::Kind::kStream);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto s = co_await c->openStream(outgoing(v1::OutgoingConnect::TCP, "127.0.0.1", server.port()));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) co_return;
    std::string got;
    size_t offers = 0, declined = 0;
    (*s)->setSink([&](std::string_view payload) -> size_t {
      // Every third offer declined, the others taken in part (at most 1000).
      if (++offers % 3 == 0) {
        ++declined;
        return 0;
      }
      size_t n = std::min<size_t>(payload.size(), 1000);
      got.append(payload.substr(0, n));
      return n;
    });
    const std::string data = randomBytes(4 << 20, 11);
    auto wrote = co_await (*s)->write(data);
    EXPECT_TRUE(wrote.ok()) << wrote;
    EXPECT_TRUE((*s)->halfClose().ok());
    while (true) {
      auto chunk = co_await (*s)->read();
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok() || !chunk->has_value()) break;
      got += **chunk;
    }
    EXPECT_GT(declined, 0u);
    EXPECT_EQ(got.size(), data.size());
    EXPECT_TRUE(got == data) << "the stream's bytes differ";
  });
}

TEST_F(OutgoingServiceTest, RefusedConnectIsATypedReset) {
  ClosedPort closed;
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto s = co_await c->openStream(outgoing(v1::OutgoingConnect::TCP, "127.0.0.1", closed.port));
    EXPECT_EQ(errorCodeOf(s.status()), v1::UNAVAILABLE) << s.status();
    EXPECT_EQ(s.status().message(), absl::StrCat("connect 127.0.0.1:", closed.port,
                                                 " from the target: Connection refused"));
  });
}

TEST_F(OutgoingServiceTest, InvalidRequestsAreRefused) {
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto none = co_await c->openStream(outgoing(v1::OutgoingConnect::PROTOCOL_UNSPECIFIED, "", 0));
    EXPECT_EQ(errorCodeOf(none.status()), v1::INVALID_ARGUMENT) << none.status();
    auto no_host = co_await c->openStream(outgoing(v1::OutgoingConnect::TCP, "", 80));
    EXPECT_EQ(errorCodeOf(no_host.status()), v1::INVALID_ARGUMENT) << no_host.status();
    auto no_port = co_await c->openStream(outgoing(v1::OutgoingConnect::TCP, "127.0.0.1", 0));
    EXPECT_EQ(errorCodeOf(no_port.status()), v1::INVALID_ARGUMENT) << no_port.status();
    auto no_path = co_await c->openStream(outgoing(v1::OutgoingConnect::UNIX_STREAM, "", 0));
    EXPECT_EQ(errorCodeOf(no_path.status()), v1::INVALID_ARGUMENT) << no_path.status();
  });
}

TEST_F(OutgoingServiceTest, NamesResolveAndManyStreamsRunAtOnce) {
  EchoServer server(loopbackSocket(SOCK_STREAM), EchoServer::Kind::kStream);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    constexpr int kStreams = 16;
    int done = 0;
    net::Signal all(ex);
    for (int i = 0; i < kStreams; ++i) {
      asio::co_spawn(
          ex,
          [&, i]() -> net::awaitable<void> {
            // "localhost" goes through getaddrinfo on the NetnsWorker.
            auto s = co_await c->openStream(outgoing(
                v1::OutgoingConnect::TCP, i % 2 ? "localhost" : "127.0.0.1", server.port()));
            EXPECT_TRUE(s.ok()) << s.status();
            if (s.ok()) {
              const std::string data = randomBytes(100000 + i, static_cast<unsigned>(i));
              auto got = co_await echo(*s, data);
              EXPECT_TRUE(got.ok() && *got == data) << "stream " << i;
            }
            if (++done == kStreams) all.notify();
          },
          asio::detached);
    }
    while (done < kStreams) co_await all.wait();
  });
}

TEST_F(OutgoingServiceTest, ConnectedUdpEchoesDatagrams) {
  EchoServer server(loopbackSocket(SOCK_DGRAM), EchoServer::Kind::kDatagram);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto s = co_await c->openStream(outgoing(v1::OutgoingConnect::UDP, "127.0.0.1", server.port()));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) co_return;
    const std::vector<std::string> datagrams = {"first", std::string(1400, 'b'), "third"};
    for (const std::string& d : datagrams) {
      EXPECT_TRUE((co_await (*s)->writeMessage(d)).ok());
      auto back = co_await (*s)->read();
      EXPECT_TRUE(back.ok() && back->has_value() && **back == d);
    }
    (*s)->reset(v1::CANCELLED, "done");
  });
}

TEST_F(OutgoingServiceTest, UnconnectedUdpCarriesEachDatagramWithItsPeer) {
  EchoServer server(loopbackSocket(SOCK_DGRAM), EchoServer::Kind::kDatagram);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    // No host: an unconnected socket in the target; every datagram names
    // its peer.
    auto s = co_await c->openStream(outgoing(v1::OutgoingConnect::UDP, "", 0));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) co_return;
    v1::SocketAddress peer;
    peer.set_ip("127.0.0.1");
    peer.set_port(server.port());
    for (const std::string d : {"one", "two, longer", "three"}) {
      EXPECT_TRUE((co_await (*s)->writeDatagram(peer, d)).ok());
      auto back = co_await (*s)->readDatagram();
      EXPECT_TRUE(back.ok()) << back.status();
      if (!back.ok() || !back->has_value()) co_return;
      EXPECT_EQ((*back)->payload(), d);
      EXPECT_EQ((*back)->peer().port(), server.port());
      EXPECT_EQ((*back)->peer().ip(), "127.0.0.1");
    }
    (*s)->reset(v1::CANCELLED, "done");
  });
}

TEST_F(OutgoingServiceTest, UnixPathAndAbstractSockets) {
  char tmpl[] = "/tmp/siphon-outgoing-svc-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string abstract = "@siphon-outgoing-test-" + std::to_string(getpid());
  {
    EchoServer by_path(unixListener(dir + "/echo.sock", SOCK_STREAM), EchoServer::Kind::kStream);
    EchoServer seq(unixListener(dir + "/seq.sock", SOCK_SEQPACKET), EchoServer::Kind::kStream);
    EchoServer by_name(unixListener(abstract, SOCK_STREAM), EchoServer::Kind::kStream);
    withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
      auto p = co_await c->openStream(
          outgoing(v1::OutgoingConnect::UNIX_STREAM, "", 0, dir + "/echo.sock"));
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) {
        auto got = co_await echo(*p, "over a path");
        EXPECT_TRUE(got.ok() && *got == "over a path");
      }
      auto a = co_await c->openStream(outgoing(v1::OutgoingConnect::UNIX_STREAM, "", 0, abstract));
      EXPECT_TRUE(a.ok()) << a.status();
      if (a.ok()) {
        auto got = co_await echo(*a, "over an abstract name");
        EXPECT_TRUE(got.ok() && *got == "over an abstract name");
      }
      auto q = co_await c->openStream(
          outgoing(v1::OutgoingConnect::UNIX_SEQPACKET, "", 0, dir + "/seq.sock"));
      EXPECT_TRUE(q.ok()) << q.status();
      if (q.ok()) {
        EXPECT_TRUE((co_await (*q)->writeMessage("rec-1")).ok());
        EXPECT_TRUE((co_await (*q)->writeMessage("record-2")).ok());
        auto r1 = co_await (*q)->read();
        auto r2 = co_await (*q)->read();
        EXPECT_TRUE(r1.ok() && r1->has_value() && **r1 == "rec-1");
        EXPECT_TRUE(r2.ok() && r2->has_value() && **r2 == "record-2");
        EXPECT_TRUE((*q)->halfClose().ok());
        auto end = co_await (*q)->read();
        EXPECT_TRUE(end.ok() && !end->has_value());
      }
      // Wrong type: a stream socket at a seqpacket listener.
      auto wrong = co_await c->openStream(
          outgoing(v1::OutgoingConnect::UNIX_STREAM, "", 0, dir + "/seq.sock"));
      EXPECT_EQ(errorCodeOf(wrong.status()), v1::INVALID_ARGUMENT) << wrong.status();
      auto missing = co_await c->openStream(
          outgoing(v1::OutgoingConnect::UNIX_STREAM, "", 0, dir + "/missing.sock"));
      EXPECT_EQ(errorCodeOf(missing.status()), v1::NOT_FOUND) << missing.status();
      EXPECT_EQ(missing.status().message(),
                "connect unix " + dir + "/missing.sock from the target: No such file or directory");
    });
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST_F(OutgoingServiceTest, ClosingTheSessionClosesItsConnections) {
  // A listener the test accepts from itself, to watch the agent's side.
  int listener = loopbackSocket(SOCK_STREAM);
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto s =
        co_await c->openStream(outgoing(v1::OutgoingConnect::TCP, "127.0.0.1", ntohs(a.sin_port)));
    EXPECT_TRUE(s.ok()) << s.status();
  });
  // withClient closed the session: the agent closes the socket (EOF here).
  int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(conn, 0);
  timeval hang_guard{30, 0};  // only turns a hang into a failure
  ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &hang_guard, sizeof(hang_guard));
  char buf[16];
  EXPECT_EQ(::recv(conn, buf, sizeof(buf), 0), 0) << "the agent must close the connection";
  ::close(conn);
  ::close(listener);
}

}  // namespace
}  // namespace siphon::agent
