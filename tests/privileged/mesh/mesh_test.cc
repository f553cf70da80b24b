// Siphon in a pod with a service mesh's sidecar, as root, with real
// traffic. The pod is set up the way the mesh's init container sets one up,
// from the rules the projects document (not from their code):
//
// - Istio (istio-iptables, REDIRECT mode, iptables-nft): PREROUTING sends
//   every inbound TCP port but the proxy's own (15008, 15090, 15021, 15020)
//   and the excluded ones to the proxy's 15006; OUTPUT sends the pod's
//   outgoing TCP to 15001, except the proxy's uid/gid 1337, its inbound
//   passthrough source 127.0.0.6 over lo, and loopback of other users; the
//   same rules for IPv6 (::6, ::1), and ::6 on lo.
// - Linkerd (proxy-init, iptables-legacy): PREROUTING to 4143 but the skip
//   ports (4190, 4191, 4567, 4568 and the pod's own), OUTPUT to 4140 but
//   uid 2102, loopback and the skipped outbound ports.
//
// The proxy is mesh_proxy.cc, run as the mesh's uid: inbound it reads a
// stand-in "mTLS handshake" (a preface line a client of the mesh sends
// first) and connects to the original destination, from 127.0.0.6/::6
// for Istio (Envoy's inbound passthrough); outbound it connects to the
// original destination. So a byte stream that still starts with the
// preface is the mesh-facing hop, and one that does not is the
// application-facing hop: what siphon must steal and mirror.
//
// Each case runs for both meshes and both steal backends. The pod's
// application is the test's own server (80 meshed, 81 excluded from the
// mesh); the client is another namespace joined by a veth pair; the pod's
// DNS server (dnsmasq) and an echo server live in the client namespace.
// Every object has a unique name and an RAII owner; without root every test
// skips with the reason.
//
// Over 600 lines: the two meshes' rules, the pod they share and one case per
// area (steal, filters, mirror, capture, outgoing and DNS, drain and crash).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/eventually.h"
#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/privileged_test.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates network namespaces, a veth pair and a mesh's nat rules, runs a proxy "
    "as another uid and siphon-agent, which attaches BPF programs or iptables chains";
constexpr const char* kDnsmasq = "/usr/sbin/dnsmasq";
constexpr const char* kBusybox = "/bin/busybox";
// What a client of the mesh sends first, and the proxy strips: the stand-in
// for the mTLS handshake and encryption between two sidecars.
constexpr const char* kPreface = "MESH-TLS\n";
constexpr uint16_t kMeshedPort = 80;
constexpr uint16_t kSkippedPort = 81;  // excluded from the mesh's inbound redirect
constexpr auto kDeadline = std::chrono::seconds(20);

// ------------------------------------------------------------- the meshes

struct Mesh {
  std::string name;
  uint16_t inbound, outbound;
  int uid;
  std::string source4, source6;  // the proxy's source towards the application ("": its own)
  std::string flavor;            // the iptables the mesh's init container uses
  // nat restore input (for --noflush), of IPv4 or IPv6.
  std::function<std::string(bool v6)> rules;
};

// istio-iptables, REDIRECT mode, with traffic.sidecar.istio.io/
// excludeInboundPorts = kSkippedPort.
std::string istioRules(bool v6) {
  const std::string passthrough = v6 ? "::6/128" : "127.0.0.6/32";
  const std::string loopback = v6 ? "::1/128" : "127.0.0.1/32";
  std::string r =
      "*nat\n:ISTIO_INBOUND - [0:0]\n:ISTIO_IN_REDIRECT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n"
      ":ISTIO_REDIRECT - [0:0]\n"
      "-A PREROUTING -p tcp -j ISTIO_INBOUND\n"
      "-A OUTPUT -p tcp -j ISTIO_OUTPUT\n";
  for (int port : {15008, 15090, 15021, 15020, static_cast<int>(kSkippedPort)}) {
    r += "-A ISTIO_INBOUND -p tcp -m tcp --dport " + std::to_string(port) + " -j RETURN\n";
  }
  r += "-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT\n"
       "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006\n"
       "-A ISTIO_OUTPUT -s " +
       passthrough +
       " -o lo -j RETURN\n"
       "-A ISTIO_OUTPUT ! -d " +
       loopback +
       " -o lo -p tcp -m tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT\n"
       "-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner 1337 -j RETURN\n"
       "-A ISTIO_OUTPUT -m owner --uid-owner 1337 -j RETURN\n"
       "-A ISTIO_OUTPUT ! -d " +
       loopback +
       " -o lo -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT\n"
       "-A ISTIO_OUTPUT -o lo -m owner ! --gid-owner 1337 -j RETURN\n"
       "-A ISTIO_OUTPUT -m owner --gid-owner 1337 -j RETURN\n"
       "-A ISTIO_OUTPUT -d " +
       loopback +
       " -j RETURN\n"
       "-A ISTIO_OUTPUT -j ISTIO_REDIRECT\n"
       "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001\n"
       "COMMIT\n";
  return r;
}

