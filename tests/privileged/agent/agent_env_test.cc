// End to end, as root: a "pod" (a process in its own network namespace with a
// known environment), the real siphon-agent targeting it by PID, and the real
// siphon CLI (and the client library) talking to the agent over TCP.
//
// Every kernel object has a unique name and is owned by an RAII guard, so a
// failed assertion still kills and reaps the processes and deletes the
// namespace. Without root every test skips with the reason.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
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

extern char** environ;

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

// Limits that only turn a hang into a failure; no result depends on them.
constexpr auto kProcessDeadline = std::chrono::seconds(30);
constexpr const char* kSkipReason =
    "needs root: creates network namespaces and runs siphon-agent, which enters another "
    "process's namespaces and reads its /proc/PID/environ";

// ------------------------------------------------------------ processes

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A child process: killed (SIGKILL) and reaped by the destructor unless
// already reaped.
class Child {
 public:
  Child() = default;
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(Child&& o) noexcept : pid_(std::exchange(o.pid_, -1)) {}
  Child& operator=(Child&& o) noexcept {
    kill();
    pid_ = std::exchange(o.pid_, -1);
    return *this;
  }
  ~Child() { kill(); }
  pid_t pid() const { return pid_; }

  // The exit code (128+N for signal N), or nullopt if it has not exited by
  // `deadline` (then it is left running).
  std::optional<int> waitUntil(Clock::time_point deadline) {
    while (pid_ > 0) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (r < 0 && errno != EINTR) return std::nullopt;
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }

  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// Starts argv[0] (looked up in PATH) with exactly `env` as its environment
// (nullopt: ours). Its stdin is /dev/null; stdout and stderr go to the given
// descriptors (-1: /dev/null).
Child spawn(const std::vector<std::string>& argv,
            const std::optional<std::vector<std::string>>& env, int out_fd, int err_fd) {
  // Everything the child needs is built before fork(): after it, in a
  // threaded process, only async-signal-safe calls are allowed.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  if (env) {
    for (const auto& e : *env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
  }
  char* const* child_env = env ? envp.data() : environ;
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDWR);
    dup2(devnull, 0);
    dup2(out_fd >= 0 ? out_fd : devnull, 1);
    dup2(err_fd >= 0 ? err_fd : devnull, 2);
    // Leave no other descriptor of the test to the child (pipes held open
    // by a child would hide EOF from the test).
    for (int fd = 3; fd < 1024; ++fd) close(fd);
    execvpe(args[0], args.data(), child_env);
    _exit(127);
  }
  EXPECT_GT(pid, 0) << "fork: " << std::strerror(errno);
  return Child(pid);
}

std::pair<Fd, Fd> makePipe() {
  int fds[2];
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  return {Fd(fds[0]), Fd(fds[1])};
}

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

