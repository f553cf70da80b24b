#include "exec/policy.h"

#include <arpa/inet.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace siphon::exec {
namespace {

// Parses a numeric IPv4 or IPv6 address into 16 bytes (IPv4 in the first 4).
bool parseIp(const std::string& s, bool* v6, std::array<uint8_t, 16>* out) {
  out->fill(0);
  in_addr a4{};
  if (::inet_pton(AF_INET, s.c_str(), &a4) == 1) {
    *v6 = false;
    std::memcpy(out->data(), &a4, 4);
    return true;
  }
  in6_addr a6{};
  if (::inet_pton(AF_INET6, s.c_str(), &a6) == 1) {
    // An IPv4-mapped address is the IPv4 one (what a v6 socket may report).
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      *v6 = false;
      std::memcpy(out->data(), reinterpret_cast<const uint8_t*>(&a6) + 12, 4);
      return true;
    }
    *v6 = true;
    std::memcpy(out->data(), &a6, 16);
    return true;
  }
  return false;
}

bool prefixMatches(const std::array<uint8_t, 16>& addr, const AddressRule& r) {
  int bits = r.bits;
  for (size_t i = 0; bits > 0; ++i, bits -= 8) {
    const uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
    if ((addr[i] & mask) != (r.prefix[i] & mask)) return false;
  }
  return true;
}

bool globMatches(const std::vector<std::string>& globs, const std::string& name) {
  return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) {
    return ::fnmatch(g.c_str(), name.c_str(), 0) == 0;
  });
}

}  // namespace

absl::StatusOr<AddressRule> parseAddressRule(std::string_view text_in, Via via) {
  const std::string text(text_in);
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad address rule '", text,
                                                   "': ", std::string(why),
                                                   " (want CIDR[:PORT], [IPv6-CIDR]:PORT)"));
  };
  std::string cidr = text;
  std::string port;
  if (!cidr.empty() && cidr.front() == '[') {
    const size_t close = cidr.find(']');
    if (close == std::string::npos) return bad("unbalanced brackets");
    const std::string rest = cidr.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("text after ']' must be :PORT");
      port = rest.substr(1);
      if (port.empty()) return bad("empty port");
    }
    cidr = cidr.substr(1, close - 1);
  } else if (std::count(cidr.begin(), cidr.end(), ':') == 1) {
    // IPv4 with a port; an IPv6 CIDR has several ':' (and needs brackets
    // for a port).
    const size_t colon = cidr.find(':');
    port = cidr.substr(colon + 1);
    cidr = cidr.substr(0, colon);
    if (port.empty()) return bad("empty port");
  }
  AddressRule r;
  r.via = via;
  r.text = text;
  std::string addr = cidr;
  int bits = -1;
  if (const size_t slash = cidr.find('/'); slash != std::string::npos) {
    addr = cidr.substr(0, slash);
    if (!absl::SimpleAtoi(cidr.substr(slash + 1), &bits) || bits < 0) {
      return bad("the prefix length is not a number");
    }
  }
  if (!parseIp(addr, &r.v6, &r.prefix)) return bad("not a numeric IPv4 or IPv6 address");
  const int max = r.v6 ? 128 : 32;
  if (bits > max) return bad(absl::StrCat("the prefix length is above ", max));
  r.bits = bits < 0 ? max : bits;
  if (!port.empty()) {
    uint32_t p = 0;
    if (port.find_first_not_of("0123456789") != std::string::npos || !absl::SimpleAtoi(port, &p) ||
        p == 0 || p > 65535) {
      return bad("the port must be a number from 1 to 65535");
    }
    r.port = static_cast<uint16_t>(p);
  }
  return r;
}

Via Routes::route(std::string_view address, uint16_t port) const {
  std::array<uint8_t, 16> addr{};
  bool v6 = false;
  if (!parseIp(std::string(address), &v6, &addr)) return Via::kTarget;
  const AddressRule* best = nullptr;
  auto better = [](const AddressRule& a, const AddressRule* b) {
    if (b == nullptr) return true;
    if (a.bits != b->bits) return a.bits > b->bits;
    if ((a.port != 0) != (b->port != 0)) return a.port != 0;
    return a.via == Via::kLocal && b->via != Via::kLocal;
  };
  for (const AddressRule& r : rules_) {
    if (r.v6 != v6 || (r.port != 0 && r.port != port) || !prefixMatches(addr, r)) continue;
    if (better(r, best)) best = &r;
  }
  if (best != nullptr) return best->via;
  const bool loopback =
      v6 ? (std::all_of(addr.begin(), addr.end() - 1, [](uint8_t b) { return b == 0; }) &&
            addr[15] == 1)
         : addr[0] == 127;
  if (loopback && !remote_loopback_) return Via::kLocal;
  return Via::kTarget;
}

