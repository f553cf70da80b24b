// The typed client API's streams (siphon/client/connections.h, capture.h)
// against the real agent in process over loopback: a targetless agent, so
// the test's echo servers on 127.0.0.1 and its unix sockets are "inside the
// target". Outgoing UDP (connected, and unconnected with sendTo and
// receiveFrom), unix stream (a path and an abstract name) and seqpacket, and
// capture. No root: captures read from a fake packet source (the agent's
// libpcap source needs CAP_NET_RAW, tests/privileged/capture) with the real
// filter compiler; against the real source, only what needs no privilege
// (an interface that does not exist) is tested.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "agent/capture/capture_service.h"
#include "agent/capture/pcap_file.h"
#include "agent/server/server.h"
#include "agent/target/proc_fs.h"
#include "siphon/client/capture.h"
#include "siphon/client/connections.h"
#include "siphon/client/errors.h"
#include "siphon/client/target.h"
#include "siphon/status.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/fake_packet_source.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/fakes/loopback.h"

namespace siphon::client {
namespace {

namespace asio = net::asio;
using fakes::EchoServer;
using fakes::loopbackSocket;
using fakes::randomBytes;
using fakes::unixListener;
using fakes::FakePacketSource;
using fakes::FakePacketSourceState;

constexpr char kToken[] = "typed-connections-token";

// A scratch directory for unix sockets, removed with what is in it.
class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/siphon-typed-conn-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes `data` in `pieces` writes, half-closes, and reads until the
// peer's FIN: what came back. Free function (GCC 12: by-value parameters of
// lambda coroutines are destroyed twice).
net::awaitable<absl::StatusOr<std::string>> echoThrough(Connection* conn, std::string data,
                                                        size_t pieces) {
  const size_t step = data.size() / pieces + 1;
  for (size_t off = 0; off < data.size(); off += step) {
    absl::Status wrote = co_await conn->write(data.substr(off, step));
    if (!wrote.ok()) co_return wrote;
  }
  absl::Status closed = conn->halfClose();
  if (!closed.ok()) co_return closed;
  std::string got;
  while (true) {
    auto chunk = co_await conn->read();
    if (!chunk.ok()) co_return chunk.status();
    if (!chunk->has_value()) co_return got;
    got += **chunk;
  }
}

class TypedConnectionsTest : public ::testing::Test {
 protected:
  // The agent; with `fake_capture`, its capture service opens fake sources
  // (or fails with open_error_) and compiles filters with libpcap.
  void start(bool fake_capture = false) {
    agent::AgentConfig config;
    config.token = kToken;
    agent::TargetSpec spec;
    spec.mode = agent::TargetMode::kTargetless;
    std::function<void(agent::Server&)> before_run;
    if (fake_capture) {
      before_run = [this](agent::Server& s) {
        agent::capture::CaptureOptions o;
        o.open_source = [this](const agent::capture::CaptureSpec& asked)
            -> absl::StatusOr<std::unique_ptr<agent::capture::PacketSource>> {
          ++opens_;
          std::lock_guard<std::mutex> l(mu_);
          last_spec_ = asked;
          if (!open_error_.ok()) return open_error_;
          return std::make_unique<FakePacketSource>(source_, asked.snaplen);
        };
        // The kernel's drop counter is read after every read, so a drop
        // shows as soon as a packet follows it (not on a timer).
        o.stream.stats_interval = std::chrono::milliseconds(0);
        s.services().addStream(v1::StreamOpen::kCapture,
                               agent::capture::makeCaptureService(s.serviceContext(), o));
      };
    }
    agent_.start(config, std::make_unique<agent::RealProcFs>(), spec, before_run);
  }

  TargetOptions options() {
    TargetOptions o;
    o.endpoints = {agent_.address()};
    o.token = kToken;
    o.client_name = "typed-connections-test";
    return o;
  }

