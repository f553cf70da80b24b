// MirrorEngine: the capture half of the mirror. A thread of its own enters
// the target's network namespace, loads the TC capture program
// (bpf/loader/mirror_loader.h), attaches it to every interface there
// (loopback at ingress only, so each packet is copied once) and to every
// interface that appears later (rtnetlink link events through libnl), reads
// the ring buffer and reassembles the TCP connections of the mirrored ports
// (reassembly.h). What comes out (connections opened, records, gaps, ends,
// closes) is handed over in batches to `Deliver`, which the service posts to
// its event loop.
//
// Memory is bounded twice: the reassembly's own bounds (connections, the
// memory out-of-order segments hold), and `max_queued_bytes` of records handed over and not
// yet released() by the consumer. Past it, bytes become gaps at once: the
// engine never waits for a consumer, so it never slows the ring buffer, and
// the ring buffer never slows the application (a full ring drops the copy,
// never the packet).
//
// Nothing is pinned: the TCX links are fds of this process, so the
// destructor, or the process dying by any signal, detaches everything.
//
// Handover (a new agent process takes over, docs/CONTINUITY.md section 8):
// the old engine pause()s (its thread parks between two batches, having
// delivered everything it read; its program keeps copying into its ring)
// and exportState()s its connections and a dup of its ring's fd. The new
// engine starts with them (MirrorEngineOptions::adopted): its own program
// copies into its own ring from its start, but its thread reads neither ring
// until go(), which comes once the old process is gone (its links with it).
// Then it reads the old ring to its end, then its own: together they hold
// every packet since the pause, some twice (the reassembler counts those
// as duplicates), so no stream has a gap the copy did not have anyway.
//
// Threads: start(), addPort(), removePort(), setServerToClient(),
// released(), stats(), pause(), resume(), exportState(), go() and the
// destructor from any thread; `Deliver` runs on the engine's thread, never
// while it is paused.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/mirror/reassembly.h"

namespace siphon::agent::mirror {

// One thing that happened to a mirrored connection, in order per connection.
struct MirrorEvent {
  enum class Kind : uint8_t { kOpened, kData, kGap, kEnd, kClosed };
  Kind kind = Kind::kData;
  uint64_t connection = 0;
  Direction direction = Direction::kClientToServer;  // kData, kGap, kEnd
  // kData: one record as it goes on the wire (streams.proto,
  // MirroredConnection): the v1::Direction byte, then the bytes.
  std::string record;
  uint64_t gap_bytes = 0;                  // kGap
  ConnectionInfo info;                     // kOpened
  CloseReason reason = CloseReason::kFin;  // kClosed
};

// The v1::Direction value of a direction (the first byte of a record).
uint8_t directionByte(Direction direction);

// What a paused engine hands to the engine that takes over from it
// (MirrorEngine::exportState(), MirrorEngineOptions::adopted).
struct MirrorEngineState {
  // Every open connection, least recently active first, its reassembly
  // exactly as the old engine left it.
  std::vector<ConnectionSnapshot> connections;
  uint64_t next_connection_id = 1;
  // The mirrored ports (addPort()), and those whose server->client bytes
  // nobody wants (setServerToClient(port, false)): the new engine mirrors
  // and skips them from its start, so restored connections go on as they
  // were.
  std::set<uint16_t> ports;
  std::set<uint16_t> ports_without_server_bytes;
  // A dup of the old engine's ring buffer map fd. Its program keeps writing
  // there until its links are gone (the old process exited).
  UniqueFd ring;
};

struct MirrorEngineOptions {
  // The ring buffer between the TC program and this thread (a power of two,
  // at least a page). Too small for a burst: the copies are lost, reported
  // as gaps.
  uint32_t ring_bytes = 32u << 20;
  // Record bytes handed over and not yet released by the consumer.
  size_t max_queued_bytes = 64u << 20;
  // Record payload at most (one Data frame each).
  size_t max_record = 32 * 1024;
  std::chrono::milliseconds tick{50};  // hole and idle timeouts, kernel counters
  // After the ring wakes the thread, how long it lets more packets gather
  // before it reads them: the kernel wakes a reader that has caught up for
  // every packet, and small packets at 100k/s would cost a context switch
  // each (and a batch handed to the event loop each). Adds at most this to
  // a copy's delay; 0: read at once.
  std::chrono::microseconds coalesce{250};
  // server_ports follows addPort/removePort. Out of order, 8 MiB of memory
  // per direction (7.2 MiB of MSS-sized payload, segmentCost()): a sender
  // cannot get further ahead of a hole than the receiver's window, which
  // Linux caps at 6 MiB by default (tcp_rmem); a lost copy of one packet
  // must not turn its retransmission into a gap.
  ConnectionTableOptions table = [] {
    ConnectionTableOptions o;
    o.stream.max_buffered = 8u << 20;
    return o;
  }();
  // Taking over from an engine of another process (its exportState()):
  // start() also mirrors the ports of the state and of table.server_ports
  // at once (as if addPort()ed: the new ring fills from the start), skips
  // the server->client bytes of its ports_without_server_bytes (as if
  // setServerToClient(port, false)), restores the connections (no kOpened:
  // the consumer knows them; their ids kept, new ones above), and the
  // thread reads nothing until go(). The engine closes `ring` once it has
  // read it, and drops its reference to the state then.
  std::shared_ptr<MirrorEngineState> adopted;
};

struct MirrorEngineStats {
  uint64_t kernel_seen = 0;  // packets of mirrored ports the TC program saw
  uint64_t kernel_copied = 0;
  uint64_t kernel_lost = 0;         // ring buffer full
  MirrorCounters table;             // reassembly
  uint64_t overflow_gap_bytes = 0;  // turned into gaps: the consumer was behind
  // Mesh-facing hops of meshed connections, not followed (redirected_hops.h).
  uint64_t connections_left_out = 0;
  std::vector<std::string> interfaces;  // attached, "name(ifindex)"
};

class MirrorEngine {
 public:
  using Deliver = std::function<void(std::vector<MirrorEvent> batch)>;

