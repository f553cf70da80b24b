// Session continuity end to end, as root, with real traffic (issue 6):
//
//  - a "pod" network namespace running busybox httpd on port 80 (the
//    application, the agent's target), joined by a veth pair to a "client"
//    namespace (the remote client of the pod, as from another pod);
//  - a "node" namespace holding only loopback, where the real siphon-agent
//    and the real siphon CLI run and talk over 127.0.0.1, with the local
//    servers the CLI bridges to. The transport between them is cut there
//    (`ss -K`) or blackholed (an iptables DROP in that namespace), so
//    nothing of the host is touched.
//
// What each test proves: a cut transport does not end the session (the CLI
// reconnects, both sides replay what the other has not acked, and a 256 MiB
// transfer in flight arrives byte-exact, each byte checked against its
// generator); a blackhole longer than the keepalive timeout does the same
// while the agent's memory stays bounded (replay buffer, then TCP
// backpressure on the pod's side); and past --session-grace the steal is
// released (the application has its port back, its stolen connections are
// closed, the agent's steering and fds are gone) and the CLI says the
// session expired, exit 3.
//
// Every kernel object has a unique name and an RAII owner; every socket of
// the test has a timeout, so a bug fails a test instead of hanging it.
// Without root every test skips with the reason.
//
// Over 600 lines: one scenario family's cases sharing the namespaces, agent and cut proxy below.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

extern char** environ;