  agent::capture::CaptureSpec lastSpec() {
    std::lock_guard<std::mutex> l(mu_);
    return last_spec_;
  }
  void failOpens(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    open_error_ = std::move(s);
  }

  fakes::InProcessAgent agent_;
  std::shared_ptr<FakePacketSourceState> source_ = std::make_shared<FakePacketSourceState>();
  std::atomic<int> opens_{0};
  std::mutex mu_;
  agent::capture::CaptureSpec last_spec_;  // written on the agent's netns thread
  absl::Status open_error_;
};

// ------------------------------------------------------------------- UDP

TEST_F(TypedConnectionsTest, ConnectedUdpKeepsEachDatagramWhole) {
  EchoServer echo(loopbackSocket(SOCK_DGRAM), EchoServer::Kind::kDatagram);
  start();
  const uint16_t port = echo.port();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    Connections connections(target);
    auto conn = co_await connections.connectUdp("127.0.0.1", port);
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) co_return;
    EXPECT_EQ(conn->kind(), Connection::Kind::kUdp);
    EXPECT_EQ(conn->remote().text(), "127.0.0.1:" + std::to_string(port));
    EXPECT_EQ(conn->local().ip, "127.0.0.1");
    EXPECT_NE(conn->local().port, 0);
    EXPECT_NE(conn->local().port, port);

    // All sent before any is read: each read is one datagram, not the
    // bytes of several run together.
    const std::vector<std::string> datagrams{"first", randomBytes(1400, 1), "third"};
    for (const std::string& d : datagrams) {
      absl::Status wrote = co_await conn->write(d);
      EXPECT_TRUE(wrote.ok()) << wrote;
    }
    for (const std::string& d : datagrams) {
      auto back = co_await conn->read();
      EXPECT_TRUE(back.ok()) << back.status();
      if (!back.ok() || !back->has_value()) co_return;
      EXPECT_EQ(**back, d);
    }

    // One datagram above what one frame carries is refused, whole, here.
    auto too_big = co_await conn->write(std::string(2 * 1024 * 1024, 'x'));
    EXPECT_EQ(errorCode(too_big), ErrorCode::kInvalidArgument) << too_big;
    // ... and the connection goes on.
    EXPECT_TRUE((co_await conn->write("after")).ok());
    auto after = co_await conn->read();
    EXPECT_TRUE(after.ok() && after->has_value() && **after == "after");
    conn->reset();
    target.close();
  });
}

TEST_F(TypedConnectionsTest, UnconnectedUdpNamesThePeerOfEachDatagram) {
  EchoServer a(loopbackSocket(SOCK_DGRAM), EchoServer::Kind::kDatagram);
  EchoServer b(loopbackSocket(SOCK_DGRAM), EchoServer::Kind::kDatagram);
  start();
  const uint16_t port_a = a.port();
  const uint16_t port_b = b.port();
  ASSERT_NE(port_a, port_b);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    Connections connections(target);
    auto conn = co_await connections.openUdp();
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) co_return;
    EXPECT_EQ(conn->kind(), Connection::Kind::kUnconnectedUdp);

    // One at a time: each answer names the server it came from. (GCC 12:
    // no braced lists in a coroutine's co_await arguments or range-for.)
    std::vector<std::pair<uint16_t, std::string>> one_by_one;
    one_by_one.emplace_back(port_a, "to a");
    one_by_one.emplace_back(port_b, "to b");
    for (const auto& entry : one_by_one) {
      SocketAddress to;
      to.ip = "127.0.0.1";
      to.port = entry.first;
      absl::Status sent = co_await conn->sendTo(to, entry.second);
      EXPECT_TRUE(sent.ok()) << sent;
      auto back = co_await conn->receiveFrom();
      EXPECT_TRUE(back.ok()) << back.status();
      if (!back.ok() || !back->has_value()) co_return;
      EXPECT_EQ((*back)->payload, entry.second);
      EXPECT_EQ((*back)->peer.ip, "127.0.0.1");
      EXPECT_EQ((*back)->peer.port, entry.first);
    }

    // Several in flight to both: every payload comes back once, from the
    // peer it was sent to (the order between the two servers is theirs).
    std::map<std::string, uint16_t> sent;
    for (int i = 0; i < 6; ++i) {
      const uint16_t port = i % 2 == 0 ? port_a : port_b;
      std::string payload = "datagram " + std::to_string(i) + std::string(i * 100, '.');
      sent[payload] = port;
      SocketAddress to;
      to.ip = "127.0.0.1";
      to.port = port;
      absl::Status s = co_await conn->sendTo(to, payload);
      EXPECT_TRUE(s.ok()) << s;
    }
    std::map<std::string, uint16_t> received;
    for (int i = 0; i < 6; ++i) {
      auto back = co_await conn->receiveFrom();
      EXPECT_TRUE(back.ok()) << back.status();
      if (!back.ok() || !back->has_value()) co_return;
      EXPECT_EQ(received.count((*back)->payload), 0u) << "twice: " << (*back)->payload;
      received[(*back)->payload] = (*back)->peer.port;
    }
    EXPECT_EQ(received, sent);
    conn->reset();
    target.close();
  });
}

