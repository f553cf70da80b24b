// The sk_lookup steering backend and connection flushing, as root, against
// the real kernel.
//
// Two fresh network namespaces joined by a veth pair: the "pod" (the target:
// its application's listeners on ports P and P+1, and the agent's listeners)
// and the "peer" (a client elsewhere on the network), each with IPv4 and IPv6
// addresses that exist only inside them. Every socket is made inside its
// namespace (a thread setns()es, creates it and ends; a socket keeps the
// netns it was created in), and the test plays the agent itself.
//
// Which listener a connection reached is seen from the listeners: after the
// client's connect() completes, exactly one of them becomes readable, and the
// accepted socket's peer is checked to be that client.
//
// Every kernel object has a unique name and an RAII owner, so a failed
// assertion still closes sockets, kills children and deletes the namespaces.
// Without root every test skips with the reason.
//
// Over 600 lines: one backend's cases sharing the namespace fixture below.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/bpf.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/steal/sk_lookup/sk_lookup_steering.h"
#include "agent/steal/sk_lookup/socket_destroy.h"
// The harness's Agent (a running siphon-agent) is not used here.
#define SIPHON_AGENT_BIN "siphon-agent"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon::agent::steal {
namespace {

using harness::Clock;
using harness::Fd;
using harness::NetNs;
using harness::Result;
using harness::run;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and attaches a BPF sk_lookup program to one";

// Only turns a hang into a failure; no result depends on it.
constexpr auto kDeadline = std::chrono::seconds(5);

constexpr const char* kPodIp4 = "10.77.0.1";
constexpr const char* kPeerIp4 = "10.77.0.2";
constexpr const char* kPodIp6 = "fd77::1";
constexpr const char* kPeerIp6 = "fd77::2";

// A socket made inside the named network namespace: a thread enters it,
// creates the socket and ends; the socket keeps that namespace for life.
int socketIn(const std::string& netns, int domain, int type, int protocol = 0) {
  int fd = -1;
  int err = 0;
  std::thread t([&] {
    int ns = ::open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) {
      err = errno;
      return;
    }
    if (::setns(ns, CLONE_NEWNET) == 0) {
      fd = ::socket(domain, type | SOCK_CLOEXEC, protocol);
    }
    if (fd < 0) err = errno;
    ::close(ns);
  });
  t.join();
  EXPECT_GE(fd, 0) << "socket in " << netns << ": " << std::strerror(err);
  return fd;
}

// An IP literal ("10.0.0.1", "::1") and a port as a socket address.
SockAddr ip(const std::string& host, uint16_t port) {
  std::optional<SockAddr> a = outgoing::ipAddress(host, port);
  if (!a) {
    ADD_FAILURE() << "not an IP literal: " << host;
    return {};
  }
  return *a;
}

// "10.0.0.1:80", "[::1]:80".
std::string format(const SockAddr& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a.get())->sin_addr, host,
              sizeof(host));
    return std::string(host) + ":" + std::to_string(portOf(a));
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a.get())->sin6_addr, host,
            sizeof(host));
  return "[" + std::string(host) + "]:" + std::to_string(portOf(a));
}

SockAddr localAddr(int fd) {
  SockAddr a;
  a.len = sizeof(a.storage);
  EXPECT_EQ(getsockname(fd, a.get(), &a.len), 0) << std::strerror(errno);
  return a;
}

SockAddr peerAddr(int fd) {
  SockAddr a;
  a.len = sizeof(a.storage);
  EXPECT_EQ(getpeername(fd, a.get(), &a.len), 0) << std::strerror(errno);
  return a;
}

uint16_t localPort(int fd) { return portOf(localAddr(fd)); }

// A TCP listener in `netns` on the wildcard address of `family`, port
// `port` (0: the kernel picks). IPv6 listeners are IPV6_V6ONLY, as the
// agent's are, so that IPv4 has listeners of its own.
Fd listenIn(const std::string& netns, int family, uint16_t port) {
  Fd fd(socketIn(netns, family, SOCK_STREAM));
  if (fd.get() < 0) return fd;
  int one = 1;
  if (family == AF_INET6) {
    EXPECT_EQ(setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)), 0);
  }
  SockAddr any = ip(family == AF_INET ? "0.0.0.0" : "::", port);
  EXPECT_EQ(bind(fd.get(), any.get(), any.len), 0)
      << "bind port " << port << ": " << std::strerror(errno);
  EXPECT_EQ(listen(fd.get(), 64), 0) << std::strerror(errno);
  return fd;
}