// Runs a command to completion and captures its output. A command still
// running after kProcessDeadline is killed and reported as exit -1.
Result run(const std::vector<std::string>& argv,
           const std::optional<std::vector<std::string>>& env = std::nullopt) {
  auto [out_r, out_w] = makePipe();
  auto [err_r, err_w] = makePipe();
  Child child = spawn(argv, env, out_w.get(), err_w.get());
  out_w.reset();
  err_w.reset();
  Result result;
  const auto deadline = Clock::now() + kProcessDeadline;
  pollfd fds[2] = {{out_r.get(), POLLIN, 0}, {err_r.get(), POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0 && Clock::now() < deadline) {
    int n = poll(fds, 2, 100);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  result.exit_code = child.waitUntil(deadline).value_or(-1);
  return result;
}

// Our environment plus `extra` (NAME=VALUE), without any SIPHON_* variable
// of ours, so an agent or CLI gets exactly the settings a test gives it.
std::vector<std::string> cleanEnv(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "SIPHON_", 7) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string randomHex(int digits) {
  std::random_device rd;
  std::string out;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < digits; ++i) out.push_back(hex[rd() % 16]);
  return out;
}

// ------------------------------------------------------------ fixtures

// A temporary directory, removed with its content.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/siphon-agent-test-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name, const std::string& content) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p) << content;
    chmod(p.c_str(), 0600);
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A named network namespace (`ip netns add`), deleted by the destructor.
class NetNs {
 public:
  NetNs() : name_("siphon-test-" + std::to_string(getpid()) + "-" + randomHex(6)) {
    Result r = run({"ip", "netns", "add", name_});
    created_ = r.exit_code == 0;
    EXPECT_TRUE(created_) << "ip netns add " << name_ << ": " << r;
    if (created_) {
      Result up = run({"ip", "-n", name_, "link", "set", "lo", "up"});
      EXPECT_EQ(up.exit_code, 0) << up;
    }
  }
  ~NetNs() {
    if (!created_) return;
    Result r = run({"ip", "netns", "del", name_});
    EXPECT_EQ(r.exit_code, 0) << "ip netns del " << name_ << ": " << r;
  }
  const std::string& name() const { return name_; }
  bool created() const { return created_; }
  uint64_t inode() const {
    struct stat st {};
    EXPECT_EQ(stat(("/var/run/netns/" + name_).c_str(), &st), 0) << std::strerror(errno);
    return st.st_ino;
  }

 private:
  std::string name_;
  bool created_ = false;
};

uint64_t netnsInodeOf(pid_t pid) {
  struct stat st {};
  if (stat(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), &st) != 0) return 0;
  return st.st_ino;
}

// The agent's ready line, split: "siphon-agent ready version=V
// listen=HOST:PORT target_pid=N netns=net:[INODE]".
struct ReadyLine {
  std::string raw;
  std::map<std::string, std::string> fields;
};

std::optional<ReadyLine> parseReadyLine(const std::string& line) {
  constexpr std::string_view kPrefix = "siphon-agent ready ";
  if (line.rfind(kPrefix, 0) != 0) return std::nullopt;
  ReadyLine ready{line, {}};
  std::istringstream in(line.substr(kPrefix.size()));
  std::string word;
  while (in >> word) {
    size_t eq = word.find('=');
    if (eq == std::string::npos) return std::nullopt;
    ready.fields[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return ready;
}

// A running siphon-agent: stdout is read up to the ready line; stderr (the
// logs) goes to a file shown when a test fails.
class Agent {
 public:
  Agent(const std::vector<std::string>& args, const std::vector<std::string>& env,
        const std::string& log_path)
      : log_path_(log_path) {
    auto [out_r, out_w] = makePipe();
    Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::vector<std::string> argv = {SIPHON_AGENT_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    child_ = spawn(argv, env, out_w.get(), log.get());
    out_w.reset();
    stdout_ = std::move(out_r);
  }

  // The first stdout line, or nullopt if the agent exits (or says nothing)
  // before kProcessDeadline.
  std::optional<std::string> readLine() {
    std::string line;
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      pollfd p{stdout_.get(), POLLIN, 0};
      int n = poll(&p, 1, 100);
      if (n <= 0) continue;
      char c;
      ssize_t got = read(stdout_.get(), &c, 1);
      if (got <= 0) return std::nullopt;
      if (c == '\n') return line;
      line.push_back(c);
    }
    return std::nullopt;
  }

  Child& child() { return child_; }
  std::string log() const { return readFile(log_path_); }

 private:
  std::string log_path_;
  Child child_;
  Fd stdout_;
};

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
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      if (readFile(comm_path) == "sleep\n" && netnsInodeOf(pod_.pid()) == netns_->inode()) return;
      if (pod_.waitUntil(Clock::now())) FAIL() << "the pod process exited";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "pod process " << pod_.pid() << " never ran sleep in " << netns_->name();
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
  EXPECT_THAT(r.out, HasSubstr("\"protocol_version\": \"1.0\""));
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
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline && (sessions = sessionsNow()) != 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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

}  // namespace
}  // namespace siphon
