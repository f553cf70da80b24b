// DNS end to end, as root: a "pod" is a network namespace with a dnsmasq
// on 127.0.0.1:53 and a process chrooted into a directory whose
// /etc/resolv.conf and /etc/hosts the test writes. The real siphon-agent
// targets that process and the real siphon CLI asks it; the answers must be
// the pod's, which the host (another namespace, other files) cannot give.
//
// Every process, namespace and directory is owned by an RAII guard, so a
// failed assertion still kills dnsmasq and the pod and deletes the
// namespace. Without root (or without dnsmasq) every test skips.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/privileged_test.h"

namespace siphon {
namespace {

using namespace siphon::harness;  // NOLINT: test file
using ::testing::HasSubstr;

constexpr const char* kSkipReason =
    "needs root: creates a network namespace with a dnsmasq in it, chroots the pod process and "
    "runs siphon-agent, which enters another process's namespaces";
constexpr const char* kDnsmasq = "/usr/sbin/dnsmasq";
constexpr const char* kBusybox = "/bin/busybox";

constexpr const char* kResolvConf =
    "# written by dns_test\n"
    "nameserver 127.0.0.1\n"
    "search pod.example other.example\n"
    "options ndots:1 timeout:2 attempts:2\n";

constexpr const char* kHosts =
    "127.0.0.1 localhost\n"
    "10.77.0.1 hosts-only.internal hostsalias   # only in the pod's hosts file\n"
    "10.77.0.3 shadowed.pod.example\n";

// True when getaddrinfo of the test process (the host's resolv.conf, hosts
// file and network namespace) finds `name`.
bool resolvesOnHost(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(name.c_str(), nullptr, &hints, &res);
  if (res != nullptr) freeaddrinfo(res);
  return rc == 0;
}

class DnsTest : public PrivilegedTest {
 protected:
  DnsTest() : PrivilegedTest(kSkipReason) {}

  void SetUp() override {
    PrivilegedTest::SetUp();
    if (IsSkipped()) return;
    if (access(kDnsmasq, X_OK) != 0 || access(kBusybox, X_OK) != 0) {
      GTEST_SKIP() << "needs " << kDnsmasq << " and " << kBusybox
                   << " (dnsmasq-base, busybox-static: scripts/install-deps.sh)";
    }
    dir_ = &dir();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    root_ = dir_->path() + "/root";
    std::filesystem::create_directories(root_ + "/bin");
    std::filesystem::create_directories(root_ + "/etc");
    std::filesystem::copy_file(kBusybox, root_ + "/bin/busybox");
    writeRootFile("etc/resolv.conf", kResolvConf);
    writeRootFile("etc/hosts", kHosts);

    netns_ = &addNetns();
    ASSERT_TRUE(netns_->created());
    showOnFailure("dnsmasq log", [this] { return readFile(dir_->path() + "/dnsmasq.log"); });
    ASSERT_NO_FATAL_FAILURE(startDnsmasq());
    ASSERT_NO_FATAL_FAILURE(startPod());

    agent_.emplace(std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                            "--first-client-timeout", "30s", "targeted", "--pid",
                                            std::to_string(pod_.pid())},
                   cleanEnv(), dir_->path() + "/agent.log");
    showOnFailure("agent log", [this] { return agent_->log(); });
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  // Replaces a file of the pod's root with a new one (a new inode, as
  // kubelet and editors do).
  void writeRootFile(const std::string& rel, const std::string& content) {
    std::string tmp = root_ + "/" + rel + ".new";
    std::ofstream(tmp) << content;
    std::filesystem::rename(tmp, root_ + "/" + rel);
  }

