// MirrorEngine (agent/mirror/mirror_engine.h), as root, against the real
// kernel: the thread that enters a namespace, attaches the TC program to
// every interface there (and to interfaces that appear later, through link
// events), reads the ring and rebuilds the connections.
//
// A "pod" namespace where the engine runs, and a "peer" namespace joined to
// it by a veth pair that is created only after the engine started: the
// engine must pick the new interface up by itself. Real TCP transfers, the
// events collected as the service would get them, byte-exact checks.
//
// Every kernel object has a unique name and an RAII owner. Without root
// every test skips with the reason.
#include "agent/mirror/mirror_engine.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// The harness's Agent (a running siphon-agent) is not used here.
#define SIPHON_AGENT_BIN "siphon-agent"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon::agent::mirror {
namespace {

using harness::Fd;
using harness::NetNs;

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and attaches BPF TC programs in one";
constexpr auto kDeadline = std::chrono::seconds(10);  // a hang guard only

// Everything the engine handed over, per connection.
struct Seen {
  ConnectionInfo info;
  std::string up, down;
  uint64_t up_gap = 0, down_gap = 0;
  bool up_end = false, down_end = false;
  std::optional<CloseReason> closed;
};

class Collector {
 public:
  MirrorEngine::Deliver deliver() {
    return [this](std::vector<MirrorEvent> batch) { take(std::move(batch)); };
  }
  void setEngine(MirrorEngine* e) {
    std::lock_guard l(mu_);
    engine_ = e;
  }

  // Waits until a connection is closed; returns its record.
  std::optional<Seen> waitClosed() {
    std::unique_lock l(mu_);
    cv_.wait_for(l, kDeadline, [&] {
      return std::any_of(seen_.begin(), seen_.end(), [](auto& kv) { return kv.second.closed; });
    });
    for (auto& [id, s] : seen_) {
      if (s.closed) return s;
    }
    return std::nullopt;
  }
  size_t connections() {
    std::lock_guard l(mu_);
    return seen_.size();
  }
  std::vector<Seen> closedConnections() {
    std::lock_guard l(mu_);
    std::vector<Seen> out;
    for (auto& [id, s] : seen_) {
      if (s.closed) out.push_back(s);
    }
    return out;
  }

