#include "agent/server/agent_session.h"

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/server/server.h"
#include "agent/streams/socket_pump.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

#ifndef SIPHON_VERSION
#define SIPHON_VERSION "0.0.0"
#endif

namespace siphon::agent {

using net::awaitable;

namespace {

// Transport endings that also end the session: the peer broke the protocol,
// so its view of the session cannot be trusted for a resume.
bool endsSession(const absl::Status& why) {
  switch (errorCodeOf(why)) {
    case v1::PROTOCOL_ERROR:
    case v1::FRAME_TOO_LARGE:
    case v1::FLOW_CONTROL_ERROR:
    case v1::STREAM_CLOSED:
    case v1::INTERNAL:
    case v1::SESSION_BUFFER_FULL:  // it reads nothing: a resume would not help
      return true;
    default:
      return false;
  }
}

}  // namespace

AgentSession::AgentSession(Server& server, std::string id, std::string resume_token,
                           std::string client_name, protocol::SessionLimits limits)
    : server_(server),
      id_(std::move(id)),
      resume_token_(std::move(resume_token)),
      client_name_(std::move(client_name)),
      session_(protocol::Role::kAgent, limits),
      grace_timer_(server.executor()),
      created_(std::chrono::steady_clock::now()) {
  session_.setLimitObserver([this](const absl::Status& hit) { logLimitHit(hit); });
}

void AgentSession::logLimitHit(const absl::Status& hit) {
  // One line per hit would let a client that keeps hitting a limit flood
  // the log: the 1st, 2nd, 4th, 8th... hit of each kind are logged, with
  // the count so far.
  const uint64_t n = ++limit_hits_[errorCodeOf(hit)];
  if ((n & (n - 1)) != 0) return;
  log::warn("limit_hit", {{"session", id_},
                          {"client", client_name_},
                          {"code", errorCodeName(errorCodeOf(hit))},
                          {"count", n},
                          {"error", sv(hit.message())}});
}

static awaitable<void> runTransport(std::shared_ptr<AgentSession> self,
                                    std::shared_ptr<net::SessionTransport> transport,
                                    std::function<void(const absl::Status&)> done) {
  // GCC 12 drops coroutine parameters the body never names: hold the owner
  // in a frame variable so it outlives every suspension.
  const auto keep_alive = std::move(self);
  absl::Status why = co_await transport->run();
  done(why);
}

bool AgentSession::attach(net::Stream stream, std::string leftover, uint64_t attachment) {
  if (ended_ || !session_.attach(attachment).ok()) {
    // A later resume took the session over while this one's Welcome was
    // being written: this connection never carries a session frame.
    stream.close();
    return false;
  }
  uint64_t generation = ++generation_;
  if (transport_) transport_->close();
  grace_timer_.cancel();
  transport_ = std::make_shared<net::SessionTransport>(std::move(stream), session_, *this,
                                                       std::move(leftover));
  auto self = shared_from_this();
  auto ended = [self, generation](const absl::Status& why) {
    self->transportEnded(generation, why);
  };
  net::spawn(server_.executor(), runTransport(self, transport_, ended), "session_transport",
             [ended] { ended(protoError(v1::INTERNAL, "the session transport failed")); });
  transport_->wake();
  return true;
}

void AgentSession::resumeFailed(uint64_t attachment) {
  // Only the latest resume may detach the session again: an earlier one
  // that fails must not undo the later one's resume().
  if (ended_ || attached() || session_.attachment() != attachment) return;
  session_.onTransportLost();
}

void AgentSession::transportEnded(uint64_t generation, const absl::Status& why) {
  if (generation != generation_ || ended_) return;  // replaced by a resume, or over
  if (client_closed_) {
    end("closed by the client");
    return;
  }
  if (endsSession(why)) {
    log::warn("session_protocol_error", {{"session", id_},
                                         {"code", errorCodeName(errorCodeOf(why))},
                                         {"error", sv(why.message())}});
    lose("protocol error");
    return;
  }
  session_.onTransportLost();
  log::info("session_detached",
            {{"session", id_},
             {"reason", sv(why.message())},
             {"grace_ms", static_cast<int64_t>(session_.limits().session_grace.count())}});
  armGrace(std::chrono::steady_clock::now() + session_.limits().session_grace);
}

void AgentSession::armGrace(std::chrono::steady_clock::time_point deadline) {
  grace_deadline_ = deadline;
  grace_timer_.expires_at(deadline);
  const uint64_t generation = generation_;
  std::weak_ptr<AgentSession> weak = weak_from_this();
  grace_timer_.async_wait([weak, generation](net::error_code ec) {
    auto self = weak.lock();
    if (ec || !self || self->generation_ != generation || self->ended_) return;
    self->lose("no resume within the session grace period");
  });
}

void AgentSession::detachForResume() {
  // The old transport's end, even one already under way (closed, its
  // coroutines finishing), must not detach the session after the resume.
  ++generation_;
  if (transport_) transport_->close();
  if (session_.attached()) {
    session_.onTransportLost();
    log::info("session_detached",
              {{"session", id_},
               {"reason", "a resume replaces the connection"},
               {"grace_ms", static_cast<int64_t>(session_.limits().session_grace.count())}});
    armGrace(std::chrono::steady_clock::now() + session_.limits().session_grace);
  } else {
    armGrace(grace_deadline_);  // the same deadline, for the new generation
  }
}

void AgentSession::lose(std::string_view reason) {
  if (!ended_) metrics().session("lost");
  // Reset, not closed: a stolen or outgoing connection cut off mid-way must
  // not look complete to its peer in the target (an RST, not a FIN).
  resetStreams(toProtoError(
      protoError(v1::AGENT_LOST, absl::StrCat("session ", id_, " lost: ", asv(reason)))));
  end(reason);
}

void AgentSession::respond(v1::Response response) {
  countAnswer(response);
  if (ended_) return;
  session_.sendResponse(std::move(response));
  if (transport_) transport_->wake();
}

void AgentSession::respond(v1::Response response, std::shared_ptr<protocol::PipedBytes> data) {
  countAnswer(response);
  if (ended_) return;
  session_.sendResponse(std::move(response), std::move(data));
  if (transport_) transport_->wake();
}

void AgentSession::countAnswer(const v1::Response& response) {
  if (auto it = request_kinds_.find(response.request_id()); it != request_kinds_.end()) {
    metrics().requestAnswered(it->second.first, it->second.second, response);
    request_kinds_.erase(it);
  } else if (response.has_error()) {
    metrics().errorSent(response.error().code(), metrics::ErrorFrame::kResponse);
  }
}

void AgentSession::notifyDraining(int64_t deadline_unix_ms, std::string_view reason) {
  if (ended_) return;
  v1::Draining d;
  d.set_deadline_unix_ms(deadline_unix_ms);
  d.set_reason(std::string(reason));
  session_.sendDraining(std::move(d));
  if (transport_) transport_->wake();
}

void AgentSession::notifyTargetRestarted(const v1::TargetRestarted& restarted) {
  if (ended_ || protocol_minor_ < 1) return;
  session_.sendTargetRestarted(restarted);
  if (transport_) transport_->wake();
}

void AgentSession::end(std::string_view reason) {
  if (ended_) return;
  ended_ = true;
  grace_timer_.cancel();
  if (transport_ && !transport_->closed()) {
    session_.sendGoaway(v1::CANCELLED, reason);
    metrics().errorSent(v1::CANCELLED, metrics::ErrorFrame::kGoaway);
    transport_->closeAfterFlush();
  }
  // Streams die with the session: their sockets close now.
  auto streams = std::move(streams_);
  streams_.clear();
  for (auto& [id, e] : streams) e->close();
  stream_kinds_.clear();
  metrics().session("ended");
  log::info("session_ended", {{"session", id_}, {"client", client_name_}, {"reason", reason}});
  server_.sessionEnded(id_);
}

void AgentSession::onRequest(v1::Request request) {
  request_kinds_[request.request_id()] = {
      request.body_case(), request.has_file() ? static_cast<int>(request.file().op_case()) : 0};
  server_.handleRequest(shared_from_this(), std::move(request));
}

void AgentSession::onStreamOpen(v1::StreamOpen open) {
  stream_kinds_[open.stream_id()] = metrics::streamKindOf(open);
  if (server_.draining()) {
    resetStream(open.stream_id(),
                toProtoError(protoError(v1::AGENT_DRAINING,
                                        "the agent is draining: no new streams; open it "
                                        "through another agent")));
    return;
  }
  if (StreamService* service = server_.services().stream(open.kind_case())) {
    service->open(shared_from_this(), std::move(open));
    return;
  }
  // Say so at once instead of leaving the opener waiting.
  std::string kind = open.kind_case() == v1::StreamOpen::KIND_NOT_SET
                         ? "(none)"
                         : open.GetDescriptor()->FindFieldByNumber(open.kind_case())->name();
  resetStream(
      open.stream_id(),
      toProtoError(protoError(
          v1::UNIMPLEMENTED,
          absl::StrCat("stream kind '", kind, "' is not implemented by agent ", SIPHON_VERSION))));
}

void AgentSession::onStreamAccept(v1::StreamAccept accept) {
  if (StreamEndpoint* e = endpoint(accept.stream_id())) e->onAccept(accept);
}

void AgentSession::registerStream(uint64_t stream_id, std::shared_ptr<StreamEndpoint> endpoint) {
  if (ended_) {
    endpoint->close();
    return;
  }
  if (!streams_.contains(stream_id)) metrics().streamOpened(kindOf(stream_id));
  streams_[stream_id] = std::move(endpoint);
}

void AgentSession::unregisterStream(uint64_t stream_id) {
  streams_.erase(stream_id);
  stream_kinds_.erase(stream_id);
}

void AgentSession::resetStreams(const v1::Error& error) {
  if (ended_) return;
  auto streams = streams_;  // onReset() unregisters
  for (auto& [id, e] : streams) {
    resetStream(id, error);
    e->onReset(error);
  }
  streams_.clear();
  stream_kinds_.clear();
  for (uint64_t id : session_.streamIds()) session_.resetStream(id, error);
  wake();
}

void AgentSession::wake() {
  if (transport_) transport_->wake();
}

StreamEndpoint* AgentSession::endpoint(uint64_t stream_id) {
  auto it = streams_.find(stream_id);
  return it == streams_.end() ? nullptr : it->second.get();
}

void AgentSession::onStreamData(uint64_t stream_id, std::string_view payload) {
  bytes_in_ += payload.size();
  metrics().bytesIn(kindOf(stream_id), payload.size());
  if (StreamEndpoint* e = endpoint(stream_id)) {
    e->onData(payload);
  } else {
    session_.consumed(stream_id, payload.size());  // nobody to deliver to
  }
}

void AgentSession::onStreamDatagram(v1::StreamDatagram datagram) {
  bytes_in_ += datagram.payload().size();
  metrics().bytesIn(kindOf(datagram.stream_id()), datagram.payload().size());
  if (StreamEndpoint* e = endpoint(datagram.stream_id())) e->onDatagram(std::move(datagram));
}

void AgentSession::onStreamHalfClose(uint64_t stream_id) {
  if (StreamEndpoint* e = endpoint(stream_id)) e->onHalfClose();
}

void AgentSession::onStreamReset(uint64_t stream_id, v1::Error error) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end()) return;
  auto e = std::move(it->second);
  streams_.erase(it);
  stream_kinds_.erase(stream_id);
  e->onReset(error);
}

