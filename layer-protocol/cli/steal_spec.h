// The pure parts of `siphon steal`: pairing --port with --to, parsing
// HOST:PORT, and the lines it prints (text for people on stderr, one JSON
// object per line on stdout with --json). No I/O, so they are unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::cli {

// Where the connections to one stolen port of the target go.
struct StealRoute {
  uint16_t port = 0;     // the target's port, 1..65535
  std::string host;      // the local server: an IP or a name, without brackets
  uint16_t to_port = 0;  // 1..65535

  // "127.0.0.1:9000", "[::1]:9000", "localhost:9000".
  std::string to() const;
};

// A port, 1..65535, in plain decimal digits (no sign, no blanks).
bool parsePort(std::string_view s, uint16_t* out);

// "10.0.0.1:80", "[::1]:80", "db:5432": brackets around hosts with a ':'.
std::string hostPort(std::string_view host, uint32_t port);

// A --to value: "HOST:PORT", IPv6 as "[ADDR]:PORT", port 1..65535.
// INVALID_ARGUMENT naming the value and what is wrong.
absl::StatusOr<StealRoute> parseStealTarget(std::string_view text);

// The i-th --to goes with the i-th --port. INVALID_ARGUMENT (the message is
// meant for the user as it is) when no port is given, the counts differ, a
// port is not 1..65535, a --to is malformed, or a port is given twice (one
// port has one destination; the agent also allows one subscription per port
// and session).
absl::StatusOr<std::vector<StealRoute>> pairStealRoutes(const std::vector<std::string>& ports,
                                                        const std::vector<std::string>& tos);

// One stolen connection, as the lines about it show it.
struct StolenEvent {
  std::string source;       // the remote client, "10.1.2.3:40000"
  std::string destination;  // the address it connected to, "10.0.0.5:80" (may be empty)
  uint32_t port = 0;        // the stolen port
  std::string to;           // the local server, "127.0.0.1:9000"
  uint64_t in = 0;          // bytes from the remote client
  uint64_t out = 0;         // bytes to the remote client
  std::string error;        // why it ended abnormally, or why it never opened; empty when clean
};

struct StealTotals {
  uint64_t connections = 0;  // bridged to the local server
  uint64_t failed = 0;       // the local server could not be reached
  uint64_t in = 0;
  uint64_t out = 0;
};

// Each returns one line with its '\n': the text form when `json` is false,
// else a one-line JSON object with an "event" member.
//
//   stealing port 80 -> 127.0.0.1:9000 (backend sk_lookup)
//   {"event":"stealing","port":80,"to":"127.0.0.1:9000","backend":"sk_lookup","subscription_id":7}
std::string stealingLine(const StealRoute& route, std::string_view backend,
                         uint64_t subscription_id, bool json);
//   open 10.1.2.3:40000 -> :80 => 127.0.0.1:9000
std::string openLine(const StolenEvent& e, bool json);
//   failed 10.1.2.3:40000 -> :80 => 127.0.0.1:9000: connect 127.0.0.1:9000: Connection refused
std::string failedLine(const StolenEvent& e, bool json);
//   close 10.1.2.3:40000 -> :80 in=123 out=456
//   close 10.1.2.3:40000 -> :80 in=5 out=0 (reset by the agent: CANCELLED: ...)
std::string closeLine(const StolenEvent& e, bool json);
//   stopping: waiting for 2 open connections (signal again to end them)
std::string stoppingLine(uint64_t open_connections, bool json);
// The agent said it is draining (SIGTERM): the ports are the application's
// again, connections in flight go on until the deadline (`seconds_left`).
std::string drainingLine(const std::string& reason, int64_t seconds_left, uint64_t open_connections,
                         bool json);
// The client moved to another agent (failover).
struct AgentMove {
  std::string from, to, reason;
  bool draining = false;
  uint64_t connections = 0;  // draining: left to finish on `from`; else reset
  uint64_t ports_back = 0;   // stolen again on `to`
  uint64_t ports_lost = 0;   // refused there
};
//   agent A draining; moved to agent B; 3 connections finishing on A
//   agent A lost (why); moved to agent B; 3 connections reset
std::string movedLine(const AgentMove& m, bool json);
// A port that could not be stolen again on the new agent.
std::string restealFailedLine(uint16_t port, const std::string& agent, const std::string& error,
                              bool json);
// The transport to the agent was cut (`cut`: why) and the session resumed
// on a new connection; open connections went on.
std::string resumedLine(const std::string& agent, const std::string& cut, bool json);
//   summary: 3 connections, in=123 bytes, out=456 bytes
std::string summaryLine(const StealTotals& t, bool json);

}  // namespace siphon::cli