// connect() with a deadline; true once connected.
bool connectTo(int fd, const SockAddr& to) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(fd, to.get(), to.len);
  if (rc != 0 && errno != EINPROGRESS) {
    ADD_FAILURE() << "connect " << format(to) << ": " << std::strerror(errno);
    return false;
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())) != 1) {
      ADD_FAILURE() << "connect " << format(to) << ": no answer";
      return false;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ADD_FAILURE() << "connect " << format(to) << ": " << std::strerror(err);
      return false;
    }
  }
  fcntl(fd, F_SETFL, flags);
  return true;
}

enum class Who { kNone, kApp, kAppOther, kAgent, kSecondAgent };

std::ostream& operator<<(std::ostream& os, Who who) {
  switch (who) {
    case Who::kNone:
      return os << "nobody";
    case Who::kApp:
      return os << "the application (port P)";
    case Who::kAppOther:
      return os << "the application (port P+1)";
    case Who::kAgent:
      return os << "the agent";
    case Who::kSecondAgent:
      return os << "the second agent";
  }
  return os;
}

struct Landing {
  Who who = Who::kNone;
  Fd accepted;                 // the server side of the connection
  Fd client;                   // the client side
  uint16_t accepted_port = 0;  // getsockname() port of the server side
};

// One connection attempt.
struct Attempt {
  Attempt(std::string netns, SockAddr to, std::function<void(int)> prepare = {})
      : netns(std::move(netns)), to(to), prepare(std::move(prepare)) {}

  std::string netns;                 // where the client is
  SockAddr to;                       // where it connects
  std::function<void(int)> prepare;  // runs on the client socket before connect()
};

class StealSkLookupTest : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    pod_.emplace();
    peer_.emplace();
    ASSERT_TRUE(pod_->created() && peer_->created());
    const std::string& pod = pod_->name();
    const std::string& peer = peer_->name();
    ASSERT_TRUE(harness::linkVeth(
        {pod, "vpod", {std::string(kPodIp4) + "/24", std::string(kPodIp6) + "/64"}},
        {peer, "vpeer", {std::string(kPeerIp4) + "/24", std::string(kPeerIp6) + "/64"}}));
    netns_fd_ = Fd(::open(("/var/run/netns/" + pod).c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(netns_fd_.get(), 0) << std::strerror(errno);

    app4_ = listenIn(pod, AF_INET, 0);
    port_ = localPort(app4_.get());
    ASSERT_NE(port_, 0);
    app6_ = listenIn(pod, AF_INET6, port_);
    // Nothing else lives in this fresh namespace: P+1 is free unless the
    // agent's listeners below took it, and they are made after.
    other4_ = listenIn(pod, AF_INET, port_ + 1);
    other6_ = listenIn(pod, AF_INET6, port_ + 1);
    agent4_ = listenIn(pod, AF_INET, 0);
    agent6_ = listenIn(pod, AF_INET6, 0);
    ASSERT_FALSE(HasFailure());
  }

  Listeners listeners() const {
    return Listeners{.v4 = agent4_.get(),
                     .v6 = agent6_.get(),
                     .v4_port = localPort(agent4_.get()),
                     .v6_port = localPort(agent6_.get())};
  }

  std::unique_ptr<Steering> makeSteering() {
    absl::StatusOr<std::unique_ptr<Steering>> steering =
        makeSkLookupSteering(netns_fd_.get(), listeners());
    EXPECT_TRUE(steering.ok()) << steering.status();
    return steering.ok() ? std::move(*steering) : nullptr;
  }

  // Connects as `attempt` says and accepts the connection on whichever
  // listener it reached.
  Landing land(const Attempt& attempt) {
    Landing out;
    out.client = Fd(socketIn(attempt.netns, attempt.to.family(), SOCK_STREAM));
    if (out.client.get() < 0) return out;
    if (attempt.prepare) attempt.prepare(out.client.get());
    if (!connectTo(out.client.get(), attempt.to)) return out;
    const uint16_t client_port = localPort(out.client.get());

    const std::pair<int, Who> candidates[] = {
        {app4_.get(), Who::kApp},
        {app6_.get(), Who::kApp},
        {other4_.get(), Who::kAppOther},
        {other6_.get(), Who::kAppOther},
        {agent4_.get(), Who::kAgent},
        {agent6_.get(), Who::kAgent},
        // -1 (poll ignores it) unless a test made a second agent.
        {second4_.get(), Who::kSecondAgent},
        {second6_.get(), Who::kSecondAgent},
    };
    std::vector<pollfd> fds;
    for (const auto& [fd, who] : candidates) fds.push_back({fd, POLLIN, 0});
    const auto deadline = Clock::now() + kDeadline;
    while (Clock::now() < deadline) {
      if (poll(fds.data(), fds.size(), 50) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if ((fds[i].revents & POLLIN) == 0) continue;
        Fd accepted(accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC));
        EXPECT_GE(accepted.get(), 0) << std::strerror(errno);
        EXPECT_EQ(portOf(peerAddr(accepted.get())), client_port)
            << "a connection other than the test's reached " << candidates[i].second;
        out.who = candidates[i].second;
        out.accepted_port = localPort(accepted.get());
        out.accepted = std::move(accepted);
        return out;
      }
    }
    ADD_FAILURE() << "connection to " << format(attempt.to) << " reached no listener";
    return out;
  }

  Who whoGets(const Attempt& attempt) { return land(attempt).who; }

  // Every way to reach port `port` of the pod: from the peer over the veth,
  // from inside the pod over loopback and to its own addresses.
  std::vector<Attempt> everyRoute(uint16_t port) {
    const std::string& pod = pod_->name();
    const std::string& peer = peer_->name();
    return {
        {peer, ip(kPodIp4, port)}, {peer, ip(kPodIp6, port)}, {pod, ip("127.0.0.1", port)},
        {pod, ip("::1", port)},    {pod, ip(kPodIp4, port)},  {pod, ip(kPodIp6, port)},
    };
  }

  std::optional<NetNs> pod_;
  std::optional<NetNs> peer_;
  Fd netns_fd_;
  uint16_t port_ = 0;     // P
  Fd app4_, app6_;        // the application on P
  Fd other4_, other6_;    // the application on P+1
  Fd agent4_, agent6_;    // the agent's listeners
  Fd second4_, second6_;  // a second agent's, when a test makes them
};

