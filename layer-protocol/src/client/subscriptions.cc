// The typed steal and mirror subscriptions (siphon/client/subscriptions.h).
// The streams and news reach a SubscriptionState through TargetCore
// (target.cc); a Subscription takes them in order.
#include "siphon/client/subscriptions.h"

#include "absl/strings/str_cat.h"
#include "client/target_core.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::client {

namespace {

// A dropped subscription's Unsubscribe: nobody waits for its answer. A
// failure (the session is gone, or the agent forgot the subscription
// already) leaves nothing to undo.
net::awaitable<void> unsubscribeDropped(std::shared_ptr<TargetCore> core_in, uint64_t id) {
  const std::shared_ptr<TargetCore> core = std::move(core_in);
  v1::Request request;
  request.mutable_unsubscribe()->set_subscription_id(id);
  (void)co_await core->call(std::move(request));
  // Kept (abandoned) until now, so that its late streams are reset.
  core->subscriptions.erase(id);
}

// Over: no more events; the streams still queued are reset.
void endState(SubscriptionState& state, absl::Status why, std::string_view reset_why) {
  state.ended = std::move(why);
  for (auto& s : state.streams) {
    if (s) s->reset(v1::CANCELLED, reset_why);
  }
  state.streams.clear();
  state.events.clear();
  state.wake.notify();
}

}  // namespace

// What a Subscription object holds: the core (so the routing outlives the
// Target object) and the state. Dropping the last one abandons the state
// (streams queued for it are reset, later ones too) and, while the
// subscription holds, unsubscribes on the agent: a program that lets go of
// its Subscription must not leave the port stolen for the session's life.
struct SubscriptionOwner {
  std::shared_ptr<TargetCore> core;
  std::shared_ptr<SubscriptionState> state;
  ~SubscriptionOwner() {
    state->abandoned = true;
    const bool holds = state->ended.ok();
    endState(*state,
             protoError(v1::CANCELLED, absl::StrCat("subscription ", state->id, " dropped")),
             "nobody takes this subscription's streams any more");
    if (!holds || !core->client->lostStatus().ok()) return;
    net::spawn(core->ex, unsubscribeDropped(core, state->id), "unsubscribe_dropped");
  }
};

Subscription::Subscription(std::shared_ptr<SubscriptionOwner> owner)
    : state_owner_(std::move(owner)), state_(state_owner_->state) {}

uint64_t Subscription::id() const { return state_ ? state_->id : 0; }

const std::string& Subscription::backend() const {
  static const std::string kNone;
  return state_ ? state_->backend : kNone;
}

absl::Status Subscription::status() const {
  if (!state_) return protoError(v1::FAILED_PRECONDITION, "no subscription");
  return state_->ended;
}

net::awaitable<absl::StatusOr<SubscriptionEvent>> Subscription::next() {
  const auto state = state_;
  const auto owner = state_owner_;
  if (!state) co_return protoError(v1::FAILED_PRECONDITION, "no subscription");
  while (state->events.empty()) {
    if (!state->ended.ok()) co_return state->ended;
    co_await state->wake.wait();
  }
  SubscriptionEvent event = std::move(state->events.front());
  std::shared_ptr<ClientStream> stream = std::move(state->streams.front());
  state->events.pop_front();
  state->streams.pop_front();
  if (stream) {
    // Accepted as it is handed out: its bytes flow from now on. A stream
    // the agent ended meanwhile (its client went away) is handed out all
    // the same: its own reads and writes say so, and the subscription goes
    // on.
    absl::Status accepted = owner->core->client->acceptStream(*stream);
    if (!accepted.ok()) {
      stream->reset(v1::CANCELLED, absl::StrCat("not accepted: ", accepted.message()));
    }
  }
  co_return event;
}

net::awaitable<absl::Status> Subscription::unsubscribe() {
  const auto state = state_;
  const auto owner = state_owner_;
  if (!state) co_return protoError(v1::FAILED_PRECONDITION, "no subscription");
  if (!state->ended.ok()) co_return absl::OkStatus();
  const std::shared_ptr<TargetCore> core = owner->core;
  v1::Request request;
  request.mutable_unsubscribe()->set_subscription_id(state->id);
  auto r = co_await core->call(std::move(request));
  // Over here whatever the agent answered: the program asked to stop, and
  // a next() waiting must not wait for ever on a subscription nobody takes.
  endState(*state,
           protoError(v1::CANCELLED, absl::StrCat("subscription ", state->id, " unsubscribed")),
           "unsubscribed");
  core->subscriptions.erase(state->id);
  if (!r.ok() && errorCodeOf(r.status()) != v1::NOT_FOUND) co_return r.status();
  co_return absl::OkStatus();
}

// The notices of a subscription (a filter's overlap) come through the
// Target's own notice handler (TargetCore::onNotice, target.cc).
Subscriptions::Subscriptions(const Target& target) : core_(target.core()) {}

namespace {

net::awaitable<absl::StatusOr<std::shared_ptr<SubscriptionOwner>>> subscribe(
    std::shared_ptr<TargetCore> core_in, v1::Request request) {
  const std::shared_ptr<TargetCore> core = std::move(core_in);
  auto r = co_await core->call(std::move(request));
  if (!r.ok()) co_return r.status();
  if (!r->has_subscribed()) co_return wrongKind("subscribe");
  // Streams of it may have come already: they wait in its state.
  auto owner = std::make_shared<SubscriptionOwner>();
  owner->core = core;
  owner->state = core->subscription(r->subscribed().subscription_id());
  owner->state->backend = r->subscribed().backend();
  owner->state->claimed = true;
  co_return owner;
}

}  // namespace

net::awaitable<absl::StatusOr<Subscription>> Subscriptions::steal(StealSpec spec) {
  v1::Request request;
  v1::StealSubscribe* s = request.mutable_steal();
  s->set_port(spec.port);
  s->set_flush_connections(spec.flush_connections);
  if (spec.filter) {
    v1::HttpFilter* f = s->mutable_http_filter();
    for (auto& [name, regex] : spec.filter->headers) {
      v1::HeaderFilter* h = f->add_headers();
      h->set_name(name);
      h->set_value_regex(regex);
    }
    f->set_path_regex(spec.filter->path_regex);
    f->set_method(spec.filter->method);
    f->set_match_any(spec.filter->match_any);
  }
  auto owner = co_await subscribe(core_, std::move(request));
  if (!owner.ok()) co_return owner.status();
  co_return Subscription(std::move(*owner));
}

net::awaitable<absl::StatusOr<Subscription>> Subscriptions::mirror(MirrorSpec spec) {
  v1::Request request;
  request.mutable_mirror()->set_port(spec.port);
  request.mutable_mirror()->set_both_directions(spec.both_directions);
  auto owner = co_await subscribe(core_, std::move(request));
  if (!owner.ok()) co_return owner.status();
  co_return Subscription(std::move(*owner));
}

}  // namespace siphon::client
