// Unauthenticated peers are bounded (docs/SECURITY.md#handshake-admission).
// A real siphon-agent (targetless, in a process of its own, so that its
// descriptors, its memory and its log are its own to count) gets thousands
// of connections that never finish the handshake: idle ones, and slow ones
// that dribble part of a Hello, from several loopback source addresses,
// while an authenticated session streams through it. Past the caps the
// agent closes the connection that has waited longest without a Hello, at
// once; the session's bytes keep arriving exactly; a client from the
// flood's own address still gets in; the agent's descriptors stay under
// the caps and its soft RLIMIT_NOFILE; the log grows with the logarithm of
// the flood. No root. (The eviction order itself: admission_test.cc.)
//
// The flood's outcome is read after the agent has accounted for every
// connection (its metrics: pending + rejected + evicted = connections
// made), so no assertion depends on how fast it is; the waits are hang
// guards. Tests that count connections left open give the first bytes the
// whole --handshake-timeout (--handshake-first-bytes-timeout 600s), so
// that no deadline closes one during the test.
//
// Over 600 lines: the flood, the slow peers and the accounting share one agent process and its
// counters.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "agent/server/admission.h"
#include "siphon/client/client.h"
#include "siphon/protocol/codec.h"
#include "siphon/protocol/handshake.h"
#include "siphon/transport/stream.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/eventually.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/fakes/loopback.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/unit/agent/metrics/http_test_util.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using harness::Clock;
using std::chrono::milliseconds;

constexpr char kToken[] = "handshake-flood-token";

// ------------------------------------------------------------ the binary

// The test process holds every flood connection: room for them.
void raiseOwnFdLimit(rlim_t want) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max < want)
    GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << rl.rlim_max << " < " << want;
  if (rl.rlim_cur < want) {
    rl.rlim_cur = want;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
}

// A running siphon-agent targetless: stdout read up to the ready line,
// stderr (the log) to a file.
struct RunningAgent {
  harness::Child child;
  harness::TempDir dir;
  std::string log_path;
  std::string listen;
  std::string metrics;
  std::string log() const { return harness::readFile(log_path); }
  pid_t pid() const { return const_cast<harness::Child&>(child).pid(); }
};

