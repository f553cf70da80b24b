// The UDP datagrams of `siphon exec`'s program as IP packets: the program's
// namespace routes UDP into a TUN device (sandbox.h), whose reads are whole
// IPv4 or IPv6 packets. parseUdp() takes one apart (the flow and the
// payload); buildUdp() makes the answer to write back (source and
// destination swapped, checksums set). Fragments and packets with IPv6
// extension headers are not UDP datagrams here (a TUN MTU of 65535 leaves
// IPv4 unfragmented). Pure functions (tests/unit/exec/packet_test.cc).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace siphon::exec {

struct UdpFlow {
  bool v6 = false;
  std::array<uint8_t, 16> src{};  // network order; IPv4 in the first 4
  std::array<uint8_t, 16> dst{};
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  bool operator==(const UdpFlow&) const = default;
  bool operator<(const UdpFlow& o) const {
    return std::tie(v6, src, dst, src_port, dst_port) <
           std::tie(o.v6, o.src, o.dst, o.src_port, o.dst_port);
  }
  std::string dstAddress() const;  // numeric, "10.0.0.1" or "fd00::1"
  std::string srcAddress() const;
};

struct UdpPacket {
  UdpFlow flow;
  std::string_view payload;  // into the packet parsed
};

// nullopt for anything but a whole, well-formed UDP datagram.
std::optional<UdpPacket> parseUdp(std::string_view packet);

// The IP packet that carries `payload` from flow.dst:dst_port back to
// flow.src:src_port (an answer to a datagram of `flow`).
std::string buildUdpReply(const UdpFlow& flow, std::string_view payload);

// The ICMP "port unreachable" (IPv4) or "destination unreachable, port
// unreachable" (ICMPv6) answer to `packet`, a datagram of `flow`: what the
// program's socket sees as ECONNREFUSED.
std::string buildPortUnreachable(const UdpFlow& flow, std::string_view packet);

}  // namespace siphon::exec
