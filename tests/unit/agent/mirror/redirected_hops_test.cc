// RedirectedHops over a fake NatLookup: which copies of a connection go on
// to reassembly in a pod with a mesh (redirected_hops.h).
#include "agent/mirror/redirected_hops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/agent/mirror/test_packets.h"

namespace siphon::agent::mirror {
namespace {

using ::testing::ElementsAre;
using testing::ipv4Packet;
using ::testing::IsEmpty;
using testing::TcpFields;

// What conntrack and /proc would say: per client port, the translated
// destination port (absent: no conntrack entry yet); the agent's own
// listeners.
struct FakeNat : NatLookup {
  std::map<uint16_t, uint16_t> translated;  // client port -> port
  std::set<uint16_t> own;
  int lookups = 0;
  std::optional<uint16_t> translatedPort(const Endpoint& client, const Endpoint&) override {
    ++lookups;
    auto it = translated.find(client.port);
    if (it == translated.end()) return std::nullopt;
    return it->second;
  }
  bool ownListener(uint16_t port) override { return own.contains(port); }
};

// Client 10.0.0.1:client_port -> server 10.0.0.2:80, or the reply.
std::string packet(uint16_t client_port, uint8_t flags, bool reply = false,
                   const std::string& payload = "") {
  TcpFields f;
  f.source_port = reply ? 80 : client_port;
  f.destination_port = reply ? client_port : 80;
  f.flags = flags;
  f.payload = payload;
  std::string p = ipv4Packet(f);
  if (reply) {
    for (int i = 0; i < 4; ++i) std::swap(p[12 + i], p[16 + i]);
  }
  return p;
}

class RedirectedHopsTest : public ::testing::Test {
 protected:
  RedirectedHopsTest() {
    auto nat = std::make_unique<FakeNat>();
    nat_ = nat.get();
    hops_ = std::make_unique<RedirectedHops>(std::move(nat));
    hops_->setPorts({80});
  }
  void feed(const std::string& p, bool loopback = false, Timestamp at = Timestamp(0)) {
    hops_->onPacket(p, loopback, at, [this](std::string_view b) { out_.emplace_back(b); });
  }

  FakeNat* nat_;
  std::unique_ptr<RedirectedHops> hops_;
  std::vector<std::string> out_;
};

TEST_F(RedirectedHopsTest, AConnectionTheMeshRedirectedIsLeftOutOnItsInterface) {
  const std::string syn = packet(40000, tcp::kSyn);
  feed(syn);  // conntrack has not confirmed it yet: held
  EXPECT_THAT(out_, IsEmpty());
  nat_->translated[40000] = 15006;  // REDIRECTed to the proxy's port
  feed(packet(40000, tcp::kSyn | tcp::kAck, true));
  feed(packet(40000, tcp::kAck, false, "MESH-TLS"));
  EXPECT_THAT(out_, IsEmpty());
  EXPECT_EQ(hops_->counters().connections_left_out, 1u);
  EXPECT_EQ(hops_->counters().packets_left_out, 3u);
  EXPECT_EQ(nat_->lookups, 2);  // once per look, not per packet
  // The proxy's hop to the application, over lo, is followed.
  const std::string plain = packet(40001, tcp::kAck, false, "GET /");
  feed(plain, /*loopback=*/true);
  EXPECT_THAT(out_, ElementsAre(plain));
}

TEST_F(RedirectedHopsTest, AConnectionNotTranslatedIsFollowedWithItsHeldSynFirst) {
  const std::string syn = packet(40000, tcp::kSyn);
  const std::string synack = packet(40000, tcp::kSyn | tcp::kAck, true);
  feed(syn);
  nat_->translated[40000] = 80;
  feed(synack);
  EXPECT_THAT(out_, ElementsAre(syn, synack));
}

TEST_F(RedirectedHopsTest, ARedirectToTheAgentsOwnListenerIsFollowed) {
  // The iptables steal backend's REDIRECT: what the steal delivers.
  nat_->translated[40000] = 41234;
  nat_->own.insert(41234);
  const std::string syn = packet(40000, tcp::kSyn),
                    synack = packet(40000, tcp::kSyn | tcp::kAck, true);
  feed(syn);
  feed(synack);
  EXPECT_THAT(out_, ElementsAre(syn, synack));
}

TEST_F(RedirectedHopsTest, NoConntrackAnswerDeliversAtTheNextPacketOrTheHoldLimit) {
  const std::string syn = packet(40000, tcp::kSyn);
  const std::string synack = packet(40000, tcp::kSyn | tcp::kAck, true);
  feed(syn);
  feed(synack);  // still nothing known: no NAT in this namespace
  EXPECT_THAT(out_, ElementsAre(syn, synack));

  const std::string lonely = packet(40002, tcp::kSyn);
  feed(lonely, false, Timestamp(0));
  hops_->advanceTime(RedirectedHops::kHoldLimit / 2,
                     [this](std::string_view b) { out_.emplace_back(b); });
  EXPECT_EQ(out_.size(), 2u);
  hops_->advanceTime(RedirectedHops::kHoldLimit,
                     [this](std::string_view b) { out_.emplace_back(b); });
  EXPECT_EQ(out_.back(), lonely);
}

TEST_F(RedirectedHopsTest, LoopbackAndOtherPortsPassUntouched) {
  nat_->translated[40000] = 15006;
  const std::string on_lo = packet(40000, tcp::kAck, false, "x");
  feed(on_lo, true);
  hops_->setPorts({8080});
  const std::string other = packet(40000, tcp::kAck, false, "y");
  feed(other);
  EXPECT_THAT(out_, ElementsAre(on_lo, other));
  EXPECT_EQ(nat_->lookups, 0);
}

TEST_F(RedirectedHopsTest, ClosedConnectionsAreForgotten) {
  nat_->translated[40000] = 15006;
  feed(packet(40000, tcp::kAck, false, "a"));
  feed(packet(40000, tcp::kFin | tcp::kAck));
  EXPECT_EQ(hops_->sizeForTest(), 1u);
  auto none = [](std::string_view) {};
  hops_->advanceTime(RedirectedHops::kClosedLinger, none);
  EXPECT_EQ(hops_->sizeForTest(), 0u);
  feed(packet(40001, tcp::kAck, false, "b"));
  hops_->advanceTime(RedirectedHops::kIdleLimit, none);
  EXPECT_EQ(hops_->sizeForTest(), 0u);
}

}  // namespace
}  // namespace siphon::agent::mirror