absl::StatusOr<uint64_t> AgentSession::openStream(v1::StreamOpen open) {
  const metrics::StreamKind kind = metrics::streamKindOf(open);
  auto id = session_.openStream(std::move(open));
  if (id.ok()) stream_kinds_[*id] = kind;
  return id;
}

metrics::StreamKind AgentSession::kindOf(uint64_t stream_id) const {
  auto it = stream_kinds_.find(stream_id);
  return it == stream_kinds_.end() ? metrics::StreamKind::kOther : it->second;
}

void AgentSession::countSent(uint64_t stream_id, uint64_t n) {
  bytes_out_ += n;
  metrics().bytesOut(kindOf(stream_id), n);
}

void AgentSession::resetStream(uint64_t stream_id, const v1::Error& error) {
  if (ended_) return;
  session_.resetStream(stream_id, error);
  metrics().errorSent(error.code(), metrics::ErrorFrame::kStreamReset);
}

void AgentSession::countGap(uint64_t stream_id, uint64_t bytes) {
  metrics().gap(kindOf(stream_id), bytes);
}

metrics::AgentMetrics& AgentSession::metrics() { return server_.metrics(); }

void AgentSession::countStreams(std::array<uint64_t, metrics::kStreamKinds>& out) const {
  for (const auto& [id, e] : streams_) ++out[static_cast<size_t>(kindOf(id))];
}

