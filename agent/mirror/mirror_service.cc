// The mirror service: subscriptions of sessions to mirrored ports, and the
// fan-out of each mirrored connection to every subscribed session as its
// own stream, with a per-copy budget and explicit gaps. Over 600 lines
// because one class owns the subscriptions and the connections they see
// (the event loop and the strand share it; see the sections below); the
// capture itself is mirror_engine.cc, reassembly reassembly.cc.
#include "agent/mirror/mirror_service.h"

#include <cerrno>
#include <deque>
#include <future>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "siphon/status.h"

namespace siphon::agent::mirror {
namespace {

namespace asio = net::asio;

// A record is at most this (the Data frame of one record must fit the
// client's window with room to spare: credit returns in quarter steps).
constexpr size_t kMaxRecord = 32 * 1024 + 1;

v1::SocketAddress toProto(const Endpoint& e) {
  v1::SocketAddress a;
  a.set_ip(e.address.toString());
  a.set_port(e.port);
  return a;
}

v1::Direction toProto(Direction d) {
  return d == Direction::kClientToServer ? v1::CLIENT_TO_SERVER : v1::SERVER_TO_CLIENT;
}

v1::Error closeError(CloseReason reason) {
  switch (reason) {
    case CloseReason::kReset: {
      v1::Error e = toProtoError(errnoStatus(ECONNRESET, "mirrored connection reset"));
      return e;
    }
    case CloseReason::kIdle:
      return toProtoError(protoError(v1::TIMEOUT, "mirrored connection idle too long"));
    case CloseReason::kEvicted:
      return toProtoError(protoError(
          v1::RESOURCE_EXHAUSTED, "mirror: connection table full; least recently active dropped"));
    case CloseReason::kReplaced:
      return toProtoError(
          protoError(v1::CANCELLED, "mirrored connection replaced by a new one on its addresses"));
    case CloseReason::kShutdown:
    case CloseReason::kFin:
      break;
  }
  return toProtoError(protoError(v1::CANCELLED, "mirror of this port stopped"));
}

// ---- handover: the capture's state as handover.proto carries it ----

v1::MirrorEndpointExport toExport(const Endpoint& e) {
  v1::MirrorEndpointExport out;
  out.set_family(e.address.family);
  out.set_address(std::string(e.address.bytes.begin(), e.address.bytes.end()));
  out.set_port(e.port);
  return out;
}

absl::StatusOr<Endpoint> fromExport(const v1::MirrorEndpointExport& in) {
  if ((in.family() != 4 && in.family() != 6) || in.address().size() != 16 || in.port() > 65535) {
    return absl::InvalidArgumentError("mirror: a malformed connection endpoint");
  }
  Endpoint e;
  e.address.family = static_cast<uint8_t>(in.family());
  std::copy(in.address().begin(), in.address().end(), e.address.bytes.begin());
  e.port = static_cast<uint16_t>(in.port());
  return e;
}

void toExport(const StreamSnapshot& s, v1::MirrorDirectionExport* out) {
  out->set_started(s.started);
  out->set_mid_stream(s.mid_stream);
  out->set_ended(s.ended);
  out->set_has_isn(s.isn.has_value());
  out->set_isn(s.isn.value_or(0));
  out->set_next_seq(s.next_seq);
  for (const auto& [seq, bytes] : s.pending) {
    v1::MirrorChunkExport* c = out->add_pending();
    c->set_seq(seq);
    c->set_bytes(bytes);
  }
  out->set_has_fin(s.fin_seq.has_value());
  out->set_fin_seq(s.fin_seq.value_or(0));
}

StreamSnapshot fromExport(const v1::MirrorDirectionExport& in) {
  StreamSnapshot s;
  s.started = in.started();
  s.mid_stream = in.mid_stream();
  s.ended = in.ended();
  if (in.has_isn()) s.isn = in.isn();
  s.next_seq = in.next_seq();
  for (const v1::MirrorChunkExport& c : in.pending()) s.pending.emplace_back(c.seq(), c.bytes());
  if (in.has_fin()) s.fin_seq = in.fin_seq();
  return s;
}

// What one subscription holds across its streams.
struct Budget {
  size_t limit = 0;
  size_t queued = 0;
};

// The agent side of one mirrored stream: sends records within credit,
// queues within the subscription's budget, turns the rest into gaps.
class MirrorStream final : public StreamEndpoint,
                           public std::enable_shared_from_this<MirrorStream> {
 public:
  MirrorStream(std::weak_ptr<SessionHost> session, uint64_t id, std::shared_ptr<Budget> budget,
               MirrorServiceStats& stats)
      : session_(std::move(session)), id_(id), budget_(std::move(budget)), stats_(stats) {}

  ~MirrorStream() override { budget_->queued -= queued_; }

  bool dead() const { return dead_; }

  // Handover: the stream as it stands (frozen), and the same on the new
  // agent (its queue counted in the subscription's budget again).
  void exportTo(v1::MirrorStreamExport* out) const {
    out->set_stream_id(id_);
    out->set_dead(dead_);
    out->set_accepted(accepted_);
    out->set_finishing(finishing_);
    out->set_half_closed(half_closed_);
    out->set_client_closed(client_closed_);
    out->set_max_record(static_cast<uint32_t>(max_record_));
    for (const Item& item : queue_) {
      v1::MirrorQueuedExport* q = out->add_queue();
      q->set_kind(static_cast<uint32_t>(item.kind));
      q->set_record(item.record);
      q->set_direction(item.direction == Direction::kServerToClient ? 1 : 0);
      q->set_gap(item.gap);
      if (item.kind == Item::kReset) *q->mutable_error() = item.error;
    }
  }
  void restoreFrom(const v1::MirrorStreamExport& in) {
    dead_ = in.dead();
    accepted_ = in.accepted();
    finishing_ = in.finishing();
    half_closed_ = in.half_closed();
    client_closed_ = in.client_closed();
    if (in.max_record() >= 2) max_record_ = std::min<size_t>(in.max_record(), kMaxRecord);
    for (const v1::MirrorQueuedExport& q : in.queue()) {
      Item item;
      item.kind = static_cast<Item::Kind>(std::min<uint32_t>(q.kind(), Item::kReset));
      item.record = q.record();
      item.direction = q.direction() == 1 ? Direction::kServerToClient : Direction::kClientToServer;
      item.gap = q.gap();
      item.error = q.error();
      if (item.kind == Item::kRecord) {
        queued_ += item.record.size();
        budget_->queued += item.record.size();
      }
      queue_.push_back(std::move(item));
    }
  }

  // `record` starts with the direction byte.
  void pushRecord(std::string record, Direction direction) {
    if (dead_ || finishing_) return;
    if (record.size() > max_record_) {
      // Split so every frame fits the client's window.
      const char dir = record[0];
      std::string_view rest(record);
      rest.remove_prefix(1);
      while (!rest.empty()) {
        const size_t n = std::min(rest.size(), max_record_ - 1);
        std::string part;
        part.reserve(n + 1);
        part.push_back(dir);
        part.append(rest.substr(0, n));
        pushOne(std::move(part), direction);
        rest.remove_prefix(n);
      }
      return;
    }
    pushOne(std::move(record), direction);
  }

  void pushGap(Direction direction, uint64_t bytes) {
    if (dead_ || finishing_ || bytes == 0) return;
    addGap(direction, bytes);
    flush();
  }

  // Ends the stream once everything queued went: HalfClose, or Reset.
  void pushEnd(std::optional<v1::Error> error) {
    if (dead_ || finishing_) return;
    finishing_ = true;
    Item item;
    item.kind = error ? Item::kReset : Item::kHalfClose;
    if (error) item.error = std::move(*error);
    queue_.push_back(std::move(item));
    flush();
  }

  // Now, without waiting for the queue (unsubscribe, drain). What the
  // queue still held (the client had not given credit for it, or had not
  // accepted the stream yet) is counted in the reset's message and in the
  // gaps, so that no mirrored byte goes unreported.
  void resetNow(const v1::Error& error) {
    if (dead_) return;
    const auto self = shared_from_this();  // unregistering may drop the last other owner
    auto s = session_.lock();
    uint64_t undelivered = 0;
    for (const Item& item : queue_) {
      if (item.kind == Item::kRecord) undelivered += item.record.size() - 1;
      if (item.kind == Item::kGap) undelivered += item.gap;
    }
    die();
    if (!s || s->ended()) return;
    v1::Error told = error;
    if (undelivered > 0) {
      told.set_message(
          absl::StrCat(error.message(), " (", undelivered, " mirrored bytes not delivered)"));
      stats_.gap_bytes += undelivered;
      ++stats_.gaps;
    }
    s->resetStream(id_, told);
    s->unregisterStream(id_);
    s->wake();
  }

  // ---- StreamEndpoint ----

  void onData(std::string_view payload) override {
    // Read-only: what the client sends is dropped, its credit returned.
    if (auto s = session_.lock()) s->session().consumed(id_, payload.size());
  }
  void onHalfClose() override {
    client_closed_ = true;
    if (half_closed_) finishOnSession();
  }
  void onReset(const v1::Error&) override { die(); }
  void onWritable() override { flush(); }
  // Handover: the session moves this stream's frames and credit; the
  // mirror service moves the stream itself (its queue).
  void thaw() override { flush(); }
  absl::Status exportState(v1::PumpExport* out, std::vector<UniqueFd>* fds) override {
    (void)fds;
    out->set_stream_id(id_);
    out->set_fd(-1);
    out->set_service("mirror");
    return absl::OkStatus();
  }
  void onAccept(const v1::StreamAccept& accept) override {
    accepted_ = true;
    auto s = session_.lock();
    const uint32_t window = accept.initial_window() != 0
                                ? accept.initial_window()
                                : (s ? s->session().limits().initial_stream_window : 0);
    if (window >= 8) max_record_ = std::min(kMaxRecord, static_cast<size_t>(window / 4 * 3));
    flush();
  }
  void close() override { die(); }

 private:
  struct Item {
    enum Kind { kRecord, kGap, kHalfClose, kReset } kind = kRecord;
    std::string record;
    Direction direction = Direction::kClientToServer;
    uint64_t gap = 0;
    v1::Error error;
  };

  void pushOne(std::string record, Direction direction) {
    if (queue_.empty() && accepted_) {
      auto s = session_.lock();
      if (s && !s->ended() && s->session().sendCredit(id_, record.size()) >= record.size()) {
        send(*s, std::move(record));
        s->wake();
        return;
      }
    }
    if (budget_->queued + record.size() > budget_->limit) {
      addGap(direction, record.size() - 1);  // the bytes, not the direction byte
      return;
    }
    budget_->queued += record.size();
    queued_ += record.size();
    Item item;
    item.kind = Item::kRecord;
    item.direction = direction;
    item.record = std::move(record);
    queue_.push_back(std::move(item));
  }

  void addGap(Direction direction, uint64_t bytes) {
    if (!queue_.empty() && queue_.back().kind == Item::kGap &&
        queue_.back().direction == direction) {
      queue_.back().gap += bytes;
      return;
    }
    Item item;
    item.kind = Item::kGap;
    item.direction = direction;
    item.gap = bytes;
    queue_.push_back(std::move(item));
  }

  void send(SessionHost& s, std::string record) {
    stats_.delivered_bytes += record.size() - 1;
    s.countSent(id_, record.size() - 1);  // the payload, without the direction byte
    absl::Status sent = s.session().sendData(id_, std::move(record));
    if (!sent.ok()) die();
  }

  void flush() {
    if (dead_ || !accepted_) return;
    // The session may hold the only other reference, and this may
    // unregister the stream (a reset, both sides closed).
    const auto self = shared_from_this();
    auto s = session_.lock();
    if (!s || s->ended()) return;
    bool wrote = false;
    while (!queue_.empty() && !dead_) {
      Item& item = queue_.front();
      if (item.kind == Item::kRecord) {
        const size_t n = item.record.size();
        if (s->session().sendCredit(id_, n) < n) break;
        budget_->queued -= n;
        queued_ -= n;
        std::string record = std::move(item.record);
        queue_.pop_front();
        send(*s, std::move(record));
      } else if (item.kind == Item::kGap) {
        const uint64_t bytes = item.gap;
        const Direction direction = item.direction;
        queue_.pop_front();  // `item` is gone from here on
        v1::StreamGap gap;
        gap.set_stream_id(id_);
        gap.set_direction(toProto(direction));
        gap.set_bytes(bytes);
        stats_.gap_bytes += bytes;
        ++stats_.gaps;
        s->countGap(id_, bytes);
        (void)s->session().sendGap(std::move(gap));
      } else if (item.kind == Item::kHalfClose) {
        queue_.pop_front();
        (void)s->session().halfClose(id_);
        half_closed_ = true;
        if (client_closed_) finishOnSession();
      } else {
        v1::Error error = std::move(item.error);
        queue_.pop_front();
        s->resetStream(id_, error);
        s->unregisterStream(id_);
        die();
      }
      wrote = true;
    }
    if (wrote) s->wake();
  }

  // Both sides closed: the session forgot the stream; so do we.
  void finishOnSession() {
    auto self = shared_from_this();  // unregistering drops the session's reference
    if (auto s = session_.lock()) s->unregisterStream(id_);
    die();
  }

  void die() {
    dead_ = true;
    budget_->queued -= queued_;
    queued_ = 0;
    queue_.clear();
  }

  std::weak_ptr<SessionHost> session_;
  uint64_t id_;
  std::shared_ptr<Budget> budget_;
  MirrorServiceStats& stats_;
  std::deque<Item> queue_;
  size_t queued_ = 0;  // record bytes in queue_
  size_t max_record_ = kMaxRecord;
  bool accepted_ = false;
  bool finishing_ = false;  // the end is queued
  bool half_closed_ = false;
  bool client_closed_ = false;
  bool dead_ = false;
};

struct Subscription {
  uint64_t id = 0;
  uint16_t port = 0;
  bool both = false;
  bool active = false;  // the source has the port
  std::string session_id;
  std::weak_ptr<SessionHost> session;
  std::shared_ptr<Budget> budget = std::make_shared<Budget>();
  // Streams of this subscription by connection; a dead one stays until the
  // connection closes so a reset stream is not opened again.
  std::map<uint64_t, std::shared_ptr<MirrorStream>> streams;
};

class MirrorServiceImpl final : public MirrorService,
                                public std::enable_shared_from_this<MirrorServiceImpl> {
 public:
  MirrorServiceImpl(ServiceContext& ctx, MirrorSourceFactory factory, MirrorServiceOptions options)
      : ctx_(ctx),
        factory_(std::move(factory)),
        options_(options),
        strand_(asio::make_strand(ctx.blocking)) {}

  ~MirrorServiceImpl() override {
    // The blocking pool is joined by now: nothing else touches the source.
    source_.reset();
  }

  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    if (request.has_mirror()) {
      subscribe(std::move(session), request.request_id(), request.mirror());
    } else if (request.has_unsubscribe()) {
      unsubscribe(*session, request.request_id(), request.unsubscribe().subscription_id());
    } else {
      session->respondError(request.request_id(),
                            protoError(v1::INTERNAL, "mirror service: unexpected request"));
    }
  }

