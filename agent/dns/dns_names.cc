#include "agent/dns/dns_names.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::dns {

bool familyAccepts(Family family, int af) {
  switch (family) {
    case Family::kAny:
      return af == AF_INET || af == AF_INET6;
    case Family::kInet:
      return af == AF_INET;
    case Family::kInet6:
      return af == AF_INET6;
  }
  return false;
}

std::optional<IpAddress> parseIp(std::string_view s) {
  if (s.empty() || s.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  std::string text(s);
  unsigned char buf[sizeof(in6_addr)];
  char normal[INET6_ADDRSTRLEN];
  for (int family : {AF_INET, AF_INET6}) {
    if (inet_pton(family, text.c_str(), buf) == 1 &&
        inet_ntop(family, buf, normal, sizeof(normal)) != nullptr) {
      size_t n = family == AF_INET ? sizeof(in_addr) : sizeof(in6_addr);
      return IpAddress{family, std::string(reinterpret_cast<char*>(buf), n), normal};
    }
  }
  return std::nullopt;
}

absl::Status validateName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("empty name");
  std::string_view bare = name;
  if (bare.back() == '.') bare.remove_suffix(1);
  if (bare.empty()) return absl::InvalidArgumentError("empty name");
  if (bare.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("name too long: ", bare.size(), " bytes (at most ", kMaxNameLength, ")"));
  }
  for (unsigned char c : bare) {
    if (c <= ' ' || c == 0x7f) {
      return absl::InvalidArgumentError("name contains a blank or a control character");
    }
  }
  size_t start = 0;
  while (start <= bare.size()) {
    size_t dot = bare.find('.', start);
    if (dot == std::string_view::npos) dot = bare.size();
    size_t len = dot - start;
    if (len == 0) return absl::InvalidArgumentError("name has an empty label");
    if (len > kMaxLabelLength) {
      return absl::InvalidArgumentError(
          absl::StrCat("name has a label of ", len, " bytes (at most ", kMaxLabelLength, ")"));
    }
    start = dot + 1;
  }
  return absl::OkStatus();
}

std::vector<std::string> searchCandidates(std::string_view name,
                                          const std::vector<std::string>& search, int ndots) {
  std::vector<std::string> out;
  auto add = [&out](std::string n) {
    for (const auto& have : out) {
      if (sameName(have, n)) return;
    }
    out.push_back(std::move(n));
  };
  if (!name.empty() && name.back() == '.') {
    add(std::string(name));
    return out;
  }
  const int dots = static_cast<int>(std::count(name.begin(), name.end(), '.'));
  const bool as_is_first = dots >= ndots;
  if (as_is_first) add(std::string(name));
  for (const auto& domain : search) {
    std::string_view d = domain;
    while (!d.empty() && d.front() == '.') d.remove_prefix(1);
    if (d.empty()) continue;
    std::string candidate = absl::StrCat(asv(name), ".", asv(d));
    // A search domain that makes the name too long cannot be queried;
    // glibc skips it the same way.
    if (validateName(candidate).ok()) add(std::move(candidate));
  }
  if (!as_is_first) add(std::string(name));
  return out;
}

std::string reverseName(const IpAddress& address) {
  const auto* b = reinterpret_cast<const unsigned char*>(address.bytes.data());
  std::string out;
  if (address.family == AF_INET) {
    for (int i = 3; i >= 0; --i) absl::StrAppend(&out, static_cast<int>(b[i]), ".");
    out += "in-addr.arpa";
    return out;
  }
  constexpr char kHex[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i) {
    out.push_back(kHex[b[i] & 0xf]);
    out.push_back('.');
    out.push_back(kHex[b[i] >> 4]);
    out.push_back('.');
  }
  out += "ip6.arpa";
  return out;
}

bool sameName(std::string_view a, std::string_view b) {
  return absl::EqualsIgnoreCase(asv(a), asv(b));
}

}  // namespace siphon::agent::dns
