// Steal and mirror subscriptions: traffic to a port of the target, handed to
// the program as events of its Subscription, in arrival order.
//  - A steal takes the port's connections (or, with an HTTP filter, the
//    requests that match) from the application: kConnection events carry a
//    Connection (a byte stream to the original client), kRequest events a
//    Connection whose bytes are the request as HTTP/1.1 and on which the
//    program writes one HTTP/1.1 response (docs/PROTOCOL.md).
//  - A mirror copies the port's connections without touching them:
//    kMirrored events carry a MirroredConnection, whose events are the
//    bytes of each direction, each direction's end, and gaps (bytes lost in
//    the copy, never silently).
// And the session's own news, for each subscription: kDraining (its agent
// drains: new connections go to the application), kMoved (made again on
// another agent: status OK, or why it could not be and is gone), kOverlap
// (a filtered steal's requests went to an earlier subscription), kLost (the
// session is gone; next() then fails with kAgentLost).
// Streams handed out are accepted already: their bytes flow. One that the
// agent ended before it could be accepted (its client went away) is still
// handed out; its first read() or write() says why.
//
// Threads: as the Target's (target.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/client/connections.h"
#include "siphon/client/target.h"

namespace siphon::client {

struct HttpFilter {
  // name (case-insensitive) -> a regex (RE2, unanchored) its value must match.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string path_regex;
  std::string method;
  bool match_any = false;  // any test, not all
};

struct StealSpec {
  uint16_t port = 0;
  std::optional<HttpFilter> filter;  // none: the whole port, exclusively
  bool flush_connections = false;    // destroy established connections first
};

struct MirrorSpec {
  uint16_t port = 0;
  bool both_directions = false;  // the server's bytes too
};

enum class Direction { kUnspecified, kClientToServer, kServerToClient };

struct MirrorEvent {
  enum class Kind { kData, kFin, kGap };
  Kind kind = Kind::kData;
  Direction direction = Direction::kUnspecified;
  std::string bytes;       // kData
  uint64_t gap_bytes = 0;  // kGap
};

class MirroredConnection {
 public:
  MirroredConnection() = default;
  const SocketAddress& source() const { return source_; }
  const SocketAddress& destination() const { return destination_; }
  bool startedMidStream() const { return mid_stream_; }
  // The next record or gap; nullopt when both directions ended; an error
  // status when the copy ended otherwise (the connection reset: kErrno
  // ECONNRESET; idle: kTimeout; the mirror stopped: kCancelled; a record
  // the agent got wrong: kProtocolError, and the copy ends...).
  net::awaitable<absl::StatusOr<std::optional<MirrorEvent>>> next();
  // Ends the copy of this connection (not the connection); `code` and `why`
  // go to the agent.
  void stop();
  void stop(ErrorCode code, std::string_view why);

 private:
  friend struct TargetCore;
  std::shared_ptr<ClientStream> stream_;
  SocketAddress source_;
  SocketAddress destination_;
  bool mid_stream_ = false;
};

struct StolenRequestInfo {
  std::string protocol;  // how the client spoke: "HTTP/1.1", "HTTP/2"...
  std::string method;
  std::string path;
  uint64_t connection_request = 0;  // its position on the client's connection, from 1
};

// kOverlap: requests this filtered steal's filter matched went to an
// earlier subscription of the port (another session's, usually).
struct FilterOverlap {
  uint64_t taken_by = 0;        // the agent's id of the subscription that got them
  std::string taken_by_client;  // its session's client name (may be empty)
  uint64_t requests = 0;
  std::string method;  // the first of them
  std::string path;
};

struct SubscriptionEvent {
  enum class Kind {
    kConnection,
    kRequest,
    kMirrored,
    kOverlap,
    kDraining,
    kMoved,
    kLost,
    kTargetRestarted,  // the target's container restarted; text says how
  };
  Kind kind = Kind::kLost;
  Connection connection;        // kConnection, kRequest
  SocketAddress source;         // kConnection, kRequest, kMirrored
  SocketAddress destination;    // the original destination
  StolenRequestInfo request;    // kRequest
  MirroredConnection mirrored;  // kMirrored
  absl::Status status;          // kMoved (OK: back), kLost
  FilterOverlap overlap;        // kOverlap
  std::string text;  // kOverlap, kDraining, kMoved, kTargetRestarted: what happened
};

struct SubscriptionState;
struct SubscriptionOwner;

// Dropping the last copy of a Subscription without unsubscribe() resets
// the streams it did not take, and those that come later, and gives the
// port back on the agent (an Unsubscribe sent without waiting for its
// answer; nothing when the subscription is over already).
class Subscription {
 public:
  Subscription() = default;
  // This client's id (kept across a failover) and the agent's backend
  // ("sk_lookup", "iptables", "tc").
  uint64_t id() const;
  const std::string& backend() const;
  // OK while the subscription holds; once it is over, why (as next() will
  // answer after the events still queued). Known as soon as the session's
  // news is: a LinkEvent kMoved handler sees here which subscriptions came
  // back on the new agent and which did not.
  absl::Status status() const;
  // The next event; an error status once the subscription is over
  // (unsubscribed: kCancelled; the session lost: kAgentLost).
  net::awaitable<absl::StatusOr<SubscriptionEvent>> next();
  // Gives the port back. The subscription is over here whatever the agent
  // answers (next() then fails with kCancelled); the status says whether the
  // agent confirmed (a lost session's subscriptions are gone already: OK).
  net::awaitable<absl::Status> unsubscribe();

 private:
  friend class Subscriptions;
  explicit Subscription(std::shared_ptr<SubscriptionOwner> owner);
  std::shared_ptr<SubscriptionOwner> state_owner_;
  std::shared_ptr<SubscriptionState> state_;
};

class Subscriptions {
 public:
  explicit Subscriptions(const Target& target);
  // kPortBusy: an unfiltered steal of the port is held (or a filtered one,
  // for an unfiltered ask).
  net::awaitable<absl::StatusOr<Subscription>> steal(StealSpec spec);
  net::awaitable<absl::StatusOr<Subscription>> mirror(MirrorSpec spec);

 private:
  std::shared_ptr<TargetCore> core_;
};

}  // namespace siphon::client
