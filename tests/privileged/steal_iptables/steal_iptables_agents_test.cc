// Two real siphon-agents on one target with the iptables backend, each
// stolen from by a real `siphon steal` of its own port: a pod namespace
// with busybox httpd on ports 80 and 81 ("original-80", "original-81"), a
// client namespace joined to it by a veth pair, and an echo server on the
// host's loopback that both steals bridge to (a stolen request comes back
// as it was sent). Both flavours.
//
// Neither agent's start, death or guard may undo the other's chains: the
// second agent starts while the first is stealing (its start-up sweep must
// leave the first's chains alone), the first is killed (its guard removes
// only its own), and an agent killed together with its guard leaves chains
// that the next agent's start-up removes, and only those.
//
// Every kernel object has a unique name and an RAII owner; without root
// every test skips with the reason.
#include <arpa/inet.h>
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
    "needs root: creates network namespaces and veth pairs, runs siphon-agent, which installs "
    "iptables chains in another process's network namespace";

// Only turns a hang into a failure.
constexpr auto kHang = std::chrono::seconds(20);

// Who answers an HTTP request to ip:port from `netns`: "stolen" (the echo
// server sent it back), the page of the application, or what went wrong.
std::string whoAnswers(const std::string& netns, const std::string& ip, uint16_t port) {
  int raw = socketInNetns(netns, AF_INET, SOCK_STREAM);
  if (raw < 0) return "no socket";
  Fd fd(raw);
  setTimeouts(fd.get(), 5);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    return std::string("connect failed: ") + strerror(errno);
  }
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

// Live (not zombie) guard processes whose chain name starts with `prefix`.
std::vector<pid_t> guardsOf(const std::string& prefix) {
  std::vector<pid_t> pids;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return pids;
  while (dirent* e = readdir(dir)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string base = "/proc/" + std::string(e->d_name);
    std::string cmdline = readFile(base + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("__iptables-guard") == std::string::npos ||
        cmdline.find("--pre=" + prefix) == std::string::npos) {
      continue;
    }
    std::string stat = readFile(base + "/stat");
    size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') continue;
    pids.push_back(pid);
  }
  closedir(dir);
  return pids;
}

// One agent and its `siphon steal` of one port.
struct Stealer {
  std::optional<Agent> agent;
  std::string endpoint;
  std::optional<Proc> steal;
};

class StealIptablesAgents : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    pod_.emplace();
    client_.emplace();
    ASSERT_TRUE(pod_->created() && client_->created());
    ASSERT_TRUE(linkPodToClient(*pod_, *client_, "si", &link_));
    Result lo = run({"ip", "-n", pod_->name(), "link", "set", "lo", "up"});
    ASSERT_EQ(lo.exit_code, 0) << lo;
    for (int i = 0; i < 2; ++i) {
      const std::string port = std::to_string(80 + i);
      const std::string www = dir_->path() + "/www-" + port;
      std::filesystem::create_directories(www);
      dir_->file("www-" + port + "/index.html", "original-" + port + "\n");
      httpd_[i] = spawn(
          {"ip", "netns", "exec", pod_->name(), "busybox", "httpd", "-f", "-p", port, "-h", www},
          std::nullopt, -1, -1);
      ASSERT_GT(httpd_[i].pid(), 0);
      ASSERT_TRUE(eventually([&] { return who(80 + i) == "original-" + port + "\n"; }))
          << "httpd on " << port << " never answered: " << who(80 + i);
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
    for (auto* s : {&a_, &b_, &c_}) {
      if (s->steal) {
        s->steal->signal(SIGKILL);
        s->steal->finish();
      }
    }
    if (HasFailure()) {
      for (auto* s : {&a_, &b_, &c_}) {
        if (s->agent) std::cerr << "--- agent log (" << s->endpoint << ")\n" << s->agent->log();
        if (s->steal) std::cerr << "--- siphon steal\n" << s->steal->err << "---\n";
      }
    }
    // Agents before the namespace: their guards clean up after them.
    for (auto* s : {&a_, &b_, &c_}) s->agent.reset();
    for (auto& h : httpd_) h.kill();
  }

  std::string who(uint16_t port) { return whoAnswers(client_->name(), link_.pod_ip, port); }

  bool eventually(const std::function<bool()>& done) {
    const auto deadline = Clock::now() + kHang;
    for (;;) {
      if (done()) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // An agent with the iptables backend targeting the httpd on port 80 (the
  // pod's netns), named `name` for its log.
  void startAgent(Stealer& s, const std::string& name) {
    s.agent.emplace(
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                 "--first-client-timeout", "120s", "--log-level", "debug",
                                 "--steal-backend", "iptables", "--iptables", GetParam(),
                                 "targeted", "--pid", std::to_string(httpd_[0].pid())},
        cleanEnv(), dir_->path() + "/agent-" + name + ".log");
    ASSERT_TRUE(s.agent->ready(&s.endpoint));
  }

  // `siphon steal` of `port` through `s`'s agent.
  void startSteal(Stealer& s, uint16_t port) {
    const std::string p = std::to_string(port);
    s.steal.emplace(std::vector<std::string>{SIPHON_CLI_BIN, "--agent", s.endpoint, "--token-file",
                                             token_file_, "steal", "--port", p, "--to", echo_to_},
                    cleanEnv());
    ASSERT_TRUE(s.steal->readUntil([&p](const std::string&, const std::string& err) {
      return err.find("stealing port " + p) != std::string::npos ||
             err.find("siphon:") != std::string::npos;
    })) << s.steal->err;
    ASSERT_THAT(s.steal->err, HasSubstr("stealing port " + p));
  }

  // The owner id in the chains an agent's log says it installed.
  static std::string chainOf(const Stealer& s) {
    const std::string log = s.agent->log();
    const std::string key = "chain_pre=";
    size_t at = log.find("steal_iptables_installed");
    if (at == std::string::npos) return "";
    at = log.find(key, at);
    if (at == std::string::npos) return "";
    at += key.size();
    return log.substr(at, log.find_first_of(" \n", at) - at);
  }

  std::string save() {
    return run({"ip", "netns", "exec", pod_->name(),
                std::string("iptables-") + GetParam() + "-save"})
        .out;
  }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> pod_;
  std::optional<NetNs> client_;
  PodLink link_;
  Child httpd_[2];
  int echo_fd_ = -1;
  std::string echo_to_;
  std::optional<fakes::EchoServer> echo_;
  Stealer a_, b_, c_;
};