// linkerd proxy-init with config.linkerd.io/skip-inbound-ports =
// kSkippedPort (added to the defaults).
std::string linkerdRules(bool) {
  const std::string skip_in = "4190,4191,4567,4568," + std::to_string(kSkippedPort);
  return "*nat\n:PROXY_INIT_REDIRECT - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n"
         "-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" "
         "-j PROXY_INIT_REDIRECT\n"
         "-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" "
         "-j PROXY_INIT_OUTPUT\n"
         "-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports " +
         skip_in + " -m comment --comment \"proxy-init/ignore-port-" + skip_in +
         "\" -j RETURN\n"
         "-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "
         "\"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143\n"
         "-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment "
         "\"proxy-init/ignore-proxy-user-id\" -j RETURN\n"
         "-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" "
         "-j RETURN\n"
         "-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 4567,4568 -m comment --comment "
         "\"proxy-init/ignore-port-4567,4568\" -j RETURN\n"
         "-A PROXY_INIT_OUTPUT -p tcp -m comment --comment "
         "\"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140\n"
         "COMMIT\n";
}

Mesh meshNamed(const std::string& name) {
  if (name == "istio") {
    return Mesh{"istio", 15006, 15001, 1337, "127.0.0.6", "::6", "nft", istioRules};
  }
  return Mesh{"linkerd", 4143, 4140, 2102, "", "", "legacy", linkerdRules};
}

struct Param {
  std::string mesh;     // istio | linkerd
  std::string backend;  // sk_lookup | iptables
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.mesh << "/" << p.backend; }

std::string paramName(const testing::TestParamInfo<Param>& info) {
  return info.param.mesh + "_" + info.param.backend;
}

// ---------------------------------------------------------------- servers

// A TCP listener on `port` of every address (IPv4 and IPv6) inside the
// named namespace.
Fd listenDualStack(const std::string& netns, uint16_t port) {
  Fd fd(socketInNetns(netns, AF_INET6, SOCK_STREAM));
  int zero = 0, one = 1;
  ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  a.sin6_port = htons(port);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  EXPECT_EQ(::listen(fd.get(), 512), 0);
  return fd;
}

// A listener on the host's 127.0.0.1 (the developer's side of a steal).
Fd loopbackListener() {
  uint16_t port = 0;
  return listenOnLoopback(&port, 128);
}

uint16_t localPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

// An HTTP server answering every request with `body` (keep-alive as the
// client asks), remembering each request head as it arrived: the bytes a
// hop carried, preface or not.
class HttpServer {
 public:
  HttpServer(Fd listener, std::string body)
      : port_(localPort(listener.get())),
        acceptor_(std::move(listener), 30, [this, body](int fd) { serve(fd, body); }) {}
  uint16_t port() const { return port_; }
  std::string to() const { return "127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> heads() const {
    std::lock_guard<std::mutex> l(mu_);
    return heads_;
  }

 private:
  void serve(int fd, const std::string& body) {
    std::string buf;
    char chunk[4096];
    while (true) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        buf.append(chunk, static_cast<size_t>(n));
      }
      std::string head = buf.substr(0, end);
      buf.erase(0, end + 4);
      {
        std::lock_guard<std::mutex> l(mu_);
        heads_.push_back(head);
      }
      std::string lower = head;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      const bool http10 = lower.find(" http/1.0\r\n") != std::string::npos;
      const bool close = http10 ? lower.find("connection: keep-alive") == std::string::npos
                                : lower.find("connection: close") != std::string::npos;
      std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\n" +
                         (close ? "Connection: close\r\n" : "") + "\r\n" + body;
      if (!writeAll(fd, resp.data(), resp.size()) || close) return;
    }
  }

  uint16_t port_;
  mutable std::mutex mu_;
  std::vector<std::string> heads_;
  Acceptor acceptor_;  // last: serves once the rest exists
};

