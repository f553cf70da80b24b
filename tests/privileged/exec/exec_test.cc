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
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/echo_server.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon {
namespace {

using ::testing::AnyOf;
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
    // siphon's TMPDIR (its staging directories): this test's own, so that
    // what it checks is left of its runs is not another test's, running
    // beside it. Open to nobody's runs, as /tmp is.
    tmp_ = dir_->path() + "/tmp";
    std::filesystem::create_directories(tmp_);
    ::chmod(tmp_.c_str(), 01777);
    netns_.emplace();
    ASSERT_TRUE(netns_->created());
    for (const char* addr : {kWeb, kDns, kUdpEcho}) {
      Result r =
          run({"ip", "-n", netns_->name(), "addr", "add", std::string(addr) + "/32", "dev", "lo"});
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
                  // A nameserver on the pod's loopback too (a DNS sidecar).
                  "--listen-address=127.0.0.1",
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
    pod_ =
        spawn({"ip", "netns", "exec", netns_->name(), "/usr/sbin/chroot", root_, "/bin/busybox",
               "sleep", "600"},
              std::vector<std::string>{"POD_SECRET=from-the-pod", "PATH=/pod/bin", "LANG=pod-lang"},
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
      Result r = run({"ip", "netns", "exec", netns_->name(), "dig", "+short", "+time=1", "+tries=1",
                      std::string("@") + kDns, "web.default.svc.cluster.local"});
      return r.out.find(kWeb) != std::string::npos;
    })) << "dnsmasq in the pod never answered";
    ASSERT_TRUE(eventually([&] {
      Result r = run({"ip", "netns", "exec", netns_->name(), "curl", "-sf", "-m", "2",
                      std::string("http://") + kWeb + "/file.txt"});
      return r.exit_code == 0;
    })) << "the pod's HTTP service never answered";
  }

  // An agent for the pod process (or `target`, another process).
  std::unique_ptr<Agent> startAgent(std::string* endpoint,
                                    const std::vector<std::string>& extra = {}, pid_t target = 0) {
    std::vector<std::string> argv = {
        "--listen", "127.0.0.1:0", "--token-file", token_file_, "--first-client-timeout", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (const std::string& a : {std::string("targeted"), std::string("--pid"),
                                 std::to_string(target != 0 ? target : pod_.pid())}) {
      argv.push_back(a);
    }
    auto agent =
        std::make_unique<Agent>(argv, cleanEnv(), dir_->path() + "/agent-" + randomHex(4) + ".log");
    EXPECT_TRUE(agent->ready(endpoint));
    return agent;
  }

  std::vector<std::string> siphon(const std::vector<std::string>& exec_args,
                                  const std::string& endpoint = "") const {
    std::vector<std::string> argv = {"env",
                                     "TMPDIR=" + tmp_,
                                     SIPHON_CLI_BIN,
                                     "--agent",
                                     endpoint.empty() ? endpoint_ : endpoint,
                                     "--token-file",
                                     token_file_,
                                     "exec"};
    argv.insert(argv.end(), exec_args.begin(), exec_args.end());
    return argv;
  }
  Result exec(const std::vector<std::string>& args) const { return run(siphon(args)); }

  // Why nobody cannot run this build's CLI with this test's token, or "".
  // A tree under a directory closed to other users (a clone in `mktemp -d`,
  // mode 0700) is one: the tests as nobody then say so and skip.
  std::string nobodyCannotRunTheCli() const {
    Result r = run({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sh", "-c",
                    "test -x \"$0\" || { echo \"cannot execute $0\"; exit 1; }; "
                    "test -r \"$1\" || { echo \"cannot read $1\"; exit 1; }",
                    SIPHON_CLI_BIN, token_file_});
    if (r.exit_code == 0) return "";
    return "nobody (uid 65534) " + (r.out.empty() ? r.err : r.out) +
           ": a directory above it is closed to other users";
  }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::string tmp_;
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

// A pod whose nameserver is on its own loopback (a DNS sidecar, a local
// cache): the program's lookups go there, not to this machine's loopback.
TEST_F(ExecTest, ANameserverOnThePodsLoopbackIsThePods) {
  writeFile("/etc/resolv.conf", std::string(kSearch) + "nameserver 127.0.0.1\noptions ndots:5\n");
  Result r = exec({"getent", "hosts", "web"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(std::string(kWeb) + " ")) << r;
  r = exec({"dig", "+short", "web.default.svc.cluster.local"});  // UDP
  EXPECT_EQ(r.out, std::string(kWeb) + "\n") << r;
  r = exec({"dig", "+short", "+tcp", "TXT", "web.default.svc.cluster.local"});
  EXPECT_EQ(r.out, "\"hello txt\"\n") << r;
  r = exec({"cat", "/etc/resolv.conf"});
  EXPECT_THAT(r.out, HasSubstr("nameserver 198.18.0.53  # the target's 127.0.0.1\n"));
}

// Issue 40: a target without /etc/hosts (a FROM scratch image run outside
// Kubernetes) is one with no entries, as libc reads a missing file: the
// program runs, told in one line. Without resolv.conf too, the resolver's
// defaults: a nameserver on the target's loopback (the pod's dnsmasq
// listens there), no search domains.
TEST_F(ExecTest, ATargetWithoutHostsOrResolvConfIsAsLibcReadsIt) {
  std::filesystem::remove(root_ + "/etc/hosts");
  Result r = exec({"sh", "-c", "getent hosts web; wc -c < /etc/hosts"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(std::string(kWeb) + " ")) << r;
  EXPECT_THAT(r.out, HasSubstr("\n0\n")) << "an empty hosts, not this machine's: " << r;
  EXPECT_THAT(r.err, HasSubstr("exec: the target's /etc/hosts: No such file or directory; the "
                               "program's has no entries"))
      << r;

  std::filesystem::remove(root_ + "/etc/resolv.conf");
  r = exec({"sh", "-c", "getent hosts web.default.svc.cluster.local; cat /etc/resolv.conf"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr(std::string(kWeb) + " ")) << r;
  EXPECT_THAT(r.out, HasSubstr("nameserver 198.18.0.53  # the target's 127.0.0.1")) << r;
  EXPECT_THAT(r.err, HasSubstr("exec: the target's /etc/resolv.conf: No such file or directory; "
                               "the program's has the resolver's defaults"))
      << r;
  // The JSON form of the same.
  r = run({"env", "TMPDIR=" + tmp_, SIPHON_CLI_BIN, "--json", "--agent", endpoint_, "--token-file",
           token_file_, "exec", "--", "true"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr(R"({"event":"target_file","path":"/etc/hosts")")) << r;
}

// Issue 40: nothing of siphon's reaches the program: its connection to the
// agent and its other sockets are not close-on-exec (Asio's), and used to
// be the program's (`ls -l /proc/self/fd` showed a socket), a way to this
// machine's network namespace and to the session's frames. The program
// holds 0, 1, 2 and what --keep-fd gives it, a descriptor siphon was
// started without is /dev/null, never one of siphon's.
TEST_F(ExecTest, TheProgramHoldsOnlyItsStreamsAndWhatItIsGiven) {
  const std::string list = "ls /proc/$$/fd; ls -l /proc/$$/fd >&2; ";
  // fd 7 given to siphon but not named: not the program's.
  std::vector<std::string> with7 = {"sh", "-c", "exec 7< /etc/hostname; exec \"$@\"", "sh"};
  auto argv = siphon({"sh", "-c", list + ":"});
  argv.insert(argv.begin(), with7.begin(), with7.end());
  Result r = run(argv);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "0\n1\n2\n") << r;
  // Named: at the same number, readable.
  argv = siphon({"--keep-fd", "7", "--", "sh", "-c", list + "cat <&7"});
  argv.insert(argv.begin(), with7.begin(), with7.end());
  r = run(argv);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "0\n1\n2\n7\n" + readFile("/etc/hostname")) << r;
  // One siphon was not given is an error before anything runs.
  r = exec({"--keep-fd", "7", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--keep-fd 7: siphon was not given descriptor 7")) << r;
  // siphon started without a stdin: the program's is /dev/null, not the
  // socket that would have taken number 0.
  argv = siphon({"sh", "-c", "ls -l /proc/$$/fd/0; " + list + ":"});
  argv.insert(argv.begin(), {"sh", "-c", "exec 0<&-; exec \"$@\"", "sh"});
  r = run(argv);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("-> /dev/null\n0\n1\n2\n")) << r;
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
    s.sendto(b"datagram %d" % i, (")") +
                              kUdpEcho + R"(", 7))
    data, peer = s.recvfrom(100)
    print(data.decode(), peer[0], peer[1])
)";
  Result r = exec({"/usr/bin/python3", "-c", program});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, std::string("datagram 0 ") + kUdpEcho + " 7\ndatagram 1 " + kUdpEcho +
                       " 7\ndatagram 2 " + kUdpEcho + " 7\n")
      << r;
}

// A burst on a new flow (a resolver's first queries): every datagram is
// held until the agent's side of the flow exists, none dropped (siphon
// used to keep 64). 150: what a default socket buffer here holds of small
// datagrams, on each side, without the kernel dropping some.
TEST_F(ExecTest, ABurstOnANewUdpFlowArrivesWhole) {
  const std::string program = std::string(R"(
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.settimeout(10)
for i in range(150):
    s.sendto(b"burst %d" % i, (")") +
                              kUdpEcho + R"(", 7))
got = set()
try:
    while len(got) < 150:
        got.add(s.recv(100))
except socket.timeout:
    pass
print(len(got))
)";
  Result r = exec({"/usr/bin/python3", "-c", program});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "150\n") << r;
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

