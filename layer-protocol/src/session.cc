// The protocol session without I/O (siphon/protocol/session.h): receiving
// and dispatching frames, sequencing, acks and resume, flow control, and the
// write queue. Over 600 lines because these are one state machine whose
// invariants (every sequenced frame delivered exactly once across a resume;
// the buffered bytes bounded) span receiving and sending; the codec and the
// handshake are codec.cc and handshake.cc.
#include "siphon/protocol/session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::protocol {

std::vector<std::string_view> WriteBatch::buffers() const {
  std::vector<std::string_view> out;
  out.reserve(frames.size() * 2);
  for (const auto& f : frames) {
    out.emplace_back(f->head);
    if (!f->payload.empty()) out.emplace_back(f->payload);
    if (f->piped && f->piped->materialized()) out.emplace_back(*f->piped->materialize());
  }
  return out;
}

Session::Session(Role role, SessionLimits limits, TimePoint now)
    : role_(role),
      limits_(limits),
      decoder_(limits.max_frame_size),
      now_(now),
      last_received_(now),
      last_ping_(now),
      next_stream_id_(role == Role::kClient ? 1 : 2) {
  // The client receives file reads' bytes straight into their FileData
  // strings (codec.h): no copy out of the receive buffer.
  if (role == Role::kClient) decoder_.setDetachFileData(kDetachedDataMin);
}

bool Session::isLocalStream(uint64_t stream_id) const {
  bool odd = (stream_id & 1) != 0;
  return role_ == Role::kClient ? odd : !odd;
}

absl::Status Session::unknownStream(uint64_t stream_id, std::string_view frame) const {
  // Ids only grow (each side counts up): an id at or above our next one, or
  // above the peer's highest Open, was never opened. A peer that names one
  // is out of step or probing; ignoring it would hide the bug.
  const bool never =
      stream_id == 0 ||
      (isLocalStream(stream_id) ? stream_id >= next_stream_id_ : stream_id > highest_peer_stream_);
  if (!never) return absl::OkStatus();
  return protoError(v1::PROTOCOL_ERROR, absl::StrCat(asv(frame), " for stream ", stream_id,
                                                     ", which was never opened"));
}

uint64_t Session::replayFree() const {
  return limits_.replay_buffer_bytes > replay_bytes_ ? limits_.replay_buffer_bytes - replay_bytes_
                                                     : 0;
}

std::string Session::bufferLimitText() const {
  return absl::StrCat("twice the session buffer limit of ", limits_.replay_buffer_bytes,
                      " bytes (siphon-agent --max-session-buffer raises it)");
}

absl::Status Session::limitHit(absl::Status status) {
  if (limit_observer_) limit_observer_(status);
  return status;
}

// ---------------------------------------------------------------- receiving

absl::Status Session::onBytes(std::string_view bytes, SessionHandler& handler, TimePoint now) {
  decoder_.feed(bytes);
  return processDecoded(handler, now);
}

absl::Status Session::onRead(size_t n, SessionHandler& handler, TimePoint now) {
  decoder_.commit(n);
  return processDecoded(handler, now);
}

absl::Status Session::onPiped(std::shared_ptr<PipedBytes> piped, SessionHandler& handler,
                              TimePoint now) {
  decoder_.commitPiped(std::move(piped));
  return processDecoded(handler, now);
}

void SessionHandler::onResponse(v1::Response response, std::shared_ptr<PipedBytes> piped) {
  // A handler that takes no pipes gets the bytes in memory.
  auto bytes = piped->materialize();
  if (!bytes.ok()) {
    v1::Response error;
    error.set_request_id(response.request_id());
    *error.mutable_error() = toProtoError(bytes.status());
    onResponse(std::move(error));
    return;
  }
  response.mutable_file()->mutable_data()->mutable_data()->append(*bytes);
  onResponse(std::move(response));
}

absl::Status Session::processDecoded(SessionHandler& handler, TimePoint now) {
  last_received_ = now;
  now_ = now;
  if (recheck_writable_) {
    // resume() dropped the frames the peer had received, which frees replay
    // space, but it has no handler to tell the streams waiting for it. The
    // peer's Ack that follows carries no news (it equals the resume count),
    // so without this those streams would wait forever.
    recheck_writable_ = false;
    if (any_wants_write_) notifyWritable(handler);
  }
  while (true) {
    auto next = decoder_.next();
    if (!next.ok()) {
      if (errorCodeOf(next.status()) != v1::FRAME_TOO_LARGE) return next.status();
      return limitHit(protoError(v1::FRAME_TOO_LARGE,
                                 absl::StrCat(next.status().message(),
                                              " (the session's frame size limit; siphon-agent "
                                              "--max-frame-size raises it)")));
    }
    if (!next->has_value()) break;
    const uint64_t before = received_;
    RETURN_IF_ERROR(dispatch(**next, handler, now));
    if (received_ > before) unacked_in_bytes_ += (*next)->wire_size;
    // What the peer's frames made us queue stays bounded even when it
    // reads nothing: data stops at the buffer limit (credit) and large
    // answers at twice it (sendResponse), but each small answer, reset or
    // window update still adds a little. Past twice the limit the peer is
    // not reading what it asks for: it is cut off. No backpressure is
    // possible here: its acks come in the same byte stream.
    if (role_ == Role::kAgent && bufferedBytes() > answerCap()) {
      return limitHit(protoError(
          v1::SESSION_BUFFER_FULL,
          absl::StrCat("the agent holds ", bufferedBytes(),
                       " bytes the client has not acknowledged, above ", bufferLimitText(),
                       ": the client sends requests but reads no answers")));
    }
  }
  // The ack waits for other frames to ride with (takeWrites), within
  // kAckDelay, unless the peer's replay buffer is filling up.
  if (received_ > ack_sent_) {
    if (unacked_in_bytes_ >= std::max<uint64_t>(limits_.replay_buffer_bytes / 4, 1)) {
      queueAck();
    } else if (ack_due_ == TimePoint::max()) {
      ack_due_ = now + kAckDelay;
    }
  }
  return absl::OkStatus();
}

