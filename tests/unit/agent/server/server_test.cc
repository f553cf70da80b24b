// The agent's server and the Asio client end to end, in process, on
// loopback: handshake, auth, requests, concurrent sessions, resume after a
// cut, and typed rejections. No root: the target is a fake /proc.
#include "agent/server/server.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "siphon/client/client.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "tests/fakes/eventually.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using std::chrono::milliseconds;

constexpr pid_t kPodPid = 4242;
constexpr char kToken[] = "s3cret-token";

class ServerTest : public testing::Test {
 protected:
  void start(AgentConfig config = {}) {
    config.listen = "127.0.0.1:0";
    config.token = kToken;
    auto procfs = std::make_unique<fakes::FakeProcFs>();
    procfs->setSelfPid(kPodPid);
    fakes::FakeProcess pod;
    pod.environ = std::string("SIPHON_POD=hello\0OTHER=x\0SIPHON_B=2\0", 36);
    pod.netns_inode = 4026530001;
    procfs->addProcess(kPodPid, pod);
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::move(procfs), spec);
    address_ = agent_.address();
  }

  client::ClientOptions options(std::string token = kToken) {
    client::ClientOptions o;
    o.endpoints = {address_};
    o.token = std::move(token);
    o.client_name = "server-test";
    return o;
  }

  // Runs a coroutine on a fresh client io_context until it finishes.
  template <typename F>
  void runClient(F f) {
    fakes::runClient(std::move(f));
  }

  fakes::InProcessAgent agent_;
  std::string address_;
};

v1::Request infoRequest() {
  v1::Request r;
  r.mutable_info();
  return r;
}

TEST_F(ServerTest, InfoAndFilteredEnvComeFromTheTarget) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    absl::Status s = co_await c->connect();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(c->welcome().target().mode(), "targetless");
    EXPECT_EQ(c->welcome().target().pid(), kPodPid);

    auto info = co_await c->call(infoRequest());
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) {
      EXPECT_EQ(info->info().sessions(), 1u);
      EXPECT_EQ(info->info().session_id(), c->welcome().session_id());
      EXPECT_EQ(info->info().target().netns_inode(), 4026530001u);
    }

    v1::Request env;
    env.mutable_env()->add_include("SIPHON_*");
    auto r = co_await c->call(env);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok() && r->env().vars_size() == 2) {
      EXPECT_EQ(r->env().vars(0).name(), "SIPHON_B");
      EXPECT_EQ(r->env().vars(1).name(), "SIPHON_POD");
      EXPECT_EQ(r->env().vars(1).value(), "hello");
    } else if (r.ok()) {
      ADD_FAILURE() << "want 2 variables, got " << r->env().ShortDebugString();
    }
    c->close();
  });
}

TEST_F(ServerTest, WrongTokenIsRejectedAsUnauthenticated) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options("not-the-token"));
    absl::Status s = co_await c->connect();
    EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  });
}

TEST_F(ServerTest, TwoConcurrentSessionsAreServed) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto a = client::Client::create(ex, options());
    auto b = client::Client::create(ex, options());
    EXPECT_TRUE((co_await a->connect()).ok());
    EXPECT_TRUE((co_await b->connect()).ok());
    EXPECT_NE(a->welcome().session_id(), b->welcome().session_id());
    auto ia = co_await a->call(infoRequest());
    auto ib = co_await b->call(infoRequest());
    EXPECT_TRUE(ia.ok() && ib.ok());
    if (ia.ok() && ib.ok()) {
      EXPECT_EQ(ia->info().sessions(), 2u);
      EXPECT_EQ(ib->info().session_id(), b->welcome().session_id());
    }
    a->close();
    b->close();
  });
}

TEST_F(ServerTest, UnimplementedRequestsAndStreamsAnswerAtOnce) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    // Every request kind is served now; a kind this agent does not know (a
    // newer client's) parses as a request with no body.
    v1::Request unknown;
    auto r = co_await c->call(unknown, milliseconds(5000));
    EXPECT_EQ(errorCodeOf(r.status()), v1::INVALID_ARGUMENT) << r.status();

    v1::StreamOpen open;
    open.mutable_stolen()->set_subscription_id(1);  // a kind only the agent opens
    auto stream = co_await c->openStream(open);
    EXPECT_EQ(errorCodeOf(stream.status()), v1::UNIMPLEMENTED) << stream.status();
    c->close();
  });
}