// sk_lookup links attached to the netns whose inode is `netns_ino`, across
// every process.
int skLookupLinksOn(uint64_t netns_ino) {
  int count = 0;
  uint32_t id = 0;
  while (bpf_link_get_next_id(id, &id) == 0) {
    Fd fd(bpf_link_get_fd_by_id(id));
    if (fd.get() < 0) continue;  // released since
    bpf_link_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd.get(), &info, &len) != 0) continue;
    if (info.type == BPF_LINK_TYPE_NETNS && info.netns.attach_type == BPF_SK_LOOKUP &&
        info.netns.netns_ino == netns_ino) {
      ++count;
    }
  }
  return count;
}

TEST_F(StealSkLookupTest, SteeredPortReachesTheAgentFromEverywhere) {
  std::unique_ptr<Steering> steering = makeSteering();
  ASSERT_NE(steering, nullptr);
  EXPECT_EQ(steering->name(), "sk_lookup");
  EXPECT_EQ(skLookupLinksOn(pod_->inode()), 1);

  // Attached but no port steered: nothing changes.
  for (const Attempt& a : everyRoute(port_)) {
    EXPECT_EQ(whoGets(a), Who::kApp) << format(a.to);
  }

  ASSERT_TRUE(steering->addPort(port_).ok());
  ASSERT_TRUE(steering->addPort(port_).ok()) << "adding twice is a no-op";
  for (const Attempt& a : everyRoute(port_)) {
    Landing l = land(a);
    EXPECT_EQ(l.who, Who::kAgent) << format(a.to);
    if (l.who != Who::kAgent) continue;
    // The agent's listeners are on other ports; the accepted socket still
    // has the address the client connected to.
    EXPECT_EQ(l.accepted_port, port_);
    absl::StatusOr<SockAddr> original = steering->originalDestination(l.accepted.get());
    ASSERT_TRUE(original.ok()) << original.status();
    EXPECT_EQ(format(*original), format(a.to));
  }

  // A port that was not added (P+1, next to the stolen one) is untouched.
  for (const Attempt& a : everyRoute(port_ + 1)) {
    EXPECT_EQ(whoGets(a), Who::kAppOther) << format(a.to);
  }
}