// `ulimit`: a shell ulimit command the agent is started under ("" none).
::testing::AssertionResult startAgent(RunningAgent* a, std::vector<std::string> flags,
                                      const std::string& ulimit = "") {
  a->log_path = a->dir.path() + "/agent.log";
  std::vector<std::string> argv;
  if (!ulimit.empty()) argv = {"/bin/sh", "-c", ulimit + " && exec \"$0\" \"$@\""};
  argv.push_back(SIPHON_AGENT_BIN);
  for (const char* f : {"targetless", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                        "--first-client-timeout", "0s", "--log-level", "debug"}) {
    argv.push_back(f);
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto [out_r, out_w] = harness::makePipe();
  harness::Fd log(::open(a->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  a->child = harness::spawn(argv, harness::cleanEnv({std::string("SIPHON_TOKEN=") + kToken}),
                            out_w.get(), log.get());
  out_w.reset();
  std::string line;
  const auto deadline = Clock::now() + harness::kProcessDeadline;
  while (Clock::now() < deadline) {
    pollfd p{out_r.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char c;
    if (::read(out_r.get(), &c, 1) <= 0) break;
    if (c == '\n') break;
    line.push_back(c);
  }
  auto ready = harness::parseReadyLine(line);
  if (!ready) {
    return ::testing::AssertionFailure() << "no ready line (" << line << "); log:\n" << a->log();
  }
  a->listen = ready->fields["listen"];
  a->metrics = ready->fields["metrics"];
  return ::testing::AssertionSuccess();
}

uint64_t fdCount(pid_t pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return 0;
  uint64_t n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// A line of /proc/PID/<file> starting with `key`, its words after it.
std::vector<std::string> procLine(pid_t pid, const std::string& file, const std::string& key) {
  std::istringstream in(harness::readFile("/proc/" + std::to_string(pid) + "/" + file));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream words(line.substr(key.size()));
    std::vector<std::string> out;
    std::string w;
    while (words >> w) out.push_back(w);
    return out;
  }
  return {};
}

uint64_t rssKib(pid_t pid) {
  auto w = procLine(pid, "status", "VmRSS:");
  return w.empty() ? 0 : std::stoull(w[0]);
}

size_t countLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

// Connections closed at admission by one rule: the newcomer refused, or
// the connection that had waited longest evicted for it.
struct ByRule {
  double global = -1;      // max_handshakes
  double per_source = -1;  // max_handshakes_per_source
  double fd_reserve = -1;
  double sum() const { return global + per_source + fd_reserve; }
};

// The agent's handshake accounting, scraped.
struct Accounting {
  double pending = -1;
  ByRule rejected;
  ByRule evicted;
  double seen() const { return pending + rejected.sum() + evicted.sum(); }
};

Accounting scrapeAccounting(const std::string& metrics) {
  using metrics::testing::sample;
  const std::string text = metrics::testing::get(metrics, "/metrics").body;
  Accounting a;
  a.pending = sample(text, "siphon_handshakes_pending");
  for (auto [counter, rule] : {std::pair{"siphon_handshakes_rejected_total", &a.rejected},
                               std::pair{"siphon_handshakes_evicted_total", &a.evicted}}) {
    const std::string c(counter);
    rule->global = sample(text, c + "{reason=\"max_handshakes\"}");
    rule->per_source = sample(text, c + "{reason=\"max_handshakes_per_source\"}");
    rule->fd_reserve = sample(text, c + "{reason=\"fd_reserve\"}");
  }
  return a;
}

std::ostream& operator<<(std::ostream& out, const Accounting& a) {
  return out << "pending " << a.pending << ", rejected " << a.rejected.global << " + "
             << a.rejected.per_source << " + " << a.rejected.fd_reserve << ", evicted "
             << a.evicted.global << " + " << a.evicted.per_source << " + " << a.evicted.fd_reserve;
}

// Polls the metrics until the agent has accounted for `n` connections (a
// hang guard of 60 s, not a timing check).
bool waitAccounted(const std::string& metrics, double n, Accounting* out) {
  return fakes::eventually(
      [&] {
        *out = scrapeAccounting(metrics);
        return out->pending >= 0 && out->rejected.global >= 0 && out->evicted.global >= 0 &&
               out->seen() >= n;
      },
      std::chrono::seconds(60) * fakes::kSanitizerSlowdown, milliseconds(20));
}

sockaddr_in endpointOf(const std::string& host_port) {
  std::string host, port;
  EXPECT_TRUE(net::splitHostPort(host_port, &host, &port).ok());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(port)));
  return a;
}

// How a flood connection behaves: sends nothing, or part of a Hello.
enum class Kind { kIdle, kPartialPrefix, kPartialBody };

// The flood's connections, closed with it.
struct Flood {
  std::vector<int> fds;
  std::vector<int> source_of;  // index into the sources
  ~Flood() {
    for (int fd : fds) ::close(fd);
  }
};

// Opens `n` connections to `agent`, the i-th from 127.0.0.(first_host + i %
// sources), the i-th of kind i % 3 when `mixed`, else idle; each sends
// `each` when given (and nothing else).
void flood(Flood* f, const std::string& agent, int n, int sources, bool mixed, int first_host = 2,
           const std::string& each = "") {
  const sockaddr_in to = endpointOf(agent);
  const std::string hello =
      protocol::encodeFrame(protocol::makeHello("flood", kToken, {}, nullptr));
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    const std::string src = "127.0.0." + std::to_string(first_host + i % sources);
    ::inet_pton(AF_INET, src.c_str(), &from.sin_addr);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from), 0)
        << src << ": " << std::strerror(errno);
    // ECONNRESET: the agent accepted and reset it (refused, or evicted by
    // newer ones) before this thread came back from connect(), which a
    // loaded machine allows; the socket is then closed by the agent, as
    // closedByAgent() sees.
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
      ASSERT_EQ(errno, ECONNRESET) << "connection " << i << ": " << std::strerror(errno);
    }
    f->fds.push_back(fd);
    f->source_of.push_back(i % sources);
    const Kind kind = mixed ? static_cast<Kind>(i % 3) : Kind::kIdle;
    // A connection closed already refuses the bytes: that is fine.
    if (!each.empty()) {
      (void)!::send(fd, each.data(), each.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    } else if (kind == Kind::kPartialPrefix) {
      (void)!::send(fd, hello.data(), 3, MSG_NOSIGNAL | MSG_DONTWAIT);
    } else if (kind == Kind::kPartialBody) {
      (void)!::send(fd, hello.data(), hello.size() / 2, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
}

// Closed by the agent (EOF or RST), as far as this end can tell now.
bool closedByAgent(int fd) {
  char c;
  ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

v1::StreamOpen outgoingTo(uint16_t port) {
  v1::StreamOpen o;
  o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
  o.mutable_outgoing()->set_host("127.0.0.1");
  o.mutable_outgoing()->set_port(port);
  return o;
}

// Writes `chunk` on `stream` and reads it back whole; false (with the
// failure recorded) otherwise.
net::awaitable<bool> echoRound(std::shared_ptr<client::ClientStream> stream, std::string chunk) {
  absl::Status wrote = co_await stream->write(chunk);
  EXPECT_TRUE(wrote.ok()) << wrote;
  if (!wrote.ok()) co_return false;
  std::string got;
  while (got.size() < chunk.size()) {
    auto piece = co_await stream->read();
    EXPECT_TRUE(piece.ok() && piece->has_value())
        << (piece.ok() ? "EOF" : piece.status().ToString());
    if (!piece.ok() || !piece->has_value()) co_return false;
    got += **piece;
  }
  EXPECT_TRUE(got == chunk) << "the session's stream bytes differ";
  co_return got == chunk;
}

net::awaitable<void> pause(milliseconds d) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  t.expires_after(d);
  net::error_code ec;
  co_await t.async_wait(asio::redirect_error(net::use_awaitable, ec));
}

// One session's start, as a developer's command makes it: connect (TCP,
// TLS when asked, Hello, Welcome), then an info request.
struct SessionStart {
  absl::Status status;
  milliseconds took{0};  // connect() alone
};

// `n` sessions in a row, from 127.0.0.1 (the client's address on
// loopback), each after `before_each()`, each closed before the next.
std::vector<SessionStart> sessionsInARow(client::ClientOptions options, int n,
                                         const std::function<void()>& before_each) {
  std::vector<SessionStart> out;
  asio::io_context io;
  asio::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        for (int i = 0; i < n; ++i) {
          before_each();
          auto c = client::Client::create(io.get_executor(), options);
          const auto t0 = Clock::now();
          // Not in a braced initializer: GCC 12 destroys a co_await's
          // result there twice.
          absl::Status connected = co_await c->connect();
          SessionStart start;
          start.took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
          start.status = std::move(connected);
          if (start.status.ok()) {
            v1::Request info;
            info.mutable_info();
            auto answer = co_await c->call(info, milliseconds(10000));
            if (!answer.ok()) start.status = answer.status();
          }
          c->close();
          out.push_back(start);
        }
      },
      asio::detached);
  io.run();
  return out;
}

