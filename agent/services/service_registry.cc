#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/services/service.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

class UnsubscribeRouter final : public RequestService {
 public:
  explicit UnsubscribeRouter(std::vector<std::shared_ptr<RequestService>> services)
      : services_(std::move(services)) {}

  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    const uint64_t id = request.unsubscribe().subscription_id();
    for (auto& s : services_) {
      if (s->ownsSubscription(id, session->id())) {
        s->handle(std::move(session), std::move(request));
        return;
      }
    }
    session->respondError(
        request.request_id(),
        protoError(v1::NOT_FOUND, absl::StrCat("no subscription ", id, " in this session")));
  }

 private:
  std::vector<std::shared_ptr<RequestService>> services_;
};

}  // namespace

void ServiceRegistry::routeUnsubscribe() {
  // Not added to unique_requests_: the services it routes to are there.
  requests_[v1::Request::kUnsubscribe] = std::make_shared<UnsubscribeRouter>(unique_requests_);
}

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
  std::vector<StreamService*> done;
  for (auto& [kind, s] : streams_) {
    if (std::find(done.begin(), done.end(), s.get()) != done.end()) continue;
    done.push_back(s.get());
    s->agentDraining();
  }
}

size_t ServiceRegistry::inFlight() const {
  size_t n = 0;
  for (const auto& s : unique_requests_) n += s->inFlight();
  return n;
}

void ServiceRegistry::describeSubscriptions(
    const std::string& session_id,
    google::protobuf::RepeatedPtrField<v1::SubscriptionSummary>* out) const {
  for (const auto& s : unique_requests_) s->describeSubscriptions(session_id, out);
}

void ServiceRegistry::sessionEnded(const std::string& session_id) {
  for (auto& s : unique_requests_) s->sessionEnded(session_id);
}

void ServiceRegistry::prepareHandover() {
  for (auto& s : unique_requests_) s->prepareHandover();
}

void ServiceRegistry::freeze() {
  for (auto& s : unique_requests_) s->freeze();
}

void ServiceRegistry::thaw() {
  for (auto& s : unique_requests_) s->thaw();
}

std::string ServiceRegistry::handoverBlocker() const {
  for (const auto& s : unique_requests_) {
    if (std::string why = s->handoverBlocker(); !why.empty()) return why;
  }
  for (const auto& [kind, s] : streams_) {
    if (std::string why = s->handoverBlocker(); !why.empty()) return why;
  }
  return "";
}

absl::Status ServiceRegistry::exportState(v1::AgentState* out, std::vector<UniqueFd>* fds) {
  for (auto& s : unique_requests_) RETURN_IF_ERROR(s->exportState(out, fds));
  return absl::OkStatus();
}

absl::Status ServiceRegistry::importState(
    const v1::AgentState& in, std::vector<UniqueFd>& fds,
    const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) {
  for (auto& s : unique_requests_) RETURN_IF_ERROR(s->importState(in, fds, sessions));
  for (auto& [kind, s] : streams_) RETURN_IF_ERROR(s->importState(in, fds, sessions));
  return absl::OkStatus();
}

void ServiceRegistry::handedOver() {
  for (auto& s : unique_requests_) s->handedOver();
}

void ServiceRegistry::startAfterHandover() {
  for (auto& s : unique_requests_) s->startAfterHandover();
  for (auto& [kind, s] : streams_) s->startAfterHandover();
}

}  // namespace siphon::agent
