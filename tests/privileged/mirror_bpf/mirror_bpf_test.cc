// The mirror TC capture program (bpf/mirror.bpf.c) and its loader, as root,
// against the real kernel.
//
// Two fresh network namespaces joined by a veth pair: the "pod" (where the
// program is attached, to its loopback and its veth end) and the "peer" (a
// client elsewhere on the network). Real TCP transfers of a few MiB run
// through them; the captured packets are parsed (IPv4/IPv6 + TCP) and their
// payloads, ordered by sequence number and deduplicated, must rebuild each
// direction's bytes exactly.
//
// Every kernel object has a unique name and an RAII owner, so a failed
// assertion still closes sockets, kills children and deletes the namespaces.
// Without root every test skips with the reason.
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "agent/outgoing/address.h"
#include "loader/mirror_loader.h"
#include "siphon/status.h"
// The harness's Agent (a running siphon-agent) is not used here.
#define SIPHON_AGENT_BIN "siphon-agent"
#include "tests/privileged/harness/bpf_links.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/tcx.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon::bpf {
namespace {

using harness::BpfLink;
using harness::bpfLinks;
using harness::Child;
using harness::Clock;
using harness::Fd;
using harness::inNetns;
using harness::kBpfTcxEgress;
using harness::kBpfTcxIngress;
using harness::tcxProgs;
using harness::NetNs;
using harness::Result;
using harness::readAll;
using harness::run;
using harness::setTimeouts;
using harness::writeAll;

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and attaches BPF TC programs in one";

// Only turn hangs into failures; no result depends on them.
constexpr auto kDeadline = std::chrono::seconds(10);
constexpr int kSocketTimeoutSec = 10;

constexpr const char* kPodIp4 = "10.78.0.1";
constexpr const char* kPeerIp4 = "10.78.0.2";
constexpr const char* kPodIp6 = "fd78::1";
constexpr const char* kPeerIp6 = "fd78::2";

using agent::outgoing::SockAddr;

SockAddr ip(const std::string& host, uint16_t port) {
  std::optional<SockAddr> a = agent::outgoing::ipAddress(host, port);
  if (!a) {
    ADD_FAILURE() << "not an IP literal: " << host;
    return {};
  }
  return *a;
}

Fd tcpSocketIn(const std::string& netns, int family) {
  Fd fd(harness::socketInNetns(netns, family, SOCK_STREAM));
  EXPECT_GE(fd.get(), 0) << "socket in " << netns;
  if (fd.get() >= 0) setTimeouts(fd.get(), kSocketTimeoutSec);
  return fd;
}

// A listener in `netns` on the wildcard address of `family`, on a port the
// kernel picks; returns it and its port.
std::pair<Fd, uint16_t> listenIn(const std::string& netns, int family) {
  Fd fd = tcpSocketIn(netns, family);
  SockAddr any = ip(family == AF_INET ? "0.0.0.0" : "::", 0);
  EXPECT_EQ(bind(fd.get(), any.get(), any.len), 0) << std::strerror(errno);
  EXPECT_EQ(listen(fd.get(), 8), 0) << std::strerror(errno);
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  EXPECT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len), 0);
  uint16_t port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&local)->sin_port
                                          : reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
  return {std::move(fd), port};
}

std::string randomBytes(size_t size, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(gen());
  return out;
}

// One TCP segment parsed from a captured packet.
struct Segment {
  uint16_t sport = 0;
  uint16_t dport = 0;
  uint32_t seq = 0;
  bool syn = false;
  std::string payload;
};

