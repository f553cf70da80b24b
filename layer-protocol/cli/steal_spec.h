// The pure parts of `siphon steal`: pairing --port with --to, parsing
// HOST:PORT and the --filter-* flags, and the lines it prints (text for
// people on stderr, one JSON object per line on stdout with --json). No I/O,
// so they are unit-tested.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/format.h"
#include "siphon/client/subscriptions.h"
#include "siphon/v1/services.pb.h"

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

// The --filter-* flags of one `siphon steal`, as given. One filter serves
// every --port of the command.
struct FilterFlags {
  std::vector<std::string> headers;   // --filter-header 'Name: regex', repeatable
  std::optional<std::string> path;    // --filter-path REGEX
  std::optional<std::string> method;  // --filter-method METHOD
  bool any = false;                   // --filter-any: any-of instead of all-of
};

// An HTTP token (RFC 9110 5.6.2): what a header name or a method is made of.
bool isHttpToken(std::string_view s);

// The filter each StealSubscribe carries; nullopt without filter flags (the
// whole port, exactly as before filters existed). A header flag is split at
// its first ':'; blanks around the name and the regex are trimmed; an empty
// regex matches any value (the header is present). INVALID_ARGUMENT, meant
// for the user as it is, for: no ':', a name or a method that is not an
// HTTP token, an empty --filter-path, --filter-any alone. The regexes are
// the agent's to check (RE2): a bad one comes back from the subscribe.
absl::StatusOr<std::optional<v1::HttpFilter>> parseHttpFilter(const FilterFlags& flags);

// The same, for the typed API (siphon/client/subscriptions.h): what
// Subscriptions::steal() takes.
absl::StatusOr<std::optional<client::HttpFilter>> parseStealFilter(const FilterFlags& flags);

// What a filter takes, for people: "header x-user: alice and path ^/api",
// "header x-user: alice or method POST".
std::string filterText(const v1::HttpFilter& filter);
std::string filterText(const client::HttpFilter& filter);

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

// One stolen HTTP request (StreamOpen{stolen_request}), as its line shows it.
struct RequestEvent {
  std::string source;       // the HTTP client, "10.1.2.3:40000"
  std::string destination;  // the address it connected to (may be empty)
  uint32_t port = 0;        // the stolen port
  std::string to;           // the local server
  std::string method;       // "GET"
  std::string path;         // the request target, "/api/x?y=1"
  int status = 0;           // the final status the HTTP client got; 0: none (reset)
  uint64_t in = 0;          // bytes from the agent (the request, raw bytes after a 101)
  uint64_t out = 0;         // bytes to the agent (the response...)
  std::string error;        // why it failed, or why we answered for the local server
};

// FilterOverlap: requests this subscription's filter matched went to an
// earlier subscription of the port.
struct OverlapEvent {
  uint32_t port = 0;
  uint64_t taken_by = 0;  // the agent's id of the subscription that got them
  std::string client;     // its session's client name (may be empty)
  uint64_t requests = 0;
  std::string method;  // the first of them
  std::string path;
};

struct StealTotals {
  uint64_t connections = 0;  // bridged to the local server
  uint64_t failed = 0;       // the local server could not be reached
  uint64_t in = 0;
  uint64_t out = 0;
  bool filtered = false;         // an HTTP-filtered steal: the summary counts requests
  uint64_t requests = 0;         // stolen requests answered, by the local server or by us
  uint64_t requests_failed = 0;  // of those, the ones the local server did not answer whole
};

// Each returns one line with its '\n': the text form when `json` is false,
// else a one-line JSON object with an "event" member.
//
//   stealing port 80 -> 127.0.0.1:9000 (backend sk_lookup)
//   {"event":"stealing","port":80,"to":"127.0.0.1:9000","backend":"sk_lookup","subscription_id":7}
//   stealing port 80 -> 127.0.0.1:9000 (backend sk_lookup, filter header x-user: alice)
// (with a filter, JSON has "filter": filterText()).
std::string stealingLine(const StealRoute& route, std::string_view backend,
                         uint64_t subscription_id, bool json,
                         const v1::HttpFilter* filter = nullptr);
std::string stealingLine(const StealRoute& route, std::string_view backend,
                         uint64_t subscription_id, bool json, const client::HttpFilter* filter);
//   open 10.1.2.3:40000 -> :80 => 127.0.0.1:9000
std::string openLine(const StolenEvent& e, bool json);
//   failed 10.1.2.3:40000 -> :80 => 127.0.0.1:9000: connect 127.0.0.1:9000: Connection refused
std::string failedLine(const StolenEvent& e, bool json);
//   close 10.1.2.3:40000 -> :80 in=123 out=456
//   close 10.1.2.3:40000 -> :80 in=5 out=0 (reset by the agent: CANCELLED: ...)
std::string closeLine(const StolenEvent& e, bool json);
// One per stolen request, when it ends:
//   request 10.1.2.3:40000 GET /api/x -> 127.0.0.1:9000: 200 in=123 out=456
//   request 10.1.2.3:40000 GET /x -> 127.0.0.1:9000: 502 in=80 out=160 (connect 127.0.0.1:9000:
//   Connection refused) request 10.1.2.3:40000 GET /x -> 127.0.0.1:9000: reset in=80 out=3000 (the
//   local server ...)
std::string requestLine(const RequestEvent& e, bool json);
//   overlap: 3 requests to port 80 matching this filter went to subscription 7 of client "bob"
//   (first: GET /x)
std::string overlapLine(const OverlapEvent& e, bool json);
//   stopping: waiting for 2 open connections (signal again to end them)
//   stopping: waiting for 1 open connection and 2 requests (signal again to end them)
std::string stoppingLine(uint64_t open_connections, bool json, uint64_t open_requests = 0);
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

// The target's container restarted and the agent adopted its new process
// (the same pod): what was stolen or mirrored stays so.
//   target restarted: pid 4242 -> 4301 (container abc), down 812 ms; the
//   steal goes on
struct TargetRestart {
  int32_t previous_pid = 0;
  int32_t pid = 0;
  std::string container_id;
  int64_t down_ms = 0;
  uint32_t restarts = 0;
};
std::string targetRestartedLine(const TargetRestart& r, std::string_view what_goes_on, bool json);
// A port that could not be stolen again on the new agent.
std::string restealFailedLine(uint16_t port, const std::string& agent, const std::string& error,
                              bool json);
// The transport to the agent was cut (`cut`: why) and the session resumed
// on a new connection; open connections went on.
std::string resumedLine(const std::string& agent, const std::string& cut, bool json);
//   summary: 3 connections, in=123 bytes, out=456 bytes
//   summary: 0 connections, 5 requests (1 failed), in=123 bytes, out=456 bytes   (filtered)
std::string summaryLine(const StealTotals& t, bool json);

}  // namespace siphon::cli