TEST_P(StealIptablesAgents, TwoAgentsStealingDifferentPortsNeverUndoEachOther) {
  ASSERT_NO_FATAL_FAILURE(startAgent(a_, "a"));
  ASSERT_NO_FATAL_FAILURE(startSteal(a_, 80));
  EXPECT_EQ(who(80), "stolen");
  EXPECT_EQ(who(81), "original-81\n");

  // B starts while A steals: its start-up sweep leaves A's chains alone.
  ASSERT_NO_FATAL_FAILURE(startAgent(b_, "b"));
  ASSERT_NO_FATAL_FAILURE(startSteal(b_, 81));
  EXPECT_EQ(who(80), "stolen");
  EXPECT_EQ(who(81), "stolen");
  const std::string a_pre = chainOf(a_), b_pre = chainOf(b_);
  ASSERT_FALSE(a_pre.empty()) << a_.agent->log();
  ASSERT_FALSE(b_pre.empty()) << b_.agent->log();
  EXPECT_NE(a_pre, b_pre);
  EXPECT_THAT(b_.agent->log(), Not(HasSubstr("steal_stale_chains_removed")));

  // kill -9 A: its guard removes A's chains only.
  a_.agent->child().kill();
  EXPECT_TRUE(eventually([&] { return who(80) == "original-80\n"; })) << who(80);
  EXPECT_EQ(who(81), "stolen");
  EXPECT_TRUE(eventually([&] { return save().find(a_pre) == std::string::npos; })) << save();
  EXPECT_THAT(save(), HasSubstr(":" + b_pre));

  // A replacement for A steals port 80 again next to B.
  a_.steal->signal(SIGKILL);
  a_.steal->finish();
  a_.steal.reset();
  ASSERT_NO_FATAL_FAILURE(startAgent(c_, "c"));
  ASSERT_NO_FATAL_FAILURE(startSteal(c_, 80));
  EXPECT_EQ(who(80), "stolen");
  EXPECT_EQ(who(81), "stolen");

  // B killed together with its guard (stopped first, so it cannot clean
  // up): B's chains stay, port 81 goes to B's closed listener.
  std::vector<pid_t> guard = guardsOf(b_pre);
  ASSERT_EQ(guard.size(), 1u);
  ASSERT_EQ(::kill(guard[0], SIGSTOP), 0);
  b_.agent->child().kill();
  ASSERT_EQ(::kill(guard[0], SIGKILL), 0);
  ASSERT_TRUE(eventually([&] { return guardsOf(b_pre).empty(); }));
  EXPECT_THAT(save(), HasSubstr(":" + b_pre));
  EXPECT_THAT(who(81), HasSubstr("connect failed"));

  // The next agent's start-up removes B's chains, and not C's.
  Stealer d;
  ASSERT_NO_FATAL_FAILURE(startAgent(d, "d"));
  EXPECT_TRUE(eventually([&] { return who(81) == "original-81\n"; })) << who(81);
  EXPECT_TRUE(eventually([&] {
    return d.agent->log().find("steal_stale_chains_removed") != std::string::npos;
  })) << d.agent->log();
  EXPECT_THAT(save(), Not(HasSubstr(b_pre)));
  EXPECT_THAT(save(), HasSubstr(":" + chainOf(c_)));
  EXPECT_EQ(who(80), "stolen");
  if (HasFailure()) std::cerr << "--- agent log (d)\n" << d.agent->log();
}

INSTANTIATE_TEST_SUITE_P(Flavors, StealIptablesAgents, ::testing::Values("nft", "legacy"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace siphon