  bool ownsSubscription(uint64_t id, const std::string& session_id) const override {
    auto it = subs_.find(id);
    return it != subs_.end() && it->second.session_id == session_id;
  }

  void describeSubscriptions(
      const std::string& session_id,
      google::protobuf::RepeatedPtrField<v1::SubscriptionSummary>* out) const override {
    for (const auto& [id, sub] : subs_) {
      if (sub.session_id != session_id) continue;
      v1::SubscriptionSummary& d = *out->Add();
      d.set_subscription_id(id);
      d.set_kind("mirror");
      d.set_port(sub.port);
      d.set_backend("tc");
      d.set_both_directions(sub.both);
    }
  }

  // ---- handover (docs/CONTINUITY.md) ----

  // The capture stops reading once what it read is on its way here: the
  // batches it delivered are run before the export (posted before it).
  void freeze() override {
    frozen_ = true;
    onStrandAndWait([this] {
      if (source_) source_->pause();
      return true;
    });
  }

  void thaw() override {
    if (!frozen_) return;
    frozen_ = false;
    auto self = shared_from_this();
    asio::post(strand_, [self] {
      if (self->source_) self->source_->resume();
    });
  }

  absl::Status exportState(v1::AgentState* out, std::vector<UniqueFd>* fds) override {
    if (subs_.empty()) return absl::OkStatus();
    absl::StatusOr<MirrorEngineState> engine =
        onStrandAndWait([this]() -> absl::StatusOr<MirrorEngineState> {
          if (!source_) return absl::FailedPreconditionError("mirror: no capture runs");
          return source_->exportState();
        });
    if (!engine.ok()) {
      return absl::Status(engine.status().code(),
                          absl::StrCat("mirror: ", engine.status().message()));
    }
    v1::MirrorExport& m = *out->mutable_mirror();
    m.set_ring(-1);
    if (engine->ring.valid()) {
      m.set_ring(static_cast<int32_t>(fds->size()));
      fds->push_back(std::move(engine->ring));
    }
    m.set_next_connection_id(engine->next_connection_id);
    for (const auto& [port, refs] : port_refs_) {
      m.add_ports(port);
      if (!serverToClientWanted(port)) m.add_ports_without_server_bytes(port);
    }
    for (const ConnectionSnapshot& c : engine->connections) {
      v1::MirrorConnectionExport& x = *m.add_connections();
      x.set_id(c.info.id);
      *x.mutable_client() = toExport(c.info.client);
      *x.mutable_server() = toExport(c.info.server);
      x.set_started_mid_stream(c.info.started_mid_stream);
      toExport(c.client_to_server, x.mutable_client_to_server());
      toExport(c.server_to_client, x.mutable_server_to_client());
      x.set_in_service(conns_.contains(c.info.id));
    }
    uint64_t streams = 0;
    for (const auto& [id, sub] : subs_) {
      v1::MirrorSubscriptionExport& x = *m.add_subscriptions();
      x.set_id(id);
      x.set_port(sub.port);
      x.set_both_directions(sub.both);
      x.set_session_id(sub.session_id);
      x.set_budget(sub.budget->limit);
      for (const auto& [conn, stream] : sub.streams) {
        v1::MirrorStreamExport& y = *x.add_streams();
        y.set_connection(conn);
        stream->exportTo(&y);
        ++streams;
      }
    }
    log::info("mirror_exported", {{"subscriptions", static_cast<uint64_t>(subs_.size())},
                                  {"streams", streams},
                                  {"connections", static_cast<uint64_t>(engine->connections.size())}});
    return absl::OkStatus();
  }