// Echoes every byte back.
void echoServe(int fd) {
  char buf[16384];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || !writeAll(fd, buf, static_cast<size_t>(n))) return;
  }
}

// iptables-save output without what changes on its own: comments (the
// date) and counters. What remains is every table, chain and rule.
std::string normalizedSave(const std::string& save) {
  std::string out;
  std::istringstream in(save);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '#') continue;
    if (!line.empty() && line[0] == ':') {
      size_t counters = line.rfind(" [");
      if (counters != std::string::npos) line.erase(counters);
    }
    out += line + "\n";
  }
  return out;
}

// ------------------------------------------------------------ the fixture

class MeshTest : public PrivilegedParamTest<Param> {
 protected:
  MeshTest() : PrivilegedParamTest<Param>(kSkipReason), mesh_(meshNamed(GetParam().mesh)) {}

  void SetUp() override {
    PrivilegedParamTest<Param>::SetUp();
    if (IsSkipped()) return;
    for (const char* tool : {kDnsmasq, kBusybox, "/usr/bin/setpriv"}) {
      if (access(tool, X_OK) != 0) {
        GTEST_SKIP() << "needs " << tool << " (dnsmasq-base, busybox-static, util-linux)";
      }
    }
    dir_ = &dir();
    // The proxy runs as the mesh's uid: its binary must be reachable.
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    pod_ = &addNetns();
    client_ = &addNetns();
    ASSERT_TRUE(pod_->created() && client_->created());
    ASSERT_NO_FATAL_FAILURE(linkPod());
    ASSERT_NO_FATAL_FAILURE(installMesh());
    ASSERT_NO_FATAL_FAILURE(startProxy());
    app_.emplace(listenDualStack(pod_->name(), kMeshedPort), "original\n");
    skipped_app_.emplace(listenDualStack(pod_->name(), kSkippedPort), "original-81\n");
    Fd echo = listenDualStack(client_->name(), 0);
    echo_port_ = localPort(echo.get());
    echo_.emplace(std::move(echo), 30, echoServe);
    ASSERT_NO_FATAL_FAILURE(startDnsmasq());
    ASSERT_NO_FATAL_FAILURE(startTarget());
    // The mesh works before siphon comes: a meshed request reaches the
    // application through the proxy.
    ASSERT_EQ(body(meshGet(pod4_, kMeshedPort)), "original\n") << proxyLog();
    mesh_rules_ = saves();
    ASSERT_THAT(mesh_rules_, HasSubstr(mesh_.name == "istio" ? "ISTIO_INBOUND" : "PROXY_INIT"));
    ASSERT_NO_FATAL_FAILURE(startAgent());
  }

  void TearDown() override {
    for (auto& p : procs_) {
      p->signal(SIGKILL);
      p->finish();
    }
    PrivilegedParamTest<Param>::TearDown();
  }

  void linkPod() {
    const std::string tag = randomHex(6);
    const int subnet =
        1 + static_cast<int>(std::strtoul(tag.substr(0, 2).c_str(), nullptr, 16) % 254);
    pod4_ = "10.249." + std::to_string(subnet) + ".1";
    client4_ = "10.249." + std::to_string(subnet) + ".2";
    pod6_ = "fd00:5153:" + tag.substr(0, 4) + "::1";
    client6_ = "fd00:5153:" + tag.substr(0, 4) + "::2";
    ASSERT_TRUE(
        linkVeth({pod_->name(), "sm" + tag + "p", {pod4_ + "/24", pod6_ + "/64"}},
                 {client_->name(), "sm" + tag + "c", {client4_ + "/24", client6_ + "/64"}}));
  }