client::ClientOptions developer(const std::string& agent) {
  client::ClientOptions o;
  o.endpoints = {agent};
  o.token = kToken;
  o.client_name = "developer";
  // Long enough that a slow start shows as slow (the bound below), not as
  // the client's own timeout.
  o.connect_timeout = o.handshake_timeout = std::chrono::seconds(30);
  o.reconnect = false;
  return o;
}

// How long a session's start may take beside a flood. The issue asks for
// 1 s, and a start on loopback takes milliseconds (the agent answers a
// Hello at once, whatever waits beside it); five times the second,
// because a loaded two-core CI machine can stall a process that long. The
// failure this guards against (before the eviction order) is not a slow
// start but a refused one: the connection reset at accept.
constexpr milliseconds kStartBound = std::chrono::seconds(5) * fakes::kSanitizerSlowdown;

class HandshakeFloodTest : public ::testing::Test {
 protected:
  void SetUp() override { raiseOwnFdLimit(8192); }
  void TearDown() override {
    if (HasFailure()) std::cerr << "--- agent log\n" << agent_.log().substr(0, 20000) << "\n";
  }
  RunningAgent agent_;
};

// The acceptance test of the issue: 2000 connections that never finish
// the handshake, from 20 addresses, a third idle, a third stopping inside
// a Hello's length prefix, a third inside its body; deadlines long enough
// that none closes one during the test. All but the newest
// --max-handshakes are closed at once, each evicted by a newer one (before
// the eviction order the newest were refused, the first kept); the session
// streams throughout.
TEST_F(HandshakeFloodTest, PastTheCapsConnectionsCloseAtOnceAndTheSessionStreamsOn) {
  constexpr int kConnections = 2000, kSources = 20, kMax = 64, kPerSource = 16;
  ASSERT_TRUE(
      startAgent(&agent_, {"--max-handshakes", std::to_string(kMax), "--max-handshakes-per-source",
                           std::to_string(kPerSource), "--handshake-timeout", "600s",
                           "--handshake-first-bytes-timeout", "600s"}));
  fakes::EchoServer echo(fakes::loopbackListener(), fakes::EchoServer::Kind::kStream);
  const uint16_t echo_port = echo.port();

  Flood f;
  std::atomic<bool> flooded{false};
  bool accounted = false;
  Accounting acc;
  uint64_t fds_before = 0, fds_during = 0, rss_before = 0, rss_during = 0;
  std::jthread flooder;
  int rounds_during = 0;
  fakes::withClient(
      agent_.listen, kToken, [&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
        auto opened = co_await c->openStream(outgoingTo(echo_port));
        EXPECT_TRUE(opened.ok()) << opened.status();
        if (!opened.ok()) co_return;
        const std::shared_ptr<client::ClientStream> stream = *opened;
        unsigned round = 0;
        if (!co_await echoRound(stream, fakes::randomBytes(16 * 1024, round++))) co_return;
        fds_before = fdCount(agent_.pid());
        rss_before = rssKib(agent_.pid());
        flooder = std::jthread([&] {
          flood(&f, agent_.listen, kConnections, kSources, true);
          accounted = waitAccounted(agent_.metrics, kConnections, &acc);
          fds_during = fdCount(agent_.pid());
          rss_during = rssKib(agent_.pid());
          flooded = true;
        });
        // The session streams while the flood goes on...
        while (!flooded) {
          if (!co_await echoRound(stream, fakes::randomBytes(16 * 1024 + round, round))) co_return;
          ++round;
          ++rounds_during;
          co_await pause(milliseconds(5));
        }
        // ...and after it, with every slot taken: an outgoing connection (a new
        // descriptor in the agent) and a request.
        if (!co_await echoRound(stream, fakes::randomBytes(64 * 1024, round++))) co_return;
        auto second = co_await c->openStream(outgoingTo(echo_port));
        EXPECT_TRUE(second.ok()) << second.status();
        if (second.ok()) {
          const bool echoed = co_await echoRound(*second, fakes::randomBytes(32 * 1024, 99));
          EXPECT_TRUE(echoed);
        }
        v1::Request info;
        info.mutable_info();
        auto answer = co_await c->call(info, milliseconds(10000));
        EXPECT_TRUE(answer.ok()) << answer.status();
      });
  if (flooder.joinable()) flooder.join();
  ASSERT_TRUE(accounted) << "the agent did not account for every connection: " << acc;
  EXPECT_GT(rounds_during, 0);
  // Exactly --max-handshakes are waiting for their deadline, the newest
  // (the global cap binds: 20 sources round robin hold 4 each); every
  // other connection is closed already (an RST), none answered.
  int open = 0, newest_open = 0;
  std::vector<int> open_from(kSources, 0);
  for (size_t i = 0; i < f.fds.size(); ++i) {
    if (!closedByAgent(f.fds[i])) {
      ++open;
      ++open_from[f.source_of[i]];
      newest_open += i >= f.fds.size() - kMax;
    }
  }
  EXPECT_EQ(open, kMax);
  EXPECT_EQ(newest_open, kMax) << "the connections left open are not the newest";
  for (int n : open_from) EXPECT_LE(n, kPerSource);
  EXPECT_EQ(acc.pending, kMax);
  EXPECT_EQ(acc.evicted.global, kConnections - kMax) << acc;
  EXPECT_EQ(acc.evicted.per_source + acc.evicted.fd_reserve, 0) << acc;
  EXPECT_EQ(acc.rejected.sum(), 0) << acc;
  // Descriptors: one per pending handshake (and a few for the session's
  // second stream), not one per connection; memory likewise bounded.
  EXPECT_LE(fds_during, fds_before + kMax + 4);
  // (Not in an instrumented build: the allocator's quarantine holds freed
  // memory.)
  if (!fakes::kSanitizedBuild) {
    EXPECT_LE(rss_during, rss_before + 32 * 1024) << "KiB resident";
  }
  // The log: the 1st, 2nd, 4th... eviction of each reason, not 1936 lines.
  const std::string log = agent_.log();
  const size_t per_reason = static_cast<size_t>(std::log2(kConnections)) + 1;
  EXPECT_GE(countLines(log, "handshake_evicted"), 1u);
  EXPECT_LE(countLines(log, "handshake_evicted"), 2 * per_reason);
  EXPECT_EQ(countLines(log, "handshake_refused"), 0u);
  EXPECT_EQ(countLines(log, "coroutine_failed"), 0u);
}