absl::Status Session::dispatch(DecodedFrame& decoded, SessionHandler& handler, TimePoint now) {
  (void)now;
  if (decoded.is_data) {
    ++received_;
    return onData(decoded.data.stream_id, decoded.data.payload, handler);
  }
  v1::Frame& f = decoded.frame;
  if (isSequenced(f)) ++received_;
  switch (f.body_case()) {
    case v1::Frame::kHello:
    case v1::Frame::kWelcome:
    case v1::Frame::kReject:
      return protoError(v1::PROTOCOL_ERROR, "handshake frame inside an established session");
    case v1::Frame::kAck: {
      uint64_t r = f.ack().received();
      if (r > acked_ + write_next_) {
        return protoError(v1::PROTOCOL_ERROR, absl::StrCat("ack of ", r, " frames but only ",
                                                           acked_ + write_next_, " were sent"));
      }
      onAck(r, handler);
      return absl::OkStatus();
    }
    case v1::Frame::kPing: {
      // A peer that pings and reads nothing gets one pong, the latest, not
      // a queue of them.
      v1::Frame pong;
      pong.mutable_pong()->set_nonce(f.ping().nonce());
      queueReplacing(queued_pong_, pong);
      return absl::OkStatus();
    }
    case v1::Frame::kPong:
      return absl::OkStatus();
    case v1::Frame::kGoaway:
      handler.onGoaway(std::move(*f.mutable_goaway()));
      return absl::OkStatus();
    case v1::Frame::kRequest: {
      uint64_t id = f.request().request_id();
      if (!incoming_requests_.insert(id).second) {
        return protoError(v1::PROTOCOL_ERROR,
                          absl::StrCat("request ", id, " sent again before its response"));
      }
      if (incoming_requests_.size() > limits_.max_pending_requests) {
        // The limit binds both ways: a peer that ignores it gets a typed
        // answer, and the work we hold for it stays bounded.
        absl::Status refused =
            limitHit(protoError(v1::TOO_MANY_PENDING_REQUESTS,
                                limitReached("pending request", limits_.max_pending_requests,
                                             "--max-pending-requests")));
        v1::Response r;
        r.set_request_id(id);
        *r.mutable_error() = toProtoError(refused);
        sendResponse(std::move(r));
        return absl::OkStatus();
      }
      handler.onRequest(std::move(*f.mutable_request()));
      return absl::OkStatus();
    }
    case v1::Frame::kResponse:
      pending_requests_.erase(f.response().request_id());
      decoder_.forgetPiped(f.response().request_id());
      if (decoded.piped) {
        handler.onResponse(std::move(*f.mutable_response()), std::move(decoded.piped));
      } else {
        handler.onResponse(std::move(*f.mutable_response()));
      }
      return absl::OkStatus();
    case v1::Frame::kOpen: {
      uint64_t id = f.open().stream_id();
      if (id == 0 || isLocalStream(id)) {
        return protoError(v1::PROTOCOL_ERROR,
                          absl::StrCat("peer opened stream ", id, " with the wrong parity"));
      }
      if (streams_.contains(id)) {
        return protoError(v1::PROTOCOL_ERROR, absl::StrCat("stream ", id, " opened twice"));
      }
      highest_peer_stream_ = std::max(highest_peer_stream_, id);
      if (streams_.size() >= limits_.max_streams) {
        absl::Status refused = limitHit(protoError(
            v1::TOO_MANY_STREAMS, limitReached("stream", limits_.max_streams, "--max-streams")));
        v1::Frame reset;
        reset.mutable_reset()->set_stream_id(id);
        *reset.mutable_reset()->mutable_error() = toProtoError(refused);
        queueSequenced(reset);
        return absl::OkStatus();
      }
      Stream& s = streams_[id];
      s.last_update = now_;
      // 0 means the default, as on our side (openStream).
      s.send_credit = f.open().initial_window() != 0 ? f.open().initial_window()
                                                     : limits_.initial_stream_window;
      // Early data: the opener may send up to the initial window before we
      // accept; the accept grants only what our window has beyond it.
      if (early_receive_) s.recv_credit = s.recv_window = limits_.initial_stream_window;
      handler.onStreamOpen(std::move(*f.mutable_open()));
      return absl::OkStatus();
    }
    case v1::Frame::kAccept: {
      uint64_t id = f.accept().stream_id();
      auto it = streams_.find(id);
      if (it == streams_.end()) return unknownStream(id, "accept");  // we reset it meanwhile
      if (!isLocalStream(id) || it->second.accepted) {
        return protoError(v1::PROTOCOL_ERROR, absl::StrCat("unexpected accept of stream ", id));
      }
      Stream& s = it->second;
      s.accepted = true;
      const uint64_t window = f.accept().initial_window() != 0 ? f.accept().initial_window()
                                                               : limits_.initial_stream_window;
      if (s.early) {
        // The early credit was part of this window (and what the peer
        // returned of it came as window updates): add the rest. A peer
        // that granted less than the early credit (against the rule) gets
        // its difference taken off what is left.
        const uint64_t early = limits_.initial_stream_window;
        s.send_credit = window >= early ? s.send_credit + (window - early)
                                        : s.send_credit - std::min(s.send_credit, early - window);
      } else {
        s.send_credit = window;
      }
      handler.onStreamAccept(std::move(*f.mutable_accept()));
      return absl::OkStatus();
    }
    case v1::Frame::kData:
      // The decoder reports every data frame as is_data.
      return protoError(v1::INTERNAL, "data frame not decoded as data");
    case v1::Frame::kDatagram: {
      auto it = streams_.find(f.datagram().stream_id());
      if (it == streams_.end()) return unknownStream(f.datagram().stream_id(), "datagram");
      size_t n = f.datagram().payload().size();
      if (n > it->second.recv_credit) {
        return protoError(
            v1::FLOW_CONTROL_ERROR,
            absl::StrCat("datagram of ", n, " bytes on stream ", f.datagram().stream_id(),
                         " beyond its credit of ", it->second.recv_credit));
      }
      it->second.recv_credit -= n;
      handler.onStreamDatagram(std::move(*f.mutable_datagram()));
      return absl::OkStatus();
    }
    case v1::Frame::kHalfClose: {
      uint64_t id = f.half_close().stream_id();
      auto it = streams_.find(id);
      if (it == streams_.end()) return unknownStream(id, "half-close");
      if (it->second.remote_closed) return absl::OkStatus();
      it->second.remote_closed = true;
      handler.onStreamHalfClose(id);
      maybeClose(id);
      return absl::OkStatus();
    }
    case v1::Frame::kReset: {
      uint64_t id = f.reset().stream_id();
      if (!forget(id)) return unknownStream(id, "reset");
      handler.onStreamReset(id, std::move(*f.mutable_reset()->mutable_error()));
      return absl::OkStatus();
    }
    case v1::Frame::kWindowUpdate: {
      const uint64_t id = f.window_update().stream_id();
      auto it = streams_.find(id);
      if (it == streams_.end()) return unknownStream(id, "window update");
      // Windows are uint32 on the wire and a receiver's window never grows
      // past one (max_stream_window): credit beyond it is a peer's bug.
      if (it->second.send_credit + f.window_update().increment() > UINT32_MAX) {
        return protoError(v1::FLOW_CONTROL_ERROR,
                          absl::StrCat("window update of ", f.window_update().increment(),
                                       " on stream ", id, " takes its credit past 2^32-1"));
      }
      it->second.send_credit += f.window_update().increment();
      if (it->second.wants_write) notifyWritable(handler);
      return absl::OkStatus();
    }
    case v1::Frame::kGap: {
      // A gap stands for data: the same rules (dropped for a stream we
      // reset, refused after the half-close that ended the stream's bytes).
      uint64_t id = f.gap().stream_id();
      auto it = streams_.find(id);
      if (it == streams_.end()) return unknownStream(id, "gap");
      if (it->second.remote_closed) {
        return protoError(v1::STREAM_CLOSED,
                          absl::StrCat("gap on stream ", id, " after its half-close"));
      }
      handler.onStreamGap(std::move(*f.mutable_gap()));
      return absl::OkStatus();
    }
    case v1::Frame::kDraining:
      handler.onDraining(std::move(*f.mutable_draining()));
      return absl::OkStatus();
    case v1::Frame::kNotice:
      handler.onNotice(std::move(*f.mutable_notice()));
      return absl::OkStatus();
    case v1::Frame::kFileEvents:
      handler.onFileEvents(std::move(*f.mutable_file_events()));
      return absl::OkStatus();
    case v1::Frame::kTargetRestarted:
      handler.onTargetRestarted(std::move(*f.mutable_target_restarted()));
      return absl::OkStatus();
    case v1::Frame::BODY_NOT_SET:
      break;
  }
  return protoError(v1::PROTOCOL_ERROR, "frame with no known body");
}

