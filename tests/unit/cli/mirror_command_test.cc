// `siphon mirror`, the real binary, against a scripted agent (no root, no
// kernel): what it prints for records, gaps, ends and resets, what it
// replays to a --to server, how it fails, and that a stdout nobody reads
// costs bytes (said) but never stalls the streams. The agent runs on a
// thread of its own; the test drives it by posting to it.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <future>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "siphon/status.h"
#include "tests/fakes/scripted_agent.h"
// The harness's process helpers are all this test takes from it; its Agent
// class (unused here) wants the agent binary's path.
#define SIPHON_AGENT_BIN "siphon-agent"
#include "tests/fakes/cli_process.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

namespace asio = net::asio;
using fakes::closedAddress;
using fakes::pattern;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kSubscription = 7;
const std::string kCli = SIPHON_CLI_BIN;

// What the agent does on a mirrored stream, step by step.
struct Record {
  v1::Direction direction;
  std::string bytes;  // empty: that direction's FIN
};
struct Gap {
  v1::Direction direction;
  uint64_t bytes;
};
struct HalfClose {};
struct Reset {
  v1::ErrorCode code;
};
using Step = std::variant<Record, Gap, HalfClose, Reset>;

// A ScriptedAgent on its own thread. Every call runs on that thread.
class AgentThread {
 public:
  AgentThread() : work_(asio::make_work_guard(io_)), agent_(io_.get_executor()) {
    agent_.on_request = [this](v1::Request r) { onRequest(std::move(r)); };
    agent_.on_writable = [this](uint64_t) {
      if (writable_) writable_->notify();
    };
    asio::co_spawn(io_, agent_.serve(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~AgentThread() {
    call([this] {
      writable_.reset();
      agent_.close();
    });
    io_.stop();
    thread_.join();
  }

  std::string address() const { return agent_.address(); }

  // Runs f() on the agent's thread and returns its result.
  template <typename F>
  auto call(F f) -> decltype(f()) {
    return fakes::callOn(io_, std::move(f));
  }

  // Opens a mirrored stream and plays `steps` on it, records as the
  // stream's credit allows; the future is ready when every step is done.
  std::future<void> play(bool mid_stream, std::vector<Step> steps) {
    auto done = std::make_shared<std::promise<void>>();
    auto result = done->get_future();
    asio::post(io_, [this, mid_stream, steps = std::move(steps), done]() mutable {
      if (!writable_) writable_ = std::make_unique<net::Signal>(io_.get_executor());
      uint64_t id = agent_.openMirrored(kSubscription, mid_stream);
      asio::co_spawn(io_, playSteps(id, std::move(steps)),
                     [done](std::exception_ptr) { done->set_value(); });
    });
    return result;
  }

  // The agent's answer to MirrorSubscribe: Subscribed, or this error.
  v1::ErrorCode refuse_with = v1::OK;
  std::vector<v1::Request> requests;  // read through call()

 private:
  void onRequest(v1::Request r) {
    v1::Response response;
    response.set_request_id(r.request_id());
    if (r.has_mirror() && refuse_with != v1::OK) {
      *response.mutable_error() = toProtoError(protoError(refuse_with, "mirror is not served"));
    } else if (r.has_mirror()) {
      response.mutable_subscribed()->set_subscription_id(kSubscription);
      response.mutable_subscribed()->set_backend("tc");
    } else if (r.has_unsubscribe()) {
      response.mutable_unsubscribed();
    } else {
      *response.mutable_error() = toProtoError(protoError(v1::UNIMPLEMENTED, "scripted"));
    }
    requests.push_back(std::move(r));
    agent_.session().sendResponse(std::move(response));
    agent_.wake();
  }

  net::awaitable<void> playSteps(uint64_t id, std::vector<Step> steps_in) {
    const std::vector<Step> steps = std::move(steps_in);
    for (const Step& step : steps) {
      if (const auto* r = std::get_if<Record>(&step)) {
        const size_t need = r->bytes.size() + 1;
        while (agent_.session().sendCredit(id, need) < need) {
          if (!agent_.session().streamOpen(id)) co_return;
          co_await writable_->wait(asio::steady_timer::clock_type::now() +
                                   std::chrono::milliseconds(20));
        }
        EXPECT_TRUE(agent_.sendRecord(id, r->direction, r->bytes).ok());
      } else if (const auto* g = std::get_if<Gap>(&step)) {
        EXPECT_TRUE(agent_.sendGap(id, g->direction, g->bytes).ok());
      } else if (std::holds_alternative<HalfClose>(step)) {
        EXPECT_TRUE(agent_.session().halfClose(id).ok());
        agent_.wake();
      } else {
        v1::Error e;
        e.set_code(std::get<Reset>(step).code);
        e.set_message("scripted reset");
        agent_.session().resetStream(id, e);
        agent_.wake();
      }
    }
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  fakes::ScriptedAgent agent_;
  std::unique_ptr<net::Signal> writable_;
  std::thread thread_;
};

// `siphon --agent ADDR mirror ...`, its stdout and stderr read as it runs.
class Mirror : public fakes::CliProcess {
 public:
  Mirror(const std::string& agent, std::vector<std::string> args, bool read_stdout = true)
      : CliProcess(argv(agent, std::move(args)), read_stdout) {}

  // Reads until `text` is in stderr or 20 s pass.
  bool waitFor(const std::string& text) {
    return readUntil([&] { return err.find(text) != std::string::npos; });
  }

 private:
  static std::vector<std::string> argv(const std::string& agent, std::vector<std::string> args) {
    std::vector<std::string> argv = {kCli, "--agent", agent, "mirror"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
};

// A TCP server on 127.0.0.1:0 that takes one connection and reads it to
// EOF; with a `gate`, it reads nothing before the gate opens (or 30 s).
class SinkServer {
 public:
  explicit SinkServer(std::shared_future<void> gate = {})
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_.get(), 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    got_ = std::async(std::launch::async, [this, gate] {
      harness::setTimeouts(fd_.get(), 20);
      harness::Fd c(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      Got g;
      if (c.get() < 0) return g;
      // Bounded: a failing test that never opens the gate still ends.
      if (gate.valid()) gate.wait_for(std::chrono::seconds(30));
      harness::setTimeouts(c.get(), 20);
      g.eof = harness::readAll(c.get(), &g.bytes);
      return g;
    });
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  struct Got {
    std::string bytes;
    bool eof = false;  // read to a clean end
  };
  Got get() { return got_.get(); }

 private:
  harness::Fd fd_;
  uint16_t port_ = 0;
  std::future<Got> got_;
};

const auto kC2S = v1::CLIENT_TO_SERVER;
const auto kS2C = v1::SERVER_TO_CLIENT;

TEST(MirrorCommand, BothDirectionsToStdoutWithMarkersGapsAndEnds) {
  AgentThread agent;
  Mirror m(agent.address(), {"--port", "80", "--both"});
  ASSERT_TRUE(m.waitFor("mirror: port 80")) << m.err;
  EXPECT_THAT(m.err, HasSubstr("mirror: port 80 (backend tc, subscription 7): both directions to "
                               "stdout\n"));

  const std::string request = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string response = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
  agent
      .play(false, {Record{kC2S, request}, Record{kS2C, response}, Gap{kC2S, 100},
                    Record{kC2S, "after the gap"}, Record{kC2S, ""}, Record{kS2C, ""}, HalfClose{}})
      .get();
  ASSERT_TRUE(m.waitFor("connection 1 10.0.0.2:51234 -> 10.0.0.1:80 closed")) << m.err;
  agent.play(true, {Record{kC2S, "x"}, Reset{v1::ERRNO}}).get();
  ASSERT_TRUE(m.waitFor("connection 2 10.0.0.2:51234 -> 10.0.0.1:80 closed")) << m.err;

  m.signal(SIGINT);
  EXPECT_EQ(m.finish(), 0) << m.err;
  EXPECT_EQ(m.out, ">>> #1 10.0.0.2:51234 -> 10.0.0.1:80\n" + request +
                       "\n<<< #1 10.0.0.2:51234 <- 10.0.0.1:80\n" + response +
                       "\n>>> #1 10.0.0.2:51234 -> 10.0.0.1:80 (100 bytes missing before these)\n"
                       "after the gap"
                       "\n>>> #2 10.0.0.2:51234 -> 10.0.0.1:80\nx");
  const std::string c2s = std::to_string(request.size() + 13);
  const std::string s2c = std::to_string(response.size());
  EXPECT_THAT(m.err, HasSubstr("mirror: connection 1 10.0.0.2:51234 -> 10.0.0.1:80 opened\n"));
  EXPECT_THAT(m.err, HasSubstr("mirror: connection 1: 100 bytes client->server lost (gap)\n"));
  EXPECT_THAT(m.err, HasSubstr("mirror: connection 1 10.0.0.2:51234 -> 10.0.0.1:80 closed: "
                               "client->server " +
                               c2s + " bytes, server->client " + s2c +
                               " bytes, 100 bytes client->server lost\n"));
  EXPECT_THAT(m.err, HasSubstr("mirror: connection 2 10.0.0.2:51234 -> 10.0.0.1:80 opened "
                               "(joined mid-stream: earlier bytes unknown)\n"));
  EXPECT_THAT(m.err, HasSubstr("mirror: connection 2 10.0.0.2:51234 -> 10.0.0.1:80 closed (reset "
                               "by peer): client->server 1 bytes, server->client 0 bytes\n"));
  EXPECT_THAT(m.err, HasSubstr("mirror: summary: 2 connections, client->server " +
                               std::to_string(request.size() + 14) +
                               " bytes (gaps 100 bytes), server->client " + s2c +
                               " bytes (gaps 0 bytes)\n"));
  // The subscription was given back.
  auto requests = agent.call([&] { return agent.requests; });
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_TRUE(requests[0].mirror().both_directions());
  EXPECT_EQ(requests[0].mirror().port(), 80u);
  EXPECT_EQ(requests[1].unsubscribe().subscription_id(), kSubscription);
}

TEST(MirrorCommand, JsonLinesOnStderr) {
  AgentThread agent;
  Mirror m(agent.address(), {"--port", "80", "--json"});
  ASSERT_TRUE(m.waitFor("\"event\":\"mirroring\"")) << m.err;
  agent.play(false, {Record{kC2S, "abc"}, Gap{kC2S, 9}, Reset{v1::TIMEOUT}}).get();
  ASSERT_TRUE(m.waitFor("\"event\":\"close\"")) << m.err;
  m.signal(SIGTERM);
  EXPECT_EQ(m.finish(), 0) << m.err;
  std::istringstream lines(m.err);
  std::string line;
  std::vector<std::string> events;
  while (std::getline(lines, line)) {
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
    std::smatch event;
    if (std::regex_search(line, event, std::regex("\"event\":\"([a-z_]+)\""))) {
      events.push_back(event[1]);
    }
  }
  EXPECT_EQ(events, (std::vector<std::string>{"mirroring", "open", "gap", "close", "summary"}));
  EXPECT_THAT(m.err, HasSubstr("\"reason\":\"idle too long\""));
  EXPECT_EQ(m.out, ">>> #1 10.0.0.2:51234 -> 10.0.0.1:80\nabc");
}

TEST(MirrorCommand, ReplaysTheClientsBytesToTheServerExactly) {
  AgentThread agent;
  SinkServer server;
  Mirror m(agent.address(), {"--port", "80", "--to", server.address()});
  ASSERT_TRUE(m.waitFor("client->server bytes replayed to " + server.address())) << m.err;

  const std::string bytes = pattern(42, 3 << 20);
  std::vector<Step> steps;
  for (size_t off = 0; off < bytes.size(); off += 60000) {
    steps.push_back(Record{kC2S, bytes.substr(off, 60000)});
    // Server bytes the agent should not even send without --both: never
    // replayed.
    if (off % 600000 == 0) steps.push_back(Record{kS2C, "HTTP/1.1 200 OK\r\n"});
  }
  steps.push_back(Record{kC2S, ""});
  steps.push_back(HalfClose{});
  agent.play(false, std::move(steps)).get();

  SinkServer::Got got = server.get();
  EXPECT_TRUE(got.eof);
  EXPECT_EQ(got.bytes.size(), bytes.size());
  EXPECT_TRUE(got.bytes == bytes) << "the replayed bytes differ";
  ASSERT_TRUE(m.waitFor(" closed: ")) << m.err;
  EXPECT_THAT(m.err, HasSubstr("replayed " + std::to_string(bytes.size()) + " bytes\n"));
  m.signal(SIGINT);
  EXPECT_EQ(m.finish(), 0) << m.err;
  EXPECT_EQ(m.out, "");
  EXPECT_THAT(m.err, Not(HasSubstr("not replayed")));
}

TEST(MirrorCommand, ADeadReplayServerCostsThatConnectionOnly) {
  AgentThread agent;
  const std::string dead = closedAddress();
  Mirror m(agent.address(), {"--port", "80", "--to", dead});
  ASSERT_TRUE(m.waitFor("mirror: port 80")) << m.err;
  agent.play(false, {Record{kC2S, "hello"}, Record{kC2S, "world"}, Record{kC2S, ""}, HalfClose{}})
      .get();
  ASSERT_TRUE(m.waitFor(" closed: ")) << m.err;
  EXPECT_THAT(m.err,
              HasSubstr("mirror: connection 1: replay to " + dead + " failed (connect " + dead +
                        ": Connection refused); the rest of its "
                        "client->server bytes are dropped\n"));
  EXPECT_THAT(m.err, HasSubstr("replayed 0 bytes, not replayed 10 bytes\n"));
  // The mirror goes on: a second connection is served too.
  agent.play(false, {Record{kC2S, "again"}, HalfClose{}}).get();
  ASSERT_TRUE(m.waitFor("connection 2 10.0.0.2:51234 -> 10.0.0.1:80 closed")) << m.err;
  m.signal(SIGINT);
  EXPECT_EQ(m.finish(), 0) << m.err;
  EXPECT_THAT(m.err, HasSubstr("mirror: summary: 2 connections, client->server 15 bytes"));
}

// Records of `chunk_size` bytes, `total` in all, then the FIN and the end.
std::vector<Step> bulk(const std::string& bytes, size_t chunk_size) {
  std::vector<Step> steps;
  for (size_t off = 0; off < bytes.size(); off += chunk_size) {
    steps.push_back(Record{kC2S, bytes.substr(off, chunk_size)});
  }
  steps.push_back(Record{kC2S, ""});
  steps.push_back(HalfClose{});
  return steps;
}

// `siphon mirror --to` a server that reads nothing until its gate opens,
// and 48 MiB on one mirrored connection: more than the stream's largest
// window, the replay's queue and both sockets' buffers hold, so while the
// server reads nothing the agent cannot send it all.
struct GatedReplay {
  explicit GatedReplay(uint64_t seed) : bytes(pattern(seed, 48 << 20)) {}
  ~GatedReplay() {
    if (!opened) gate.set_value();  // the server's thread ends
  }
  // Once subscribed, the agent plays the bytes.
  bool start() {
    if (!m.waitFor("client->server bytes replayed to " + server.address())) return false;
    played = agent.play(false, bulk(bytes, 60000));
    return true;
  }
  void open() {
    opened = true;
    gate.set_value();
  }

  AgentThread agent;
  std::promise<void> gate;
  bool opened = false;
  SinkServer server{gate.get_future().share()};
  Mirror m{agent.address(), {"--port", "80", "--to", server.address()}};
  const std::string bytes;
  std::future<void> played;
};

// The replay server pauses (a burst it cannot take at once, a developer's
// server at a breakpoint): the CLI stops reading that stream beyond a small
// queue, so the agent holds the bytes (its credit runs out) instead of the
// replay failing, and once the server reads again every byte arrives.
TEST(MirrorCommand, APausedReplayServerHoldsItsStreamAndLosesNothing) {
  GatedReplay r(43);
  ASSERT_TRUE(r.start()) << r.m.err;
  EXPECT_EQ(r.played.wait_for(std::chrono::seconds(2)), std::future_status::timeout)
      << "the agent sent every byte while the replay server read nothing";
  r.open();
  ASSERT_EQ(r.played.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  SinkServer::Got got = r.server.get();
  EXPECT_TRUE(got.eof);
  EXPECT_EQ(got.bytes.size(), r.bytes.size());
  EXPECT_TRUE(got.bytes == r.bytes) << "the replayed bytes differ";
  ASSERT_TRUE(r.m.waitFor(" closed: ")) << r.m.err;
  EXPECT_THAT(r.m.err, HasSubstr("replayed " + std::to_string(r.bytes.size()) + " bytes\n"));
  r.m.signal(SIGINT);
  EXPECT_EQ(r.m.finish(), 0) << r.m.err;
  EXPECT_THAT(r.m.err, Not(HasSubstr("failed")));
}

// A replay server that takes nothing at all for Replay::kStallLimit (10 s)
// has failed: its replay ends with a line, and the stream is read at full
// speed again (the agent's other connections must not wait for it), its
// bytes counted as not replayed.
TEST(MirrorCommand, AReplayServerThatTakesNothingFailsAfterTheStallLimit) {
  GatedReplay r(44);
  ASSERT_TRUE(r.start()) << r.m.err;
  ASSERT_TRUE(r.m.waitFor("replay to " + r.server.address() + " failed (it took none of the "))
      << r.m.err;
  EXPECT_THAT(r.m.err, HasSubstr(" bytes waiting for 10 s); the rest of its client->server "
                                 "bytes are dropped\n"));
  ASSERT_EQ(r.played.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(r.m.waitFor(" closed: ")) << r.m.err;
  r.m.signal(SIGINT);
  EXPECT_EQ(r.m.finish(), 0) << r.m.err;
  std::smatch counts;
  ASSERT_TRUE(std::regex_search(r.m.err, counts,
                                std::regex("replayed ([0-9]+) bytes, not replayed ([0-9]+) bytes")))
      << r.m.err;
  EXPECT_EQ(std::stoull(counts[1]) + std::stoull(counts[2]), r.bytes.size()) << r.m.err;
  EXPECT_GT(std::stoull(counts[2]), 0u) << r.m.err;
}

// Nobody reads stdout: the CLI keeps reading its streams (the agent sends
// every byte), drops what stdout cannot take, and says how much.
TEST(MirrorCommand, AStdoutNobodyReadsNeverStallsTheStreams) {
  AgentThread agent;
  Mirror m(agent.address(), {"--port", "80"}, /*read_stdout=*/false);
  ASSERT_TRUE(m.waitFor("mirror: port 80")) << m.err;
  const std::string chunk(65000, 'm');
  const size_t total = 640 * chunk.size();  // beyond the 16 MiB stdout queue and the pipe
  std::vector<Step> steps;
  for (size_t off = 0; off < total; off += chunk.size()) steps.push_back(Record{kC2S, chunk});
  steps.push_back(HalfClose{});
  auto played = agent.play(false, std::move(steps));
  // Every byte leaves the agent though stdout is stuck.
  ASSERT_EQ(played.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  ASSERT_TRUE(m.waitFor(" closed: ")) << m.err;
  m.readStdout();
  m.signal(SIGINT);
  EXPECT_EQ(m.finish(), 0) << m.err;
  // What stdout got and what it was told it missed add up to every byte.
  std::string bytes;
  uint64_t missing_in_markers = 0;
  std::regex marker(
      ">>> #1 10\\.0\\.0\\.2:51234 -> 10\\.0\\.0\\.1:80(?: \\(([0-9]+) bytes missing "
      "before these\\))?\n");
  auto it = std::sregex_iterator(m.out.begin(), m.out.end(), marker);
  size_t prev_end = 0;
  for (; it != std::sregex_iterator(); ++it) {
    size_t start = static_cast<size_t>(it->position());
    if (prev_end > 0) bytes += m.out.substr(prev_end, start - 1 - prev_end);  // minus the '\n'
    if ((*it)[1].matched) missing_in_markers += std::stoull((*it)[1]);
    prev_end = start + static_cast<size_t>(it->length());
  }
  bytes += m.out.substr(prev_end);
  EXPECT_EQ(bytes.find_first_not_of('m'), std::string::npos);
  // Every "not written" line (one per stretch stdout could not take); read
  // once the CLI is done, so m.err no longer changes under the matches.
  uint64_t dropped = 0;
  const std::regex not_written(
      "connection 1: ([0-9]+) bytes client->server not written: stdout is too slow");
  for (auto w = std::sregex_iterator(m.err.begin(), m.err.end(), not_written);
       w != std::sregex_iterator(); ++w) {
    dropped += std::stoull((*w)[1].str());
  }
  EXPECT_GT(dropped, 0u) << m.err;
  EXPECT_EQ(bytes.size() + dropped, total);
  EXPECT_LE(missing_in_markers, dropped);
  EXPECT_THAT(m.err, HasSubstr(std::to_string(dropped) + " bytes not written to stdout"));
}

TEST(MirrorCommand, AnAgentWithoutMirrorSaysSo) {
  AgentThread agent;
  agent.call([&] { agent.refuse_with = v1::UNIMPLEMENTED; });
  Mirror m(agent.address(), {"--port", "80"});
  EXPECT_EQ(m.finish(), 1) << m.err;
  EXPECT_THAT(m.err, HasSubstr("siphon: mirror port 80 failed: this agent does not mirror "
                               "(UNIMPLEMENTED: mirror is not served)"));
}

TEST(MirrorCommand, BadFlagsAreUsageErrors) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--port", "0"},
           {"--port", "65536"},
           {"--port", "80", "--to", "127.0.0.1:9", "--both"},
           {"--port", "80", "--to", "127.0.0.1:9", "--stdout"},
           {"--port", "80", "--to", "nowhere"},
           {"--to", "127.0.0.1:9"},
       }) {
    std::vector<std::string> argv = {kCli, "--agent", "127.0.0.1:1", "mirror"};
    argv.insert(argv.end(), args.begin(), args.end());
    harness::Result r = harness::run(argv, harness::cleanEnv());
    EXPECT_EQ(r.exit_code, 2) << r;
    EXPECT_THAT(r.err, HasSubstr("siphon: ")) << r;
  }
}

}  // namespace
}  // namespace siphon
