// Admission of connections that have not finished the handshake: until its
// Hello is checked a peer is unauthenticated, and anyone who can reach the
// port can open thousands of them. Each one admitted holds a slot (counted
// globally and per source address) from accept() until the handshake ends;
// one past a cap, or one that would eat into the descriptors kept for the
// sessions, is closed at once (docs/SECURITY.md#handshake-admission).
//
// No I/O but the RLIMIT_NOFILE helpers (the fd count is metrics::countOpenFds()). Threads: one
// HandshakeSlots is used from one thread (the server's event loop).
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon::agent {

class HandshakeSlots {
 public:
  // Why a connection was not admitted; the `reason` label of
  // siphon_handshakes_rejected_total and of the handshake_refused log line.
  enum class Refusal { kNone, kGlobal, kPerSource, kFdReserve };
  static std::string_view refusalName(Refusal r);

  // A held slot; released by its destructor (every exit of the handshake).
  // Move-only; a moved-from or default Slot holds nothing.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { release(); }
    bool held() const { return owner_ != nullptr; }
    void release();

   private:
    friend class HandshakeSlots;
    Slot(HandshakeSlots* owner, std::string source) : owner_(owner), source_(std::move(source)) {}
    HandshakeSlots* owner_ = nullptr;
    std::string source_;
  };

  // max_total, max_per_source >= 1. The slots must outlive every Slot.
  HandshakeSlots(uint32_t max_total, uint32_t max_per_source)
      : max_total_(max_total), max_per_source_(max_per_source) {}

  // A slot for one more handshake from `source` (the peer's address), or
  // a refusal (*why), leaving the counts as they were.
  Slot tryAcquire(const std::string& source, Refusal* why);

  uint32_t pending() const { return total_; }
  uint32_t pendingFrom(const std::string& source) const;
  // Sources with a pending handshake (the map never holds a zero count).
  size_t sources() const { return per_source_.size(); }

 private:
  void release(const std::string& source);

  uint32_t max_total_;
  uint32_t max_per_source_;
  uint32_t total_ = 0;
  std::map<std::string, uint32_t> per_source_;
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
