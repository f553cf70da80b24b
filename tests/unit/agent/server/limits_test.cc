// The agent's limits end to end (docs/SECURITY.md#limits): the real server
// and client in process over loopback, each limit set low, hit, and checked
// for its typed code, a message naming the limit, its value and its flag,
// and for what goes on afterwards (the session, or the other sessions). No
// root: the target is targetless with a scratch directory as its root.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "agent/server/server.h"
#include "absl/strings/str_cat.h"
#include "siphon/client/client.h"
#include "siphon/protocol/codec.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using Client = std::shared_ptr<client::Client>;

constexpr pid_t kSelfPid = 4242;
constexpr char kToken[] = "limits-token";

using fakes::RootedProcFs;

v1::Request infoRequest() {
  v1::Request r;
  r.mutable_info();
  return r;
}

v1::Request fileRequest(v1::FileRequest fr) {
  v1::Request r;
  *r.mutable_file() = std::move(fr);
  return r;
}

v1::FileRequest openReq(const std::string& path) {
  v1::FileRequest r;
  r.mutable_open()->set_path(path);
  r.mutable_open()->set_flags(O_RDONLY);
  return r;
}

v1::StreamOpen udpOpen() {
  v1::StreamOpen open;
  open.mutable_outgoing()->set_protocol(v1::OutgoingConnect::UDP);
  open.mutable_outgoing()->set_host("127.0.0.1");
  open.mutable_outgoing()->set_port(9);  // connected UDP needs no listener
  return open;
}

class LimitsTest : public ::testing::Test {
 protected:
  void start(AgentConfig config) {
    startOn(agent_, std::move(config));
    address_ = agent_.address();
  }
  // A targetless agent over the scratch tree, with this test's token.
  void startOn(fakes::InProcessAgent& agent, AgentConfig config) {
    config.token = kToken;
    auto procfs = std::make_unique<RootedProcFs>(tree_.root());
    procfs->setSelfPid(kSelfPid);
    procfs->addProcess(kSelfPid, {});
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent.start(config, std::move(procfs), spec);
  }

  Client makeClient(const asio::any_io_executor& ex, std::string name = "limits-test") {
    client::ClientOptions o;
    o.endpoints = {address_};
    o.token = kToken;
    o.client_name = std::move(name);
    o.reconnect = false;
    return client::Client::create(ex, o);
  }

  template <typename F>
  void runClient(F f) {
    fakes::runClient(std::move(f));
  }

  files::testing::ScratchTree tree_;
  fakes::InProcessAgent agent_;
  std::string address_;
};

TEST_F(LimitsTest, OneSessionPastMaxSessionsIsRejectedTooManySessions) {
  AgentConfig config;
  config.max_sessions = 1;
  start(config);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client a = makeClient(ex);
    EXPECT_TRUE((co_await a->connect()).ok());
    EXPECT_TRUE((co_await a->call(infoRequest())).ok());  // attached, holding its slot
    Client b = makeClient(ex);
    absl::Status s = co_await b->connect();
    EXPECT_EQ(errorCodeOf(s), v1::TOO_MANY_SESSIONS) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("session limit of 1 reached (siphon-agent --max-sessions raises it)"));
    // The session inside the limit goes on.
    auto info = co_await a->call(infoRequest());
    EXPECT_TRUE(info.ok()) << info.status();
    a->close();
  });
}

// With several agents given, a full one sends the client on to the next;
// when every one is full the client says so, naming each.
TEST_F(LimitsTest, AFullAgentSendsTheClientOnToTheNextOne) {
  AgentConfig config;
  config.max_sessions = 1;
  start(config);
  fakes::InProcessAgent roomy;
  startOn(roomy, AgentConfig{});
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client a = makeClient(ex);
    EXPECT_TRUE((co_await a->connect()).ok());
    EXPECT_TRUE((co_await a->call(infoRequest())).ok());  // the full agent's one session

    client::ClientOptions o;
    o.endpoints = {address_, roomy.address()};
    o.token = kToken;
    o.reconnect = false;
    Client b = client::Client::create(ex, o);
    absl::Status s = co_await b->connect();
    EXPECT_TRUE(s.ok()) << s;
    auto info = co_await b->call(infoRequest());
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) {
      EXPECT_EQ(info->info().sessions(), 1u) << "not the roomy agent";
    }

    o.endpoints = {address_, address_};
    Client c = client::Client::create(ex, o);
    s = co_await c->connect();
    EXPECT_EQ(errorCodeOf(s), v1::TOO_MANY_SESSIONS) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("no agent took the session: ", address_,
                                       ": session limit of 1 reached")));
    a->close();
    b->close();
    c->close();
  });
}

