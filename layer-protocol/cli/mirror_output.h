// The pure parts of `siphon mirror`: its flags, the records of a mirrored
// stream, the markers between the bytes it writes to stdout, and the lines
// it prints on stderr (text, or one JSON object per line with --json). No
// I/O, so they are unit-tested.
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/steal_spec.h"
#include "siphon/client/subscriptions.h"
#include "siphon/v1/streams.pb.h"

namespace siphon::cli {

// What the flags ask for, checked.
struct MirrorSpec {
  uint16_t port = 0;
  // Replay each connection's client->server bytes to this server; unset:
  // write the bytes to stdout.
  std::optional<StealRoute> to;  // StealRoute::port unused
  bool both = false;             // stdout only: the server's bytes too
};

// --port PORT [--to HOST:PORT | --stdout] [--both]. INVALID_ARGUMENT, with
// a message meant for the user, for a port outside 1..65535, a malformed
// --to, --to with --stdout, or --both with --to (a replay sends requests
// only: the server it replays to makes its own responses).
absl::StatusOr<MirrorSpec> parseMirrorSpec(std::string_view port, const std::string& to,
                                           bool to_stdout, bool both);

// One Data frame of a mirrored stream: byte 0 is the v1::Direction the
// bytes travelled, the rest the bytes; the direction byte alone says that
// direction's sender finished (its FIN).
struct MirrorRecord {
  v1::Direction direction = v1::DIRECTION_UNSPECIFIED;
  std::string_view bytes;  // into the payload
  bool fin = false;
};
// INVALID_ARGUMENT for an empty payload or an unknown direction.
absl::StatusOr<MirrorRecord> parseMirrorRecord(std::string_view payload);
// The record points into the payload: a temporary string would be freed
// before the record is read.
template <typename T>
requires std::same_as<std::remove_cvref_t<T>, std::string> &&(!std::is_lvalue_reference_v<T>)
    absl::StatusOr<MirrorRecord> parseMirrorRecord(T&& payload) = delete;

// "client->server", "server->client".
std::string_view directionText(v1::Direction d);

// The typed API's direction (siphon/client/subscriptions.h) as the wire's;
// the functions below that take a v1::Direction also take it.
v1::Direction wireDirection(client::Direction d);

// One mirrored connection, as the lines and markers name it.
struct MirrorConnection {
  uint64_t id = 0;     // this CLI's number, from 1, in the order they came
  std::string client;  // "10.0.0.2:51234" ("?" when the agent gave none)
  std::string server;  // "10.0.0.1:80"
  bool mid_stream = false;
};
MirrorConnection mirrorConnection(uint64_t id, const v1::MirroredConnection& m);
MirrorConnection mirrorConnection(uint64_t id, const client::MirroredConnection& m);

// What happened to one connection's bytes, per direction (index 0:
// client->server, 1: server->client).
struct MirrorCounts {
  uint64_t bytes[2] = {0, 0};        // delivered by the agent
  uint64_t gaps[2] = {0, 0};         // lost before they reached us (StreamGap)
  uint64_t not_written[2] = {0, 0};  // stdout too slow
  uint64_t replayed = 0;             // --to: client->server bytes the server took
  uint64_t not_replayed = 0;         // --to: client->server bytes it never got
};
inline int directionIndex(v1::Direction d) { return d == v1::SERVER_TO_CLIENT ? 1 : 0; }
inline int directionIndex(client::Direction d) {
  return d == client::Direction::kServerToClient ? 1 : 0;
}

struct MirrorTotals {
  uint64_t connections = 0;
  MirrorCounts counts;  // summed over the connections
};
void addCounts(MirrorCounts& to, const MirrorCounts& c);

// How a mirrored stream ended, from readEvent()'s result: OK (its
// half-close) is "closed"; a reset is told by its code: ERRNO (the
// application's connection was reset) "reset by peer", TIMEOUT "idle too
// long", RESOURCE_EXHAUSTED "dropped: the agent's connection table is full",
// CANCELLED and AGENT_DRAINING "mirror stopped", AGENT_LOST "the session
// with the agent is lost", anything else "reset by the agent: CODE: ...".
std::string closeReason(const absl::Status& end);

// Each returns one line with its '\n': text for people, or with `json` a
// one-line JSON object with an "event" member.
//
//   mirror: port 80 (backend tc, subscription 1): client->server bytes replayed to 127.0.0.1:9000
//   mirror: port 80 (backend tc, subscription 1): both directions to stdout
std::string mirroringLine(const MirrorSpec& spec, std::string_view backend,
                          uint64_t subscription_id, bool json);
//   mirror: connection 3 10.0.0.2:51234 -> 10.0.0.1:80 opened (joined mid-stream: earlier bytes
//   unknown)
std::string openedLine(const MirrorConnection& c, bool json);
//   mirror: connection 3: 12345 bytes client->server lost (gap)
std::string gapLine(const MirrorConnection& c, v1::Direction d, uint64_t bytes, bool json);
inline std::string gapLine(const MirrorConnection& c, client::Direction d, uint64_t bytes,
                           bool json) {
  return gapLine(c, wireDirection(d), bytes, json);
}
//   mirror: connection 3: replay to 127.0.0.1:9000 failed (connect: Connection refused); the rest
//   of its client->server bytes are dropped
std::string replayFailedLine(const MirrorConnection& c, const std::string& to,
                             const std::string& why, bool json);
//   mirror: connection 3: 4096 bytes server->client not written: stdout is too slow
std::string notWrittenLine(const MirrorConnection& c, v1::Direction d, uint64_t bytes, bool json);
inline std::string notWrittenLine(const MirrorConnection& c, client::Direction d, uint64_t bytes,
                                  bool json) {
  return notWrittenLine(c, wireDirection(d), bytes, json);
}
//   mirror: connection 3 10.0.0.2:51234 -> 10.0.0.1:80 closed (reset by peer): client->server 120
//   bytes, server->client 4000 bytes
// plus, when not 0: gaps, bytes not written, replayed / not replayed (with
// `replay`).
std::string closedLine(const MirrorConnection& c, const MirrorCounts& counts,
                       const std::string& reason, bool replay, bool json);
//   mirror: 4096 bytes still queued for stdout at the exit are not written
std::string stdoutLeftLine(uint64_t bytes, bool json);
//   mirror: port 80 on agent B failed: CODE: ... (the port is no longer mirrored)
std::string remirrorFailedLine(uint16_t port, const std::string& agent, const std::string& error,
                               bool json);
//   mirror: agent A draining (reason): mirroring ends
std::string mirrorDrainingLine(const std::string& reason, bool json);
//   mirror: summary: 3 connections, client->server 1234 bytes (gaps 0 bytes), server->client 0
//   bytes (gaps 0 bytes)
// plus bytes not written / not replayed when not 0.
std::string mirrorSummaryLine(const MirrorTotals& t, bool replay, bool json);

// The marker lines between the runs of bytes `siphon mirror` writes to
// stdout. A marker comes before the first bytes and whenever the
// connection or the direction changes:
//
//   >>> #3 10.0.0.2:51234 -> 10.0.0.1:80           (client->server bytes follow)
//   <<< #3 10.0.0.2:51234 <- 10.0.0.1:80           (server->client bytes follow)
//
// and also, for the same connection and direction, after bytes that never
// reach stdout (lost before they reached us, or not written because stdout
// was too slow), so bytes on both sides of a hole are never joined:
//
//   >>> #3 10.0.0.2:51234 -> 10.0.0.1:80 (12345 bytes missing before these)
//
// Every marker but the first is preceded by one '\n' that is not part of
// the bytes: the bytes of a run are exactly what lies between the end of
// its marker line and that '\n'.
//
// Call order: frame() gives the text for a chunk; if that text could not
// be written, notWritten() says so at once, before the next frame() (the
// next chunk of that connection and direction gets a marker naming what is
// missing); lost() records a gap; forget() when the connection ends.
class StdoutFramer {
 public:
  std::string frame(const MirrorConnection& c, v1::Direction d, std::string_view bytes);
  void notWritten(const MirrorConnection& c, v1::Direction d, uint64_t bytes);
  void lost(const MirrorConnection& c, v1::Direction d, uint64_t bytes);
  std::string frame(const MirrorConnection& c, client::Direction d, std::string_view bytes) {
    return frame(c, wireDirection(d), bytes);
  }
  void notWritten(const MirrorConnection& c, client::Direction d, uint64_t bytes) {
    notWritten(c, wireDirection(d), bytes);
  }
  void lost(const MirrorConnection& c, client::Direction d, uint64_t bytes) {
    lost(c, wireDirection(d), bytes);
  }
  void forget(uint64_t connection_id);

 private:
  static std::string marker(const MirrorConnection& c, v1::Direction d, uint64_t missing);

  bool wrote_any_ = false;
  uint64_t last_connection_ = 0;
  int last_direction_ = -1;
  // Bytes of (connection, direction index) missing since its last run.
  std::map<std::pair<uint64_t, int>, uint64_t> missing_;
  // The state before the last frame(), for notWritten().
  struct Undo {
    bool wrote_any = false;
    uint64_t connection = 0;
    int direction = -1;
    uint64_t missing = 0;
  };
  Undo undo_;
};

}  // namespace siphon::cli
