// End to end, as root: a "pod" (a process in its own network namespace with a
// known environment), the real siphon-agent targeting it by PID, and the real
// siphon CLI (and the client library) talking to the agent over TCP.
//
// Every kernel object has a unique name and is owned by an RAII guard, so a
// failed assertion still kills and reaps the processes and deletes the
// namespace. Without root every test skips with the reason.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/asio.h"
#include "tests/fakes/echo_server.h"
#include "tests/privileged/harness/pod_harness.h"

extern char** environ;

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and runs siphon-agent, which enters another "
    "process's namespaces and reads its /proc/PID/environ";

using namespace siphon::harness;  // NOLINT: test file

// A session opened with the client library and held open on its own thread
// until close().
class HeldSession {
 public:
  HeldSession(std::string endpoint, std::string token) {
    std::promise<absl::Status> connected;
    auto result = connected.get_future();
    thread_ = std::thread([this, endpoint, token, p = std::move(connected)]() mutable {
      client::ClientOptions options;
      options.endpoints = {endpoint};
      options.token = token;
      options.client_name = "agent_env_test-held";
      client_ = client::Client::create(io_.get_executor(), options);
      net::asio::co_spawn(io_, connect(client_, std::move(p)), net::asio::detached);
      io_.run();
    });
    if (result.wait_for(kProcessDeadline) == std::future_status::ready) {
      status_ = result.get();
    } else {
      status_ = absl::DeadlineExceededError("connect did not finish");
    }
  }
  ~HeldSession() { close(); }

  const absl::Status& status() const { return status_; }

  static net::awaitable<void> connect(std::shared_ptr<client::Client> client,
                                      std::promise<absl::Status> connected) {
    connected.set_value(co_await client->connect());
  }

  void close() {
    if (!thread_.joinable()) return;
    net::asio::post(io_, [this] {
      client_->close();
      guard_.reset();
    });
    thread_.join();
    client_.reset();
  }

 private:
  net::asio::io_context io_;
  net::asio::executor_work_guard<net::asio::io_context::executor_type> guard_ =
      net::asio::make_work_guard(io_);
  std::shared_ptr<client::Client> client_;
  std::thread thread_;
  absl::Status status_;
};

// The "pod": a process in its own network namespace with exactly this
// environment (env -i), and an agent targeting it by PID.
class AgentEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
    token_ = "tok-" + randomHex(32);
    token_file_ = dir_->file("token", token_ + "\n");

    netns_.emplace();
    ASSERT_TRUE(netns_->created());
    pod_ = spawn(
        {"ip", "netns", "exec", netns_->name(), "env", "-i", "SIPHON_POD_VAR=hello-from-pod",
         "OTHER=x", "SIPHON_POD_ODD=line1\nline2 \"quoted\" caf\xC3\xA9", "/bin/sleep", "600"},
        std::nullopt, -1, -1);
    ASSERT_GT(pod_.pid(), 0);
    ASSERT_NO_FATAL_FAILURE(waitForPod());

    agent_.emplace(std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                            "--first-client-timeout", "30s", "targeted", "--pid",
                                            std::to_string(pod_.pid())},
                   cleanEnv({"SIPHON_AGENT_ONLY=1"}), dir_->path() + "/agent.log");
    auto line = agent_->readLine();
    ASSERT_TRUE(line.has_value()) << "no ready line from the agent; its log:\n" << agent_->log();
    auto ready = parseReadyLine(*line);
    ASSERT_TRUE(ready.has_value()) << "malformed ready line: " << *line;
    ready_ = *ready;
    endpoint_ = ready_.fields["listen"];
  }

  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  // `ip netns exec` enters the namespace, then execs env, which execs
  // sleep (same PID throughout). The agent must read the environ and
  // namespace of sleep, not of ip: wait until the PID runs sleep in the
  // new namespace.
  void waitForPod() {
    const std::string comm_path = "/proc/" + std::to_string(pod_.pid()) + "/comm";
    bool exited = false;
    const bool ran = fakes::eventually(
        [&] {
          if (readFile(comm_path) == "sleep\n" && netnsInodeOf(pod_.pid()) == netns_->inode())
            return true;
          exited = pod_.waitUntil(Clock::now()).has_value();
          return exited;
        },
        kProcessDeadline);
    if (exited) FAIL() << "the pod process exited";
    if (!ran) FAIL() << "pod process " << pod_.pid() << " never ran sleep in " << netns_->name();
  }

  Result cli(const std::vector<std::string>& args, const std::string& token_file = "") {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file.empty() ? token_file_ : token_file};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, cleanEnv());
  }

  // The "sessions" count of `siphon info --json` (-1 if absent).
  int sessionsNow() {
    Result r = cli({"--json", "info"});
    EXPECT_EQ(r.exit_code, 0) << r;
    size_t at = r.out.find("\"sessions\": ");
    if (at == std::string::npos) return -1;
    return std::atoi(r.out.c_str() + at + std::strlen("\"sessions\": "));
  }

  // Destroyed in reverse: agent, pod, namespace, then the directory.
  std::optional<TempDir> dir_;
  std::string token_;
  std::string token_file_;
  std::optional<NetNs> netns_;
  Child pod_;
  std::optional<Agent> agent_;
  ReadyLine ready_;
  std::string endpoint_;
};

