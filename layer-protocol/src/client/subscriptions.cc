// The typed steal and mirror subscriptions (siphon/client/subscriptions.h).
// The streams and news reach a SubscriptionState through TargetCore
// (target.cc); a Subscription takes them in order.
#include "siphon/client/subscriptions.h"

#include "absl/strings/str_cat.h"
#include "client/target_core.h"
#include "siphon/status.h"

namespace siphon::client {

// What a Subscription object holds: the core (so the routing outlives the
// Target object) and the state. Dropping the last one abandons the state:
// streams queued for it are reset, later ones too.
struct SubscriptionOwner {
  std::shared_ptr<TargetCore> core;
  std::shared_ptr<SubscriptionState> state;
  ~SubscriptionOwner() {
    state->abandoned = true;
    for (auto& s : state->streams) {
      if (s) s->reset(v1::CANCELLED, "nobody takes this subscription's streams any more");
    }
    state->streams.clear();
    state->events.clear();
  }
};

Subscription::Subscription(std::shared_ptr<SubscriptionOwner> owner)
    : state_owner_(std::move(owner)), state_(state_owner_->state) {}

uint64_t Subscription::id() const { return state_ ? state_->id : 0; }

const std::string& Subscription::backend() const {
  static const std::string kNone;
  return state_ ? state_->backend : kNone;
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
    // Accepted as it is handed out: its bytes flow from now on.
    absl::Status accepted = owner->core->client->acceptStream(*stream);
    if (!accepted.ok()) co_return accepted;
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
  if (!r.ok() && errorCodeOf(r.status()) != v1::NOT_FOUND) co_return r.status();
  state->ended =
      protoError(v1::CANCELLED, absl::StrCat("subscription ", state->id, " unsubscribed"));
  for (auto& s : state->streams) {
    if (s) s->reset(v1::CANCELLED, "unsubscribed");
  }
  state->streams.clear();
  state->events.clear();
  state->wake.notify();
  core->subscriptions.erase(state->id);
  co_return absl::OkStatus();
}

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
