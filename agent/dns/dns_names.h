// Names and addresses of DNS requests: input checks, the search list as the
// target's resolver walks it, reverse (PTR) names, IP literals. Pure.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace siphon::agent::dns {

// Which addresses a lookup wants.
enum class Family { kAny, kInet, kInet6 };

// True when an address of `af` (AF_INET, AF_INET6) belongs in the answer.
bool familyAccepts(Family family, int af);

// An IPv4 or IPv6 literal.
struct IpAddress {
  int family = 0;     // AF_INET or AF_INET6
  std::string bytes;  // 4 or 16 bytes, network order
  std::string text;   // normalised (inet_ntop)

  bool operator==(const IpAddress&) const = default;
};

// Parses a literal ("10.0.0.1", "fd00::1"); nullopt for anything else,
// including "fe80::1%eth0" and the short IPv4 forms inet_aton takes.
std::optional<IpAddress> parseIp(std::string_view s);

// The longest name DNS carries, without the trailing dot (RFC 1035: 255
// octets on the wire).
inline constexpr size_t kMaxNameLength = 253;
inline constexpr size_t kMaxLabelLength = 63;

// InvalidArgument (with the reason) unless `name` is something a resolver
// can send: not empty, at most 253 bytes without one trailing dot, no empty
// label ("a..b", ".a"), labels of at most 63 bytes, no blanks or control
// characters.
absl::Status validateName(std::string_view name);

// The names the target's resolver queries for `name`, in order (glibc's
// res_nsearch):
//  - a trailing dot: the name as it is, only;
//  - at least `ndots` dots: as it is first, then each search domain;
//  - fewer: each search domain first, then as it is.
// Appended names do not duplicate a candidate already in the list.
std::vector<std::string> searchCandidates(std::string_view name,
                                          const std::vector<std::string>& search, int ndots);

// "13.12.11.10.in-addr.arpa" for 10.11.12.13; the nibble form under
// ip6.arpa for IPv6.
std::string reverseName(const IpAddress& address);

// ASCII case-insensitive equality, as DNS compares names.
bool sameName(std::string_view a, std::string_view b);

}  // namespace siphon::agent::dns