// Issue 40: a pod's environment must not choose the code that runs on the
// developer's machine. A target whose env has BASH_ENV (a script that
// would leave a marker here) and LD_PRELOAD: neither reaches the program,
// one line names them, and --env-allow takes one anyway.
TEST_F(ExecTest, TheTargetsLoaderAndShellVariablesAreNotTaken) {
  const std::string marker = dir_->path() + "/bash-env-ran";
  const std::string script = dir_->file("bash_env.sh", "echo sourced > " + marker + "\n");
  ::chmod(script.c_str(), 0644);
  const std::string preload = "/nonexistent/siphon-test-preload.so";
  Child pod = spawn({"ip", "netns", "exec", netns_->name(), "/usr/sbin/chroot", root_,
                     "/bin/busybox", "sleep", "600"},
                    std::vector<std::string>{"POD_SECRET=from-the-pod", "BASH_ENV=" + script,
                                             "LD_PRELOAD=" + preload, "PATH=/pod/bin"},
                    -1, -1);
  ASSERT_TRUE(eventually([&] { return comm(pod.pid()) == "busybox"; }));
  std::string endpoint;
  auto agent = startAgent(&endpoint, {}, pod.pid());
  ASSERT_FALSE(endpoint.empty());
  const std::string program = "echo ${LD_PRELOAD-unset} $POD_SECRET";
  Result r = run(siphon({"--", "/bin/bash", "-c", program}, endpoint));
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "unset from-the-pod\n") << r;
  EXPECT_FALSE(std::filesystem::exists(marker)) << "bash sourced the target's BASH_ENV";
  EXPECT_THAT(r.err, HasSubstr("exec: the target's BASH_ENV, LD_PRELOAD left out")) << r;
  EXPECT_THAT(r.err, Not(HasSubstr("cannot be preloaded"))) << r;
  r = run({"env", "TMPDIR=" + tmp_, SIPHON_CLI_BIN, "--json", "--agent", endpoint, "--token-file",
           token_file_, "exec", "--", "true"});
  EXPECT_THAT(r.err, HasSubstr(R"({"event":"env_left_out","names":"BASH_ENV, LD_PRELOAD"})")) << r;

  // Taken when asked for: bash sources it; the loader is given the library.
  r = run(siphon({"--env-allow", "BASH_ENV", "--", "/bin/bash", "-c", program}, endpoint));
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_TRUE(std::filesystem::exists(marker)) << r;
  EXPECT_THAT(r.err, HasSubstr("exec: the target's LD_PRELOAD left out")) << r;
  r = run(siphon({"--env-allow", "LD_*", "--", "/bin/bash", "-c", program}, endpoint));
  EXPECT_EQ(r.out, preload + " from-the-pod\n") << r;
  EXPECT_THAT(r.err, HasSubstr("cannot be preloaded")) << "ld.so was given it: " << r;
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
  // The program's connect completed in its own namespace (the redirect's
  // listener answers at once); the refusal comes as a reset, which curl
  // reports as a failed connect or a reset by when it reads it.
  EXPECT_THAT(r.err, AnyOf(HasSubstr("reset"), HasSubstr("Couldn't connect"))) << r;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15)) << "not the curl timeout";
}

