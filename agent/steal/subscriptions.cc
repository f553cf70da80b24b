#include "agent/steal/subscriptions.h"

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::steal {

absl::StatusOr<Subscription> SubscriptionTable::reserve(uint16_t port,
                                                        const std::string& session_id,
                                                        const std::string& client_name) {
  if (port == 0) return protoError(v1::INVALID_ARGUMENT, "steal: port must be 1 to 65535");
  if (auto it = by_port_.find(port); it != by_port_.end()) {
    const Subscription& holder = by_id_.at(it->second);
    std::string who =
        holder.session_id == session_id
            ? "this session"
            : absl::StrCat("session ", holder.session_id,
                           holder.client_name.empty()
                               ? ""
                               : absl::StrCat(" (client \"", holder.client_name, "\")"));
    return protoError(v1::PORT_BUSY, absl::StrCat("port ", port, " is already stolen by ", who,
                                                  " (subscription ", holder.id, ")"));
  }
  Subscription s;
  s.id = ids_ ? ids_() : next_id_++;
  s.port = port;
  s.session_id = session_id;
  s.client_name = client_name;
  by_port_[port] = s.id;
  by_id_[s.id] = s;
  return s;
}

bool SubscriptionTable::activate(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  it->second.active = true;
  return true;
}

const Subscription* SubscriptionTable::activeForPort(uint16_t port) const {
  auto it = by_port_.find(port);
  if (it == by_port_.end()) return nullptr;
  const Subscription& s = by_id_.at(it->second);
  return s.active ? &s : nullptr;
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
  by_port_.erase(s.port);
  return s;
}

std::vector<Subscription> SubscriptionTable::removeSession(const std::string& session_id) {
  std::vector<Subscription> out;
  for (auto it = by_id_.begin(); it != by_id_.end();) {
    if (it->second.session_id == session_id) {
      by_port_.erase(it->second.port);
      out.push_back(std::move(it->second));
      it = by_id_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<uint16_t> SubscriptionTable::portsOf(const std::string& session_id) const {
  std::vector<uint16_t> out;
  for (const auto& [id, s] : by_id_) {
    if (s.session_id == session_id) out.push_back(s.port);
  }
  return out;
}

}  // namespace siphon::agent::steal