TEST_F(StealSkLookupTest, ExemptedSocketReachesTheApplication) {
  std::unique_ptr<Steering> steering = makeSteering();
  ASSERT_NE(steering, nullptr);
  ASSERT_TRUE(steering->addPort(port_).ok());
  const std::string& pod = pod_->name();

  auto exempt = [&](int fd) {
    absl::Status s = steering->exempt(fd);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_NE(localPort(fd), 0) << "exempt() binds the socket";
  };
  for (const char* host : {"127.0.0.1", "::1", kPodIp4, kPodIp6}) {
    Landing l = land({pod, ip(host, port_), exempt});
    EXPECT_EQ(l.who, Who::kApp) << host;
    steering->unexempt(l.client.get());
    // The exemption is per socket: others are still stolen.
    EXPECT_EQ(whoGets({pod, ip(host, port_)}), Who::kAgent) << host;
  }

  // A dual-stack IPv6 socket to a v4-mapped address sends IPv4 packets.
  Landing mapped = land({pod, ip("::ffff:127.0.0.1", port_), exempt});
  EXPECT_EQ(mapped.who, Who::kApp);
  steering->unexempt(mapped.client.get());

  // An already bound socket keeps its port.
  auto bind_then_exempt = [&](int fd) {
    SockAddr local = ip("127.0.0.1", 0);
    ASSERT_EQ(bind(fd, local.get(), local.len), 0) << std::strerror(errno);
    uint16_t bound = localPort(fd);
    exempt(fd);
    EXPECT_EQ(localPort(fd), bound);
  };
  EXPECT_EQ(whoGets({pod, ip("127.0.0.1", port_), bind_then_exempt}), Who::kApp);

  // unexempt() before the connect: stolen again.
  auto exempt_unexempt = [&](int fd) {
    exempt(fd);
    steering->unexempt(fd);
  };
  EXPECT_EQ(whoGets({pod, ip("127.0.0.1", port_), exempt_unexempt}), Who::kAgent);
  EXPECT_EQ(whoGets({pod, ip("::1", port_), exempt_unexempt}), Who::kAgent);
}

TEST_F(StealSkLookupTest, RemovePortStopAndDestroyGiveTheApplicationBack) {
  std::unique_ptr<Steering> steering = makeSteering();
  ASSERT_NE(steering, nullptr);
  const uint64_t ino = pod_->inode();
  const Attempt v4{peer_->name(), ip(kPodIp4, port_)};
  const Attempt v6{peer_->name(), ip(kPodIp6, port_)};

  ASSERT_TRUE(steering->addPort(port_).ok());
  EXPECT_EQ(whoGets(v4), Who::kAgent);
  ASSERT_TRUE(steering->removePort(port_).ok());
  EXPECT_EQ(whoGets(v4), Who::kApp);
  EXPECT_EQ(whoGets(v6), Who::kApp);
  EXPECT_TRUE(steering->removePort(port_).ok()) << "removing an unsteered port is a no-op";

  ASSERT_TRUE(steering->addPort(port_).ok());
  EXPECT_EQ(whoGets(v6), Who::kAgent);
  EXPECT_EQ(skLookupLinksOn(ino), 1);
  steering.reset();
  EXPECT_EQ(skLookupLinksOn(ino), 0);
  EXPECT_EQ(whoGets(v4), Who::kApp);
  EXPECT_EQ(whoGets(v6), Who::kApp);

  // stop() detaches at once, too.
  steering = makeSteering();
  ASSERT_NE(steering, nullptr);
  ASSERT_TRUE(steering->addPort(port_).ok());
  EXPECT_EQ(whoGets(v4), Who::kAgent);
  steering->stop();
  EXPECT_EQ(skLookupLinksOn(ino), 0);
  EXPECT_EQ(whoGets(v4), Who::kApp);
  EXPECT_FALSE(steering->addPort(port_).ok()) << "a stopped steering steers nothing";
}

TEST_F(StealSkLookupTest, WithoutIpv6ListenerIpv6IsLeftAlone) {
  Listeners only_v4 = listeners();
  only_v4.v6 = -1;
  absl::StatusOr<std::unique_ptr<Steering>> steering =
      makeSkLookupSteering(netns_fd_.get(), only_v4);
  ASSERT_TRUE(steering.ok()) << steering.status();
  ASSERT_TRUE((*steering)->addPort(port_).ok());
  EXPECT_EQ(whoGets({peer_->name(), ip(kPodIp4, port_)}), Who::kAgent);
  EXPECT_EQ(whoGets({peer_->name(), ip(kPodIp6, port_)}), Who::kApp);
}

