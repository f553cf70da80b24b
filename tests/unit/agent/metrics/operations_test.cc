// Operations end to end, in process: an agent with --metrics on loopback,
// real traffic through a real client (an outgoing TCP echo, file reads, a
// failed open), then the scraped counters, /readyz across a drain, the
// sessions listing, and `siphon sessions` (the real binary) against two
// sessions. No root: targetless, the files' root a scratch directory.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "tests/fakes/loopback.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/unit/agent/files/files_test_util.h"
#include "tests/unit/agent/metrics/http_test_util.h"

#define SIPHON_AGENT_BIN "siphon-agent"
#include "tests/fakes/cli_process.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using metrics::testing::get;
using metrics::testing::sample;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr pid_t kSelfPid = 4242;
constexpr char kToken[] = "ops-token";

using fakes::RootedProcFs;

using fakes::loopbackListener;

v1::StreamOpen tcpTo(uint16_t port) {
  v1::StreamOpen o;
  o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
  o.mutable_outgoing()->set_host("127.0.0.1");
  o.mutable_outgoing()->set_port(port);
  return o;
}

v1::Request fileReq(v1::FileRequest fr) {
  v1::Request r;
  *r.mutable_file() = std::move(fr);
  return r;
}
v1::Request openReq(const std::string& path) {
  v1::FileRequest fr;
  fr.mutable_open()->set_path(path);
  fr.mutable_open()->set_flags(O_RDONLY);
  return fileReq(fr);
}
v1::Request preadReq(uint64_t fd, uint32_t size) {
  v1::FileRequest fr;
  fr.mutable_pread()->set_fd(fd);
  fr.mutable_pread()->set_size(size);
  return fileReq(fr);
}
v1::Request sessionsReq() {
  v1::Request r;
  r.mutable_sessions();
  return r;
}

// A steal service stand-in (stealing needs root): answers a subscribe and
// describes what each session subscribed, as the real one does.
class FakeStealService : public RequestService {
 public:
  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    subscribed_[session->id()] = request.steal().port();
    v1::Response r;
    r.set_request_id(request.request_id());
    r.mutable_subscribed()->set_subscription_id(77);
    r.mutable_subscribed()->set_backend("fake");
    session->respond(std::move(r));
  }
  void describeSubscriptions(
      const std::string& session_id,
      google::protobuf::RepeatedPtrField<v1::SubscriptionSummary>* out) const override {
    auto it = subscribed_.find(session_id);
    if (it == subscribed_.end()) return;
    v1::SubscriptionSummary& d = *out->Add();
    d.set_subscription_id(77);
    d.set_kind("steal");
    d.set_port(it->second);
    d.set_filter("header x-user: ^me$");
    d.set_backend("fake");
  }

 private:
  std::map<std::string, uint32_t> subscribed_;
};

class OperationsTest : public ::testing::Test {
 protected:
  void start(std::function<void(Server&)> before_run = {}) {
    AgentConfig config;
    config.token = kToken;
    config.metrics_listen = "127.0.0.1:0";
    config.fs_mode = FsMode::kReadOnly;
    auto procfs = std::make_unique<RootedProcFs>(tree_.root());
    procfs->setSelfPid(kSelfPid);
    procfs->addProcess(kSelfPid, {});
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::move(procfs), spec, std::move(before_run));
    metrics_ = agent_.server().metricsAddress();
    ASSERT_FALSE(metrics_.empty());
  }

  client::ClientOptions options(std::string name) {
    client::ClientOptions o;
    o.endpoints = {agent_.address()};
    o.token = kToken;
    o.client_name = std::move(name);
    return o;
  }

  std::string scrape() {
    auto a = get(metrics_, "/metrics");
    EXPECT_EQ(a.status, 200);
    return a.body;
  }

  files::testing::ScratchTree tree_;
  fakes::InProcessAgent agent_;
  std::string metrics_;
};

TEST_F(OperationsTest, ReadyLineReportsTheMetricsAddress) {
  start();
  EXPECT_THAT(agent_.server().readyLine(), HasSubstr(" metrics=" + metrics_));
  EXPECT_EQ(get(metrics_, "/healthz").status, 200);
  EXPECT_EQ(get(metrics_, "/readyz").status, 200);
}