  // Before the new agent serves: the subscriptions and their streams as
  // they were, and the capture started beside the old one's (it reads from
  // startAfterHandover()).
  absl::Status importState(
      const v1::AgentState& in, std::vector<UniqueFd>& fds,
      const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) override {
    if (!in.has_mirror() || in.mirror().subscriptions_size() == 0) return absl::OkStatus();
    const v1::MirrorExport& m = in.mirror();
    auto adopted = std::make_shared<MirrorEngineState>();
    adopted->next_connection_id = m.next_connection_id();
    if (m.ring() >= 0) {
      const auto i = static_cast<size_t>(m.ring());
      if (i >= fds.size() || !fds[i].valid()) {
        return absl::InvalidArgumentError("mirror: the capture's ring buffer is missing");
      }
      adopted->ring = std::move(fds[i]);
    }
    for (uint32_t port : m.ports()) adopted->ports.insert(static_cast<uint16_t>(port));
    for (uint32_t port : m.ports_without_server_bytes()) {
      adopted->ports_without_server_bytes.insert(static_cast<uint16_t>(port));
    }
    for (const v1::MirrorConnectionExport& x : m.connections()) {
      ConnectionSnapshot c;
      c.info.id = x.id();
      ASSIGN_OR_RETURN(c.info.client, fromExport(x.client()));
      ASSIGN_OR_RETURN(c.info.server, fromExport(x.server()));
      c.info.started_mid_stream = x.started_mid_stream();
      c.client_to_server = fromExport(x.client_to_server());
      c.server_to_client = fromExport(x.server_to_client());
      if (x.in_service()) conns_[c.info.id] = c.info;
      adopted->connections.push_back(std::move(c));
    }
    for (const v1::MirrorSubscriptionExport& x : m.subscriptions()) {
      auto host = sessions.find(x.session_id());
      if (host == sessions.end() || x.port() == 0 || x.port() > 65535) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mirror subscription ", x.id(), ": its session ", x.session_id(), " did not come"));
      }
      Subscription sub;
      sub.id = x.id();
      sub.port = static_cast<uint16_t>(x.port());
      sub.both = x.both_directions();
      sub.active = true;
      sub.session_id = x.session_id();
      sub.session = host->second;
      sub.budget->limit = x.budget() != 0 ? x.budget() : options_.subscription_buffer;
      for (const v1::MirrorStreamExport& y : x.streams()) {
        auto stream =
            std::make_shared<MirrorStream>(sub.session, y.stream_id(), sub.budget, stats_);
        stream->restoreFrom(y);
        if (!stream->dead() && y.stream_id() != 0) {
          if (!host->second->session().streamOpen(y.stream_id())) {
            return absl::InvalidArgumentError(absl::StrCat(
                "mirror subscription ", x.id(), ": stream ", y.stream_id(), " is not open"));
          }
          host->second->registerStream(y.stream_id(), stream);
        }
        sub.streams[y.connection()] = std::move(stream);
      }
      ++port_refs_[sub.port];
      subs_.emplace(sub.id, std::move(sub));
    }
    // The capture: attached now, beside the old agent's; reading waits for
    // go() (startAfterHandover).
    const uint64_t generation = generation_;
    auto source = factory_(deliverer(generation), adopted);
    if (!source.ok()) {
      return absl::Status(source.status().code(),
                          absl::StrCat("mirror: the capture: ", source.status().message()));
    }
    source_ = std::move(*source);
    source_generation_ = generation;
    log::info("mirror_imported", {{"subscriptions", static_cast<uint64_t>(subs_.size())},
                                  {"connections", static_cast<uint64_t>(adopted->connections.size())}});
    return absl::OkStatus();
  }

