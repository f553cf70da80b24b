// The iptables steering backend against real netfilter: a "pod" netns with
// a veth to a "peer" netns (the outside world), an application server in
// the pod answering "original", and the test as the agent. Both flavours,
// IPv4 and IPv6; crash safety with a stand-in agent killed by SIGKILL.
// Nothing here touches the host's own tables: every iptables command runs
// inside the test's namespaces.
//
// Over 600 lines: one backend's cases (both flavours) sharing the namespace fixture below.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "agent/steal/iptables/iptables_steering.h"
#include "tests/fakes/sanitizers.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon::agent::steal {
namespace {

using harness::Clock;
using harness::Fd;
using harness::NetNs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// What the issue asks: chains gone within 1 s of the agent's death (in the
// normal build; an instrumented guard starts and runs slower).
constexpr auto kCleanupDeadline = std::chrono::seconds(1) * fakes::kSanitizerSlowdown;
// Only turns a hang into a failure.
constexpr auto kHangDeadline = std::chrono::seconds(15) * fakes::kSanitizerSlowdown;

// The owner id the in-process steerings pin (the agent's is random).
constexpr char kOwner[] = "5e1f00";

#define SKIP_UNLESS_ROOT() \
  if (geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces and iptables"

// Runs `fn` on a thread that entered the netns `fd` (setns moves only the
// calling thread; sockets keep the netns they were made in).
void inNetns(int fd, const std::function<void()>& fn) {
  std::thread t([&] {
    if (setns(fd, CLONE_NEWNET) != 0) {
      ADD_FAILURE() << "setns: " << std::strerror(errno);
      return;
    }
    fn();
  });
  t.join();
}

uint16_t portOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                       : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

// A TCP listener in a netns on the wildcard address. AF_INET6 with
// v6only=false takes IPv4 too.
Fd listenIn(int netns_fd, int family, bool v6only, uint16_t port = 0) {
  Fd out;
  inNetns(netns_fd, [&] {
    Fd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1, v6 = v6only ? 1 : 0;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6, sizeof v6);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(port);
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(port);
      len = sizeof *a;
    }
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len), 0) << std::strerror(errno);
    ASSERT_EQ(listen(fd.get(), 64), 0);
    out = std::move(fd);
  });
  return out;
}

// Answers every connection with reply(fd) + "\n", then closes it.
class Server {
 public:
  Server(Fd fd, std::function<std::string(int)> reply)
      : fd_(std::move(fd)), thread_([this, reply] {
          for (;;) {
            int c = accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) {
              if (errno == EINTR || errno == ECONNABORTED) continue;
              return;  // shut down
            }
            std::string msg = reply(c) + "\n";
            ssize_t ignored = write(c, msg.data(), msg.size());
            (void)ignored;
            close(c);
          }
        }) {}
  ~Server() {
    shutdown(fd_.get(), SHUT_RDWR);  // wakes accept()
    thread_.join();
  }
  uint16_t port() const { return portOf(fd_.get()); }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  std::thread thread_;
};

