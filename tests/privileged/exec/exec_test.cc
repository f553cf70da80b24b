// `siphon exec` end to end, as root, with real programs: a "pod" network
// namespace with its own root (resolv.conf with search domains and ndots,
// hosts, hostname), a DNS server (dnsmasq), an HTTP service (python3
// http.server) and a UDP echo service that only the pod can reach, the pod
// process as the target, the real siphon-agent and the real siphon CLI.
// Through `siphon exec`: curl and busybox wget by short name, getent, dig
// SRV and TXT, a shell script's child, UDP, env, hostname, loopback local
// or remote, exit codes and signals, a failed connection, a transport cut
// in the middle of a download (byte-exact), the agent killed, nothing left
// afterwards, and the same as nobody (no TUN device for nobody here: its
// lookups go over TCP).
//
// Every address is local: the pod's are on its own loopback, the program's
// namespace routes everything into its loopback and TUN device, which
// siphon holds. Each kernel object has a unique name and an RAII owner.
// Without root every test skips with the reason.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/echo_server.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file
using fakes::EchoServer;

constexpr const char* kSkipReason =
    "needs root: creates a pod network namespace with services inside and runs siphon-agent, "
    "which enters another process's network namespace";

// The pod's addresses, on its own loopback (nothing outside the pod has a
// route to them: the program reaches them only through the agent).
constexpr const char* kWeb = "10.251.0.10";
constexpr const char* kDns = "10.251.0.53";
constexpr const char* kUdpEcho = "10.251.0.30";
constexpr const char* kFromHosts = "10.251.0.20";
constexpr const char* kSearch =
    "search default.svc.cluster.local svc.cluster.local cluster.local\n";

