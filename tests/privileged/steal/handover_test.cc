// Handover end to end, as root, with real traffic (docs/CONTINUITY.md,
// "Handover"): the steal tests' pod, client namespace and agent
// (steal_fixture.h), the agent started with --handover-socket, and a second
// siphon-agent started with --take-over while clients use the first:
//
//  - under wrk's keep-alive load through a stolen port: no socket error, no
//    non-2xx, every answer the stolen one; the old agent exits 0, the CLI
//    says once that its agent was handed over;
//  - 1 GiB through a stolen connection and 1 GiB through an outgoing one
//    (siphon forward), each paused by its reader mid-way while the handover
//    runs: byte-exact;
//  - the new agent killed (SIGKILL) after it imported everything and before
//    it confirmed: the old agent goes on serving the same connections and
//    new ones, and nothing of the new one is left (links, chains);
//  - ten handovers in a row with a connection held across all of them, a
//    mirror and a packet capture: it echoes after each, descriptors, links
//    and chains stay level, the capture has each request once;
//  - a packet capture (`siphon capture`) of datagrams streaming through
//    the handover: every one in the file once, in order;
//  - a mirror of a connection streaming through the handover, replayed by
//    `siphon mirror --to`: the replay is byte-exact, no gap;
//  - a filtered steal under two wrk loads (one its filter matches, one
//    not): every request answered by the right side, none failed; its
//    keep-alive connections park between requests and move;
//  - on a filtered port, a connection that is not HTTP and one upgraded by
//    the application (raw splices) move mid-stream and echo after it;
//  - refusals: a new agent for another target, and an agent holding what
//    cannot move in time (a filtered request answered after the wait):
//    one line on each side, the old agent serves, the request is answered;
//  - root in the pod without the agent's capabilities or its key, while a
//    stolen download runs: it cannot reach the socket (the agent's own
//    mount namespace, /proc/PID/root of a process that is not dumpable),
//    and root that reaches it without the key gets a refusal and nothing
//    else; the agent never froze, the client never resumed; the agent's
//    own successor (--take-over auto) still takes it over.
//
// Both backends (sk_lookup, iptables). Without root every test skips.
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "siphon/v1/handover.pb.h"
#include "tests/privileged/steal/steal_fixture.h"

