#include "exec/packet.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

namespace siphon::exec {
namespace {

constexpr uint8_t kUdp = 17;
constexpr uint8_t kIcmp = 1;
constexpr uint8_t kIcmp6 = 58;

uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

// The one's-complement sum of `data`, folded into `sum`.
uint32_t sumOf(const uint8_t* data, size_t n, uint32_t sum) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += get16(data + i);
  if (n % 2 != 0) sum += static_cast<uint32_t>(data[n - 1]) << 8;
  return sum;
}
uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// The sum of the pseudo-header of an upper-layer packet of `length` bytes.
uint32_t pseudoSum(bool v6, const uint8_t* src, const uint8_t* dst, uint8_t proto,
                   size_t length) {
  const size_t alen = v6 ? 16 : 4;
  uint32_t sum = sumOf(src, alen, 0);
  sum = sumOf(dst, alen, sum);
  sum += proto;
  sum += static_cast<uint32_t>(length >> 16);
  sum += static_cast<uint32_t>(length & 0xffff);
  return sum;
}

// An IP header for `payload_len` bytes of `proto` from `src` to `dst`,
// written at `out` (20 or 40 bytes).
void ipHeader(bool v6, uint8_t* out, const uint8_t* src, const uint8_t* dst, uint8_t proto,
              size_t payload_len) {
  if (v6) {
    out[0] = 0x60;
    put16(out + 4, static_cast<uint16_t>(payload_len));
    out[6] = proto;
    out[7] = 64;
    std::memcpy(out + 8, src, 16);
    std::memcpy(out + 24, dst, 16);
    return;
  }
  out[0] = 0x45;
  put16(out + 2, static_cast<uint16_t>(20 + payload_len));
  out[6] = 0x40;  // don't fragment
  out[8] = 64;
  out[9] = proto;
  std::memcpy(out + 12, src, 4);
  std::memcpy(out + 16, dst, 4);
  put16(out + 10, fold(sumOf(out, 20, 0)));
}

std::string addressText(bool v6, const std::array<uint8_t, 16>& a) {
  char text[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(v6 ? AF_INET6 : AF_INET, a.data(), text, sizeof(text));
  return text;
}

}  // namespace

std::string UdpFlow::dstAddress() const { return addressText(v6, dst); }
std::string UdpFlow::srcAddress() const { return addressText(v6, src); }

std::optional<UdpPacket> parseUdp(std::string_view packet) {
  const auto* p = reinterpret_cast<const uint8_t*>(packet.data());
  const size_t n = packet.size();
  if (n < 1) return std::nullopt;
  UdpPacket out;
  size_t header = 0;
  size_t total = 0;
  if ((p[0] >> 4) == 4) {
    if (n < 20) return std::nullopt;
    header = static_cast<size_t>(p[0] & 0x0f) * 4;
    total = get16(p + 2);
    // Fragments (more to come, or an offset) are not whole datagrams.
    const uint16_t frag = get16(p + 6);
    if (header < 20 || total < header || total > n || p[9] != kUdp || (frag & 0x3fff) != 0) {
      return std::nullopt;
    }
    std::memcpy(out.flow.src.data(), p + 12, 4);
    std::memcpy(out.flow.dst.data(), p + 16, 4);
  } else if ((p[0] >> 4) == 6) {
    if (n < 40) return std::nullopt;
    header = 40;
    total = 40 + get16(p + 4);
    if (total > n || p[6] != kUdp) return std::nullopt;
    out.flow.v6 = true;
    std::memcpy(out.flow.src.data(), p + 8, 16);
    std::memcpy(out.flow.dst.data(), p + 24, 16);
  } else {
    return std::nullopt;
  }
  if (total - header < 8) return std::nullopt;
  const uint8_t* udp = p + header;
  const size_t udp_len = get16(udp + 4);
  if (udp_len < 8 || udp_len > total - header) return std::nullopt;
  out.flow.src_port = get16(udp);
  out.flow.dst_port = get16(udp + 2);
  out.payload = packet.substr(header + 8, udp_len - 8);
  return out;
}

std::string buildUdpReply(const UdpFlow& flow, std::string_view payload) {
  const size_t ip = flow.v6 ? 40 : 20;
  const size_t udp_len = 8 + payload.size();
  std::string out(ip + udp_len, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  ipHeader(flow.v6, p, flow.dst.data(), flow.src.data(), kUdp, udp_len);
  uint8_t* udp = p + ip;
  put16(udp, flow.dst_port);
  put16(udp + 2, flow.src_port);
  put16(udp + 4, static_cast<uint16_t>(udp_len));
  std::memcpy(udp + 8, payload.data(), payload.size());
  uint16_t sum =
      fold(sumOf(udp, udp_len, pseudoSum(flow.v6, flow.dst.data(), flow.src.data(), kUdp, udp_len)));
  if (sum == 0) sum = 0xffff;  // 0 means "no checksum" (and is not allowed in IPv6)
  put16(udp + 6, sum);
  return out;
}

std::string buildPortUnreachable(const UdpFlow& flow, std::string_view packet) {
  // As much of the offending packet as the minimum MTU allows (RFC 792:
  // its header and 8 bytes at least; RFC 4443: up to 1280 in all).
  const size_t ip = flow.v6 ? 40 : 20;
  const size_t quoted = std::min(packet.size(), flow.v6 ? size_t{1280 - 48} : size_t{576 - 28});
  const size_t icmp_len = 8 + quoted;
  std::string out(ip + icmp_len, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  // From the destination the program tried (as a host would answer).
  ipHeader(flow.v6, p, flow.dst.data(), flow.src.data(), flow.v6 ? kIcmp6 : kIcmp, icmp_len);
  uint8_t* icmp = p + ip;
  icmp[0] = flow.v6 ? 1 : 3;  // destination unreachable
  icmp[1] = flow.v6 ? 4 : 3;  // port unreachable
  std::memcpy(icmp + 8, packet.data(), quoted);
  const uint32_t start =
      flow.v6 ? pseudoSum(true, flow.dst.data(), flow.src.data(), kIcmp6, icmp_len) : 0;
  put16(icmp + 2, fold(sumOf(icmp, icmp_len, start)));
  return out;
}

}  // namespace siphon::exec
