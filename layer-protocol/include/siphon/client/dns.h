// Names as the target resolves them: its resolv.conf and hosts file, its
// network namespace (the agent's c-ares). A lookup that the DNS answered
// (even "no such name") is an OK DnsAnswer with its result; a failed call
// (no DNS on this agent, the session lost) is an error status (errors.h).
//
// Threads: as the Target's (target.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/client/target.h"

namespace siphon::client {

enum class AddressFamily { kAny, kIpv4, kIpv6 };

enum class DnsResult { kOk, kNxDomain, kNoData, kTimeout, kServFail, kRefused, kUnknown };

struct DnsAnswer {
  DnsResult result = DnsResult::kUnknown;
  std::vector<std::string> addresses;  // lookup: textual IPs
  std::vector<std::string> names;      // reverse; lookup: the canonical name first
  uint32_t ttl = 0;
  bool ok() const { return result == DnsResult::kOk; }
};

// "OK", "NXDOMAIN", ...
std::string dnsResultName(DnsResult result);

class Dns {
 public:
  explicit Dns(const Target& target);
  net::awaitable<absl::StatusOr<DnsAnswer>> lookup(std::string name,
                                                   AddressFamily family = AddressFamily::kAny);
  // The names of an IPv4 or IPv6 address (the hosts file first, then PTR).
  net::awaitable<absl::StatusOr<DnsAnswer>> reverse(std::string address);

 private:
  std::shared_ptr<TargetCore> core_;
};

}  // namespace siphon::client