bool choosesCode(std::string_view name) {
  const std::string n(name);
  return std::any_of(std::begin(kCodeChoosing), std::end(kCodeChoosing),
                     [&](std::string_view glob) {
                       return ::fnmatch(std::string(glob).c_str(), n.c_str(), 0) == 0;
                     });
}

OverlaidEnvironment overlayEnvironment(
    const std::vector<std::string>& local,
    const std::vector<std::pair<std::string, std::string>>& target, const EnvOverlay& overlay) {
  std::map<std::string, std::string> env;
  for (const std::string& e : local) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  std::set<std::string> set_names;
  for (const std::string& e : overlay.set) {
    const size_t eq = e.find('=');
    if (eq != std::string::npos && eq != 0) set_names.insert(e.substr(0, eq));
  }
  std::set<std::string> left_out;
  for (const auto& [name, value] : target) {
    if (std::find(kKeepLocal.begin(), kKeepLocal.end(), name) != kKeepLocal.end()) continue;
    if (globMatches(overlay.exclude, name)) continue;
    if (!overlay.include.empty() && !globMatches(overlay.include, name)) continue;
    if (choosesCode(name) && !globMatches(overlay.allow, name)) {
      // Told only when it changes what the program gets.
      auto here = env.find(name);
      if (set_names.count(name) == 0 && (here == env.end() || here->second != value)) {
        left_out.insert(name);
      }
      continue;
    }
    env[name] = value;
  }
  for (const std::string& e : overlay.set) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env[e.substr(0, eq)] = e.substr(eq + 1);
  }
  OverlaidEnvironment out;
  out.env.reserve(env.size());
  for (const auto& [name, value] : env) out.env.push_back(absl::StrCat(name, "=", value));
  out.left_out.assign(left_out.begin(), left_out.end());
  return out;
}

absl::Status checkEnvAssignment(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad --env '", std::string(text), "': want NAME=VALUE (NAME not empty)"));
  }
  return absl::OkStatus();
}

int exitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

ShownResolvConf standInNameservers(std::string_view resolv_conf) {
  ShownResolvConf out;
  int next4 = 53, next6 = 0x53;
  bool any_nameserver = false;
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!resolv_conf.empty()) {
    const size_t eol = resolv_conf.find('\n');
    const std::string_view whole = resolv_conf.substr(0, eol);
    const bool newline = eol != std::string_view::npos;
    resolv_conf.remove_prefix(newline ? eol + 1 : resolv_conf.size());
    std::string_view line = whole;
    while (!line.empty() && blank(line.front())) line.remove_prefix(1);
    constexpr std::string_view kKey = "nameserver";
    std::string address;
    if (line.substr(0, kKey.size()) == kKey && line.size() > kKey.size() &&
        blank(line[kKey.size()])) {
      line.remove_prefix(kKey.size());
      while (!line.empty() && blank(line.front())) line.remove_prefix(1);
      size_t end = 0;
      while (end < line.size() && !blank(line[end]) && line[end] != '#' && line[end] != ';') {
        ++end;
      }
      address.assign(line.substr(0, end));
      if (!address.empty()) any_nameserver = true;
    }
    unsigned char bytes[16];
    std::string stand_in;
    if (!address.empty() && ::inet_pton(AF_INET, address.c_str(), bytes) == 1 && bytes[0] == 127 &&
        next4 < 255) {
      stand_in = absl::StrCat("198.18.0.", next4++);
    } else if (!address.empty() && ::inet_pton(AF_INET6, address.c_str(), bytes) == 1 &&
               IN6_IS_ADDR_LOOPBACK(reinterpret_cast<in6_addr*>(bytes)) && next6 < 0xffff) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "%x", next6++);
      stand_in = absl::StrCat("fd5e:5e00::", hex);
    }
    if (stand_in.empty()) {
      absl::StrAppend(&out.text, std::string(whole), newline ? "\n" : "");
      continue;
    }
    out.stand_ins[stand_in] = address;
    absl::StrAppend(&out.text, "nameserver ", stand_in, "  # the target's ", address, "\n");
  }
  if (!any_nameserver) {
    // No nameserver line (or no file): the resolver asks 127.0.0.1, the
    // target's loopback, not the program's.
    if (!out.text.empty() && out.text.back() != '\n') out.text.push_back('\n');
    out.stand_ins["198.18.0.53"] = "127.0.0.1";
    absl::StrAppend(&out.text,
                    "nameserver 198.18.0.53  # the target's 127.0.0.1 (no nameserver line: the "
                    "resolver's default)\n");
  }
  return out;
}

bool absentToTheResolver(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
    case EACCES:
    case EPERM:
    case EISDIR:
    case ELOOP:
      return true;
    default:
      return false;
  }
}

}  // namespace siphon::exec