  // The mesh's init container: its nat rules for both families (and, for
  // Istio, ::6 on lo for the inbound passthrough's IPv6 source).
  void installMesh() {
    if (mesh_.name == "istio") {
      Result r = run({"ip", "-n", pod_->name(), "-6", "addr", "add", "::6/128", "dev", "lo"});
      ASSERT_EQ(r.exit_code, 0) << r;
    }
    for (bool v6 : {false, true}) {
      const std::string tool =
          std::string(v6 ? "ip6tables-" : "iptables-") + mesh_.flavor + "-restore";
      const std::string file = dir_->file(v6 ? "mesh6.rules" : "mesh4.rules", mesh_.rules(v6));
      Result r =
          run({"sh", "-c", "ip netns exec " + pod_->name() + " " + tool + " --noflush < " + file});
      ASSERT_EQ(r.exit_code, 0) << tool << ": " << r << "\n" << mesh_.rules(v6);
    }
  }

  void startProxy() {
    proxy_log_ = dir_->path() + "/proxy.log";
    Fd log(open(proxy_log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    std::vector<std::string> argv = {"ip",
                                     "netns",
                                     "exec",
                                     pod_->name(),
                                     "setpriv",
                                     "--reuid=" + std::to_string(mesh_.uid),
                                     "--regid=" + std::to_string(mesh_.uid),
                                     "--clear-groups",
                                     MESH_PROXY_BIN,
                                     "--inbound",
                                     std::to_string(mesh_.inbound),
                                     "--outbound",
                                     std::to_string(mesh_.outbound),
                                     "--preface",
                                     kPreface};
    if (!mesh_.source4.empty()) {
      for (const std::string& a : {std::string("--inbound-source4"), mesh_.source4,
                                   std::string("--inbound-source6"), mesh_.source6}) {
        argv.push_back(a);
      }
    }
    proxy_ = spawn(argv, std::nullopt, log.get(), log.get());
    showOnFailure("mesh proxy log", [this] { return proxyLog(); });
    ASSERT_TRUE(fakes::eventually([&] { return proxyLog().find("ready\n") != std::string::npos; },
                                  kDeadline))
        << "the mesh proxy did not start: " << proxyLog();
  }

  // The pod's DNS server, in the client namespace (as the cluster's DNS is
  // outside the pod): echo.mesh.test is the client's address.
  void startDnsmasq() {
    const std::string log_path = dir_->path() + "/dnsmasq.log";
    Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    dnsmasq_ = spawn({"ip", "netns", "exec", client_->name(), kDnsmasq, "--no-daemon",
                      "--conf-file=/dev/null", "--pid-file=", "--no-resolv", "--no-hosts",
                      "--listen-address=" + client4_, "--bind-interfaces", "--port=53",
                      "--host-record=echo.mesh.test," + client4_, "--local=/test/"},
                     std::nullopt, log.get(), log.get());
    showOnFailure("dnsmasq log", [log_path] { return readFile(log_path); });
    ASSERT_TRUE(fakes::eventually(
        [&] {
          Result r = run({"ip", "netns", "exec", pod_->name(), kBusybox, "nslookup", "-type=a",
                          "echo.mesh.test", client4_});
          return r.exit_code == 0 && r.out.find(client4_) != std::string::npos;
        },
        kDeadline, std::chrono::milliseconds(50)))
        << "dnsmasq does not answer from the pod";
  }

  // The target process: busybox sleep chrooted into a root whose
  // resolv.conf names the DNS server above.
  void startTarget() {
    root_ = dir_->path() + "/root";
    std::filesystem::create_directories(root_ + "/bin");
    std::filesystem::create_directories(root_ + "/etc");
    std::filesystem::copy_file(kBusybox, root_ + "/bin/busybox");
    std::ofstream(root_ + "/etc/resolv.conf") << "nameserver " << client4_ << "\n";
    std::ofstream(root_ + "/etc/hosts") << "127.0.0.1 localhost\n";
    target_ = spawn(
        {"ip", "netns", "exec", pod_->name(), "chroot", root_, "/bin/busybox", "sleep", "600"},
        std::nullopt, -1, -1);
    ASSERT_TRUE(fakes::eventually(
        [&] {
          std::error_code ec;
          auto exe =
              std::filesystem::read_symlink("/proc/" + std::to_string(target_.pid()) + "/exe", ec);
          return !ec && exe == root_ + "/bin/busybox" &&
                 netnsInodeOf(target_.pid()) == pod_->inode();
        },
        kDeadline))
        << "the target never ran in " << pod_->name();
  }

  void startAgent() {
    agent_.reset();
    agent_.emplace(
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                 "--first-client-timeout", "120s", "--session-grace", "2s",
                                 "--log-level", "debug", "--steal-backend", GetParam().backend,
                                 "targeted", "--pid", std::to_string(target_.pid())},
        cleanEnv(), dir_->path() + "/agent-" + std::to_string(++agents_) + ".log");
    showOnFailure("agent log " + std::to_string(agents_), [this, n = agents_] {
      return readFile(dir_->path() + "/agent-" + std::to_string(n) + ".log");
    });
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  std::string proxyLog() const { return readFile(proxy_log_); }
  // Lines of the proxy's log starting with `prefix`.
  int proxyLines(const std::string& prefix) const {
    std::istringstream in(proxyLog());
    std::string line;
    int n = 0;
    while (std::getline(in, line)) n += line.rfind(prefix, 0) == 0;
    return n;
  }

  // Every save tool's output in the pod, normalised: the mesh's rules (and
  // ours, while we hold some).
  std::string saves() {
    std::string out;
    for (const char* tool : {"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save",
                             "ip6tables-legacy-save"}) {
      Result r = run({"ip", "netns", "exec", pod_->name(), tool});
      out += std::string("== ") + tool + "\n" + normalizedSave(r.out);
    }
    return out;
  }

  // A client of the mesh: connects from the client namespace to the pod,
  // sends the preface (only when `meshed`), then an HTTP/1.0 request with
  // `headers`, and reads the answer to EOF ("" on a failure).
  std::string request(const std::string& ip, uint16_t port, bool meshed,
                      const std::string& headers = "") {
    const int family = ip.find(':') == std::string::npos ? AF_INET : AF_INET6;
    Fd c(socketInNetns(client_->name(), family, SOCK_STREAM));
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&ss);
      in->sin_family = AF_INET;
      in->sin_port = htons(port);
      inet_pton(AF_INET, ip.c_str(), &in->sin_addr);
      len = sizeof *in;
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(port);
      inet_pton(AF_INET6, ip.c_str(), &in6->sin6_addr);
      len = sizeof *in6;
    }
    if (::connect(c.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) return "";
    setTimeouts(c.get(), 10);
    const std::string req =
        std::string(meshed ? kPreface : "") + "GET / HTTP/1.0\r\nHost: app\r\n" + headers + "\r\n";
    std::string resp;
    if (!writeAll(c.get(), req) || !readAll(c.get(), &resp)) return "";
    return resp;
  }
  std::string meshGet(const std::string& ip, uint16_t port, const std::string& headers = "") {
    return request(ip, port, true, headers);
  }
  static std::string body(const std::string& resp) {
    size_t at = resp.find("\r\n\r\n");
    return at == std::string::npos ? "no answer: " + resp : resp.substr(at + 4);
  }

  // A `siphon` command; waits until `ready` shows on its stderr (or it
  // fails).
  Proc* cli(const std::vector<std::string>& args, const std::string& ready) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    procs_.push_back(std::make_unique<Proc>(argv, cleanEnv()));
    Proc* p = procs_.back().get();
    p->readUntil([&](const std::string&, const std::string& err) {
      return err.find(ready) != std::string::npos || err.find("siphon:") != std::string::npos;
    });
    EXPECT_THAT(p->err, HasSubstr(ready));
    return p;
  }
  Proc* steal(std::vector<std::string> args) {
    args.insert(args.begin(), "steal");
    return cli(args, "stealing port");
  }
  Result runCli(const std::vector<std::string>& args, const std::string& input = "") {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    Proc p(argv, cleanEnv());
    std::thread writer([&] {
      p.write(input);
      p.closeStdin();
    });
    int rc = p.finish();
    writer.join();
    return Result{rc, p.out, p.err};
  }

