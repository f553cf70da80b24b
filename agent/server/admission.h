// Admission of connections that have not finished the handshake: until its
// Hello is checked a peer is unauthenticated, and anyone who can reach the
// port can open thousands of them. Each one admitted holds a slot (counted
// globally and per source address) from accept() until the handshake ends
// (docs/SECURITY.md#handshake-admission).
//
// When a cap is full, the newcomer is not the one turned away: the
// connection of that cap that has waited longest without a complete Hello
// is closed (evicted) and the newcomer takes its place. Behind one source
// address (every client of a `kubectl port-forward` arrives from loopback)
// the cap cannot tell a developer from a flood; this order can: a client
// that sends its Hello promptly is past it before a flood's newer
// connections reach the front of the queue, and a flood's idle connections
// are each evicted by the next one. A connection whose Hello is complete
// (Slot::helloReceived) is never evicted; only when a full cap holds
// nothing else is the newcomer refused.
//
// The queues are in accept order, one over all sources and one per source:
// admit() and every eviction are O(1) but for the per-source map's
// O(log sources) lookup, never a scan of what is pending.
//
// No I/O but the RLIMIT_NOFILE helpers (the fd count is
// metrics::countOpenFds()); closing an evicted connection is the caller's
// callback. Threads: one HandshakeSlots is used from one thread (the
// server's event loop).
#pragma once

#include <sys/resource.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon::agent {

class HandshakeSlots {
  struct Entry;

 public:
  using Clock = std::chrono::steady_clock;

  // The rule that was full when a connection was closed at admission; the
  // `reason` label of siphon_handshakes_rejected_total (the newcomer
  // refused) and siphon_handshakes_evicted_total (an older one evicted),
  // and of their log lines.
  enum class Refusal { kNone, kGlobal, kPerSource, kFdReserve };
  static std::string_view refusalName(Refusal r);

  // Closes an evicted connection (with an RST). Called from inside admit()
  // or evictOldest(): it must not call back into the slots.
  using Evict = std::function<void()>;

  // A held slot; released by its destructor (every exit of the handshake).
  // Move-only; a moved-from or default Slot holds nothing.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot();
    // Counted: admitted, neither released nor evicted.
    bool held() const;
    // Its connection was evicted (and closed by the Evict callback): the
    // handshake ends without a word, the eviction was logged already.
    bool evicted() const;
    // The Hello is complete: never evicted from now on; still counted
    // until released.
    void helloReceived();
    void release();

   private:
    friend class HandshakeSlots;
    explicit Slot(std::unique_ptr<Entry> entry);
    // Owned here, not by the slots: it outlives an eviction, so that the
    // handshake can still ask evicted().
    std::unique_ptr<Entry> entry_;
  };

  // An eviction that made room: which rule, whose connection, after how
  // long (a connection evicted within milliseconds of its accept says the
  // flood reopens faster than a client's Hello round trip).
  struct Eviction {
    Refusal rule = Refusal::kNone;  // kNone: no eviction
    std::string source;
    Clock::duration waited{};
  };

  // What admit() did: a slot for the newcomer, unless refused, and at most
  // one eviction to make room for it.
  struct Admission {
    Slot slot;
    Refusal refused = Refusal::kNone;
    Eviction evicted;
  };

  // max_total, max_per_source >= 1. The slots must outlive every Slot.
  HandshakeSlots(uint32_t max_total, uint32_t max_per_source)
      : max_total_(max_total), max_per_source_(max_per_source) {}
  HandshakeSlots(const HandshakeSlots&) = delete;
  HandshakeSlots& operator=(const HandshakeSlots&) = delete;

  // A slot for one more handshake from `source` (the peer's address),
  // accepted at `now`, closed by `on_evict` if it is evicted later. When
  // `source`'s cap is full, its oldest connection without a complete
  // Hello is evicted, else the newcomer is refused (kPerSource); then the
  // same for the global cap (kGlobal). A refusal leaves everything as it
  // was.
  Admission admit(const std::string& source, Clock::time_point now, Evict on_evict);

  // The fd reserve (FdBudget) is reached: evicts the connection that has
  // waited longest without a complete Hello, other than `keep` (the
  // newcomer), as `rule`. False, with nothing changed, when there is none.
  bool evictOldest(const Slot& keep, Refusal rule, Clock::time_point now, Eviction* out);

  uint32_t pending() const { return total_; }
  uint32_t pendingFrom(const std::string& source) const;
  // Pending connections that may be evicted (no complete Hello yet).
  size_t waiting() const { return waiting_.size(); }
  // Sources with a pending handshake (the map never holds a zero count).
  size_t sources() const { return per_source_.size(); }

 private:
  struct Source {
    uint32_t pending = 0;
    std::list<Entry*> waiting;  // accept order, oldest first
  };
  using Sources = std::map<std::string, Source, std::less<>>;
  struct Entry {
    HandshakeSlots* owner = nullptr;  // null once released or evicted
    Sources::iterator source;
    Clock::time_point accepted;
    Evict on_evict;
    bool waiting = true;  // in the queues below: no complete Hello yet
    bool evicted = false;
    std::list<Entry*>::iterator in_all;
    std::list<Entry*>::iterator in_source;
  };

  void unqueue(Entry& e);
  void release(Entry& e);
  void evict(Entry& e, Refusal rule, Clock::time_point now, Eviction* out);

  uint32_t max_total_;
  uint32_t max_per_source_;
  uint32_t total_ = 0;
  Sources per_source_;
  std::list<Entry*> waiting_;  // every source's, accept order, oldest first
};

// The descriptor budget: handshakes are refused while fewer than reserve()
// descriptors are left below the soft RLIMIT_NOFILE, so that authenticated
// sessions keep opening files and sockets during a flood of connections.
struct FdBudget {
  uint64_t limit = 0;    // the soft RLIMIT_NOFILE
  uint64_t reserve = 0;  // a quarter of it, at least kMinFdReserve
  // True when a process holding `open_fds` descriptors may admit one more
  // handshake.
  bool admits(uint64_t open_fds) const { return open_fds + reserve < limit; }
};
inline constexpr uint64_t kMinFdReserve = 32;
FdBudget fdBudgetFor(uint64_t soft_limit);

// The soft RLIMIT_NOFILE the agent raises itself to at start-up: this, or
// the hard limit when lower. Never lowered.
inline constexpr rlim_t kFdLimitTarget = 65536;
struct FdLimits {
  rlim_t before = 0;  // soft limit found
  rlim_t soft = 0;    // soft limit now
  rlim_t hard = 0;
};
// Raises the soft RLIMIT_NOFILE to min(kFdLimitTarget, hard), if below.
absl::StatusOr<FdLimits> raiseFdLimit();

}  // namespace siphon::agent