// Each source address keeps its newest --max-handshakes-per-source: a
// source past its cap evicts its own oldest, never another source's.
TEST_F(HandshakeFloodTest, EachSourceAddressHasItsOwnCap) {
  constexpr int kSources = 3, kEach = 10, kPerSource = 4;
  ASSERT_TRUE(startAgent(&agent_, {"--max-handshakes", "100", "--max-handshakes-per-source",
                                   std::to_string(kPerSource), "--handshake-timeout", "600s",
                                   "--handshake-first-bytes-timeout", "600s"}));
  Flood f;
  flood(&f, agent_.listen, kSources * kEach, kSources, false);
  Accounting acc;
  ASSERT_TRUE(waitAccounted(agent_.metrics, kSources * kEach, &acc));
  std::vector<int> open_from(kSources, 0);
  for (size_t i = 0; i < f.fds.size(); ++i) {
    const bool open = !closedByAgent(f.fds[i]);
    open_from[f.source_of[i]] += open;
    // Round robin: the last kPerSource rounds are the newest of each source.
    EXPECT_EQ(open, static_cast<int>(i) >= kSources * (kEach - kPerSource)) << "connection " << i;
  }
  for (int s = 0; s < kSources; ++s) {
    EXPECT_EQ(open_from[s], kPerSource) << "127.0.0." << 2 + s;
  }
  EXPECT_EQ(acc.evicted.per_source, kSources * (kEach - kPerSource)) << acc;
  EXPECT_EQ(acc.evicted.global, 0);
  EXPECT_EQ(acc.rejected.sum(), 0);
  EXPECT_EQ(acc.pending, kSources * kPerSource);
  // A client from a full source's neighbour address still gets in.
  fakes::withClient(agent_.listen, kToken,
                    [&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
                      v1::Request info;
                      info.mutable_info();
                      auto answer = co_await c->call(info, milliseconds(10000));
                      EXPECT_TRUE(answer.ok()) << answer.status();
                    });
}

