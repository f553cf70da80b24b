// Mirror end to end, as root, with real traffic: a "pod" network namespace
// with the application (busybox httpd on port 80, which the agent targets by
// PID, and the test's own byte sink on port 9000), a "client" namespace
// joined to it by a veth pair (curl and the test's senders come from there),
// the real siphon-agent, and the real `siphon mirror` printing to stdout or
// replaying to a server the test runs on the host's loopback.
//
// Every kernel object has a unique name and an RAII owner, so a failed
// assertion still kills the processes and deletes the namespaces. Without
// root every test skips with the reason.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/tcx.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and a veth pair, runs siphon-agent, which attaches "
    "TC programs to the interfaces of another process's network namespace";

constexpr const char* kPodIp = "10.252.0.1";
constexpr const char* kClientIp = "10.252.0.2";
constexpr uint16_t kSinkPort = 9000;

// A blocking TCP connection from the named namespace to the pod; -1 on
// failure.
int connectToPod(const std::string& netns, uint16_t port) {
  int fd = socketInNetns(netns, AF_INET, SOCK_STREAM);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, kPodIp, &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  setTimeouts(fd, 30);
  return fd;
}

// A TCP server reading every connection to EOF, on a thread per connection:
// the application's sink in the pod, or the developer's replay target on
// the host. With a seed, each connection's bytes are checked against
// Pattern(seed).
class ByteSink {
 public:
  // On the host's loopback, port 0.
  explicit ByteSink(std::optional<uint64_t> seed)
      : seed_(seed),
        acceptor_(listenOnLoopback(&port_, kBacklog), kIoTimeoutSeconds,
                  [this](int fd) { serve(fd); }) {}
  // Inside the named namespace, on `port` of every address.
  ByteSink(std::optional<uint64_t> seed, const std::string& netns, uint16_t port)
      : seed_(seed),
        port_(port),
        acceptor_(listenInNetns(netns, port, kBacklog), kIoTimeoutSeconds,
                  [this](int fd) { serve(fd); }) {}

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Bytes read so far, over every connection.
  uint64_t received() const { return received_; }

  struct Connection {
    uint64_t bytes = 0;
    uint64_t good = 0;  // bytes that matched the pattern before the first difference
    bool eof = false;   // ended cleanly
  };
  // The connections that ended, in the order they ended.
  std::vector<Connection> ended() {
    std::lock_guard<std::mutex> l(mu_);
    return ended_;
  }
  // Waits until `n` connections ended; false after `limit`.
  bool waitEnded(size_t n, std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (ended().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

 private:
  static constexpr int kBacklog = 64;
  static constexpr int kIoTimeoutSeconds = 60;

  void serve(int fd) {
    Connection conn;
    std::optional<Pattern> pattern;
    if (seed_) pattern.emplace(*seed_);
    std::string buf(1 << 20, '\0'), want;
    bool matching = true;
    while (true) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        conn.eof = n == 0;
        break;
      }
      const auto got = static_cast<size_t>(n);
      if (pattern && matching) {
        want.resize(got);
        pattern->fill(want.data(), got);
        if (std::memcmp(buf.data(), want.data(), got) == 0) {
          conn.good += got;
        } else {
          matching = false;
        }
      }
      conn.bytes += got;
      received_ += got;
    }
    std::lock_guard<std::mutex> l(mu_);
    ended_.push_back(conn);
  }

  std::optional<uint64_t> seed_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<Connection> ended_;
  std::atomic<uint64_t> received_{0};
  Acceptor acceptor_;  // last: its workers use the members above
};

// Writes of sendPaced().
constexpr size_t kPaceChunk = 256 << 10;
// How far the paced sender may be ahead of what the replay received, so at
// most this plus one chunk is anywhere between them. On a busy two-core
// machine the veth delivers packets to the pod out of order (two CPUs'
// backlogs), as far back as the bytes in flight: the agent's out-of-order
// bound (8 MiB per direction, MirrorEngineOptions) must hold that much, or a
// hole would be given up as a gap although its bytes come. With a 1 MiB
// bound this pacing gave a gap in about one run in ten.
constexpr uint64_t kPaceAhead = 4 << 20;