TEST_F(OperationsTest, TrafficMovesTheCountersByTheRightAmounts) {
  tree_.file("etc/motd", "hello from the target\n");  // 22 bytes
  start();
  fakes::EchoServer echo(loopbackListener(), fakes::EchoServer::Kind::kStream);
  const std::string payload(3000, 'x');
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options("ops-test"));
    EXPECT_TRUE((co_await c->connect()).ok());

    // An outgoing TCP connection: 3000 bytes out and back.
    auto s = co_await c->openStream(tcpTo(echo.port()));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) {
      EXPECT_TRUE((co_await (*s)->write(payload)).ok());
      EXPECT_TRUE((*s)->halfClose().ok());
      std::string got;
      for (;;) {
        auto chunk = co_await (*s)->read();
        if (!chunk.ok() || !chunk->has_value()) break;
        got += **chunk;
      }
      EXPECT_EQ(got.size(), payload.size());
    }

    // An outgoing connect the agent refuses: a stream reset, counted.
    v1::StreamOpen port_zero = tcpTo(0);
    auto refused = co_await c->openStream(port_zero);
    EXPECT_EQ(errorCodeOf(refused.status()), v1::INVALID_ARGUMENT) << refused.status();

    // A file read and a failed open.
    auto opened = co_await c->call(openReq("/etc/motd"), milliseconds(10000));
    EXPECT_TRUE(opened.ok() && opened->has_file() && !opened->has_error()) << opened.status();
    if (opened.ok() && opened->has_file()) {
      auto data =
          co_await c->call(preadReq(opened->file().opened().fd(), 100), milliseconds(10000));
      EXPECT_TRUE(data.ok());
      if (data.ok()) {
        EXPECT_EQ(data->file().data().data(), "hello from the target\n");
      }
    }
    auto missing = co_await c->call(openReq("/etc/missing"), milliseconds(10000));
    EXPECT_EQ(errnoOf(missing.status()), ENOENT) << missing.status();

    // This session's own line of the listing.
    auto listed = co_await c->call(sessionsReq(), milliseconds(10000));
    EXPECT_TRUE(listed.ok() && listed->has_sessions());
    if (listed.ok() && listed->sessions().sessions_size() == 1) {
      const auto& me = listed->sessions().sessions(0);
      EXPECT_TRUE(me.current());
      EXPECT_EQ(me.client_name(), "ops-test");
      EXPECT_EQ(me.state(), "attached");
      EXPECT_EQ(me.bytes_in(), payload.size());
      EXPECT_EQ(me.bytes_out(), payload.size());
    } else {
      ADD_FAILURE() << "expected one session";
    }

    // Scraped while the session is attached (a blocking call is fine
    // here: the agent runs on its own thread).
    const std::string text = scrape();
    EXPECT_EQ(sample(text, "siphon_sessions{state=\"attached\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_sessions{state=\"detached\"}"), 0);
    EXPECT_EQ(sample(text, "siphon_session_events_total{event=\"opened\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_streams_opened_total{kind=\"outgoing_tcp\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_stream_bytes_in_total{kind=\"outgoing_tcp\"}"), 3000);
    EXPECT_EQ(sample(text, "siphon_stream_bytes_out_total{kind=\"outgoing_tcp\"}"), 3000);
    EXPECT_EQ(sample(text, "siphon_file_operations_total{op=\"open\",result=\"ok\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_file_operations_total{op=\"pread\",result=\"ok\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_file_operations_total{op=\"open\",result=\"ENOENT\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_requests_total{kind=\"sessions\",result=\"ok\"}"), 1);
    EXPECT_EQ(sample(text, "siphon_errors_sent_total{code=\"ERRNO\",frame=\"response\"}"), 1);
    EXPECT_EQ(
        sample(text, "siphon_errors_sent_total{code=\"INVALID_ARGUMENT\",frame=\"stream_reset\"}"),
        1);
    EXPECT_GT(sample(text, "siphon_process_resident_memory_bytes"), 0);
    EXPECT_GT(sample(text, "siphon_process_open_fds"), 0);
    EXPECT_GT(sample(text, "siphon_process_start_time_seconds"), 1.6e9);
    EXPECT_EQ(sample(text, "siphon_ready"), 1);
    c->close();
  });
}