// An idle client (no call, no stream) still learns that its session is
// gone: the agent stopping sends Goaway, and the lost handler fires once.
TEST_F(ServerTest, IdleClientHearsThatTheSessionIsLost) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    int calls = 0;
    absl::Status why;
    net::Signal lost(ex);
    c->setLostHandler([&](const absl::Status& s) {
      ++calls;
      why = s;
      lost.notify();
    });
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->call(infoRequest(), milliseconds(5000))).ok());
    agent_.stop();
    while (calls == 0) co_await lost.wait();
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(errorCodeOf(why), v1::AGENT_LOST) << why;
    c->close();
    EXPECT_EQ(calls, 1);  // close() after the loss says nothing more
  });
}

// close() is the client's own doing: not a loss to report.
TEST_F(ServerTest, CloseDoesNotCallTheLostHandler) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    int calls = 0;
    c->setLostHandler([&](const absl::Status&) { ++calls; });
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->call(infoRequest(), milliseconds(5000))).ok());
    c->close();
    EXPECT_EQ(calls, 0);
  });
}

TEST_F(ServerTest, RequestsQueuedDuringACutAreAnsweredAfterResume) {
  start();
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->call(infoRequest())).ok());
    c->cutTransportForTest();
    auto info = co_await c->call(infoRequest(), milliseconds(10000));
    EXPECT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(c->resumeCountForTest(), 1u);
    if (info.ok()) {
      // Same session on the agent, not a new one.
      EXPECT_EQ(info->info().session_id(), c->welcome().session_id());
      EXPECT_EQ(info->info().sessions(), 1u);
    }
    c->close();
  });
}

// Raw handshakes: what a foreign or broken client gets.
class RawHandshakeTest : public ServerTest {
 protected:
  absl::StatusOr<v1::Frame> exchange(const std::string& bytes) {
    absl::StatusOr<v1::Frame> out = absl::InternalError("not run");
    runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
      net::tcp::socket socket(ex);
      std::string host, port;
      EXPECT_TRUE(net::splitHostPort(address_, &host, &port).ok());
      net::error_code ec;
      co_await socket.async_connect(
          net::tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(std::stoi(port))),
          asio::redirect_error(net::use_awaitable, ec));
      EXPECT_FALSE(ec) << ec.message();
      co_await asio::async_write(socket, asio::buffer(bytes),
                                 asio::redirect_error(net::use_awaitable, ec));
      auto f = co_await net::readFirstFrame(socket, milliseconds(5000), 1 << 20);
      if (f.ok()) {
        out = f->frame;
      } else {
        out = f.status();
      }
    });
    return out;
  }
};

TEST_F(RawHandshakeTest, MajorVersionMismatchNamesBothVersions) {
  start();
  v1::Frame hello = protocol::makeHello("raw", kToken, {}, nullptr);
  hello.mutable_hello()->mutable_version()->set_major(2);
  hello.mutable_hello()->mutable_version()->set_minor(3);
  auto f = exchange(protocol::encodeFrame(hello));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_reject());
  EXPECT_EQ(f->reject().code(), v1::UNSUPPORTED_VERSION);
  EXPECT_NE(f->reject().message().find("2.3"), std::string::npos) << f->reject().message();
  EXPECT_NE(f->reject().message().find(protocol::versionString(protocol::currentVersion())),
            std::string::npos)
      << f->reject().message();
}

TEST_F(RawHandshakeTest, ResumeOfAnUnknownSessionIsSessionExpired) {
  start();
  v1::ResumeRequest resume;
  resume.set_session_id("feedfacefeedface");
  resume.set_resume_token("whatever");
  auto f = exchange(protocol::encodeFrame(protocol::makeHello("raw", kToken, {}, &resume)));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_reject());
  EXPECT_EQ(f->reject().code(), v1::SESSION_EXPIRED);
}

TEST_F(RawHandshakeTest, OversizedFirstFrameIsFrameTooLarge) {
  start();
  auto f = exchange(std::string("\x7f\xff\xff\xff", 4));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_reject());
  EXPECT_EQ(f->reject().code(), v1::FRAME_TOO_LARGE);
}

// Before the handshake the client is unknown: a first frame above 64 KiB
// (a Hello is a few hundred bytes) is refused before it is buffered.
TEST_F(RawHandshakeTest, FirstFrameAbove64KiBIsFrameTooLarge) {
  start();
  v1::Frame hello = protocol::makeHello(std::string(70 << 10, 'n'), kToken, {}, nullptr);
  auto f = exchange(protocol::encodeFrame(hello));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_reject());
  EXPECT_EQ(f->reject().code(), v1::FRAME_TOO_LARGE);
  // A Hello of ordinary size still gets in.
  auto ok = exchange(protocol::encodeFrame(protocol::makeHello("ok", kToken, {}, nullptr)));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->has_welcome());
}