  // The old agent let go (it is gone): its ring holds what its capture saw
  // last, read to its end before ours.
  void startAfterHandover() override {
    auto self = shared_from_this();
    asio::post(strand_, [self] {
      if (self->source_) self->source_->go();
    });
  }

  void sessionEnded(const std::string& session_id) override {
    std::vector<uint64_t> ids;
    for (const auto& [id, sub] : subs_) {
      if (sub.session_id == session_id) ids.push_back(id);
    }
    for (uint64_t id : ids) removeSubscription(id, "session ended");
  }

  void agentDraining() override { stopAll("the agent is draining", v1::AGENT_DRAINING); }
  void agentStopping() override { stopAll("the agent is stopping", v1::AGENT_DRAINING); }

  MirrorServiceStats stats() const override { return stats_; }

 private:
  void subscribe(std::shared_ptr<SessionHost> session, uint64_t request_id,
                 const v1::MirrorSubscribe& req) {
    if (req.port() == 0 || req.port() > 65535) {
      session->respondError(
          request_id, protoError(v1::INVALID_ARGUMENT,
                                 absl::StrCat("mirror: port ", req.port(), " is not 1 to 65535")));
      return;
    }
    if (stopping_) {
      session->respondError(
          request_id,
          protoError(v1::AGENT_DRAINING,
                     "mirror: the agent is shutting down; mirror through another agent"));
      return;
    }
    Subscription sub;
    sub.id = ctx_.subscription_ids.next();
    sub.port = static_cast<uint16_t>(req.port());
    sub.both = req.both_directions();
    sub.session_id = session->id();
    sub.session = session;
    sub.budget->limit = options_.subscription_buffer;
    const uint64_t id = sub.id;
    const uint16_t port = sub.port;
    subs_.emplace(id, std::move(sub));
    const bool first_on_port = port_refs_[port]++ == 0;
    const bool s2c = serverToClientWanted(port);
    const uint64_t generation = generation_;
    auto self = shared_from_this();
    std::weak_ptr<SessionHost> weak = session;
    asio::post(strand_, [self, weak, id, port, first_on_port, s2c, request_id, generation] {
      absl::Status s = self->ensureSourceOnStrand(generation);
      if (s.ok() && first_on_port) s = self->source_->addPort(port);
      if (s.ok()) self->source_->setServerToClient(port, s2c);
      // Moved, not copied: a copy would leave this thread to drop its share
      // of the Status while the event loop reads it, a race on the refcount
      // inside Debian's abseil that TSan cannot see is atomic.
      asio::post(self->ctx_.io, [self, weak, id, port, request_id, s = std::move(s)] {
        self->subscribed(weak, id, port, request_id, s);
      });
    });
  }