// Connects from inside `netns_fd` to ip:port and returns the first line
// answered, or "error: ..." (`exempt`: a passthrough socket).
std::string talk(int netns_fd, const std::string& ip, uint16_t port, Steering* exempt = nullptr) {
  std::string out;
  inNetns(netns_fd, [&] {
    auto addr = outgoing::ipAddress(ip, port);
    ASSERT_TRUE(addr.has_value()) << ip;
    Fd s(socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
    timeval tv{5, 0};  // a hang becomes an error
    setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (exempt != nullptr) {
      absl::Status st = exempt->exempt(s.get());
      ASSERT_TRUE(st.ok()) << st;
    }
    int rc = connect(s.get(), addr->get(), addr->len);
    int err = errno;
    if (exempt != nullptr) exempt->unexempt(s.get());
    if (rc != 0) {
      out = std::string("error: connect: ") + std::strerror(err);
      return;
    }
    char buf[256];
    for (;;) {
      ssize_t n = read(s.get(), buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
  });
  return out;
}

harness::Result mustRun(const std::vector<std::string>& argv) {
  harness::Result r = harness::run(argv);
  EXPECT_EQ(r.exit_code, 0) << r;
  return r;
}

// A pod netns (10.77.0.1, fd77::1) wired by a veth to a peer (10.77.0.2,
// fd77::2). The addresses exist only inside these namespaces.
class Pods {
 public:
  Pods() {
    if (!pod.created() || !peer.created()) return;
    mustRun({"ip", "-n", pod.name(), "link", "add", "sip0", "type", "veth", "peer", "name", "sip1",
             "netns", peer.name()});
    mustRun({"ip", "-n", pod.name(), "addr", "add", "10.77.0.1/24", "dev", "sip0"});
    mustRun({"ip", "-n", pod.name(), "addr", "add", "fd77::1/64", "dev", "sip0", "nodad"});
    mustRun({"ip", "-n", peer.name(), "addr", "add", "10.77.0.2/24", "dev", "sip1"});
    mustRun({"ip", "-n", peer.name(), "addr", "add", "fd77::2/64", "dev", "sip1", "nodad"});
    mustRun({"ip", "-n", pod.name(), "link", "set", "sip0", "up"});
    mustRun({"ip", "-n", peer.name(), "link", "set", "sip1", "up"});
    pod_fd = Fd(open(("/var/run/netns/" + pod.name()).c_str(), O_RDONLY | O_CLOEXEC));
    peer_fd = Fd(open(("/var/run/netns/" + peer.name()).c_str(), O_RDONLY | O_CLOEXEC));
  }
  bool ok() const { return pod_fd.get() >= 0 && peer_fd.get() >= 0; }

  // iptables-save output of a tool ("iptables-nft-save") in the pod.
  std::string save(const std::string& tool) const {
    return mustRun({"ip", "netns", "exec", pod.name(), tool}).out;
  }
  // Whether any of our chains for the pod is in any flavour or family.
  bool anyChainLeft() const { return anyChainOf(chainPrefixFor(pod.inode())); }
  // Whether a chain whose name starts with `name` is in any flavour or family.
  bool anyChainOf(const std::string& name) const {
    for (const char* tool : {"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save",
                             "ip6tables-legacy-save"}) {
      if (save(tool).find(name) != std::string::npos) return true;
    }
    return false;
  }

  NetNs pod;
  NetNs peer;
  Fd pod_fd;
  Fd peer_fd;
};

class StealIptables : public ::testing::TestWithParam<std::string> {
 protected:
  std::string flavor() const { return GetParam(); }
  std::string saveTool(bool v6 = false) const {
    return std::string(v6 ? "ip6tables-" : "iptables-") + flavor() + "-save";
  }
  std::string otherSaveTool() const {
    return flavor() == "nft" ? "iptables-legacy-save" : "iptables-nft-save";
  }
};

TEST_P(StealIptables, StealsLocalConnectionsOfAddedPortsOnly) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  const int pod = pods.pod_fd.get(), peer = pods.peer_fd.get();

  // The application: dual-stack, on two ports; only the first is stolen.
  Server app(listenIn(pod, AF_INET6, false), [](int) { return "original"; });
  Server other(listenIn(pod, AF_INET6, false), [](int) { return "other"; });
  const uint16_t port = app.port();
  // A remote server on the same port number: the app's own outgoing
  // connections there must not be steered.
  Server remote(listenIn(peer, AF_INET6, false, port), [](int) { return "remote"; });

  Fd v4 = listenIn(pod, AF_INET, true);
  Fd v6 = listenIn(pod, AF_INET6, true);
  IptablesOptions options;
  options.netns_fd = pod;
  options.netns_inode = pods.pod.inode();
  options.listeners = Listeners{v4.get(), v6.get(), portOf(v4.get()), portOf(v6.get())};
  options.flavor = flavor();
  options.guard_exe = SIPHON_AGENT_BIN;
  options.owner = kOwner;
  auto made = makeIptablesSteering(options);
  ASSERT_TRUE(made.ok()) << made.status();
  Steering& steering = **made;
  EXPECT_EQ(steering.name(), "iptables");
  // The agent: answers with the original destination.
  auto agentReply = [&steering](int fd) {
    auto orig = steering.originalDestination(fd);
    return orig.ok() ? "agent " + outgoing::formatAddress(*orig)
                     : "agent error " + orig.status().ToString();
  };
  Server agent4(std::move(v4), agentReply);
  Server agent6(std::move(v6), agentReply);

  const std::string p = std::to_string(port);
  EXPECT_EQ(talk(peer, "10.77.0.1", port), "original");

  ASSERT_TRUE(steering.addPort(port).ok());
  ASSERT_TRUE(steering.addPort(port).ok());  // twice: no-op
  EXPECT_EQ(talk(peer, "10.77.0.1", port), "agent 10.77.0.1:" + p);
  EXPECT_EQ(talk(peer, "fd77::1", port), "agent [fd77::1]:" + p);
  EXPECT_EQ(talk(pod, "127.0.0.1", port), "agent 127.0.0.1:" + p);
  EXPECT_EQ(talk(pod, "10.77.0.1", port), "agent 10.77.0.1:" + p);
  EXPECT_EQ(talk(pod, "::1", port), "agent [::1]:" + p);
  EXPECT_EQ(talk(pod, "fd77::1", port), "agent [fd77::1]:" + p);
  // Not local: untouched.
  EXPECT_EQ(talk(pod, "10.77.0.2", port), "remote");
  EXPECT_EQ(talk(pod, "fd77::2", port), "remote");
  // Not added: untouched.
  EXPECT_EQ(talk(peer, "10.77.0.1", other.port()), "other");
  EXPECT_EQ(talk(pod, "127.0.0.1", other.port()), "other");
  // Passthrough sockets reach the application.
  EXPECT_EQ(talk(pod, "10.77.0.1", port, &steering), "original");
  EXPECT_EQ(talk(pod, "127.0.0.1", port, &steering), "original");
  EXPECT_EQ(talk(pod, "fd77::1", port, &steering), "original");
  EXPECT_EQ(talk(pod, "::1", port, &steering), "original");

  // The chains live in the flavour asked for, named after the target and
  // the owner.
  ChainNames chains = chainNamesFor(pods.pod.inode(), kOwner);
  EXPECT_THAT(pods.save(saveTool()), HasSubstr(":" + chains.pre));
  EXPECT_THAT(pods.save(saveTool(true)), HasSubstr(":" + chains.out));
  EXPECT_THAT(pods.save(otherSaveTool()), Not(HasSubstr("SIPHON_")));

  ASSERT_TRUE(steering.removePort(port).ok());
  EXPECT_EQ(talk(peer, "10.77.0.1", port), "original");
  EXPECT_EQ(talk(peer, "fd77::1", port), "original");
  EXPECT_EQ(talk(pod, "127.0.0.1", port), "original");

  // Again after a removal (the chains stayed): the removal only put a
  // RETURN ahead of the REDIRECT (it deletes nothing: a deleting restore
  // waits for the kernel's RCU grace period), and stealing again takes
  // that RETURN out; no rule is doubled.
  ASSERT_TRUE(steering.addPort(port).ok());
  EXPECT_EQ(talk(peer, "10.77.0.1", port), "agent 10.77.0.1:" + p);
  EXPECT_EQ(talk(peer, "fd77::1", port), "agent [fd77::1]:" + p);
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  for (bool v6 : {false, true}) {
    const std::string save = pods.save(saveTool(v6));
    EXPECT_EQ(count(save, "--dport " + p + " -j REDIRECT"), 2u) << save;
    EXPECT_EQ(count(save, "--dport " + p + " -j RETURN"), 0u) << save;
  }
  ASSERT_TRUE(steering.removePort(port).ok());
  EXPECT_EQ(talk(peer, "10.77.0.1", port), "original");
  EXPECT_EQ(talk(pod, "::1", port), "original");
  for (bool v6 : {false, true}) {
    const std::string save = pods.save(saveTool(v6));
    EXPECT_EQ(count(save, "--dport " + p + " -j RETURN"), 2u) << save;
  }
  ASSERT_TRUE(steering.addPort(port).ok());
  EXPECT_EQ(talk(pod, "10.77.0.1", port), "agent 10.77.0.1:" + p);

  steering.stop();
  EXPECT_FALSE(pods.anyChainLeft()) << pods.save(saveTool());
  EXPECT_EQ(talk(peer, "10.77.0.1", port), "original");
}

TEST_P(StealIptables, IPv4OnlyWithoutAnIpv6Listener) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  Server app(listenIn(pods.pod_fd.get(), AF_INET6, false), [](int) { return "original"; });
  Fd v4 = listenIn(pods.pod_fd.get(), AF_INET, true);
  IptablesOptions options;
  options.netns_fd = pods.pod_fd.get();
  options.netns_inode = pods.pod.inode();
  options.listeners = Listeners{v4.get(), -1, portOf(v4.get()), 0};
  options.flavor = flavor();
  options.guard_exe = SIPHON_AGENT_BIN;
  options.owner = kOwner;
  auto made = makeIptablesSteering(options);
  ASSERT_TRUE(made.ok()) << made.status();
  Server agent(std::move(v4), [](int) { return "agent"; });
  ASSERT_TRUE((*made)->addPort(app.port()).ok());
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "agent");
  EXPECT_EQ(talk(pods.peer_fd.get(), "fd77::1", app.port()), "original");
  EXPECT_THAT(pods.save(saveTool(true)), Not(HasSubstr("SIPHON_")));
}

