#include "agent/steal/subscriptions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::steal {

namespace {

std::string holderName(const Subscription& holder, const std::string& session_id) {
  if (holder.session_id == session_id) return "this session";
  return absl::StrCat("session ", holder.session_id,
                      holder.client_name.empty()
                          ? ""
                          : absl::StrCat(" (client \"", holder.client_name, "\")"));
}

}  // namespace

absl::StatusOr<Subscription> SubscriptionTable::reserve(
    uint16_t port, const std::string& session_id, const std::string& client_name,
    std::shared_ptr<const http::RequestFilter> filter) {
  if (port == 0) return protoError(v1::INVALID_ARGUMENT, "steal: port must be 1 to 65535");
  if (auto it = by_port_.find(port); it != by_port_.end()) {
    for (uint64_t id : it->second) {
      const Subscription& holder = by_id_.at(id);
      const std::string who = holderName(holder, session_id);
      if (holder.session_id == session_id) {
        return protoError(v1::PORT_BUSY,
                          absl::StrCat("port ", port, " is already stolen by this session ",
                                       "(subscription ", holder.id, "; one steal per port)"));
      }
      if (!holder.filter) {
        return protoError(v1::PORT_BUSY, absl::StrCat("port ", port, " is already stolen by ", who,
                                                      " (subscription ", holder.id, ")"));
      }
      if (!filter) {
        return protoError(
            v1::PORT_BUSY,
            absl::StrCat("port ", port, " has filtered steals (", who, ", subscription ", holder.id,
                         ", filter ", holder.filter->description(),
                         "); steal it whole only once they end, or steal with a filter too"));
      }
    }
  }
  Subscription s;
  s.id = ids_ ? ids_() : next_id_++;
  s.port = port;
  s.session_id = session_id;
  s.client_name = client_name;
  s.filter = std::move(filter);
  std::vector<uint64_t>& ids = by_port_[port];
  ids.insert(std::upper_bound(ids.begin(), ids.end(), s.id), s.id);
  by_id_[s.id] = s;
  return s;
}

std::vector<const Subscription*> SubscriptionTable::all() const {
  std::vector<const Subscription*> out;
  out.reserve(by_id_.size());
  for (const auto& [id, s] : by_id_) out.push_back(&s);
  return out;
}

absl::Status SubscriptionTable::restore(Subscription s) {
  if (s.id == 0 || by_id_.contains(s.id)) {
    return absl::InvalidArgumentError(absl::StrCat("subscription id ", s.id, " is taken"));
  }
  if (s.port == 0) return absl::InvalidArgumentError("port 0");
  // The rules reserve() keeps: filtered steals of one port coexist, one per
  // session; anything else holds the port alone.
  if (auto it = by_port_.find(s.port); it != by_port_.end()) {
    for (uint64_t other : it->second) {
      const Subscription& o = by_id_.at(other);
      if (!s.filter || !o.filter || o.session_id == s.session_id) {
        return absl::InvalidArgumentError(absl::StrCat("port ", s.port, " is subscribed twice"));
      }
    }
  }
  s.active = true;
  std::vector<uint64_t>& ids = by_port_[s.port];
  ids.insert(std::upper_bound(ids.begin(), ids.end(), s.id), s.id);  // ascending
  next_id_ = std::max(next_id_, s.id + 1);
  by_id_[s.id] = std::move(s);
  return absl::OkStatus();
}

bool SubscriptionTable::activate(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  it->second.active = true;
  return true;
}

const Subscription* SubscriptionTable::activeForPort(uint16_t port) const {
  auto it = by_port_.find(port);
  if (it == by_port_.end() || it->second.size() != 1) return nullptr;
  const Subscription& s = by_id_.at(it->second.front());
  return s.active && !s.filter ? &s : nullptr;
}

bool SubscriptionTable::hasActiveFiltered(uint16_t port) const {
  auto it = by_port_.find(port);
  if (it == by_port_.end()) return false;
  for (uint64_t id : it->second) {
    const Subscription& s = by_id_.at(id);
    if (s.active && s.filter) return true;
  }
  return false;
}

std::vector<const Subscription*> SubscriptionTable::matching(uint16_t port,
                                                             const http::RequestHead& head) const {
  std::vector<const Subscription*> out;
  auto it = by_port_.find(port);
  if (it == by_port_.end()) return out;
  for (uint64_t id : it->second) {
    const Subscription& s = by_id_.at(id);
    if (s.active && s.filter && s.filter->matches(head)) out.push_back(&s);
  }
  return out;
}

const Subscription* SubscriptionTable::find(uint64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

absl::StatusOr<Subscription> SubscriptionTable::remove(uint64_t id, const std::string& session_id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.session_id != session_id) {
    return protoError(v1::NOT_FOUND,
                      absl::StrCat("unsubscribe: no subscription ", id, " in this session"));
  }
  Subscription s = std::move(it->second);
  by_id_.erase(it);
  unindex(s);
  return s;
}

std::vector<Subscription> SubscriptionTable::removeSession(const std::string& session_id) {
  std::vector<Subscription> out;
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    if (it->second.session_id == session_id) {
      unindex(it->second);
      out.push_back(std::move(it->second));
      it = by_id_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void SubscriptionTable::unindex(const Subscription& s) {
  auto it = by_port_.find(s.port);
  if (it == by_port_.end()) return;
  std::erase(it->second, s.id);
  if (it->second.empty()) by_port_.erase(it);
}

std::vector<uint16_t> SubscriptionTable::portsOf(const std::string& session_id) const {
  std::vector<uint16_t> out;
  for (const auto& [id, s] : by_id_) {
    if (s.session_id == session_id) out.push_back(s.port);
  }
  return out;
}

std::vector<const Subscription*> SubscriptionTable::ofSession(
    const std::string& session_id) const {
  std::vector<const Subscription*> out;
  for (const auto& [id, s] : by_id_) {
    if (s.session_id == session_id) out.push_back(&s);
  }
  return out;
}

}  // namespace siphon::agent::steal