  // Ends a CLI process with SIGINT; its exit code.
  static int stop(Proc* p) {
    p->signal(SIGINT);
    return p->finish();
  }

  const Mesh mesh_;
  TempDir* dir_ = nullptr;  // PrivilegedTest's
  NetNs *pod_ = nullptr, *client_ = nullptr;
  std::string token_file_, proxy_log_, root_;
  std::string pod4_, pod6_, client4_, client6_;
  std::string mesh_rules_;  // saves() with the mesh's rules, before any agent
  // Destroyed in reverse: agent, target, servers, dnsmasq, proxy.
  Child proxy_, dnsmasq_;
  std::optional<HttpServer> app_, skipped_app_;
  uint16_t echo_port_ = 0;
  std::optional<Acceptor> echo_;
  Child target_;
  int agents_ = 0;
  std::optional<Agent> agent_;
  std::string endpoint_;
  std::vector<std::unique_ptr<Proc>> procs_;
};

INSTANTIATE_TEST_SUITE_P(Meshes, MeshTest,
                         ::testing::Values(Param{"istio", "sk_lookup"}, Param{"istio", "iptables"},
                                           Param{"linkerd", "sk_lookup"},
                                           Param{"linkerd", "iptables"}),
                         paramName);

// ------------------------------------------------------------------ tests