// Parses IPv4/IPv6 + TCP from the IP header on; nullopt for anything else
// or a packet whose IP length disagrees with the bytes captured.
std::optional<Segment> parse(std::span<const uint8_t> p) {
  if (p.empty()) return std::nullopt;
  size_t l4 = 0;
  size_t ip_len = 0;
  if ((p[0] >> 4) == 4) {
    if (p.size() < 20 || p[9] != IPPROTO_TCP) return std::nullopt;
    l4 = (p[0] & 0xf) * 4u;
    ip_len = (size_t{p[2]} << 8) | p[3];
  } else if ((p[0] >> 4) == 6) {
    if (p.size() < 40 || p[6] != IPPROTO_TCP) return std::nullopt;
    l4 = 40;
    ip_len = 40 + ((size_t{p[4]} << 8) | p[5]);
  } else {
    return std::nullopt;
  }
  if (ip_len != p.size() || p.size() < l4 + 20) return std::nullopt;
  const uint8_t* t = p.data() + l4;
  Segment s;
  s.sport = static_cast<uint16_t>((t[0] << 8) | t[1]);
  s.dport = static_cast<uint16_t>((t[2] << 8) | t[3]);
  s.seq = (uint32_t{t[4]} << 24) | (uint32_t{t[5]} << 16) | (uint32_t{t[6]} << 8) | t[7];
  s.syn = (t[13] & 0x02) != 0;
  size_t data_off = l4 + (t[12] >> 4) * 4u;
  if (data_off > p.size()) return std::nullopt;
  s.payload.assign(reinterpret_cast<const char*>(p.data() + data_off), p.size() - data_off);
  return s;
}

// The bytes of one direction, rebuilt from its segments: ordered by sequence
// number relative to the SYN's, duplicates and overlaps dropped. nullopt
// (with a failure) when there is no SYN or a hole.
std::optional<std::string> reassemble(const std::vector<Segment>& segments) {
  auto syn = std::find_if(segments.begin(), segments.end(), [](const Segment& s) { return s.syn; });
  if (syn == segments.end()) {
    ADD_FAILURE() << "no SYN among " << segments.size() << " segments";
    return std::nullopt;
  }
  const uint32_t isn = syn->seq + 1;  // The SYN takes one sequence number.
  std::vector<std::pair<uint32_t, const std::string*>> ordered;
  for (const Segment& s : segments) {
    if (!s.payload.empty()) ordered.emplace_back(s.seq - isn, &s.payload);  // mod 2^32
  }
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [off, payload] : ordered) {
    if (off > out.size()) {
      ADD_FAILURE() << "hole at byte " << out.size() << " (next segment at " << off << ")";
      return std::nullopt;
    }
    if (off + payload->size() > out.size()) out.append(payload->substr(out.size() - off));
  }
  return out;
}

struct Captured {
  MirrorPacketHeader header;
  std::string bytes;
};


class MirrorBpfTest : public testing::Test {
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
    inNetns(pod, [&] {
      lo_ = static_cast<int>(if_nametoindex("lo"));
      vpod_ = static_cast<int>(if_nametoindex("vpod"));
    });
    ASSERT_GT(lo_, 0);
    ASSERT_GT(vpod_, 0);