// ------------------------------------------------------------ crash safety

// The owner id of a helper agent unless a test gives it another.
constexpr char kHelperOwner[] = "00000a";

// A running steal_iptables_helper steering `port` of the pod as `owner`,
// answering stolen connections with `reply`.
class HelperAgent {
 public:
  HelperAgent(const Pods& pods, const std::string& flavor, uint16_t port,
              const std::string& log_path, const std::string& owner = kHelperOwner,
              const std::string& reply = "agent") {
    auto [out_r, out_w] = harness::makePipe();
    Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    child_ = harness::spawn({STEAL_IPTABLES_HELPER, "/var/run/netns/" + pods.pod.name(), flavor,
                             std::to_string(port), owner, reply},
                            std::nullopt, out_w.get(), log.get());
    out_w.reset();
    std::string line;
    const auto deadline = Clock::now() + kHangDeadline;
    while (Clock::now() < deadline) {
      pollfd p{out_r.get(), POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char c;
      if (read(out_r.get(), &c, 1) <= 0) break;
      if (c == '\n') break;
      line.push_back(c);
    }
    ready_ = line == "ready";
  }
  bool ready() const { return ready_; }
  harness::Child& child() { return child_; }

 private:
  harness::Child child_;
  bool ready_ = false;
};

// Live guard processes for `pre` (zombies excluded).
std::vector<pid_t> guardPids(const std::string& pre) {
  std::vector<pid_t> pids;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return pids;
  while (dirent* e = readdir(dir)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::string base = "/proc/" + std::string(e->d_name);
    std::string cmdline = harness::readFile(base + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(std::string(kIptablesGuardCommand)) == std::string::npos ||
        cmdline.find("--pre=" + pre + " ") == std::string::npos) {
      continue;
    }
    std::string stat = harness::readFile(base + "/stat");
    size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') continue;
    pids.push_back(pid);
  }
  closedir(dir);
  return pids;
}

// Polls until `done` or the deadline; whether it got there.
bool eventually(Clock::duration within, const std::function<bool()>& done) {
  const auto deadline = Clock::now() + within;
  for (;;) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST_P(StealIptables, SigkillOfTheAgentRemovesTheChains) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  harness::TempDir tmp;
  Server app(listenIn(pods.pod_fd.get(), AF_INET6, false), [](int) { return "original"; });
  HelperAgent agent(pods, flavor(), app.port(), tmp.path() + "/agent.log");
  ASSERT_TRUE(agent.ready()) << harness::readFile(tmp.path() + "/agent.log");
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "agent");
  EXPECT_EQ(talk(pods.peer_fd.get(), "fd77::1", app.port()), "agent");
  ASSERT_TRUE(pods.anyChainLeft());