absl::Status Session::onData(uint64_t stream_id, std::string_view payload,
                             SessionHandler& handler) {
  auto it = streams_.find(stream_id);
  // Data for a stream we reset may still be in flight: drop it quietly.
  if (it == streams_.end()) return unknownStream(stream_id, "data");
  Stream& s = it->second;
  if (s.remote_closed) {
    return protoError(v1::STREAM_CLOSED,
                      absl::StrCat("data on stream ", stream_id, " after its half-close"));
  }
  if (payload.size() > s.recv_credit) {
    return protoError(v1::FLOW_CONTROL_ERROR,
                      absl::StrCat(payload.size(), " bytes on stream ", stream_id,
                                   " beyond its credit of ", s.recv_credit));
  }
  s.recv_credit -= payload.size();
  handler.onStreamData(stream_id, payload);
  return absl::OkStatus();
}

void Session::onAck(uint64_t received, SessionHandler& handler) {
  if (received <= acked_) return;  // stale or repeated
  uint64_t n = received - acked_;
  for (uint64_t i = 0; i < n; ++i) {
    replay_bytes_ -= replay_.front()->size();
    replay_.pop_front();
  }
  write_next_ -= n;
  acked_ = received;
  if (any_wants_write_) notifyWritable(handler);
}

void Session::notifyWritable(SessionHandler& handler) {
  std::vector<uint64_t> ready;
  bool still_waiting = false;
  uint64_t free = replayFree();
  for (auto& [id, s] : streams_) {
    if (!s.wants_write) continue;
    if (s.send_credit > 0 && free > 0 && s.unsent <= s.unsent_bound / 2) {
      s.wants_write = false;
      ready.push_back(id);
    } else {
      still_waiting = true;
    }
  }
  any_wants_write_ = still_waiting;
  // Lowest id first, so the order does not depend on the hash map.
  std::sort(ready.begin(), ready.end());
  for (uint64_t id : ready) {
    if (streams_.contains(id)) handler.onStreamWritable(id);
  }
}