TEST_F(StealSkLookupTest, KilledHolderLeavesNothingBehind) {
  const uint64_t ino = pod_->inode();
  auto [ready_r, ready_w] = harness::makePipe();
  Listeners l = listeners();
  const int netns_fd = netns_fd_.get();
  const uint16_t port = port_;
  // The child plays an agent that dies without any chance to clean up. No
  // other thread runs in this process (the socket threads have ended), so
  // the child may allocate.
  pid_t pid = fork();
  if (pid == 0) {
    absl::StatusOr<std::unique_ptr<Steering>> steering = makeSkLookupSteering(netns_fd, l);
    char verdict = steering.ok() && (*steering)->addPort(port).ok() ? 'y' : 'n';
    if (write(ready_w.get(), &verdict, 1) != 1) _exit(1);
    for (;;) pause();
  }
  ASSERT_GT(pid, 0) << std::strerror(errno);
  harness::Child child(pid);
  ready_w.reset();
  pollfd p{ready_r.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())), 1);
  char verdict = 0;
  ASSERT_EQ(read(ready_r.get(), &verdict, 1), 1);
  ASSERT_EQ(verdict, 'y') << "the child could not steer";

  const Attempt from_peer{peer_->name(), ip(kPodIp4, port_)};
  EXPECT_EQ(whoGets(from_peer), Who::kAgent);
  EXPECT_EQ(skLookupLinksOn(ino), 1);

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(child.waitUntil(Clock::now() + kDeadline), 128 + SIGKILL);
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  Who who = Who::kNone;
  int links = -1;
  do {
    links = skLookupLinksOn(ino);
    who = whoGets(from_peer);
  } while ((links != 0 || who != Who::kApp) && Clock::now() < deadline);
  EXPECT_EQ(links, 0);
  EXPECT_EQ(who, Who::kApp);
}

// Two agents on one target, each stealing its own port: two links that
// coexist, each program steering only the ports of its own map, and one
// agent's link going (a stop, or its death: the kernel closes the same fd)
// leaves the other's alone. Nothing sweeps or detaches links of others.
TEST_F(StealSkLookupTest, TwoAgentsOnOneTargetEachKeepTheirOwnPorts) {
  std::unique_ptr<Steering> first = makeSteering();
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->addPort(port_).ok());
  second4_ = listenIn(pod_->name(), AF_INET, 0);
  second6_ = listenIn(pod_->name(), AF_INET6, 0);
  absl::StatusOr<std::unique_ptr<Steering>> second =
      makeSkLookupSteering(netns_fd_.get(), Listeners{.v4 = second4_.get(),
                                                      .v6 = second6_.get(),
                                                      .v4_port = localPort(second4_.get()),
                                                      .v6_port = localPort(second6_.get())});
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)->addPort(port_ + 1).ok());
  EXPECT_EQ(skLookupLinksOn(pod_->inode()), 2);
  for (const Attempt& a : everyRoute(port_)) EXPECT_EQ(whoGets(a), Who::kAgent) << format(a.to);
  for (const Attempt& a : everyRoute(port_ + 1)) {
    EXPECT_EQ(whoGets(a), Who::kSecondAgent) << format(a.to);
  }

  first.reset();  // detaches the first agent's link only
  EXPECT_EQ(skLookupLinksOn(pod_->inode()), 1);
  for (const Attempt& a : everyRoute(port_)) EXPECT_EQ(whoGets(a), Who::kApp) << format(a.to);
  for (const Attempt& a : everyRoute(port_ + 1)) {
    EXPECT_EQ(whoGets(a), Who::kSecondAgent) << format(a.to);
  }
}

TEST_F(StealSkLookupTest, FactoryFailuresSayWhy) {
  Listeners not_listening = listeners();
  Fd unbound(socketIn(pod_->name(), AF_INET, SOCK_STREAM));
  not_listening.v4 = unbound.get();
  absl::StatusOr<std::unique_ptr<Steering>> steering =
      makeSkLookupSteering(netns_fd_.get(), not_listening);
  ASSERT_FALSE(steering.ok());
  EXPECT_THAT(std::string(steering.status().message()), StartsWith("sk_lookup unavailable: "));
  EXPECT_THAT(std::string(steering.status().message()), HasSubstr("listener"));

  Fd not_netns(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  steering = makeSkLookupSteering(not_netns.get(), listeners());
  ASSERT_FALSE(steering.ok());
  EXPECT_THAT(std::string(steering.status().message()),
              StartsWith("sk_lookup unavailable: attach sk_lookup to netns: "));
  EXPECT_EQ(skLookupLinksOn(pod_->inode()), 0);
}

// Waits until the client side of a connection sees the end: a reset
// (ECONNRESET) or EOF. Returns recv()'s result as "ok"/"eof"/strerror.
std::string clientEnd(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())) != 1) {
    return "still open";
  }
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
  if (n == 0) return "eof";
  if (n < 0) return std::strerror(errno);
  return "data";
}