// ------------------------------------------------------------------ unix

TEST_F(TypedConnectionsTest, UnixStreamByPathAndAbstractNameWithHalfClose) {
  ScratchDir dir;
  const std::string abstract = "@siphon-typed-conn-" + std::to_string(::getpid());
  EchoServer by_path(unixListener(dir / "echo.sock", SOCK_STREAM), EchoServer::Kind::kStream);
  EchoServer by_name(unixListener(abstract, SOCK_STREAM), EchoServer::Kind::kStream);
  start();
  const std::string path = dir / "echo.sock";
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    Connections connections(target);

    auto conn = co_await connections.connectUnix(path);
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) co_return;
    EXPECT_EQ(conn->kind(), Connection::Kind::kUnixStream);
    // More than one window, in pieces; after the half-close ("no more from
    // me") the echo still comes back whole, then the server's FIN.
    const std::string payload = randomBytes(700 * 1024, 2);
    auto got = co_await echoThrough(&*conn, payload, 7);
    EXPECT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got.ok() ? got->size() : 0u, payload.size());
    EXPECT_TRUE(got.ok() && *got == payload) << "the echo differs";
    // Nothing more to say once half-closed; the FIN stays.
    EXPECT_FALSE((co_await conn->write("late")).ok());
    auto again = co_await conn->read();
    EXPECT_TRUE(again.ok() && !again->has_value());

    auto named = co_await connections.connectUnix(abstract);
    EXPECT_TRUE(named.ok()) << named.status();
    if (named.ok()) {
      auto echoed = co_await echoThrough(&*named, "over an abstract name", 1);
      EXPECT_EQ(echoed.value_or("?"), "over an abstract name");
    }
    EXPECT_EQ(by_path.connections(), 1);
    EXPECT_EQ(by_name.connections(), 1);

    auto missing = co_await connections.connectUnix(dir / "missing.sock");
    EXPECT_EQ(errorCode(missing.status()), ErrorCode::kNotFound) << missing.status();
    EXPECT_EQ(missing.status().message(), "connect unix " + (dir / "missing.sock") +
                                              " from the target: No such file or directory");
    target.close();
  });
}