// ---------------------------------------------------------------- sending

void Session::queueSequenced(std::shared_ptr<OutFrame> frame) {
  frame->sequenced = true;
  ++sent_;
  replay_bytes_ += frame->size();
  replay_.push_back(std::move(frame));
}

void Session::queueStreamFrame(std::shared_ptr<OutFrame> frame) {
  // Frames before `floor` were taken by a transport, maybe sent: a replay
  // after a cut must resend them in the order the peer counted them.
  const size_t floor = std::max<size_t>(write_next_, static_cast<size_t>(taken_ - acked_));
  size_t at = replay_.size();
  while (at > floor) {
    const OutFrame& before = *replay_[at - 1];
    if (before.stream_id == 0) break;  // not a data frame: a barrier
    if (before.stream_id == frame->stream_id) {
      at = replay_.size();  // the stream has bytes waiting: no jumping them
      break;
    }
    --at;
  }
  frame->sequenced = true;
  ++sent_;
  replay_bytes_ += frame->size();
  replay_.insert(replay_.begin() + static_cast<std::ptrdiff_t>(at), std::move(frame));
}

void Session::queueSequenced(const v1::Frame& frame) {
  auto out = std::make_shared<OutFrame>();
  encodeFrame(frame, &out->head);
  queueSequenced(std::move(out));
}

void Session::queueControl(const v1::Frame& frame) {
  if (!attached_) return;  // control frames mean nothing on a later transport
  auto out = std::make_shared<OutFrame>();
  encodeFrame(frame, &out->head);
  control_bytes_ += out->size();
  control_.push_back(std::move(out));
}

void Session::queueReplacing(std::shared_ptr<OutFrame>& slot, const v1::Frame& frame) {
  if (!attached_) return;
  if (slot) {
    control_bytes_ -= slot->size();
    slot->head.clear();
    encodeFrame(frame, &slot->head);
    control_bytes_ += slot->size();
    return;
  }
  queueControl(frame);
  slot = control_.back();
}

void Session::queueAck() {
  // Acks are cumulative: the latest says all the earlier ones did, so a
  // peer that sends without reading holds one of them, not one per batch.
  v1::Frame ack;
  ack.mutable_ack()->set_received(received_);
  queueReplacing(queued_ack_, ack);
  ack_sent_ = received_;
  unacked_in_bytes_ = 0;
  ack_due_ = TimePoint::max();
}

bool Session::hasWrites() const {
  return attached_ && (!control_.empty() || write_next_ < replay_.size());
}

WriteBatch Session::takeWrites(size_t max_bytes) {
  WriteBatch batch;
  if (!attached_) return batch;
  // An ack owed rides with whatever goes now.
  if (received_ > ack_sent_ && (!control_.empty() || write_next_ < replay_.size())) queueAck();
  while (!control_.empty()) {
    batch.bytes += control_.front()->size();
    batch.frames.push_back(std::move(control_.front()));
    control_.pop_front();
  }
  control_bytes_ = 0;
  queued_pong_.reset();
  queued_ack_.reset();
  queued_ping_.reset();
  while (write_next_ < replay_.size() && (batch.frames.empty() || batch.bytes < max_bytes)) {
    const auto& f = replay_[write_next_++];
    batch.bytes += f->size();
    batch.frames.push_back(f);
    if (f->stream_id == 0) continue;
    auto it = streams_.find(f->stream_id);
    if (it == streams_.end()) continue;
    Stream& s = it->second;
    s.unsent -= std::min<uint64_t>(s.unsent, f->payload.size());
    if (s.wants_write && s.unsent <= s.unsent_bound / 2) unsent_drained_ = true;
  }
  taken_ = std::max(taken_, acked_ + write_next_);
  return batch;
}

void Session::pollWritable(SessionHandler& handler) {
  if (!unsent_drained_) return;
  unsent_drained_ = false;
  if (any_wants_write_) notifyWritable(handler);
}

void Session::recountUnsent() {
  for (auto& [id, s] : streams_) s.unsent = 0;
  for (size_t i = write_next_; i < replay_.size(); ++i) {
    const auto& f = replay_[i];
    if (f->stream_id == 0) continue;
    if (auto it = streams_.find(f->stream_id); it != streams_.end()) {
      it->second.unsent += f->payload.size();
    }
  }
}

absl::Status Session::onTick(TimePoint now) {
  now_ = now;
  if (!attached_) return absl::OkStatus();
  auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_received_);
  if (silent >= limits_.keepalive_timeout) {
    return protoError(v1::UNAVAILABLE,
                      absl::StrCat("peer silent for ", silent.count(), " ms (keepalive timeout ",
                                   limits_.keepalive_timeout.count(), " ms)"));
  }
  if (received_ > ack_sent_ && now >= ack_due_) queueAck();
  if (now - last_ping_ >= limits_.keepalive_interval) {
    // At most one ping per interval, and none while the last one is still
    // waiting to go out (a peer that reads nothing): it stands for this one.
    if (!queued_ping_) {
      v1::Frame ping;
      ping.mutable_ping()->set_nonce(++ping_nonce_);
      queueControl(ping);
      queued_ping_ = control_.back();
    }
    last_ping_ = now;
  }
  return absl::OkStatus();
}

TimePoint Session::nextTick() const {
  TimePoint next =
      std::min(last_ping_ + limits_.keepalive_interval, last_received_ + limits_.keepalive_timeout);
  return received_ > ack_sent_ ? std::min(next, ack_due_) : next;
}