TEST_F(LimitsTest, OneStreamPastMaxStreamsIsRefusedAndTheSessionGoesOn) {
  AgentConfig config;
  config.limits.max_streams = 1;
  start(config);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = makeClient(ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_EQ(c->welcome().limits().max_streams(), 1u);
    auto first = co_await c->openStream(udpOpen());
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) co_return;
    // The client's own session knows the negotiated limit and refuses
    // locally, with the agent's flag in the message.
    auto second = co_await c->openStream(udpOpen());
    EXPECT_EQ(errorCodeOf(second.status()), v1::TOO_MANY_STREAMS) << second.status();
    EXPECT_THAT(std::string(second.status().message()),
                HasSubstr("stream limit of 1 reached (siphon-agent --max-streams raises it)"));
    // The session goes on, and a closed stream frees the slot.
    EXPECT_TRUE((co_await c->call(infoRequest())).ok());
    (*first)->reset(v1::CANCELLED, "done");
    auto third = co_await c->openStream(udpOpen());
    EXPECT_TRUE(third.ok()) << third.status();
    if (third.ok()) (*third)->reset(v1::CANCELLED, "done");
    c->close();
  });
}

TEST_F(LimitsTest, MaxPendingRequestsIsNegotiatedAndTypedForTheClient) {
  AgentConfig config;
  config.limits.max_pending_requests = 1;
  start(config);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = makeClient(ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_EQ(c->welcome().limits().max_pending_requests(), 1u);
    // Two requests at once: both are sent before any answer can come back
    // (the coroutines start in order, the answer needs a round trip), so
    // one is pending when the other is made.
    absl::Status results[2] = {absl::UnknownError("not run"), absl::UnknownError("not run")};
    int done = 0;
    for (int k = 0; k < 2; ++k) {
      // By reference, as fakes::runClient: the enclosing frame outlives
      // these (it waits for both).
      asio::co_spawn(
          ex,
          [&, k]() -> net::awaitable<void> {
            auto r = co_await c->call(infoRequest());
            results[k] = r.status();
            ++done;
          },
          asio::detached);
    }
    asio::steady_timer t(ex);
    for (int i = 0; i < 500 && done < 2; ++i) {
      t.expires_after(milliseconds(10));
      co_await t.async_wait(net::use_awaitable);
    }
    EXPECT_EQ(done, 2);
    EXPECT_TRUE(results[0].ok()) << results[0];
    EXPECT_EQ(errorCodeOf(results[1]), v1::TOO_MANY_PENDING_REQUESTS) << results[1];
    EXPECT_THAT(std::string(results[1].message()),
                HasSubstr("pending request limit of 1 reached (siphon-agent "
                          "--max-pending-requests raises it)"));
    // The session goes on.
    EXPECT_TRUE((co_await c->call(infoRequest())).ok());
    c->close();
  });
}

TEST_F(LimitsTest, AFrameAboveMaxFrameSizeEndsThatSessionOnly) {
  AgentConfig config;
  config.limits.max_frame_size = 4096;
  config.limits.max_read_size = 4096 - protocol::kReadSizeHeadroom;
  start(config);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client other = makeClient(ex, "other");
    EXPECT_TRUE((co_await other->connect()).ok());
    Client c = makeClient(ex, "oversized");
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_EQ(c->welcome().limits().max_frame_size(), 4096u);
    v1::Request big;
    big.mutable_env()->add_include(std::string(5000, 'x'));
    auto r = co_await c->call(big, milliseconds(10000));
    // The agent's Goaway ends the session: the client's calls fail with
    // AGENT_LOST, the text naming the Goaway's code and message.
    EXPECT_EQ(errorCodeOf(r.status()), v1::AGENT_LOST) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("(FRAME_TOO_LARGE)"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("above the maximum of 4096"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--max-frame-size"));
    // The other session is untouched, and the oversized one is gone.
    uint32_t sessions = 0;
    asio::steady_timer t(ex);
    for (int i = 0; i < 500; ++i) {
      auto info = co_await other->call(infoRequest());
      EXPECT_TRUE(info.ok()) << info.status();
      if (!info.ok()) break;
      sessions = info->info().sessions();
      if (sessions == 1) break;
      t.expires_after(milliseconds(10));
      co_await t.async_wait(net::use_awaitable);
    }
    EXPECT_EQ(sessions, 1u);
    other->close();
  });
}