void AgentSession::onStreamWritable(uint64_t stream_id) {
  if (StreamEndpoint* e = endpoint(stream_id)) e->onWritable();
}

void AgentSession::onGoaway(v1::Goaway goaway) {
  client_closed_ = true;
  log::debug("session_goaway", {{"session", id_}, {"message", goaway.message()}});
}

// ---- handover ----

void AgentSession::freezeForHandover() {
  if (ended_ || frozen_) return;
  frozen_ = true;
  // The grace stops while frozen (no session ends in the middle of a
  // handover); a session the handover cuts gets all of it afterwards.
  const auto now = std::chrono::steady_clock::now();
  grace_left_ = session_.limits().session_grace;
  if (attached()) {
    // The old transport's end must not detach the session a second time.
    ++generation_;
    transport_->close();
    session_.onTransportLost();
    log::info("session_detached", {{"session", id_}, {"reason", "handover"}});
  } else if (session_.attached()) {
    session_.onTransportLost();  // a handshake's session, never attached
  } else if (grace_deadline_ > now) {
    grace_left_ = std::chrono::duration_cast<std::chrono::milliseconds>(grace_deadline_ - now);
  }
  ++generation_;  // the grace timer's handler does nothing now
  grace_timer_.cancel();
  for (auto& [id, e] : streams_) e->freeze();
}