// The case: behind `kubectl port-forward` every client arrives from
// loopback, the flood's address. 3000 idle connections from 127.0.0.1,
// then ten sessions in a row from 127.0.0.1, each just after 32 more idle
// connections (so that every slot of the address is a fresh flood
// connection when the session comes, whatever the deadlines did
// meanwhile): each session starts. --handshake-timeout 600s keeps any
// deadline of the whole handshake out of it (before the eviction order,
// the first 16 of the flood held the address's slots for that long and
// every session was reset at accept); the first bytes' deadline is the
// default, which afterwards closes every flood connection, the 16 left
// open included. The agent's descriptors and memory stay bounded.
TEST_F(HandshakeFloodTest, ASessionFromTheFloodsOwnAddressStartsEachTime) {
  constexpr int kConnections = 3000, kSessions = 10, kBurst = 32, kPerSource = 16;
  ASSERT_TRUE(startAgent(&agent_, {"--handshake-timeout", "600s"}));
  const uint64_t fds_before = fdCount(agent_.pid()), rss_before = rssKib(agent_.pid());
  Flood f;
  flood(&f, agent_.listen, kConnections, 1, false, /*first_host=*/1);
  // The agent has taken every connection once all but the address's cap
  // are closed (evicted, or past the first bytes' deadline): a hang guard.
  auto closedCount = [&f] {
    int n = 0;
    for (int fd : f.fds) n += closedByAgent(fd);
    return n;
  };
  ASSERT_TRUE(fakes::eventually([&] { return closedCount() >= kConnections - kPerSource; },
                                std::chrono::seconds(60) * fakes::kSanitizerSlowdown,
                                milliseconds(20)))
      << closedCount() << " of " << kConnections << " closed";
  const uint64_t fds_flood = fdCount(agent_.pid()), rss_flood = rssKib(agent_.pid());

  uint64_t fds_most = fds_flood;
  const std::vector<SessionStart> starts = sessionsInARow(developer(agent_.listen), kSessions, [&] {
    flood(&f, agent_.listen, kBurst, 1, false, /*first_host=*/1);
    fds_most = std::max(fds_most, fdCount(agent_.pid()));
  });
  ASSERT_EQ(starts.size(), static_cast<size_t>(kSessions));
  milliseconds slowest{0};
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_TRUE(starts[i].status.ok()) << "session " << i << ": " << starts[i].status;
    EXPECT_LT(starts[i].took, kStartBound) << "session " << i;
    slowest = std::max(slowest, starts[i].took);
  }
  std::cerr << "slowest of " << kSessions << " session starts: " << slowest.count() << " ms\n";
  const Accounting acc = scrapeAccounting(agent_.metrics);
  EXPECT_EQ(acc.rejected.sum(), 0) << acc;
  // Descriptors: the address's slots and a session's socket, not one per
  // connection; memory likewise.
  EXPECT_LE(fds_flood, fds_before + kPerSource + 4);
  EXPECT_LE(fds_most, fds_before + kPerSource + 4);
  if (!fakes::kSanitizedBuild) {
    EXPECT_LE(rss_flood, rss_before + 32 * 1024) << "KiB resident";
    EXPECT_LE(rssKib(agent_.pid()), rss_before + 32 * 1024) << "KiB resident";
  }
  // The first bytes' deadline (2 s) closes what the flood left open,
  // --handshake-timeout (600 s) notwithstanding: a hang guard of 60 s.
  const int total = static_cast<int>(f.fds.size());
  EXPECT_TRUE(fakes::eventually([&] { return closedCount() == total; },
                                std::chrono::seconds(60) * fakes::kSanitizerSlowdown,
                                milliseconds(50)))
      << total - closedCount() << " flood connections still open";
  const std::string log = agent_.log();
  const size_t per_reason = static_cast<size_t>(std::log2(total)) + 1;
  EXPECT_GE(countLines(log, "handshake_evicted"), 1u);
  EXPECT_LE(countLines(log, "handshake_evicted"), per_reason);
  EXPECT_LE(countLines(log, "handshake_failed"), per_reason);
  EXPECT_EQ(countLines(log, "coroutine_failed"), 0u);
}