TEST_F(RawHandshakeTest, GarbageIsAProtocolError) {
  start();
  auto f = exchange(std::string("\x00\x00\x00\x05\xff\xff\xff\xff\xff", 9));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_reject());
  EXPECT_EQ(f->reject().code(), v1::PROTOCOL_ERROR);
}

// A raw session: Hello, the Welcome, optionally an info request and its
// answer, then the connection is cut without a Goaway.
void handshakeAndCut(const std::string& address, bool send_request) {
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    net::tcp::socket socket(ex);
    std::string host, port;
    EXPECT_TRUE(net::splitHostPort(address, &host, &port).ok());
    net::error_code ec;
    co_await socket.async_connect(
        net::tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(std::stoi(port))),
        asio::redirect_error(net::use_awaitable, ec));
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE((co_await net::writeFrame(socket, protocol::makeHello("cut", kToken, {}, nullptr)))
                    .ok());
    auto welcome = co_await net::readFirstFrame(socket, milliseconds(5000), 1 << 20);
    EXPECT_TRUE(welcome.ok() && welcome->frame.has_welcome());
    if (send_request) {
      v1::Frame f;
      *f.mutable_request() = infoRequest();
      f.mutable_request()->set_request_id(1);
      EXPECT_TRUE((co_await net::writeFrame(socket, f)).ok());
      // Up to the answer: the agent has counted the request.
      protocol::FrameDecoder decoder(1 << 20);
      decoder.feed(welcome.ok() ? welcome->leftover : "");
      bool answered = false;
      while (!answered) {
        auto next = decoder.next();
        if (!next.ok()) break;
        if (next->has_value()) {
          answered = !(*next)->is_data && (*next)->frame.has_response();
          continue;
        }
        auto buf = decoder.prepare(4096);
        size_t n = co_await socket.async_read_some(asio::buffer(buf.data(), buf.size()),
                                                   asio::redirect_error(net::use_awaitable, ec));
        if (ec) break;
        decoder.commit(n);
      }
      EXPECT_TRUE(answered);
    }
    socket.close(ec);
  });
}

// At --max-sessions, sessions cut right after the handshake (nothing sent,
// nothing to resume) make room for a new client; sessions that sent
// something are kept for their resume, and the new client is refused.
TEST_F(RawHandshakeTest, SessionLimitEvictsOnlyDetachedSessionsThatSentNothing) {
  AgentConfig config;
  config.max_sessions = 2;
  start(config);
  handshakeAndCut(address_, /*send_request=*/true);
  handshakeAndCut(address_, /*send_request=*/true);
  auto refused = exchange(protocol::encodeFrame(protocol::makeHello("new", kToken, {}, nullptr)));
  ASSERT_TRUE(refused.ok()) << refused.status();
  ASSERT_TRUE(refused->has_reject());
  EXPECT_EQ(refused->reject().code(), v1::TOO_MANY_SESSIONS);
}

TEST_F(RawHandshakeTest, SessionLimitMakesRoomFromSessionsCutAfterTheHandshake) {
  AgentConfig config;
  config.max_sessions = 2;
  start(config);
  handshakeAndCut(address_, /*send_request=*/false);
  handshakeAndCut(address_, /*send_request=*/false);
  // The agent sees each cut when it reads the EOF: until then the session
  // is attached and not evictable.
  absl::StatusOr<v1::Frame> f = absl::InternalError("not run");
  fakes::eventually(
      [&] {
        f = exchange(protocol::encodeFrame(protocol::makeHello("new", kToken, {}, nullptr)));
        return f.ok() && f->has_welcome();
      },
      std::chrono::seconds(5), milliseconds(20));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->has_welcome()) << f->ShortDebugString();
}

TEST(ServerLifecycleTest, ExitsWithCodeSixWhenNoClientComes) {
  auto procfs = std::make_unique<fakes::FakeProcFs>();
  procfs->setSelfPid(kPodPid);
  procfs->addProcess(kPodPid, {});
  TargetSpec spec;
  spec.mode = TargetMode::kTargetless;
  auto target = Target::open(*procfs, spec);
  ASSERT_TRUE(target.ok());
  AgentConfig config;
  config.listen = "127.0.0.1:0";
  config.token = kToken;
  config.first_client_timeout = milliseconds(50);
  Server server(config, std::move(*target), std::move(procfs));
  ASSERT_TRUE(server.init().ok());
  ASSERT_TRUE(server.listen().ok());
  EXPECT_EQ(server.run(), kExitNoClient);
}

}  // namespace
}  // namespace siphon::agent
