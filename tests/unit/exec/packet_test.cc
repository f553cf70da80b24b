// The program's UDP datagrams as IP packets (layer-protocol/exec/packet.h):
// parsed, answered, and their checksums checked here by an independent sum.
#include "exec/packet.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace siphon::exec {
namespace {

uint16_t at16(const std::string& s, size_t i) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[i]) << 8 | static_cast<uint8_t>(s[i + 1]));
}

// The one's-complement sum of `words` (an even-padded byte string): 0xffff
// when the checksum inside is right.
uint16_t onesSum(std::string bytes) {
  if (bytes.size() % 2) bytes.push_back('\0');
  uint32_t sum = 0;
  for (size_t i = 0; i < bytes.size(); i += 2) sum += at16(bytes, i);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// The pseudo-header an upper-layer checksum covers.
std::string pseudo(const std::string& src, const std::string& dst, uint8_t proto, size_t len) {
  std::string p = src + dst;
  if (src.size() == 4) {
    p += std::string(1, '\0') + std::string(1, static_cast<char>(proto));
    p += std::string(1, static_cast<char>(len >> 8)) + std::string(1, static_cast<char>(len));
  } else {
    p += std::string(1, static_cast<char>(len >> 24)) + std::string(1, static_cast<char>(len >> 16));
    p += std::string(1, static_cast<char>(len >> 8)) + std::string(1, static_cast<char>(len));
    p += std::string(3, '\0') + std::string(1, static_cast<char>(proto));
  }
  return p;
}

UdpFlow flow4() {
  UdpFlow f;
  inet_pton(AF_INET, "198.18.255.254", f.src.data());
  inet_pton(AF_INET, "10.96.0.10", f.dst.data());
  f.src_port = 40000;
  f.dst_port = 53;
  return f;
}

UdpFlow flow6() {
  UdpFlow f;
  f.v6 = true;
  inet_pton(AF_INET6, "fd5e:5e00::1", f.src.data());
  inet_pton(AF_INET6, "fd00::53", f.dst.data());
  f.src_port = 40001;
  f.dst_port = 5353;
  return f;
}

// A datagram as the program would send it: the reply of the reversed flow.
std::string sent(const UdpFlow& f, std::string_view payload) {
  UdpFlow reversed = f;
  std::swap(reversed.src, reversed.dst);
  std::swap(reversed.src_port, reversed.dst_port);
  return buildUdpReply(reversed, payload);
}

TEST(PacketTest, AnIpv4DatagramRoundTrips) {
  const std::string packet = sent(flow4(), "query");
  auto p = parseUdp(packet);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->flow, flow4());
  EXPECT_EQ(p->payload, "query");
  EXPECT_EQ(p->flow.dstAddress(), "10.96.0.10");
  EXPECT_EQ(p->flow.srcAddress(), "198.18.255.254");
  EXPECT_EQ(packet.size(), 20u + 8 + 5);
  EXPECT_EQ(onesSum(packet.substr(0, 20)), 0xffff) << "IPv4 header checksum";
  EXPECT_EQ(onesSum(pseudo(packet.substr(12, 4), packet.substr(16, 4), 17, 13) + packet.substr(20)),
            0xffff)
      << "UDP checksum";
}

TEST(PacketTest, TheReplySwapsTheEnds) {
  const std::string reply = buildUdpReply(flow4(), "answer");
  auto p = parseUdp(reply);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->flow.srcAddress(), "10.96.0.10");
  EXPECT_EQ(p->flow.dstAddress(), "198.18.255.254");
  EXPECT_EQ(p->flow.src_port, 53);
  EXPECT_EQ(p->flow.dst_port, 40000);
  EXPECT_EQ(p->payload, "answer");
}

TEST(PacketTest, AnIpv6DatagramRoundTripsWithItsChecksum) {
  const std::string packet = sent(flow6(), std::string(1001, 'x'));  // odd length
  auto p = parseUdp(packet);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->flow, flow6());
  EXPECT_EQ(p->payload.size(), 1001u);
  EXPECT_EQ(p->flow.dstAddress(), "fd00::53");
  EXPECT_EQ(onesSum(pseudo(packet.substr(8, 16), packet.substr(24, 16), 17, 1009) +
                    packet.substr(40)),
            0xffff);
}

TEST(PacketTest, AnEmptyDatagramIsOne) {
  auto p = parseUdp(sent(flow4(), ""));
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->payload.empty());
}

TEST(PacketTest, WhatIsNotAWholeDatagramIsRefused) {
  const std::string good = sent(flow4(), "query");
  EXPECT_FALSE(parseUdp("").has_value());
  EXPECT_FALSE(parseUdp(good.substr(0, 27)).has_value());  // truncated UDP header
  EXPECT_FALSE(parseUdp(good.substr(0, good.size() - 1)).has_value());  // shorter than its length
  std::string frag = good;
  frag[6] = 0x20;  // more fragments
  EXPECT_FALSE(parseUdp(frag).has_value());
  std::string offset = good;
  offset[6] = 0;
  offset[7] = 1;  // a later fragment
  EXPECT_FALSE(parseUdp(offset).has_value());
  std::string tcp = good;
  tcp[9] = 6;
  EXPECT_FALSE(parseUdp(tcp).has_value());
  std::string v5 = good;
  v5[0] = 0x55;
  EXPECT_FALSE(parseUdp(v5).has_value());
  std::string bad_udp_len = good;
  bad_udp_len[24] = 0x10;  // UDP length beyond the packet
  EXPECT_FALSE(parseUdp(bad_udp_len).has_value());
  std::string ext = sent(flow6(), "x");
  ext[6] = 0;  // hop-by-hop options first: not taken apart
  EXPECT_FALSE(parseUdp(ext).has_value());
}

TEST(PacketTest, PortUnreachableQuotesTheDatagram) {
  const std::string packet = sent(flow4(), "query");
  const std::string icmp = buildPortUnreachable(flow4(), packet);
  ASSERT_EQ(icmp.size(), 20u + 8 + packet.size());
  EXPECT_EQ(icmp[9], 1);  // ICMP
  EXPECT_EQ(icmp.substr(12, 4), packet.substr(16, 4)) << "from where the program sent";
  EXPECT_EQ(icmp.substr(16, 4), packet.substr(12, 4));
  EXPECT_EQ(icmp[20], 3);
  EXPECT_EQ(icmp[21], 3);
  EXPECT_EQ(icmp.substr(28), packet);
  EXPECT_EQ(onesSum(icmp.substr(0, 20)), 0xffff);
  EXPECT_EQ(onesSum(icmp.substr(20)), 0xffff);

  const std::string packet6 = sent(flow6(), "q");
  const std::string icmp6 = buildPortUnreachable(flow6(), packet6);
  EXPECT_EQ(icmp6[6], 58);
  EXPECT_EQ(icmp6[40], 1);
  EXPECT_EQ(icmp6[41], 4);
  EXPECT_EQ(onesSum(pseudo(icmp6.substr(8, 16), icmp6.substr(24, 16), 58, icmp6.size() - 40) +
                    icmp6.substr(40)),
            0xffff);
  // A large datagram is quoted only as far as the minimum MTU allows.
  const std::string big = sent(flow6(), std::string(4000, 'y'));
  EXPECT_EQ(buildPortUnreachable(flow6(), big).size(), 1280u);
}

}  // namespace
}  // namespace siphon::exec