void Session::onTransportLost() {
  attached_ = false;
  control_.clear();
  control_bytes_ = 0;
  queued_pong_.reset();
  queued_ack_.reset();
  queued_ping_.reset();
  decoder_.reset();
  write_next_ = 0;
  recountUnsent();
}

absl::Status Session::resume(uint64_t peer_last_received, TimePoint now) {
  if (attached_) onTransportLost();
  if (peer_last_received < acked_ || peer_last_received > sent_) {
    return protoError(v1::RESUME_FAILED,
                      absl::StrCat("peer resumes after frame ", peer_last_received, " but frames ",
                                   acked_ + 1, "..", sent_, " are what can be replayed"));
  }
  while (acked_ < peer_last_received) {
    replay_bytes_ -= replay_.front()->size();
    replay_.pop_front();
    ++acked_;
  }
  write_next_ = 0;
  recountUnsent();
  attached_ = true;
  ++attachment_;
  recheck_writable_ = true;
  last_received_ = now;
  last_ping_ = now;
  now_ = now;
  // Tell the peer at once what we hold, so its replay buffer shrinks.
  queueAck();
  return absl::OkStatus();
}

absl::Status Session::attach(uint64_t n) {
  if (n != attachment_ || !attached_) {
    return protoError(
        v1::FAILED_PRECONDITION,
        absl::StrCat("attachment ", n, " of the session was superseded by ", attachment_,
                     attached_ ? "" : " (detached)", ": a later resume took the session over"));
  }
  // Only the winner's transport writes from here: its peer has what
  // resume() dropped, nothing after, so the replay starts at the first
  // frame it lacks even if another transport took frames since.
  write_next_ = 0;
  recountUnsent();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Session::sendRequest(v1::Request request) {
  if (pending_requests_.size() >= limits_.max_pending_requests) {
    return limitHit(protoError(
        v1::TOO_MANY_PENDING_REQUESTS,
        limitReached("pending request", limits_.max_pending_requests, "--max-pending-requests")));
  }
  uint64_t id = next_request_id_++;
  request.set_request_id(id);
  pending_requests_.insert(id);
  v1::Frame f;
  *f.mutable_request() = std::move(request);
  queueSequenced(f);
  return id;
}

absl::StatusOr<size_t> Session::reserveResponse(uint64_t request_id, size_t wanted) {
  if (!incoming_requests_.contains(request_id)) return wanted;
  const uint64_t used = bufferedBytes();
  const uint64_t room = answerCap() > used ? answerCap() - used : 0;
  if (room == 0) {
    return limitHit(
        protoError(v1::SESSION_BUFFER_FULL,
                   absl::StrCat("no room for the answer: the agent holds ", used,
                                " bytes the client has not acknowledged, ", bufferLimitText(),
                                "; retry once the client has read what is on its way")));
  }
  const size_t granted = static_cast<size_t>(std::min<uint64_t>(wanted, room));
  reserved_[request_id] += granted;
  reserved_total_ += granted;
  return granted;
}

bool Session::admitResponse(v1::Response& response, size_t size) {
  incoming_requests_.erase(response.request_id());
  uint64_t reserved = 0;
  if (auto it = reserved_.find(response.request_id()); it != reserved_.end()) {
    reserved = it->second;
    reserved_total_ -= reserved;
    reserved_.erase(it);
  }
  if (size <= kSmallResponse || size <= reserved + kSmallResponse ||
      bufferedBytes() + size <= answerCap()) {
    return true;
  }
  absl::Status full = limitHit(protoError(
      v1::SESSION_BUFFER_FULL,
      absl::StrCat("answer of ", size, " bytes dropped: the agent holds ", bufferedBytes(),
                   " bytes the client has not acknowledged and answers may take ",
                   bufferLimitText())));
  v1::Response error;
  error.set_request_id(response.request_id());
  *error.mutable_error() = toProtoError(full);
  response = std::move(error);
  return false;
}

void Session::sendResponse(v1::Response response, std::shared_ptr<PipedBytes> data) {
  if (!admitResponse(response, response.ByteSizeLong() + data->size())) {
    sendResponse(std::move(response));
    return;
  }
  auto out = std::make_shared<OutFrame>();
  out->head = encodeFileDataResponseHead(response, data->size());
  out->piped = std::move(data);
  queueSequenced(std::move(out));
}

void Session::sendResponse(v1::Response response) {
  // An answer already admitted (the piped form's refusal) passes again:
  // its request is no longer pending, so nothing is reserved for it.
  (void)admitResponse(response, response.ByteSizeLong());
  if (response.has_file() && response.file().has_data() &&
      response.file().data().data().size() >= kDetachedDataMin) {
    // A file read's bytes go to the socket from where they were read into,
    // after a hand-written header: no copy into a serialised frame.
    auto out = std::make_shared<OutFrame>();
    v1::FileData* fd = response.mutable_file()->mutable_data();
    out->payload = std::move(*fd->mutable_data());
    fd->clear_data();
    out->head = encodeFileDataResponseHead(response, out->payload.size());
    queueSequenced(std::move(out));
    return;
  }
  v1::Frame f;
  *f.mutable_response() = std::move(response);
  queueSequenced(f);
}

std::vector<uint64_t> Session::pendingRequestIds() const {
  std::vector<uint64_t> ids(pending_requests_.begin(), pending_requests_.end());
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::StatusOr<uint64_t> Session::openStream(v1::StreamOpen open) {
  if (streams_.size() >= limits_.max_streams) {
    return limitHit(protoError(v1::TOO_MANY_STREAMS,
                               limitReached("stream", limits_.max_streams, "--max-streams")));
  }
  uint64_t id = next_stream_id_;
  next_stream_id_ += 2;
  open.set_stream_id(id);
  if (open.initial_window() == 0) open.set_initial_window(limits_.initial_stream_window);
  Stream& s = streams_[id];
  s.recv_credit = s.recv_window = open.initial_window();
  s.last_update = now_;
  if (early_send_) {
    s.early = true;
    s.send_credit = limits_.initial_stream_window;
  }
  v1::Frame f;
  *f.mutable_open() = std::move(open);
  queueSequenced(f);
  return id;
}

absl::Status Session::acceptStream(v1::StreamAccept accept) {
  auto it = streams_.find(accept.stream_id());
  if (it == streams_.end() || isLocalStream(accept.stream_id()) || it->second.accepted) {
    return protoError(v1::STREAM_CLOSED,
                      absl::StrCat("no stream ", accept.stream_id(), " waiting to be accepted"));
  }
  if (accept.initial_window() == 0) accept.set_initial_window(limits_.initial_stream_window);
  Stream& s = it->second;
  s.accepted = true;
  if (early_receive_) {
    // The peer's early credit counts toward this window: never grant less,
    // and add only the rest (what was consumed meanwhile went back as
    // window updates already).
    const uint32_t early = limits_.initial_stream_window;
    if (accept.initial_window() < early) accept.set_initial_window(early);
    s.recv_credit += accept.initial_window() - early;
    s.recv_window += accept.initial_window() - early;
  } else {
    s.recv_credit = s.recv_window = accept.initial_window();
  }
  s.last_update = now_;
  v1::Frame f;
  *f.mutable_accept() = std::move(accept);
  queueSequenced(f);
  return absl::OkStatus();
}

void Session::unboundUnsent(uint64_t stream_id) {
  if (auto it = streams_.find(stream_id); it != streams_.end()) {
    it->second.unsent_bound = UINT64_MAX;
  }
}

size_t Session::sendCredit(uint64_t stream_id, size_t wanted) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || !(it->second.accepted || it->second.early) ||
      it->second.local_closed) {
    return 0;
  }
  uint64_t c = std::min({it->second.send_credit, replayFree(), unsentRoom(it->second)});
  if (c == 0 || c < wanted) {
    it->second.wants_write = true;
    any_wants_write_ = true;
  }
  return static_cast<size_t>(c);
}

