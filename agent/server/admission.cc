#include "agent/server/admission.h"

#include <algorithm>
#include <utility>

#include "siphon/status.h"

namespace siphon::agent {

std::string_view HandshakeSlots::refusalName(Refusal r) {
  switch (r) {
    case Refusal::kNone:
      return "none";
    case Refusal::kGlobal:
      return "max_handshakes";
    case Refusal::kPerSource:
      return "max_handshakes_per_source";
    case Refusal::kFdReserve:
      return "fd_reserve";
  }
  return "unknown";
}

HandshakeSlots::Slot& HandshakeSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    source_ = std::move(other.source_);
  }
  return *this;
}

void HandshakeSlots::Slot::release() {
  if (HandshakeSlots* owner = std::exchange(owner_, nullptr)) owner->release(source_);
}

HandshakeSlots::Slot HandshakeSlots::tryAcquire(const std::string& source, Refusal* why) {
  if (total_ >= max_total_) {
    *why = Refusal::kGlobal;
    return {};
  }
  auto it = per_source_.find(source);
  if (it != per_source_.end() && it->second >= max_per_source_) {
    *why = Refusal::kPerSource;
    return {};
  }
  ++total_;
  ++per_source_[source];
  *why = Refusal::kNone;
  return Slot(this, source);
}

uint32_t HandshakeSlots::pendingFrom(const std::string& source) const {
  auto it = per_source_.find(source);
  return it == per_source_.end() ? 0 : it->second;
}

void HandshakeSlots::release(const std::string& source) {
  --total_;
  auto it = per_source_.find(source);
  if (--it->second == 0) per_source_.erase(it);
}

FdBudget fdBudgetFor(uint64_t soft_limit) {
  return {soft_limit, std::max<uint64_t>(kMinFdReserve, soft_limit / 4)};
}

absl::StatusOr<FdLimits> raiseFdLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return lastErrnoStatus("getrlimit RLIMIT_NOFILE");
  FdLimits out{rl.rlim_cur, rl.rlim_cur, rl.rlim_max};
  const rlim_t want = std::min(kFdLimitTarget, rl.rlim_max);
  if (rl.rlim_cur >= want) return out;
  rl.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return lastErrnoStatus("setrlimit RLIMIT_NOFILE");
  out.soft = want;
  return out;
}

}  // namespace siphon::agent