  void subscribed(std::weak_ptr<SessionHost> weak, uint64_t id, uint16_t port, uint64_t request_id,
                  const absl::Status& status) {
    auto session = weak.lock();
    auto it = subs_.find(id);
    if (!status.ok()) {
      if (it != subs_.end()) removeSubscription(id, "subscribe failed", /*quiet=*/true);
      if (session) session->respondError(request_id, status, absl::StrCat("mirror port ", port));
      log::warn("mirror_subscribe_failed",
                {{"port", static_cast<int>(port)}, {"error", sv(status.message())}});
      return;
    }
    if (it == subs_.end() || !session || session->ended()) return;  // gone meanwhile
    it->second.active = true;
    log::info("mirror_subscribed", {{"session", session->id()},
                                    {"port", static_cast<int>(port)},
                                    {"subscription", id},
                                    {"both_directions", it->second.both}});
    v1::Response r;
    r.set_request_id(request_id);
    r.mutable_subscribed()->set_subscription_id(id);
    r.mutable_subscribed()->set_backend("tc");
    session->respond(std::move(r));
  }

  void unsubscribe(SessionHost& session, uint64_t request_id, uint64_t id) {
    if (!ownsSubscription(id, session.id())) {
      session.respondError(
          request_id,
          protoError(v1::NOT_FOUND, absl::StrCat("no subscription ", id, " in this session")));
      return;
    }
    removeSubscription(id, "unsubscribe");
    v1::Response r;
    r.set_request_id(request_id);
    r.mutable_unsubscribed();
    session.respond(std::move(r));
  }