bool echoes(int a, int b) {
  const char out = 'x';
  char in = 0;
  return send(a, &out, 1, MSG_NOSIGNAL) == 1 && recv(b, &in, 1, 0) == 1 && in == out;
}

TEST_F(StealSkLookupTest, DestroyEstablishedResetsConnectionsButKeepsTheListener) {
  const std::string& pod = pod_->name();
  const std::string& peer = peer_->name();
  Fd diag(socketIn(pod, AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG));
  ASSERT_GE(diag.get(), 0);

  // Accepted by the application: IPv4 and IPv6 from the peer, and IPv4
  // over loopback inside the pod (whose client side, also in the pod, has P
  // as its destination port and must not count).
  Landing v4 = land({peer, ip(kPodIp4, port_)});
  Landing v6 = land({peer, ip(kPodIp6, port_)});
  Landing loop = land({pod, ip("127.0.0.1", port_)});
  ASSERT_EQ(v4.who, Who::kApp);
  ASSERT_EQ(v6.who, Who::kApp);
  ASSERT_EQ(loop.who, Who::kApp);
  // A connection to another port is not flushed.
  Landing other = land({peer, ip(kPodIp4, port_ + 1)});
  ASSERT_EQ(other.who, Who::kAppOther);

  // One still in the accept queue, established but never accepted.
  Fd queued(socketIn(peer, AF_INET, SOCK_STREAM));
  ASSERT_TRUE(connectTo(queued.get(), ip(kPodIp4, port_)));
  pollfd in_queue{app4_.get(), POLLIN, 0};
  ASSERT_EQ(poll(&in_queue, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())), 1);

  absl::StatusOr<FlushResult> flushed = destroyEstablished(diag.get(), port_);
  ASSERT_TRUE(flushed.ok()) << flushed.status();
  EXPECT_EQ(flushed->destroyed, 4u);
  EXPECT_EQ(flushed->failed, 0u) << flushed->first_error;
  EXPECT_EQ(flushed->first_error, "");

  for (Landing* l : {&v4, &v6, &loop}) {
    std::string end = clientEnd(l->client.get());
    EXPECT_TRUE(end == std::strerror(ECONNRESET) || end == "eof") << end;
    // The application's side was aborted by the kernel.
    char c;
    EXPECT_EQ(recv(l->accepted.get(), &c, 1, MSG_DONTWAIT), -1);
    EXPECT_EQ(errno, ECONNABORTED) << std::strerror(errno);
  }
  std::string end = clientEnd(queued.get());
  EXPECT_TRUE(end == std::strerror(ECONNRESET) || end == "eof") << end;
  // The aborted socket stays in the accept queue until accepted; take it
  // out so that the next connection is the next one accepted.
  Fd aborted(accept4(app4_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));

  EXPECT_TRUE(echoes(other.client.get(), other.accepted.get()));
  EXPECT_TRUE(echoes(other.accepted.get(), other.client.get()));

  // The listener stays and takes new connections.
  Landing again = land({peer, ip(kPodIp4, port_)});
  ASSERT_EQ(again.who, Who::kApp);
  EXPECT_TRUE(echoes(again.client.get(), again.accepted.get()));

  // A port without connections: nothing to flush.
  flushed = destroyEstablished(diag.get(), port_ + 2);
  ASSERT_TRUE(flushed.ok()) << flushed.status();
  EXPECT_EQ(flushed->destroyed, 0u);
}

TEST_F(StealSkLookupTest, DestroyEstablishedWithoutDiagSocketFails) {
  absl::StatusOr<FlushResult> flushed = destroyEstablished(-1, port_);
  ASSERT_FALSE(flushed.ok());
  EXPECT_THAT(std::string(flushed.status().message()), HasSubstr("dump TCP sockets"));
}

}  // namespace
}  // namespace siphon::agent::steal
