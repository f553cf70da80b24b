// Shared pieces of the privileged tests: child processes, captured command
// runs, temporary directories, named network namespaces ("pods"), and a
// running siphon-agent read up to its ready line. Header-only; a test that
// uses Agent defines SIPHON_AGENT_BIN (CMake passes the binary's path).
#pragma once

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
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
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/fakes/eventually.h"
#include "tests/fakes/sanitizers.h"

namespace siphon::harness {

using Clock = std::chrono::steady_clock;

// Limits that only turn a hang into a failure; no result depends on them.
// Longer in a sanitizer build, whose processes run several times slower.
constexpr auto kProcessDeadline = std::chrono::seconds(30) * fakes::kSanitizerSlowdown;

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
inline Child spawn(const std::vector<std::string>& argv,
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

inline std::pair<Fd, Fd> makePipe() {
  int fds[2];
  EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0) << std::strerror(errno);
  return {Fd(fds[0]), Fd(fds[1])};
}

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::ostream& operator<<(std::ostream& os, const Result& r) {
  return os << "exit " << r.exit_code << "\n--- stdout\n" << r.out << "--- stderr\n" << r.err;
}

// Runs a command to completion and captures its output. A command still
// running after kProcessDeadline is killed and reported as exit -1.
inline Result run(const std::vector<std::string>& argv,
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
inline std::vector<std::string> cleanEnv(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "SIPHON_", 7) != 0) env.emplace_back(*e);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// The first of `candidates` that is an executable file, or "".
inline std::string firstExisting(const std::vector<std::string>& candidates) {
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return "";
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string randomHex(int digits) {
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

// One end of a veth pair: its namespace, interface name and addresses with
// their prefix ("10.0.0.1/24", "fd00::1/64").
struct VethEnd {
  std::string netns;
  std::string name;
  std::vector<std::string> addresses;
};

// A veth pair made inside a.netns with its peer end moved straight into
// b.netns (the names never exist on the host, so they cannot clash),
// addressed (IPv6 with nodad: usable at once, not "tentative" for a second
// or two) and up.
inline ::testing::AssertionResult linkVeth(const VethEnd& a, const VethEnd& b) {
  std::vector<std::vector<std::string>> cmds = {{"ip", "-n", a.netns, "link", "add", a.name, "type",
                                                 "veth", "peer", "name", b.name, "netns", b.netns}};
  for (const VethEnd* end : {&a, &b}) {
    for (const std::string& addr : end->addresses) {
      std::vector<std::string> cmd = {"ip",  "-n", end->netns, "addr",
                                      "add", addr, "dev",      end->name};
      if (addr.find(':') != std::string::npos) cmd.push_back("nodad");
      cmds.push_back(std::move(cmd));
    }
  }
  for (const VethEnd* end : {&a, &b}) {
    cmds.push_back({"ip", "-n", end->netns, "link", "set", end->name, "up"});
  }
  for (const auto& cmd : cmds) {
    Result r = run(cmd);
    if (r.exit_code != 0) {
      std::string line;
      for (const auto& w : cmd) line += w + " ";
      return ::testing::AssertionFailure() << line << ": " << r;
    }
  }
  return ::testing::AssertionSuccess();
}

// A pod and a client namespace joined by a veth pair on 10.252.N.0/24, the
// pod .1 and the client .2.
struct PodLink {
  std::string pod_if, client_if;
  std::string pod_ip, client_ip;  // without the prefix
};

// Links `pod` and `client` (linkVeth). The interfaces are named
// "<prefix><tag>p" and "<prefix><tag>c" with a random tag (unique; 15
// characters at most with a two-letter prefix); N comes from the same tag,
// which keeps the addresses of tests running at once apart too.
inline ::testing::AssertionResult linkPodToClient(const NetNs& pod, const NetNs& client,
                                                  const std::string& prefix, PodLink* link) {
  const std::string tag = randomHex(6);
  const int subnet =
      1 + static_cast<int>(std::strtoul(tag.substr(0, 2).c_str(), nullptr, 16) % 254);
  link->pod_if = prefix + tag + "p";
  link->client_if = prefix + tag + "c";
  link->pod_ip = "10.252." + std::to_string(subnet) + ".1";
  link->client_ip = "10.252." + std::to_string(subnet) + ".2";
  return linkVeth({pod.name(), link->pod_if, {link->pod_ip + "/24"}},
                  {client.name(), link->client_if, {link->client_ip + "/24"}});
}

inline uint64_t netnsInodeOf(pid_t pid) {
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

inline std::optional<ReadyLine> parseReadyLine(const std::string& line) {
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
  // `wrapper`: a command line the agent is started under, one that execs
  // it in place (so the agent keeps the child's pid), such as `unshare`.
  Agent(const std::vector<std::string>& args, const std::vector<std::string>& env,
        const std::string& log_path, const std::vector<std::string>& wrapper = {})
      : log_path_(log_path) {
    auto [out_r, out_w] = makePipe();
    Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::vector<std::string> argv = wrapper;
    argv.push_back(SIPHON_AGENT_BIN);
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

  // Waits for the ready line and gives its listen endpoint; a failure
  // carries the agent's log.
  ::testing::AssertionResult ready(std::string* endpoint) {
    auto line = readLine();
    if (!line)
      return ::testing::AssertionFailure() << "no ready line from the agent; its log:\n" << log();
    auto parsed = parseReadyLine(*line);
    if (!parsed) return ::testing::AssertionFailure() << "malformed ready line: " << *line;
    *endpoint = parsed->fields["listen"];
    return ::testing::AssertionSuccess();
  }

  Child& child() { return child_; }
  std::string log() const { return readFile(log_path_); }

 private:
  std::string log_path_;
  Child child_;
  Fd stdout_;
};

// ------------------------------------------------------------ sockets and
// interactive processes

// A socket made inside the named network namespace: a thread enters it,
// creates the socket and ends; the socket keeps that namespace for life.
// Runs `fn` on a thread inside the named network namespace (setns moves
// only the calling thread; sockets keep the namespace they were made in).
inline void inNetns(const std::string& netns, const std::function<void()>& fn) {
  std::thread t([&] {
    int ns = ::open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) {
      ADD_FAILURE() << "enter netns " << netns << ": " << std::strerror(errno);
      if (ns >= 0) ::close(ns);
      return;
    }
    ::close(ns);
    fn();
  });
  t.join();
}

inline int socketInNetns(const std::string& netns, int domain, int type) {
  int fd = -1;
  std::thread t([&] {
    int ns = ::open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return;
    if (::setns(ns, CLONE_NEWNET) == 0) fd = ::socket(domain, type | SOCK_CLOEXEC, 0);
    ::close(ns);
  });
  t.join();
  return fd;
}

// A child with pipes on stdin, stdout and stderr, read and written by the
// test as it goes. Killed and reaped by the destructor.
class Proc {
 public:
  Proc(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    auto [in_r, in_w] = makePipe();
    auto [out_r, out_w] = makePipe();
    auto [err_r, err_w] = makePipe();
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      dup2(in_r.get(), 0);
      dup2(out_w.get(), 1);
      dup2(err_w.get(), 2);
      for (int fd = 3; fd < 1024; ++fd) close(fd);
      execvpe(args[0], args.data(), envp.data());
      _exit(127);
    }
    child_ = Child(pid);
    in_ = std::move(in_w);
    out_ = std::move(out_r);
    err_ = std::move(err_r);
  }

  // Writes all of `data` to the child's stdin (blocking).
  bool write(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(in_.get(), data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  void closeStdin() { in_.reset(); }

  // Reads until `done(out, err)` holds, both pipes end, or kProcessDeadline.
  template <typename Pred>
  bool readUntil(Pred done) {
    const auto deadline = Clock::now() + kProcessDeadline;
    while (!done(out, err) && Clock::now() < deadline) {
      pollfd fds[2] = {{out_.get(), POLLIN, 0}, {err_.get(), POLLIN, 0}};
      if (fds[0].fd < 0 && fds[1].fd < 0) break;
      int n = poll(fds, 2, 100);
      if (n < 0 && errno != EINTR) break;
      std::string* sinks[2] = {&out, &err};
      Fd* owners[2] = {&out_, &err_};
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0) continue;
        char buf[65536];
        ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
        if (got > 0) {
          sinks[i]->append(buf, static_cast<size_t>(got));
        } else if (got == 0 || errno != EINTR) {
          owners[i]->reset();
        }
      }
    }
    return done(out, err);
  }

  // Reads everything to EOF and returns the exit code (-1 on a hang).
  int finish() {
    readUntil([](const std::string&, const std::string&) { return false; });
    return child_.waitUntil(Clock::now() + kProcessDeadline).value_or(-1);
  }
  // Never kill(-1, ...): once reaped the pid is -1, which would signal
  // every process we may signal.
  pid_t pid() const { return child_.pid(); }
  void signal(int sig) {
    if (child_.pid() > 0) ::kill(child_.pid(), sig);
  }

  std::string out, err;

 private:
  Child child_;
  Fd in_, out_, err_;
};

}  // namespace siphon::harness
