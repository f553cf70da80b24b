// What a DNS response says about one query: the canonical name (CNAMEs
// followed from the question), the A/AAAA addresses or PTR names of that
// name, and the smallest TTL among the records used. Pure: bytes in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent::dns {

// The Internet class, and the RR types this parser cares about (RFC 1035,
// RFC 3596).
inline constexpr int kClassIn = 1;
inline constexpr int kTypeA = 1;
inline constexpr int kTypeCname = 5;
inline constexpr int kTypePtr = 12;
inline constexpr int kTypeAaaa = 28;

struct DnsAnswer {
  std::string canonical;               // the question's name when no CNAME applies
  std::vector<std::string> addresses;  // kTypeA / kTypeAaaa queries, answer order
  std::vector<std::string> names;      // kTypePtr queries, answer order
  std::optional<uint32_t> ttl;         // of the CNAME chain and the records above
};

// Parses the answer section of `buf` for a query of `qtype`. Only records
// of class IN owned by the question's name or a name its CNAME chain leads
// to count, as a stub resolver does; records of other names are ignored. An
// answer with no such record is not an error: `addresses`/`names` are empty
// (NODATA). InvalidArgument for a malformed message.
absl::StatusOr<DnsAnswer> parseDnsAnswer(const unsigned char* buf, size_t len, int qtype);

}  // namespace siphon::agent::dns