TEST_F(OperationsTest, RejectedClientsCountAsErrorsByCode) {
  start();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto o = options("wrong-token");
    o.token = "nope";
    auto c = client::Client::create(ex, o);
    absl::Status s = co_await c->connect();
    EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
    c->close();
  });
  EXPECT_EQ(sample(scrape(), "siphon_errors_sent_total{code=\"UNAUTHENTICATED\",frame=\"reject\"}"),
            1);
}

TEST_F(OperationsTest, NotReadyWhileDraining) {
  start();
  fakes::EchoServer echo(loopbackListener(), fakes::EchoServer::Kind::kStream);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options("drain-test"));
    EXPECT_TRUE((co_await c->connect()).ok());
    // A connection in flight holds the drain open.
    auto s = co_await c->openStream(tcpTo(echo.port()));
    EXPECT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(get(metrics_, "/readyz").status, 200);
    agent_.server().requestDrain("SIGTERM");
    metrics::testing::HttpAnswer a;
    const bool not_ready = co_await fakes::eventually([&] {
      a = get(metrics_, "/readyz");
      return a.status == 503;
    });
    EXPECT_TRUE(not_ready);
    EXPECT_THAT(a.body, HasSubstr("draining (SIGTERM)"));
    EXPECT_EQ(get(metrics_, "/healthz").status, 200);  // the loop still answers
    EXPECT_EQ(sample(scrape(), "siphon_ready"), 0);
    c->close();
  });
}

TEST_F(OperationsTest, SiphonSessionsListsTwoSessions) {
  auto steal = std::make_shared<FakeStealService>();
  start([&](Server& server) { server.services().addRequest(v1::Request::kSteal, steal); });
  const std::string token_file = tree_.base() + "/token";
  files::testing::ScratchTree::write(token_file, kToken);
  auto cli = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", agent_.address(), "--token-file",
                                     token_file};
    argv.insert(argv.end(), extra.begin(), extra.end());
    fakes::CliProcess p(argv);
    const int rc = p.finish();
    EXPECT_EQ(rc, 0) << p.err;
    return p.out;
  };
  std::string text, json;
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto a = client::Client::create(ex, options("alpha"));
    auto b = client::Client::create(ex, options("beta"));
    EXPECT_TRUE((co_await a->connect()).ok());
    EXPECT_TRUE((co_await b->connect()).ok());
    v1::Request sub;
    sub.mutable_steal()->set_port(8080);
    auto r = co_await a->call(sub, milliseconds(10000));
    EXPECT_TRUE(r.ok() && r->has_subscribed()) << r.status();
    // The CLI is a third session, run while these two are attached.
    text = cli({"sessions"});
    json = cli({"--json", "sessions"});
    a->close();
    b->close();
  });

  // Header plus three sessions; the CLI's own is marked.
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u) << text;
  EXPECT_THAT(lines[0], HasSubstr("SESSION"));
  int marked = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.starts_with("*")) {
      ++marked;
      EXPECT_THAT(l, HasSubstr("siphon"));
    }
    if (l.find("alpha") != std::string::npos) {
      EXPECT_THAT(l, HasSubstr("attached"));
      EXPECT_THAT(l, HasSubstr("steal 8080 [header x-user: ^me$]"));
    }
    if (l.find("beta") != std::string::npos) {
      EXPECT_TRUE(l.ends_with(" -")) << l;
    }
  }
  EXPECT_EQ(marked, 1) << text;

  EXPECT_THAT(json, HasSubstr("\"client_name\": \"alpha\""));
  EXPECT_THAT(json, HasSubstr("\"client_name\": \"beta\""));
  EXPECT_THAT(json, HasSubstr("\"kind\": \"steal\""));
  EXPECT_THAT(json, HasSubstr("\"port\": 8080"));
  const std::regex current("\"current\": true");
  EXPECT_EQ(std::distance(std::sregex_iterator(json.begin(), json.end(), current),
                          std::sregex_iterator()),
            1)
      << json;
}

}  // namespace
}  // namespace siphon::agent
