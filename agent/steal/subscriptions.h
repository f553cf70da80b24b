// Subscriptions: which session steals which port, or which of its HTTP
// requests. Pure bookkeeping, no I/O, so the rules are tested on their own:
//
//  - An unfiltered steal of a port is exclusive across sessions: a second
//    one gets PORT_BUSY naming the holder, never a silent eviction. The
//    same session subscribing its own port again is PORT_BUSY too (one
//    subscription per port), so an unsubscribe is never ambiguous.
//  - Filtered steals (an HTTP filter) of one port coexist, one per session;
//    a filtered and an unfiltered steal of one port are PORT_BUSY either
//    way round. A request several filters match goes to the subscription
//    made first (the lowest id): matching() lists them in that order.
//  - A port is reserved (reserve()) before the steering is changed, so two
//    sessions racing for it cannot both reach the kernel; the reservation
//    becomes active (activate()) once the steering took the port, or is
//    dropped (remove()) when it failed.
//  - remove() and removeSession() return what was removed, so the caller
//    knows which ports to give back to the application.
//
// Threads: the event loop only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/steal/http/filter.h"

namespace siphon::agent::steal {

struct Subscription {
  uint64_t id = 0;
  uint16_t port = 0;
  std::string session_id;
  std::string client_name;  // for PORT_BUSY messages and logs
  bool active = false;      // the steering has the port
  bool flush = false;       // destroy established connections on subscribe
  // Null: the whole port. Else only the requests it matches.
  std::shared_ptr<const http::RequestFilter> filter;
};

class SubscriptionTable {
 public:
  // `ids` hands out subscription ids (shared with other services, so an
  // unsubscribe names one subscription agent-wide); none: 1, 2, 3...
  explicit SubscriptionTable(std::function<uint64_t()> ids = nullptr) : ids_(std::move(ids)) {}

  // Reserves `port` for the session (with `filter`: the requests it
  // matches). INVALID_ARGUMENT for port 0; PORT_BUSY when a subscription
  // (reserved or active) of the port conflicts: any of this session's, an
  // unfiltered one, or any one when `filter` is null.
  absl::StatusOr<Subscription> reserve(uint16_t port, const std::string& session_id,
                                       const std::string& client_name,
                                       std::shared_ptr<const http::RequestFilter> filter = nullptr);
  // The steering has the port now. False when the subscription is gone
  // (its session ended meanwhile): the caller gives the port back.
  bool activate(uint64_t id);

  // The active unfiltered subscription for `port` (where a new connection
  // goes whole), or null.
  const Subscription* activeForPort(uint16_t port) const;
  // Whether `port` has an active filtered subscription (its connections go
  // through the HTTP engine).
  bool hasActiveFiltered(uint16_t port) const;
  // The active filtered subscriptions of `port` whose filter matches, the
  // earliest (lowest id) first.
  std::vector<const Subscription*> matching(uint16_t port, const http::RequestHead& head) const;
  const Subscription* find(uint64_t id) const;

  // Removes subscription `id` if `session_id` owns it: NOT_FOUND otherwise
  // (an unknown id and another session's id look the same to the caller).
  absl::StatusOr<Subscription> remove(uint64_t id, const std::string& session_id);
  // Removes every subscription of a session (it ended).
  std::vector<Subscription> removeSession(const std::string& session_id);

  // Ports held by a session, for the sessions listing.
  std::vector<uint16_t> portsOf(const std::string& session_id) const;
  // The subscriptions of a session, by id (`siphon sessions`).
  std::vector<const Subscription*> ofSession(const std::string& session_id) const;
  size_t size() const { return by_id_.size(); }
  // Every subscription, by id (a handover exports them).
  std::vector<const Subscription*> all() const;
  // A subscription of the old agent, active, under its own id (a
  // handover). INVALID_ARGUMENT when its id or port is taken already.
  absl::Status restore(Subscription s);

 private:
  void unindex(const Subscription& s);

  std::function<uint64_t()> ids_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, Subscription> by_id_;
  std::map<uint16_t, std::vector<uint64_t>> by_port_;  // ids ascending
};

}  // namespace siphon::agent::steal