    // Large enough for every test's transfers even without the concurrent
    // reader below.
    makeLoader(64u << 20);
  }

  // Replaces the loader with one whose ring buffer is `ring_bytes` long,
  // reading into captured_ and lost_, attached to lo and vpod of the pod.
  void makeLoader(uint32_t ring_bytes) {
    loader_.reset();
    absl::StatusOr<std::unique_ptr<MirrorLoader>> loader =
        MirrorLoader::load({.ring_bytes = ring_bytes});
    ASSERT_TRUE(loader.ok()) << loader.status();
    loader_ = std::move(*loader);
    absl::Status started = loader_->startReader(
        [this](const MirrorPacket& p) {
          captured_.push_back(Captured{
              p.header, std::string(reinterpret_cast<const char*>(p.data.data()), p.data.size())});
        },
        [this](uint64_t lost) { lost_ += lost; });
    ASSERT_TRUE(started.ok()) << started;
    attachInPod(lo_);
    attachInPod(vpod_);
  }

  void TearDown() override {
    stopReading();
    loader_.reset();
  }

  void attachInPod(int ifindex) {
    inNetns(pod_->name(), [&] {
      absl::Status s = loader_->attach(ifindex);
      ASSERT_TRUE(s.ok()) << s;
    });
  }

  // Reads the ring buffer on a thread while a transfer runs; the loader
  // sees no other call meanwhile.
  void startReading() {
    stop_ = false;
    reading_ = std::thread([this] {
      while (!stop_) {
        pollfd p{loader_->fd(), POLLIN, 0};
        poll(&p, 1, 50);
        absl::StatusOr<size_t> n = loader_->consume();
        if (!n.ok()) {
          ADD_FAILURE() << n.status();
          return;
        }
      }
    });
  }
  void stopReading() {
    if (!reading_.joinable()) return;
    stop_ = true;
    reading_.join();
    absl::StatusOr<size_t> n = loader_->consume();
    EXPECT_TRUE(n.ok()) << n.status();
  }

  struct Transfer {
    std::string to_server;   // what the client sent
    std::string to_client;   // what the server sent back
    std::string got_server;  // what the server received
    std::string got_client;  // what the client received
    uint16_t port = 0;
  };

  // Client in `client_ns` connects to `server_host` (an address of the pod)
  // on a fresh listener of the pod, sends `up` bytes and half-closes; the
  // server reads to EOF, answers `down` bytes and closes. `before` runs
  // once the port is known, before the connection.
  Transfer transfer(const std::string& client_ns, const std::string& server_host, size_t up,
                    size_t down, const std::function<void(uint16_t)>& before) {
    Transfer t;
    t.to_server = randomBytes(up, 1);
    t.to_client = randomBytes(down, 2);
    SockAddr probe = ip(server_host, 0);
    auto [listener, port] = listenIn(pod_->name(), probe.family());
    t.port = port;
    before(port);
    startReading();
    std::thread server([&, lfd = listener.get()] {
      pollfd p{lfd, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())) != 1) {
        ADD_FAILURE() << "no connection to the server";
        return;
      }
      Fd conn(accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC));
      if (conn.get() < 0) {
        ADD_FAILURE() << "accept: " << std::strerror(errno);
        return;
      }
      setTimeouts(conn.get(), kSocketTimeoutSec);
      EXPECT_TRUE(readAll(conn.get(), &t.got_server)) << std::strerror(errno);
      EXPECT_TRUE(writeAll(conn.get(), t.to_client)) << std::strerror(errno);
    });
    Fd client = tcpSocketIn(client_ns, probe.family());
    SockAddr to = ip(server_host, port);
    if (connect(client.get(), to.get(), to.len) == 0) {
      EXPECT_TRUE(writeAll(client.get(), t.to_server)) << std::strerror(errno);
      shutdown(client.get(), SHUT_WR);
      EXPECT_TRUE(readAll(client.get(), &t.got_client)) << std::strerror(errno);
    } else {
      ADD_FAILURE() << "connect " << server_host << ":" << port << ": " << std::strerror(errno);
    }
    client.reset();
    server.join();
    stopReading();
    return t;
  }

  std::vector<Captured> capturedOnPort(uint16_t port) const {
    std::vector<Captured> out;
    for (const Captured& c : captured_) {
      std::optional<Segment> s = parse(std::span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size()));
      if (s && (s->sport == port || s->dport == port)) out.push_back(c);
    }
    return out;
  }

  // Checks that the packets captured for `t` rebuild both directions
  // byte-exact, whole, on `ifindex`, in the directions `ifindex` sees them.
  void expectReassembles(const Transfer& t, int ifindex, bool server_side_only) {
    // The application's transfer itself is unaffected.
    EXPECT_TRUE(t.got_server == t.to_server)
        << "server got " << t.got_server.size() << " of " << t.to_server.size() << " bytes";
    EXPECT_TRUE(t.got_client == t.to_client)
        << "client got " << t.got_client.size() << " of " << t.to_client.size() << " bytes";
    std::vector<Segment> up, down;
    size_t largest = 0;
    int ingress = 0, egress = 0;
    for (const Captured& c : capturedOnPort(t.port)) {
      EXPECT_EQ(c.header.ifindex, static_cast<uint32_t>(ifindex));
      // Whole packets, GRO/TSO super-packets included.
      EXPECT_EQ(c.header.cap_len, c.header.orig_len);
      EXPECT_EQ(c.header.cap_len, c.bytes.size());
      EXPECT_GT(c.header.timestamp_ns, 0u);
      largest = std::max(largest, c.bytes.size());
      std::optional<Segment> s = parse(std::span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size()));
      ASSERT_TRUE(s.has_value()) << "a captured packet that is not whole IP+TCP";
      const bool to_server = s->dport == t.port;
      const auto dir = static_cast<MirrorDirection>(c.header.direction);
      (dir == MirrorDirection::kIngress ? ingress : egress)++;
      if (server_side_only) {
        // On the server's veth end, what comes in goes to the server.
        EXPECT_EQ(dir, to_server ? MirrorDirection::kIngress : MirrorDirection::kEgress);
      }
      (to_server ? up : down).push_back(std::move(*s));
    }
    EXPECT_GT(ingress, 0);
    EXPECT_GT(egress, 0);
    EXPECT_GT(largest, 1500u) << "no GRO/TSO-size packet captured";
    std::optional<std::string> up_bytes = reassemble(up);
    std::optional<std::string> down_bytes = reassemble(down);
    ASSERT_TRUE(up_bytes && down_bytes);
    EXPECT_TRUE(*up_bytes == t.to_server)
        << "client->server rebuilt " << up_bytes->size() << " of " << t.to_server.size();
    EXPECT_TRUE(*down_bytes == t.to_client)
        << "server->client rebuilt " << down_bytes->size() << " of " << t.to_client.size();
    absl::StatusOr<MirrorCounters> counters = loader_->counters();
    ASSERT_TRUE(counters.ok()) << counters.status();
    EXPECT_EQ(counters->failed, 0u);
    EXPECT_EQ(lost_, 0u);
    EXPECT_EQ(counters->copied, counters->seen);
  }

  std::optional<NetNs> pod_;
  std::optional<NetNs> peer_;
  int lo_ = 0;
  int vpod_ = 0;
  std::unique_ptr<MirrorLoader> loader_;
  std::vector<Captured> captured_;  // written by the reader thread only while it runs
  uint64_t lost_ = 0;
  std::thread reading_;
  std::atomic<bool> stop_{false};
};