 private:
  void take(std::vector<MirrorEvent> batch) {
    size_t bytes = 0;
    {
      std::lock_guard l(mu_);
      for (MirrorEvent& e : batch) {
        Seen& s = seen_[e.connection];
        const bool up = e.direction == Direction::kClientToServer;
        switch (e.kind) {
          case MirrorEvent::Kind::kOpened:
            s.info = e.info;
            break;
          case MirrorEvent::Kind::kData:
            EXPECT_EQ(static_cast<uint8_t>(e.record[0]), directionByte(e.direction));
            (up ? s.up : s.down).append(e.record, 1);
            bytes += e.record.size();
            break;
          case MirrorEvent::Kind::kGap:
            (up ? s.up_gap : s.down_gap) += e.gap_bytes;
            break;
          case MirrorEvent::Kind::kEnd:
            (up ? s.up_end : s.down_end) = true;
            break;
          case MirrorEvent::Kind::kClosed:
            s.closed = e.reason;
            break;
        }
      }
      if (engine_) engine_->released(bytes);
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Seen> seen_;
  MirrorEngine* engine_ = nullptr;
};

uint16_t boundPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A listener on `ip`:0 in `netns`.
Fd listenIn(const std::string& netns, const char* ip) {
  Fd fd(harness::socketInNetns(netns, AF_INET, SOCK_STREAM));
  EXPECT_GE(fd.get(), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a.sin_addr);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  EXPECT_EQ(::listen(fd.get(), 8), 0);
  return fd;
}

// One exchange: the client sends `request` and half-closes; the server
// reads it all and answers `answer`, then closes. Returns what the server
// received.
std::string exchange(int listener, const std::string& client_netns, const char* server_ip,
                     const std::string& request, const std::string& answer) {
  const uint16_t port = boundPort(listener);
  std::string got;
  std::thread server([&] {
    Fd c(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) return;
    harness::setTimeouts(c.get(), 10);
    EXPECT_TRUE(harness::readAll(c.get(), &got));
    harness::writeAll(c.get(), answer);
  });
  Fd fd(harness::socketInNetns(client_netns, AF_INET, SOCK_STREAM));
  harness::setTimeouts(fd.get(), 10);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, server_ip, &a.sin_addr);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  EXPECT_TRUE(harness::writeAll(fd.get(), request));
  ::shutdown(fd.get(), SHUT_WR);
  std::string back;
  EXPECT_TRUE(harness::readAll(fd.get(), &back));
  EXPECT_TRUE(back == answer) << back.size() << " of " << answer.size() << " bytes back";
  server.join();
  return got;
}

std::string pattern(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  harness::Pattern(seed).fill(s.data(), s.size());
  return s;
}

class MirrorEngineTest : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    pod_.emplace();
    ASSERT_TRUE(pod_->created());
    netns_ = Fd(::open(("/var/run/netns/" + pod_->name()).c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(netns_.get(), 0);
  }

  void startEngine() {
    auto e = MirrorEngine::start(netns_.get(), MirrorEngineOptions{}, collector_.deliver());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    collector_.setEngine(engine_.get());
  }

  void TearDown() override {
    collector_.setEngine(nullptr);
    engine_.reset();
  }

  bool attachedTo(const std::string& name) {
    for (const auto& i : engine_->stats().interfaces) {
      if (i.rfind(name + "(", 0) == 0) return true;
    }
    return false;
  }
  bool waitAttached(const std::string& name, bool want = true) {
    auto deadline = harness::Clock::now() + kDeadline;
    while (harness::Clock::now() < deadline) {
      if (attachedTo(name) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  std::optional<NetNs> pod_;
  Fd netns_;
  Collector collector_;
  std::unique_ptr<MirrorEngine> engine_;
};

// The veth appears after the engine started: the link event attaches it,
// and a transfer through it arrives whole, both directions, client side
// known, no gap; removing the veth detaches it.
TEST_F(MirrorEngineTest, InterfaceThatAppearsLaterIsMirrored) {
  startEngine();
  // The stats that list interfaces are published every tick: wait for it.
  ASSERT_TRUE(waitAttached("lo"));
  NetNs peer;
  ASSERT_TRUE(peer.created());
  Fd listener = listenIn(pod_->name(), "0.0.0.0");  // the address comes later
  ASSERT_TRUE(engine_->addPort(boundPort(listener.get())).ok());
  ASSERT_TRUE(harness::linkVeth({pod_->name(), "vlate", {"10.79.0.1/24"}},
                                {peer.name(), "vlatepeer", {"10.79.0.2/24"}}));
  ASSERT_TRUE(waitAttached("vlate")) << "the new interface was not attached";

  const std::string request = pattern(4 << 20, 21);
  const std::string answer = pattern(64 << 10, 22);
  EXPECT_TRUE(exchange(listener.get(), peer.name(), "10.79.0.1", request, answer) == request);

  std::optional<Seen> s = collector_.waitClosed();
  ASSERT_TRUE(s.has_value()) << "no connection closed";
  EXPECT_EQ(s->info.client.address.toString(), "10.79.0.2");
  EXPECT_EQ(s->info.server.port, boundPort(listener.get()));
  EXPECT_FALSE(s->info.started_mid_stream);
  EXPECT_EQ(s->up_gap, 0u);
  EXPECT_EQ(s->down_gap, 0u);
  EXPECT_TRUE(s->up == request) << s->up.size() << " of " << request.size() << " bytes";
  EXPECT_TRUE(s->down == answer) << s->down.size() << " of " << answer.size() << " bytes";
  EXPECT_TRUE(s->up_end && s->down_end);
  EXPECT_EQ(*s->closed, CloseReason::kFin);

  ASSERT_EQ(harness::run({"ip", "-n", pod_->name(), "link", "del", "vlate"}).exit_code, 0);
  EXPECT_TRUE(waitAttached("vlate", false)) << "the removed interface is still listed";
}

// Loopback inside the pod is mirrored (at ingress only: each packet once),
// byte-exact both ways.
TEST_F(MirrorEngineTest, LoopbackTrafficIsMirroredByteExact) {
  startEngine();
  Fd listener = listenIn(pod_->name(), "127.0.0.1");
  ASSERT_TRUE(engine_->addPort(boundPort(listener.get())).ok());
  const std::string request = pattern(8 << 20, 31);
  const std::string answer = pattern(1 << 20, 32);
  EXPECT_TRUE(exchange(listener.get(), pod_->name(), "127.0.0.1", request, answer) == request);
  std::optional<Seen> s = collector_.waitClosed();
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->up_gap + s->down_gap, 0u);
  EXPECT_TRUE(s->up == request) << s->up.size() << " of " << request.size() << " bytes";
  EXPECT_TRUE(s->down == answer) << s->down.size() << " of " << answer.size() << " bytes";
  // Each packet was copied once: a second copy (egress and ingress of lo)
  // would show as duplicate bytes, as many as the transfer (both ways). A
  // busy machine retransmits on lo too (a segment dropped at the socket's
  // backlog was seen at ingress already): one CI run saw 1.8 % of the bytes
  // twice. So the bound is half the transfer, far from both.
  MirrorEngineStats st;
  auto deadline = harness::Clock::now() + kDeadline;
  do {  // the stats are published every tick
    st = engine_->stats();
    if (st.table.connections_closed == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (harness::Clock::now() < deadline);
  EXPECT_EQ(st.table.connections_closed, 1u);
  EXPECT_EQ(st.kernel_lost, 0u);
  EXPECT_LT(st.table.duplicate_bytes, (request.size() + answer.size()) / 2)
      << "packets copied twice? (kernel: " << st.kernel_seen << " seen, " << st.kernel_lost
      << " lost)";
  EXPECT_EQ(collector_.connections(), 1u);
}

// Nobody wants a port's server->client bytes: they are not copied into
// records but said as gaps of exactly their size (the connection's end is
// still seen), while the client's bytes arrive whole; wanted again, the
// next connection gets both directions.
TEST_F(MirrorEngineTest, AServerDirectionNobodyWantsIsAGapNotACopy) {
  startEngine();
  Fd listener = listenIn(pod_->name(), "127.0.0.1");
  const uint16_t port = boundPort(listener.get());
  ASSERT_TRUE(engine_->addPort(port).ok());
  engine_->setServerToClient(port, false);
  const std::string request = pattern(1 << 20, 41);
  const std::string answer = pattern(3 << 20, 42);
  EXPECT_TRUE(exchange(listener.get(), pod_->name(), "127.0.0.1", request, answer) == request);
  std::optional<Seen> s = collector_.waitClosed();
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->up == request) << s->up.size() << " of " << request.size() << " bytes";
  EXPECT_EQ(s->up_gap, 0u);
  EXPECT_EQ(s->down, "");
  EXPECT_EQ(s->down_gap, answer.size());
  EXPECT_TRUE(s->up_end && s->down_end);
  EXPECT_EQ(*s->closed, CloseReason::kFin);

  engine_->setServerToClient(port, true);
  const std::string answer2 = pattern(256 << 10, 43);
  EXPECT_TRUE(exchange(listener.get(), pod_->name(), "127.0.0.1", "second", answer2) ==
              "second");
  std::optional<Seen> second;
  auto deadline = harness::Clock::now() + kDeadline;
  while (harness::Clock::now() < deadline && !second) {
    for (const Seen& c : collector_.closedConnections()) {
      if (c.up == "second") second = c;
    }
    if (!second) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(second.has_value()) << "the second connection did not close";
  EXPECT_EQ(second->down_gap, 0u);
  EXPECT_TRUE(second->down == answer2) << second->down.size() << " of " << answer2.size();
}

// A port no longer mirrored gives nothing more, and its open connections
// are closed (their missing bytes reported first).
TEST_F(MirrorEngineTest, RemovedPortStopsTheCopy) {
  startEngine();
  Fd listener = listenIn(pod_->name(), "127.0.0.1");
  const uint16_t port = boundPort(listener.get());
  ASSERT_TRUE(engine_->addPort(port).ok());
  ASSERT_TRUE(engine_->removePort(port).ok());
  exchange(listener.get(), pod_->name(), "127.0.0.1", "hello", "world");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(collector_.connections(), 0u);
}

TEST_F(MirrorEngineTest, StartErrorsSayWhatFailed) {
  // A namespace fd that is not one: setns fails, and says so.
  Fd not_ns(::open("/", O_RDONLY | O_CLOEXEC));
  auto e = MirrorEngine::start(not_ns.get(), MirrorEngineOptions{}, collector_.deliver());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("network namespace"), absl::string_view::npos)
      << e.status();
  // A ring size the kernel refuses.
  MirrorEngineOptions bad;
  bad.ring_bytes = 12345;
  auto r = MirrorEngine::start(netns_.get(), bad, collector_.deliver());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mirror"), absl::string_view::npos) << r.status();
}

}  // namespace
}  // namespace siphon::agent::mirror