namespace siphon {
namespace {

// An agent of a handover: its process, its log, its ready endpoint.
struct NewAgent {
  std::unique_ptr<Agent> agent;
  std::string endpoint;
};

// The fewest descriptors `pid` holds over five looks 20 ms apart: one look
// may catch one that comes and goes (a metrics scrape, a resume's accept).
size_t openFds(pid_t pid);
size_t steadyFds(pid_t pid) {
  size_t least = SIZE_MAX;
  for (int i = 0; i < 5; ++i) {
    least = std::min(least, openFds(pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return least;
}

size_t openFds(pid_t pid) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

char processState(pid_t pid) {
  std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// Reads Pattern(seed) from `fd`: `pause_at` bytes, then waits for `go`,
// then the rest to EOF. The bytes that matched, and whether EOF was clean.
uint64_t receivePaused(int fd, uint64_t seed, uint64_t pause_at, std::promise<void>* paused,
                       std::shared_future<void> go, bool* clean_eof) {
  Pattern p(seed);
  std::string buf(256 << 10, '\0'), want(256 << 10, '\0');
  uint64_t good = 0;
  bool waited = false;
  *clean_eof = false;
  while (true) {
    if (!waited && good >= pause_at) {
      waited = true;
      paused->set_value();
      go.wait();
    }
    const size_t ask = waited ? buf.size() : std::min<uint64_t>(buf.size(), pause_at - good);
    ssize_t n = ::read(fd, buf.data(), ask);
    if (n == 0) {
      *clean_eof = true;
      break;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    p.fill(want.data(), static_cast<size_t>(n));
    if (std::memcmp(buf.data(), want.data(), static_cast<size_t>(n)) != 0) break;
    good += static_cast<uint64_t>(n);
  }
  if (!waited) paused->set_value();
  return good;
}

// What a process that reaches a handover socket gets: it connects (or
// not: the errno), says say[0], then the next of `say` after each message
// it hears, and reads until the other side closes or stays silent for 2 s;
// the messages, and the descriptors that rode on them (closed at once).
struct Intrusion {
  int connect_errno = 0;
  std::vector<v1::HandoverMessage> heard;
  size_t descriptors = 0;
  std::string said() const {
    std::string out;
    for (const auto& m : heard) out += m.ShortDebugString() + "; ";
    return out + std::to_string(descriptors) + " descriptors";
  }
};

sockaddr_un unixAddress(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  return a;
}

Intrusion intrude(const std::string& path, const std::vector<v1::HandoverMessage>& say) {
  Intrusion r;
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  const sockaddr_un a = unixAddress(path);
  if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    r.connect_errno = errno;
    return r;
  }
  size_t said = 0;
  auto next = [&] {
    if (said == say.size()) return;
    const std::string bytes = say[said++].SerializeAsString();
    (void)::send(s.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  };
  next();
  while (true) {
    pollfd p{s.get(), POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) break;
    std::string buf(64 << 10, '\0');
    std::vector<char> control(CMSG_SPACE(sizeof(int) * 253));
    iovec iov{buf.data(), buf.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control.data();
    m.msg_controllen = control.size();
    const ssize_t n = ::recvmsg(s.get(), &m, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        ::close(fd);
        ++r.descriptors;
      }
    }
    if (n <= 0) break;
    v1::HandoverMessage msg;
    msg.ParseFromArray(buf.data(), static_cast<int>(n));
    r.heard.push_back(msg);
    next();
  }
  return r;
}

// A hello as any process can write one: the public values of the target
// (its pid and netns inode, in /proc), and nothing else.
v1::HandoverMessage publicHello(pid_t target, uint64_t netns_inode) {
  v1::HandoverMessage m;
  v1::HandoverHello& h = *m.mutable_hello();
  h.set_format(3);
  h.set_min_format(1);
  h.set_agent_version("0.1.0");
  h.set_pid(::getpid());
  h.set_target_pid(target);
  h.set_target_netns_inode(netns_inode);
  return m;
}

// The capabilities a container gets by default (containerd, CRI-O,
// Docker): root without CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_NET_ADMIN or
// CAP_DAC_READ_SEARCH.
constexpr uint64_t kContainerDefaultCaps =
    (1ull << CAP_CHOWN) | (1ull << CAP_DAC_OVERRIDE) | (1ull << CAP_FSETID) | (1ull << CAP_FOWNER) |
    (1ull << CAP_MKNOD) | (1ull << CAP_NET_RAW) | (1ull << CAP_SETGID) | (1ull << CAP_SETUID) |
    (1ull << CAP_SETFCAP) | (1ull << CAP_SETPCAP) | (1ull << CAP_NET_BIND_SERVICE) |
    (1ull << CAP_SYS_CHROOT) | (1ull << CAP_KILL) | (1ull << CAP_AUDIT_WRITE);

// In a child process, as uid 0 with only `caps`, in the network namespace
// `netns`: a connect to each of `paths`. Its errno for each (0: connected;
// -1: the child could not drop to `caps`).
std::vector<int> connectAsContainerRoot(const std::string& netns,
                                        const std::vector<std::string>& paths, uint64_t caps) {
  std::vector<sockaddr_un> addrs;
  for (const auto& p : paths) addrs.push_back(unixAddress(p));
  Fd ns(::open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC));
  int out[2];
  if (ns.get() < 0 || ::pipe2(out, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only system calls from here: the parent has threads.
    ::close(out[0]);
    bool dropped = ::setns(ns.get(), CLONE_NEWNET) == 0;
    for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
      if ((caps & (1ull << cap)) == 0) ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
    }
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    data[0].effective = data[0].permitted = static_cast<uint32_t>(caps);
    data[1].effective = data[1].permitted = static_cast<uint32_t>(caps >> 32);
    dropped = dropped && ::syscall(SYS_capset, &header, data) == 0;
    ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    // Check what the kernel says it holds now.
    __user_cap_data_struct now[2] = {};
    dropped = dropped && ::syscall(SYS_capget, &header, now) == 0 &&
              (now[0].effective & (1u << CAP_SYS_PTRACE)) == 0 && ::getuid() == 0;
    for (const sockaddr_un& a : addrs) {
      int e = -1;
      if (dropped) {
        const int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        e = ::connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
        ::close(s);
      }
      (void)!::write(out[1], &e, sizeof e);
    }
    ::_exit(0);
  }
  ::close(out[1]);
  std::vector<int> errnos;
  int e;
  while (::read(out[0], &e, sizeof e) == static_cast<ssize_t>(sizeof e)) errnos.push_back(e);
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return errnos;
}

// `pid` and every process below it.
std::vector<pid_t> processTree(pid_t pid) {
  std::vector<pid_t> tree = {pid};
  for (size_t i = 0; i < tree.size(); ++i) {
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator("/proc", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      const std::string name = it->path().filename();
      if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
      const std::string stat = readFile(it->path().string() + "/stat");
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 2));
      char state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      const pid_t child = std::stoi(name);
      if (ppid == tree[i] && std::find(tree.begin(), tree.end(), child) == tree.end()) {
        tree.push_back(child);
      }
    }
  }
  return tree;
}

class HandoverTest : public StealDrainLoadTest {
 protected:
  void SetUp() override {
    StealDrainLoadTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    socket_ = dir_->path() + "/handover.sock";
    // Every agent serves its metrics on the same address: the new one
    // binds it once the old one let go.
    Fd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(::bind(probe.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
    metrics_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    probe.reset();
    ASSERT_NO_FATAL_FAILURE(restartAgent({"--handover-socket", socket_, "--metrics", metrics_}));
  }

  void TearDown() override {
    if (HasFailure()) {
      for (size_t i = 0; i < agents_.size(); ++i) {
        std::cerr << "--- new agent " << i << " log\n" << agents_[i]->log() << "---\n";
      }
    }
    for (auto& a : agents_) a->child().kill();
    StealDrainLoadTest::TearDown();
  }

  // A new agent taking over the one on socket_ (the fixture's agent_, or
  // the last one this test started), with `env` added.
  // `from`: --take-over's value (socket_ by default; "auto" finds it).
  Agent* takeOver(pid_t target, const std::vector<std::string>& env = {},
                  const std::string& from = "") {
    std::vector<std::string> argv = {"--listen",       "127.0.0.1:0", "--token-file",
                                     token_file_,      "--log-level", "debug",
                                     "--steal-backend", GetParam().backend,
                                     "--handover-socket", socket_,   "--take-over",
                                     from.empty() ? socket_ : from, "--session-grace", "3s",
                                     "--metrics", metrics_,
                                     "targeted",       "--pid",       std::to_string(target)};
    std::vector<std::string> full_env = cleanEnv(env);
    agents_.push_back(std::make_unique<Agent>(
        argv, full_env, dir_->path() + "/agent-" + std::to_string(agents_.size() + 1) + ".log"));
    return agents_.back().get();
  }

  // The agent now serving (the last that took over, or the first).
  Agent& current() { return agents_.empty() ? *agent_ : *agents_.back(); }

  // Hands the current agent over to a new one; expects success: the new
  // agent's ready line, the old one's exit 0.
  ::testing::AssertionResult handOver(const std::string& from = "") {
    Agent& old = current();
    Agent* next = takeOver(httpd80_.pid(), {}, from);
    std::string endpoint;
    if (auto r = next->ready(&endpoint); !r) return r;
    if (endpoint != endpoint_) {
      return ::testing::AssertionFailure()
             << "the new agent listens on " << endpoint << ", not " << endpoint_;
    }
    auto code = old.child().waitUntil(Clock::now() + std::chrono::seconds(10));
    if (code != 0) {
      return ::testing::AssertionFailure()
             << "the old agent exited " << (code ? std::to_string(*code) : "never")
             << "; its log:\n"
             << old.log();
    }
    if (old.log().find("handover_done") == std::string::npos) {
      return ::testing::AssertionFailure() << "no handover_done in the old agent's log";
    }
    return ::testing::AssertionSuccess();
  }

  // Ends the steal `s` (SIGINT: exit 0; `original_port`, when the pod's
  // server there answers "original", back to it soon after), then the
  // agent now serving (SIGTERM: exit 0), and checks that nothing of either
  // is left in the pod.
  void endStealAndAgent(Proc* s, std::optional<uint16_t> original_port) {
    s->signal(SIGINT);
    EXPECT_EQ(s->finish(), 0) << s->err;
    if (original_port) {
      EXPECT_TRUE(originalWithin(std::chrono::seconds(5), *original_port));
    }
    ::kill(current().child().pid(), SIGTERM);
    EXPECT_EQ(current().child().waitUntil(Clock::now() + std::chrono::seconds(10)), 0);
    EXPECT_EQ(leftovers(), "");
  }

  // sk_lookup links on the pod's netns.
  size_t podLinks() {
    size_t n = 0;
    for (const harness::BpfLink& link : harness::bpfLinks()) {
      if (link.type == BPF_LINK_TYPE_NETNS && link.netns_ino == pod_->inode()) ++n;
    }
    return n;
  }

  // SIPHON chains in the pod (iptables, both families, both flavours).
  size_t podChains() {
    size_t n = 0;
    for (const char* tool : {"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save",
                             "ip6tables-legacy-save"}) {
      Result r = run({"ip", "netns", "exec", pod_->name(), tool});
      std::istringstream in(r.out);
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind(":SIPHON", 0) == 0) ++n;
      }
    }
    return n;
  }

  std::string socket_;
  std::string metrics_;  // every agent's --metrics address
  std::vector<std::unique_ptr<Agent>> agents_;
  std::vector<std::unique_ptr<Agent>> dead_;  // killed on purpose, kept for their logs
};

// wrk's 16 keep-alive connections through a stolen port while the agent is
// handed over: every request answered, by the local server, none failed.
TEST_P(HandoverTest, KeepAliveLoadThroughAStolenPortLosesNoRequest) {
  LocalServer local(httpKeepAlive("stolen\n"));
  LocalServer app(httpKeepAlive("original\n"), pod_->name(), kLoadPort);
  Proc* s = steal({"--port", std::to_string(kLoadPort), "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 8080"));
  auto stop_reading = drainOutput(s);
  auto wrk = startWrk(6, {});
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto t0 = Clock::now();
  ASSERT_TRUE(handOver());
  const int64_t took = msSince(t0);
  WrkCounts w = wrk.get();
  stop_reading();
  std::cerr << "wrk: " << w.raw << "handover (new agent started to old agent gone): " << took
            << " ms\n";
  ASSERT_TRUE(w.parsed) << w;
  EXPECT_GT(w.requests, 1000) << w;
  EXPECT_EQ(w.socketErrors(), 0) << w;
  EXPECT_EQ(w.non2xx, 0) << w;
  EXPECT_EQ(w.other, 0) << w;
  EXPECT_EQ(w.original, 0) << w;
  EXPECT_EQ(w.stolen, w.requests) << w;
  EXPECT_EQ(app.accepted(), 0);
  EXPECT_THAT(s->err, HasSubstr("the agent was handed over to a new agent process); session "
                                "resumed, nothing lost"));
  EXPECT_THAT(current().log(), HasSubstr("handover_taken"));
  // New connections reach the new agent's steal; ending the steal gives the
  // port back, and terminating the new agent leaves nothing.
  EXPECT_EQ(curl(kLoadPort), "stolen\n");
  endStealAndAgent(s, kLoadPort);
}

// A filtered steal under load from two wrk at once, across a handover:
// the requests its filter matches (a header) go to the local server, the
// others on to the application in the pod, over the same keep-alive
// connections, before, during and after; no request fails and none goes
// to the wrong side. The HTTP connections park between requests and move.
TEST_P(HandoverTest, FilteredStealUnderLoadLosesNoRequestAndRoutesEachRight) {
  LocalServer local(httpKeepAlive("stolen\n"));
  LocalServer app(httpKeepAlive("original\n"), pod_->name(), kLoadPort);
  Proc* s = steal({"--port", std::to_string(kLoadPort), "--filter-header", "x-siphon: ^me$",
                   "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 8080"));
  auto stop_reading = drainOutput(s);
  auto mine = startWrk(6, {"-H", "x-siphon: me"});
  auto theirs = startWrk(6, {});
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(handOver());
  WrkCounts m = mine.get();
  WrkCounts t = theirs.get();
  stop_reading();
  std::cerr << "wrk (x-siphon: me): " << m.raw << "wrk (no header): " << t.raw;
  ASSERT_TRUE(m.parsed) << m;
  ASSERT_TRUE(t.parsed) << t;
  EXPECT_GT(m.requests, 500) << m;
  EXPECT_GT(t.requests, 500) << t;
  for (const WrkCounts* w : {&m, &t}) {
    EXPECT_EQ(w->socketErrors(), 0) << *w;
    EXPECT_EQ(w->non2xx, 0) << *w;
    EXPECT_EQ(w->other, 0) << *w;
  }
  EXPECT_EQ(m.stolen, m.requests) << m;
  EXPECT_EQ(t.original, t.requests) << t;
  // The old agent moved connections it held between requests (wrk's
  // keep-alive ones), it did not close them.
  EXPECT_THAT(current().log(), HasSubstr("handover_taken"));
  EXPECT_THAT(current().log(), Not(HasSubstr("http_connections=0")));
  EXPECT_THAT(current().log(), HasSubstr("http_connections="));
  EXPECT_THAT(current().log(), Not(HasSubstr("http1_connection_failed")));
  EXPECT_THAT(s->err, HasSubstr("session resumed, nothing lost"));
  // After it: the new agent routes new connections by the same filter.
  EXPECT_EQ(run({"ip", "netns", "exec", client_->name(), "curl", "-sS", "-g", "--max-time", "5",
                 "-H", "x-siphon: me", podAddress().url(kLoadPort)})
                .out,
            "stolen\n");
  EXPECT_EQ(curl(kLoadPort), "original\n");
  endStealAndAgent(s, kLoadPort);
}

// A filtered port's connections the engine does not parse: one that is not
// HTTP, and one upgraded (101) by the application. Both are raw splices to
// the application and move mid-stream: each echoes after the handover on
// the same connection, and the application never saw a new one.
TEST_P(HandoverTest, RawAndUpgradedConnectionsOfAFilteredPortMoveMidStream) {
  LocalServer local(httpKeepAlive("stolen\n"));
  LocalServer app(
      [](int fd) {
        std::string first(4096, '\0');
        const ssize_t n = ::read(fd, first.data(), first.size());
        if (n <= 0) return;
        first.resize(static_cast<size_t>(n));
        if (first.rfind("GET /ws ", 0) == 0) {
          const std::string ok =
              "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n";
          if (!writeAll(fd, ok.data(), ok.size())) return;
        } else if (!writeAll(fd, first.data(), first.size())) {
          return;
        }
        echoServe(fd);
      },
      pod_->name(), kLoadPort);
  Proc* s = steal({"--port", std::to_string(kLoadPort), "--filter-header", "x-siphon: ^me$",
                   "--to", local.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 8080"));
  Fd raw(connectFrom(client_->name(), podAddress(), kLoadPort));
  ASSERT_GE(raw.get(), 0);
  const std::string tls_like("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11);
  EXPECT_EQ(echoOnce(raw.get(), tls_like), tls_like);
  Fd up(connectFrom(client_->name(), podAddress(), kLoadPort));
  ASSERT_GE(up.get(), 0);
  const std::string upgrade =
      "GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n";
  ASSERT_TRUE(writeAll(up.get(), upgrade.data(), upgrade.size()));
  std::string head;
  char c;
  while (head.find("\r\n\r\n") == std::string::npos && ::read(up.get(), &c, 1) == 1) head += c;
  ASSERT_THAT(head, HasSubstr("101"));
  EXPECT_EQ(echoOnce(up.get(), "ws-before"), "ws-before");

  ASSERT_TRUE(handOver());
  EXPECT_EQ(echoOnce(raw.get(), "raw-after"), "raw-after");
  EXPECT_EQ(echoOnce(up.get(), "ws-after"), "ws-after");
  EXPECT_EQ(app.accepted(), 2);
  EXPECT_THAT(current().log(), HasSubstr("passthroughs=2"));
  raw.reset();
  up.reset();
  endStealAndAgent(s, std::nullopt);  // the pod's echo server answers no GET
}

// 1 GiB down a stolen connection and 1 GiB down an outgoing one, each
// paused by its reader a quarter of the way while the agent is handed over.
TEST_P(HandoverTest, StolenAndOutgoingDownloadsArriveByteExact) {
  constexpr uint64_t kTotal = 1ull << 30;
  constexpr uint64_t kPauseAt = 256ull << 20;
  LocalServer stolen_source([](int fd) { sendPattern(fd, 11, kTotal); });
  LocalServer pod_source([](int fd) { sendPattern(fd, 22, kTotal); }, pod_->name(), 8092);
  Proc* s = steal({"--port", "80", "--to", stolen_source.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  steals_.push_back(std::make_unique<Proc>(
      std::vector<std::string>{SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_,
                               "forward", "-L", "0:127.0.0.1:8092"},
      cleanEnv()));
  Proc* fwd = steals_.back().get();
  ASSERT_TRUE(fwd->readUntil([](const std::string&, const std::string& err) {
    return err.find("forwarding ") != std::string::npos || err.find("siphon:") != std::string::npos;
  })) << fwd->err;
  const size_t colon = fwd->err.find("127.0.0.1:");
  ASSERT_NE(colon, std::string::npos) << fwd->err;
  const uint16_t fwd_port = static_cast<uint16_t>(std::stoi(fwd->err.substr(colon + 10)));

  Fd down1(connectFrom(client_->name(), podAddress(), 80));
  ASSERT_GE(down1.get(), 0);
  setTimeouts(down1.get(), 60);
  Fd down2(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_storage ss{};
  socklen_t len = 0;
  Address loop{AF_INET, "127.0.0.1"};
  ss = sockaddrOf(loop, fwd_port, &len);
  ASSERT_EQ(::connect(down2.get(), reinterpret_cast<sockaddr*>(&ss), len), 0) << strerror(errno);
  setTimeouts(down2.get(), 60);

  std::promise<void> go;
  std::shared_future<void> go_f = go.get_future().share();
  std::promise<void> paused1, paused2;
  auto p1 = paused1.get_future();
  auto p2 = paused2.get_future();
  bool eof1 = false, eof2 = false;
  auto r1 = std::async(std::launch::async, [&] {
    return receivePaused(down1.get(), 11, kPauseAt, &paused1, go_f, &eof1);
  });
  auto r2 = std::async(std::launch::async, [&] {
    return receivePaused(down2.get(), 22, kPauseAt, &paused2, go_f, &eof2);
  });
  p1.wait();
  p2.wait();
  const bool handed = handOver();
  go.set_value();
  const uint64_t got1 = r1.get(), got2 = r2.get();
  ASSERT_TRUE(handed);
  EXPECT_EQ(got1, kTotal) << "stolen download";
  EXPECT_TRUE(eof1);
  EXPECT_EQ(got2, kTotal) << "outgoing download";
  EXPECT_TRUE(eof2);
  EXPECT_THAT(current().log(), HasSubstr("handover_taken"));
  EXPECT_TRUE(s->readUntil([](const std::string&, const std::string& err) {
    return err.find("handed over to a new agent process") != std::string::npos;
  })) << s->err;
}

// The new agent stops (a test hook) with everything imported, its own
// steering attached and nothing confirmed, and is killed: the old agent
// thaws and serves the connection it held and new ones; nothing of the new
// agent is left in the pod.
TEST_P(HandoverTest, ANewAgentKilledBeforeItConfirmsLeavesTheOldOneServing) {
  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd held = stealAndConnect(local, &s);
  ASSERT_GE(held.get(), 0);
  const size_t links_before = podLinks();
  const size_t chains_before = podChains();
  Agent* next = takeOver(httpd80_.pid(), {"SIPHON_TEST_HANDOVER_STOP=before-confirm"});
  const pid_t pid = next->child().pid();
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (processState(pid) != 'T' && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(processState(pid), 'T') << next->log();
  // Stopped with its steering beside the old one's.
  EXPECT_THAT(next->log(), HasSubstr("handover=true"));
  next->child().kill();
  dead_.push_back(std::move(agents_.back()));
  agents_.pop_back();
  // The old agent sees the socket close and goes on.
  const auto thaw_deadline = Clock::now() + std::chrono::seconds(10);
  while (agent_->log().find("handover_thawed") == std::string::npos &&
         Clock::now() < thaw_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(agent_->log(), HasSubstr("handover_thawed"));
  EXPECT_FALSE(agent_->child().waitUntil(Clock::now()).has_value()) << "the old agent exited";
  EXPECT_EQ(echoOnce(held.get(), "after"), "after");
  Fd fresh(connectFrom(client_->name(), podAddress(), 80));
  ASSERT_GE(fresh.get(), 0);
  EXPECT_EQ(echoOnce(fresh.get(), "new"), "new");
  // The new agent's link (sk_lookup) went with it; its chains (iptables)
  // went with its guard.
  const auto clean_deadline = Clock::now() + std::chrono::seconds(10);
  while ((podLinks() != links_before || podChains() != chains_before) &&
         Clock::now() < clean_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(podLinks(), links_before);
  EXPECT_EQ(podChains(), chains_before);
  // And a handover after that one works.
  EXPECT_TRUE(handOver());
  EXPECT_EQ(echoOnce(held.get(), "later"), "later");
}

// Ten handovers in a row, one connection held across all of them, echoing
// after each: the agents' descriptors, the state handed over, the pod's
// links and chains level, a mirror of another port moving each time and
// seeing every request; every other new agent finds the old one with
// --take-over auto.
TEST_P(HandoverTest, TenHandoversInARowLeakNothing) {
  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd held = stealAndConnect(local, &s);
  ASSERT_GE(held.get(), 0);
  // A mirror of another port moves each time too (its ring buffer, its
  // capture), and sees every connection made to that port meanwhile.
  steals_.push_back(std::make_unique<Proc>(
      std::vector<std::string>{SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_,
                               "mirror", "--port", "81"},
      cleanEnv()));
  Proc* m = steals_.back().get();
  ASSERT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
    return err.find("mirror: port 81") != std::string::npos ||
           err.find("siphon:") != std::string::npos;
  })) << m->err;
  // And a packet capture of port 81's traffic (its packet socket and ring).
  const std::string pcap = dir_->path() + "/ten.pcap";
  steals_.push_back(std::make_unique<Proc>(
      std::vector<std::string>{SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_,
                               "capture", "-i", "any", "-w", pcap, "tcp", "port", "81"},
      cleanEnv()));
  Proc* cap = steals_.back().get();
  ASSERT_TRUE(cap->readUntil([](const std::string&, const std::string& err) {
    return err.find("capturing on") != std::string::npos ||
           err.find("siphon:") != std::string::npos;
  })) << cap->err;
  const size_t links = podLinks();
  const size_t chains = podChains();
  std::vector<size_t> fds;
  std::vector<size_t> state_bytes;
  for (int i = 0; i < 10; ++i) {
    // Every other one finds the old agent by itself (--take-over auto: its
    // process, and its socket at our --handover-socket path in its root).
    ASSERT_TRUE(handOver(i % 2 == 1 ? "auto" : "")) << "handover " << i + 1;
    ASSERT_EQ(echoOnce(held.get(), "round" + std::to_string(i)), "round" + std::to_string(i));
    Fd fresh(connectFrom(client_->name(), podAddress(), 80));
    ASSERT_GE(fresh.get(), 0);
    ASSERT_EQ(echoOnce(fresh.get(), "new"), "new");
    ASSERT_EQ(curl(81), "original-81\n");
    fds.push_back(steadyFds(current().child().pid()));
    {
      // What the old agent handed over (its handover_done line).
      Agent& old = agents_.size() >= 2 ? *agents_[agents_.size() - 2] : *agent_;
      const std::string log = old.log();
      const size_t at = log.find("state_bytes=", log.find("handover_done"));
      state_bytes.push_back(at == std::string::npos ? 0 : std::stoul(log.substr(at + 12)));
    }
    EXPECT_EQ(podLinks(), links) << "after handover " << i + 1;
    // The new agent's metrics, on the old one's address.
    Result m = run({"curl", "-sS", "--max-time", "5", "http://" + metrics_ + "/metrics"});
    EXPECT_THAT(m.out, HasSubstr("siphon_handovers_total{result=\"taken\"} 1"))
        << "after handover " << i + 1 << ": " << m;
  }
  // Chains: the old agent's go as it exits (its guard), a moment later.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (podChains() != chains && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(podChains(), chains);
  // The 10th agent holds what the 2nd did: a descriptor lost per handover
  // would be 8 more.
  EXPECT_LE(fds.back(), fds[1] + 2) << "descriptors grow with each handover";
  // And the state handed over stays level (a few bytes of counters may
  // grow, an unacknowledged frame come and go): a session's state growing
  // with each handover would be a leak carried from agent to agent.
  ASSERT_EQ(state_bytes.size(), 10u);
  EXPECT_GT(state_bytes[1], 0u) << "no state_bytes in the handover_done line";
  EXPECT_LE(state_bytes.back(), state_bytes[1] + 48)
      << "the state grows with each handover: " << ::testing::PrintToString(state_bytes);
  EXPECT_THAT(current().log(), HasSubstr("handover_taken"));
  // `siphon sessions` counts them for the session that went through them.
  Result sessions = run({SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_,
                         "sessions"});
  EXPECT_EQ(sessions.exit_code, 0) << sessions;
  EXPECT_THAT(sessions.out, HasSubstr("attached (10 handovers)")) << sessions;
  // The mirror saw the ten requests to port 81, one connection each.
  EXPECT_TRUE(m->readUntil([](const std::string& out, const std::string&) {
    size_t n = 0;
    for (size_t at = out.find("GET / "); at != std::string::npos; at = out.find("GET / ", at + 1)) {
      ++n;
    }
    return n >= 10;
  })) << m->out << m->err;
  EXPECT_THAT(m->err, Not(HasSubstr("missing"))) << m->err;
  // The capture went through all ten: each request to port 81 is in its
  // file once, and it ends cleanly.
  cap->signal(SIGINT);
  EXPECT_EQ(cap->finish(), 0) << cap->err;
  EXPECT_THAT(cap->err, Not(HasSubstr("siphon: capture"))) << cap->err;
  const std::string captured = readFile(pcap);
  size_t gets = 0;
  for (size_t at = captured.find("GET / "); at != std::string::npos;
       at = captured.find("GET / ", at + 1)) {
    ++gets;
  }
  EXPECT_EQ(gets, 10u) << "requests to port 81 in the capture";
}

// Sequence numbers of the datagrams a pcap file holds: each record's
// "SIPHONSEQ" marker and the eight digits after it, in file order.
std::vector<int> handoverSequencesIn(const std::string& pcap) {
  std::vector<int> out;
  size_t at = 24;  // the global header
  while (at + 16 <= pcap.size()) {
    uint32_t caplen = 0;
    std::memcpy(&caplen, pcap.data() + at + 8, 4);
    const std::string_view data(pcap.data() + at + 16,
                                std::min<size_t>(caplen, pcap.size() - at - 16));
    at += 16 + caplen;
    const size_t m = data.find("SIPHONSEQ");
    if (m == std::string_view::npos || m + 17 > data.size()) continue;
    out.push_back(std::stoi(std::string(data.substr(m + 9, 8))));
  }
  return out;
}

// `siphon capture` on the pod's interfaces while datagrams stream into the
// pod (one a millisecond) from before the handover to after it: the file
// holds every one of them once, in order; the packet socket and its ring
// moved (the new agent reads on from the next block), and the CLI says
// once that its agent was handed over.
TEST_P(HandoverTest, APacketCaptureAcrossAHandoverMissesAndRepeatsNothing) {
  constexpr uint16_t kPort = 9777;
  constexpr int kDatagrams = 3000;
  const std::string file = dir_->path() + "/handover.pcap";
  steals_.push_back(std::make_unique<Proc>(
      std::vector<std::string>{SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_,
                               "capture", "-i", "any", "-w", file, "udp", "port",
                               std::to_string(kPort)},
      cleanEnv()));
  Proc* c = steals_.back().get();
  ASSERT_TRUE(c->readUntil([](const std::string&, const std::string& err) {
    return err.find("capturing on") != std::string::npos ||
           err.find("siphon:") != std::string::npos;
  })) << c->err;
  ASSERT_THAT(c->err, HasSubstr("capturing on"));

  Fd udp(socketInNetns(client_->name(), podAddress().family, SOCK_DGRAM));
  ASSERT_GE(udp.get(), 0);
  socklen_t len = 0;
  const sockaddr_storage to = sockaddrOf(podAddress(), kPort, &len);
  std::atomic<int> sent{0};
  auto sender = std::async(std::launch::async, [&] {
    for (int i = 0; i < kDatagrams; ++i) {
      char payload[64];
      const int n = std::snprintf(payload, sizeof payload, "SIPHONSEQ%08d", i);
      if (::sendto(udp.get(), payload, static_cast<size_t>(n), 0,
                   reinterpret_cast<const sockaddr*>(&to), len) != n) {
        return false;
      }
      ++sent;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  });
  while (sent < kDatagrams / 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool handed = handOver();
  const int at_handover = sent;
  ASSERT_TRUE(sender.get());
  ASSERT_TRUE(handed);
  EXPECT_LT(at_handover, kDatagrams) << "the handover ran after the datagrams ended";
  // The last ring block reaches the agent after its timeout; then stop.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  c->signal(SIGINT);
  EXPECT_EQ(c->finish(), 0) << c->err;
  const std::vector<int> seen = handoverSequencesIn(readFile(file));
  std::vector<int> want(kDatagrams);
  for (int i = 0; i < kDatagrams; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(seen.size(), want.size()) << c->err;
  EXPECT_TRUE(seen == want) << "the capture is not every datagram once, in order";
  EXPECT_THAT(c->err, HasSubstr("handed over to a new agent process"));
  EXPECT_THAT(c->err, Not(HasSubstr("siphon: capture"))) << c->err;  // no gap line
  EXPECT_THAT(current().log(), HasSubstr("capture_adopted"));
}

// A connection to a mirrored port of the pod streams 48 MiB at about
// 24 MiB/s from before the handover to after it; `siphon mirror --to`
// replays its bytes to a local server: they arrive byte-exact, with no
// gap, and the mirror CLI says once that its agent was handed over.
TEST_P(HandoverTest, AMirrorAcrossAHandoverHasNoGap) {
  constexpr uint16_t kMirrored = 8093;
  constexpr uint64_t kTotal = 48ull << 20;
  constexpr size_t kChunk = 64 << 10;
  LocalServer sink([](int fd) {
    std::string buf(256 << 10, '\0');
    while (::read(fd, buf.data(), buf.size()) > 0) {
    }
  }, pod_->name(), kMirrored);
  std::mutex mu;
  std::string replayed;
  LocalServer replay([&](int fd) {
    std::string buf(256 << 10, '\0');
    ssize_t n;
    while ((n = ::read(fd, buf.data(), buf.size())) > 0) {
      std::lock_guard<std::mutex> lock(mu);
      replayed.append(buf.data(), static_cast<size_t>(n));
    }
  });
  steals_.push_back(std::make_unique<Proc>(
      std::vector<std::string>{SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file", token_file_,
                               "mirror", "--port", std::to_string(kMirrored), "--to",
                               replay.to()},
      cleanEnv()));
  Proc* m = steals_.back().get();
  ASSERT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
    return err.find("mirror: port ") != std::string::npos ||
           err.find("siphon:") != std::string::npos;
  })) << m->err;

  Fd conn(connectFrom(client_->name(), podAddress(), kMirrored));
  ASSERT_GE(conn.get(), 0);
  setTimeouts(conn.get(), 60);
  std::atomic<uint64_t> sent{0};
  auto sender = std::async(std::launch::async, [&] {
    Pattern p(33);
    std::string chunk(kChunk, '\0');
    while (sent < kTotal) {
      p.fill(chunk.data(), chunk.size());
      if (::send(conn.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(chunk.size())) {
        return false;
      }
      sent += chunk.size();
      std::this_thread::sleep_for(std::chrono::microseconds(2500));
    }
    return true;
  });
  while (sent < kTotal / 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool handed = handOver();
  const uint64_t at_handover = sent;
  ASSERT_TRUE(sender.get()) << "the sender failed after " << sent << " bytes";
  ASSERT_TRUE(handed);
  EXPECT_LT(at_handover, kTotal) << "the handover ran after the stream ended";
  conn.reset();
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (replayed.size() >= kTotal) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string want(kTotal, '\0');
  Pattern(33).fill(want.data(), want.size());
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(replayed.size(), kTotal) << "replayed bytes; mirror stderr:\n" << m->err;
    EXPECT_TRUE(replayed == want) << "the replay is not the stream";
  }
  EXPECT_TRUE(m->readUntil([](const std::string&, const std::string& err) {
    return err.find("handed over to a new agent process") != std::string::npos;
  })) << m->err;
  EXPECT_THAT(m->err, Not(HasSubstr("missing"))) << m->err;
  EXPECT_THAT(m->err, Not(HasSubstr("gap"))) << m->err;
  EXPECT_THAT(agent_->log(), HasSubstr("mirror_exported"));
  EXPECT_THAT(current().log(), HasSubstr("mirror_imported"));
}

// A new agent for another target is refused; so is a handover of an agent
// holding what does not move yet (a filtered steal), before any client is
// cut. One line on each side; the old agent serves on.
TEST_P(HandoverTest, RefusalsAreOneLineAndTheOldAgentServesOn) {
  LocalServer local(echoServe);
  Proc* s = nullptr;
  Fd held = stealAndConnect(local, &s);
  ASSERT_GE(held.get(), 0);

  Agent* wrong = takeOver(httpd81_.pid());
  dead_.push_back(std::move(agents_.back()));
  agents_.pop_back();
  EXPECT_EQ(wrong->child().waitUntil(Clock::now() + std::chrono::seconds(10)), 1);
  EXPECT_THAT(wrong->log(), HasSubstr("refused the handover: the new agent was started for target "
                                      "pid " + std::to_string(httpd81_.pid())));
  EXPECT_THAT(agent_->log(), HasSubstr("handover_refused"));

  // A filtered steal whose request is answered later than the old agent
  // waits (3 s): its connection cannot park, the handover is refused
  // before the freeze, and the request is answered as if nothing happened.
  LocalServer filtered([](int fd) {
    std::string head;
    char c;
    while (head.find("\r\n\r\n") == std::string::npos && ::read(fd, &c, 1) == 1) head += c;
    std::this_thread::sleep_for(std::chrono::seconds(6));
    const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nslow\n";
    (void)writeAll(fd, answer.data(), answer.size());
  });
  Proc* f = steal({"--port", "81", "--filter-path", "^/slow", "--to", filtered.to()});
  ASSERT_THAT(f->err, HasSubstr("stealing port 81"));
  auto slow = std::async(std::launch::async, [this] {
    return run({"ip", "netns", "exec", client_->name(), "curl", "-sS", "-g", "--max-time", "20",
                podAddress().url(81, "/slow")});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the request is under way
  Agent* blocked = takeOver(httpd80_.pid());
  dead_.push_back(std::move(agents_.back()));
  agents_.pop_back();
  EXPECT_EQ(blocked->child().waitUntil(Clock::now() + std::chrono::seconds(20)), 1);
  EXPECT_THAT(blocked->log(), HasSubstr("this agent holds what cannot move: 1 HTTP connections of "
                                        "filtered steals with a request"));
  Result answered = slow.get();
  EXPECT_EQ(answered.out, "slow\n") << answered.err;
  // Refused before the freeze: no client was even cut.
  EXPECT_THAT(agent_->log(), Not(HasSubstr("reason=handover")));
  EXPECT_EQ(echoOnce(held.get(), "still"), "still");
  EXPECT_EQ(curl(81), "original-81\n");
}

// Root in the pod, as its other containers are, while a stolen download
// runs through the agent. The agent runs as in a container: its handover
// socket in a tmpfs of its own mount namespace (the container's /dev of the
// manifests). Root with a container's default capabilities, in the pod's
// network namespace, cannot reach it: not at its path (another mount
// namespace), not through /proc/PID/root of the agent or of any process of
// it (none is dumpable: that takes CAP_SYS_PTRACE). Root that can reach it
// (every capability, here the test itself) but does not hold the key gets a
// refusal and nothing else: no offer, no state, no descriptor. Throughout,
// the agent never prepared or froze and the client never resumed; the
// download is byte-exact. The agent's successor (the key, CAP_SYS_PTRACE,
// --take-over auto) then takes it over as before.
TEST_P(HandoverTest, RootInThePodWithoutTheAgentsCapabilitiesOrKeyGetsNothing) {
  constexpr uint64_t kTotal = 64ull << 20;
  constexpr uint64_t kPauseAt = 16ull << 20;
  const std::string own = dir_->path() + "/own";
  ASSERT_EQ(::mkdir(own.c_str(), 0755), 0);
  socket_ = own + "/handover.sock";
  ::kill(agent_->child().pid(), SIGTERM);
  ASSERT_EQ(agent_->child().waitUntil(Clock::now() + std::chrono::seconds(5)), 0);
  const std::vector<std::string> args = {"--listen",
                                         "127.0.0.1:0",
                                         "--token-file",
                                         token_file_,
                                         "--first-client-timeout",
                                         "120s",
                                         "--session-grace",
                                         "3s",
                                         "--log-level",
                                         "debug",
                                         "--steal-backend",
                                         GetParam().backend,
                                         "--handover-socket",
                                         socket_,
                                         "--metrics",
                                         metrics_,
                                         "targeted",
                                         "--pid",
                                         std::to_string(httpd80_.pid())};
  agent_.emplace(
      args, cleanEnv(), dir_->path() + "/agent-own.log",
      std::vector<std::string>{
          "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
          "mount -t tmpfs -o mode=0755,size=1m siphon-own '" + own + "' && exec \"$0\" \"$@\""});
  ASSERT_TRUE(agent_->ready(&endpoint_));
  const pid_t agent = agent_->child().pid();

  LocalServer source([](int fd) { sendPattern(fd, 44, kTotal); });
  Proc* s = steal({"--port", "80", "--to", source.to()});
  ASSERT_THAT(s->err, HasSubstr("stealing port 80"));
  Fd down(connectFrom(client_->name(), podAddress(), 80));
  ASSERT_GE(down.get(), 0);
  setTimeouts(down.get(), 60);
  std::promise<void> go, paused;
  std::shared_future<void> go_f = go.get_future().share();
  auto paused_f = paused.get_future();
  bool eof = false;
  auto reader = std::async(std::launch::async, [&] {
    return receivePaused(down.get(), 44, kPauseAt, &paused, go_f, &eof);
  });
  paused_f.wait();

  // Root with a container's capabilities, and with a mesh sidecar's
  // (NET_ADMIN too, as istio-init has): the path, and /proc/PID/root of
  // each process of the agent. The iptables guard holds only NET_ADMIN and
  // NET_RAW: were it dumpable, the sidecar (whose capabilities cover its)
  // would reach the agent's file system through it.
  std::vector<std::string> paths = {socket_};
  for (pid_t p : processTree(agent)) {
    paths.push_back("/proc/" + std::to_string(p) + "/root" + socket_);
  }
  for (uint64_t caps : std::vector<uint64_t>{kContainerDefaultCaps,
                                             kContainerDefaultCaps | (1ull << CAP_NET_ADMIN)}) {
    const std::vector<int> errnos = connectAsContainerRoot(pod_->name(), paths, caps);
    ASSERT_EQ(errnos.size(), paths.size());
    for (size_t i = 0; i < paths.size(); ++i) {
      ASSERT_NE(errnos[i], -1) << "the child could not become root without CAP_SYS_PTRACE";
      EXPECT_NE(errnos[i], 0) << "root without CAP_SYS_PTRACE (capabilities " << std::hex << caps
                              << std::dec << ") reached " << paths[i];
    }
    EXPECT_EQ(errnos[0], ENOENT) << "the socket is not in the agent's own mount namespace";
  }

  // Root that reaches it without the key: a hello of public values, once
  // as an agent before the proofs would send it, once with a handshake, a
  // nonce and then a made-up proof (written by field number: a hello's
  // handshake 7 and nonce 8, a message's proof 9).
  const std::string reachable = "/proc/" + std::to_string(agent) + "/root" + socket_;
  const v1::HandoverMessage plain = publicHello(httpd80_.pid(), pod_->inode());
  v1::HandoverMessage with_nonce = plain;
  auto* hello_fields =
      with_nonce.mutable_hello()->GetReflection()->MutableUnknownFields(with_nonce.mutable_hello());
  hello_fields->AddVarint(7, 2);
  hello_fields->AddLengthDelimited(8, std::string(32, 'n'));
  v1::HandoverMessage made_up_proof;
  made_up_proof.GetReflection()
      ->MutableUnknownFields(&made_up_proof)
      ->AddLengthDelimited(9, std::string("\x0a\x20", 2) + std::string(32, 'p'));
  for (const std::vector<v1::HandoverMessage>& say :
       {std::vector<v1::HandoverMessage>{plain},
        std::vector<v1::HandoverMessage>{with_nonce, made_up_proof}}) {
    Intrusion r = intrude(reachable, say);
    ASSERT_EQ(r.connect_errno, 0) << std::strerror(r.connect_errno);
    EXPECT_EQ(r.descriptors, 0u) << r.said();
    bool offered = false, refused = false;
    for (const auto& m : r.heard) {
      offered = offered || m.has_offer() || m.has_state() || m.has_fds();
      refused = refused || m.has_refused();
    }
    EXPECT_FALSE(offered) << r.said();
    EXPECT_TRUE(refused) << r.said();
  }

  go.set_value();
  EXPECT_EQ(reader.get(), kTotal);
  EXPECT_TRUE(eof);
  const std::string log = agent_->log();
  EXPECT_THAT(log, HasSubstr("handover_refused"));
  for (const char* never :
       {"handover_started", "handover_thawed", "reason=handover", "session_detached"}) {
    EXPECT_THAT(log, Not(HasSubstr(never))) << "the agent was disturbed";
  }
  EXPECT_THAT(s->err, Not(HasSubstr("resumed"))) << s->err;
  EXPECT_THAT(s->err, Not(HasSubstr("cut"))) << s->err;

  // Its successor, with the key and CAP_SYS_PTRACE, finds it and takes over.
  EXPECT_TRUE(handOver("auto"));
}

INSTANTIATE_TEST_SUITE_P(Backends, HandoverTest,
                         ::testing::Values(Param{"sk_lookup", AF_INET},
                                           Param{"iptables", AF_INET6}),
                         paramName);

}  // namespace
}  // namespace siphon