// An unfiltered steal of a meshed port takes the application-facing hop:
// the stolen bytes are the plain request (the preface ended at the
// proxy), and every client connection went through the proxy once. A port
// the mesh skips is stolen straight from the client.
TEST_P(MeshTest, StealTakesTheApplicationFacingHop) {
  HttpServer local(loopbackListener(), "stolen\n");
  HttpServer local81(loopbackListener(), "stolen-81\n");
  Proc* s = steal({"--port", "80", "--to", local.to()});
  Proc* s81 = steal({"--port", "81", "--to", local81.to()});

  for (const std::string& ip : {pod4_, pod6_}) {
    EXPECT_EQ(body(meshGet(ip, kMeshedPort)), "stolen\n") << ip;
    EXPECT_EQ(body(request(ip, kSkippedPort, false)), "stolen-81\n") << ip;
  }
  for (const std::string& head : local.heads()) {
    EXPECT_EQ(head.rfind("GET / HTTP/1.0\r\n", 0), 0u)
        << "a stolen hop still had the preface: " << head;
  }
  EXPECT_EQ(local.heads().size(), 2u);
  EXPECT_EQ(local81.heads().size(), 2u);
  // Before the steal, one meshed request (SetUp); now two more, each once
  // through the proxy: nothing of the agent's looped back into it.
  EXPECT_EQ(proxyLines("inbound "), 3) << proxyLog();
  EXPECT_EQ(proxyLines("outbound"), 0) << proxyLog();
  EXPECT_THAT(proxyLog(), Not(HasSubstr("failed")));
  EXPECT_EQ(stop(s), 0) << s->err;
  if (!mesh_.source4.empty()) {
    // Istio's inbound passthrough source: the hop from the proxy.
    EXPECT_THAT(s->err, HasSubstr("open " + mesh_.source4 + ":")) << s->err;
  }
  EXPECT_EQ(stop(s81), 0) << s81->err;
  for (const std::string& ip : {pod4_, pod6_}) {
    EXPECT_EQ(body(meshGet(ip, kMeshedPort)), "original\n") << ip;
    EXPECT_EQ(body(request(ip, kSkippedPort, false)), "original-81\n") << ip;
  }
  EXPECT_EQ(app_->heads().size(), 3u);
}

// An HTTP-filtered steal sees the plain requests: a matching one is stolen,
// the others reach the application through the agent's passthrough, which
// never loops through the mesh (the proxy saw each client connection once,
// and no outbound one).
TEST_P(MeshTest, FilteredStealSeesThePlainRequests) {
  HttpServer local(loopbackListener(), "stolen\n");
  Proc* s = steal({"--port", "80", "--to", local.to(), "--filter-header", "X-Dev: me"});
  for (const std::string& ip : {pod4_, pod6_}) {
    EXPECT_EQ(body(meshGet(ip, kMeshedPort, "X-Dev: me\r\n")), "stolen\n") << ip;
    EXPECT_EQ(body(meshGet(ip, kMeshedPort)), "original\n") << ip;
    EXPECT_EQ(body(meshGet(ip, kMeshedPort, "X-Dev: other\r\n")), "original\n") << ip;
  }
  EXPECT_EQ(local.heads().size(), 2u);
  EXPECT_EQ(app_->heads().size(), 1u + 4u);
  for (const std::string& head : app_->heads()) {
    EXPECT_EQ(head.rfind("GET / HTTP/1", 0), 0u) << head;
  }
  EXPECT_EQ(proxyLines("inbound "), 1 + 6) << proxyLog();
  EXPECT_EQ(proxyLines("outbound"), 0) << proxyLog();
  EXPECT_EQ(stop(s), 0) << s->err;
  EXPECT_EQ(body(meshGet(pod4_, kMeshedPort, "X-Dev: me\r\n")), "original\n");
}

