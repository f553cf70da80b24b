// Failover end to end, as root: two "replica" pods (network namespaces),
// each running busybox httpd on port 80 (the same application, answering
// "original-a" and "original-b"), a "client" namespace joined to both by
// veth pairs, a real siphon-agent targeting each httpd, and one real
// `siphon steal` given both agents, bridging stolen connections to an echo
// server on the host's loopback.
//
// Every case runs for both backends. Every kernel object has a unique name
// and an RAII owner; without root every test skips with the reason.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tests/fakes/echo_server.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and veth pairs, runs siphon-agent, which attaches "
    "BPF programs or iptables chains to another process's network namespace";

// The CLI's keepalive timeout in these tests: a lost agent must be left
// within it (plus a second).
constexpr auto kKeepaliveTimeout = std::chrono::seconds(2);

// A blocking TCP connection from the named namespace with 5 s timeouts on
// both directions (a bug fails the test instead of hanging it); -1 on
// failure.
int connectFrom(const std::string& netns, const std::string& ip, uint16_t port) {
  int fd = socketInNetns(netns, AF_INET, SOCK_STREAM);
  if (fd < 0) return -1;
  setTimeouts(fd, 5);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads `n` bytes, or what came before EOF, an error or the timeout.
std::string readN(int fd, size_t n) {
  std::string out;
  char buf[4096];
  while (out.size() < n) {
    ssize_t got = ::read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

// Who answers a new connection to ip:80: "stolen" (the echo server behind
// `siphon steal` sends the request back), the application's body, or what
// went wrong.
std::string whoAnswers(const std::string& netns, const std::string& ip) {
  Fd fd(connectFrom(netns, ip, 80));
  if (fd.get() < 0) return std::string("connect failed: ") + strerror(errno);
  const std::string request = "GET / HTTP/1.0\r\n\r\n";
  if (!writeAll(fd.get(), request)) return std::string("write failed: ") + strerror(errno);
  ::shutdown(fd.get(), SHUT_WR);
  std::string answer;
  readAll(fd.get(), &answer);
  if (answer == request) return "stolen";
  size_t body = answer.find("\r\n\r\n");
  if (body != std::string::npos) return answer.substr(body + 4);
  return "no answer: '" + answer + "'";
}

// One replica: a pod namespace, its httpd, its veth to the client
// namespace and the agent targeting it.
struct Replica {
  std::optional<NetNs> pod;
  std::string ip;
  Child httpd;
  std::optional<Agent> agent;
  std::string endpoint;
};

class FailoverTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    client_.emplace();
    ASSERT_TRUE(client_->created());
    const std::string tag = randomHex(6);
    const int subnet =
        1 + static_cast<int>(std::strtoul(tag.substr(0, 2).c_str(), nullptr, 16) % 120);
    for (int i = 0; i < 2; ++i) {
      Replica& r = replicas_[i];
      r.pod.emplace();
      ASSERT_TRUE(r.pod->created());
      const std::string name = std::string(1, static_cast<char>('a' + i));
      const std::string pod_if = "sf" + tag + name + "p", client_if = "sf" + tag + name + "c";
      const std::string net = "10.252." + std::to_string(subnet * 2 + i);
      r.ip = net + ".1";
      for (const auto& argv : std::vector<std::vector<std::string>>{
               {"ip", "link", "add", pod_if, "netns", r.pod->name(), "type", "veth", "peer",
                "name", client_if, "netns", client_->name()},
               {"ip", "-n", r.pod->name(), "addr", "add", r.ip + "/24", "dev", pod_if},
               {"ip", "-n", client_->name(), "addr", "add", net + ".2/24", "dev", client_if},
               {"ip", "-n", r.pod->name(), "link", "set", pod_if, "up"},
               {"ip", "-n", r.pod->name(), "link", "set", "lo", "up"},
               {"ip", "-n", client_->name(), "link", "set", client_if, "up"},
           }) {
        Result res = run(argv);
        ASSERT_EQ(res.exit_code, 0) << res;
      }
      const std::string www = dir_->path() + "/www-" + name;
      std::filesystem::create_directories(www);
      dir_->file("www-" + name + "/index.html", "original-" + name + "\n");
      r.httpd = spawn({"ip", "netns", "exec", r.pod->name(), "busybox", "httpd", "-f", "-p", "80",
                       "-h", www},
                      std::nullopt, -1, -1);
      ASSERT_GT(r.httpd.pid(), 0);
      ASSERT_TRUE(answersWithin(i, "original-" + name + "\n", kProcessDeadline))
          << "httpd of replica " << name << " never answered";
      ASSERT_NO_FATAL_FAILURE(startAgent(i));
    }
    echo_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(echo_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(echo_fd_, 128), 0);
    socklen_t len = sizeof a;
    ::getsockname(echo_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    echo_to_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    echo_.emplace(echo_fd_, fakes::EchoServer::Kind::kStream);
  }

  void TearDown() override {
    if (steal_) {
      steal_->signal(SIGKILL);
      steal_->finish();
    }
    if (HasFailure()) {
      for (auto& r : replicas_) {
        if (r.agent) std::cerr << "--- agent log (" << r.endpoint << ")\n" << r.agent->log();
      }
      if (steal_) std::cerr << "--- siphon steal\n" << steal_->err << "---\n";
    }
  }

  void startAgent(int i) {
    Replica& r = replicas_[i];
    // The httpd's own PID: `ip netns exec` execs it.
    r.agent.emplace(std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file",
                                             token_file_, "--first-client-timeout", "120s",
                                             "--drain-timeout", "10s", "--log-level", "debug",
                                             "--steal-backend", GetParam(), "targeted", "--pid",
                                             std::to_string(r.httpd.pid())},
                    cleanEnv(), dir_->path() + "/agent-" + std::to_string(i) + ".log");
    ASSERT_TRUE(r.agent->ready(&r.endpoint));
  }

  bool answersWithin(int i, const std::string& expected, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    do {
      if (whoAnswers(client_->name(), replicas_[i].ip) == expected) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (Clock::now() < deadline);
    return false;
  }
  std::string who(int i) { return whoAnswers(client_->name(), replicas_[i].ip); }

  // `siphon steal` of port 80 given both agents, the first one first.
  void startSteal() {
    steal_.emplace(std::vector<std::string>{SIPHON_CLI_BIN, "--agent", replicas_[0].endpoint,
                                            "--agent", replicas_[1].endpoint, "--token-file",
                                            token_file_, "--keepalive-interval", "500ms",
                                            "--keepalive-timeout", "2s", "steal", "--port", "80",
                                            "--to", echo_to_},
                   cleanEnv());
    ASSERT_TRUE(steal_->readUntil([](const std::string&, const std::string& err) {
      return err.find("stealing port 80") != std::string::npos ||
             err.find("siphon:") != std::string::npos;
    })) << steal_->err;
  }
  bool stealSays(const std::string& what) {
    return steal_->readUntil([&what](const std::string&, const std::string& err) {
      return err.find(what) != std::string::npos;
    });
  }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> client_;
  std::array<Replica, 2> replicas_;
  int echo_fd_ = -1;
  std::string echo_to_;
  std::optional<fakes::EchoServer> echo_;
  std::optional<Proc> steal_;
};

// kill -9 of the first agent: `siphon steal` moves to the second within
// the keepalive timeout plus a second, steals the port there (new
// connections to the second replica are stolen), and the first replica
// has its port back.
TEST_P(FailoverTest, KilledAgentMovesTheStealToTheOtherReplica) {
  ASSERT_NO_FATAL_FAILURE(startSteal());
  EXPECT_EQ(who(0), "stolen");
  EXPECT_EQ(who(1), "original-b\n");

  replicas_[0].agent->child().kill();
  const std::string moved = "moved to agent " + replicas_[1].endpoint;
  ASSERT_TRUE(stealSays(moved)) << steal_->err;
  // How soon is the client's own bound, not a clock read here (a loaded
  // machine would make that flaky): the refused reconnect, which no
  // keepalive waits for.
  EXPECT_THAT(steal_->err, HasSubstr("agent " + replicas_[0].endpoint + " lost ("));

  EXPECT_EQ(who(1), "stolen");
  EXPECT_TRUE(answersWithin(0, "original-a\n", std::chrono::seconds(2)));

  // Still serving; the first signal ends it cleanly and gives the port back.
  steal_->signal(SIGTERM);
  EXPECT_EQ(steal_->finish(), 0) << steal_->err;
  EXPECT_THAT(steal_->err, HasSubstr("summary:"));
  EXPECT_TRUE(answersWithin(1, "original-b\n", std::chrono::seconds(2)));
}

// A frozen agent (SIGSTOP: a hung node, a partition) says nothing: the
// keepalive timeout notices, resumes are tried for one more keepalive
// timeout (each attempt bounded by it), then the steal moves.
TEST_P(FailoverTest, SilentAgentIsLeftAfterTheKeepaliveTimeout) {
  ASSERT_NO_FATAL_FAILURE(startSteal());
  EXPECT_EQ(who(0), "stolen");
  const pid_t frozen = replicas_[0].agent->child().pid();
  const auto stopped = Clock::now();
  ::kill(frozen, SIGSTOP);
  const bool moved = stealSays("moved to agent " + replicas_[1].endpoint);
  const auto took = Clock::now() - stopped;
  ::kill(frozen, SIGKILL);
  ::kill(frozen, SIGCONT);
  ASSERT_TRUE(moved) << steal_->err;
  // Not before the keepalive timeout; how late is the client's bound (a
  // resume attempt bounded by the keepalive timeout), which it names, and
  // not a clock read here (flaky on a loaded machine).
  EXPECT_GE(took, kKeepaliveTimeout);
  const std::string bound = std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(kKeepaliveTimeout).count());
  EXPECT_THAT(steal_->err, HasSubstr("lost (no resume within " + bound + " ms"));
  EXPECT_EQ(who(1), "stolen");
  steal_->signal(SIGTERM);
  EXPECT_EQ(steal_->finish(), 0) << steal_->err;
}

// SIGTERM to the first agent (a node drain): the steal moves to the second
// replica at once, while the connection open through the first goes on
// until it closes; then the first agent exits 0.
TEST_P(FailoverTest, DrainingAgentHandsTheStealOverAndFinishesItsConnection) {
  ASSERT_NO_FATAL_FAILURE(startSteal());
  Fd held(connectFrom(client_->name(), replicas_[0].ip, 80));
  ASSERT_GE(held.get(), 0) << strerror(errno);
  ASSERT_TRUE(writeAll(held.get(), "before"));
  ASSERT_EQ(readN(held.get(), 6), "before");

  ::kill(replicas_[0].agent->child().pid(), SIGTERM);
  ASSERT_TRUE(stealSays("moved to agent " + replicas_[1].endpoint)) << steal_->err;
  EXPECT_THAT(steal_->err, HasSubstr("agent " + replicas_[0].endpoint +
                                     " draining; moved to agent " + replicas_[1].endpoint +
                                     "; 1 connection finishing on " + replicas_[0].endpoint));
  EXPECT_EQ(who(1), "stolen");
  EXPECT_TRUE(answersWithin(0, "original-a\n", std::chrono::seconds(2)));

  // The held connection still echoes through the draining agent.
  ASSERT_TRUE(writeAll(held.get(), "after"));
  EXPECT_EQ(readN(held.get(), 5), "after");
  held.reset();
  auto code = replicas_[0].agent->child().waitUntil(Clock::now() + std::chrono::seconds(10));
  EXPECT_EQ(code, std::optional<int>(0));

  steal_->signal(SIGTERM);
  EXPECT_EQ(steal_->finish(), 0) << steal_->err;
  EXPECT_THAT(steal_->err, Not(HasSubstr("siphon:")));
}

INSTANTIATE_TEST_SUITE_P(Backends, FailoverTest, ::testing::Values("sk_lookup", "iptables"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace siphon