  agent.child().kill();  // SIGKILL
  EXPECT_TRUE(eventually(kCleanupDeadline, [&] { return !pods.anyChainLeft(); }))
      << pods.save(saveTool());
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "original");
  EXPECT_EQ(talk(pods.peer_fd.get(), "fd77::1", app.port()), "original");
  EXPECT_TRUE(eventually(kHangDeadline, [&] {
    return guardPids(chainNamesFor(pods.pod.inode(), kHelperOwner).pre).empty();
  })) << "the guard exits once done";
}

TEST_P(StealIptables, ADeadGuardIsReplacedAndStillCleansUp) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  harness::TempDir tmp;
  const std::string log = tmp.path() + "/agent.log";
  const std::string pre = chainNamesFor(pods.pod.inode(), kHelperOwner).pre;
  Server app(listenIn(pods.pod_fd.get(), AF_INET6, false), [](int) { return "original"; });
  HelperAgent agent(pods, flavor(), app.port(), log);
  ASSERT_TRUE(agent.ready()) << harness::readFile(log);

  std::vector<pid_t> first = guardPids(pre);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(kill(first[0], SIGKILL), 0);
  std::vector<pid_t> second;
  ASSERT_TRUE(eventually(kHangDeadline, [&] {
    second = guardPids(pre);
    return second.size() == 1 && second[0] != first[0];
  })) << harness::readFile(log);
  EXPECT_THAT(harness::readFile(log), HasSubstr("steal_iptables_guard_died"));
  // The steering is untouched by the guard's death.
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "agent");
  EXPECT_TRUE(pods.anyChainLeft());

  agent.child().kill();
  EXPECT_TRUE(eventually(kCleanupDeadline, [&] { return !pods.anyChainLeft(); }))
      << pods.save(saveTool());
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "original");
}

