// The adopted ring (agent/capture/adopted_ring.h) against libpcap itself, as
// root. In a network namespace of its own, each test opens two libpcap
// captures with the same settings: one is handed over as the agents do it
// (read to the end, its socket duplicated, ringGeometry(), adoptRing(), the
// libpcap handle closed), the other is the reference that reads everything.
// What the old capture read and then the adopted one read must be, record
// for record and byte for byte, what the reference read.
//
// Traffic: UDP datagrams over loopback ("lo" and "any", where libpcap
// leaves out loopback's outgoing copies and builds cooked headers), and
// VLAN-tagged Ethernet frames over a veth pair (the receiving side's kernel
// takes the tag off into the ring's header; libpcap puts it back). Each
// packet carries a marker ("|siphon-ring b2-007|") found in its record.
// Time stamps compare exactly too: the fixture has the kernel stamp each
// packet once, for every socket (shareTimestamps()).
//
// Without root every test skips with the reason. Over 600 lines: one
// reader's cases sharing the namespace, the traffic and the comparison.
#include "agent/capture/adopted_ring.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pcap/dlt.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/capture/capture_spec.h"
#include "agent/capture/packet_source.h"
#include "siphon/status.h"
#include "tests/fakes/eventually.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/privileged_test.h"

namespace siphon::agent::capture {
namespace {

using ::testing::HasSubstr;

constexpr const char* kRingSkipReason =
    "needs root: makes a network namespace and veth links, opens packet sockets with rings "
    "(CAP_NET_RAW)";
// Only turns a hang into a failure; block timeouts are 10 ms.
constexpr auto kRingDeadline = std::chrono::seconds(20) * fakes::kSanitizerSlowdown;
constexpr int kRingBatch = 20;
// Smaller than the larger packets: the snapshot length cuts them.
constexpr uint32_t kRingSnaplen = 160;
// A VLAN tag of priority 5, VLAN 42.
constexpr uint16_t kRingTci = (5 << 13) | 42;

// ------------------------------------------------------------ records

struct RingRecord {
  int64_t ts_sec = 0;
  int64_t ts_usec = 0;
  uint32_t caplen = 0;
  uint32_t len = 0;
  std::string data;
  bool operator==(const RingRecord&) const = default;
};

std::string describeRingRecord(const RingRecord& r) {
  std::string out = std::to_string(r.ts_sec) + "." + std::to_string(r.ts_usec) + " caplen " +
                    std::to_string(r.caplen) + " len " + std::to_string(r.len) + " [";
  for (size_t i = 0; i < r.data.size() && i < 48; ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned char>(r.data[i]));
    out += hex;
  }
  return out + (r.data.size() > 48 ? "...]" : "]");
}

class RingCollector final : public PacketSink {
 public:
  void onPacket(const Packet& p) override {
    records.push_back({p.ts_sec, p.ts_usec, p.caplen, p.len,
                       std::string(reinterpret_cast<const char*>(p.data), p.caplen)});
  }
  std::vector<RingRecord> records;
};

std::string ringMarker(std::string_view name) { return "|siphon-ring " + std::string(name) + "|"; }

std::string ringMarker(int batch, int i) {
  char name[32];
  std::snprintf(name, sizeof(name), "b%d-%03d", batch, i);
  return ringMarker(name);
}

// A marker and filler, of a length that varies with `i`: some are cut by
// the snapshot length, some not.
std::string ringPayload(const std::string& marker, int i) {
  return marker + std::string(static_cast<size_t>(i * 37 % 500), static_cast<char>('a' + i % 26));
}

size_t ringCount(const std::vector<RingRecord>& records, std::string_view marker) {
  size_t n = 0;
  for (const RingRecord& r : records) n += r.data.find(marker) != std::string::npos;
  return n;
}

// The records from the first that carries `from` to the last that carries
// `to`, both included; empty when either is missing.
std::vector<RingRecord> ringBetween(const std::vector<RingRecord>& records, std::string_view from,
                                    std::string_view to) {
  std::optional<size_t> first, last;
  for (size_t i = 0; i < records.size(); ++i) {
    if (!first && records[i].data.find(from) != std::string::npos) first = i;
    if (records[i].data.find(to) != std::string::npos) last = i;
  }
  if (!first || !last || *last < *first) return {};
  return {records.begin() + static_cast<std::ptrdiff_t>(*first),
          records.begin() + static_cast<std::ptrdiff_t>(*last) + 1};
}

::testing::AssertionResult ringSameRecords(const std::vector<RingRecord>& got,
                                           const std::vector<RingRecord>& want) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure()
             << "record " << i << " differs:\n  got  " << describeRingRecord(got[i]) << "\n  want "
             << describeRingRecord(want[i]);
    }
  }
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " records, libpcap has " << want.size();
  }
  return ::testing::AssertionSuccess();
}