TEST_F(MirrorBpfTest, VethTransferIPv4ReassemblesBothDirections) {
  Transfer t = transfer(peer_->name(), kPodIp4, 3u << 20, 1u << 20,
                        [&](uint16_t port) { ASSERT_TRUE(loader_->addPort(port).ok()); });
  expectReassembles(t, vpod_, /*server_side_only=*/true);
}

TEST_F(MirrorBpfTest, VethTransferIPv6ReassemblesBothDirections) {
  Transfer t = transfer(peer_->name(), kPodIp6, 3u << 20, 1u << 20,
                        [&](uint16_t port) { ASSERT_TRUE(loader_->addPort(port).ok()); });
  expectReassembles(t, vpod_, /*server_side_only=*/true);
}

TEST_F(MirrorBpfTest, LoopbackTransferReassemblesBothFamilies) {
  for (const char* host : {"127.0.0.1", "::1"}) {
    SCOPED_TRACE(host);
    captured_.clear();
    Transfer t = transfer(pod_->name(), host, 2u << 20, 1u << 20,
                          [&](uint16_t port) { ASSERT_TRUE(loader_->addPort(port).ok()); });
    // Loopback sees each packet twice, leaving (egress) and coming back
    // (ingress); the reassembly drops the duplicates.
    expectReassembles(t, lo_, /*server_side_only=*/false);
  }
}