  // Starts the thread in the network namespace of `netns_fd` (-1: the
  // caller's) and returns once the program is attached to every interface
  // there. Errors: PERMISSION_DENIED without CAP_BPF/CAP_NET_ADMIN or setns;
  // INVALID_ARGUMENT from a kernel without TCX (< 6.6) or bpf_cast_to_kern_ctx;
  // each with what failed.
  static absl::StatusOr<std::unique_ptr<MirrorEngine>> start(int netns_fd,
                                                             MirrorEngineOptions options,
                                                             Deliver deliver);
  // Stops the thread, detaches from every interface, unloads.
  ~MirrorEngine();
  MirrorEngine(const MirrorEngine&) = delete;
  MirrorEngine& operator=(const MirrorEngine&) = delete;

  // Mirrors / stops mirroring a port from the next packet on. Stopping
  // closes the port's connections (kClosed, kShutdown) with their missing
  // bytes reported first.
  absl::Status addPort(uint16_t port);
  absl::Status removePort(uint16_t port);
  // Whether anyone wants the server->client bytes of a port's connections
  // (a subscription with both directions); yes until told otherwise. When
  // nobody does, those bytes are still reassembled (their FIN, their RST,
  // their holes end the connection as before) but not copied into records:
  // each run of them is a kGap event instead, which costs no copy, and a
  // consumer that asked for them just now is told what it missed. From the
  // next packet on.
  void setServerToClient(uint16_t port, bool wanted);

  // The consumer is done with `bytes` of records it was handed.
  void released(size_t bytes);
  size_t queuedBytes() const;

  MirrorEngineStats stats() const;

  // Stops reading the ring, for a handover: returns once the thread is
  // parked, every event of what it read delivered (the last batch was
  // handed to `Deliver` before it returns). The program still copies into
  // the ring meanwhile (a full ring drops copies, seen later as gaps);
  // ports, link events and timeouts wait too. Destroyed while paused, the
  // engine delivers nothing more (not even the closes of its connections:
  // another engine may hold them now). No-op when paused already, or when
  // the thread has ended (a ring that could not be read).
  void pause();
  // Goes on exactly as before the pause (the handover failed): the ring
  // kept what came meanwhile. No-op when not paused.
  void resume();
  // While paused: the state another engine takes over with (see
  // MirrorEngineOptions::adopted); the engine itself is unchanged, and
  // resume() goes on with it. Errors: FAILED_PRECONDITION when not paused,
  // or before go() of an engine that adopted a state (the old ring is
  // unread); the errno of dup().
  absl::StatusOr<MirrorEngineState> exportState();
  // With options.adopted: the old engine's process is gone (its ring gets
  // nothing more); read its ring to its end, close it, then read this
  // engine's own as usual. Returns at once; the thread does it. No-op
  // without options.adopted, or when called again.
  void go();

 private:
  struct Impl;
  explicit MirrorEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace siphon::agent::mirror