  void removeSubscription(uint64_t id, std::string_view reason, bool quiet = false) {
    auto it = subs_.find(id);
    if (it == subs_.end()) return;
    Subscription sub = std::move(it->second);
    subs_.erase(it);
    const v1::Error error = toProtoError(
        protoError(v1::CANCELLED, absl::StrCat("mirror stopped: ", std::string(reason))));
    for (auto& [conn, stream] : sub.streams) stream->resetNow(error);
    if (!quiet) {
      log::info("mirror_unsubscribed", {{"session", sub.session_id},
                                        {"port", static_cast<int>(sub.port)},
                                        {"subscription", id},
                                        {"reason", reason}});
    }
    auto ref = port_refs_.find(sub.port);
    if (ref != port_refs_.end() && --ref->second == 0) {
      port_refs_.erase(ref);
      releasePort(sub.port);
    } else if (ref != port_refs_.end() && sub.both && !serverToClientWanted(sub.port)) {
      // The last subscription that wanted the server's bytes went.
      auto self = shared_from_this();
      asio::post(strand_, [self, port = sub.port] {
        if (self->source_) self->source_->setServerToClient(port, false);
      });
    }
  }

  // Whether a subscription of `port` wants its server->client bytes.
  bool serverToClientWanted(uint16_t port) const {
    for (const auto& [id, sub] : subs_) {
      if (sub.port == port && sub.both) return true;
    }
    return false;
  }

  void stopAll(std::string_view why, v1::ErrorCode code) {
    if (stopping_) return;
    stopping_ = true;
    const v1::Error error =
        toProtoError(protoError(code, absl::StrCat("mirror stopped: ", std::string(why))));
    for (auto& [id, sub] : subs_) {
      for (auto& [conn, stream] : sub.streams) stream->resetNow(error);
      sub.streams.clear();
    }
    subs_.clear();
    port_refs_.clear();
    conns_.clear();
    ++generation_;
    auto self = shared_from_this();
    asio::post(strand_, [self] { self->stopSourceOnStrand(); });
  }

