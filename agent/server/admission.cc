#include "agent/server/admission.h"

#include <algorithm>
#include <memory>
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

HandshakeSlots::Slot::Slot(std::unique_ptr<Entry> entry) : entry_(std::move(entry)) {}

HandshakeSlots::Slot::~Slot() { release(); }

HandshakeSlots::Slot& HandshakeSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    release();
    entry_ = std::move(other.entry_);
  }
  return *this;
}

bool HandshakeSlots::Slot::held() const { return entry_ != nullptr && entry_->owner != nullptr; }

bool HandshakeSlots::Slot::evicted() const { return entry_ != nullptr && entry_->evicted; }

void HandshakeSlots::Slot::helloReceived() {
  if (held() && entry_->waiting) entry_->owner->unqueue(*entry_);
}

void HandshakeSlots::Slot::release() {
  if (held()) entry_->owner->release(*entry_);
  entry_.reset();
}

HandshakeSlots::Admission HandshakeSlots::admit(const std::string& source, Clock::time_point now,
                                                Evict on_evict) {
  Admission out;
  if (auto it = per_source_.find(source);
      it != per_source_.end() && it->second.pending >= max_per_source_) {
    if (it->second.waiting.empty()) {
      out.refused = Refusal::kPerSource;
      return out;
    }
    evict(*it->second.waiting.front(), Refusal::kPerSource, now, &out.evicted);
  }
  // After a per-source eviction the total is below its cap: one eviction
  // at most.
  if (total_ >= max_total_) {
    if (waiting_.empty()) {
      out.refused = Refusal::kGlobal;
      return out;
    }
    evict(*waiting_.front(), Refusal::kGlobal, now, &out.evicted);
  }
  auto e = std::make_unique<Entry>();
  e->owner = this;
  // Found again: an eviction may have erased the source's entry.
  e->source = per_source_.try_emplace(source).first;
  e->accepted = now;
  e->on_evict = std::move(on_evict);
  e->in_all = waiting_.insert(waiting_.end(), e.get());
  e->in_source = e->source->second.waiting.insert(e->source->second.waiting.end(), e.get());
  ++e->source->second.pending;
  ++total_;
  out.slot = Slot(std::move(e));
  return out;
}

bool HandshakeSlots::evictOldest(const Slot& keep, Refusal rule, Clock::time_point now,
                                 Eviction* out) {
  // The newcomer is the newest: at the front only when it waits alone.
  if (waiting_.empty() || waiting_.front() == keep.entry_.get()) return false;
  evict(*waiting_.front(), rule, now, out);
  return true;
}

uint32_t HandshakeSlots::pendingFrom(const std::string& source) const {
  auto it = per_source_.find(source);
  return it == per_source_.end() ? 0 : it->second.pending;
}

void HandshakeSlots::unqueue(Entry& e) {
  waiting_.erase(e.in_all);
  e.source->second.waiting.erase(e.in_source);
  e.waiting = false;
}

void HandshakeSlots::release(Entry& e) {
  if (e.waiting) unqueue(e);
  --total_;
  if (--e.source->second.pending == 0) per_source_.erase(e.source);
  e.owner = nullptr;
  e.on_evict = nullptr;
}

void HandshakeSlots::evict(Entry& e, Refusal rule, Clock::time_point now, Eviction* out) {
  *out = Eviction{rule, e.source->first, now - e.accepted};
  Evict close = std::move(e.on_evict);
  release(e);
  e.evicted = true;
  // Last: the slots are consistent whatever the callback does.
  if (close) close();
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