// Chains of the pod as a previous agent that died with its guard would
// leave them, in `tool` ("iptables-legacy-restore"), stealing `port` to a
// port nobody listens on. `owner` "": an agent from before owner ids.
void plantStaleChains(const Pods& pods, const std::string& tool, uint16_t port,
                      const std::string& owner = "") {
  ChainNames c = chainNamesFor(pods.pod.inode(), owner);
  std::string text = "*nat\n:" + c.pre + " - [0:0]\n:" + c.out + " - [0:0]\n" +
                     "-I PREROUTING 1 -j " + c.pre + "\n-I OUTPUT 1 -j " + c.out + "\n" + "-A " +
                     c.pre + " -p tcp --dport " + std::to_string(port) +
                     " -j REDIRECT --to-ports 1\nCOMMIT\n";
  harness::TempDir tmp;
  std::string file = tmp.file("stale.rules", text);
  harness::Result r = harness::run(
      {"sh", "-c", "ip netns exec " + pods.pod.name() + " " + tool + " --noflush < " + file});
  ASSERT_EQ(r.exit_code, 0) << r;
}

TEST_P(StealIptables, StaleChainsAreRemovedOnStartUp) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  harness::TempDir tmp;
  const std::string log = tmp.path() + "/agent.log";
  ChainNames old = chainNamesFor(pods.pod.inode(), "");
  ChainNames dead = chainNamesFor(pods.pod.inode(), "dead00");
  ChainNames c = chainNamesFor(pods.pod.inode(), kHelperOwner);
  Server app(listenIn(pods.pod_fd.get(), AF_INET6, false), [](int) { return "original"; });
  for (const char* tool : {"iptables-nft-restore", "iptables-legacy-restore",
                           "ip6tables-nft-restore", "ip6tables-legacy-restore"}) {
    plantStaleChains(pods, tool, app.port());            // an older agent's
    plantStaleChains(pods, tool, app.port(), "dead00");  // a dead owner's
  }
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()),
            "error: connect: Connection refused");

  HelperAgent agent(pods, flavor(), app.port(), log);
  ASSERT_TRUE(agent.ready()) << harness::readFile(log);
  EXPECT_THAT(harness::readFile(log), HasSubstr("steal_stale_chains_removed"));
  EXPECT_THAT(pods.save(otherSaveTool()), Not(HasSubstr("SIPHON_")));
  // Ours only: one jump, the stale ones gone.
  std::string save = pods.save(saveTool());
  size_t jumps = 0;
  for (size_t at = save.find("-j " + c.pre); at != std::string::npos;
       at = save.find("-j " + c.pre, at + 1)) {
    ++jumps;
  }
  EXPECT_EQ(jumps, 1u) << save;
  EXPECT_FALSE(pods.anyChainOf(old.pre + " ")) << save;
  EXPECT_FALSE(pods.anyChainOf(dead.pre)) << save;
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "agent");
  EXPECT_EQ(talk(pods.peer_fd.get(), "fd77::1", app.port()), "agent");
}