// Sends Pattern(seed) in kPaceChunk writes, from byte `from` of the pattern
// stream (the pattern is kept in `p` across calls) to `to`, waiting before
// each write until `caught_up(sent)` holds (pacing). False on a write
// failure or when caught_up() stays false for 60 s.
bool sendPaced(int fd, Pattern& p, uint64_t from, uint64_t to,
               const std::function<bool(uint64_t sent)>& caught_up) {
  std::string buf(kPaceChunk, '\0');
  uint64_t sent = from;
  while (sent < to) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!caught_up(sent)) {
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "the mirror made no progress for 60 s at byte " << sent;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const auto n = static_cast<size_t>(std::min<uint64_t>(buf.size(), to - sent));
    p.fill(buf.data(), n);
    if (!writeAll(fd, buf.data(), n)) {
      ADD_FAILURE() << "send at byte " << sent << ": " << std::strerror(errno);
      return false;
    }
    sent += n;
  }
  return true;
}

// Sums the numbers `re` captures (group 1) in `text`.
uint64_t sumOf(const std::string& text, const std::regex& re) {
  uint64_t sum = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    sum += std::stoull((*it)[1]);
  }
  return sum;
}

// The byte counts of connection `id`'s closed line.
struct ClosedCounts {
  bool found = false;
  std::string reason;  // empty for a clean end
  uint64_t c2s = 0, s2c = 0, c2s_lost = 0, replayed = 0, not_replayed = 0;
};
ClosedCounts closedCounts(const std::string& err, int id) {
  ClosedCounts c;
  std::smatch m;
  const std::regex line("mirror: connection " + std::to_string(id) +
                        " \\S+ -> \\S+ closed(?: \\(([^)]*)\\))?: client->server ([0-9]+) bytes, "
                        "server->client ([0-9]+) bytes([^\n]*)\n");
  if (!std::regex_search(err, m, line)) return c;
  c.found = true;
  c.reason = m[1];
  c.c2s = std::stoull(m[2]);
  c.s2c = std::stoull(m[3]);
  const std::string rest = m[4];
  std::smatch r;
  if (std::regex_search(rest, r, std::regex(", ([0-9]+) bytes client->server lost"))) {
    c.c2s_lost = std::stoull(r[1]);
  }
  if (std::regex_search(rest, r, std::regex(", replayed ([0-9]+) bytes"))) {
    c.replayed = std::stoull(r[1]);
  }
  if (std::regex_search(rest, r, std::regex(", not replayed ([0-9]+) bytes"))) {
    c.not_replayed = std::stoull(r[1]);
  }
  return c;
}

class MirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    pod_.emplace();
    client_.emplace();
    ASSERT_TRUE(pod_->created() && client_->created());
    ASSERT_TRUE(linkVeth({pod_->name(), "vpod", {std::string(kPodIp) + "/24"}},
                         {client_->name(), "vcli", {std::string(kClientIp) + "/24"}}));
    std::string www = dir_->path() + "/www";
    std::filesystem::create_directories(www);
    dir_->file("www/index.html", "original\n");
    httpd_ = spawn(
        {"ip", "netns", "exec", pod_->name(), "busybox", "httpd", "-f", "-p", "80", "-h", www},
        std::nullopt, -1, -1);
    ASSERT_GT(httpd_.pid(), 0);
    const auto deadline = Clock::now() + kProcessDeadline;
    fakes::eventually(
        [&] {
          return netnsInodeOf(httpd_.pid()) == pod_->inode() &&
                 readFile("/proc/" + std::to_string(httpd_.pid()) + "/comm") == "busybox\n";
        },
        deadline - Clock::now());
    std::string got;
    fakes::eventually([&] { return (got = curl()) == "original\n"; }, deadline - Clock::now(),
                      std::chrono::milliseconds(20));
    ASSERT_EQ(got, "original\n");
  }

  void TearDown() override {
    for (auto& p : procs_) {
      p->signal(SIGCONT);
      p->signal(SIGKILL);
      p->finish();
    }
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  void startAgent(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {
        "--listen", "127.0.0.1:0", "--token-file", token_file_, "--first-client-timeout",
        "120s",     "--log-level", "debug"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (const char* a : {"targeted", "--pid"}) argv.push_back(a);
    argv.push_back(std::to_string(httpd_.pid()));
    agent_.emplace(argv, cleanEnv(), dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  // A `siphon` command against the agent; waits until `ready` shows on its
  // stderr (or it fails: "siphon:").
  Proc* cli(const std::string& command, const std::vector<std::string>& args,
            const std::string& ready) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent",   endpoint_,
                                     "--token-file", token_file_, command};
    argv.insert(argv.end(), args.begin(), args.end());
    procs_.push_back(std::make_unique<Proc>(argv, cleanEnv()));
    Proc* p = procs_.back().get();
    p->readUntil([&](const std::string&, const std::string& err) {
      return err.find(ready) != std::string::npos || err.find("siphon:") != std::string::npos;
    });
    EXPECT_THAT(p->err, HasSubstr(ready));
    return p;
  }
  Proc* mirror(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--port"};
    all.insert(all.end(), args.begin(), args.end());
    return cli("mirror", all, "mirror: port " + args.front());
  }

  // curl from the client namespace to the pod's port 80; the body, or
  // "curl exit N" on failure.
  std::string curl() {
    Result r = run({"ip", "netns", "exec", client_->name(), "curl", "-sS", "--max-time", "5",
                    std::string("http://") + kPodIp + "/"});
    if (r.exit_code != 0) return "curl exit " + std::to_string(r.exit_code) + ": " + r.err;
    return r.out;
  }

  // Reads the process's output until `text` shows on its stderr.
  static bool waitFor(Proc* p, const std::string& text) {
    return p->readUntil([&](const std::string&, const std::string& err) {
      return err.find(text) != std::string::npos;
    });
  }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> pod_, client_;
  Child httpd_;
  std::optional<Agent> agent_;
  std::string endpoint_;
  std::vector<std::unique_ptr<Proc>> procs_;
};

// (a) A bulk transfer to the application, replayed to a local server: every
// byte, in order, no gap. The sender is paced by the replay's progress (at
// most kPaceAhead ahead of it), so the transfer runs at the rate the machine
// sustains through the whole chain (TC copy, reassembly, session, CLI,
// replay) and nothing has a reason to be dropped.
TEST_F(MirrorTest, BulkTransferIsReplayedByteExactWithoutGaps) {
  ASSERT_NO_FATAL_FAILURE(startAgent());
  constexpr uint64_t kTotal = 512ull << 20;
  constexpr uint64_t kSeed = 0x5eed0001;
  ByteSink app(kSeed, pod_->name(), kSinkPort);
  ByteSink replay(kSeed);
  Proc* m = mirror({std::to_string(kSinkPort), "--to", replay.address()});
  ASSERT_THAT(m->err, HasSubstr("client->server bytes replayed to " + replay.address()));

  Fd c(connectToPod(client_->name(), kSinkPort));
  ASSERT_GE(c.get(), 0) << std::strerror(errno);
  Pattern p(kSeed);
  const auto start = Clock::now();
  ASSERT_TRUE(sendPaced(c.get(), p, 0, kTotal,
                        [&](uint64_t sent) { return sent <= replay.received() + kPaceAhead; }));
  ASSERT_EQ(::shutdown(c.get(), SHUT_WR), 0);
  ASSERT_TRUE(app.waitEnded(1));
  ASSERT_TRUE(replay.waitEnded(1, std::chrono::seconds(120)))
      << "the replay never ended; replayed " << replay.received() << " bytes";
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double mb_per_s = static_cast<double>(kTotal) / 1e6 / seconds;
  RecordProperty("mirror_replay_mb_per_s", std::to_string(static_cast<int>(mb_per_s)));
  std::cout << "mirrored and replayed " << (kTotal >> 20) << " MiB in " << seconds
            << " s: " << mb_per_s << " MB/s\n";

  auto app_conns = app.ended();
  auto replayed = replay.ended();
  ASSERT_EQ(app_conns.size(), 1u);
  ASSERT_EQ(replayed.size(), 1u);
  EXPECT_EQ(app_conns[0].good, kTotal);
  EXPECT_TRUE(app_conns[0].eof);
  EXPECT_EQ(replayed[0].bytes, kTotal);
  EXPECT_EQ(replayed[0].good, kTotal) << "the replayed bytes differ from byte " << replayed[0].good;
  EXPECT_TRUE(replayed[0].eof);

  ASSERT_TRUE(waitFor(m, " closed")) << m->err;
  m->signal(SIGINT);
  EXPECT_EQ(m->finish(), 0) << m->err;
  EXPECT_THAT(m->err, Not(HasSubstr("(gap)")));
  ClosedCounts closed = closedCounts(m->err, 1);
  ASSERT_TRUE(closed.found) << m->err;
  EXPECT_EQ(closed.reason, "") << m->err;
  EXPECT_EQ(closed.c2s, kTotal);
  EXPECT_EQ(closed.replayed, kTotal);
  EXPECT_EQ(closed.not_replayed, 0u);
  EXPECT_THAT(m->err, HasSubstr("summary: 1 connection, client->server " + std::to_string(kTotal) +
                                " bytes (gaps 0 bytes)"));
}

// (b) Both directions of a small HTTP exchange, on stdout, in order, each
// after its marker.
TEST_F(MirrorTest, BothDirectionsOfAnHttpExchangeInOrder) {
  ASSERT_NO_FATAL_FAILURE(startAgent());
  Proc* m = mirror({"80", "--both"});
  EXPECT_EQ(curl(), "original\n");
  ASSERT_TRUE(waitFor(m, " closed")) << m->err;
  m->signal(SIGINT);
  EXPECT_EQ(m->finish(), 0) << m->err;

  std::smatch opened;
  ASSERT_TRUE(std::regex_search(m->err, opened,
                                std::regex("mirror: connection 1 (10\\.252\\.0\\.2:[0-9]+) -> "
                                           "10\\.252\\.0\\.1:80 opened\n")))
      << m->err;
  const std::string client = opened[1];
  const std::string request_marker = ">>> #1 " + client + " -> 10.252.0.1:80\n";
  const std::string response_marker = "\n<<< #1 " + client + " <- 10.252.0.1:80\n";
  EXPECT_EQ(m->out.rfind(request_marker + "GET / HTTP/1.1\r\n", 0), 0u) << m->out;
  const size_t end_of_request = m->out.find("\r\n\r\n");
  const size_t response = m->out.find(response_marker);
  ASSERT_NE(end_of_request, std::string::npos) << m->out;
  ASSERT_NE(response, std::string::npos) << m->out;
  // The request whole, then the response: nothing between them.
  EXPECT_EQ(response, end_of_request + 4) << m->out;
  const std::string answer = m->out.substr(response + response_marker.size());
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << m->out;
  EXPECT_THAT(answer, HasSubstr("\r\n\r\noriginal\n"));
  EXPECT_EQ(answer.find(">>> #"), std::string::npos) << m->out;
  EXPECT_THAT(m->err, Not(HasSubstr("(gap)")));
  EXPECT_THAT(m->err, Not(HasSubstr("joined mid-stream")));
}

// (c) A connection that was open before the mirror started: what it sends
// afterwards is mirrored, and the open line says the mirror joined late.
TEST_F(MirrorTest, AConnectionOpenBeforeTheMirrorIsJoinedMidStream) {
  ASSERT_NO_FATAL_FAILURE(startAgent());
  ByteSink app(std::nullopt, pod_->name(), kSinkPort);
  Fd c(connectToPod(client_->name(), kSinkPort));
  ASSERT_GE(c.get(), 0) << std::strerror(errno);
  const std::string before = "bytes sent before the mirror\n";
  ASSERT_TRUE(writeAll(c.get(), before));
  fakes::eventually([&] { return app.received() >= before.size(); }, std::chrono::seconds(10),
                    std::chrono::milliseconds(5));
  ASSERT_EQ(app.received(), before.size());

  Proc* m = mirror({std::to_string(kSinkPort)});
  const std::string after = "bytes sent after the mirror started\n";
  ASSERT_TRUE(writeAll(c.get(), after));
  ASSERT_TRUE(waitFor(m, "opened")) << m->err;
  c.reset();  // FIN
  ASSERT_TRUE(app.waitEnded(1));
  ASSERT_TRUE(waitFor(m, " closed")) << m->err;
  m->signal(SIGINT);
  EXPECT_EQ(m->finish(), 0) << m->err;

  EXPECT_THAT(m->err, HasSubstr("opened (joined mid-stream: earlier bytes unknown)\n"));
  EXPECT_THAT(m->out, HasSubstr(after));
  EXPECT_THAT(m->out, Not(HasSubstr("before the mirror")));
  ClosedCounts closed = closedCounts(m->err, 1);
  ASSERT_TRUE(closed.found) << m->err;
  EXPECT_EQ(closed.c2s, after.size());
}

// (d) The mirror's client stops reading (SIGSTOP) while traffic flows: the
// agent gives up bytes for that session only and says how many. What was
// delivered plus what the gaps report is exactly what the application got,
// and the application's transfer itself is untouched.
TEST_F(MirrorTest, AStalledMirrorLosesBytesAsGapsThatAddUpExactly) {
  // A small per-session budget, so the stall overflows it quickly.
  ASSERT_NO_FATAL_FAILURE(startAgent({"--mirror-buffer", "1024"}));
  constexpr uint64_t kSeed = 0x5eed0004;
  constexpr uint64_t kPaced = 16ull << 20;     // before and after the stall
  constexpr uint64_t kStalled = 160ull << 20;  // while the mirror is stopped
  constexpr uint64_t kTotal = 2 * kPaced + kStalled;
  ByteSink app(kSeed, pod_->name(), kSinkPort);
  ByteSink replay(std::nullopt);
  Proc* m = mirror({std::to_string(kSinkPort), "--to", replay.address()});

  Fd c(connectToPod(client_->name(), kSinkPort));
  ASSERT_GE(c.get(), 0) << std::strerror(errno);
  Pattern p(kSeed);
  auto paced = [&](uint64_t sent) { return sent <= replay.received() + kPaceAhead; };
  ASSERT_TRUE(sendPaced(c.get(), p, 0, kPaced, paced));
  m->signal(SIGSTOP);
  // The application does not wait for the mirror: all of it arrives.
  ASSERT_TRUE(sendPaced(c.get(), p, kPaced, kPaced + kStalled, [](uint64_t) { return true; }));
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (app.received() < kPaced + kStalled && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(app.received(), kPaced + kStalled);
  m->signal(SIGCONT);
  // Paced again once the mirror has caught up with what it still holds.
  const uint64_t resumed_from = replay.received();
  const bool caught_up = sendPaced(c.get(), p, kPaced + kStalled, kTotal, [&](uint64_t sent) {
    return sent - (kPaced + kStalled) <= replay.received() - resumed_from + kPaceAhead;
  });
  if (!caught_up) {
    m->signal(SIGINT);  // for its lines
    m->finish();
  }
  ASSERT_TRUE(caught_up) << m->err;
  ASSERT_EQ(::shutdown(c.get(), SHUT_WR), 0);
  ASSERT_TRUE(app.waitEnded(1));
  auto app_conns = app.ended();
  ASSERT_EQ(app_conns.size(), 1u);
  EXPECT_EQ(app_conns[0].good, kTotal);
  EXPECT_TRUE(app_conns[0].eof);

  ASSERT_TRUE(waitFor(m, "connection 1 10.252.0.2")) << m->err;
  ASSERT_TRUE(waitFor(m, " closed")) << m->err;
  m->signal(SIGINT);
  EXPECT_EQ(m->finish(), 0) << m->err;
  ClosedCounts closed = closedCounts(m->err, 1);
  ASSERT_TRUE(closed.found) << m->err;
  const uint64_t gap_lines =
      sumOf(m->err, std::regex("connection 1: ([0-9]+) bytes client->server lost \\(gap\\)"));
  EXPECT_GT(closed.c2s_lost, 0u) << m->err;
  EXPECT_EQ(gap_lines, closed.c2s_lost) << m->err;
  EXPECT_EQ(closed.c2s + closed.c2s_lost, kTotal) << m->err;
  EXPECT_EQ(closed.replayed, closed.c2s) << m->err;
  RecordProperty("gap_bytes", std::to_string(closed.c2s_lost));
  std::cout << "stalled mirror: " << closed.c2s << " bytes delivered + " << closed.c2s_lost
            << " bytes in gaps = " << kTotal << " sent\n";
}

// (e) The agent dies by SIGKILL while mirroring: nothing of ours stays on
// the pod's interfaces (the TCX links die with their last fd), and the
// application goes on as before.
TEST_F(MirrorTest, SigkillOfTheAgentLeavesNoProgramBehind) {
  ASSERT_NO_FATAL_FAILURE(startAgent());
  Proc* m = mirror({"80", "--both"});
  EXPECT_EQ(curl(), "original\n");
  ASSERT_TRUE(waitFor(m, " closed")) << m->err;
  // While mirroring, the programs are there: the check below can fail.
  std::vector<std::string> attached = tcxPrograms(pod_->name());
  EXPECT_FALSE(attached.empty());
  RecordProperty("attached", ::testing::PrintToString(attached));

  agent_->child().kill();
  // The links go as the dead process's fds are released, which the kernel
  // may finish a little after the process is reaped: look again a while.
  std::vector<std::string> left;
  fakes::eventually([&] { return (left = tcxPrograms(pod_->name())).empty(); },
                    std::chrono::seconds(10), std::chrono::milliseconds(20));
  EXPECT_EQ(left, std::vector<std::string>{});
  for (const char* dev : {"lo", "vpod"}) {
    Result net = run({"ip", "netns", "exec", pod_->name(), "bpftool", "net", "show", "dev", dev});
    EXPECT_EQ(net.exit_code, 0) << net;
    EXPECT_EQ(net.out.find("mirror"), std::string::npos) << net;
    Result tc =
        run({"ip", "netns", "exec", pod_->name(), "tc", "filter", "show", "dev", dev, "ingress"});
    EXPECT_EQ(tc.out.find("bpf"), std::string::npos) << tc;
  }
  EXPECT_EQ(curl(), "original\n");
  // The mirror's session is gone with its agent: it says so and exits 3.
  EXPECT_EQ(m->finish(), 3) << m->err;
  EXPECT_THAT(m->err, HasSubstr("siphon: mirror: "));
  EXPECT_THAT(m->err, HasSubstr("mirror: summary: 1 connection"));
}

// (f) A port both stolen and mirrored: the mirror sees the stolen
// connection's bytes (the request, and the answer the local server made).
TEST_F(MirrorTest, AStolenPortIsMirroredToo) {
  ASSERT_NO_FATAL_FAILURE(startAgent());
  // The developer's local server for the steal: one HTTP answer.
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener.get(), 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len);
  const std::string local = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::thread server([&] {
    setTimeouts(listener.get(), 30);
    Fd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) return;
    setTimeouts(c.get(), 30);
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(c.get(), buf, sizeof buf);
      if (n <= 0) return;
      req.append(buf, static_cast<size_t>(n));
    }
    const std::string resp =
        "HTTP/1.0 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nstolen\n";
    writeAll(c.get(), resp);
  });

  Proc* s = cli("steal", {"--port", "80", "--to", local}, "stealing port 80");
  Proc* m = mirror({"80", "--both"});
  EXPECT_EQ(curl(), "stolen\n");
  server.join();
  ASSERT_TRUE(waitFor(m, " closed")) << m->err;
  m->signal(SIGINT);
  EXPECT_EQ(m->finish(), 0) << m->err;
  s->signal(SIGINT);
  EXPECT_EQ(s->finish(), 0) << s->err;

  EXPECT_THAT(m->out, HasSubstr(">>> #1 "));
  EXPECT_THAT(m->out, HasSubstr("GET / HTTP/1.1\r\n"));
  EXPECT_THAT(m->out, HasSubstr("<<< #1 "));
  EXPECT_THAT(m->out, HasSubstr("\r\n\r\nstolen\n"));
  EXPECT_LT(m->out.find("GET / HTTP/1.1"), m->out.find("stolen\n")) << m->out;
  EXPECT_THAT(m->err, Not(HasSubstr("(gap)")));
  // And the application has its port back.
  EXPECT_EQ(curl(), "original\n");
}

}  // namespace
}  // namespace siphon