// --handshake-first-bytes-timeout (default 2 s): a peer that has sent
// nothing is closed at it; one that has sent part of its Hello has the
// whole --handshake-timeout.
TEST_F(HandshakeFloodTest, TheFirstBytesDeadlineClosesOnlyPeersThatSentNothing) {
  constexpr int kConnections = 60;
  ASSERT_TRUE(startAgent(&agent_, {"--max-handshakes", "1000", "--max-handshakes-per-source",
                                   "1000", "--handshake-timeout", "600s"}));
  Flood f;
  flood(&f, agent_.listen, kConnections, 1, true);  // idle, partial prefix, partial body
  auto idleClosed = [&f] {
    int n = 0;
    for (size_t i = 0; i < f.fds.size(); i += 3) n += closedByAgent(f.fds[i]);
    return n;
  };
  ASSERT_TRUE(fakes::eventually([&] { return idleClosed() == kConnections / 3; },
                                std::chrono::seconds(60) * fakes::kSanitizerSlowdown,
                                milliseconds(50)))
      << idleClosed() << " of " << kConnections / 3 << " idle connections closed";
  for (size_t i = 0; i < f.fds.size(); ++i) {
    if (i % 3 != 0) {
      EXPECT_FALSE(closedByAgent(f.fds[i])) << "connection " << i << " sent bytes";
    }
  }
  Accounting acc;
  ASSERT_TRUE(fakes::eventually(
      [&] { return (acc = scrapeAccounting(agent_.metrics)).pending == 2 * kConnections / 3; },
      std::chrono::seconds(10) * fakes::kSanitizerSlowdown, milliseconds(20)))
      << acc;
  EXPECT_EQ(acc.rejected.sum() + acc.evicted.sum(), 0) << acc;
  EXPECT_NE(agent_.log().find("no bytes within 2000 ms"), std::string::npos) << agent_.log();
}

// Idle and half-sent Hellos end at --handshake-timeout (which caps the
// first bytes' deadline too); the agent logs their ends at the 1st, 2nd,
// 4th... one, not once each.
TEST_F(HandshakeFloodTest, TheDeadlineClosesSilentPeersAndTheLogStaysLogarithmic) {
  constexpr int kConnections = 300;
  ASSERT_TRUE(startAgent(&agent_, {"--max-handshakes", "1000", "--max-handshakes-per-source",
                                   "1000", "--handshake-timeout", "1s"}));
  Flood f;
  flood(&f, agent_.listen, kConnections, 1, true);
  // Until every one is closed (a hang guard, 60 s).
  int closed = 0;
  fakes::eventually(
      [&] {
        closed = 0;
        for (int fd : f.fds) closed += closedByAgent(fd);
        return closed == kConnections;
      },
      std::chrono::seconds(60) * fakes::kSanitizerSlowdown, milliseconds(50));
  ASSERT_EQ(closed, kConnections) << "connections still open past the deadline";
  Accounting acc = scrapeAccounting(agent_.metrics);
  EXPECT_EQ(acc.pending, 0);
  EXPECT_EQ(acc.rejected.sum() + acc.evicted.sum(), 0) << acc;
  const size_t logged = countLines(agent_.log(), "handshake_failed");
  EXPECT_GE(logged, 1u);
  EXPECT_LE(logged, static_cast<size_t>(std::log2(kConnections)) + 1)
      << "lines, for " << kConnections;
}

// Under `ulimit -n 256` (soft and hard: the agent cannot raise it) and
// caps higher than that, the descriptor reserve is what holds: while fewer
// than a quarter of the descriptors are left a new connection takes the
// place of the oldest waiting one (no descriptor more), and the session
// opens new outgoing connections during the flood.
TEST_F(HandshakeFloodTest, TheFdReserveKeepsRoomForSessionsPastTheSoftLimit) {
  constexpr int kLimit = 256, kConnections = 400, kNewStreams = 16;
  ASSERT_TRUE(startAgent(&agent_,
                         {"--max-handshakes", "2000", "--max-handshakes-per-source", "2000",
                          "--handshake-timeout", "600s", "--handshake-first-bytes-timeout", "600s"},
                         "ulimit -n " + std::to_string(kLimit)));
  EXPECT_NE(agent_.log().find("fd_limit soft=256 hard=256"), std::string::npos) << agent_.log();
  fakes::EchoServer echo(fakes::loopbackListener(), fakes::EchoServer::Kind::kStream);
  const uint16_t echo_port = echo.port();
  Flood f;
  bool accounted = false;
  Accounting acc;
  uint64_t fds_during = 0;
  fakes::withClient(
      agent_.listen, kToken, [&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
        auto opened = co_await c->openStream(outgoingTo(echo_port));
        EXPECT_TRUE(opened.ok()) << opened.status();
        if (!opened.ok()) co_return;
        if (!co_await echoRound(*opened, fakes::randomBytes(8 * 1024, 1))) co_return;
        // Blocking, on this thread: the session waits meanwhile, its
        // keepalives well within reach.
        flood(&f, agent_.listen, kConnections, 1, false);
        accounted = waitAccounted(agent_.metrics, kConnections, &acc);
        fds_during = fdCount(agent_.pid());
        if (!co_await echoRound(*opened, fakes::randomBytes(8 * 1024, 2))) co_return;
        for (int i = 0; i < kNewStreams; ++i) {
          auto more = co_await c->openStream(outgoingTo(echo_port));
          EXPECT_TRUE(more.ok()) << "stream " << i << " opened during the flood: " << more.status();
          if (!more.ok()) co_return;
          if (!co_await echoRound(*more, fakes::randomBytes(4096, 10 + i))) co_return;
        }
      });
  ASSERT_TRUE(accounted) << acc;
  EXPECT_GT(acc.evicted.fd_reserve, 0) << acc;
  EXPECT_EQ(acc.evicted.global + acc.evicted.per_source + acc.rejected.sum(), 0) << acc;
  const FdBudget budget = fdBudgetFor(kLimit);
  EXPECT_LE(fds_during, budget.limit - budget.reserve);
}