  // ---- strand side ----

  // What a source of `generation` hands its batches to (from its thread):
  // they run on the event loop.
  std::function<void(std::vector<MirrorEvent>)> deliverer(uint64_t generation) {
    std::weak_ptr<MirrorServiceImpl> weak = shared_from_this();
    asio::io_context& io = ctx_.io;
    return [weak, &io, generation](std::vector<MirrorEvent> batch) {
      asio::post(io, [weak, generation, batch = std::move(batch)]() mutable {
        if (auto self = weak.lock()) self->onBatch(generation, std::move(batch));
      });
    };
  }

  // Runs `f` on the strand and waits for its result (the handover's
  // freeze and export, from the event loop: the strand's work is short).
  template <typename F>
  auto onStrandAndWait(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(strand_, [&task] { task(); });
    return result.get();
  }

  absl::Status ensureSourceOnStrand(uint64_t generation) {
    if (source_) return absl::OkStatus();
    if (stopping_) return protoError(v1::AGENT_DRAINING, "the agent is shutting down");
    auto source = factory_(deliverer(generation), nullptr);
    if (!source.ok()) return source.status();
    source_ = std::move(*source);
    source_generation_ = generation;
    log::info("mirror_started", {});
    return absl::OkStatus();
  }

  void stopSourceOnStrand() {
    if (!source_) return;
    source_.reset();  // detaches from every interface
    log::info("mirror_stopped", {{"connections", stats_.connections},
                                 {"delivered_bytes", stats_.delivered_bytes},
                                 {"gap_bytes", stats_.gap_bytes}});
  }

  void releasePort(uint16_t port) {
    auto self = shared_from_this();
    const bool last = port_refs_.empty();
    if (last) {
      ++generation_;  // batches of the old source are only released
      conns_.clear();
    }
    asio::post(strand_, [self, port, last] {
      if (!self->source_) return;
      absl::Status s = self->source_->removePort(port);
      if (!s.ok()) {
        log::warn("mirror_release_failed",
                  {{"port", static_cast<int>(port)}, {"error", sv(s.message())}});
      }
      // Nobody mirrors anything: the target goes back to no program at all.
      // A subscribe that came after this release posted its task after
      // this one, so it starts the source again.
      if (last) self->stopSourceOnStrand();
    });
  }

  // ---- event loop: connections ----

  void onBatch(uint64_t generation, std::vector<MirrorEvent> batch) {
    size_t bytes = 0;
    for (const MirrorEvent& e : batch) bytes += e.record.size();
    if (generation == generation_) {
      for (MirrorEvent& e : batch) onEvent(e);
    }
    // Whatever happened to them, the source may hand over as much again.
    auto self = shared_from_this();
    asio::post(strand_, [self, bytes, generation] {
      if (self->source_ && self->source_generation_ == generation) self->source_->released(bytes);
    });
  }

  void onEvent(MirrorEvent& e) {
    switch (e.kind) {
      case MirrorEvent::Kind::kOpened: {
        conns_[e.connection] = e.info;
        auto range = subsOf(e.info.server.port);
        for (Subscription* sub : range) openStream(*sub, e.info, e.info.started_mid_stream);
        return;
      }
      case MirrorEvent::Kind::kClosed: {
        auto it = conns_.find(e.connection);
        if (it == conns_.end()) return;
        const std::optional<v1::Error> error =
            e.reason == CloseReason::kFin ? std::nullopt : std::optional(closeError(e.reason));
        for (Subscription* sub : subsOf(it->second.server.port)) {
          auto s = sub->streams.find(e.connection);
          if (s == sub->streams.end()) continue;
          s->second->pushEnd(error);
          sub->streams.erase(s);
        }
        conns_.erase(it);
        return;
      }
      default:
        break;
    }
    auto it = conns_.find(e.connection);
    if (it == conns_.end()) return;
    std::vector<Subscription*> subs = subsOf(it->second.server.port);
    // Each subscription that wants this direction gets a copy; the last
    // one takes the record itself.
    std::vector<MirrorStream*> targets;
    for (Subscription* sub : subs) {
      if (e.direction == Direction::kServerToClient && !sub->both) continue;
      auto s = sub->streams.find(e.connection);
      // A subscription newer than the connection joins it here.
      MirrorStream* stream =
          s != sub->streams.end() ? s->second.get() : openStream(*sub, it->second, true);
      if (stream != nullptr && !stream->dead()) targets.push_back(stream);
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      MirrorStream& stream = *targets[i];
      switch (e.kind) {
        case MirrorEvent::Kind::kData:
          stream.pushRecord(i + 1 == targets.size() ? std::move(e.record) : e.record, e.direction);
          break;
        case MirrorEvent::Kind::kGap:
          stream.pushGap(e.direction, e.gap_bytes);
          break;
        case MirrorEvent::Kind::kEnd:
          stream.pushRecord(std::string(1, static_cast<char>(directionByte(e.direction))),
                            e.direction);
          break;
        default:
          break;
      }
    }
  }