TEST_F(TypedConnectionsTest, SeqpacketKeepsRecordBoundaries) {
  ScratchDir dir;
  EchoServer seq(unixListener(dir / "seq.sock", SOCK_SEQPACKET), EchoServer::Kind::kStream);
  start();
  const std::string path = dir / "seq.sock";
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    Connections connections(target);
    auto conn = co_await connections.connectSeqpacket(path);
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) co_return;
    EXPECT_EQ(conn->kind(), Connection::Kind::kUnixSeqpacket);

    // All written before any is read: one read is one record.
    const std::vector<std::string> records = {"rec-1", randomBytes(16 * 1024, 3), "r3"};
    for (const std::string& r : records) {
      absl::Status wrote = co_await conn->write(r);
      EXPECT_TRUE(wrote.ok()) << wrote;
    }
    for (const std::string& r : records) {
      auto back = co_await conn->read();
      EXPECT_TRUE(back.ok()) << back.status();
      if (!back.ok() || !back->has_value()) co_return;
      EXPECT_EQ((*back)->size(), r.size());
      EXPECT_TRUE(**back == r);
    }
    // Half-close: the server sees the end and closes its side: our EOF.
    EXPECT_TRUE(conn->halfClose().ok());
    auto end = co_await conn->read();
    EXPECT_TRUE(end.ok()) << end.status();
    EXPECT_TRUE(end.ok() && !end->has_value());

    // A stream socket cannot connect to a seqpacket listener; the other
    // way round neither.
    auto wrong = co_await connections.connectUnix(path);
    EXPECT_EQ(errorCode(wrong.status()), ErrorCode::kInvalidArgument) << wrong.status();
    target.close();
  });
  EXPECT_EQ(seq.connections(), 1);
}

// --------------------------------------------------------------- capture

TEST_F(TypedConnectionsTest, CaptureIsAPcapFileWithGapsForDrops) {
  start(/*fake_capture=*/true);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    CaptureSpec spec;
    spec.interface = "eth0";
    spec.filter = "tcp port 80";
    spec.snaplen = 1500;
    auto capture = co_await Capture::start(target, spec);
    EXPECT_TRUE(capture.ok()) << capture.status();
    if (!capture.ok()) co_return;
    EXPECT_EQ(opens_, 1);
    EXPECT_EQ(lastSpec().interface, "eth0");
    EXPECT_EQ(lastSpec().snaplen, 1500u);
    // Compiled by libpcap, installed on the source.
    EXPECT_EQ(source_->installedFilter(), "tcp port 80");

    auto header = co_await capture->next();
    EXPECT_TRUE(header.ok() && header->has_value()) << header.status();
    if (!header.ok() || !header->has_value()) co_return;
    EXPECT_EQ((*header)->kind, CaptureEvent::Kind::kHeader);
    EXPECT_EQ((*header)->bytes, agent::capture::globalHeader(FakePacketSource::kLinkType, 1500));

    const std::vector<std::string> sent = {"first packet", randomBytes(1400, 4), "third"};
    for (const auto& p : sent) source_->push(p);
    for (size_t i = 0; i < sent.size(); ++i) {
      auto r = co_await capture->next();
      EXPECT_TRUE(r.ok() && r->has_value()) << r.status();
      if (!r.ok() || !r->has_value()) co_return;
      EXPECT_EQ((*r)->kind, CaptureEvent::Kind::kPacket);
      EXPECT_EQ((*r)->bytes, agent::capture::record(FakePacketSource::packetFor(i, sent[i])));
    }

    // The kernel dropped 3: a gap says so, never silence.
    source_->setKernelDrops(3);
    source_->push("after the drops");
    auto after = co_await capture->next();
    EXPECT_TRUE(after.ok() && after->has_value()) << after.status();
    if (!after.ok() || !after->has_value()) co_return;
    EXPECT_EQ((*after)->kind, CaptureEvent::Kind::kPacket);
    EXPECT_EQ((*after)->bytes,
              agent::capture::record(FakePacketSource::packetFor(3, "after the drops")));
    auto gap = co_await capture->next();
    EXPECT_TRUE(gap.ok() && gap->has_value()) << gap.status();
    if (!gap.ok() || !gap->has_value()) co_return;
    EXPECT_EQ((*gap)->kind, CaptureEvent::Kind::kGap);
    EXPECT_EQ((*gap)->gap_packets, 3u);

    // stop() ends it on the agent: the source is closed.
    capture->stop();
    EXPECT_TRUE(co_await fakes::eventually([&] { return source_->closed.load(); }))
        << "the agent still captures";
    auto stopped = co_await capture->next();
    EXPECT_FALSE(stopped.ok() && stopped->has_value()) << "an event after stop()";
    target.close();
  });
}