// Reads `source` into `out`, `max` at a time, until `copies` records carry
// `marker`. Every read must give at most `max`.
::testing::AssertionResult ringReadUntil(PacketSource& source, RingCollector& out,
                                         std::string_view marker, size_t copies = 1,
                                         int max = INT_MAX) {
  absl::Status error;
  int over = 0;
  const bool seen = fakes::eventually(
      [&] {
        for (;;) {
          absl::StatusOr<int> n = source.read(max, out);
          if (!n.ok()) {
            error = n.status();
            return true;
          }
          if (*n > max) over = *n;
          if (*n < max) break;  // none left now
        }
        return ringCount(out.records, marker) >= copies;
      },
      kRingDeadline);
  if (!error.ok()) return ::testing::AssertionFailure() << "read: " << error;
  if (over != 0) return ::testing::AssertionFailure() << "read(" << max << ") gave " << over;
  if (!seen) {
    return ::testing::AssertionFailure()
           << ringCount(out.records, marker) << " of " << copies << " records with " << marker
           << " after " << out.records.size() << " records";
  }
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------------ traffic

using RingSend = std::function<void(const std::string& payload)>;

// UDP datagrams to 127.0.0.1 inside the namespace, to a socket bound there
// (no ICMP error comes back).
class RingUdpSender {
 public:
  explicit RingUdpSender(const std::string& netns)
      : rx_(harness::socketInNetns(netns, AF_INET, SOCK_DGRAM)),
        tx_(harness::socketInNetns(netns, AF_INET, SOCK_DGRAM)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(rx_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    socklen_t len = sizeof(a);
    EXPECT_EQ(getsockname(rx_.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
    EXPECT_EQ(connect(tx_.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
  }
  void send(const std::string& payload) {
    EXPECT_EQ(::send(tx_.get(), payload.data(), payload.size(), 0),
              static_cast<ssize_t>(payload.size()))
        << strerror(errno);
  }

 private:
  harness::Fd rx_;
  harness::Fd tx_;
};

// Ethernet frames with a VLAN tag in them, sent through a packet socket on
// `interface`: the veth's peer takes the tag off on receipt, into the
// skb's metadata, which is where the ring's header gets it from.
class RingVlanSender {
 public:
  RingVlanSender(const std::string& netns, const std::string& interface) {
    harness::inNetns(netns, [&] {
      fd_ = harness::Fd(socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0));
      ifindex_ = static_cast<int>(if_nametoindex(interface.c_str()));
    });
    EXPECT_GE(fd_.get(), 0) << strerror(errno);
    EXPECT_GT(ifindex_, 0) << interface;
  }
  void send(const std::string& payload) {
    std::string frame(6, '\xff');  // broadcast
    frame += std::string("\x02\x00\x5e\x00\x53\x01", 6);
    frame += std::string("\x81\x00", 2);  // 802.1Q
    frame.push_back(static_cast<char>(kRingTci >> 8));
    frame.push_back(static_cast<char>(kRingTci & 0xff));
    frame += std::string("\x88\xb5", 2);  // local experimental EtherType
    frame += payload;
    sockaddr_ll to{};
    to.sll_family = AF_PACKET;
    to.sll_ifindex = ifindex_;
    to.sll_halen = 6;
    std::memset(to.sll_addr, 0xff, 6);
    EXPECT_EQ(sendto(fd_.get(), frame.data(), frame.size(), 0, reinterpret_cast<sockaddr*>(&to),
                     sizeof(to)),
              static_cast<ssize_t>(frame.size()))
        << strerror(errno);
  }

 private:
  harness::Fd fd_;
  int ifindex_ = 0;
};

// ------------------------------------------------------------ fixture

// What one handover gave.
struct RingRun {
  std::vector<RingRecord> old_records;  // the old agent's libpcap read
  std::vector<RingRecord> adopted;      // the adopted ring read
  std::vector<RingRecord> reference;    // the second libpcap capture read
  RingGeometry geometry;
};

class AdoptedRingTest : public harness::PrivilegedTest {
 protected:
  AdoptedRingTest() : harness::PrivilegedTest(kRingSkipReason) {}

  void SetUp() override {
    harness::PrivilegedTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ns_ = &addNetns();
    ASSERT_NO_FATAL_FAILURE(shareTimestamps());
  }

  const std::string& netns() const { return ns_->name(); }

  static CaptureSpec spec(const std::string& interface) {
    CaptureSpec s;
    s.interface = interface;
    s.snaplen = kRingSnaplen;
    s.buffer_bytes = 1024 * 1024;
    s.block_timeout_ms = 10;
    return s;
  }

  // openPcap() on a thread inside the namespace, as the NetnsWorker does.
  std::unique_ptr<PacketSource> openInNetns(const CaptureSpec& s) {
    std::unique_ptr<PacketSource> out;
    harness::inNetns(netns(), [&] {
      absl::StatusOr<std::unique_ptr<PacketSource>> source = openPcap(s);
      if (source.ok()) {
        out = std::move(*source);
      } else {
        ADD_FAILURE() << "openPcap " << s.interface << ": " << source.status();
      }
    });
    return out;
  }

  UniqueFd diagSocket() {
    UniqueFd fd;
    harness::inNetns(netns(), [&] {
      fd = UniqueFd(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
    });
    EXPECT_TRUE(fd.valid()) << strerror(errno);
    return fd;
  }

  // The new agent's side of a handover: the socket as SCM_RIGHTS would give
  // it (another descriptor of the same socket), its geometry from the
  // kernel, and the old source's exported numbers.
  absl::StatusOr<std::unique_ptr<PacketSource>> adoptFrom(
      PacketSource& old, RingGeometry* geometry = nullptr,
      std::optional<uint32_t> drops = std::nullopt) {
    UniqueFd diag = diagSocket();
    absl::StatusOr<RingGeometry> g = ringGeometry(diag.get(), old.selectableFd());
    if (!g.ok()) return g.status();
    if (geometry != nullptr) *geometry = *g;
    absl::StatusOr<uint32_t> old_drops = old.kernelDrops();
    if (!old_drops.ok()) return old_drops.status();
    AdoptedRing ring;
    ring.socket = UniqueFd(fcntl(old.selectableFd(), F_DUPFD_CLOEXEC, 0));
    ring.geometry = *g;
    ring.link_type = old.linkType();
    ring.snaplen = old.snaplen();
    ring.data_link = old.dataLink();
    ring.kernel_drops = drops.value_or(*old_drops);
    return adoptRing(std::move(ring));
  }

  // A handover in the middle of traffic: batch 1 is read by the old
  // capture to the end, batch 2 is sent before the adoption, so part of it
  // may sit in a block the kernel has not handed over yet. Each packet
  // shows `copies` times in a capture.
  void handover(const CaptureSpec& s, const RingSend& send, size_t copies, RingRun* run) {
    std::unique_ptr<PacketSource> old = openInNetns(s);
    std::unique_ptr<PacketSource> reference = openInNetns(s);
    ASSERT_TRUE(old && reference);

    send(ringPayload(ringMarker("start"), 0));
    for (int i = 0; i < kRingBatch; ++i) send(ringPayload(ringMarker(1, i), i));
    RingCollector old_records;
    ASSERT_TRUE(ringReadUntil(*old, old_records, ringMarker(1, kRingBatch - 1), copies));

    for (int i = 0; i < kRingBatch; ++i) send(ringPayload(ringMarker(2, i), i));
    send(ringPayload(ringMarker("end"), 1));

    absl::StatusOr<std::unique_ptr<PacketSource>> adopted = adoptFrom(*old, &run->geometry);
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    // libpcap unmaps and closes its descriptor; the ring stays, mapped by
    // the adopted source, on the socket the duplicate keeps open.
    old.reset();

    RingCollector adopted_records, reference_records;
    ASSERT_TRUE(ringReadUntil(**adopted, adopted_records, ringMarker("end"), copies));
    ASSERT_TRUE(ringReadUntil(*reference, reference_records, ringMarker("end"), copies));
    run->old_records = std::move(old_records.records);
    run->adopted = std::move(adopted_records.records);
    run->reference = std::move(reference_records.records);

    EXPECT_EQ(errorCodeOf((*adopted)->setFilter(CompiledFilter("udp"))), v1::FAILED_PRECONDITION);
    EXPECT_EQ((*adopted)->linkType(), reference->linkType());
    EXPECT_EQ((*adopted)->snaplen(), reference->snaplen());
    EXPECT_EQ((*adopted)->dataLink(), reference->dataLink());
  }

  // A veth pair va/vb inside the namespace, up, with IPv6 off so that no
  // neighbour discovery or MLD packet comes in between (packets that no
  // test sends could reach the two captures in different orders).
  void vethPair() {
    harness::inNetns(netns(), [] {
      for (const char* path : {"/proc/sys/net/ipv6/conf/all/disable_ipv6",
                               "/proc/sys/net/ipv6/conf/default/disable_ipv6"}) {
        std::ofstream(path) << "1\n";
      }
    });
    for (const std::vector<std::string>& cmd :
         std::vector<std::vector<std::string>>{{"ip", "-n", netns(), "link", "add", "name", "va",
                                                "type", "veth", "peer", "name", "vb"},
                                               {"ip", "-n", netns(), "link", "set", "va", "up"},
                                               {"ip", "-n", netns(), "link", "set", "vb", "up"}}) {
      harness::Result r = harness::run(cmd);
      ASSERT_EQ(r.exit_code, 0) << cmd[4] << " " << cmd[5] << ": " << r;
    }
  }

  // Two captures of one packet get the same time stamp only when it comes
  // from the skb, which the kernel stamps only while some socket wants time
  // stamps (net_enable_timestamp); otherwise each packet socket reads the
  // clock itself, a microsecond or so apart. This socket wants them for the
  // whole test. The kernel turns stamping on from a work queue: wait until a
  // packet read 20 ms after it came carries its arrival time, not the time
  // it was read.
  void shareTimestamps() {
    harness::inNetns(netns(), [&] {
      stamper_ = harness::Fd(socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_ALL)));
      sockaddr_ll lo{};
      lo.sll_family = AF_PACKET;
      lo.sll_protocol = htons(ETH_P_ALL);
      lo.sll_ifindex = static_cast<int>(if_nametoindex("lo"));
      EXPECT_EQ(bind(stamper_.get(), reinterpret_cast<sockaddr*>(&lo), sizeof(lo)), 0)
          << strerror(errno);
    });
    ASSERT_GE(stamper_.get(), 0) << strerror(errno);
    int on = 1;
    ASSERT_EQ(setsockopt(stamper_.get(), SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on)), 0)
        << strerror(errno);
    RingUdpSender probe(netns());
    int64_t age_ms = 0;
    ASSERT_TRUE(fakes::eventually(
        [&] {
          char drain[2048];
          while (recv(stamper_.get(), drain, sizeof(drain), MSG_DONTWAIT) > 0) {
          }
          probe.send("probe");
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          std::optional<timespec> stamp;
          for (;;) {
            char data[2048];
            alignas(cmsghdr) char control[256];
            iovec iov{data, sizeof(data)};
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control;
            msg.msg_controllen = sizeof(control);
            if (recvmsg(stamper_.get(), &msg, MSG_DONTWAIT) < 0) break;
            for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
              if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                timespec ts;
                std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
                stamp = ts;
              }
            }
          }
          if (!stamp) return false;
          timespec now;
          clock_gettime(CLOCK_REALTIME, &now);
          age_ms = (now.tv_sec - stamp->tv_sec) * 1000 + (now.tv_nsec - stamp->tv_nsec) / 1000000;
          return age_ms >= 15;
        },
        kRingDeadline))
        << "packets are not stamped on arrival (last one " << age_ms << " ms old when read)";
  }

  harness::NetNs* ns_ = nullptr;
  harness::Fd stamper_;
};

// The records of a handover are libpcap's: the old capture's then the
// adopted one's are the reference's, from the start marker to the end
// marker; batch 1 went to the old capture only, batch 2 to the adopted one
// only, each packet as many times as libpcap shows it.
void expectLibpcapRecords(const RingRun& run, size_t copies) {
  std::vector<RingRecord> both = run.old_records;
  both.insert(both.end(), run.adopted.begin(), run.adopted.end());
  const std::string start = ringMarker("start");
  const std::string end = ringMarker("end");
  const std::vector<RingRecord> want = ringBetween(run.reference, start, end);
  EXPECT_GE(want.size(), (2 * kRingBatch + 2) * copies);
  EXPECT_TRUE(ringSameRecords(ringBetween(both, start, end), want));
  for (int i = 0; i < kRingBatch; ++i) {
    EXPECT_EQ(ringCount(run.old_records, ringMarker(1, i)), copies) << ringMarker(1, i);
    EXPECT_EQ(ringCount(run.adopted, ringMarker(1, i)), 0u) << ringMarker(1, i);
    EXPECT_EQ(ringCount(run.adopted, ringMarker(2, i)), copies) << ringMarker(2, i);
  }
  // Some records were cut at the snapshot length, some not.
  bool cut = false, whole = false;
  for (const RingRecord& r : run.adopted) {
    (r.caplen < r.len ? cut : whole) = true;
    EXPECT_LE(r.caplen, kRingSnaplen);
  }
  EXPECT_TRUE(cut && whole);
}

// How many of `records` that start with `prefix` have our VLAN tag at
// `offset`.
size_t ringTagsAt(const std::vector<RingRecord>& records, size_t offset,
                  std::string_view prefix = {}) {
  const std::string tag = {'\x81', '\x00', static_cast<char>(kRingTci >> 8),
                           static_cast<char>(kRingTci & 0xff)};
  size_t n = 0;
  for (const RingRecord& r : records) {
    if (r.data.size() < offset + tag.size() || r.data.compare(0, prefix.size(), prefix) != 0) {
      continue;
    }
    n += r.data.compare(offset, tag.size(), tag) == 0;
  }
  return n;
}

// ------------------------------------------------------------ tests

TEST_F(AdoptedRingTest, LoopbackHandoverGivesLibpcapsRecords) {
  RingUdpSender udp(netns());
  RingRun run;
  // Loopback hands each packet over twice (out, then in); libpcap keeps one.
  ASSERT_NO_FATAL_FAILURE(handover(
      spec("lo"), [&](const std::string& p) { udp.send(p); }, 1, &run));
  expectLibpcapRecords(run, 1);
  EXPECT_EQ(run.geometry.version, 2u);
  EXPECT_EQ(run.geometry.socket_type, SOCK_RAW);
  EXPECT_GT(run.geometry.block_nr, 1u);
  EXPECT_EQ(uint64_t{run.geometry.block_size} * run.geometry.block_nr % 4096, 0u);
}

TEST_F(AdoptedRingTest, AnyHandoverGivesLibpcapsCookedRecords) {
  RingUdpSender udp(netns());
  RingRun run;
  ASSERT_NO_FATAL_FAILURE(handover(
      spec("any"), [&](const std::string& p) { udp.send(p); }, 1, &run));
  expectLibpcapRecords(run, 1);
  EXPECT_EQ(run.geometry.socket_type, SOCK_DGRAM);
  // A cooked header: "sent to us" (0), ARPHRD_LOOPBACK (772).
  ASSERT_FALSE(run.adopted.empty());
  EXPECT_EQ(run.adopted[0].data.substr(0, 4), std::string("\x00\x00\x03\x04", 4));
}

TEST_F(AdoptedRingTest, VlanTagsGoBackIntoEthernetRecords) {
  ASSERT_NO_FATAL_FAILURE(vethPair());
  RingVlanSender vlan(netns(), "va");
  RingRun run;
  ASSERT_NO_FATAL_FAILURE(handover(
      spec("vb"), [&](const std::string& p) { vlan.send(p); }, 1, &run));
  expectLibpcapRecords(run, 1);
  // Between the MAC addresses and the EtherType, where it was sent.
  EXPECT_GE(ringTagsAt(run.adopted, 12), static_cast<size_t>(kRingBatch + 1));
}

TEST_F(AdoptedRingTest, VlanTagsGoBackIntoCookedRecords) {
  ASSERT_NO_FATAL_FAILURE(vethPair());
  RingVlanSender vlan(netns(), "va");
  RingRun run;
  // Each frame leaves va (tag in the frame) and reaches vb (tag taken off).
  ASSERT_NO_FATAL_FAILURE(handover(
      spec("any"), [&](const std::string& p) { vlan.send(p); }, 2, &run));
  expectLibpcapRecords(run, 2);
  // Before the cooked header's protocol field, in the frames vb received
  // (broadcast, PACKET_BROADCAST). va's copies hold their tag in the data
  // the kernel gives, after a cooked header whose protocol is 802.1Q.
  EXPECT_GE(ringTagsAt(run.adopted, 14, std::string("\x00\x01", 2)),
            static_cast<size_t>(kRingBatch + 1));
}

// Reading a few at a time stops inside blocks and goes on there; a source
// read to the end can be handed over again.
TEST_F(AdoptedRingTest, SmallReadsAndASecondHandoverKeepTheSequence) {
  RingUdpSender udp(netns());
  std::unique_ptr<PacketSource> old = openInNetns(spec("lo"));
  std::unique_ptr<PacketSource> reference = openInNetns(spec("lo"));
  ASSERT_TRUE(old && reference);

  udp.send(ringPayload(ringMarker("start"), 0));
  for (int i = 0; i < kRingBatch; ++i) udp.send(ringPayload(ringMarker(1, i), i));
  RingCollector old_records;
  ASSERT_TRUE(ringReadUntil(*old, old_records, ringMarker(1, kRingBatch - 1)));
  for (int i = 0; i < kRingBatch; ++i) udp.send(ringPayload(ringMarker(2, i), i));
  udp.send(ringPayload(ringMarker("middle"), 1));

  absl::StatusOr<std::unique_ptr<PacketSource>> first = adoptFrom(*old);
  ASSERT_TRUE(first.ok()) << first.status();
  old.reset();
  RingCollector first_records;
  ASSERT_TRUE(ringReadUntil(**first, first_records, ringMarker("middle"), 1, 3));
  // Then to the end, as an agent does before it hands over.
  ASSERT_TRUE(ringReadUntil(**first, first_records, ringMarker("middle")));

  for (int i = 0; i < kRingBatch; ++i) udp.send(ringPayload(ringMarker(3, i), i + 5));
  udp.send(ringPayload(ringMarker("end"), 2));
  absl::StatusOr<std::unique_ptr<PacketSource>> second = adoptFrom(**first);
  ASSERT_TRUE(second.ok()) << second.status();
  first->reset();
  RingCollector second_records, reference_records;
  ASSERT_TRUE(ringReadUntil(**second, second_records, ringMarker("end"), 1, 3));
  ASSERT_TRUE(ringReadUntil(*reference, reference_records, ringMarker("end")));

  std::vector<RingRecord> all = old_records.records;
  all.insert(all.end(), first_records.records.begin(), first_records.records.end());
  all.insert(all.end(), second_records.records.begin(), second_records.records.end());
  const std::vector<RingRecord> want =
      ringBetween(reference_records.records, ringMarker("start"), ringMarker("end"));
  EXPECT_EQ(want.size(), static_cast<size_t>(3 * kRingBatch + 3));
  EXPECT_TRUE(ringSameRecords(ringBetween(all, ringMarker("start"), ringMarker("end")), want));
  for (int i = 0; i < kRingBatch; ++i) {
    EXPECT_EQ(ringCount(first_records.records, ringMarker(2, i)), 1u) << ringMarker(2, i);
    EXPECT_EQ(ringCount(second_records.records, ringMarker(3, i)), 1u) << ringMarker(3, i);
    EXPECT_EQ(ringCount(second_records.records, ringMarker(2, i)), 0u) << ringMarker(2, i);
  }
}

// A full ring whose oldest block is not its first: reading starts at the
// oldest (by the kernel's block numbers), goes round the ring, and hands
// every block back (a packet sent afterwards gets in).
TEST_F(AdoptedRingTest, FullRingIsReadOldestBlockFirst) {
  RingUdpSender udp(netns());
  std::unique_ptr<PacketSource> old = openInNetns(spec("lo"));
  ASSERT_TRUE(old);
  // Each round ends when the kernel has handed over the block holding its
  // packet: the packets after it go into the next block.
  RingCollector old_records;
  for (int round = 0; round < 2; ++round) {
    const std::string marker = ringMarker("round-" + std::to_string(round));
    udp.send(marker);
    ASSERT_TRUE(ringReadUntil(*old, old_records, marker));
  }
  // Several times what the 1 MiB ring holds; the kernel drops the rest.
  const std::string filler(1000, 'f');
  for (int i = 0; i < 3000; ++i) {
    char marker[32];
    std::snprintf(marker, sizeof(marker), "|siphon-ring f%05d|", i);
    udp.send(marker + filler);
  }
  absl::StatusOr<std::unique_ptr<PacketSource>> adopted = adoptFrom(*old);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  old.reset();

  RingCollector got;
  ASSERT_TRUE((*adopted)->read(INT_MAX, got).ok());
  std::vector<int> numbers;
  for (const RingRecord& r : got.records) {
    const size_t at = r.data.find("|siphon-ring f");
    if (at != std::string::npos) numbers.push_back(std::stoi(r.data.substr(at + 14, 5)));
  }
  ASSERT_GE(numbers.size(), 100u);
  EXPECT_EQ(numbers.front(), 0);
  for (size_t i = 1; i < numbers.size(); ++i) {
    ASSERT_LT(numbers[i - 1], numbers[i]) << "record " << i << " of " << numbers.size();
  }
  udp.send(ringMarker("after"));
  EXPECT_TRUE(ringReadUntil(**adopted, got, ringMarker("after")));
}

TEST_F(AdoptedRingTest, KernelDropsCarryOnFromTheExport) {
  RingUdpSender udp(netns());
  std::unique_ptr<PacketSource> old = openInNetns(spec("lo"));
  ASSERT_TRUE(old);
  // Near 2^32, so the count wraps as libpcap's does.
  const uint32_t exported = 0xffffff00u;
  absl::StatusOr<std::unique_ptr<PacketSource>> adopted = adoptFrom(*old, nullptr, exported);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  old.reset();
  PacketSource& source = **adopted;

  // Far more than the 1 MiB ring holds, read by nobody.
  const std::string big(1200, 'x');
  for (int i = 0; i < 3000; ++i) udp.send(big);
  absl::StatusOr<uint32_t> first = source.kernelDrops();
  ASSERT_TRUE(first.ok()) << first.status();
  const uint32_t dropped = *first - exported;
  EXPECT_GT(dropped, 256u) << "the count should have wrapped past 2^32";
  EXPECT_LE(dropped, 6000u);  // each datagram goes into the ring twice, out and in

  RingCollector drained;
  ASSERT_TRUE(source.read(INT_MAX, drained).ok());
  for (int i = 0; i < 3000; ++i) udp.send(big);
  absl::StatusOr<uint32_t> second = source.kernelDrops();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(static_cast<uint32_t>(*second - *first), 0u) << "the drops add up";
}

TEST_F(AdoptedRingTest, DeletedInterfaceEndsTheCapture) {
  ASSERT_NO_FATAL_FAILURE(vethPair());
  std::unique_ptr<PacketSource> old = openInNetns(spec("va"));
  ASSERT_TRUE(old);
  absl::StatusOr<std::unique_ptr<PacketSource>> adopted = adoptFrom(*old);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  old.reset();
  RingCollector records;
  ASSERT_TRUE((*adopted)->read(INT_MAX, records).ok());

  // Down only pauses a capture.
  harness::Result down = harness::run({"ip", "-n", netns(), "link", "set", "va", "down"});
  ASSERT_EQ(down.exit_code, 0) << down;
  absl::StatusOr<int> n = (*adopted)->read(INT_MAX, records);
  EXPECT_TRUE(n.ok()) << n.status();

  harness::Result del = harness::run({"ip", "-n", netns(), "link", "del", "va"});
  ASSERT_EQ(del.exit_code, 0) << del;
  absl::Status error;
  ASSERT_TRUE(fakes::eventually(
      [&] {
        absl::StatusOr<int> r = (*adopted)->read(INT_MAX, records);
        error = r.status();
        return !r.ok();
      },
      kRingDeadline));
  EXPECT_EQ(errorCodeOf(error), v1::UNAVAILABLE) << error;
  EXPECT_THAT(std::string(error.message()), HasSubstr("disappeared"));
}

TEST_F(AdoptedRingTest, RingGeometryErrorsSayWhatIsWrong) {
  UniqueFd diag = diagSocket();

  harness::Fd udp(harness::socketInNetns(netns(), AF_INET, SOCK_DGRAM));
  absl::StatusOr<RingGeometry> g = ringGeometry(diag.get(), udp.get());
  EXPECT_EQ(errorCodeOf(g.status()), v1::NOT_FOUND) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("no packet socket"));

  harness::Fd file(open("/dev/null", O_RDONLY | O_CLOEXEC));
  g = ringGeometry(diag.get(), file.get());
  EXPECT_EQ(errorCodeOf(g.status()), v1::NOT_FOUND) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("not a socket"));

  // A packet socket of another namespace (the test's own) is not listed.
  harness::Fd elsewhere(socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0));
  ASSERT_GE(elsewhere.get(), 0) << strerror(errno);
  g = ringGeometry(diag.get(), elsewhere.get());
  EXPECT_EQ(errorCodeOf(g.status()), v1::NOT_FOUND) << g.status();

  harness::Fd no_ring(harness::socketInNetns(netns(), AF_PACKET, SOCK_RAW));
  ASSERT_GE(no_ring.get(), 0) << strerror(errno);
  g = ringGeometry(diag.get(), no_ring.get());
  EXPECT_EQ(errorCodeOf(g.status()), v1::FAILED_PRECONDITION) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("no RX ring"));

  harness::Fd v2(harness::socketInNetns(netns(), AF_PACKET, SOCK_RAW));
  int version = TPACKET_V2;
  ASSERT_EQ(setsockopt(v2.get(), SOL_PACKET, PACKET_VERSION, &version, sizeof(version)), 0)
      << strerror(errno);
  tpacket_req req{};
  req.tp_block_size = 4096;
  req.tp_block_nr = 1;
  req.tp_frame_size = 2048;
  req.tp_frame_nr = 2;
  ASSERT_EQ(setsockopt(v2.get(), SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)), 0)
      << strerror(errno);
  g = ringGeometry(diag.get(), v2.get());
  EXPECT_EQ(errorCodeOf(g.status()), v1::FAILED_PRECONDITION) << g.status();
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("TPACKET_V2"));

  // The netlink socket is left clean: a good question after the others.
  std::unique_ptr<PacketSource> pcap = openInNetns(spec("lo"));
  ASSERT_TRUE(pcap);
  g = ringGeometry(diag.get(), pcap->selectableFd());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->version, 2u);

  // adoptRing() takes no ring it cannot read as libpcap would.
  AdoptedRing ring;
  ring.socket = UniqueFd(fcntl(pcap->selectableFd(), F_DUPFD_CLOEXEC, 0));
  ring.geometry = *g;
  ring.geometry.socket_type = SOCK_DGRAM;
  ring.data_link = DLT_EN10MB;
  absl::StatusOr<std::unique_ptr<PacketSource>> source = adoptRing(std::move(ring));
  EXPECT_EQ(errorCodeOf(source.status()), v1::UNIMPLEMENTED) << source.status();
}

}  // namespace
}  // namespace siphon::agent::capture