  std::vector<Subscription*> subsOf(uint16_t port) {
    std::vector<Subscription*> out;
    for (auto& [id, sub] : subs_) {
      if (sub.port == port && sub.active) out.push_back(&sub);
    }
    return out;
  }

  MirrorStream* openStream(Subscription& sub, const ConnectionInfo& info, bool mid_stream) {
    auto session = sub.session.lock();
    if (!session || session->ended()) return nullptr;
    v1::StreamOpen open;
    v1::MirroredConnection& m = *open.mutable_mirrored();
    m.set_subscription_id(sub.id);
    *m.mutable_source() = toProto(info.client);
    *m.mutable_destination() = toProto(info.server);
    m.set_started_mid_stream(mid_stream);
    auto id = session->openStream(std::move(open));  // counts the stream's kind
    if (!id.ok()) {
      // At the session's stream limit: this connection is not mirrored to
      // it. Remembered as dead so it is not tried for every packet.
      ++stats_.refused_streams;
      log::warn("mirror_connection_refused", {{"session", session->id()},
                                              {"connection", info.client.toString()},
                                              {"error", sv(id.status().message())}});
      auto dead = std::make_shared<MirrorStream>(sub.session, 0, sub.budget, stats_);
      dead->close();
      sub.streams[info.id] = dead;
      return nullptr;
    }
    auto stream = std::make_shared<MirrorStream>(sub.session, *id, sub.budget, stats_);
    session->registerStream(*id, stream);
    session->wake();
    sub.streams[info.id] = stream;
    ++stats_.connections;
    log::debug("mirror_connection", {{"session", session->id()},
                                     {"stream", *id},
                                     {"client", info.client.toString()},
                                     {"server", info.server.toString()},
                                     {"mid_stream", mid_stream}});
    return stream.get();
  }

  ServiceContext& ctx_;
  MirrorSourceFactory factory_;
  MirrorServiceOptions options_;
  asio::strand<asio::thread_pool::executor_type> strand_;

  // Event loop.
  std::map<uint64_t, Subscription> subs_;
  std::map<uint16_t, int> port_refs_;
  std::map<uint64_t, ConnectionInfo> conns_;
  MirrorServiceStats stats_;
  uint64_t generation_ = 1;  // bumped when the source goes: its late batches are ignored
  std::atomic<bool> stopping_{false};
  bool frozen_ = false;  // a handover froze the capture

  // Strand.
  std::unique_ptr<MirrorSource> source_;
  uint64_t source_generation_ = 0;
};

class EngineSource final : public MirrorSource {
 public:
  explicit EngineSource(std::unique_ptr<MirrorEngine> engine) : engine_(std::move(engine)) {}
  absl::Status addPort(uint16_t port) override { return engine_->addPort(port); }
  absl::Status removePort(uint16_t port) override { return engine_->removePort(port); }
  void released(size_t bytes) override { engine_->released(bytes); }
  void setServerToClient(uint16_t port, bool wanted) override {
    engine_->setServerToClient(port, wanted);
  }
  void pause() override { engine_->pause(); }
  void resume() override { engine_->resume(); }
  absl::StatusOr<MirrorEngineState> exportState() override { return engine_->exportState(); }
  void go() override { engine_->go(); }

 private:
  std::unique_ptr<MirrorEngine> engine_;
};

}  // namespace

std::shared_ptr<MirrorService> makeMirrorService(ServiceContext& ctx, MirrorSourceFactory factory,
                                                 MirrorServiceOptions options) {
  return std::make_shared<MirrorServiceImpl>(ctx, std::move(factory), options);
}

void registerMirror(ServiceRegistry& registry, ServiceContext& ctx) {
  const int netns_fd = ctx.target.netnsFd();
  MirrorEngineOptions engine;
  engine.ring_bytes = ctx.config.mirror_ring_bytes;
  MirrorServiceOptions options;
  options.subscription_buffer = ctx.config.mirror_buffer_bytes;
  auto service = makeMirrorService(
      ctx,
      [netns_fd, engine](std::function<void(std::vector<MirrorEvent>)> deliver,
                         std::shared_ptr<MirrorEngineState> adopted)
          -> absl::StatusOr<std::unique_ptr<MirrorSource>> {
        MirrorEngineOptions o = engine;
        o.adopted = std::move(adopted);
        ASSIGN_OR_RETURN(auto e, MirrorEngine::start(netns_fd, o, std::move(deliver)));
        return std::unique_ptr<MirrorSource>(new EngineSource(std::move(e)));
      },
      options);
  registry.addRequest(v1::Request::kMirror, service);
  registry.addFeature(v1::FEATURE_MIRROR);
}

}  // namespace siphon::agent::mirror