// The agent raises its soft RLIMIT_NOFILE to kFdLimitTarget, or the hard
// limit when lower, and logs it.
TEST_F(HandshakeFloodTest, RaisesItsSoftFdLimitAtStartUp) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max <= 1024) GTEST_SKIP() << "hard RLIMIT_NOFILE " << rl.rlim_max << ": no room";
  ASSERT_TRUE(startAgent(&agent_, {}, "ulimit -Sn 1024"));
  auto limits = procLine(agent_.pid(), "limits", "Max open files");
  ASSERT_GE(limits.size(), 2u);
  const rlim_t want = std::min<rlim_t>(kFdLimitTarget, rl.rlim_max);
  EXPECT_EQ(limits[0], std::to_string(want));
  EXPECT_NE(agent_.log().find("fd_limit soft=" + std::to_string(want)), std::string::npos)
      << agent_.log();
}

// ------------------------------------------------------------ over TLS

class TlsHandshakeFloodTest : public HandshakeFloodTest {
 protected:
  void SetUp() override {
    HandshakeFloodTest::SetUp();
    if (IsSkipped()) return;
    harness::Result r = harness::run(
        {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "2", "-subj", "/CN=agent", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", certs_.path() + "/agent.key", "-out", certs_.path() + "/agent.pem"});
    ASSERT_EQ(r.exit_code, 0) << "making a certificate: " << r;
  }
  std::vector<std::string> tlsFlags(std::vector<std::string> more) const {
    std::vector<std::string> flags = {"--tls-cert", certs_.path() + "/agent.pem", "--tls-key",
                                      certs_.path() + "/agent.key"};
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  }
  harness::TempDir certs_;
};

// A TLS record header promising a ClientHello, and a few bytes of it.
const std::string kPartialClientHello("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11);

// A peer stuck inside its TLS ClientHello holds a handshake slot like one
// stuck inside its Hello: past the cap the oldest is closed at once.
TEST_F(TlsHandshakeFloodTest, PartialClientHellosCountAgainstTheCap) {
  constexpr int kConnections = 200, kMax = 16;
  ASSERT_TRUE(startAgent(
      &agent_, tlsFlags({"--max-handshakes", std::to_string(kMax), "--max-handshakes-per-source",
                         std::to_string(kMax), "--handshake-timeout", "600s",
                         "--handshake-first-bytes-timeout", "600s"})));
  Flood f;
  flood(&f, agent_.listen, kConnections, 2, false);  // the global cap binds, not the per-source
  for (int fd : f.fds) {
    (void)!::send(fd, kPartialClientHello.data(), kPartialClientHello.size(),
                  MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  Accounting acc;
  ASSERT_TRUE(waitAccounted(agent_.metrics, kConnections, &acc));
  int open = 0, newest_open = 0;
  for (size_t i = 0; i < f.fds.size(); ++i) {
    const bool still = !closedByAgent(f.fds[i]);
    open += still;
    newest_open += still && i >= f.fds.size() - kMax;
  }
  EXPECT_EQ(open, kMax);
  EXPECT_EQ(newest_open, kMax) << "the connections left open are not the newest";
  EXPECT_EQ(acc.pending, kMax);
  EXPECT_EQ(acc.evicted.global, kConnections - kMax) << acc;
  EXPECT_EQ(acc.rejected.sum(), 0) << acc;
}

// Over TLS the same: a flood from the client's own address of connections
// stuck inside their ClientHello (past the first bytes' deadline, which a
// ClientHello meets), and sessions from that address still start, each
// after 32 more of them; the stuck ones are reset mid-TLS-handshake.
TEST_F(TlsHandshakeFloodTest, AClientFromTheFloodsOwnAddressGetsIn) {
  constexpr int kConnections = 500, kSessions = 3, kBurst = 32, kPerSource = 16;
  ASSERT_TRUE(startAgent(&agent_, tlsFlags({"--handshake-timeout", "600s"})));
  Flood f;
  flood(&f, agent_.listen, kConnections, 1, false, /*first_host=*/1, kPartialClientHello);
  // Every connection taken: all but the address's cap closed (a hang guard).
  auto open = [&f] {
    int n = 0;
    for (int fd : f.fds) n += !closedByAgent(fd);
    return n;
  };
  ASSERT_TRUE(fakes::eventually([&] { return open() <= kPerSource; },
                                std::chrono::seconds(60) * fakes::kSanitizerSlowdown,
                                milliseconds(20)))
      << open() << " open";
  client::ClientOptions o = developer(agent_.listen);
  o.tls_ca = certs_.path() + "/agent.pem";
  const std::vector<SessionStart> starts = sessionsInARow(o, kSessions, [&] {
    flood(&f, agent_.listen, kBurst, 1, false, /*first_host=*/1, kPartialClientHello);
  });
  ASSERT_EQ(starts.size(), static_cast<size_t>(kSessions));
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_TRUE(starts[i].status.ok()) << "session " << i << ": " << starts[i].status;
    EXPECT_LT(starts[i].took, kStartBound) << "session " << i;
  }
  // The address's slots hold the newest of the flood but one, whose place
  // the last session took; every other flood connection was evicted.
  const int left = open();
  EXPECT_EQ(left, kPerSource - 1);
  const Accounting acc = scrapeAccounting(agent_.metrics);
  EXPECT_EQ(acc.evicted.per_source, static_cast<double>(f.fds.size() - left)) << acc;
  EXPECT_EQ(acc.rejected.sum(), 0) << acc;
  EXPECT_EQ(countLines(agent_.log(), "coroutine_failed"), 0u);
}

// The TLS handshake and the Hello share one --handshake-timeout from
// accept: a peer that completes TLS and then says nothing is given what is
// left of it for its Hello (the agent's own message says how much), not a
// whole new timeout.
TEST_F(TlsHandshakeFloodTest, OneDeadlineCoversTheTlsHandshakeAndTheHello) {
  constexpr int kTimeoutMs = 3000;
  ASSERT_TRUE(
      startAgent(&agent_, tlsFlags({"--handshake-timeout", std::to_string(kTimeoutMs) + "ms"})));
  asio::io_context io;
  net::ssl::context ctx(net::ssl::context::tls_client);
  ctx.set_verify_mode(net::ssl::verify_none);
  net::ssl::stream<net::tcp::socket> tls(io, ctx);
  const sockaddr_in to = endpointOf(agent_.listen);
  net::error_code ec;
  tls.lowest_layer().connect(
      net::tcp::endpoint(asio::ip::address_v4(ntohl(to.sin_addr.s_addr)), ntohs(to.sin_port)), ec);
  ASSERT_FALSE(ec) << ec.message();
  tls.handshake(net::ssl::stream_base::client, ec);
  ASSERT_FALSE(ec) << "TLS handshake: " << ec.message();
  // Silent after TLS: wait for the agent to close (a hang guard, 30 s).
  pollfd p{tls.lowest_layer().native_handle(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000 * fakes::kSanitizerSlowdown), 1)
      << "the agent did not close the connection";
  std::smatch m;
  const std::string log = agent_.log();
  const std::regex given("handshake_failed .*no handshake frame within ([0-9]+) ms");
  ASSERT_TRUE(std::regex_search(log, m, given)) << log;
  EXPECT_LT(std::stoi(m[1]), kTimeoutMs) << "the Hello got a deadline of its own: " << m[0];
}

struct BadFlags {
  std::vector<std::string> flags;
  std::string message;  // what stderr must say
};

TEST(HandshakeFlags, BadValuesExitTwoNamingTheFlag) {
  const std::vector<BadFlags> cases = {
      {{"--max-handshakes", "0"}, "--max-handshakes: Value 0 not in range"},
      {{"--max-handshakes-per-source", "0"}, "--max-handshakes-per-source: Value 0 not in range"},
      {{"--max-handshakes", "70000"}, "--max-handshakes: Value 70000 not in range"},
      {{"--max-handshakes", "8", "--max-handshakes-per-source", "16"},
       "--max-handshakes-per-source 16: must be at most --max-handshakes (8)"},
      {{"--handshake-timeout", "0s"}, "--handshake-timeout 0s: must be positive"},
      {{"--handshake-first-bytes-timeout", "0s"},
       "--handshake-first-bytes-timeout 0s: must be positive"},
      {{"--handshake-first-bytes-timeout", "soon"},
       "--handshake-first-bytes-timeout soon: bad duration 'soon'"},
  };
  for (const BadFlags& c : cases) {
    std::vector<std::string> argv = {SIPHON_AGENT_BIN, "targetless", "--insecure-no-auth",
                                     "--listen", "127.0.0.1:0"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    harness::Result r = harness::run(argv, harness::cleanEnv());
    EXPECT_EQ(r.exit_code, kExitUsage) << c.message << "\n" << r;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r;
  }
}

}  // namespace
}  // namespace siphon::agent