TEST_F(LimitsTest, OneOpenPastMaxOpenFilesIsEmfileNamingTheLimit) {
  tree_.file("a", "a");
  tree_.file("b", "b");
  AgentConfig config;
  config.max_open_files = 2;
  start(config);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = makeClient(ex);
    Client other = makeClient(ex, "other");
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await other->connect()).ok());
    auto one = co_await c->call(fileRequest(openReq("/a")));
    auto two = co_await c->call(fileRequest(openReq("/b")));
    EXPECT_TRUE(one.ok() && two.ok());
    if (!one.ok() || !two.ok()) co_return;
    auto three = co_await c->call(fileRequest(openReq("/a")));
    EXPECT_EQ(errorCodeOf(three.status()), v1::ERRNO) << three.status();
    EXPECT_EQ(errnoOf(three.status()), EMFILE);
    // The reason is the agent's, whole: `siphon fs` prints it after strerror.
    EXPECT_EQ(errnoReason(three.status()),
              "open file and directory limit of 2 reached (siphon-agent --max-open-files "
              "raises it)");
    // Directories count too.
    v1::FileRequest od;
    od.mutable_opendir()->set_path("/");
    EXPECT_EQ(errnoOf((co_await c->call(fileRequest(od))).status()), EMFILE);
    // The limit is per session.
    EXPECT_TRUE((co_await other->call(fileRequest(openReq("/a")))).ok());
    // A close frees a slot.
    v1::FileRequest close;
    close.mutable_close()->set_fd(one->file().opened().fd());
    EXPECT_TRUE((co_await c->call(fileRequest(close))).ok());
    auto again = co_await c->call(fileRequest(openReq("/a")));
    EXPECT_TRUE(again.ok()) << again.status();
    c->close();
    other->close();
  });
}

TEST_F(LimitsTest, AReadAboveMaxReadSizeIsClamped) {
  tree_.file("big", std::string(20000, 'z'));
  AgentConfig config;
  config.limits.max_read_size = 8192;
  start(config);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = makeClient(ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_EQ(c->welcome().limits().max_read_size(), 8192u);
    auto opened = co_await c->call(fileRequest(openReq("/big")));
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    v1::FileRequest read;
    read.mutable_read()->set_fd(opened->file().opened().fd());
    read.mutable_read()->set_size(1 << 20);
    // A short read, as read(2) may give: the client reads on.
    size_t total = 0;
    for (int i = 0; i < 10; ++i) {
      auto r = co_await c->call(fileRequest(read));
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      EXPECT_LE(r->file().data().data().size(), 8192u);
      total += r->file().data().data().size();
      if (r->file().data().eof() || r->file().data().data().empty()) break;
    }
    EXPECT_EQ(total, 20000u);
    c->close();
  });
}

// A raw client that sends requests and reads nothing: the agent holds its
// answers (unacked) up to twice --max-session-buffer, then cuts it off with
// Goaway SESSION_BUFFER_FULL; another session goes on.
TEST_F(LimitsTest, AClientThatReadsNothingIsCutOffPastTwiceMaxSessionBuffer) {
  AgentConfig config;
  config.limits.max_frame_size = 4096;
  config.limits.max_read_size = 4096 - protocol::kReadSizeHeadroom;
  config.limits.replay_buffer_bytes = 8192;  // answers may take 16 KiB
  start(config);
  v1::Goaway goaway;
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    net::tcp::socket socket(ex);
    std::string host, port;
    EXPECT_TRUE(net::splitHostPort(address_, &host, &port).ok());
    net::error_code ec;
    co_await socket.async_connect(
        net::tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(std::stoi(port))),
        asio::redirect_error(net::use_awaitable, ec));
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(
        (co_await net::writeFrame(socket, protocol::makeHello("mute", kToken, {}, nullptr))).ok());
    auto welcome = co_await net::readFirstFrame(socket, milliseconds(5000), 1 << 20);
    EXPECT_TRUE(welcome.ok() && welcome->frame.has_welcome());
    // 500 info requests (answers of some hundred bytes each), never acked.
    std::string requests;
    for (uint64_t id = 1; id <= 500; ++id) {
      v1::Frame f;
      *f.mutable_request() = infoRequest();
      f.mutable_request()->set_request_id(id);
      requests += protocol::encodeFrame(f);
    }
    co_await asio::async_write(socket, asio::buffer(requests),
                               asio::redirect_error(net::use_awaitable, ec));
    // Now read, until the Goaway (the agent closes after it).
    protocol::FrameDecoder decoder(1 << 20);
    decoder.feed(welcome.ok() ? welcome->leftover : "");
    bool done = false;
    while (!done) {
      auto next = decoder.next();
      if (!next.ok()) break;
      if (next->has_value()) {
        if (!(*next)->is_data && (*next)->frame.has_goaway()) {
          goaway = (*next)->frame.goaway();
          done = true;
        }
        continue;
      }
      auto buf = decoder.prepare(64 * 1024);
      size_t n = co_await socket.async_read_some(asio::buffer(buf.data(), buf.size()),
                                                 asio::redirect_error(net::use_awaitable, ec));
      if (ec) break;
      decoder.commit(n);
    }
  });
  EXPECT_EQ(goaway.code(), v1::SESSION_BUFFER_FULL) << goaway.ShortDebugString();
  EXPECT_THAT(goaway.message(), HasSubstr("--max-session-buffer"));
  // Other clients are served.
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = makeClient(ex);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE((co_await c->call(infoRequest())).ok());
    c->close();
  });
}

}  // namespace
}  // namespace siphon::agent
