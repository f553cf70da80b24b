// The target's /etc/resolv.conf, read the way glibc's resolver reads it
// (resolv.conf(5), resolv/res_init.c), reduced to what the agent's c-ares
// channel needs. Pure: text in, settings out; unknown or malformed lines are
// skipped as glibc skips them, never an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace siphon::agent::dns {

struct Nameserver {
  int family = 0;       // AF_INET or AF_INET6
  std::string address;  // normalised text (inet_ntop of the parsed address)
  // resolv.conf has no port syntax, so the parser always says 53; tests and
  // other sources of configuration may say otherwise.
  uint16_t port = 53;

  bool operator==(const Nameserver&) const = default;
};

struct ResolvConf {
  // glibc uses the first three (MAXNS); none at all means 127.0.0.1.
  static constexpr size_t kMaxNameservers = 3;
  static constexpr int kMaxNdots = 15;     // RES_MAXNDOTS
  static constexpr int kMaxTimeoutS = 30;  // RES_MAXRETRANS
  static constexpr int kMaxAttempts = 5;   // RES_MAXRETRY

  std::vector<Nameserver> nameservers;
  // From the last "search" or "domain" line (each replaces the other).
  std::vector<std::string> search;
  int ndots = 1;
  // Per try and server. options timeout:N is in seconds; glibc never waits
  // less than one second, so the parser keeps 1000..30000.
  int timeout_ms = 5000;
  int attempts = 2;
  bool rotate = false;
  bool use_vc = false;  // options use-vc (or tcp): queries over TCP
  bool edns0 = false;

  bool operator==(const ResolvConf&) const = default;
};

// Parses the content of a resolv.conf. Keywords start a line and are
// followed by a blank; lines starting with '#' or ';' are comments, and
// (like c-ares, unlike glibc) a '#' or ';' later in a line ends it.
// Nameservers are IPv4 or IPv6 literals; anything else (a host name, an
// address with a port or a %scope) is skipped. Numeric options are clamped
// to glibc's limits.
ResolvConf parseResolvConf(std::string_view text);

// The configuration of a missing or empty resolv.conf: 127.0.0.1, no
// search list, ndots 1, timeout 5 s, 2 attempts.
ResolvConf defaultResolvConf();

}  // namespace siphon::agent::dns
