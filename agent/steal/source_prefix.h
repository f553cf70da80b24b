// A source prefix no steal takes (--probe-source CIDR): where the kubelet's
// health probes come from (the node's address). Connections from it reach
// the application whatever the port's steal, filtered or not, on both
// backends: a steal must never get the pod restarted by its own probes.
#pragma once

#include <arpa/inet.h>
#include <sys/socket.h>

#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace siphon::agent::steal {

struct SourcePrefix {
  int family = AF_INET;
  std::array<uint8_t, 16> addr{};  // network order; IPv4 in the first 4 bytes
  int bits = 0;                    // of the family's width
  bool operator==(const SourcePrefix&) const = default;

  // "10.0.0.0/8", "fd00::/64", with the host bits cleared.
  std::string text() const {
    char buf[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(family, addr.data(), buf, sizeof(buf));
    return absl::StrCat(buf, "/", bits);
  }
  // The LPM key's 16 bytes and prefix length (IPv4 as v4-mapped IPv6).
  std::array<uint8_t, 16> mapped() const {
    if (family == AF_INET6) return addr;
    std::array<uint8_t, 16> out{};
    out[10] = out[11] = 0xff;
    for (int i = 0; i < 4; ++i) out[12 + i] = addr[i];
    return out;
  }
  uint32_t mappedBits() const {
    return static_cast<uint32_t>(family == AF_INET ? bits + 96 : bits);
  }
};

// "ADDR" (a single host) or "ADDR/BITS", IPv4 or IPv6. INVALID_ARGUMENT
// names what is wrong.
inline absl::StatusOr<SourcePrefix> parseSourcePrefix(std::string_view text) {
  SourcePrefix p;
  const size_t slash = text.find('/');
  const std::string address(text.substr(0, slash));
  if (::inet_pton(AF_INET, address.c_str(), p.addr.data()) == 1) {
    p.family = AF_INET;
  } else if (::inet_pton(AF_INET6, address.c_str(), p.addr.data()) == 1) {
    p.family = AF_INET6;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\" is not an IPv4 or IPv6 address (CIDR: ADDR[/BITS])"));
  }
  const int width = p.family == AF_INET ? 32 : 128;
  p.bits = width;
  if (slash != std::string_view::npos) {
    const std::string_view bits = text.substr(slash + 1);
    auto [end, ec] = std::from_chars(bits.data(), bits.data() + bits.size(), p.bits);
    if (bits.empty() || ec != std::errc() || end != bits.data() + bits.size() || p.bits < 0 ||
        p.bits > width) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", std::string(bits), "\" is not a prefix length (0-", width, ")"));
    }
  }
  for (int i = 0; i < width / 8; ++i) {
    const int keep = p.bits - i * 8;
    if (keep >= 8) continue;
    p.addr[i] &= keep <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - keep));
  }
  return p;
}

}  // namespace siphon::agent::steal