// A mirror of a meshed port delivers the application-facing hop, once per
// connection: the plain request, not the preface the client sent the
// mesh.
TEST_P(MeshTest, MirrorDeliversTheApplicationFacingHopOnce) {
  Proc* m = cli({"mirror", "--port", "80", "--both"}, "mirror: port 80");
  EXPECT_EQ(body(meshGet(pod4_, kMeshedPort)), "original\n");
  ASSERT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
    return err.find(" closed") != std::string::npos;
  })) << m->err;
  // A second connection: the first one's duplicate, if any, shows by now.
  EXPECT_EQ(body(meshGet(pod6_, kMeshedPort)), "original\n");
  ASSERT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
    size_t n = 0, at = 0;
    while ((at = err.find(" closed", at)) != std::string::npos) ++n, ++at;
    return n >= 2;
  })) << m->err;
  EXPECT_EQ(stop(m), 0) << m->err;
  EXPECT_THAT(m->out, Not(HasSubstr("MESH-TLS"))) << m->out;
  size_t requests = 0, at = 0;
  while ((at = m->out.find("GET / HTTP/1.0\r\n", at)) != std::string::npos) ++requests, ++at;
  EXPECT_EQ(requests, 2u) << m->out;
  EXPECT_THAT(m->err, Not(HasSubstr("connection 3 "))) << m->err;
}

// Mirror and steal of one meshed port: the stolen connection is answered
// by the local server, and the mirror does not show the mesh-facing hop.
TEST_P(MeshTest, MirrorAndStealOfOneMeshedPort) {
  HttpServer local(loopbackListener(), "stolen\n");
  Proc* m = cli({"mirror", "--port", "80", "--both"}, "mirror: port 80");
  Proc* s = steal({"--port", "80", "--to", local.to()});
  EXPECT_EQ(body(meshGet(pod4_, kMeshedPort)), "stolen\n");
  if (GetParam().backend == "sk_lookup") {
    // The mirrored copy trails the stolen answer (ring buffer, reassembly,
    // the session): stopping the mirror before it arrived would drop it.
    ASSERT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
      return err.find(" closed") != std::string::npos;
    })) << m->err;
  }
  EXPECT_EQ(stop(s), 0) << s->err;
  EXPECT_EQ(stop(m), 0) << m->err;
  EXPECT_THAT(m->out, Not(HasSubstr("MESH-TLS"))) << m->out;
  if (GetParam().backend == "sk_lookup") {
    // The stolen hop keeps port 80 on lo: mirrored. (iptables REDIRECTs it
    // in OUTPUT, before lo: lo carries the agent's listener port, which
    // nobody mirrors; docs/MIRROR.md.)
    EXPECT_THAT(m->out, HasSubstr("GET / HTTP/1.0\r\n")) << m->out;
  }
}

// A port the mesh skips, stolen and mirrored: the client's connection is
// the one the steal takes (iptables: REDIRECTed by our own PREROUTING rule
// to the agent's listener, which the mirror recognises as its own), and the
// mirror shows it.
TEST_P(MeshTest, MirrorAndStealOfASkippedPort) {
  HttpServer local(loopbackListener(), "stolen-81\n");
  Proc* m = cli({"mirror", "--port", "81", "--both"}, "mirror: port 81");
  Proc* s = steal({"--port", "81", "--to", local.to()});
  EXPECT_EQ(body(request(pod4_, kSkippedPort, false)), "stolen-81\n");
  ASSERT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
    return err.find(" closed") != std::string::npos;
  })) << m->err;
  EXPECT_EQ(stop(s), 0) << s->err;
  EXPECT_EQ(stop(m), 0) << m->err;
  EXPECT_THAT(m->out, HasSubstr("GET / HTTP/1.0\r\n")) << m->out;
  EXPECT_THAT(m->out, HasSubstr("stolen-81\n")) << m->out;
}