void AgentSession::thawAfterHandover() {
  if (!frozen_) return;
  frozen_ = false;
  if (!attached() && !ended_) armGrace(std::chrono::steady_clock::now() + grace_left_);
  auto streams = streams_;  // an endpoint may unregister itself
  for (auto& [id, e] : streams) e->thaw();
}

std::string AgentSession::handoverBlocker() const {
  if (ended_) return "";
  if (size_t n = session_.unansweredRequests(); n > 0) {
    return absl::StrCat("session ", id_, " has ", n, " requests not answered yet");
  }
  return "";
}

absl::Status AgentSession::exportState(v1::SessionExport* out, std::vector<UniqueFd>* fds) {
  out->set_id(id_);
  out->set_resume_token(resume_token_);
  out->set_client_name(client_name_);
  out->set_protocol_minor(protocol_minor_);
  absl::Status s = session_.exportState(out->mutable_protocol());
  if (!s.ok()) return absl::FailedPreconditionError(absl::StrCat("session ", id_, ": ", s.message()));
  for (auto& [id, e] : streams_) {
    absl::Status p = e->exportState(out->add_pumps(), fds);
    if (!p.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("session ", id_, ", stream ", id, ": ", p.message()));
    }
  }
  for (const auto& [id, kind] : stream_kinds_) {
    (*out->mutable_stream_kinds())[id] = static_cast<uint32_t>(kind);
  }
  out->set_bytes_in(bytes_in_);
  out->set_bytes_out(bytes_out_);
  out->set_grace_left_ms(static_cast<uint64_t>(grace_left_.count()));
  out->set_handovers(handovers_);
  out->set_age_ms(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::steady_clock::now() - created_)
                                            .count()));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<AgentSession>> AgentSession::restore(
    Server& server, const v1::SessionExport& state, std::vector<UniqueFd>& fds) {
  auto self = std::make_shared<AgentSession>(server, state.id(), state.resume_token(),
                                             state.client_name(),
                                             protocol::Session::limitsOf(state.protocol()));
  absl::Status s = self->session_.restoreState(state.protocol(), protocol::Clock::now());
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("session ", state.id(), ": ", s.message()));
  self->protocol_minor_ = state.protocol_minor();
  self->handovers_ = state.handovers() + 1;
  self->bytes_in_ = state.bytes_in();
  self->bytes_out_ = state.bytes_out();
  self->frozen_ = true;
  self->created_ = std::chrono::steady_clock::now() - std::chrono::milliseconds(state.age_ms());
  self->restored_ = true;
  self->grace_left_ = self->session_.limits().session_grace;
  if (state.grace_left_ms() > 0) {
    self->grace_left_ =
        std::min(self->grace_left_, std::chrono::milliseconds(state.grace_left_ms()));
  }
  for (const v1::PumpExport& p : state.pumps()) {
    if (!p.service().empty()) {
      // A service's endpoint (a mirror's stream): the service registers it
      // as it imports its own state (ServiceRegistry::importState).
      if (!self->session_.streamOpen(p.stream_id())) {
        return absl::InvalidArgumentError(absl::StrCat("session ", state.id(), ", stream ",
                                                       p.stream_id(), ": not open in the session"));
      }
      continue;
    }
    if (p.fd() < 0 || static_cast<size_t>(p.fd()) >= fds.size() || !fds[p.fd()]) {
      return absl::InvalidArgumentError(
          absl::StrCat("session ", state.id(), ", stream ", p.stream_id(), ": no socket"));
    }
    if (!self->session_.streamOpen(p.stream_id())) {
      return absl::InvalidArgumentError(absl::StrCat("session ", state.id(), ", stream ",
                                                     p.stream_id(), ": not open in the session"));
    }
    auto pump = streams::SocketPump::restore(server.executor(), self, p,
                                             std::move(fds[static_cast<size_t>(p.fd())]));
    if (!pump.ok()) return pump.status();
    self->streams_[p.stream_id()] = *std::move(pump);
  }
  for (const auto& [id, kind] : state.stream_kinds()) {
    if (kind < metrics::kStreamKinds) {
      self->stream_kinds_[id] = static_cast<metrics::StreamKind>(kind);
    }
  }
  return self;
}

void AgentSession::startAfterHandover() { thawAfterHandover(); }

}  // namespace siphon::agent
