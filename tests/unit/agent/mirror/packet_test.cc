#include <gtest/gtest.h>

#include <random>

#include "agent/mirror/reassembly.h"
#include "tests/unit/agent/mirror/test_packets.h"

namespace siphon::agent::mirror {
namespace {

using testing::ethernet;
using testing::ipv4Packet;
using testing::ipv6Packet;
using testing::TcpFields;

TcpFields fields() {
  TcpFields f;
  f.source_port = 40001;
  f.destination_port = 8080;
  f.seq = 0xfffffff0;
  f.ack = 77;
  f.flags = tcp::kAck | tcp::kPsh;
  f.payload = "GET / HTTP/1.1\r\n";
  return f;
}

// For the packets whose segment is not read.
absl::Status statusOf(const std::string& packet, LinkType link) {
  return parsePacket(packet, link).status();
}

bool mentions(const absl::Status& status, std::string_view text) {
  return std::string_view(status.message().data(), status.message().size()).find(text) !=
         std::string_view::npos;
}

TEST(ParsePacket, Ipv4WithOptionsOnBothLayers) {
  TcpFields f = fields();
  f.options = std::string("\x02\x04\x05\xb4", 4);  // MSS
  std::string packet = ipv4Packet(f, std::string("\x01\x01\x01\x01", 4));
  auto segment = parsePacket(packet, LinkType::kRawIp);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->source.toString(), "10.0.0.1:40001");
  EXPECT_EQ(segment->destination.toString(), "10.0.0.2:8080");
  EXPECT_EQ(segment->source.address, IpAddress::v4(10, 0, 0, 1));
  EXPECT_EQ(segment->seq, 0xfffffff0u);
  EXPECT_EQ(segment->ack, 77u);
  EXPECT_TRUE(segment->has(tcp::kPsh));
  EXPECT_FALSE(segment->has(tcp::kSyn));
  EXPECT_EQ(segment->payload, "GET / HTTP/1.1\r\n");
}

TEST(ParsePacket, Ipv4LinkPaddingIsNotPayload) {
  TcpFields f = fields();
  f.payload = "";
  std::string packet = ipv4Packet(f) + std::string(6, '\0');  // a minimum-size frame's padding
  std::string frame = ethernet(0x0800, packet);
  auto segment = parsePacket(frame, LinkType::kEthernet);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_TRUE(segment->payload.empty());
}

TEST(ParsePacket, Ipv6WithExtensionHeaders) {
  TcpFields f = fields();
  std::string hop_by_hop = std::string("\x00", 1) + std::string(6, '\x01');    // 8 bytes: len 0
  std::string destination = std::string("\x01", 1) + std::string(14, '\x00');  // 16 bytes: len 1
  std::string auth = std::string("\x01", 1) + std::string(10, '\x00');         // 12 bytes: len 1
  auto packet = ipv6Packet(f, {{0, hop_by_hop}, {60, destination}, {51, auth}});
  auto segment = parsePacket(packet, LinkType::kRawIp);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->source.toString(), "[fd00::1]:40001");
  EXPECT_EQ(segment->destination.toString(), "[fd00::2]:8080");
  EXPECT_EQ(segment->destination.address.family, 6);
  EXPECT_EQ(segment->payload, f.payload);
}

TEST(ParsePacket, EthernetWithVlanTags) {
  std::string two_tags = ethernet(0x86dd, ipv6Packet(fields()), {10, 20});
  auto v6 = parsePacket(two_tags, LinkType::kEthernet);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->payload, fields().payload);
  EXPECT_EQ(statusOf(ethernet(0x86dd, ipv6Packet(fields()), {1, 2, 3}), LinkType::kEthernet).code(),
            absl::StatusCode::kUnimplemented);
}