// Capture is tcpdump in the pod: it has both hops, the mesh-facing one
// (with the preface) and the application-facing one over lo.
TEST_P(MeshTest, CaptureHasBothHops) {
  const std::string pcap = dir_->path() + "/mesh.pcap";
  Proc* cap = cli({"capture", "-w", pcap, "tcp", "port", "80"}, "capturing on");
  EXPECT_EQ(body(meshGet(pod4_, kMeshedPort)), "original\n");
  // Both hops' requests in the file (the CLI writes as packets come).
  auto requests = [&] {
    const std::string file = readFile(pcap);
    size_t n = 0, at = 0;
    while ((at = file.find("GET / HTTP/1.0\r\n", at)) != std::string::npos) ++n, ++at;
    return n;
  };
  ASSERT_TRUE(fakes::eventually([&] { return requests() >= 2; }, kDeadline)) << cap->err;
  EXPECT_EQ(stop(cap), 0) << cap->err;
  // Each hop's request (a retransmission may add a copy).
  const std::string file = readFile(pcap);
  size_t plain = 0, meshed = 0;
  const std::string preface = kPreface;
  for (size_t at = file.find("GET / HTTP/1.0\r\n"); at != std::string::npos;
       at = file.find("GET / HTTP/1.0\r\n", at + 1)) {
    const bool after_preface =
        at >= preface.size() && file.compare(at - preface.size(), preface.size(), preface) == 0;
    ++(after_preface ? meshed : plain);
  }
  EXPECT_GE(plain, 1u) << "the application-facing hop";
  EXPECT_GE(meshed, 1u) << "the mesh-facing hop";
}

// Outgoing connections and DNS from the target: the name resolves through
// the pod's DNS server, and the connection goes through the mesh's outbound
// proxy as the application's would, once.
TEST_P(MeshTest, OutgoingConnectionsAndDnsGoThroughTheMeshOnce) {
  Result dns = runCli({"dns", "lookup", "echo.mesh.test"});
  EXPECT_EQ(dns.exit_code, 0) << dns;
  EXPECT_EQ(dns.out, client4_ + "\n");

  const uint16_t echo_port = echo_port_;
  ASSERT_NE(echo_port, 0);
  Result r = runCli({"connect", "echo.mesh.test:" + std::to_string(echo_port)}, "through\n");
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "through\n");
  EXPECT_EQ(echo_->accepted(), 1);
  EXPECT_EQ(proxyLines("outbound " + client4_ + ":" + std::to_string(echo_port)), 1) << proxyLog();
  EXPECT_EQ(proxyLines("outbound"), 1) << proxyLog();
}

// A drain (SIGTERM) and a kill -9 of the agent, each while it steals a
// meshed port, leave the mesh's rules exactly as they were, in every
// iptables of the pod; the mesh then serves the port again.
TEST_P(MeshTest, DrainAndKillLeaveTheMeshsRulesAsTheyWere) {
  HttpServer local(loopbackListener(), "stolen\n");
  Proc* s = steal({"--port", "80", "--to", local.to()});
  EXPECT_EQ(body(meshGet(pod6_, kMeshedPort)), "stolen\n");
  if (GetParam().backend == "iptables") {
    EXPECT_THAT(saves(), HasSubstr("SIPHON_"));
  }
  ::kill(agent_->child().pid(), SIGTERM);
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kDeadline), 0) << agent_->log();
  EXPECT_EQ(saves(), mesh_rules_);
  EXPECT_EQ(body(meshGet(pod4_, kMeshedPort)), "original\n");
  s->finish();

  ASSERT_NO_FATAL_FAILURE(startAgent());
  s = steal({"--port", "80", "--to", local.to()});
  EXPECT_EQ(body(meshGet(pod4_, kMeshedPort)), "stolen\n");
  agent_->child().kill();  // SIGKILL; the guard (iptables) cleans up after it
  EXPECT_TRUE(fakes::eventually([&] { return saves() == mesh_rules_; }, kDeadline))
      << saves() << "\nbefore:\n"
      << mesh_rules_;
  EXPECT_EQ(body(meshGet(pod6_, kMeshedPort)), "original\n");
  EXPECT_EQ(body(request(pod4_, kSkippedPort, false)), "original-81\n");
}

}  // namespace
}  // namespace siphon