TEST_P(StealIptables, RemoveStaleChainsOnItsOwn) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  plantStaleChains(pods, "iptables-" + flavor() + "-restore", 80);
  plantStaleChains(pods, "ip6tables-" + flavor() + "-restore", 80);
  // Another target's chains in the same tables are not ours.
  harness::Result other = harness::run(
      {"sh", "-c",
       "printf '*nat\\n:SIPHON_00000001_PRE - [0:0]\\n-A PREROUTING -j SIPHON_00000001_PRE\\n"
       "COMMIT\\n' | ip netns exec " +
           pods.pod.name() + " iptables-" + flavor() + "-restore --noflush"});
  ASSERT_EQ(other.exit_code, 0) << other;
  ASSERT_TRUE(pods.anyChainLeft());
  absl::Status s = removeStaleIptablesChains(pods.pod_fd.get(), pods.pod.inode());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(pods.anyChainLeft()) << pods.save(saveTool());
  EXPECT_THAT(pods.save(saveTool()), HasSubstr("-A PREROUTING -j SIPHON_00000001_PRE"));
  // Nothing left: a second call is a no-op.
  EXPECT_TRUE(removeStaleIptablesChains(pods.pod_fd.get(), pods.pod.inode()).ok());
}

// Runs the guard (the helper's iptablesGuardMain) on the pod's chains, both
// families, with `sock` as its end of the agent's socketpair; its exit code,
// or nullopt if it hangs.
std::optional<int> runGuard(const Pods& pods, const std::string& flavor, int sock) {
  const ChainNames c = chainNamesFor(pods.pod.inode(), "");
  std::vector<std::string> argv = {STEAL_IPTABLES_HELPER, std::string(kIptablesGuardCommand),
                                   "--netns-fd=10",       "--sock-fd=11",
                                   "--flavor=" + flavor,  "--pre=" + c.pre,
                                   "--out=" + c.out,      "--v6=1"};
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int ns = pods.pod_fd.get();
  pid_t pid = fork();
  if (pid == 0) {  // async-signal-safe calls only
    int ns_copy = fcntl(ns, F_DUPFD, 20), sock_copy = fcntl(sock, F_DUPFD, 20);
    if (ns_copy < 0 || sock_copy < 0 || dup2(ns_copy, 10) < 0 || dup2(sock_copy, 11) < 0) {
      _exit(126);
    }
    close_range(12, ~0U, 0);
    execv(args[0], args.data());
    _exit(127);
  }
  EXPECT_GT(pid, 0) << "fork: " << std::strerror(errno);
  harness::Child child(pid);
  return child.waitUntil(Clock::now() + kHangDeadline);
}