absl::Status Session::sendData(uint64_t stream_id, std::string payload) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || it->second.local_closed) {
    return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", stream_id, " is closed"));
  }
  Stream& s = it->second;
  if (!s.accepted && !s.early) {
    return protoError(v1::FLOW_CONTROL_ERROR,
                      absl::StrCat("stream ", stream_id, " is not accepted yet"));
  }
  // The credit is sendCredit(): the stream's own and the replay buffer's, so
  // the buffer stays within its bound whatever the caller does.
  uint64_t credit = std::min({s.send_credit, replayFree(), unsentRoom(s)});
  if (payload.size() > credit) {
    return protoError(
        v1::FLOW_CONTROL_ERROR,
        absl::StrCat(payload.size(), " bytes on stream ", stream_id, " beyond its credit of ",
                     credit, " (stream ", s.send_credit, ", replay buffer ", replayFree(),
                     ", unsent ", s.unsent, " of ", s.unsent_bound, ")"));
  }
  s.send_credit -= payload.size();
  s.unsent += payload.size();
  size_t max_chunk = limits_.max_frame_size - kDataFrameOverhead;
  auto emit = [&](std::string chunk) {
    auto out = std::make_shared<OutFrame>();
    char header[kMaxDataHeaderSize];
    size_t n = encodeDataHeader(stream_id, chunk.size(), header);
    out->head.assign(header, n);
    out->payload = std::move(chunk);
    out->stream_id = stream_id;
    queueStreamFrame(std::move(out));
  };
  if (payload.size() <= max_chunk) {
    emit(std::move(payload));  // the common case: no copy
    return absl::OkStatus();
  }
  for (size_t at = 0; at < payload.size(); at += max_chunk) {
    emit(payload.substr(at, max_chunk));
  }
  return absl::OkStatus();
}

absl::Status Session::sendDatagram(v1::StreamDatagram datagram) {
  auto it = streams_.find(datagram.stream_id());
  if (it == streams_.end() || it->second.local_closed) {
    return protoError(v1::STREAM_CLOSED,
                      absl::StrCat("stream ", datagram.stream_id(), " is closed"));
  }
  if (!it->second.accepted || datagram.payload().size() > it->second.send_credit) {
    return protoError(v1::FLOW_CONTROL_ERROR,
                      absl::StrCat("datagram beyond the credit of stream ", datagram.stream_id()));
  }
  it->second.send_credit -= datagram.payload().size();
  v1::Frame f;
  *f.mutable_datagram() = std::move(datagram);
  auto out = std::make_shared<OutFrame>();
  encodeFrame(f, &out->head);
  out->stream_id = f.datagram().stream_id();  // its bytes are in head: unsent counts 0
  queueStreamFrame(std::move(out));
  return absl::OkStatus();
}

absl::Status Session::halfClose(uint64_t stream_id) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || it->second.local_closed) {
    return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", stream_id, " is closed"));
  }
  it->second.local_closed = true;
  v1::Frame f;
  f.mutable_half_close()->set_stream_id(stream_id);
  queueSequenced(f);
  maybeClose(stream_id);
  return absl::OkStatus();
}

void Session::resetStream(uint64_t stream_id, v1::Error error) {
  if (!forget(stream_id)) return;
  v1::Frame f;
  f.mutable_reset()->set_stream_id(stream_id);
  *f.mutable_reset()->mutable_error() = std::move(error);
  queueSequenced(f);
}

