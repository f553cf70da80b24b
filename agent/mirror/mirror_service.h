// The mirror service: sessions subscribe ports of the target
// (Request{mirror}) and receive a copy of each TCP connection to them as a
// stream the agent opens (StreamOpen{mirrored}); the application's own
// traffic is never touched. Any number of sessions may mirror one port, and
// a stolen port can be mirrored too (the copy is what crossed the target's
// interfaces, so the mirror sees what the steal delivers).
//
//   subscribe   the capture source starts with the first subscription
//               (MirrorEngine: TC program on every interface of the target,
//               on the blocking pool) -> the port is added to its map ->
//               Subscribed{id, "tc"}.
//   connection  the source's events (opened, records, gaps, ends, closes)
//               arrive in batches on the event loop; each subscription of
//               the connection's port gets its own stream, opened when the
//               connection opens, or on its next event when the
//               subscription came later (flagged started_mid_stream).
//   slow client each stream sends within its credit; what it cannot send
//               yet queues, within the subscription's budget
//               (--mirror-buffer); past the budget the bytes are dropped
//               for that subscription only and a StreamGap says how many.
//               Nothing waits: the application and the other sessions
//               never slow down for a slow one.
//
// Handover (docs/CONTINUITY.md): the capture pauses at the freeze, once
// what it read is delivered to the streams; the subscriptions, each
// stream's queue and the capture's state (MirrorEngine::exportState) move;
// the new agent's capture attaches at once and reads the old one's ring to
// its end before its own, so a mirrored stream goes on with no gap.
//
// Unsubscribe, or the session's end, resets the subscription's streams
// (CANCELLED) and stops mirroring the port when nobody else does; the last
// subscription gone unloads the capture program. A drain resets every
// mirrored stream with AGENT_DRAINING (a mirror holds nothing the
// application needs) and refuses new subscriptions.
//
// Threads: everything on the event loop except the source's start and stop
// (blocking pool, one at a time) and its own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/mirror/mirror_engine.h"
#include "agent/services/service.h"

namespace siphon::agent::mirror {

// What the service needs of the capture side (MirrorEngine; tests inject
// their own).
class MirrorSource {
 public:
  virtual ~MirrorSource() = default;
  virtual absl::Status addPort(uint16_t port) = 0;
  virtual absl::Status removePort(uint16_t port) = 0;
  // The service is done with `bytes` of record bytes it was handed.
  virtual void released(size_t bytes) = 0;
  // Whether a subscription of `port` wants server->client bytes
  // (MirrorEngine::setServerToClient); a source may ignore it.
  virtual void setServerToClient(uint16_t port, bool wanted) {
    (void)port;
    (void)wanted;
  }
  // Handover (MirrorEngine's pause, resume, exportState, go). A source
  // that cannot move says so in exportState().
  virtual void pause() {}
  virtual void resume() {}
  virtual absl::StatusOr<MirrorEngineState> exportState() {
    return absl::FailedPreconditionError("this mirror source does not move to a new agent");
  }
  virtual void go() {}
};

// Starts a source that hands its batches to `deliver` (from any thread);
// with `adopted`, one that goes on from another agent's (a handover:
// MirrorEngineOptions::adopted). Runs on the blocking pool.
using MirrorSourceFactory = std::function<absl::StatusOr<std::unique_ptr<MirrorSource>>(
    std::function<void(std::vector<MirrorEvent>)> deliver,
    std::shared_ptr<MirrorEngineState> adopted)>;

struct MirrorServiceOptions {
  // Bytes a subscription may hold for streams without credit.
  size_t subscription_buffer = 32u << 20;
};

// Counters over the agent's life, for logs and tests.
struct MirrorServiceStats {
  uint64_t connections = 0;      // streams opened
  uint64_t refused_streams = 0;  // a session at its stream limit
  uint64_t delivered_bytes = 0;  // record payload sent to sessions
  uint64_t gap_bytes = 0;        // reported to sessions as gaps
  uint64_t gaps = 0;
};

class MirrorService : public RequestService {
 public:
  virtual MirrorServiceStats stats() const = 0;
};

std::shared_ptr<MirrorService> makeMirrorService(ServiceContext& ctx, MirrorSourceFactory factory,
                                                 MirrorServiceOptions options = {});

// Adds the service for Request{mirror} with the real capture source
// (MirrorEngine in the target's netns), and FEATURE_MIRROR.
void registerMirror(ServiceRegistry& registry, ServiceContext& ctx);

}  // namespace siphon::agent::mirror