sockaddr_in addressOf(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

uint16_t portOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

std::string sha256Of(const std::string& path) {
  Result r = run({"sha256sum", path});
  return r.out.substr(0, 64);
}

class ExecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
    // nobody's run reads the token and the pod's files from here.
    ::chmod(dir_->path().c_str(), 0755);
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    ::chmod(token_file_.c_str(), 0644);
    netns_.emplace();
    ASSERT_TRUE(netns_->created());
    for (const char* addr : {kWeb, kDns, kUdpEcho}) {
      Result r = run({"ip", "-n", netns_->name(), "addr", "add", std::string(addr) + "/32", "dev",
                      "lo"});
      ASSERT_EQ(r.exit_code, 0) << r;
    }
    ASSERT_EQ(run({"ip", "-n", netns_->name(), "link", "set", "lo", "up"}).exit_code, 0);

    // The pod's root: what `siphon exec` shows the program at /etc.
    root_ = dir_->path() + "/root";
    for (const char* d : {"/etc", "/bin", "/www"}) std::filesystem::create_directories(root_ + d);
    std::filesystem::copy_file("/bin/busybox", root_ + "/bin/busybox");
    writeFile("/etc/resolv.conf",
              std::string(kSearch) + "nameserver " + kDns + "\noptions ndots:5\n");
    writeFile("/etc/hosts", std::string("127.0.0.1 localhost\n") + kFromHosts + " db-from-hosts\n");
    writeFile("/etc/hostname", "web-7d9f\n");
    writeFile("/www/file.txt", "hello from the pod\n");
    {
      // A download large enough to cut in the middle of.
      std::mt19937 rng(21);
      std::string big(48 << 20, '\0');
      for (auto& c : big) c = static_cast<char>(rng());
      writeFile("/www/big.bin", big);
    }

    // The pod's services.
    dns_ = spawn({"ip", "netns", "exec", netns_->name(), "dnsmasq", "--no-daemon", "--no-resolv",
                  "--no-hosts", "--bind-interfaces", std::string("--listen-address=") + kDns,
                  std::string("--address=/web.default.svc.cluster.local/") + kWeb,
                  "--srv-host=_http._tcp.web.default.svc.cluster.local,"
                  "web.default.svc.cluster.local,80",
                  "--txt-record=web.default.svc.cluster.local,hello txt"},
                 std::nullopt, -1, -1);
    web_ = spawn({"ip", "netns", "exec", netns_->name(), "/usr/bin/python3", "-m", "http.server",
                  "80", "--bind", kWeb, "--directory", root_ + "/www"},
                 std::nullopt, -1, -1);
    int udp = socketInNetns(netns_->name(), AF_INET, SOCK_DGRAM);
    ASSERT_GE(udp, 0);
    sockaddr_in ua = addressOf(kUdpEcho, 7);
    ASSERT_EQ(::bind(udp, reinterpret_cast<sockaddr*>(&ua), sizeof(ua)), 0) << std::strerror(errno);
    udp_echo_.emplace(udp, EchoServer::Kind::kDatagram);
    // The pod's own loopback service (a sidecar), for --remote-loopback.
    int sidecar = socketInNetns(netns_->name(), AF_INET, SOCK_STREAM);
    sockaddr_in sa = addressOf("127.0.0.1", 0);
    ASSERT_EQ(::bind(sidecar, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    ASSERT_EQ(::listen(sidecar, 16), 0);
    sidecar_port_ = portOf(sidecar);
    sidecar_.emplace(sidecar, EchoServer::Kind::kStream);
    waitForPodServices();

    // The target: a process in the pod's namespace and root, with its own
    // environment.
    pod_ = spawn({"ip", "netns", "exec", netns_->name(), "/usr/sbin/chroot", root_,
                  "/bin/busybox", "sleep", "600"},
                 std::vector<std::string>{"POD_SECRET=from-the-pod", "PATH=/pod/bin",
                                          "LANG=pod-lang"},
                 -1, -1);
    ASSERT_TRUE(eventually([&] { return comm(pod_.pid()) == "busybox"; }));
    agent_ = startAgent(&endpoint_);
    ASSERT_FALSE(endpoint_.empty());
  }

  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  static std::string comm(pid_t pid) {
    std::string c = readFile("/proc/" + std::to_string(pid) + "/comm");
    while (!c.empty() && c.back() == '\n') c.pop_back();
    return c;
  }
  template <typename F>
  static bool eventually(F f) {
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      if (f()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  void writeFile(const std::string& path, const std::string& content) {
    std::ofstream(root_ + path, std::ios::binary) << content;
    ::chmod((root_ + path).c_str(), 0644);
  }

  void waitForPodServices() {
    ASSERT_TRUE(eventually([&] {
      Result r = run({"ip", "netns", "exec", netns_->name(), "dig", "+short", "+time=1",
                      "+tries=1", std::string("@") + kDns, "web.default.svc.cluster.local"});
      return r.out.find(kWeb) != std::string::npos;
    })) << "dnsmasq in the pod never answered";
    ASSERT_TRUE(eventually([&] {
      Result r = run({"ip", "netns", "exec", netns_->name(), "curl", "-sf", "-m", "2",
                      std::string("http://") + kWeb + "/file.txt"});
      return r.exit_code == 0;
    })) << "the pod's HTTP service never answered";
  }

  std::unique_ptr<Agent> startAgent(std::string* endpoint) {
    auto agent = std::make_unique<Agent>(
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                 "--first-client-timeout", "0", "targeted", "--pid",
                                 std::to_string(pod_.pid())},
        cleanEnv(), dir_->path() + "/agent-" + randomHex(4) + ".log");
    EXPECT_TRUE(agent->ready(endpoint));
    return agent;
  }

  std::vector<std::string> siphon(const std::vector<std::string>& exec_args,
                                  const std::string& endpoint = "") const {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent",
                                     endpoint.empty() ? endpoint_ : endpoint, "--token-file",
                                     token_file_, "exec"};
    argv.insert(argv.end(), exec_args.begin(), exec_args.end());
    return argv;
  }
  Result exec(const std::vector<std::string>& args) const { return run(siphon(args)); }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::string root_;
  std::optional<NetNs> netns_;
  Child dns_, web_, pod_;
  std::optional<EchoServer> udp_echo_, sidecar_;
  uint16_t sidecar_port_ = 0;
  std::unique_ptr<Agent> agent_;
  std::string endpoint_;
};

TEST_F(ExecTest, ReachesThePodsServicesByShortName) {
  Result r = exec({"--", "curl", "-sS", "-m", "10", "http://web/file.txt"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "hello from the pod\n") << r;
  // A static binary (no libc to preload into) the same.
  r = exec({"busybox", "wget", "-qO-", "http://web/file.txt"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "hello from the pod\n") << r;
  // (No check that the address is unreachable without siphon: from this
  // namespace it would be sent off the machine by the default route.)
}

TEST_F(ExecTest, NamesResolveAsTheTargetResolvesThem) {
  Result r = exec({"getent", "hosts", "web", "db-from-hosts"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(std::string(kWeb) + " "));
  EXPECT_THAT(r.out, HasSubstr("web.default.svc.cluster.local"));
  EXPECT_THAT(r.out, HasSubstr(std::string(kFromHosts) + " "));
  // dig reads resolv.conf itself; SRV and TXT come from the pod's server.
  r = exec({"dig", "+short", "SRV", "_http._tcp.web.default.svc.cluster.local"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "0 0 80 web.default.svc.cluster.local.\n") << r;
  r = exec({"dig", "+short", "+tcp", "TXT", "web.default.svc.cluster.local"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "\"hello txt\"\n") << r;
  r = exec({"cat", "/etc/resolv.conf"});
  EXPECT_THAT(r.out, HasSubstr(kSearch));
  // This machine's own files are untouched.
  EXPECT_THAT(readFile("/etc/resolv.conf"), Not(HasSubstr(kSearch)));
}

TEST_F(ExecTest, AScriptsChildrenAreSteeredToo) {
  Result r = exec({"sh", "-c", "sh -c 'busybox wget -qO- http://web/file.txt' | tr a-z A-Z"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "HELLO FROM THE POD\n") << r;
}

TEST_F(ExecTest, UdpRequestAndAnswer) {
  const std::string program = std::string(R"(
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
for i in range(3):
    s.sendto(b"datagram %d" % i, (")") + kUdpEcho + R"(", 7))
    data, peer = s.recvfrom(100)
    print(data.decode(), peer[0], peer[1])
)";
  Result r = exec({"/usr/bin/python3", "-c", program});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, std::string("datagram 0 ") + kUdpEcho + " 7\ndatagram 1 " + kUdpEcho +
                       " 7\ndatagram 2 " + kUdpEcho + " 7\n")
      << r;
}

TEST_F(ExecTest, TheTargetsEnvironmentAndHostname) {
  Result r = exec({"--env", "EXTRA=set-here", "--", "sh", "-c",
                   "echo $POD_SECRET $LANG $EXTRA; echo $PATH; hostname"});
  EXPECT_EQ(r.exit_code, 0) << r;
  std::istringstream lines(r.out);
  std::string vars, path, host;
  std::getline(lines, vars);
  std::getline(lines, path);
  std::getline(lines, host);
  EXPECT_EQ(vars, "from-the-pod pod-lang set-here") << r;
  EXPECT_EQ(path, std::getenv("PATH")) << "PATH stays local";
  EXPECT_EQ(host, "web-7d9f");
  r = exec({"--env-exclude", "LANG", "--hostname", "mine", "--", "sh", "-c",
            "echo ${LANG-unset}; hostname"});
  EXPECT_EQ(r.out, std::string(std::getenv("LANG") ? std::getenv("LANG") : "unset") + "\nmine\n")
      << r;
}

TEST_F(ExecTest, LoopbackStaysLocalUnlessAskedOtherwise) {
  // A developer's side service on this machine's loopback.
  int local = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = addressOf("127.0.0.1", 0);
  ASSERT_EQ(::bind(local, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(local, 16), 0);
  const uint16_t local_port = portOf(local);
  EchoServer local_echo(local, EchoServer::Kind::kStream);
  auto echoVia = [&](std::vector<std::string> flags, uint16_t port) {
    flags.insert(flags.end(), {"--", "/usr/bin/python3", "-c",
                               "import socket,sys\n"
                               "s=socket.create_connection(('127.0.0.1'," +
                                   std::to_string(port) +
                                   "),timeout=10)\n"
                                   "s.sendall(b'ping');s.shutdown(1)\n"
                                   "print(s.recv(100).decode())\n"});
    return exec(flags);
  };
  Result r = echoVia({}, local_port);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "ping\n") << r;
  // The pod's sidecar on its loopback: with --remote-loopback, or a rule.
  r = echoVia({"--remote-loopback"}, sidecar_port_);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "ping\n") << r;
  r = echoVia({"--remote", "127.0.0.1:" + std::to_string(sidecar_port_)}, sidecar_port_);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "ping\n") << r;
}

TEST_F(ExecTest, ExitCodesAndSignals) {
  EXPECT_EQ(exec({"sh", "-c", "exit 7"}).exit_code, 7);
  EXPECT_EQ(exec({"sh", "-c", "kill -TERM $$"}).exit_code, 128 + SIGTERM);
  Result missing = exec({"/nonexistent/program"});
  EXPECT_EQ(missing.exit_code, 127) << missing;
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent/program"));
  // Signals to siphon go to the program, which decides.
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    Proc p(siphon({"sh", "-c",
                   "trap 'echo got $0; exit 9' " + std::to_string(sig) +
                       "; echo ready; while :; do sleep 0.1; done"}),
           cleanEnv());
    ASSERT_TRUE(p.readUntil([](const std::string& out, const std::string&) {
      return out.find("ready") != std::string::npos;
    }));
    p.signal(sig);
    EXPECT_EQ(p.finish(), 9) << "signal " << sig << "\n" << p.out << p.err;
    EXPECT_THAT(p.out, HasSubstr("got"));
  }
}

TEST_F(ExecTest, AConnectionTheAgentCannotMakeFailsAtOnce) {
  const auto start = Clock::now();
  Result r = exec({"curl", "-sS", "-m", "20", std::string("http://") + kWeb + ":81/"});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("reset")) << r;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << "not the curl timeout";
}

TEST_F(ExecTest, NothingIsLeftAfterTheProgram) {
  const std::string marker = "4" + std::to_string(::getpid() % 1000) + ".5";
  Result r = exec({"sh", "-c", "setsid sleep " + marker + "1 & sleep " + marker + "2 & echo ok"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(run({"pgrep", "-f", "sleep " + marker}).exit_code, 1)
      << "a process of the program outlived it: " << run({"pgrep", "-af", "sleep " + marker}).out;
  // Its session on the agent is gone: the next session is the only one.
  Result s = run({SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_, "sessions"});
  EXPECT_EQ(s.exit_code, 0) << s;
  EXPECT_EQ(std::count(s.out.begin(), s.out.end(), '\n'), 2) << "a header and this session\n"
                                                             << s.out;
}

TEST_F(ExecTest, ATransportCutInTheMiddleOfADownloadLosesNothing) {
  const std::string out = dir_->path() + "/download.bin";
  Proc p(siphon({"curl", "-sS", "-m", "60", "--limit-rate", "12M", "-o", out,
                 "http://web/big.bin"}),
         cleanEnv());
  // Once the download is well under way, cut the CLI's transport (the
  // socket of siphon's own namespace to the agent's port).
  ASSERT_TRUE(eventually([&] {
    std::error_code ec;
    return std::filesystem::exists(out) && std::filesystem::file_size(out, ec) > (8u << 20);
  }));
  const std::string port = endpoint_.substr(endpoint_.rfind(':') + 1);
  Result cut = run({"ss", "-K", "dst", "127.0.0.1", "dport", "=", ":" + port});
  EXPECT_EQ(cut.exit_code, 0) << cut;
  EXPECT_EQ(p.finish(), 0) << p.out << p.err;
  EXPECT_EQ(std::filesystem::file_size(out), 48u << 20);
  EXPECT_EQ(sha256Of(out), sha256Of(root_ + "/www/big.bin"));
  EXPECT_THAT(agent_->log(), HasSubstr("session_resumed"));
}

TEST_F(ExecTest, TheAgentLostStopsTheProgramAndSaysWhy) {
  std::string endpoint2;
  auto agent2 = startAgent(&endpoint2);
  Proc p(siphon({"sh", "-c", "trap 'echo stopped; exit 1' TERM; echo ready; while :; do sleep 0.1; done"},
                endpoint2),
         cleanEnv());
  ASSERT_TRUE(p.readUntil([](const std::string& out, const std::string&) {
    return out.find("ready") != std::string::npos;
  }));
  const auto start = Clock::now();
  agent2->child().kill();
  EXPECT_EQ(p.finish(), 3) << p.out << p.err;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(25));
  EXPECT_THAT(p.out, HasSubstr("stopped"));
  EXPECT_THAT(p.err, HasSubstr("stopping sh (SIGTERM)"));
}

TEST_F(ExecTest, JsonEventsForTools) {
  Result r = run({SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_, "--json",
                  "exec", "--", "busybox", "wget", "-qO-", "http://web/file.txt"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("{\"event\":\"started\""));
  EXPECT_THAT(r.err, HasSubstr("\"protocol\":\"tcp\",\"to\":\"10.251.0.10:80\",\"via\":\"target\","
                               "\"ok\":true"));
  EXPECT_THAT(r.err, HasSubstr("{\"event\":\"exited\",\"code\":0"));
}

TEST_F(ExecTest, AConfigFileHoldsTheSetUp) {
  const std::string config = dir_->file(
      "siphon.json", R"json({"env": {"FROM_FILE": "yes"}, "hostname": "from-file",
                             "command": ["sh", "-c", "echo $FROM_FILE $(hostname)"]})json");
  Result r = exec({"-f", config});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "yes from-file\n");
  // A flag wins over the file.
  r = exec({"-f", config, "--hostname", "flag"});
  EXPECT_EQ(r.out, "yes flag\n");
  const std::string bad = dir_->file("bad.json", R"({"hostnme": "x"})");
  r = exec({"-f", bad, "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("unknown option \"hostnme\""));
}

// The unprivileged path: nobody, in a user namespace of its own. No TUN
// device is open to nobody here (/dev/net/tun is 0600), so UDP stays in the
// program's namespace and its lookups go over TCP.
TEST_F(ExecTest, AsNobody) {
  std::vector<std::string> argv = {"setpriv", "--reuid=nobody", "--regid=nogroup",
                                   "--clear-groups"};
  for (const auto& a : siphon({"sh", "-c", "id -u; curl -sS -m 10 http://web/file.txt; "
                                           "getent hosts web; echo $POD_SECRET"})) {
    argv.push_back(a);
  }
  Result r = run(argv);
  if (r.exit_code != 0 && r.err.find("user namespace") != std::string::npos) {
    GTEST_SKIP() << "unprivileged user namespaces are off here: " << r.err;
  }
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("65534\nhello from the pod\n"));
  EXPECT_THAT(r.out, HasSubstr(std::string(kWeb) + " "));
  EXPECT_THAT(r.out, HasSubstr("from-the-pod"));
}

}  // namespace
}  // namespace siphon