absl::Status Session::sendGap(v1::StreamGap gap) {
  auto it = streams_.find(gap.stream_id());
  if (it == streams_.end() || it->second.local_closed) {
    return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", gap.stream_id(), " is closed"));
  }
  v1::Frame f;
  *f.mutable_gap() = std::move(gap);
  queueSequenced(f);
  return absl::OkStatus();
}

void Session::consumed(uint64_t stream_id, size_t n) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end() || it->second.remote_closed) return;
  Stream& s = it->second;
  s.unreported += n;
  // Return credit in chunks of a quarter window: fewer frames, and the
  // sender never runs dry while we are keeping up.
  if (s.unreported >= std::max<uint32_t>(s.recv_window / 4, 1)) {
    uint64_t increment = s.unreported;
    // A reader that keeps up gets a larger window: the sender waits for
    // credit less, and credit goes back in larger (so fewer) steps.
    const auto grow_period = std::max<std::chrono::microseconds>(kWindowGrowPeriod, 2 * path_rtt_);
    if (now_ - s.last_update < grow_period && s.recv_window < limits_.max_stream_window &&
        window_growth_ < limits_.window_growth_budget) {
      const uint64_t grow =
          std::min<uint64_t>({s.recv_window, limits_.max_stream_window - s.recv_window,
                              limits_.window_growth_budget - window_growth_});
      s.recv_window += static_cast<uint32_t>(grow);
      s.grown += static_cast<uint32_t>(grow);
      window_growth_ += grow;
      increment += grow;
    }
    s.last_update = now_;
    v1::Frame f;
    f.mutable_window_update()->set_stream_id(stream_id);
    f.mutable_window_update()->set_increment(static_cast<uint32_t>(increment));
    s.recv_credit += increment;
    s.unreported = 0;
    queueSequenced(f);
  }
}

void Session::forget(std::unordered_map<uint64_t, Stream>::iterator it) {
  window_growth_ -= it->second.grown;
  streams_.erase(it);
}

bool Session::forget(uint64_t stream_id) {
  auto it = streams_.find(stream_id);
  if (it == streams_.end()) return false;
  forget(it);
  return true;
}

std::vector<uint64_t> Session::streamIds() const {
  std::vector<uint64_t> ids;
  for (const auto& [id, s] : streams_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void Session::maybeClose(uint64_t stream_id) {
  auto it = streams_.find(stream_id);
  if (it != streams_.end() && it->second.local_closed && it->second.remote_closed) {
    forget(it);
  }
}

void Session::sendDraining(v1::Draining draining) {
  v1::Frame f;
  *f.mutable_draining() = std::move(draining);
  queueSequenced(f);
}

void Session::sendNotice(v1::SubscriptionNotice notice) {
  v1::Frame f;
  *f.mutable_notice() = std::move(notice);
  queueSequenced(f);
}

void Session::sendFileEvents(v1::FileEvents events) {
  v1::Frame f;
  *f.mutable_file_events() = std::move(events);
  queueSequenced(f);
}

void Session::sendTargetRestarted(v1::TargetRestarted restarted) {
  v1::Frame f;
  *f.mutable_target_restarted() = std::move(restarted);
  queueSequenced(f);
}

void Session::sendGoaway(v1::ErrorCode code, std::string_view message) {
  v1::Frame f;
  f.mutable_goaway()->set_code(code);
  f.mutable_goaway()->set_message(std::string(message));
  queueControl(f);
}

// ---- handover ----

absl::Status Session::exportState(v1::SessionState* out) {
  if (attached_) {
    return absl::FailedPreconditionError("the session still has a transport");
  }
  if (!incoming_requests_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(incoming_requests_.size(), " requests of the client are not answered yet"));
  }
  if (reserved_total_ != 0 || !reserved_.empty()) {
    return absl::FailedPreconditionError("room is reserved for an answer being prepared");
  }
  out->Clear();
  setLimitsOf(limits_, out);
  for (const auto& f : replay_) {
    v1::ReplayFrame& r = *out->add_replay();
    r.set_head(f->head);
    std::string payload = f->payload;
    if (f->piped) {
      // The pipe is read once (materialize() keeps the bytes): the old
      // agent, going on after a failed handover, sends the same bytes.
      auto bytes = f->piped->materialize();
      if (!bytes.ok()) return bytes.status();
      payload.append(*bytes);
    }
    r.set_payload(std::move(payload));
    r.set_stream_id(f->stream_id);
  }
  out->set_acked(acked_);
  out->set_sent(sent_);
  out->set_taken(taken_);
  out->set_attachment(attachment_);
  out->set_received(received_);
  out->set_ack_sent(ack_sent_);
  out->set_ping_nonce(ping_nonce_);
  out->set_next_request_id(next_request_id_);
  std::vector<uint64_t> pending(pending_requests_.begin(), pending_requests_.end());
  std::sort(pending.begin(), pending.end());
  for (uint64_t id : pending) out->add_pending_requests(id);
  out->set_next_stream_id(next_stream_id_);
  out->set_highest_peer_stream(highest_peer_stream_);
  std::vector<uint64_t> ids = streamIds();
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    const Stream& s = streams_.at(id);
    v1::StreamState& o = *out->add_streams();
    o.set_id(id);
    o.set_accepted(s.accepted);
    o.set_early(s.early);
    o.set_unsent(s.unsent);
    o.set_send_credit(s.send_credit);
    o.set_recv_credit(s.recv_credit);
    o.set_unreported(s.unreported);
    o.set_recv_window(s.recv_window);
    o.set_grown(s.grown);
    o.set_local_closed(s.local_closed);
    o.set_remote_closed(s.remote_closed);
    o.set_wants_write(s.wants_write);
    o.set_unsent_bound(s.unsent_bound);
  }
  out->set_window_growth(window_growth_);
  out->set_early_send(early_send_);
  out->set_early_receive(early_receive_);
  out->set_path_rtt_us(static_cast<uint64_t>(path_rtt_.count()));
  return absl::OkStatus();
}