TEST_F(TypedConnectionsTest, CaptureRefusalsAreTyped) {
  start(/*fake_capture=*/true);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());

    // libpcap's words for a filter it cannot parse; nothing opened stays.
    CaptureSpec bad_filter;
    bad_filter.filter = "tcp prot 80";
    auto parse = co_await Capture::start(target, bad_filter);
    EXPECT_EQ(errorCode(parse.status()), ErrorCode::kInvalidArgument) << parse.status();
    EXPECT_NE(parse.status().message().find("tcp prot 80"), absl::string_view::npos)
        << parse.status();

    // A malformed interface name never reaches the source.
    const int opens = opens_;
    CaptureSpec malformed;
    malformed.interface = "../../etc";
    auto refused = co_await Capture::start(target, malformed);
    EXPECT_EQ(errorCode(refused.status()), ErrorCode::kInvalidArgument) << refused.status();
    EXPECT_EQ(opens_, opens);

    // The source's refusal, as it said it.
    failOpens(protoError(v1::NOT_FOUND,
                         "capture on interface 'nosuch0' in the target: No such "
                         "device exists (SIOCGIFINDEX)"));
    CaptureSpec unknown;
    unknown.interface = "nosuch0";
    auto missing = co_await Capture::start(target, unknown);
    EXPECT_EQ(errorCode(missing.status()), ErrorCode::kNotFound) << missing.status();
    EXPECT_NE(missing.status().message().find("'nosuch0'"), absl::string_view::npos)
        << missing.status();

    // The session serves on.
    failOpens(absl::OkStatus());
    auto works = co_await Capture::start(target, CaptureSpec());
    EXPECT_TRUE(works.ok()) << works.status();
    target.close();
  });
}

// A drain ends a capture at once, typed.
TEST_F(TypedConnectionsTest, ADrainEndsTheCaptureWithAgentDraining) {
  start(/*fake_capture=*/true);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    auto capture = co_await Capture::start(target, CaptureSpec());
    EXPECT_TRUE(capture.ok()) << capture.status();
    if (!capture.ok()) co_return;
    auto header = co_await capture->next();
    EXPECT_TRUE(header.ok() && header->has_value() &&
                (*header)->kind == CaptureEvent::Kind::kHeader);
    agent_.server().requestDrain("test");
    absl::Status end;
    while (true) {
      auto e = co_await capture->next();
      if (!e.ok()) {
        end = e.status();
        break;
      }
      EXPECT_TRUE(e->has_value()) << "an end of file rather than the drain's reset";
      if (!e->has_value()) break;
    }
    EXPECT_EQ(errorCode(end), ErrorCode::kAgentDraining) << end;
    target.close();
  });
}

// The real (libpcap) source: an interface the target does not have. With
// CAP_NET_RAW libpcap looks it up (kNotFound); without, it cannot open a
// packet socket at all (kPermissionDenied). Either way a typed status, not
// a hang or an empty file.
TEST_F(TypedConnectionsTest, TheRealCaptureRefusesAnUnknownInterface) {
  const int probe = ::socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
  const bool privileged = probe >= 0;
  if (probe >= 0) ::close(probe);
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Target target = Target::create(ex, options());
    EXPECT_TRUE((co_await target.connect()).ok());
    CaptureSpec spec;
    spec.interface = "nosuch0";
    auto capture = co_await Capture::start(target, spec);
    EXPECT_FALSE(capture.ok());
    EXPECT_EQ(errorCode(capture.status()),
              privileged ? ErrorCode::kNotFound : ErrorCode::kPermissionDenied)
        << capture.status();
    if (privileged) {
      EXPECT_NE(capture.status().message().find("nosuch0"), absl::string_view::npos)
          << capture.status();
    }
    target.close();
  });
}

}  // namespace
}  // namespace siphon::client
