// Continuity across agents: a Link lost beyond resume, or whose agent
// drains, is replaced by a new one on another endpoint (failover), its
// subscriptions made again there; with nowhere to go the client is lost.
// The order of endpoints and the attempts are LinkLifecycle's (no I/O).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/link.h"
#include "client/link_lifecycle.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::client {

using net::asio::steady_timer;
namespace asio = net::asio;

bool Client::canFailover() const {
  return options_.failover && options_.endpoints.size() > 1 && !closing_;
}

void Client::linkLost(const std::shared_ptr<Link>& link, const absl::Status& why) {
  if (!link->lost.ok()) return;
  link->lost = linkLostStatus(link->endpoint, why);
  auto [requests, streams] = link->failAll(link->lost);
  if (closing_ || !lost_.ok()) return;
  if (link != link_) {
    if (auto it = std::find(replicas_.begin(), replicas_.end(), link); it != replicas_.end()) {
      replicas_.erase(it);
      ReplicaEvent event;
      event.kind = ReplicaEvent::Kind::kLost;
      event.endpoint = link->endpoint;
      event.status = link->lost;
      event.streams = streams;
      emitReplica(std::move(event));
    }
    return;
  }
  if (options_.replicas) {
    replaceCurrent(link, std::string(why.message()), /*draining=*/false, streams, requests);
    return;
  }
  if (moving_) return;  // the failover under way sees it
  moveOn(link, std::string(why.message()), streams, requests);
}

void Client::moveOn(const std::shared_ptr<Link>& link, std::string reason, size_t streams,
                    size_t requests) {
  if (!canFailover()) {
    sessionLost(link->lost);
    return;
  }
  FailoverEvent event;
  event.from = link->endpoint;
  event.reason = std::move(reason);
  event.streams = streams;
  event.requests_failed = requests;
  spawnFailover(link, std::move(event), std::nullopt);
}

void Client::spawnFailover(std::shared_ptr<Link> from, FailoverEvent event,
                           std::optional<v1::Draining> draining) {
  // A failover that throws ends the session with a clear error rather than
  // leaving it half moved with nobody told.
  auto self = shared_from_this();
  net::spawn(ex_, failover(self, std::move(from), std::move(event), std::move(draining)),
             "client_failover",
             [self] { self->sessionLost(protoError(v1::INTERNAL, "the failover failed")); });
}

net::awaitable<void> Client::failover(std::shared_ptr<Client> self, std::shared_ptr<Link> from_in,
                                      FailoverEvent event_in,
                                      std::optional<v1::Draining> draining_in) {
  const auto keep_alive = std::move(self);
  const std::shared_ptr<Link> from = std::move(from_in);
  FailoverEvent event = std::move(event_in);
  const std::optional<v1::Draining> draining = std::move(draining_in);
  moving_ = true;
  auto reached = co_await runLifecycle(
      LinkLifecycle::move(options_.endpoints, from->endpoint, draining.has_value(),
                          options_.failover_timeout, backoff()),
      nullptr);
  if (closing_) {
    moving_ = false;
    moved_.notify();
    co_return;
  }
  if (!reached.ok()) {
    moving_ = false;
    moved_.notify();
    if (draining && from->lost.ok()) {
      // No other agent: stay with the draining one while it lasts.
      if (on_draining_) on_draining_(*draining);
      co_return;
    }
    // The lifecycle's failure names each endpoint of the last round.
    const std::string failures(reached.status().message());
    sessionLost(protoError(v1::AGENT_LOST,
                           absl::StrCat(from->lost.message(), "; no other agent answered",
                                        failures.empty() ? "" : ": ", failures)));
    co_return;
  }
  const std::shared_ptr<Link> next = std::move(reached->link);
  next->resubscribing = true;
  link_ = next;
  start(next, std::move(reached->socket), std::move(reached->leftover));
  if (draining) {
    from->retiring = true;
    retiring_.push_back(from);
  }
  ++failovers_;
  event.to = next->endpoint;
  // The subscriptions, again, under their ids.
  std::vector<uint64_t> ids;
  for (const auto& [id, sub] : subscriptions_) {
    if (!sub.agents.empty()) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    auto it = subscriptions_.find(id);
    if (it == subscriptions_.end()) continue;  // unsubscribed meanwhile
    v1::Request request = it->second.request;
    it->second.agents.clear();  // gone until the new agent says otherwise
    auto r = co_await callOn(next, std::move(request), options_.handshake_timeout,
                             /*subscription=*/id);
    event.subscriptions.emplace_back(id, r.ok() ? absl::OkStatus() : r.status());
  }
  next->resubscribing = false;
  // Streams of the new subscriptions that came before the answers.
  auto parked = std::move(next->parked);
  next->parked.clear();
  for (auto& [stream, open] : parked) handOver(*next, std::move(stream), std::move(open));
  moving_ = false;
  moved_.notify();
  if (on_failover_) on_failover_(event);
  if (!next->lost.ok() && link_ == next && !closing_ && lost_.ok()) {
    // The new agent went too, while we were busy: move on again.
    moveOn(next, std::string(next->lost.message()), next->openStreams(), 0);
  }
}

void Client::sessionLost(const absl::Status& why) {
  if (!lost_.ok()) return;
  lost_ = errorCodeOf(why) == v1::AGENT_LOST || errorCodeOf(why) == v1::CANCELLED
              ? why
              : protoError(v1::AGENT_LOST, sv(why.message()));
  if (link_) link_->failAll(lost_);
  for (auto& weak : retiring_) {
    if (auto l = weak.lock()) l->failAll(lost_);
  }
  for (auto& l : replicas_) l->failAll(lost_);
  moved_.notify();
  if (on_lost_ && !closing_) {
    // Moved out first: the handler may drop the last reference to its owner.
    auto handler = std::move(on_lost_);
    handler(lost_);
  }
  releaseHandlers();
}

void Client::releaseHandlers() {
  // No event can come any more. A handler often holds what holds this
  // client (the acceptor keeps the streams it was given, and each stream
  // keeps its client): dropping them ends that cycle with the session.
  // They are destroyed on the loop, not here, because one of them may be
  // the caller (a draining handler that closes the client).
  asio::post(ex_, [acceptor = std::exchange(acceptor_, nullptr),
                   on_draining = std::exchange(on_draining_, nullptr),
                   on_notice = std::exchange(on_notice_, nullptr),
                   on_target_restarted = std::exchange(on_target_restarted_, nullptr),
                   on_file_events = std::exchange(on_file_events_, nullptr),
                   on_lost = std::exchange(on_lost_, nullptr),
                   on_failover = std::exchange(on_failover_, nullptr),
                   on_resumed = std::exchange(on_resumed_, nullptr),
                   on_replica = std::exchange(on_replica_, nullptr)] {});
}

net::awaitable<bool> Client::waitForMove(std::chrono::steady_clock::time_point deadline) {
  while (moving_ && lost_.ok() && steady_timer::clock_type::now() < deadline) {
    co_await moved_.wait(deadline);
  }
  co_return !moving_;
}

}  // namespace siphon::client