// The agent killed while its replacement guard starts: the guard cannot say
// it is ready (EPIPE), and must still remove the chains, not leave the port
// redirected to nothing. (Seen in CI: the instrumented guard starts slowly.)
TEST_P(StealIptables, AGuardWhoseAgentIsAlreadyGoneStillCleansUp) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  Server app(listenIn(pods.pod_fd.get(), AF_INET6, false), [](int) { return "original"; });
  plantStaleChains(pods, "iptables-" + flavor() + "-restore", app.port());
  plantStaleChains(pods, "ip6tables-" + flavor() + "-restore", app.port());
  ASSERT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()),
            "error: connect: Connection refused");
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Fd guard_end(sv[1]);
  ::close(sv[0]);  // the agent's end: gone before the guard is ready
  EXPECT_EQ(runGuard(pods, flavor(), guard_end.get()), 0);
  EXPECT_FALSE(pods.anyChainLeft()) << pods.save(saveTool());
  EXPECT_EQ(talk(pods.peer_fd.get(), "10.77.0.1", app.port()), "original");
  EXPECT_EQ(talk(pods.peer_fd.get(), "fd77::1", app.port()), "original");
}

// ------------------------------------------------- two agents, one target

// Two agents stealing different ports of one pod: each has its own chains,
// and neither agent's start, death or guard removes the other's. The second
// starts while the first is stealing (its start-up sweep must leave the
// first's chains alone), then the first is killed: its guard removes only
// its own chains.
TEST_P(StealIptables, TwoAgentsOnOneTargetNeverUndoEachOther) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  harness::TempDir tmp;
  const int peer = pods.peer_fd.get(), pod = pods.pod_fd.get();
  const ChainNames a_chains = chainNamesFor(pods.pod.inode(), "00000a");
  const ChainNames b_chains = chainNamesFor(pods.pod.inode(), "00000b");
  Server app1(listenIn(pod, AF_INET6, false), [](int) { return "original"; });
  Server app2(listenIn(pod, AF_INET6, false), [](int) { return "original"; });
  const uint16_t p1 = app1.port(), p2 = app2.port();

  HelperAgent a(pods, flavor(), p1, tmp.path() + "/a.log", "00000a", "agent-a");
  ASSERT_TRUE(a.ready()) << harness::readFile(tmp.path() + "/a.log");
  ASSERT_EQ(talk(peer, "10.77.0.1", p1), "agent-a");
  HelperAgent b(pods, flavor(), p2, tmp.path() + "/b.log", "00000b", "agent-b");
  ASSERT_TRUE(b.ready()) << harness::readFile(tmp.path() + "/b.log");
  EXPECT_THAT(harness::readFile(tmp.path() + "/b.log"),
              Not(HasSubstr("steal_stale_chains_removed")));
  // A third agent's start-up sweep (whatever its backend): both are alive.
  absl::Status swept = removeStaleIptablesChains(pod, pods.pod.inode());
  ASSERT_TRUE(swept.ok()) << swept;

  for (const char* ip : {"10.77.0.1", "fd77::1"}) {
    EXPECT_EQ(talk(peer, ip, p1), "agent-a") << ip;
    EXPECT_EQ(talk(peer, ip, p2), "agent-b") << ip;
  }
  // Inside the pod too (OUTPUT: both chains in turn, each only its port).
  EXPECT_EQ(talk(pod, "127.0.0.1", p1), "agent-a");
  EXPECT_EQ(talk(pod, "::1", p2), "agent-b");
  EXPECT_THAT(pods.save(saveTool()), HasSubstr(":" + a_chains.pre));
  EXPECT_THAT(pods.save(saveTool(true)), HasSubstr(":" + b_chains.out));

  a.child().kill();  // SIGKILL; its guard cleans up after it
  EXPECT_TRUE(eventually(kCleanupDeadline, [&] { return !pods.anyChainOf(a_chains.pre); }))
      << pods.save(saveTool());
  EXPECT_TRUE(eventually(kHangDeadline, [&] { return !pods.anyChainOf(a_chains.out); }))
      << pods.save(saveTool());
  for (const char* ip : {"10.77.0.1", "fd77::1"}) {
    EXPECT_EQ(talk(peer, ip, p1), "original") << ip;
    EXPECT_EQ(talk(peer, ip, p2), "agent-b") << ip;
  }
  EXPECT_THAT(pods.save(saveTool()), HasSubstr(":" + b_chains.pre));
  EXPECT_THAT(pods.save(saveTool(true)), HasSubstr(":" + b_chains.pre));
}