TEST_F(MirrorBpfTest, UnmirroredPortGivesNothing) {
  // Another port is mirrored: the program runs, and skips this one.
  ASSERT_TRUE(loader_->addPort(1).ok());
  Transfer t = transfer(peer_->name(), kPodIp4, 1u << 20, 1u << 20, [](uint16_t) {});
  EXPECT_TRUE(t.got_server == t.to_server && t.got_client == t.to_client);
  EXPECT_TRUE(captured_.empty()) << captured_.size() << " packets captured";
  absl::StatusOr<MirrorCounters> counters = loader_->counters();
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_EQ(counters->seen, 0u);
}

TEST_F(MirrorBpfTest, RemovePortStopsMirroring) {
  Transfer t = transfer(peer_->name(), kPodIp4, 1u << 20, 1u << 20, [&](uint16_t port) {
    ASSERT_TRUE(loader_->addPort(port).ok());
    ASSERT_TRUE(loader_->removePort(port).ok());
    // Idempotent.
    ASSERT_TRUE(loader_->removePort(port).ok());
  });
  EXPECT_TRUE(t.got_server == t.to_server && t.got_client == t.to_client);
  EXPECT_TRUE(captured_.empty()) << captured_.size() << " packets captured";

  // And the same port, added again, is mirrored again.
  captured_.clear();
  Transfer again = transfer(peer_->name(), kPodIp4, 1u << 20, 1u << 20,
                            [&](uint16_t port) { ASSERT_TRUE(loader_->addPort(port).ok()); });
  expectReassembles(again, vpod_, /*server_side_only=*/true);
}

TEST_F(MirrorBpfTest, LossIsCountedAndReported) {
  // A ring buffer smaller than a GRO/TSO super-packet: those cannot be
  // handed over, whatever the reader does.
  makeLoader(16u << 10);
  ASSERT_FALSE(HasFatalFailure());
  Transfer t = transfer(peer_->name(), kPodIp4, 2u << 20, 1u << 20,
                        [&](uint16_t port) { ASSERT_TRUE(loader_->addPort(port).ok()); });
  // The application does not notice.
  EXPECT_TRUE(t.got_server == t.to_server && t.got_client == t.to_client);
  absl::StatusOr<MirrorCounters> counters = loader_->counters();
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_GT(counters->failed, 0u);
  EXPECT_EQ(counters->copied + counters->failed, counters->seen);
  EXPECT_EQ(captured_.size(), counters->copied);
  // Every loss reached the loss callback, none twice.
  EXPECT_EQ(lost_, counters->failed);
}

TEST_F(MirrorBpfTest, BadRingSizeIsRefused) {
  absl::StatusOr<std::unique_ptr<MirrorLoader>> loader = MirrorLoader::load({.ring_bytes = 12345});
  EXPECT_EQ(loader.status().code(), absl::StatusCode::kInvalidArgument) << loader.status();
}

TEST_F(MirrorBpfTest, AttachErrorsCarryTheReason) {
  absl::Status again;
  inNetns(pod_->name(), [&] { again = loader_->attach(vpod_); });
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  absl::Status missing;
  inNetns(pod_->name(), [&] { missing = loader_->attach(9999); });
  EXPECT_EQ(errnoOf(missing), ENODEV) << missing;
  EXPECT_NE(std::string(missing.message()).find("ifindex 9999"), std::string::npos) << missing;
  EXPECT_EQ(loader_->detach(9999).code(), absl::StatusCode::kNotFound);
}