Result podGet(const NetNs& pod, uint16_t port, const std::string& path,
              std::vector<std::string> extra = {});
bool says(Proc& p, const std::string& err_part, const std::string& out_part = "");
extern const char* const kProgramServer;
std::string readlinkOf(const std::string& path) {
  std::error_code ec;
  return std::filesystem::read_symlink(path, ec).string();
}

// Every process whose namespace is `ns` ("net:[4026532243]").
std::vector<std::string> processesIn(const std::string& kind, const std::string& ns) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code link_ec;
    const auto target = std::filesystem::read_symlink(entry.path() / "ns" / kind, link_ec);
    if (!link_ec && target.string() == ns) out.push_back(name);
  }
  return out;
}

TEST_F(ExecTest, NothingIsLeftAfterTheProgram) {
  const std::string marker = "4" + std::to_string(::getpid() % 1000) + ".5";
  // With a port stolen, so the connector runs too. The program waits for a
  // line on its stdin: meanwhile the test holds its namespaces open, so
  // their inode numbers cannot be given to a namespace a test running
  // beside this one makes after the program's ended.
  Proc p(
      siphon({"--steal", "80:18080", "--", "sh", "-c",
              "echo $$; setsid sleep " + marker + "1 & sleep " + marker + "2 & read go; echo ok"}),
      cleanEnv());
  ASSERT_TRUE(p.readUntil([](const std::string& out, const std::string&) {
    return out.find('\n') != std::string::npos;
  })) << p.out
      << p.err;
  const std::string pid = p.out.substr(0, p.out.find('\n'));
  Fd net_fd(::open(("/proc/" + pid + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  Fd mnt_fd(::open(("/proc/" + pid + "/ns/mnt").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(net_fd.get(), 0) << pid << ": " << strerror(errno);
  ASSERT_GE(mnt_fd.get(), 0) << pid << ": " << strerror(errno);
  const std::string net = readlinkOf("/proc/" + pid + "/ns/net");
  const std::string mnt = readlinkOf("/proc/" + pid + "/ns/mnt");
  p.closeStdin();
  EXPECT_EQ(p.finish(), 0) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr("ok"));
  ASSERT_THAT(net, HasSubstr("net:["));
  EXPECT_NE(net, readlinkOf("/proc/self/ns/net")) << "the program had a namespace of its own";
  EXPECT_THAT(processesIn("net", net), ::testing::IsEmpty()) << "a process kept its namespace";
  EXPECT_THAT(processesIn("mnt", mnt), ::testing::IsEmpty()) << "a process kept its mounts";
  // The port is the application's again.
  Result got = podGet(*netns_, 80, "/file.txt");
  EXPECT_EQ(got.out, "hello from the pod\n") << got;
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
  Proc p(
      siphon({"curl", "-sS", "-m", "60", "--limit-rate", "12M", "-o", out, "http://web/big.bin"}),
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
  Proc p(siphon({"sh", "-c",
                 "trap 'echo stopped; exit 1' TERM; echo ready; while :; do sleep 0.1; done"},
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

// siphon killed (SIGKILL: no handler runs): the program does not run on
// unsteered and unseen; it gets SIGTERM, and SIGKILL if it stays.
TEST_F(ExecTest, SiphonKilledStopsTheProgram) {
  for (const char* trap : {"", "trap '' TERM; "}) {
    Proc p(siphon({"sh", "-c", std::string(trap) + "echo $$; while :; do sleep 0.1; done"}),
           cleanEnv());
    ASSERT_TRUE(p.readUntil([](const std::string& out, const std::string&) {
      return out.find('\n') != std::string::npos;
    })) << p.err;
    const pid_t program = std::stoi(p.out);
    ASSERT_EQ(::kill(program, 0), 0);
    p.signal(SIGKILL);
    p.finish();
    // Gone, or a zombie nobody reaped yet.
    EXPECT_TRUE(eventually([&] {
      return ::kill(program, 0) != 0 ||
             readFile("/proc/" + std::to_string(program) + "/stat").find(") Z ") !=
                 std::string::npos;
    })) << "the program outlived siphon"
        << (trap[0] ? " (ignoring SIGTERM)" : "");
  }
}

TEST_F(ExecTest, JsonEventsForTools) {
  Result r = run({SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_, "--json",
                  "exec", "--", "busybox", "wget", "-qO-", "http://web/file.txt"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("{\"event\":\"started\""));
  EXPECT_THAT(r.err, HasSubstr("\"protocol\":\"tcp\",\"to\":\"10.251.0.10:80\",\"via\":\"target\","
                               "\"ok\":true"));
  EXPECT_THAT(r.err, HasSubstr("{\"event\":\"exited\",\"code\":0"));
  // Incoming: the port taken, a stolen connection, the port given back.
  Proc p({SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_, "--json", "exec",
          "--steal", "80:18080", "--", "/usr/bin/python3", "-c", kProgramServer, "18080"},
         cleanEnv());
  ASSERT_TRUE(says(p, "{\"event\":\"subscribed\",\"mode\":\"steal\",\"port\":80,\"local\":18080",
                   "listening"))
      << p.err;
  Result got = podGet(*netns_, 80, "/json");
  EXPECT_EQ(got.out, "from the program /json\n") << got;
  p.signal(SIGTERM);
  EXPECT_EQ(p.finish(), 128 + SIGTERM);
  EXPECT_THAT(p.err, HasSubstr("\"direction\":\"incoming\""));
  EXPECT_THAT(p.err, HasSubstr("\"port\":80,\"local\":18080,\"ok\":true}"));
  EXPECT_THAT(p.err, HasSubstr("{\"event\":\"released\",\"port\":80}"));
}

TEST_F(ExecTest, AConfigFileHoldsTheSetUp) {
  const std::string config =
      dir_->file("siphon.json", R"json({"env": {"FROM_FILE": "yes"}, "hostname": "from-file",
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

// ------------------------------------------------------------ incoming

// The program's HTTP server for the incoming tests: "from the program
// PATH" for every GET, on 127.0.0.1:PORT (argv[1]) of its namespace.
const char* const kProgramServer = R"(
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("from the program " + self.path + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
print("listening", flush=True)
s.serve_forever()
)";

// A client of the pod's, in the pod's namespace (the steal takes it as any
// other connection to the port).
Result podGet(const NetNs& pod, uint16_t port, const std::string& path,
              std::vector<std::string> extra) {
  std::vector<std::string> argv = {"ip", "netns", "exec", pod.name(), "curl", "-sS", "-m", "10"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(std::string("http://") + kWeb + ":" + std::to_string(port) + path);
  return run(argv);
}

bool says(Proc& p, const std::string& err_part, const std::string& out_part) {
  return p.readUntil([&](const std::string& out, const std::string& err) {
    return err.find(err_part) != std::string::npos &&
           (out_part.empty() || out.find(out_part) != std::string::npos);
  });
}

TEST_F(ExecTest, StolenConnectionsReachTheProgramsListener) {
  Proc p(siphon({"--steal", "80:18080", "--", "/usr/bin/python3", "-c", kProgramServer, "18080"}),
         cleanEnv());
  ASSERT_TRUE(says(p, "exec: stealing port 80 -> the program's port 18080", "listening"))
      << p.out << p.err;
  Result r = podGet(*netns_, 80, "/file.txt");
  EXPECT_EQ(r.out, "from the program /file.txt\n") << r << p.err;
  // Another request, another connection: each is the program's.
  r = podGet(*netns_, 80, "/again");
  EXPECT_EQ(r.out, "from the program /again\n") << r << p.err;
  p.signal(SIGTERM);
  EXPECT_EQ(p.finish(), 128 + SIGTERM) << p.out << p.err;
  // Given back with the program's end: the application answers again.
  r = podGet(*netns_, 80, "/file.txt");
  EXPECT_EQ(r.out, "hello from the pod\n") << r << p.err;
}

TEST_F(ExecTest, AFilteredStealTakesOnlyTheMatchingRequests) {
  Proc p(siphon({"--steal", "80:18080", "--filter-header", "x-user: ^alice$", "--",
                 "/usr/bin/python3", "-c", kProgramServer, "18080"}),
         cleanEnv());
  ASSERT_TRUE(says(p, "exec: stealing HTTP requests to port 80", "listening")) << p.out << p.err;
  Result r = podGet(*netns_, 80, "/file.txt", {"-H", "x-user: alice"});
  EXPECT_EQ(r.out, "from the program /file.txt\n") << r << p.err;
  r = podGet(*netns_, 80, "/file.txt", {"-H", "x-user: bob"});
  EXPECT_EQ(r.out, "hello from the pod\n") << r << p.err;
  r = podGet(*netns_, 80, "/file.txt");
  EXPECT_EQ(r.out, "hello from the pod\n") << r << p.err;
  p.signal(SIGINT);
  EXPECT_EQ(p.finish(), 128 + SIGINT) << p.out << p.err;
}

TEST_F(ExecTest, IncomingStealTakesAndGivesBackThePortsTheProgramListensOn) {
  const std::string base = kProgramServer;
  const std::string program = base.substr(0, base.find("s.serve_forever()")) +
                              "s.handle_request()\ns.server_close()\nprint('closed', flush=True)\n"
                              "import time\ntime.sleep(60)\n";
  Proc p(siphon({"--incoming", "steal", "--", "/usr/bin/python3", "-c", program, "18081"}),
         cleanEnv());
  ASSERT_TRUE(says(p, "-> the program's port 18081 (backend", "listening")) << p.out << p.err;
  EXPECT_THAT(p.err, HasSubstr("while the program listens"));
  // siphon's own listeners in the program's namespace are not taken.
  EXPECT_THAT(p.err, Not(HasSubstr("stealing port 0")));
  EXPECT_EQ(std::count(p.err.begin(), p.err.end(), '\n'), 1) << p.err;
  Result r = podGet(*netns_, 18081, "/auto");
  EXPECT_EQ(r.out, "from the program /auto\n") << r << p.err;
  ASSERT_TRUE(says(p, "exec: port 18081 given back (the program stopped listening)", "closed"))
      << p.out << p.err;
  // Nothing takes the port now: the pod has no listener there.
  r = podGet(*netns_, 18081, "/auto");
  EXPECT_NE(r.exit_code, 0) << r << p.err;
  p.signal(SIGTERM);
  EXPECT_EQ(p.finish(), 128 + SIGTERM) << p.out << p.err;
}

TEST_F(ExecTest, MirroredConnectionsReachTheProgramAsACopy) {
  // Takes one connection and prints its first line: the copy of the
  // request the application answers.
  constexpr const char* kSink = R"(
import socket
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 18083))
l.listen(8)
print("listening", flush=True)
c, _ = l.accept()
data = b""
while b"\r\n" not in data:
    chunk = c.recv(4096)
    if not chunk:
        break
    data += chunk
print("copy:", data.split(b"\r\n")[0].decode(), flush=True)
)";
  Proc p(siphon({"--mirror", "80:18083", "--", "/usr/bin/python3", "-c", kSink}), cleanEnv());
  ASSERT_TRUE(says(p, "exec: mirroring port 80 -> the program's port 18083", "listening"))
      << p.out << p.err;
  // The application still answers: a mirror only copies.
  Result r = podGet(*netns_, 80, "/file.txt");
  EXPECT_EQ(r.out, "hello from the pod\n") << r << p.err;
  EXPECT_EQ(p.finish(), 0) << p.out << p.err;
  EXPECT_THAT(p.out, HasSubstr("copy: GET /file.txt HTTP/1.1"));
}

TEST_F(ExecTest, ABusyPortFailsTheRunBeforeTheProgramRuns) {
  Proc holder(siphon({"--steal", "80:18080", "--", "sleep", "60"}), cleanEnv());
  ASSERT_TRUE(says(holder, "exec: stealing port 80")) << holder.err;
  const std::string marker = dir_->path() + "/ran";
  Result r = exec({"--steal", "80", "--", "touch", marker});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("exec: steal port 80: "));
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the program ran";
  holder.signal(SIGTERM);
  EXPECT_EQ(holder.finish(), 128 + SIGTERM);
}

TEST_F(ExecTest, BadIncomingFlagsAreOneLine) {
  Result r = exec({"--steal", "80:http", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("\"http\" is not a port"));
  r = exec({"--incoming", "sometimes", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--incoming sometimes: not steal, mirror or off"));
  r = exec({"--mirror", "80", "--filter-path", "^/api", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("--filter-* applies to stolen ports"));
}

// Two agents on the target: the first one killed, the session moves to the
// second, the steal is made again there, and the program's new
// connections and the target's traffic keep reaching where they should.
TEST_F(ExecTest, AFailoverMovesTheStealAndNewConnectionsWork) {
  std::string endpoint2;
  auto agent2 = startAgent(&endpoint2);
  std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent",      endpoint2,   "--agent",
                                   endpoint_,      "--token-file", token_file_, "exec",
                                   "--steal",      "80:18080",     "--",        "/usr/bin/python3",
                                   "-c",           kProgramServer, "18080"};
  Proc p(argv, cleanEnv());
  ASSERT_TRUE(says(p, "exec: stealing port 80", "listening")) << p.out << p.err;
  Result r = podGet(*netns_, 80, "/before");
  EXPECT_EQ(r.out, "from the program /before\n") << r << p.err;
  agent2->child().kill();
  ASSERT_TRUE(says(p, "exec: moved to agent " + endpoint_)) << p.err;
  // The steal is back on the second agent: the target's traffic still
  // reaches the program (the first agent's steal died with it).
  bool stolen = false;
  for (int i = 0; i < 100 && !stolen; ++i) {
    stolen = podGet(*netns_, 80, "/after").out == "from the program /after\n";
    if (!stolen) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(stolen) << p.err;
  EXPECT_THAT(p.err, Not(HasSubstr("is not stolen on agent")));
  p.signal(SIGTERM);
  EXPECT_EQ(p.finish(), 128 + SIGTERM) << p.out << p.err;
}

// The program's own outgoing connections go on through the second agent.
TEST_F(ExecTest, AfterAFailoverTheProgramsNewConnectionsGoThroughTheOtherAgent) {
  std::string endpoint2;
  auto agent2 = startAgent(&endpoint2);
  std::vector<std::string> argv = {SIPHON_CLI_BIN,
                                   "--agent",
                                   endpoint2,
                                   "--agent",
                                   endpoint_,
                                   "--token-file",
                                   token_file_,
                                   "exec",
                                   "--",
                                   "sh",
                                   "-c",
                                   "busybox wget -qO- http://web/file.txt; echo ready; read line; "
                                   "busybox wget -qO- http://web/file.txt"};
  Proc p(argv, cleanEnv());
  ASSERT_TRUE(p.readUntil([](const std::string& out, const std::string&) {
    return out.find("ready") != std::string::npos;
  })) << p.err;
  agent2->child().kill();
  ASSERT_TRUE(says(p, "exec: moved to agent " + endpoint_)) << p.err;
  p.write("go\n");
  EXPECT_EQ(p.finish(), 0) << p.out << p.err;
  EXPECT_EQ(p.out, "hello from the pod\nready\nhello from the pod\n");
}

// ------------------------------------------------------------ files

// Mounts of this test's runs in this machine's tree (their staging
// directories are under tmp_), and staging directories left.
std::string siphonMountsHere(const std::string& tmp) {
  std::string out;
  std::istringstream in(readFile("/proc/self/mountinfo"));
  for (std::string line; std::getline(in, line);) {
    if (line.find("fuse.siphon") != std::string::npos &&
        line.find(" " + tmp + "/") != std::string::npos) {
      out += line + "\n";
    }
  }
  return out;
}
std::set<std::string> stagingDirs(const std::string& tmp) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    if (e.path().filename().string().rfind("siphon-exec-fs-", 0) == 0) out.insert(e.path());
  }
  return out;
}

// The serviceaccount path does not exist on this machine: it is made in
// the program's view only, next to what /var/run holds here.
TEST_F(ExecTest, FsRemoteShowsTheTargetsFilesAtTheSamePath) {
  const std::string sa = "/var/run/secrets/kubernetes.io/serviceaccount";
  ASSERT_FALSE(std::filesystem::exists(sa)) << "this machine has " << sa;
  std::filesystem::create_directories(root_ + sa);
  writeFile(sa + "/token", "eyJhbGciOi.pod-token\n");
  writeFile(sa + "/namespace", "default\n");
  // An entry of this machine's /var/run the program must still see.
  std::string local_entry;
  for (const auto& e : std::filesystem::directory_iterator("/var/run")) {
    if (e.path().filename() != "secrets") local_entry = e.path().filename();
  }
  Result r = exec({"--fs-remote", sa, "--", "sh", "-c",
                   "cat " + sa + "/token " + sa + "/namespace; ls /var/run"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, ::testing::StartsWith("eyJhbGciOi.pod-token\ndefault\n")) << r;
  EXPECT_THAT(r.out, HasSubstr("\nsecrets\n")) << r;
  if (!local_entry.empty()) {
    EXPECT_THAT(r.out, HasSubstr(local_entry + "\n")) << r;
  }
  // Nothing of it here: not the path, not the mount, not its directories.
  EXPECT_FALSE(std::filesystem::exists("/var/run/secrets"));
  EXPECT_EQ(siphonMountsHere(tmp_), "");
  EXPECT_EQ(stagingDirs(tmp_), std::set<std::string>{});
}

// A path this machine has is covered in the program's view, even one the
// set-up itself runs from (ip and iptables are in /usr/sbin here): the
// target's files come last.
TEST_F(ExecTest, FsRemoteCoversAPathThisMachineHas) {
  std::filesystem::create_directories(root_ + "/usr/sbin");
  writeFile("/usr/sbin/from-the-pod", "pod's sbin\n");
  Result r = exec({"--fs-remote", "/usr/sbin", "--", "sh", "-c",
                   "cat /usr/sbin/from-the-pod; test -e /usr/sbin/iptables || echo covered"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "pod's sbin\ncovered\n") << r;
  EXPECT_TRUE(std::filesystem::exists("/usr/sbin/iptables")) << "this machine's is untouched";
  EXPECT_FALSE(std::filesystem::exists("/usr/sbin/from-the-pod"));
  EXPECT_EQ(siphonMountsHere(tmp_), "");
}

TEST_F(ExecTest, FsRootShowsTheWholeRootAndWritesReachTheTarget) {
  std::string endpoint;
  auto rw = startAgent(&endpoint, {"--fs-mode", "rw"});
  const std::string at = "/tmp/siphon-exec-root-" + randomHex(6);
  std::vector<std::string> argv =
      siphon({"--fs-root", at, "--", "sh", "-c",
              "cat " + at + "/www/file.txt " + at + "/etc/hostname && echo written > " + at +
                  "/www/new.txt && ls " + at + "/bin"},
             endpoint);
  Result r = run(argv);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "hello from the pod\nweb-7d9f\nbusybox\n") << r;
  EXPECT_EQ(readFile(root_ + "/www/new.txt"), "written\n") << "the target sees the write at once";
  EXPECT_FALSE(std::filesystem::exists(at));
  // --fs-ro: the same mount read-only.
  argv = siphon({"--fs-root", at, "--fs-ro", "--", "sh", "-c", "echo no > " + at + "/www/ro.txt"},
                endpoint);
  r = run(argv);
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("Read-only file system")) << r;
  EXPECT_FALSE(std::filesystem::exists(root_ + "/www/ro.txt"));
  EXPECT_EQ(siphonMountsHere(tmp_), "");
}

TEST_F(ExecTest, AMissingRemotePathIsOneLine) {
  const std::string marker = dir_->path() + "/ran";
  Result r = exec({"--fs-remote", "/etc/no-such-config", "--", "touch", marker});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("exec: --fs-remote /etc/no-such-config: ")) << r;
  EXPECT_FALSE(std::filesystem::exists(marker)) << "the program ran";
  r = exec({"--fs-remote", "relative/path", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("an absolute path")) << r;
  EXPECT_EQ(siphonMountsHere(tmp_), "");
}

// The unprivileged path: nobody, in a user namespace of its own. No TUN
// device is open to nobody here (/dev/net/tun is 0600), so UDP stays in the
// program's namespace and its lookups go over TCP.
TEST_F(ExecTest, AsNobody) {
  if (std::string why = nobodyCannotRunTheCli(); !why.empty()) GTEST_SKIP() << why;
  std::vector<std::string> argv = {"setpriv", "--reuid=nobody", "--regid=nogroup",
                                   "--clear-groups"};
  for (const auto& a : siphon({"sh", "-c",
                               "id -u; curl -sS -m 10 http://web/file.txt; "
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

// Incoming traffic as nobody: the connector reaches the program's listener
// in a namespace nobody owns through its user namespace.
TEST_F(ExecTest, AsNobodyTheProgramAnswersTheStolenPort) {
  if (std::string why = nobodyCannotRunTheCli(); !why.empty()) GTEST_SKIP() << why;
  std::vector<std::string> argv = {"setpriv", "--reuid=nobody", "--regid=nogroup",
                                   "--clear-groups"};
  for (const auto& a :
       siphon({"--steal", "80:18080", "--", "/usr/bin/python3", "-c", kProgramServer, "18080"})) {
    argv.push_back(a);
  }
  Proc p(argv, cleanEnv());
  const bool up = says(p, "exec: stealing port 80", "listening");
  if (!up && p.err.find("user namespace") != std::string::npos) {
    GTEST_SKIP() << "unprivileged user namespaces are off here: " << p.err;
  }
  ASSERT_TRUE(up) << p.out << p.err;
  Result r = podGet(*netns_, 80, "/as-nobody");
  EXPECT_EQ(r.out, "from the program /as-nobody\n") << r << p.err;
  p.signal(SIGTERM);
  EXPECT_EQ(p.finish(), 128 + SIGTERM) << p.out << p.err;
}

// A user without FUSE (here /dev/fuse is 0600) is told what is missing,
// before the program runs.
TEST_F(ExecTest, AsNobodyWithoutFuseTheFilesFlagsSayWhatIsMissing) {
  if (std::string why = nobodyCannotRunTheCli(); !why.empty()) GTEST_SKIP() << why;
  struct stat st {};
  if (::stat("/dev/fuse", &st) == 0 && (st.st_mode & 0006) == 0006) {
    GTEST_SKIP() << "/dev/fuse is open to every user here";
  }
  std::vector<std::string> argv = {"setpriv", "--reuid=nobody", "--regid=nogroup",
                                   "--clear-groups"};
  for (const auto& a : siphon({"--fs-remote", "/etc", "--", "touch", "/tmp/siphon-never"})) {
    argv.push_back(a);
  }
  Result r = run(argv);
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("--fs-remote/--fs-root need a FUSE mount")) << r;
  EXPECT_THAT(r.err, HasSubstr("/dev/fuse is not open to uid 65534")) << r;
  EXPECT_FALSE(std::filesystem::exists("/tmp/siphon-never"));
  EXPECT_EQ(siphonMountsHere(tmp_), "");
}

}  // namespace
}  // namespace siphon