TEST(ParsePacket, UnsupportedButWellFormedPacketsSayWhy) {
  absl::Status udp = statusOf(ipv4Packet(fields(), "", 0x4000, 17), LinkType::kRawIp);
  EXPECT_EQ(udp.code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(mentions(udp, "not TCP")) << udp;

  absl::Status more_fragments = statusOf(ipv4Packet(fields(), "", 0x2000), LinkType::kRawIp);
  EXPECT_TRUE(mentions(more_fragments, "fragment")) << more_fragments;
  absl::Status later_fragment = statusOf(ipv4Packet(fields(), "", 0x0010), LinkType::kRawIp);
  EXPECT_TRUE(mentions(later_fragment, "fragment")) << later_fragment;

  absl::Status v6_fragment =
      statusOf(ipv6Packet(fields(), {{44, std::string(7, '\0')}}), LinkType::kRawIp);
  EXPECT_TRUE(mentions(v6_fragment, "fragment")) << v6_fragment;

  absl::Status arp = statusOf(ethernet(0x0806, std::string(28, '\0')), LinkType::kEthernet);
  EXPECT_TRUE(mentions(arp, "ethertype")) << arp;
}

TEST(ParsePacket, TruncatedPacketsAreRejectedAtEveryLength) {
  for (const std::string& packet :
       {ipv4Packet(fields()), ipv6Packet(fields(), {{0, std::string(7, '\0')}}),
        ethernet(0x0800, ipv4Packet(fields()), {5})}) {
    LinkType link = packet[0] == '\x02' ? LinkType::kEthernet : LinkType::kRawIp;
    ASSERT_TRUE(parsePacket(packet, link).ok());
    for (size_t length = 0; length < packet.size(); ++length) {
      auto segment = parsePacket(std::string_view(packet).substr(0, length), link);
      EXPECT_EQ(segment.status().code(), absl::StatusCode::kInvalidArgument)
          << "length " << length << ": " << segment.status();
    }
  }
}

TEST(ParsePacket, LyingLengthFieldsAreRejected) {
  std::string packet = ipv4Packet(fields());
  std::string bad_ihl = packet;
  bad_ihl[0] = 0x43;  // header length 12 bytes
  EXPECT_EQ(parsePacket(bad_ihl, LinkType::kRawIp).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string huge_ihl = packet.substr(0, 30);
  huge_ihl[0] = 0x4f;  // 60 bytes of header in a 30-byte packet
  EXPECT_EQ(parsePacket(huge_ihl, LinkType::kRawIp).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string short_total = packet;
  short_total[2] = 0;
  short_total[3] = 10;  // shorter than its own header
  EXPECT_EQ(parsePacket(short_total, LinkType::kRawIp).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string bad_data_offset = packet;
  bad_data_offset[20 + 12] = 0x40;  // TCP header of 16 bytes
  EXPECT_EQ(parsePacket(bad_data_offset, LinkType::kRawIp).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string long_data_offset = packet;
  long_data_offset[20 + 12] = static_cast<char>(0xf0);  // 60 bytes, more than the packet
  long_data_offset.resize(20 + 40);
  long_data_offset[2] = 0;
  long_data_offset[3] = 60;
  EXPECT_EQ(parsePacket(long_data_offset, LinkType::kRawIp).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string version = packet;
  version[0] = 0x55;
  EXPECT_EQ(parsePacket(version, LinkType::kRawIp).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Ethernet says IPv4, the packet is IPv6.
  EXPECT_EQ(
      statusOf(ethernet(0x0800, ipv6Packet(fields())), LinkType::kEthernet).code(),
      absl::StatusCode::kInvalidArgument);
  // An extension header whose length runs past the packet.
  std::string long_extension = std::string("\x20", 1) + std::string(6, '\0');
  EXPECT_EQ(
      statusOf(ipv6Packet(fields(), {{60, long_extension}}), LinkType::kRawIp).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(ParsePacket, RandomGarbageNeverCrashes) {
  std::mt19937 random(7);
  std::string valid = ipv6Packet(fields(), {{0, std::string(7, '\0')}});
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string packet;
    if (i % 2 == 0) {
      packet.resize(random() % 120);
      for (char& c : packet) c = static_cast<char>(random());
      if (!packet.empty())
        packet[0] = static_cast<char>((random() % 2 ? 0x40 : 0x60) | (packet[0] & 0x0f));
    } else {
      // A valid packet with a few bytes flipped: gets further into the parser.
      packet = valid;
      for (int flips = 1 + random() % 3; flips > 0; --flips) {
        packet[random() % packet.size()] = static_cast<char>(random());
      }
    }
    auto segment = parsePacket(packet, i % 3 == 0 ? LinkType::kEthernet : LinkType::kRawIp);
    if (segment.ok()) {
      ++accepted;
      // The payload always lies inside the packet.
      EXPECT_GE(segment->payload.data(), packet.data());
      EXPECT_LE(segment->payload.data() + segment->payload.size(), packet.data() + packet.size());
    }
  }
  EXPECT_GT(accepted, 0);  // flipping payload bytes keeps some valid
}

}  // namespace
}  // namespace siphon::agent::mirror