  void startDnsmasq() {
    Fd log(open((dir_->path() + "/dnsmasq.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                0600));
    dnsmasq_ = spawn(
        {"ip", "netns", "exec", netns_->name(), kDnsmasq, "--no-daemon", "--conf-file=/dev/null",
         "--pid-file=", "--no-resolv", "--no-hosts", "--listen-address=127.0.0.1",
         "--bind-interfaces", "--port=53", "--local-ttl=60", "--bogus-priv",
         "--address=/only-in-pod.test/10.11.12.13",
         "--ptr-record=13.12.11.10.in-addr.arpa,only-in-pod.test",
         "--host-record=short.pod.example,10.20.30.40",
         "--host-record=dual.pod.example,10.5.5.5,fd00::5", "--host-record=dots.only,10.9.9.1",
         "--host-record=dots.only.pod.example,10.9.9.2",
         "--host-record=shadowed.pod.example,10.3.3.3", "--host-record=echo.pod.example,127.0.0.1",
         "--cname=alias.pod.example,short.pod.example",
         // Names under these are answered NXDOMAIN when unknown; anything
         // else gets REFUSED (no upstream servers).
         "--local=/pod.example/", "--local=/other.example/", "--local=/test/", "--local=/only/"},
        std::nullopt, log.get(), log.get());
    ASSERT_GT(dnsmasq_.pid(), 0);
    // Ready once its socket is bound: 127.0.0.1:53 in the namespace's
    // /proc/net/udp (asking with a client before that only meets a refused
    // port and the client's own timeout). Then one real question.
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      Result udp = run({"ip", "netns", "exec", netns_->name(), "cat", "/proc/net/udp"});
      if (udp.out.find(" 0100007F:0035 ") != std::string::npos) break;
      if (dnsmasq_.waitUntil(Clock::now())) {
        FAIL() << "dnsmasq exited:\n" << readFile(dir_->path() + "/dnsmasq.log");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Result r = run({"ip", "netns", "exec", netns_->name(), kBusybox, "nslookup", "-type=a",
                    "only-in-pod.test", "127.0.0.1"});
    ASSERT_EQ(r.exit_code, 0) << "dnsmasq does not answer in " << netns_->name() << ": " << r;
    ASSERT_THAT(r.out, HasSubstr("10.11.12.13")) << r;
  }

  // The pod: busybox sleep, chrooted into root_, in the namespace.
  void startPod() {
    pod_ = spawn(
        {"ip", "netns", "exec", netns_->name(), "chroot", root_, "/bin/busybox", "sleep", "600"},
        std::nullopt, -1, -1);
    ASSERT_GT(pod_.pid(), 0);
    const std::string proc = "/proc/" + std::to_string(pod_.pid());
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      std::error_code ec;
      auto exe = std::filesystem::read_symlink(proc + "/exe", ec);
      if (!ec && exe == root_ + "/bin/busybox" && netnsInodeOf(pod_.pid()) == netns_->inode()) {
        return;
      }
      if (pod_.waitUntil(Clock::now())) FAIL() << "the pod process exited";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "pod process " << pod_.pid() << " never ran busybox in " << netns_->name();
  }

  Result cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, cleanEnv());
  }

  // Destroyed in reverse: agent, pod, dnsmasq, namespace, directory.
  TempDir* dir_ = nullptr;  // PrivilegedTest's
  std::string token_file_;
  std::string root_;
  NetNs* netns_ = nullptr;  // PrivilegedTest's
  Child dnsmasq_;
  Child pod_;
  std::optional<Agent> agent_;
  std::string endpoint_;
};

TEST_F(DnsTest, ResolvesWhatOnlyThePodCanResolve) {
  Result r = cli({"dns", "lookup", "only-in-pod.test"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "10.11.12.13\n");
  EXPECT_EQ(r.err, "");
  // The host has its own resolv.conf and namespace: the name means nothing
  // there (.test is reserved, RFC 2606), so the answer above came from the
  // pod's dnsmasq through a socket in the pod's namespace.
  EXPECT_FALSE(resolvesOnHost("only-in-pod.test"));
}

// Outgoing connections to a host name resolve as the target would: through
// this same resolver (the pod's dnsmasq), not the agent's getaddrinfo.
TEST_F(DnsTest, OutgoingConnectionsToANameUseThePodsDns) {
  Child echo = spawn({"ip", "netns", "exec", netns_->name(), "socat",
                      "TCP-LISTEN:7007,bind=127.0.0.1,reuseaddr,fork", "EXEC:cat"},
                     std::nullopt, -1, -1);
  ASSERT_GT(echo.pid(), 0);
  // Ready once it listens: its socket in the pod's /proc/net/tcp (port 0x1B5F).
  const bool listening = fakes::eventually(
      [&] {
        Result tcp = run({"ip", "netns", "exec", netns_->name(), "cat", "/proc/net/tcp"});
        return tcp.out.find(":1B5F 00000000:0000 0A") != std::string::npos;
      },
      std::chrono::seconds(10), std::chrono::milliseconds(20));
  ASSERT_TRUE(listening) << "socat did not start listening in the pod";
  EXPECT_FALSE(resolvesOnHost("echo.pod.example"));

  Result r = cli({"connect", "echo.pod.example:7007"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.err, "");

  Result missing = cli({"connect", "nothing-here.pod.example:7007"});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_NE(missing.err.find("NXDOMAIN"), std::string::npos) << missing;
}

TEST_F(DnsTest, JsonOutput) {
  Result r = cli({"--json", "dns", "lookup", "alias.pod.example"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out,
            "{\n"
            "  \"name\": \"alias.pod.example\",\n"
            "  \"status\": \"ok\",\n"
            "  \"canonical_name\": \"short.pod.example\",\n"
            "  \"addresses\": [\n"
            "    \"10.20.30.40\"\n"
            "  ],\n"
            "  \"ttl\": 60\n"
            "}\n");
}

TEST_F(DnsTest, SearchDomainsAndNdotsAsTheTargetHasThem) {
  Result r = cli({"--json", "dns", "lookup", "short"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\"canonical_name\": \"short.pod.example\""));
  EXPECT_THAT(r.out, HasSubstr("\"10.20.30.40\""));

  // ndots:1: "dots.only" has enough dots to be tried as it is first...
  Result as_is = cli({"dns", "lookup", "dots.only"});
  EXPECT_EQ(as_is.exit_code, 0) << as_is;
  EXPECT_EQ(as_is.out, "10.9.9.1\n");
  // ...ndots:2: the search list first. The agent reads the new file at once.
  writeRootFile("etc/resolv.conf",
                "nameserver 127.0.0.1\nsearch pod.example other.example\noptions ndots:2\n");
  Result searched = cli({"dns", "lookup", "dots.only"});
  EXPECT_EQ(searched.exit_code, 0) << searched;
  EXPECT_EQ(searched.out, "10.9.9.2\n");
  // A trailing dot: the name only.
  Result absolute = cli({"dns", "lookup", "dots.only."});
  EXPECT_EQ(absolute.out, "10.9.9.1\n") << absolute;
}

TEST_F(DnsTest, TheTargetsHostsFileComesFirst) {
  Result r = cli({"dns", "lookup", "hosts-only.internal"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "10.77.0.1\n");
  EXPECT_FALSE(resolvesOnHost("hosts-only.internal")) << "not the host's /etc/hosts";

  Result alias = cli({"--json", "dns", "lookup", "hostsalias"});
  EXPECT_EQ(alias.exit_code, 0) << alias;
  EXPECT_THAT(alias.out, HasSubstr("\"canonical_name\": \"hosts-only.internal\""));

  // In both the hosts file and DNS: "hosts: files dns".
  EXPECT_EQ(cli({"dns", "lookup", "shadowed.pod.example"}).out, "10.77.0.3\n");

  Result names = cli({"dns", "reverse", "10.77.0.1"});
  EXPECT_EQ(names.exit_code, 0) << names;
  EXPECT_EQ(names.out, "hosts-only.internal\nhostsalias\n");

  // An edited hosts file is read again.
  writeRootFile("etc/hosts", "10.77.0.9 hosts-only.internal\n");
  EXPECT_EQ(cli({"dns", "lookup", "hosts-only.internal"}).out, "10.77.0.9\n");
}

TEST_F(DnsTest, Families) {
  Result both = cli({"dns", "lookup", "dual.pod.example"});
  EXPECT_EQ(both.exit_code, 0) << both;
  EXPECT_EQ(both.out, "10.5.5.5\nfd00::5\n");
  EXPECT_EQ(cli({"dns", "lookup", "dual.pod.example", "--family", "4"}).out, "10.5.5.5\n");
  EXPECT_EQ(cli({"dns", "lookup", "--family", "6", "dual.pod.example"}).out, "fd00::5\n");

  Result nodata = cli({"dns", "lookup", "short.pod.example", "--family", "6"});
  EXPECT_EQ(nodata.exit_code, 1) << nodata;
  EXPECT_EQ(nodata.out, "");
  EXPECT_EQ(nodata.err, "siphon: dns lookup short.pod.example: NODATA\n");

  Result bad = cli({"dns", "lookup", "short", "--family", "5"});
  EXPECT_EQ(bad.exit_code, 2) << bad;
}

TEST_F(DnsTest, NxdomainIsTypedAndExitsOne) {
  Result r = cli({"dns", "lookup", "nosuch.test"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "siphon: dns lookup nosuch.test: NXDOMAIN\n");

  Result json = cli({"--json", "dns", "lookup", "nosuch.test"});
  EXPECT_EQ(json.exit_code, 1) << json;
  EXPECT_THAT(json.out, HasSubstr("\"status\": \"nxdomain\""));
  EXPECT_THAT(json.out, HasSubstr("\"addresses\": []"));
  EXPECT_EQ(json.err, "siphon: dns lookup nosuch.test: NXDOMAIN\n");
}

TEST_F(DnsTest, RefusedIsTyped) {
  // dnsmasq has no upstream for this name and refuses it.
  Result r = cli({"dns", "lookup", "name.unknown-tld."});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.err, "siphon: dns lookup name.unknown-tld.: REFUSED\n");
}

TEST_F(DnsTest, Reverse) {
  Result r = cli({"dns", "reverse", "10.11.12.13"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "only-in-pod.test\n");

  Result v6 = cli({"--json", "dns", "reverse", "fd00::5"});
  EXPECT_EQ(v6.exit_code, 0) << v6;
  EXPECT_EQ(v6.out,
            "{\n"
            "  \"address\": \"fd00::5\",\n"
            "  \"status\": \"ok\",\n"
            "  \"names\": [\n"
            "    \"dual.pod.example\"\n"
            "  ],\n"
            "  \"ttl\": 60\n"
            "}\n");

  Result none = cli({"dns", "reverse", "10.99.99.99"});
  EXPECT_EQ(none.exit_code, 1) << none;
  EXPECT_EQ(none.err, "siphon: dns reverse 10.99.99.99: NXDOMAIN\n");
}

TEST_F(DnsTest, TimeoutWhenNothingListens) {
  // Nothing on 127.0.0.2:53 in the pod (dnsmasq is bound to 127.0.0.1).
  writeRootFile("etc/resolv.conf", "nameserver 127.0.0.2\noptions timeout:1 attempts:1\n");
  Result r = cli({"dns", "lookup", "only-in-pod.test"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.err, "siphon: dns lookup only-in-pod.test: TIMEOUT\n");
}

TEST_F(DnsTest, TimeoutWhenTheServerIsSilent) {
  // A socket bound to 127.0.0.3:53 in the pod that never answers: made by a
  // thread that entered the namespace (a socket keeps its namespace).
  Fd ns(open(("/var/run/netns/" + netns_->name()).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_GE(ns.get(), 0) << std::strerror(errno);
  int sink = -1;
  std::string error;
  std::thread([&] {
    if (setns(ns.get(), CLONE_NEWNET) != 0) {
      error = std::string("setns: ") + std::strerror(errno);
      return;
    }
    sink = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(53);
    inet_pton(AF_INET, "127.0.0.3", &addr.sin_addr);
    if (sink < 0 || bind(sink, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      error = std::string("bind 127.0.0.3:53: ") + std::strerror(errno);
    }
  }).join();
  Fd sink_fd(sink);
  ASSERT_EQ(error, "");

  writeRootFile("etc/resolv.conf", "nameserver 127.0.0.3\noptions timeout:1 attempts:1\n");
  Result r = cli({"dns", "lookup", "only-in-pod.test."});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.err, "siphon: dns lookup only-in-pod.test.: TIMEOUT\n");

  // A second nameserver that answers is used after the silent one.
  writeRootFile("etc/resolv.conf",
                "nameserver 127.0.0.3\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n");
  Result failover = cli({"dns", "lookup", "only-in-pod.test."});
  EXPECT_EQ(failover.exit_code, 0) << failover;
  EXPECT_EQ(failover.out, "10.11.12.13\n");
}

TEST_F(DnsTest, BadInputIsAnError) {
  Result ip = cli({"dns", "reverse", "not-an-ip"});
  EXPECT_EQ(ip.exit_code, 1) << ip;
  EXPECT_THAT(ip.err, HasSubstr("siphon: dns reverse not-an-ip failed: INVALID_ARGUMENT"));

  Result too_long = cli({"dns", "lookup", std::string(254, 'a')});
  EXPECT_EQ(too_long.exit_code, 1) << too_long;
  EXPECT_THAT(too_long.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(too_long.err, HasSubstr("too long"));

  Result empty = cli({"dns", "lookup", ""});
  EXPECT_EQ(empty.exit_code, 1) << empty;
  EXPECT_THAT(empty.err, HasSubstr("INVALID_ARGUMENT"));

  Result no_sub = cli({"dns"});
  EXPECT_EQ(no_sub.exit_code, 2) << no_sub;
}

TEST_F(DnsTest, InfoAdvertisesDns) {
  Result r = cli({"--json", "info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\"dns\""));
}

}  // namespace
}  // namespace siphon
