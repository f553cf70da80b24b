#include <algorithm>

#include "agent/services/service.h"

namespace siphon::agent {

void ServiceRegistry::addRequest(v1::Request::BodyCase kind,
                                 std::shared_ptr<RequestService> service) {
  if (std::find(unique_requests_.begin(), unique_requests_.end(), service) ==
      unique_requests_.end()) {
    unique_requests_.push_back(service);
  }
  requests_[kind] = std::move(service);
}

void ServiceRegistry::addStream(v1::StreamOpen::KindCase kind,
                                std::shared_ptr<StreamService> service) {
  streams_[kind] = std::move(service);
}

RequestService* ServiceRegistry::request(v1::Request::BodyCase kind) const {
  auto it = requests_.find(kind);
  return it == requests_.end() ? nullptr : it->second.get();
}

StreamService* ServiceRegistry::stream(v1::StreamOpen::KindCase kind) const {
  auto it = streams_.find(kind);
  return it == streams_.end() ? nullptr : it->second.get();
}

void ServiceRegistry::agentStopping() {
  for (auto& s : unique_requests_) s->agentStopping();
}

void ServiceRegistry::agentDraining() {
  for (auto& s : unique_requests_) s->agentDraining();
}

size_t ServiceRegistry::inFlight() const {
  size_t n = 0;
  for (const auto& s : unique_requests_) n += s->inFlight();
  return n;
}

void ServiceRegistry::sessionEnded(const std::string& session_id) {
  for (auto& s : unique_requests_) s->sessionEnded(session_id);
}

}  // namespace siphon::agent
