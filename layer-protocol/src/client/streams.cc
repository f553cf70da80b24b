// Streams: ClientStream, and the stream frames a Link's session hands on
// (data, gaps, datagrams, half-closes, resets, credit).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/link.h"
#include "siphon/status.h"

namespace siphon::client {

// ------------------------------------------------- the Link's stream frames

void Link::onStreamAccept(v1::StreamAccept accept) {
  if (auto s = stream(accept.stream_id())) {
    s->accepted_ = std::move(accept);
    s->writable_.notify();
  }
}

void Link::onStreamData(uint64_t id, std::string_view payload) {
  auto s = stream(id);
  if (!s) {
    // Nobody reads it any more: hand the credit back so the peer is not stuck.
    session->consumed(id, payload.size());
    return;
  }
  // Only with nothing queued: a payload must not pass queued data, nor a
  // queued gap (the sink would get bytes from after the gap first).
  if (s->incoming_.empty() && s->sink_) {
    size_t taken = std::min(s->sink_(payload), payload.size());
    if (taken > 0) {
      session->consumed(id, taken);
      payload.remove_prefix(taken);
    }
    if (payload.empty()) return;
  }
  s->incoming_.push_back(StreamEvent{std::string(payload), std::nullopt});
  s->readable_.notify();
}

// The session drops gaps of unknown streams and refuses them after the
// peer's half-close, so a gap always comes before the end.
void Link::onStreamGap(v1::StreamGap gap) {
  auto s = stream(gap.stream_id());
  if (!s) return;  // nobody reads it; a gap holds no credit
  s->incoming_.push_back(StreamEvent{std::string(), std::move(gap)});
  s->readable_.notify();
}

void Link::onStreamDatagram(v1::StreamDatagram datagram) {
  auto s = stream(datagram.stream_id());
  if (!s) {
    session->consumed(datagram.stream_id(), datagram.payload().size());
    return;
  }
  s->datagrams_.push_back(std::move(datagram));
  s->readable_.notify();
}

void Link::onStreamHalfClose(uint64_t id) {
  if (auto s = stream(id)) {
    s->eof_ = true;
    s->readable_.notify();
  }
}

void Link::onStreamReset(uint64_t id, v1::Error error) {
  auto it = streams.find(id);
  if (it == streams.end()) return;
  if (auto s = it->second.lock()) {
    s->error_ = fromProtoError(error);
    s->readable_.notify();
    s->writable_.notify();
  }
  streams.erase(it);
}

void Link::onStreamWritable(uint64_t id) {
  if (auto s = stream(id)) s->writable_.notify();
}

void Link::onGoaway(v1::Goaway g) {
  // OK or no code still ends the session: never leave goaway OK here.
  v1::ErrorCode code = g.code();
  if (code == v1::ERROR_CODE_UNSPECIFIED || code == v1::OK) code = v1::CANCELLED;
  goaway = protoError(code, absl::StrCat("the agent ended the session: ", g.message()));
}

std::pair<size_t, size_t> Link::failAll(const absl::Status& why) {
  size_t requests = 0, reset = 0;
  for (auto& [id, p] : pending) {
    if (p->result) continue;
    p->result = why;
    p->done.notify();
    ++requests;
  }
  for (auto& [id, weak] : streams) {
    auto s = weak.lock();
    if (!s) continue;
    if (s->error_.ok()) {
      s->error_ = why;
      if (session->streamOpen(id)) ++reset;
    }
    s->readable_.notify();
    s->writable_.notify();
  }
  return {requests, reset};
}

// ------------------------------------------------------------- ClientStream

ClientStream::ClientStream(std::shared_ptr<Client> client, std::shared_ptr<Link> link, uint64_t id)
    : client_(std::move(client)),
      link_(std::move(link)),
      id_(id),
      readable_(client_->ex_),
      writable_(client_->ex_) {}

namespace {

const char* directionText(v1::Direction d) {
  switch (d) {
    case v1::CLIENT_TO_SERVER:
      return "client->server";
    case v1::SERVER_TO_CLIENT:
      return "server->client";
    default:
      return "unspecified direction";
  }
}

}  // namespace

net::awaitable<absl::StatusOr<std::optional<std::string>>> ClientStream::read() {
  while (true) {
    if (!incoming_.empty()) {
      if (const auto& gap = incoming_.front().gap) {
        // Left queued: every read() says it, readEvent() can still take it.
        co_return protoError(
            v1::FAILED_PRECONDITION,
            absl::StrCat("stream ", id_, " has a gap (", gap->bytes(), " bytes ",
                         directionText(gap->direction()), " lost): read it with readEvent()"));
      }
      std::string chunk = std::move(incoming_.front().data);
      incoming_.pop_front();
      // Credit goes back only as the application reads: a reader that stops
      // stops the agent reading this stream's socket, nothing else.
      link_->session->consumed(id_, chunk.size());
      link_->wake();
      co_return std::optional<std::string>(std::move(chunk));
    }
    if (!error_.ok()) co_return error_;
    if (eof_) co_return std::optional<std::string>();
    co_await readable_.wait();
  }
}

net::awaitable<absl::StatusOr<std::optional<StreamEvent>>> ClientStream::readEvent() {
  while (true) {
    if (!incoming_.empty()) {
      StreamEvent event = std::move(incoming_.front());
      incoming_.pop_front();
      if (!event.gap) {
        // As in read(): credit goes back as the application takes the bytes.
        link_->session->consumed(id_, event.data.size());
        link_->wake();
      }
      co_return std::optional<StreamEvent>(std::move(event));
    }
    if (!error_.ok()) co_return error_;
    if (eof_) co_return std::optional<StreamEvent>();
    co_await readable_.wait();
  }
}

net::awaitable<absl::Status> ClientStream::write(std::string data) {
  while (!data.empty()) {
    if (!error_.ok()) co_return error_;
    if (!link_->lost.ok()) co_return link_->lost;
    size_t credit = link_->session->sendCredit(id_);
    if (credit == 0) {
      if (!link_->session->streamOpen(id_)) {
        co_return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", id_, " is closed"));
      }
      co_await writable_.wait();
      continue;
    }
    std::string chunk;
    if (credit >= data.size()) {
      chunk = std::move(data);
      data.clear();
    } else {
      chunk = data.substr(0, credit);
      data.erase(0, credit);
    }
    absl::Status s = link_->session->sendData(id_, std::move(chunk));
    if (!s.ok()) co_return s;
    link_->wake();
  }
  co_return absl::OkStatus();
}

net::awaitable<absl::Status> ClientStream::writeMessage(std::string data) {
  const protocol::SessionLimits& limits = link_->session->limits();
  uint32_t window = accepted_ ? accepted_->initial_window() : 0;
  if (window == 0) window = limits.initial_stream_window;
  const size_t limit =
      std::min<size_t>(window - window / 4, limits.max_frame_size - protocol::kDataFrameOverhead);
  if (data.size() > limit) {
    co_return protoError(v1::INVALID_ARGUMENT,
                         absl::StrCat("a message of ", data.size(), " bytes is above the ", limit,
                                      " bytes one frame of stream ", id_, " can carry"));
  }
  while (true) {
    if (!error_.ok()) co_return error_;
    if (!link_->lost.ok()) co_return link_->lost;
    if (!link_->session->streamOpen(id_)) {
      co_return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", id_, " is closed"));
    }
    if (link_->session->sendCredit(id_, std::max<size_t>(data.size(), 1)) >= data.size()) break;
    co_await writable_.wait();
  }
  absl::Status s = link_->session->sendData(id_, std::move(data));
  if (s.ok()) link_->wake();
  co_return s;
}

net::awaitable<absl::StatusOr<std::optional<v1::StreamDatagram>>> ClientStream::readDatagram() {
  while (true) {
    if (!datagrams_.empty()) {
      v1::StreamDatagram d = std::move(datagrams_.front());
      datagrams_.pop_front();
      link_->session->consumed(id_, d.payload().size());
      link_->wake();
      co_return std::optional<v1::StreamDatagram>(std::move(d));
    }
    if (!error_.ok()) co_return error_;
    if (eof_) co_return std::optional<v1::StreamDatagram>();
    co_await readable_.wait();
  }
}

net::awaitable<absl::Status> ClientStream::writeDatagram(v1::SocketAddress peer,
                                                         std::string payload) {
  const size_t size = payload.size();
  while (true) {
    if (!error_.ok()) co_return error_;
    if (!link_->lost.ok()) co_return link_->lost;
    if (!link_->session->streamOpen(id_)) {
      co_return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", id_, " is closed"));
    }
    // A datagram goes whole: wait until the credit covers all of it.
    if (link_->session->sendCredit(id_, std::max<size_t>(size, 1)) >= size) break;
    co_await writable_.wait();
  }
  v1::StreamDatagram d;
  d.set_stream_id(id_);
  *d.mutable_peer() = std::move(peer);
  d.set_payload(std::move(payload));
  absl::Status s = link_->session->sendDatagram(std::move(d));
  if (s.ok()) link_->wake();
  co_return s;
}

absl::Status ClientStream::halfClose() {
  if (!link_->lost.ok()) return link_->lost;
  RETURN_IF_ERROR(link_->session->halfClose(id_));
  link_->wake();
  return absl::OkStatus();
}

void ClientStream::reset(v1::ErrorCode code, std::string_view message) {
  if (link_->lost.ok()) {
    link_->session->resetStream(id_, toProtoError(protoError(code, message)));
    link_->wake();
  }
  if (error_.ok()) error_ = protoError(v1::CANCELLED, "stream reset by this client");
  readable_.notify();
  writable_.notify();
}


}  // namespace siphon::client
