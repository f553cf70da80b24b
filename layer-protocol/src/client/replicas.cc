// Replicas (ClientOptions::replicas): a workload's session holds a session
// on each pod's agent at once. The current one (link_) takes requests and
// outgoing streams; every one of them carries every steal and mirror
// subscription under this client's ids, so a connection is taken whichever
// pod it reaches. When the current one drains or is lost, a replica takes
// its place (promotion: nothing to make again, its subscriptions are
// there); with none, the client waits for the next addReplica, and calls
// wait with it, each within its own timeout.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/link.h"
#include "client/link_lifecycle.h"
#include "siphon/status.h"

namespace siphon::client {

net::awaitable<absl::Status> Client::subscribeOn(std::shared_ptr<Link> link_in, uint64_t id) {
  const std::shared_ptr<Link> link = std::move(link_in);
  auto it = subscriptions_.find(id);
  if (it == subscriptions_.end()) co_return absl::OkStatus();  // ended meanwhile
  if (it->second.agents.contains(link->generation) || link->subscribing.contains(id)) {
    co_return absl::OkStatus();
  }
  link->subscribing.insert(id);
  auto r = co_await callOn(link, it->second.request, options_.handshake_timeout, id);
  link->subscribing.erase(id);
  co_return r.ok() ? absl::OkStatus() : r.status();
}

net::awaitable<void> Client::fanOut(uint64_t id) {
  // A copy: the list changes while the subscribes wait.
  const std::vector<std::shared_ptr<Link>> replicas = replicas_;
  for (const auto& l : replicas) {
    if (!l->lost.ok() || l->retiring) continue;
    absl::Status s = co_await subscribeOn(l, id);
    if (s.ok() || closing_) continue;
    ReplicaEvent event;
    event.kind = ReplicaEvent::Kind::kFailed;
    event.endpoint = l->endpoint;
    event.status = s;
    event.subscriptions.emplace_back(id, s);
    emitReplica(std::move(event));
  }
}

net::awaitable<absl::Status> Client::addReplica(std::string endpoint) {
  if (!options_.replicas) {
    co_return protoError(v1::FAILED_PRECONDITION, "this client takes no replicas");
  }
  if (closing_ || !lost_.ok()) co_return protoError(v1::CANCELLED, "the session is over");
  if (link_ && link_->endpoint == endpoint && link_->lost.ok()) co_return absl::OkStatus();
  for (const auto& l : replicas_) {
    if (l->endpoint == endpoint && l->lost.ok()) co_return absl::OkStatus();
  }
  const auto keep_alive = shared_from_this();
  std::vector<std::string> one;  // (GCC 12: no braced list in a co_await)
  one.push_back(endpoint);
  auto reached = co_await runLifecycle(LinkLifecycle::connect(std::move(one)), nullptr);
  if (!reached.ok()) co_return reached.status();
  if (closing_ || !lost_.ok()) {
    // Opened as the session ended: end this one too.
    reached->link->session->sendGoaway(v1::CANCELLED, "client closed the session");
    co_return protoError(v1::CANCELLED, "the session is over");
  }
  const std::shared_ptr<Link> link = std::move(reached->link);
  link->resubscribing = true;
  replicas_.push_back(link);
  start(link, std::move(reached->socket), std::move(reached->leftover));
  ReplicaEvent event;
  event.kind = ReplicaEvent::Kind::kAdded;
  event.endpoint = endpoint;
  std::vector<uint64_t> ids;
  for (const auto& [id, sub] : subscriptions_) ids.push_back(id);
  for (uint64_t id : ids) {
    absl::Status s = co_await subscribeOn(link, id);
    if (subscriptions_.contains(id)) event.subscriptions.emplace_back(id, s);
  }
  link->resubscribing = false;
  auto parked = std::move(link->parked);
  link->parked.clear();
  for (auto& [stream, open] : parked) handOver(*link, std::move(stream), std::move(open));
  if (!link->lost.ok()) co_return link->lost;
  emitReplica(std::move(event));
  takeOverIfNoCurrent(link);
  co_return absl::OkStatus();
}

void Client::takeOverIfNoCurrent(const std::shared_ptr<Link>& link) {
  if (!moving_ && link_ && link_->lost.ok() && !link_->retiring) return;
  promoteLink(link, moving_ ? "the agent before it is gone" : "the agent before it drains",
              /*keep_old=*/true);
}

std::shared_ptr<Link> Client::nextReplica() const {
  for (const auto& l : replicas_) {
    if (l->lost.ok() && !l->retiring && !l->resubscribing) return l;
  }
  return nullptr;
}

// `next` by value: callers hand an element of replicas_, which this erases.
void Client::promoteLink(std::shared_ptr<Link> next, std::string reason, bool keep_old) {
  const std::shared_ptr<Link> old = link_;
  std::erase(replicas_, next);
  link_ = next;
  if (old && old != next && keep_old && old->lost.ok()) replicas_.push_back(old);
  ++failovers_;
  const bool was_waiting = moving_;
  moving_ = false;
  moved_.notify();
  ReplicaEvent event;
  event.kind = ReplicaEvent::Kind::kPromoted;
  event.endpoint = next->endpoint;
  event.from = old ? old->endpoint : std::string();
  event.reason = reason;
  emitReplica(std::move(event));
  if (on_failover_ && old && old != next) {
    // As a move, for whoever follows those (the typed API's kMoved): its
    // subscriptions were there already.
    FailoverEvent moved;
    moved.from = old->endpoint;
    moved.to = next->endpoint;
    moved.reason = std::move(reason);
    moved.draining = old->lost.ok();
    moved.streams = old->lost.ok() ? old->openStreams() : 0;
    for (const auto& [id, sub] : subscriptions_) {
      moved.subscriptions.emplace_back(
          id, sub.agents.contains(next->generation)
                  ? absl::OkStatus()
                  : protoError(v1::NOT_FOUND, "not made on the new agent"));
    }
    (void)was_waiting;
    on_failover_(moved);
  }
}

void Client::replaceCurrent(const std::shared_ptr<Link>& link, std::string reason, bool draining,
                            size_t streams, size_t requests) {
  (void)streams;
  (void)requests;
  if (link != link_ || closing_ || !lost_.ok()) return;
  if (auto next = nextReplica()) {
    promoteLink(next, std::move(reason), /*keep_old=*/draining);
    return;
  }
  // Nothing to go to yet: a draining agent serves on meanwhile; a lost one
  // leaves calls waiting for the next replica (addReplica), or abandon().
  if (draining || moving_) return;
  moving_ = true;
  ReplicaEvent event;
  event.kind = ReplicaEvent::Kind::kWaiting;
  event.from = link->endpoint;
  event.reason = std::move(reason);
  event.streams = streams;
  emitReplica(std::move(event));
}

net::awaitable<absl::StatusOr<v1::Response>> Client::callAt(std::string endpoint,
                                                            v1::Request request,
                                                            std::chrono::milliseconds timeout) {
  std::shared_ptr<Link> link;
  if (link_ && link_->endpoint == endpoint && link_->lost.ok()) link = link_;
  for (const auto& l : replicas_) {
    if (!link && l->endpoint == endpoint && l->lost.ok()) link = l;
  }
  if (!link) co_return protoError(v1::NOT_FOUND, absl::StrCat("no live session at ", endpoint));
  co_return co_await callOn(link, std::move(request), timeout, 0);
}

absl::Status Client::promote(const std::string& endpoint, const std::string& reason) {
  for (const auto& l : replicas_) {
    if (l->endpoint == endpoint && l->lost.ok() && !l->resubscribing) {
      promoteLink(l, reason, /*keep_old=*/true);
      return absl::OkStatus();
    }
  }
  return protoError(v1::NOT_FOUND, absl::StrCat("no live replica at ", endpoint));
}

void Client::dropSession(const std::string& endpoint, const std::string& reason) {
  if (link_ && link_->endpoint == endpoint && link_->lost.ok() && !closing_ && lost_.ok()) {
    const std::shared_ptr<Link> current = link_;
    if (current->session && current->transport && !current->transport->closed()) {
      current->session->sendGoaway(v1::CANCELLED, reason);
      current->transport->closeAfterFlush();
    }
    linkLost(current, protoError(v1::AGENT_LOST, reason));
    return;
  }
  for (const auto& l : replicas_) {
    if (l->endpoint != endpoint) continue;
    const std::shared_ptr<Link> link = l;
    std::erase(replicas_, link);
    if (link->session && link->transport && !link->transport->closed()) {
      link->session->sendGoaway(v1::CANCELLED, reason);
      link->transport->closeAfterFlush();
    }
    link->lost = protoError(v1::CANCELLED, reason);
    link->failAll(link->lost);
    return;
  }
}

std::vector<std::string> Client::replicaEndpoints() const {
  std::vector<std::string> out;
  for (const auto& l : replicas_) {
    if (l->lost.ok()) out.push_back(l->endpoint);
  }
  return out;
}

void Client::abandon(const absl::Status& why) {
  if (closing_ || !lost_.ok()) return;
  // The sessions that remain (draining ones) end with it.
  for (auto& l : replicas_) {
    if (l->session && l->transport && !l->transport->closed()) {
      l->session->sendGoaway(v1::CANCELLED, "the session ended");
      l->transport->closeAfterFlush();
    }
  }
  moving_ = false;
  sessionLost(protoError(v1::AGENT_LOST, sv(why.message())));
}

}  // namespace siphon::client