// A dead agent whose guard died too (killed together) leaves its chains;
// while its guard lives (here: stopped) they are not stale; once both are
// gone the next agent's start-up removes them, and not the live agent's.
TEST_P(StealIptables, ADeadOwnersChainsGoOnTheNextStartNotALiveOnes) {
  SKIP_UNLESS_ROOT();
  Pods pods;
  ASSERT_TRUE(pods.ok());
  harness::TempDir tmp;
  const int peer = pods.peer_fd.get(), pod = pods.pod_fd.get();
  const ChainNames a_chains = chainNamesFor(pods.pod.inode(), "00000a");
  const ChainNames b_chains = chainNamesFor(pods.pod.inode(), "00000b");
  Server app1(listenIn(pod, AF_INET6, false), [](int) { return "original"; });
  Server app2(listenIn(pod, AF_INET6, false), [](int) { return "original"; });
  const uint16_t p1 = app1.port(), p2 = app2.port();
  HelperAgent a(pods, flavor(), p1, tmp.path() + "/a.log", "00000a", "agent-a");
  ASSERT_TRUE(a.ready()) << harness::readFile(tmp.path() + "/a.log");
  HelperAgent b(pods, flavor(), p2, tmp.path() + "/b.log", "00000b", "agent-b");
  ASSERT_TRUE(b.ready()) << harness::readFile(tmp.path() + "/b.log");

  std::vector<pid_t> guard = guardPids(a_chains.pre);
  ASSERT_EQ(guard.size(), 1u);
  ASSERT_EQ(kill(guard[0], SIGSTOP), 0);
  a.child().kill();
  // A's guard still lives (and holds A's lock): not stale.
  absl::Status swept = removeStaleIptablesChains(pod, pods.pod.inode());
  ASSERT_TRUE(swept.ok()) << swept;
  EXPECT_TRUE(pods.anyChainOf(a_chains.pre));
  ASSERT_EQ(kill(guard[0], SIGKILL), 0);
  ASSERT_TRUE(eventually(kHangDeadline, [&] { return guardPids(a_chains.pre).empty(); }));
  // Nobody removed A's chains: P1 goes to A's closed listener.
  EXPECT_TRUE(pods.anyChainOf(a_chains.pre));
  EXPECT_EQ(talk(peer, "10.77.0.1", p1), "error: connect: Connection refused");

  // The next agent (stealing P1 in turn): its start-up removes A's chains.
  HelperAgent c(pods, flavor(), p1, tmp.path() + "/c.log", "00000c", "agent-c");
  ASSERT_TRUE(c.ready()) << harness::readFile(tmp.path() + "/c.log");
  EXPECT_THAT(harness::readFile(tmp.path() + "/c.log"),
              AllOf(HasSubstr("steal_stale_chains_removed"), HasSubstr("00000a")));
  EXPECT_FALSE(pods.anyChainOf(a_chains.pre)) << pods.save(saveTool());
  EXPECT_FALSE(pods.anyChainOf(a_chains.out)) << pods.save(saveTool());
  EXPECT_TRUE(pods.anyChainOf(b_chains.pre)) << pods.save(saveTool());
  for (const char* ip : {"10.77.0.1", "fd77::1"}) {
    EXPECT_EQ(talk(peer, ip, p1), "agent-c") << ip;
    EXPECT_EQ(talk(peer, ip, p2), "agent-b") << ip;
  }
}

INSTANTIATE_TEST_SUITE_P(Flavors, StealIptables, ::testing::Values("nft", "legacy"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace siphon::agent::steal