// Our programs on the TCX hooks of lo and vpod of `pod`, all four hooks.
std::vector<uint32_t> ourProgs(const std::string& pod) {
  std::vector<uint32_t> ids;
  for (const char* dev : {"lo", "vpod"}) {
    for (int hook : {kBpfTcxIngress, kBpfTcxEgress}) {
      std::vector<uint32_t> on = tcxProgs(pod, dev, hook);
      EXPECT_EQ(on.size(), 1u) << dev << " hook " << hook;
      ids.insert(ids.end(), on.begin(), on.end());
    }
  }
  return ids;
}

// Nothing of ours left in `pod`. bpftool 7.1 (Debian 12) predates TCX: `net
// show` lists only XDP, classic tc and flow dissector attachments (so it
// proves that no clsact filter of ours is left, not more), and `link show`
// prints TCX links as "type 11 prog ID". So the TCX hooks are queried
// directly too, and the links are matched by the ids of the programs that
// were attached (`ids`, from ourProgs() while attached: the checks can fail),
// read with bpfLinks(), which other tests' links coming and going cannot fail.
void expectNothingLeft(const std::string& pod, const std::vector<uint32_t>& ids) {
  for (const char* dev : {"lo", "vpod"}) {
    for (int hook : {kBpfTcxIngress, kBpfTcxEgress}) {
      EXPECT_TRUE(tcxProgs(pod, dev, hook).empty()) << dev << " hook " << hook;
    }
    Result net = run({"ip", "netns", "exec", pod, "bpftool", "net", "show", "dev", dev});
    EXPECT_EQ(net.exit_code, 0) << net;
    EXPECT_EQ(net.out.find("mirror"), std::string::npos) << net;
  }
  for (const BpfLink& link : bpfLinks()) {
    for (uint32_t id : ids) {
      EXPECT_NE(link.prog_id, id) << "link " << link.id << " of program " << id << " is left";
    }
  }
}

TEST_F(MirrorBpfTest, DetachAndDestructionLeaveNothing) {
  const std::vector<uint32_t> ids = ourProgs(pod_->name());
  ASSERT_TRUE(loader_->detach(vpod_).ok());
  EXPECT_TRUE(tcxProgs(pod_->name(), "vpod", kBpfTcxIngress).empty());
  EXPECT_TRUE(tcxProgs(pod_->name(), "vpod", kBpfTcxEgress).empty());
  EXPECT_EQ(tcxProgs(pod_->name(), "lo", kBpfTcxIngress).size(), 1u);
  loader_.reset();
  expectNothingLeft(pod_->name(), ids);
}

TEST_F(MirrorBpfTest, SigkilledHolderLeavesNothing) {
  loader_.reset();
  expectNothingLeft(pod_->name(), {});
  // A child process loads and attaches its own, says so, and waits to be
  // killed. No thread runs in the test process here, so fork() is safe.
  auto [ready_r, ready_w] = harness::makePipe();
  const std::string netns_path = "/var/run/netns/" + pod_->name();
  const int lo = lo_, vpod = vpod_;
  pid_t pid = fork();
  if (pid == 0) {
    int ns = ::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) _exit(2);
    absl::StatusOr<std::unique_ptr<MirrorLoader>> l = MirrorLoader::load();
    if (!l.ok() || !(*l)->attach(lo).ok() || !(*l)->attach(vpod).ok()) _exit(3);
    char one = 1;
    if (write(ready_w.get(), &one, 1) != 1) _exit(4);
    for (;;) pause();
  }
  ASSERT_GT(pid, 0) << std::strerror(errno);
  Child child(pid);
  ready_w.reset();
  pollfd p{ready_r.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kDeadline).count())), 1);
  char byte = 0;
  ASSERT_EQ(read(ready_r.get(), &byte, 1), 1) << "the child failed to load or attach";
  const std::vector<uint32_t> ids = ourProgs(pod_->name());
  child.kill();  // SIGKILL, then reaped: its fds are closed by then.
  expectNothingLeft(pod_->name(), ids);
}

}  // namespace
}  // namespace siphon::bpf
