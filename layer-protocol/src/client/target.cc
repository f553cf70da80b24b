// The typed API's Target: a Client, its events as LinkEvents, info and
// sessions, and the routing of subscription streams (target_core.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/target_core.h"
#include "siphon/client/errors.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"

namespace siphon::client {

// The typed codes are the wire's, number for number.
static_assert(static_cast<int>(ErrorCode::kSessionBufferFull) == v1::SESSION_BUFFER_FULL);
static_assert(static_cast<int>(ErrorCode::kErrno) == v1::ERRNO);
static_assert(static_cast<int>(ErrorCode::kAgentLost) == v1::AGENT_LOST);

ErrorCode errorCode(const absl::Status& status) {
  if (status.ok()) return ErrorCode::kOk;
  return static_cast<ErrorCode>(errorCodeOf(status));
}

int errnoValue(const absl::Status& status) { return errnoOf(status); }

std::string errorName(ErrorCode code) {
  return errorCodeName(static_cast<v1::ErrorCode>(static_cast<int>(code)));
}

std::string targetRestartedText(const LinkEvent& e) {
  return absl::StrCat("the target restarted: pid ", e.previous_pid, " -> ", e.pid,
                      e.reason.empty() ? "" : absl::StrCat(" (container ", e.reason, ")"),
                      ", down ", e.down_ms, " ms, restart ", e.restarts,
                      "; sessions, steals and mirrors go on");
}

std::string SocketAddress::text() const {
  if (ip.find(':') != std::string::npos) return absl::StrCat("[", ip, "]:", port);
  return absl::StrCat(ip, ":", port);
}

SocketAddress fromProto(const v1::SocketAddress& a) {
  return SocketAddress{a.ip(), static_cast<uint16_t>(a.port())};
}

v1::SocketAddress toProto(const SocketAddress& a) {
  v1::SocketAddress out;
  out.set_ip(a.ip);
  out.set_port(a.port);
  return out;
}

absl::Status wrongKind(std::string_view what) {
  return protoError(v1::INTERNAL,
                    absl::StrCat(asv(what), ": the agent answered with another kind of response"));
}

namespace {

// Repeated enums keep values this build does not know (proto3): those are
// named by their number rather than Feature_Name()'s empty string.
std::string featureName(int feature) {
  if (!v1::Feature_IsValid(feature) || feature == v1::FEATURE_UNSPECIFIED) {
    return absl::StrCat("UNKNOWN_", feature);
  }
  return v1::Feature_Name(static_cast<v1::Feature>(feature));
}

}  // namespace

// ------------------------------------------------------------- TargetCore

TargetCore::TargetCore(std::shared_ptr<Client> c) : client(std::move(c)), ex(client->executor()) {}

void TargetCore::install() {
  std::weak_ptr<TargetCore> weak = weak_from_this();
  client->setStreamAcceptor([weak](std::shared_ptr<ClientStream> stream, v1::StreamOpen open) {
    if (auto core = weak.lock()) {
      core->onStream(std::move(stream), std::move(open));
    } else {
      stream->reset(v1::UNIMPLEMENTED, "this client accepts no streams");
    }
  });
  client->setFailoverHandler([weak](const FailoverEvent& e) {
    if (auto core = weak.lock()) core->onFailover(e);
  });
  client->setDrainingHandler([weak](const v1::Draining& d) {
    if (auto core = weak.lock()) core->onDraining(d);
  });
  client->setLostHandler([weak](const absl::Status& s) {
    if (auto core = weak.lock()) core->onLost(s);
  });
  client->setResumedHandler([weak](const absl::Status& s) {
    if (auto core = weak.lock()) core->onResumed(s);
  });
  client->setTargetRestartedHandler([weak](const v1::TargetRestarted& r) {
    if (auto core = weak.lock()) core->onTargetRestarted(r);
  });
  client->setNoticeHandler([weak](const v1::SubscriptionNotice& n) {
    if (auto core = weak.lock()) core->onNotice(n);
  });
  client->setFileEventsHandler([weak](const v1::FileEvents& e) {
    if (auto core = weak.lock()) core->onFileEvents(e);
  });
}

net::awaitable<absl::StatusOr<v1::Response>> TargetCore::call(
    v1::Request request, std::shared_ptr<protocol::PipedBytes>* piped) {
  const std::shared_ptr<Client> c = client;
  co_return co_await c->call(std::move(request), timeout, piped);
}

std::shared_ptr<SubscriptionState> TargetCore::subscription(uint64_t id) {
  auto& s = subscriptions[id];
  if (!s) {
    s = std::make_shared<SubscriptionState>(ex);
    s->id = id;
  }
  return s;
}

void TargetCore::push(SubscriptionState& s, SubscriptionEvent event,
                      std::shared_ptr<ClientStream> stream) {
  if (!s.ended.ok() || s.abandoned) {
    if (stream) stream->reset(v1::CANCELLED, "the subscription is over");
    return;
  }
  s.events.push_back(std::move(event));
  s.streams.push_back(std::move(stream));
  s.wake.notify();
}

void TargetCore::onStream(std::shared_ptr<ClientStream> stream, v1::StreamOpen open) {
  uint64_t id = 0;
  SubscriptionEvent event;
  if (open.has_stolen()) {
    id = open.stolen().subscription_id();
    event.kind = SubscriptionEvent::Kind::kConnection;
    event.source = fromProto(open.stolen().source());
    event.destination = fromProto(open.stolen().destination());
    event.connection =
        makeConnection(Connection::Kind::kStolen, stream, event.destination, event.source);
  } else if (open.has_stolen_request()) {
    const v1::StolenRequest& r = open.stolen_request();
    id = r.subscription_id();
    event.kind = SubscriptionEvent::Kind::kRequest;
    event.source = fromProto(r.source());
    event.destination = fromProto(r.destination());
    event.request = StolenRequestInfo{r.protocol(), r.method(), r.path(), r.connection_request()};
    event.connection =
        makeConnection(Connection::Kind::kStolen, stream, event.destination, event.source);
  } else if (open.has_mirrored()) {
    const v1::MirroredConnection& m = open.mirrored();
    id = m.subscription_id();
    event.kind = SubscriptionEvent::Kind::kMirrored;
    event.source = fromProto(m.source());
    event.destination = fromProto(m.destination());
    setMirrored(event.mirrored, stream, event.source, event.destination, m.started_mid_stream());
  }
  if (id == 0) {
    stream->reset(v1::UNIMPLEMENTED, "this client accepts no such stream");
    return;
  }
  auto s = subscription(id);
  if (s->abandoned) {
    stream->reset(v1::CANCELLED, "nobody takes this subscription's streams any more");
    return;
  }
  push(*s, std::move(event), std::move(stream));
}

void TargetCore::onFailover(const FailoverEvent& e) {
  LinkEvent link;
  link.kind = LinkEvent::Kind::kMoved;
  link.from = e.from;
  link.to = e.to;
  link.reason = e.reason;
  link.draining = e.draining;
  link.streams = e.streams;
  link.requests_failed = e.requests_failed;
  for (const auto& [id, status] : e.subscriptions) {
    auto it = subscriptions.find(id);
    if (it == subscriptions.end()) continue;
    SubscriptionEvent moved;
    moved.kind = SubscriptionEvent::Kind::kMoved;
    moved.status = status;
    moved.text =
        status.ok() ? absl::StrCat("made again on the agent at ", e.to)
                    : absl::StrCat("not made again on the agent at ", e.to, ": ", status.message());
    push(*it->second, std::move(moved));
    if (!status.ok()) it->second->ended = status;
  }
  if (on_file_changes) {
    // The old session's watches stayed with it.
    FileChanges lost;
    lost.watches_lost = true;
    on_file_changes(lost);
  }
  emit(link);
}

void TargetCore::onDraining(const v1::Draining& d) {
  LinkEvent link;
  link.kind = LinkEvent::Kind::kDraining;
  link.deadline_unix_ms = d.deadline_unix_ms();
  link.reason = d.reason();
  for (auto& [id, s] : subscriptions) {
    SubscriptionEvent draining;
    draining.kind = SubscriptionEvent::Kind::kDraining;
    draining.text = absl::StrCat("the agent drains (", d.reason(), ")");
    push(*s, std::move(draining));
  }
  emit(link);
}

void TargetCore::onTargetRestarted(const v1::TargetRestarted& r) {
  LinkEvent link;
  link.kind = LinkEvent::Kind::kTargetRestarted;
  link.pid = r.target().pid();
  link.previous_pid = r.previous_pid();
  link.restarts = r.restarts();
  link.down_ms = r.down_ms();
  link.reason = r.target().container_id();
  const std::string text = targetRestartedText(link);
  for (auto& [id, s] : subscriptions) {
    SubscriptionEvent restarted;
    restarted.kind = SubscriptionEvent::Kind::kTargetRestarted;
    restarted.text = text;
    push(*s, std::move(restarted));
  }
  if (on_file_changes) {
    // The agent's watches watch the old root's files: as good as gone, and
    // every file may differ in the new root (a mount drops its caches).
    FileChanges lost;
    lost.watches_lost = true;
    on_file_changes(lost);
  }
  emit(link);
}

void TargetCore::onLost(const absl::Status& why) {
  for (auto& [id, s] : subscriptions) {
    SubscriptionEvent lost;
    lost.kind = SubscriptionEvent::Kind::kLost;
    lost.status = why;
    push(*s, std::move(lost));
    s->ended = why;
  }
  LinkEvent link;
  link.kind = LinkEvent::Kind::kLost;
  link.status = why;
  emit(link);
}

void TargetCore::onResumed(const absl::Status& why) {
  LinkEvent link;
  link.kind = LinkEvent::Kind::kResumed;
  link.status = why;
  emit(link);
}

void TargetCore::onNotice(const v1::SubscriptionNotice& n) {
  auto it = subscriptions.find(n.subscription_id());
  if (it == subscriptions.end() || !n.has_overlap()) return;
  const v1::FilterOverlap& o = n.overlap();
  SubscriptionEvent overlap;
  overlap.kind = SubscriptionEvent::Kind::kOverlap;
  overlap.overlap =
      FilterOverlap{o.taken_by(), o.taken_by_client(), o.requests(), o.method(), o.path()};
  overlap.text = absl::StrCat(o.requests(), " request(s) this filter matched (first ", o.method(),
                              " ", o.path(), ") went to the earlier subscription ", o.taken_by(),
                              o.taken_by_client().empty() ? "" : " of ", o.taken_by_client());
  push(*it->second, std::move(overlap));
}

void TargetCore::onFileEvents(const v1::FileEvents& e) {
  if (!on_file_changes) return;
  FileChanges out;
  out.overflow = e.overflow();
  out.changes.reserve(static_cast<size_t>(e.events_size()));
  for (const v1::FileEvent& f : e.events()) {
    out.changes.push_back(FileChange{f.watch(), f.name(), f.content(), f.attributes(), f.created(),
                                     f.removed(), f.watch_ended()});
  }
  on_file_changes(out);
}

// ----------------------------------------------------------------- Target

Target Target::create(net::asio::any_io_executor ex, TargetOptions o) {
  ClientOptions c;
  c.endpoints = std::move(o.endpoints);
  c.token = std::move(o.token);
  c.client_name = std::move(o.client_name);
  c.connect_timeout = o.connect_timeout;
  c.handshake_timeout = o.handshake_timeout;
  c.reconnect = o.reconnect;
  c.failover = o.failover;
  c.failover_timeout = o.failover_timeout;
  c.tls_ca = std::move(o.tls_ca);
  c.tls_cert = std::move(o.tls_cert);
  c.tls_key = std::move(o.tls_key);
  c.tls_server_name = std::move(o.tls_server_name);
  Target target = over(Client::create(std::move(ex), std::move(c)));
  target.setCallTimeout(o.call_timeout);
  return target;
}

Target Target::over(std::shared_ptr<Client> client) {
  auto core = std::make_shared<TargetCore>(std::move(client));
  core->install();
  return Target(std::move(core));
}

net::awaitable<absl::Status> Target::connect() {
  const std::shared_ptr<TargetCore> core = core_;
  co_return co_await core->client->connect();
}

void Target::close() { core_->client->close(); }

void Target::setEventHandler(std::function<void(const LinkEvent&)> handler) {
  core_->on_event = std::move(handler);
}

absl::Status Target::lostStatus() const { return core_->client->lostStatus(); }

std::string Target::endpoint() const { return core_->client->endpoint(); }

void Target::setCallTimeout(std::chrono::milliseconds timeout) { core_->timeout = timeout; }

std::shared_ptr<Client> Target::client() const { return core_->client; }

net::awaitable<absl::StatusOr<TargetInfo>> Target::info() const {
  const std::shared_ptr<TargetCore> core = core_;
  v1::Request request;
  request.mutable_info();
  auto r = co_await core->call(std::move(request));
  if (!r.ok()) co_return r.status();
  if (!r->has_info()) co_return wrongKind("info");
  const v1::InfoResponse& i = r->info();
  TargetInfo out;
  out.agent_version = i.agent_version();
  out.protocol_version = protocol::versionString(i.protocol_version());
  out.session_id = i.session_id();
  out.hostname = i.hostname();
  out.mode = i.target().mode();
  out.pid = i.target().pid();
  out.netns_inode = i.target().netns_inode();
  out.container_id = i.target().container_id();
  out.runtime = i.target().runtime();
  out.sessions = i.sessions();
  out.uptime_ms = i.uptime_ms();
  for (int f : i.features()) out.features.push_back(featureName(f));
  co_return out;
}

net::awaitable<absl::StatusOr<std::vector<SessionInfo>>> Target::sessions() const {
  const std::shared_ptr<TargetCore> core = core_;
  v1::Request request;
  request.mutable_sessions();
  auto r = co_await core->call(std::move(request));
  if (!r.ok()) co_return r.status();
  if (!r->has_sessions()) co_return wrongKind("sessions");
  std::vector<SessionInfo> out;
  for (const v1::SessionSummary& s : r->sessions().sessions()) {
    SessionInfo info;
    info.session_id = s.session_id();
    info.client_name = s.client_name();
    // Agents before `state` said only `attached`.
    info.state = !s.state().empty() ? s.state() : s.attached() ? "attached" : "detached";
    info.age_ms = s.age_ms();
    info.handovers = s.handovers();
    info.current = s.current();
    info.streams = s.streams();
    info.bytes_in = s.bytes_in();
    info.bytes_out = s.bytes_out();
    info.stolen_ports.assign(s.stolen_ports().begin(), s.stolen_ports().end());
    info.mirrored_ports.assign(s.mirrored_ports().begin(), s.mirrored_ports().end());
    for (const v1::SubscriptionSummary& sub : s.subscriptions()) {
      info.subscriptions.push_back({sub.subscription_id(), sub.kind(), sub.port(), sub.filter(),
                                    sub.backend(), sub.both_directions()});
    }
    out.push_back(std::move(info));
  }
  co_return out;
}

}  // namespace siphon::client