TEST_F(AgentEnvTest, ReadyLineNamesTheTarget) {
  EXPECT_THAT(ready_.raw, StartsWith("siphon-agent ready version="));
  EXPECT_FALSE(ready_.fields["version"].empty());
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(pod_.pid()));
  EXPECT_EQ(ready_.fields["netns"], "net:[" + std::to_string(netns_->inode()) + "]");
  EXPECT_THAT(endpoint_, StartsWith("127.0.0.1:"));
  EXPECT_NE(endpoint_, "127.0.0.1:0") << "port 0 must be replaced by the bound port";
}

TEST_F(AgentEnvTest, EnvJsonIsExactlyThePodsEnvironment) {
  Result r = cli({"--json", "env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  // Exactly the three variables of `env -i`: nothing of the agent's
  // (SIPHON_AGENT_ONLY, PATH...) or the test's.
  EXPECT_EQ(r.out,
            "{\n"
            "  \"OTHER\": \"x\",\n"
            "  \"SIPHON_POD_ODD\": \"line1\\nline2 \\\"quoted\\\" caf\xC3\xA9\",\n"
            "  \"SIPHON_POD_VAR\": \"hello-from-pod\"\n"
            "}\n");
  EXPECT_THAT(r.out, Not(HasSubstr("SIPHON_AGENT_ONLY")));
  EXPECT_EQ(r.err, "");
}

TEST_F(AgentEnvTest, EnvTextIsSortedNameValueLines) {
  Result r = cli({"env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out,
            "OTHER=x\n"
            "SIPHON_POD_ODD=line1\nline2 \"quoted\" caf\xC3\xA9\n"
            "SIPHON_POD_VAR=hello-from-pod\n");
}

TEST_F(AgentEnvTest, IncludeAndExcludeGlobs) {
  Result only = cli({"--json", "env", "--include", "SIPHON_*"});
  ASSERT_EQ(only.exit_code, 0) << only;
  EXPECT_THAT(only.out, HasSubstr("\"SIPHON_POD_VAR\": \"hello-from-pod\""));
  EXPECT_THAT(only.out, HasSubstr("\"SIPHON_POD_ODD\""));
  EXPECT_THAT(only.out, Not(HasSubstr("OTHER")));

  // Global flags may follow the command; exclude wins over include.
  Result both = cli({"env", "--include", "SIPHON_*", "--exclude", "*_ODD", "--json"});
  ASSERT_EQ(both.exit_code, 0) << both;
  EXPECT_EQ(both.out, "{\n  \"SIPHON_POD_VAR\": \"hello-from-pod\"\n}\n");

  Result none = cli({"--json", "env", "--include", "NO_SUCH_*"});
  ASSERT_EQ(none.exit_code, 0) << none;
  EXPECT_EQ(none.out, "{}\n");
}

TEST_F(AgentEnvTest, InfoJsonDescribesTheTarget) {
  Result r = cli({"--json", "info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  // The version both sides speak: this build's agent and CLI, 1.2 (early stream data).
  EXPECT_THAT(r.out, HasSubstr("\"protocol_version\": \"1.2\""));
  EXPECT_THAT(r.out, HasSubstr("\"mode\": \"targeted\""));
  EXPECT_THAT(r.out, HasSubstr("\"pid\": " + std::to_string(pod_.pid()) + ","));
  EXPECT_THAT(r.out, HasSubstr("\"netns_inode\": " + std::to_string(netns_->inode()) + ","));
  EXPECT_THAT(r.out, HasSubstr("\"netns\": \"" + ready_.fields["netns"] + "\""));
  EXPECT_THAT(r.out, HasSubstr("\"env\""));
  EXPECT_THAT(r.out, HasSubstr("\"sessions\": 1,"));
}

TEST_F(AgentEnvTest, InfoText) {
  Result r = cli({"info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\npid               " + std::to_string(pod_.pid()) + "\n"));
  EXPECT_THAT(r.out, HasSubstr("\nnetns             " + ready_.fields["netns"] + "\n"));
}

TEST_F(AgentEnvTest, WrongTokenIsRejected) {
  std::string wrong = dir_->file("wrong-token", "not-the-token\n");
  Result r = cli({"--json", "env"}, wrong);
  EXPECT_EQ(r.exit_code, 4) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith("siphon: agent rejected the session: UNAUTHENTICATED"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;

  // The right token still works afterwards.
  EXPECT_EQ(cli({"env"}).exit_code, 0);
}

TEST_F(AgentEnvTest, SecondConcurrentClient) {
  HeldSession held(endpoint_, token_);
  ASSERT_TRUE(held.status().ok()) << held.status();
  // The held session and the CLI's own.
  EXPECT_EQ(sessionsNow(), 2);
  Result env = cli({"--json", "env", "--include", "SIPHON_POD_VAR"});
  EXPECT_EQ(env.exit_code, 0) << env;
  EXPECT_THAT(env.out, HasSubstr("hello-from-pod"));

  // A closed client ends its session at once (no resume grace): the count
  // falls back to the CLI's own session. The agent handles the Goaway
  // asynchronously, hence the loop; 60 s is the --session-grace it must
  // not wait for.
  held.close();
  int sessions = -1;
  fakes::eventually([&] { return (sessions = sessionsNow()) == 1; }, std::chrono::seconds(20),
                    std::chrono::milliseconds(50));
  EXPECT_EQ(sessions, 1);
}

TEST_F(AgentEnvTest, UnreachableAgentExitsThree) {
  // Stop the agent, then talk to its (now closed) port.
  agent_->child().kill();
  Result r = cli({"info"});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_THAT(r.err, StartsWith("siphon: cannot reach the agent: " + endpoint_));
}

// Agent start-up failures: no namespace or pod needed.
class AgentStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
  }
  std::optional<TempDir> dir_;
};

TEST_F(AgentStartTest, RefusesToStartWithoutAToken) {
  Result r = run({SIPHON_AGENT_BIN, "--listen", "127.0.0.1:0", "targetless"}, cleanEnv());
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_EQ(r.out, "") << "no ready line without auth";
  EXPECT_THAT(r.err, HasSubstr("--token-file"));
  EXPECT_THAT(r.err, HasSubstr("--insecure-no-auth"));
}

TEST_F(AgentStartTest, NonexistentPidExitsThree) {
  // A PID that existed a moment ago: the kernel hands PIDs out in
  // increasing order, so it is not reused this soon.
  Child gone = spawn({"true"}, std::nullopt, -1, -1);
  pid_t pid = gone.pid();
  ASSERT_TRUE(gone.waitUntil(Clock::now() + kProcessDeadline).has_value());
  ASSERT_NE(::kill(pid, 0), 0);

  std::string token = dir_->file("token", "t\n");
  Result r = run({SIPHON_AGENT_BIN, "--listen", "127.0.0.1:0", "--token-file", token, "targeted",
                  "--pid", std::to_string(pid)},
                 cleanEnv());
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr(std::to_string(pid)));
}

TEST_F(AgentStartTest, ExitsSixWithoutAClient) {
  std::string token = dir_->file("token", "t\n");
  Agent agent({"--listen", "127.0.0.1:0", "--token-file", token, "--first-client-timeout", "200ms",
               "targetless"},
              cleanEnv(), dir_->path() + "/agent.log");
  auto line = agent.readLine();
  ASSERT_TRUE(line.has_value()) << agent.log();
  EXPECT_THAT(*line, HasSubstr("target_pid=" + std::to_string(agent.child().pid())))
      << "targetless: the agent's own pid";
  EXPECT_EQ(agent.child().waitUntil(Clock::now() + kProcessDeadline), 6) << agent.log();
}

// --idle-timeout: the agent waits while a session is open however long it
// lasts, and exits 0 once the last one has been gone that long.
TEST_F(AgentStartTest, IdleTimeoutExitsZeroOnceTheLastSessionIsGone) {
  std::string token = dir_->file("token", "t\n");
  Agent agent({"--listen", "127.0.0.1:0", "--token-file", token, "--idle-timeout", "300ms",
               "targetless"},
              cleanEnv(), dir_->path() + "/agent.log");
  std::string endpoint;
  ASSERT_TRUE(agent.ready(&endpoint));
  // A session that stays open: `siphon connect` to an echo server (the
  // targetless agent's network is ours), held while its stdin is open.
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  fakes::EchoServer echo(listener, fakes::EchoServer::Kind::kStream);
  Proc held({SIPHON_CLI_BIN, "--agent", endpoint, "--token-file", token, "connect",
             "127.0.0.1:" + std::to_string(ntohs(a.sin_port))},
            cleanEnv());
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_FALSE(agent.child().waitUntil(Clock::now()).has_value())
      << "the agent left with a session open; its log:\n" << agent.log();
  ASSERT_TRUE(held.write("still here"));
  held.closeStdin();
  EXPECT_EQ(held.finish(), 0) << held.err;
  EXPECT_EQ(held.out, "still here");
  EXPECT_EQ(agent.child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent.log();
  EXPECT_THAT(agent.log(), HasSubstr("idle_timeout"));
}

}  // namespace
}  // namespace siphon