namespace siphon {
namespace {

using ::testing::HasSubstr;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates network namespaces, a veth pair and iptables rules, runs siphon-agent, "
    "which steals ports of another process's network namespace";

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kTransfer = 256 * kMiB;
// Where in the transfer the transport is cut: well inside it.
constexpr uint64_t kCutAt = 32 * kMiB;
// Every socket of the test gives up after this long without progress: more
// than any cut lasts (a blackhole, the reconnect after it), far less than
// ctest's timeout.
constexpr int kIoTimeoutSeconds = 20;
// The keepalive of the tests that need one short (agent and CLI).
const std::vector<std::string> kShortKeepalive = {"--keepalive-interval", "500ms",
                                                  "--keepalive-timeout", "2s"};

// ---------------------------------------------------------------- sockets

sockaddr_in ipv4(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// A TCP connection from the named namespace (timeouts set); -1 on failure.
int connectFrom(const std::string& netns, const std::string& ip, uint16_t port) {
  int fd = socketInNetns(netns, AF_INET, SOCK_STREAM);
  if (fd < 0) return -1;
  setTimeouts(fd, kIoTimeoutSeconds);
  sockaddr_in a = ipv4(ip, port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A listening TCP socket on 127.0.0.1 inside the named namespace; its port.
Fd listenIn(const std::string& netns, uint16_t* port) {
  Fd fd(socketInNetns(netns, AF_INET, SOCK_STREAM));
  EXPECT_GE(fd.get(), 0);
  sockaddr_in a = ipv4("127.0.0.1", 0);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  EXPECT_EQ(::listen(fd.get(), 64), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// What a receiver saw: the bytes that matched the generator before the
// first difference, and how it ended.
struct Received {
  uint64_t good = 0;
  bool clean_eof = false;
  std::string error;  // why it stopped, when not at a clean EOF
};

// Reads to EOF and compares with Pattern(seed). `at_cut` runs once, from
// this thread, when kCutAt bytes have arrived (nothing more is read while
// it runs: the transfer is certainly in flight).
Received receivePattern(int fd, uint64_t seed, uint64_t total,
                        const std::function<void()>& at_cut = nullptr) {
  Pattern p(seed);
  std::string buf(kMiB, '\0'), want(kMiB, '\0');
  Received r;
  bool cut = false;
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) {
      r.clean_eof = true;
      return r;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.error = strerror(errno);
      return r;
    }
    p.fill(want.data(), static_cast<size_t>(n));
    if (r.good + static_cast<uint64_t>(n) > total) {
      r.error = "more bytes than were sent";
      return r;
    }
    if (std::memcmp(buf.data(), want.data(), static_cast<size_t>(n)) != 0) {
      size_t i = 0;
      while (buf[i] == want[i]) ++i;
      r.good += i;
      r.error = "a byte differs from the generator's";
      return r;
    }
    r.good += static_cast<uint64_t>(n);
    if (!cut && at_cut && r.good >= kCutAt) {
      cut = true;
      at_cut();
    }
  }
}

std::ostream& operator<<(std::ostream& os, const Received& r) {
  return os << r.good << " good bytes, " << (r.clean_eof ? "clean EOF" : "no EOF: " + r.error);
}

// A TCP server on 127.0.0.1 inside a namespace: one thread per connection
// running `serve(fd)` (the socket has the test's timeouts).
class NsServer {
 public:
  NsServer(const std::string& netns, std::function<void(int)> serve)
      : acceptor_(listenIn(netns, &port_), kIoTimeoutSeconds, std::move(serve)) {}
  uint16_t port() const { return port_; }
  std::string to() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return acceptor_.accepted(); }

 private:
  uint16_t port_ = 0;
  Acceptor acceptor_;
};

void echoServe(int fd) {
  char buf[16384];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || !writeAll(fd, buf, static_cast<size_t>(n))) return;
  }
}

// Sends `msg` and reads as many bytes back; what came back.
std::string echoOnce(int fd, const std::string& msg) {
  if (!writeAll(fd, msg.data(), msg.size())) return "write failed: " + std::string(strerror(errno));
  std::string got;
  char buf[4096];
  while (got.size() < msg.size()) {
    ssize_t n = ::read(fd, buf, std::min(sizeof buf, msg.size() - got.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return got + (n == 0 ? " <EOF>" : " <" + std::string(strerror(errno)) + ">");
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// ------------------------------------------------------------- processes

// A program run inside a namespace through `ip netns exec`, which execs it
// (so the pid is the program's own: signals and /proc reach it). stdout
// and stderr go to files; stdin is /dev/null or a pipe the test writes.
class NsProc {
 public:
  NsProc(const std::string& netns, const std::vector<std::string>& program,
         const std::string& out_path, const std::string& err_path, bool with_stdin)
      : out_path_(out_path), err_path_(err_path) {
    std::vector<std::string> argv = {"ip", "netns", "exec", netns};
    argv.insert(argv.end(), program.begin(), program.end());
    std::vector<std::string> env = cleanEnv();
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    Fd out(::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    Fd err(::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    Fd in_r(::open("/dev/null", O_RDONLY | O_CLOEXEC)), in_w;
    if (with_stdin) {
      auto [r, w] = makePipe();
      in_r = std::move(r);
      in_w = std::move(w);
    }
    pid_t pid = fork();
    if (pid == 0) {
      dup2(in_r.get(), 0);
      dup2(out.get(), 1);
      dup2(err.get(), 2);
      for (int fd = 3; fd < 1024; ++fd) close(fd);
      execvpe(args[0], args.data(), envp.data());
      _exit(127);
    }
    EXPECT_GT(pid, 0) << strerror(errno);
    child_ = Child(pid);
    in_ = std::move(in_w);
  }
  ~NsProc() {
    // A stopped process must run again to die of SIGKILL cleanly.
    signal(SIGCONT);
  }

  pid_t pid() const { return child_.pid(); }
  Child& child() { return child_; }
  int stdinFd() const { return in_.get(); }
  void closeStdin() { in_.reset(); }
  std::string out() const { return readFile(out_path_); }
  std::string err() const { return readFile(err_path_); }
  void signal(int sig) {
    if (child_.pid() > 0) ::kill(child_.pid(), sig);
  }

 private:
  std::string out_path_, err_path_;
  Child child_;
  Fd in_;
};

// Polls `text()` until it contains `needle`, for at most `limit`.
bool eventually(const std::function<std::string()>& text, const std::string& needle,
                std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (true) {
    if (text().find(needle) != std::string::npos) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

size_t countOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// VmRSS of a process in bytes (0 when it is gone).
uint64_t rssOf(pid_t pid) {
  std::string status = readFile("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find("VmRSS:");
  if (at == std::string::npos) return 0;
  return std::strtoull(status.c_str() + at + 6, nullptr, 10) * 1024;
}

// The last of the three numbers of tcp_rmem / tcp_wmem: a socket
// buffer's largest size.
uint64_t sysctlMax(const std::string& path) {
  std::istringstream in(readFile(path));
  uint64_t min = 0, def = 0, max = 0;
  in >> min >> def >> max;
  return max;
}

size_t fdCountOf(pid_t pid) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// ------------------------------------------------------------ the fixture

class ContinuityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    // A CLI that dies while the test feeds its stdin must fail the test,
    // not kill it.
    ::signal(SIGPIPE, SIG_IGN);
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    pod_.emplace();
    client_.emplace();
    node_.emplace();
    ASSERT_TRUE(pod_->created() && client_->created() && node_->created());

    PodLink link;
    ASSERT_TRUE(linkPodToClient(*pod_, *client_, "sr", &link));
    pod_ip_ = link.pod_ip;

    // The application: busybox httpd on port 80, the agent's target.
    const std::string www = dir_->path() + "/www";
    std::filesystem::create_directories(www);
    dir_->file("www/index.html", "original\n");
    httpd_ = spawn(
        {"ip", "netns", "exec", pod_->name(), "busybox", "httpd", "-f", "-p", "80", "-h", www},
        std::nullopt, -1, -1);
    ASSERT_GT(httpd_.pid(), 0);
    ASSERT_TRUE(originalWithin(std::chrono::seconds(10))) << "httpd never answered on port 80";
  }

  void TearDown() override {
    if (HasFailure()) {
      if (agent_) std::cerr << "--- agent log\n" << agent_->err() << "---\n";
      for (auto& p : clis_) std::cerr << "--- siphon stderr\n" << p->err() << "---\n";
    }
    clis_.clear();
    agent_.reset();
  }

  // siphon-agent in the node namespace, targeting the httpd; waits for its
  // ready line.
  void startAgent(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {
        SIPHON_AGENT_BIN,         "--listen", "127.0.0.1:0", "--token-file", token_file_,
        "--first-client-timeout", "120s"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {"targeted", "--pid", std::to_string(httpd_.pid())});
    agent_ = std::make_unique<NsProc>(node_->name(), argv, dir_->path() + "/agent.out",
                                      dir_->path() + "/agent.log", false);
    ASSERT_TRUE(eventually([this] { return agent_->out(); }, "\n", std::chrono::seconds(20)))
        << "no ready line from the agent; its log:\n"
        << agent_->err();
    std::string line = agent_->out();
    line = line.substr(0, line.find('\n'));
    auto ready = parseReadyLine(line);
    ASSERT_TRUE(ready.has_value()) << "malformed ready line: " << line;
    endpoint_ = ready->fields["listen"];
    agent_port_ = endpoint_.substr(endpoint_.rfind(':') + 1);
  }

  // The siphon CLI in the node namespace: global flags, then the command.
  NsProc* cli(const std::vector<std::string>& global, const std::vector<std::string>& command,
              bool with_stdin = false) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), global.begin(), global.end());
    argv.insert(argv.end(), command.begin(), command.end());
    const std::string n = std::to_string(clis_.size());
    clis_.push_back(std::make_unique<NsProc>(node_->name(), argv,
                                             dir_->path() + "/cli" + n + ".out",
                                             dir_->path() + "/cli" + n + ".err", with_stdin));
    return clis_.back().get();
  }

  // `siphon steal --port 80 --to local`; waits for its "stealing" line.
  NsProc* steal(const NsServer& local, const std::vector<std::string>& global = {}) {
    NsProc* p = cli(global, {"steal", "--port", "80", "--to", local.to()});
    EXPECT_TRUE(eventually([p] { return p->err(); }, "stealing port 80", std::chrono::seconds(20)))
        << "siphon steal did not start: " << p->err();
    return p;
  }

  std::string agentLog() const { return agent_ ? agent_->err() : ""; }

  // Kills every established TCP connection to or from the agent's port in
  // the node namespace (both ends of the agent<->CLI transport), like a
  // NAT or a load balancer dropping it; the sockets get ECONNRESET. How
  // many sockets it killed.
  size_t killTransport() {
    Result r =
        run({"ip", "netns", "exec", node_->name(), "ss", "-K", "-t", "-n", "state", "established",
             "( sport = :" + agent_port_ + " or dport = :" + agent_port_ + " )"});
    EXPECT_EQ(r.exit_code, 0) << r;
    return countOf(r.out, ":" + agent_port_ + " ");
  }

  // An iptables chain in the node namespace dropping every packet to or
  // from the agent's port: a silent network, the peers see nothing at all.
  void blackhole() {
    chain_ = "SRT_" + std::to_string(getpid()) + "_" + randomHex(4);
    for (const auto& rule : std::vector<std::vector<std::string>>{
             {"-N", chain_},
             {"-A", chain_, "-p", "tcp", "--dport", agent_port_, "-j", "DROP"},
             {"-A", chain_, "-p", "tcp", "--sport", agent_port_, "-j", "DROP"},
             {"-I", "INPUT", "-j", chain_}}) {
      std::vector<std::string> argv = {"ip", "netns", "exec", node_->name(), "iptables", "-w"};
      argv.insert(argv.end(), rule.begin(), rule.end());
      Result r = run(argv);
      ASSERT_EQ(r.exit_code, 0) << r;
    }
  }
  void removeBlackhole() {
    Result r =
        run({"ip", "netns", "exec", node_->name(), "iptables", "-w", "-D", "INPUT", "-j", chain_});
    EXPECT_EQ(r.exit_code, 0) << r;
  }

  // The ports the agent still steers into the pod: the entries of its
  // sk_lookup port map (found through its fds), REDIRECT rules of SIPHON
  // chains in either iptables. Empty when no port is stolen; the steering
  // itself (the sk_lookup link, the chains) stays until the agent exits
  // (docs/STEAL.md, "What is left behind").
  std::string steeredPorts(pid_t agent_pid) {
    std::string out;
    const std::string fdinfo = "/proc/" + std::to_string(agent_pid) + "/fdinfo";
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(fdinfo, ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const std::string info = readFile(it->path());
      size_t at = info.find("map_id:");
      if (at == std::string::npos) continue;
      const std::string id = std::to_string(std::strtoull(info.c_str() + at + 7, nullptr, 10));
      Result show = run({"bpftool", "-j", "map", "show", "id", id});
      if (show.out.find("\"name\":\"steal_ports\"") == std::string::npos) continue;
      Result dump = run({"bpftool", "-j", "map", "dump", "id", id});
      if (dump.out.find("\"key\"") != std::string::npos) out += "steal_ports map: " + dump.out;
    }
    for (const char* tool : {"iptables-nft-save", "iptables-legacy-save"}) {
      Result r = run({"ip", "netns", "exec", pod_->name(), tool});
      std::istringstream lines(r.out);
      for (std::string line; std::getline(lines, line);) {
        if (line.find("SIPHON") != std::string::npos &&
            line.find("REDIRECT") != std::string::npos) {
          out += std::string(tool) + ": " + line + "\n";
        }
      }
    }
    return out;
  }

  // Polls until a connection from the client namespace to the pod's port
  // 80 reaches the application (busybox httpd), at most `limit`.
  bool originalWithin(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    do {
      int fd = connectFrom(client_->name(), pod_ip_, 80);
      if (fd >= 0) {
        const std::string req = "GET / HTTP/1.0\r\n\r\n";
        std::string resp;
        char buf[4096];
        bool ok = writeAll(fd, req.data(), req.size());
        ssize_t n;
        while (ok && (n = ::read(fd, buf, sizeof buf)) > 0)
          resp.append(buf, static_cast<size_t>(n));
        ::close(fd);
        if (resp.find("\r\n\r\noriginal\n") != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (Clock::now() < deadline);
    return false;
  }

  // Runs a stolen transfer through `siphon steal`: the local server (the
  // developer's side) sends `down` bytes and checks `up` bytes it receives;
  // the remote client in the client namespace sends `up` and checks
  // `down`. `at_cut` runs on the remote client's receiving thread at
  // kCutAt bytes.
  struct Transfer {
    Received down, up;
  };
  Transfer stolenTransfer(uint64_t down, uint64_t up, const std::function<void()>& at_cut,
                          std::atomic<uint64_t>* up_sent, const std::vector<std::string>& global,
                          NsProc** steal_proc) {
    Transfer t;
    std::atomic<bool> up_done{false};
    NsServer local(node_->name(), [&](int fd) {
      std::thread sender([&, fd] { sendPattern(fd, 7, down); });
      t.up = receivePattern(fd, 8, up);
      sender.join();
      up_done = true;
    });
    *steal_proc = steal(local, global);
    int fd = connectFrom(client_->name(), pod_ip_, 80);
    EXPECT_GE(fd, 0) << "connect to the stolen port: " << strerror(errno);
    if (fd < 0) return t;
    std::thread uploader([&, fd] { sendPattern(fd, 8, up, up_sent); });
    t.down = receivePattern(fd, 7, down, at_cut);
    uploader.join();
    ::close(fd);
    // The local server ends once the stream's EOF reached it (or its
    // socket timed out).
    const auto deadline = Clock::now() + std::chrono::seconds(kIoTimeoutSeconds + 5);
    while (!up_done && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(up_done) << "the local server never saw the end of the upload";
    return t;
  }

  void pausedTransfer(bool pause_agent);

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> pod_, client_, node_;
  std::string pod_ip_;
  Child httpd_;
  // Declared after the namespaces: destroyed (killed) before them.
  std::unique_ptr<NsProc> agent_;
  std::vector<std::unique_ptr<NsProc>> clis_;
  std::string endpoint_, agent_port_;
  std::string chain_;
};

// ------------------------------------------------------------------ tests

// ss -K of the agent<->CLI connection in the middle of a 256 MiB stolen
// download: the CLI resumes the session and the remote client gets every
// byte once, in order.
TEST_F(ContinuityTest, StolenDownloadSurvivesAKilledTransport) {
  ASSERT_NO_FATAL_FAILURE(startAgent({}));
  size_t killed = 0;
  NsProc* s = nullptr;
  Transfer t = stolenTransfer(
      kTransfer, 0, [&] { killed = killTransport(); }, nullptr, {}, &s);
  ASSERT_NE(s, nullptr);
  EXPECT_GE(killed, 1u) << "ss -K found no agent<->CLI connection to kill";
  EXPECT_EQ(t.down.good, kTransfer) << t.down;
  EXPECT_TRUE(t.down.clean_eof) << t.down;
  EXPECT_TRUE(t.up.clean_eof) << t.up;
  // The session went on over a new connection: the agent resumed it.
  EXPECT_THAT(agentLog(), HasSubstr("session_detached"));
  EXPECT_THAT(agentLog(), HasSubstr("session_resumed"));
  s->signal(SIGINT);
  EXPECT_EQ(s->child().waitUntil(Clock::now() + kProcessDeadline), 0) << s->err();
  EXPECT_THAT(s->err(), HasSubstr("out=" + std::to_string(kTransfer)));
}

// The transport killed again and again (every 20 ms or so, resumes included)
// during a 256 MiB stolen transfer each way: each cut is resumed, and both
// directions arrive byte-exact.
TEST_F(ContinuityTest, StolenTransferSurvivesRepeatedKills) {
  ASSERT_NO_FATAL_FAILURE(startAgent({}));
  std::atomic<bool> stop{false};
  std::atomic<int> kills{0};
  std::thread killer;
  NsProc* s = nullptr;
  Transfer t = stolenTransfer(
      kTransfer, kTransfer,
      [&] {
        killer = std::thread([&] {
          while (!stop) {
            if (killTransport() > 0) ++kills;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        });
      },
      nullptr, {}, &s);
  stop = true;
  if (killer.joinable()) killer.join();
  ASSERT_NE(s, nullptr);
  EXPECT_GE(kills.load(), 1);
  EXPECT_EQ(t.down.good, kTransfer) << t.down;
  EXPECT_TRUE(t.down.clean_eof) << t.down;
  EXPECT_EQ(t.up.good, kTransfer) << t.up;
  EXPECT_TRUE(t.up.clean_eof) << t.up;
  std::cerr << kills.load() << " cuts, " << countOf(agentLog(), "session_resumed") << " resumes\n";
  s->signal(SIGINT);
  EXPECT_EQ(s->child().waitUntil(Clock::now() + kProcessDeadline), 0) << s->err();
}

// An iptables DROP on the transport for longer than the keepalive timeout,
// in the middle of a 256 MiB stolen transfer each way: both sides declare
// the connection lost, the CLI reconnects once the network is back, and
// both directions arrive byte-exact. While the network is silent, the
// agent buffers at most its replay buffer and stream windows: its memory
// stays bounded and the remote client's upload stalls (TCP backpressure)
// rather than being read into memory.
TEST_F(ContinuityTest, StolenTransferSurvivesABlackholeLongerThanTheKeepalive) {
  ASSERT_NO_FATAL_FAILURE(startAgent(kShortKeepalive));
  const pid_t agent_pid = agent_->pid();
  std::atomic<uint64_t> up_sent{0};
  uint64_t rss_at_cut = 0, rss_max = 0, up_at_cut = 0, up_at_end = 0;
  bool detached_in_time = false;
  NsProc* s = nullptr;
  Transfer t = stolenTransfer(
      kTransfer, kTransfer,
      [&] {
        blackhole();
        rss_at_cut = rss_max = rssOf(agent_pid);
        up_at_cut = up_sent;
        // Silent for longer than the keepalive timeout (2 s): the agent
        // detaches the session. Meanwhile the remote client keeps
        // uploading into a pipeline that no longer moves.
        const auto start = Clock::now();
        while (Clock::now() - start < std::chrono::milliseconds(2500) ||
               (!detached_in_time && Clock::now() - start < std::chrono::seconds(10))) {
          rss_max = std::max(rss_max, rssOf(agent_pid));
          detached_in_time = agentLog().find("session_detached") != std::string::npos;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        // A little longer, so the memory would show a leak.
        for (int i = 0; i < 25; ++i) {
          rss_max = std::max(rss_max, rssOf(agent_pid));
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        up_at_end = up_sent;
        removeBlackhole();
      },
      &up_sent, kShortKeepalive, &s);
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(detached_in_time) << "the agent never noticed the silent transport";
  EXPECT_EQ(t.down.good, kTransfer) << t.down;
  EXPECT_TRUE(t.down.clean_eof) << t.down;
  EXPECT_EQ(t.up.good, kTransfer) << t.up;
  EXPECT_TRUE(t.up.clean_eof) << t.up;
  EXPECT_THAT(agentLog(), HasSubstr("session_resumed"));
  // Bounds, not timings. Memory: the replay buffer (16 MiB) plus stream
  // windows, with room to spare; an agent reading the upload into memory
  // would grow by most of the 224 MiB left. The upload: what the kernel's
  // socket buffers on its way take (the remote client's send buffer, the
  // agent's receive buffer, at their sysctl maxima) plus the replay buffer
  // and slack.
  const uint64_t kMemoryBound = 64 * kMiB;
  EXPECT_LT(rss_max - rss_at_cut, kMemoryBound)
      << "agent RSS " << rss_at_cut / kMiB << " MiB -> " << rss_max / kMiB << " MiB";
  const uint64_t kUploadBound = sysctlMax("/proc/sys/net/ipv4/tcp_wmem") +
                                sysctlMax("/proc/sys/net/ipv4/tcp_rmem") + 32 * kMiB;
  EXPECT_LT(up_at_end - up_at_cut, kUploadBound)
      << "the remote client uploaded " << (up_at_end - up_at_cut) / kMiB
      << " MiB while the transport was silent";
  std::cerr << "blackhole: agent RSS " << rss_at_cut / kMiB << " -> " << rss_max / kMiB
            << " MiB, upload moved " << (up_at_end - up_at_cut) / kMiB << " MiB\n";
  s->signal(SIGINT);
  EXPECT_EQ(s->child().waitUntil(Clock::now() + kProcessDeadline), 0) << s->err();
  EXPECT_THAT(s->err(),
              HasSubstr("in=" + std::to_string(kTransfer) + " out=" + std::to_string(kTransfer)));
}

// One side stopped (SIGSTOP) for longer than the keepalive timeout in the
// middle of a 256 MiB stolen transfer each way, then continued: every byte
// arrives once, in order, after a resume.
void ContinuityTest::pausedTransfer(bool pause_agent) {
  ASSERT_NO_FATAL_FAILURE(startAgent(kShortKeepalive));
  NsProc* agent = agent_.get();
  NsProc* s = nullptr;
  Transfer t = stolenTransfer(
      kTransfer, kTransfer,
      [&] {
        NsProc* paused = pause_agent ? agent : s;
        paused->signal(SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        paused->signal(SIGCONT);
      },
      nullptr, kShortKeepalive, &s);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(t.down.good, kTransfer) << t.down;
  EXPECT_TRUE(t.down.clean_eof) << t.down;
  EXPECT_EQ(t.up.good, kTransfer) << t.up;
  EXPECT_TRUE(t.up.clean_eof) << t.up;
  EXPECT_THAT(agentLog(), HasSubstr("session_resumed"));
  s->signal(SIGINT);
  EXPECT_EQ(s->child().waitUntil(Clock::now() + kProcessDeadline), 0) << s->err();
}

// The agent paused: the CLI gives the connection up and reconnects at once
// (the kernel completes the new connection and holds its Hello while the
// agent is stopped). When the agent runs again, its old connection still
// holds frames the CLI sent before it gave up, and the resume waits beside
// it: whatever order the agent sees them in, nothing is handled twice or
// skipped (the bug fixed in 916f682).
TEST_F(ContinuityTest, StolenTransferSurvivesAnAgentPausedPastTheKeepalive) {
  pausedTransfer(true);
}

// The CLI paused: the agent detaches the session and keeps it; the CLI,
// running again, finds its connection gone and resumes.
TEST_F(ContinuityTest, StolenTransferSurvivesACliPausedPastTheKeepalive) { pausedTransfer(false); }

// Eight stolen uploads at once through a blackhole longer than the
// keepalive timeout: their stream windows together are more than the
// agent's replay buffer (16 MiB), so while the session is detached the
// agent reads from the pod's sockets only until that buffer is full, then
// leaves the rest to TCP backpressure. Its memory stays within the buffer
// plus slack, nothing is dropped: every upload arrives byte-exact after the
// resume.
TEST_F(ContinuityTest, DetachedSessionBuffersAtMostItsReplayBuffer) {
  ASSERT_NO_FATAL_FAILURE(startAgent(kShortKeepalive));
  const pid_t agent_pid = agent_->pid();
  constexpr int kConnections = 8;
  constexpr uint64_t kEach = 48 * kMiB;
  std::atomic<uint64_t> received{0};
  std::atomic<int> good{0};
  std::mutex mu;
  std::vector<std::string> failures;
  NsServer local(node_->name(), [&](int fd) {
    // The remote client's first 8 bytes name its generator.
    uint64_t seed = 0;
    size_t got = 0;
    while (got < sizeof seed) {
      ssize_t n = ::read(fd, reinterpret_cast<char*>(&seed) + got, sizeof seed - got);
      if (n <= 0) return;
      got += static_cast<size_t>(n);
    }
    Pattern p(seed);
    std::string buf(kMiB, '\0'), want(kMiB, '\0');
    uint64_t total = 0;
    while (true) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::lock_guard<std::mutex> l(mu);
        if (n == 0 && total == kEach) {
          ++good;
        } else {
          failures.push_back("upload " + std::to_string(seed) + ": " + std::to_string(total) +
                             " bytes, then " + (n == 0 ? "EOF" : strerror(errno)));
        }
        return;
      }
      p.fill(want.data(), static_cast<size_t>(n));
      if (std::memcmp(buf.data(), want.data(), static_cast<size_t>(n)) != 0) {
        std::lock_guard<std::mutex> l(mu);
        failures.push_back("upload " + std::to_string(seed) + ": a byte differs after " +
                           std::to_string(total));
        return;
      }
      total += static_cast<uint64_t>(n);
      received += static_cast<uint64_t>(n);
    }
  });
  NsProc* s = steal(local, kShortKeepalive);
  std::atomic<uint64_t> sent{0};
  std::vector<std::thread> uploaders;
  for (int i = 0; i < kConnections; ++i) {
    uploaders.emplace_back([&, i] {
      Fd fd(connectFrom(client_->name(), pod_ip_, 80));
      if (fd.get() < 0) return;
      const uint64_t seed = 100 + static_cast<uint64_t>(i);
      if (!writeAll(fd.get(), reinterpret_cast<const char*>(&seed), sizeof seed)) return;
      sendPattern(fd.get(), seed, kEach, &sent);
      // Wait for the local server's side to close (after our EOF), so the
      // connection is not reset under data still in flight.
      char b;
      while (::read(fd.get(), &b, 1) > 0) {
      }
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(kIoTimeoutSeconds);
  while (received < 64 * kMiB && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NO_FATAL_FAILURE(blackhole());
  const uint64_t rss_at_cut = rssOf(agent_pid), sent_at_cut = sent;
  uint64_t rss_max = rss_at_cut;
  bool detached = false;
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::milliseconds(3000) ||
         (!detached && Clock::now() - start < std::chrono::seconds(10))) {
    rss_max = std::max(rss_max, rssOf(agent_pid));
    detached = agentLog().find("session_detached") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const uint64_t sent_at_end = sent;
  removeBlackhole();
  for (auto& t : uploaders) t.join();
  EXPECT_TRUE(detached) << "the agent never noticed the silent transport";
  EXPECT_EQ(good.load(), kConnections) << testing::PrintToString(failures);
  EXPECT_THAT(agentLog(), HasSubstr("session_resumed"));
  std::cerr << "blackhole with " << kConnections << " uploads: agent RSS " << rss_at_cut / kMiB
            << " -> " << rss_max / kMiB << " MiB, uploads moved "
            << (sent_at_end - sent_at_cut) / kMiB << " MiB\n";
  // The replay buffer (16 MiB) with room to spare for the allocator and
  // the pumps' reads; an agent reading the uploads into memory would grow
  // by about 300 MiB.
  EXPECT_LT(rss_max - rss_at_cut, 40 * kMiB)
      << "agent RSS " << rss_at_cut / kMiB << " MiB -> " << rss_max / kMiB << " MiB";
  s->signal(SIGINT);
  EXPECT_EQ(s->child().waitUntil(Clock::now() + kProcessDeadline), 0) << s->err();
}

// `siphon connect` uploading 256 MiB from its stdin to a server inside the
// pod, the transport killed with ss -K mid-transfer: the server receives
// every byte once, in order, and its answer reaches the CLI's stdout.
TEST_F(ContinuityTest, OutgoingUploadSurvivesAKilledTransport) {
  ASSERT_NO_FATAL_FAILURE(startAgent({}));
  Received got;
  size_t killed = 0;
  NsServer server(pod_->name(), [&](int fd) {
    got = receivePattern(fd, 9, kTransfer, [&] { killed = killTransport(); });
    const std::string answer = "received " + std::to_string(got.good) + "\n";
    writeAll(fd, answer.data(), answer.size());
  });
  NsProc* c = cli({}, {"connect", server.to()}, /*with_stdin=*/true);
  // The CLI's stdin, fed like a socket with a timeout: a CLI that stops
  // reading fails the test instead of blocking it.
  std::atomic<bool> fed{false};
  std::thread feeder([&] {
    int fd = c->stdinFd();
    Pattern p(9);
    std::string buf(kMiB, '\0');
    uint64_t left = kTransfer;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    while (left > 0) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      p.fill(buf.data(), n);
      size_t off = 0;
      while (off < n) {
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, kIoTimeoutSeconds * 1000) <= 0) return;
        ssize_t w = ::write(fd, buf.data() + off, n - off);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (w <= 0) return;
        off += static_cast<size_t>(w);
      }
      left -= n;
    }
    fed = true;
  });
  feeder.join();
  c->closeStdin();
  EXPECT_TRUE(fed) << "the CLI stopped taking its stdin";
  EXPECT_EQ(c->child().waitUntil(Clock::now() + kProcessDeadline), 0) << c->err();
  EXPECT_GE(killed, 1u) << "ss -K found no agent<->CLI connection to kill";
  EXPECT_EQ(got.good, kTransfer) << got;
  EXPECT_TRUE(got.clean_eof) << got;
  EXPECT_EQ(c->out(), "received " + std::to_string(kTransfer) + "\n");
  EXPECT_THAT(agentLog(), HasSubstr("session_resumed"));
}

// `siphon forward` to a server inside the pod, 256 MiB each way through
// one forwarded connection, the transport killed with ss -K mid-transfer:
// both directions of the outgoing stream arrive byte-exact.
TEST_F(ContinuityTest, OutgoingForwardEachWaySurvivesAKilledTransport) {
  ASSERT_NO_FATAL_FAILURE(startAgent({}));
  Received up;
  std::atomic<bool> up_done{false};
  NsServer server(pod_->name(), [&](int fd) {
    std::thread sender([fd] { sendPattern(fd, 11, kTransfer); });
    up = receivePattern(fd, 12, kTransfer);
    sender.join();
    up_done = true;
  });
  // A free port of the node namespace (nothing else runs there).
  uint16_t local_port = 0;
  { Fd probe = listenIn(node_->name(), &local_port); }
  NsProc* f =
      cli({}, {"forward", "-L", "127.0.0.1:" + std::to_string(local_port) + ":" + server.to()});
  ASSERT_TRUE(eventually([f] { return f->err(); }, "forwarding", std::chrono::seconds(20)))
      << f->err();
  Fd fd(connectFrom(node_->name(), "127.0.0.1", local_port));
  ASSERT_GE(fd.get(), 0) << strerror(errno);
  size_t killed = 0;
  const int raw = fd.get();
  std::thread uploader([raw] { sendPattern(raw, 12, kTransfer); });
  Received down = receivePattern(raw, 11, kTransfer, [&] { killed = killTransport(); });
  uploader.join();
  const auto deadline = Clock::now() + std::chrono::seconds(kIoTimeoutSeconds + 5);
  while (!up_done && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(killed, 1u) << "ss -K found no agent<->CLI connection to kill";
  EXPECT_EQ(down.good, kTransfer) << down;
  EXPECT_TRUE(down.clean_eof) << down;
  ASSERT_TRUE(up_done) << "the pod's server never saw the end of the upload";
  EXPECT_EQ(up.good, kTransfer) << up;
  EXPECT_TRUE(up.clean_eof) << up;
  EXPECT_THAT(agentLog(), HasSubstr("session_resumed"));
}

// The CLI stopped (SIGSTOP) for longer than keepalive timeout + grace: the
// agent drops the session; the application has port 80 back, the stolen
// connection still open is reset, no port is steered any more and the
// agent holds no more fds than after a steal that ended normally (the
// session's connection, the stolen connection are closed). Resumed
// (SIGCONT), the CLI is told SESSION_EXPIRED, says so and exits 3 (agent
// lost).
TEST_F(ContinuityTest, GraceExpiryReleasesTheStealAndTheCliSaysTheSessionExpired) {
  std::vector<std::string> agent_flags = {"--session-grace", "2s"};
  agent_flags.insert(agent_flags.end(), kShortKeepalive.begin(), kShortKeepalive.end());
  ASSERT_NO_FATAL_FAILURE(startAgent(agent_flags));
  const pid_t agent_pid = agent_->pid();
  NsServer local(node_->name(), echoServe);

  // A steal that ends normally first: what the agent keeps afterwards (its
  // steering, without ports) is the baseline.
  NsProc* first = steal(local, kShortKeepalive);
  first->signal(SIGINT);
  ASSERT_EQ(first->child().waitUntil(Clock::now() + kProcessDeadline), 0) << first->err();
  ASSERT_TRUE(
      eventually([this] { return agentLog(); }, "closed by the client", std::chrono::seconds(5)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const size_t fds_idle = fdCountOf(agent_pid);
  ASSERT_EQ(steeredPorts(agent_pid), "");

  NsProc* s = steal(local, kShortKeepalive);
  Fd conn(connectFrom(client_->name(), pod_ip_, 80));
  ASSERT_GE(conn.get(), 0) << strerror(errno);
  ASSERT_EQ(echoOnce(conn.get(), "before"), "before");
  ASSERT_NE(steeredPorts(agent_pid), "") << "no sign of the steal in the pod";

  const auto stopped = Clock::now();
  s->signal(SIGSTOP);
  EXPECT_TRUE(eventually([this] { return agentLog(); }, "no resume within the session grace",
                         std::chrono::seconds(15)))
      << "the agent kept the session past keepalive timeout + grace";
  // The grace period runs after the keepalive noticed the silence.
  EXPECT_GE(Clock::now() - stopped, std::chrono::seconds(2));
  EXPECT_TRUE(originalWithin(std::chrono::seconds(3)))
      << "the application did not get port 80 back after the session expired";
  // The stolen connection was reset with the session: an RST, never an
  // EOF its client could take for a complete answer (nor a timeout).
  char b;
  errno = 0;
  ssize_t n = ::read(conn.get(), &b, 1);
  EXPECT_EQ(n, -1);
  EXPECT_EQ(errno, ECONNRESET) << "read on the stolen connection: " << n << " " << strerror(errno);
  std::string steered;
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  do {
    steered = steeredPorts(agent_pid);
    if (steered.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  EXPECT_EQ(steered, "");
  size_t fds_after = fdCountOf(agent_pid);
  for (int i = 0; i < 100 && fds_after > fds_idle; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fds_after = fdCountOf(agent_pid);
  }
  EXPECT_LE(fds_after, fds_idle) << "the expired session left fds open in the agent";

  s->signal(SIGCONT);
  EXPECT_EQ(s->child().waitUntil(Clock::now() + kProcessDeadline), 3) << s->err();
  // In plain words, with the code a script can match.
  EXPECT_THAT(s->err(), HasSubstr("expired"));
  EXPECT_THAT(s->err(), HasSubstr("SESSION_EXPIRED"));
  EXPECT_THAT(agentLog(), HasSubstr("code=SESSION_EXPIRED"));
}

}  // namespace
}  // namespace siphon