SessionLimits Session::limitsOf(const v1::SessionState& state) {
  SessionLimits l;
  l.max_frame_size = state.max_frame_size();
  l.initial_stream_window = state.initial_stream_window();
  l.max_streams = state.max_streams();
  l.max_pending_requests = state.max_pending_requests();
  l.replay_buffer_bytes = state.replay_buffer_bytes();
  l.keepalive_interval = std::chrono::milliseconds(state.keepalive_interval_ms());
  l.keepalive_timeout = std::chrono::milliseconds(state.keepalive_timeout_ms());
  l.session_grace = std::chrono::milliseconds(state.session_grace_ms());
  l.max_read_size = state.max_read_size();
  l.max_stream_window = state.max_stream_window();
  l.window_growth_budget = state.window_growth_budget();
  return l;
}

void Session::setLimitsOf(const SessionLimits& l, v1::SessionState* state) {
  state->set_max_frame_size(l.max_frame_size);
  state->set_initial_stream_window(l.initial_stream_window);
  state->set_max_streams(l.max_streams);
  state->set_max_pending_requests(l.max_pending_requests);
  state->set_replay_buffer_bytes(l.replay_buffer_bytes);
  state->set_keepalive_interval_ms(static_cast<uint64_t>(l.keepalive_interval.count()));
  state->set_keepalive_timeout_ms(static_cast<uint64_t>(l.keepalive_timeout.count()));
  state->set_session_grace_ms(static_cast<uint64_t>(l.session_grace.count()));
  state->set_max_read_size(l.max_read_size);
  state->set_max_stream_window(l.max_stream_window);
  state->set_window_growth_budget(l.window_growth_budget);
}

absl::Status Session::restoreState(const v1::SessionState& state, TimePoint now) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("handover state: ", what));
  };
  if (state.acked() > state.sent() ||
      state.sent() - state.acked() != static_cast<uint64_t>(state.replay_size())) {
    return bad(absl::StrCat("frames ", state.acked() + 1, "..", state.sent(), " but ",
                            state.replay_size(), " are held"));
  }
  if (state.taken() > state.sent() || state.ack_sent() > state.received()) {
    return bad("counters out of order");
  }
  if (state.next_stream_id() == 0 || isLocalStream(state.next_stream_id()) == false) {
    return bad(absl::StrCat("stream id ", state.next_stream_id(), " is not this side's"));
  }
  limits_ = limitsOf(state);
  decoder_.reset();
  decoder_.setMaxFrameSize(limits_.max_frame_size);
  attached_ = false;
  replay_.clear();
  replay_bytes_ = 0;
  for (const v1::ReplayFrame& r : state.replay()) {
    auto f = std::make_shared<OutFrame>();
    f->head = r.head();
    f->payload = r.payload();
    f->sequenced = true;
    f->stream_id = r.stream_id();
    replay_bytes_ += f->size();
    replay_.push_back(std::move(f));
  }
  acked_ = state.acked();
  sent_ = state.sent();
  write_next_ = 0;
  taken_ = state.taken();
  path_rtt_ = std::chrono::microseconds(state.path_rtt_us());
  control_.clear();
  control_bytes_ = 0;
  queued_pong_.reset();
  queued_ack_.reset();
  queued_ping_.reset();
  attachment_ = state.attachment();
  received_ = state.received();
  ack_sent_ = state.ack_sent();
  unacked_in_bytes_ = 0;
  ack_due_ = TimePoint::max();
  now_ = now;
  last_received_ = now;
  last_ping_ = now;
  ping_nonce_ = state.ping_nonce();
  next_request_id_ = state.next_request_id();
  pending_requests_.clear();
  pending_requests_.insert(state.pending_requests().begin(), state.pending_requests().end());
  incoming_requests_.clear();
  next_stream_id_ = state.next_stream_id();
  highest_peer_stream_ = state.highest_peer_stream();
  streams_.clear();
  any_wants_write_ = false;
  for (const v1::StreamState& o : state.streams()) {
    if (o.id() == 0 ||
        (isLocalStream(o.id()) ? o.id() >= next_stream_id_ : o.id() > highest_peer_stream_)) {
      return bad(absl::StrCat("stream ", o.id(), " was never opened"));
    }
    Stream s;
    s.accepted = o.accepted();
    s.early = o.early();
    s.send_credit = o.send_credit();
    s.recv_credit = o.recv_credit();
    s.unreported = o.unreported();
    s.recv_window = o.recv_window();
    s.grown = o.grown();
    s.last_update = now;
    s.local_closed = o.local_closed();
    s.remote_closed = o.remote_closed();
    s.wants_write = o.wants_write();
    s.unsent_bound = o.unsent_bound();
    any_wants_write_ = any_wants_write_ || s.wants_write;
    streams_.emplace(o.id(), s);
  }
  window_growth_ = state.window_growth();
  early_send_ = state.early_send();
  early_receive_ = state.early_receive();
  recheck_writable_ = true;
  unsent_drained_ = false;
  reserved_.clear();
  reserved_total_ = 0;
  recountUnsent();
  return absl::OkStatus();
}

}  // namespace siphon::protocol
