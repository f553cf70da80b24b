// The typed stream APIs: Connection and Connections
// (siphon/client/connections.h), MirroredConnection and Capture
// (subscriptions.h, capture.h), over ClientStream.
#include "siphon/client/connections.h"

#include "absl/strings/str_cat.h"
#include "client/target_core.h"
#include "siphon/client/capture.h"
#include "siphon/client/subscriptions.h"
#include "siphon/status.h"

namespace siphon::client {

namespace {

absl::Status noStream() { return protoError(v1::FAILED_PRECONDITION, "no connection"); }

Direction directionOf(v1::Direction d) {
  switch (d) {
    case v1::CLIENT_TO_SERVER:
      return Direction::kClientToServer;
    case v1::SERVER_TO_CLIENT:
      return Direction::kServerToClient;
    default:
      return Direction::kUnspecified;
  }
}

}  // namespace

// ------------------------------------------------------------- Connection

uint64_t Connection::streamId() const { return stream_ ? stream_->id() : 0; }

net::awaitable<absl::StatusOr<std::optional<std::string>>> Connection::read() {
  const auto stream = stream_;
  if (!stream) co_return noStream();
  co_return co_await stream->read();
}

net::awaitable<absl::Status> Connection::write(std::string data) {
  const auto stream = stream_;
  if (!stream) co_return noStream();
  if (kind_ == Kind::kUdp || kind_ == Kind::kUnixSeqpacket) {
    co_return co_await stream->writeMessage(std::move(data));
  }
  co_return co_await stream->write(std::move(data));
}

absl::Status Connection::halfClose() {
  if (!stream_) return noStream();
  return stream_->halfClose();
}

void Connection::reset() {
  if (stream_) stream_->reset(v1::CANCELLED, "closed by the client");
}

void Connection::reset(ErrorCode code, std::string_view why) {
  if (stream_) stream_->reset(static_cast<v1::ErrorCode>(static_cast<int>(code)), why);
}

void Connection::setSink(Sink sink) {
  if (stream_) stream_->setSink(std::move(sink));
}

net::awaitable<absl::StatusOr<std::optional<Datagram>>> Connection::receiveFrom() {
  const auto stream = stream_;
  if (!stream) co_return noStream();
  auto d = co_await stream->readDatagram();
  if (!d.ok()) co_return d.status();
  if (!d->has_value()) co_return std::optional<Datagram>();
  co_return std::optional<Datagram>(
      Datagram{fromProto((*d)->peer()), std::move(*(*d)->mutable_payload())});
}

net::awaitable<absl::Status> Connection::sendTo(SocketAddress peer, std::string payload) {
  const auto stream = stream_;
  if (!stream) co_return noStream();
  co_return co_await stream->writeDatagram(toProto(peer), std::move(payload));
}

// ------------------------------------------------------------ Connections

Connections::Connections(const Target& target) : core_(target.core()) {}

namespace {

net::awaitable<absl::StatusOr<Connection>> openOutgoing(std::shared_ptr<TargetCore> core_in,
                                                        Connection::Kind kind,
                                                        v1::OutgoingConnect outgoing) {
  const std::shared_ptr<TargetCore> core = std::move(core_in);
  v1::StreamOpen open;
  *open.mutable_outgoing() = std::move(outgoing);
  auto stream = co_await core->client->openStream(std::move(open));
  if (!stream.ok()) co_return stream.status();
  SocketAddress local, remote;
  if (const auto& accepted = (*stream)->accepted()) {
    local = fromProto(accepted->local());
    remote = fromProto(accepted->remote());
  }
  co_return TargetCore::makeConnection(kind, std::move(*stream), std::move(local),
                                       std::move(remote));
}

v1::OutgoingConnect inet(v1::OutgoingConnect::Protocol p, std::string host, uint16_t port) {
  v1::OutgoingConnect o;
  o.set_protocol(p);
  o.set_host(std::move(host));
  o.set_port(port);
  return o;
}

v1::OutgoingConnect unixSocket(v1::OutgoingConnect::Protocol p, std::string path) {
  v1::OutgoingConnect o;
  o.set_protocol(p);
  o.set_unix_path(std::move(path));
  return o;
}

}  // namespace

net::awaitable<absl::StatusOr<Connection>> Connections::connectTcp(std::string host,
                                                                   uint16_t port) {
  co_return co_await openOutgoing(core_, Connection::Kind::kTcp,
                                  inet(v1::OutgoingConnect::TCP, std::move(host), port));
}

net::awaitable<absl::StatusOr<Connection>> Connections::connectUdp(std::string host,
                                                                   uint16_t port) {
  co_return co_await openOutgoing(core_, Connection::Kind::kUdp,
                                  inet(v1::OutgoingConnect::UDP, std::move(host), port));
}

net::awaitable<absl::StatusOr<Connection>> Connections::openUdp() {
  co_return co_await openOutgoing(core_, Connection::Kind::kUnconnectedUdp,
                                  inet(v1::OutgoingConnect::UDP, "", 0));
}

net::awaitable<absl::StatusOr<Connection>> Connections::connectUnix(std::string path) {
  co_return co_await openOutgoing(core_, Connection::Kind::kUnixStream,
                                  unixSocket(v1::OutgoingConnect::UNIX_STREAM, std::move(path)));
}

net::awaitable<absl::StatusOr<Connection>> Connections::connectSeqpacket(std::string path) {
  co_return co_await openOutgoing(core_, Connection::Kind::kUnixSeqpacket,
                                  unixSocket(v1::OutgoingConnect::UNIX_SEQPACKET, std::move(path)));
}

// ----------------------------------------------------- MirroredConnection

net::awaitable<absl::StatusOr<std::optional<MirrorEvent>>> MirroredConnection::next() {
  const auto stream = stream_;
  if (!stream) co_return noStream();
  auto e = co_await stream->readEvent();
  if (!e.ok()) co_return e.status();
  if (!e->has_value()) {
    // The agent sent all it had. It reads nothing on this stream: our
    // half-close back only lets both sides forget it.
    (void)stream->halfClose();
    co_return std::optional<MirrorEvent>();
  }
  StreamEvent& event = **e;
  MirrorEvent out;
  if (event.gap) {
    out.kind = MirrorEvent::Kind::kGap;
    out.direction = directionOf(event.gap->direction());
    out.gap_bytes = event.gap->bytes();
    co_return out;
  }
  // A record: the direction byte, then the bytes; the byte alone is a FIN.
  // Anything else is the agent's mistake: the copy ends (the stream reset
  // with PROTOCOL_ERROR), since what follows could not be trusted either.
  const char* malformed = nullptr;
  if (event.data.empty()) {
    malformed = "an empty record";
  } else {
    out.direction = directionOf(static_cast<v1::Direction>(event.data[0]));
    if (out.direction == Direction::kUnspecified) malformed = "a record of no known direction";
  }
  if (malformed != nullptr) {
    const std::string why = absl::StrCat("malformed mirror record: ", malformed);
    stream->reset(v1::PROTOCOL_ERROR, why);
    co_return protoError(v1::PROTOCOL_ERROR, why);
  }
  if (event.data.size() == 1) {
    out.kind = MirrorEvent::Kind::kFin;
  } else {
    out.kind = MirrorEvent::Kind::kData;
    out.bytes = event.data.substr(1);
  }
  co_return out;
}

void MirroredConnection::stop() { stop(ErrorCode::kCancelled, "mirror stopped by the client"); }

void MirroredConnection::stop(ErrorCode code, std::string_view why) {
  if (stream_) stream_->reset(static_cast<v1::ErrorCode>(static_cast<int>(code)), why);
}

// ---------------------------------------------------------------- Capture

net::awaitable<absl::StatusOr<Capture>> Capture::start(const Target& target, CaptureSpec spec) {
  const std::shared_ptr<TargetCore> core = target.core();
  v1::StreamOpen open;
  if (spec.window > 0) open.set_initial_window(spec.window);
  open.mutable_capture()->set_interface(std::move(spec.interface));
  open.mutable_capture()->set_filter(std::move(spec.filter));
  open.mutable_capture()->set_snaplen(spec.snaplen);
  auto stream = co_await core->client->openStream(std::move(open));
  if (!stream.ok()) co_return stream.status();
  Capture c;
  c.stream_ = std::move(*stream);
  co_return c;
}

net::awaitable<absl::StatusOr<std::optional<CaptureEvent>>> Capture::next() {
  const auto stream = stream_;
  if (!stream) co_return noStream();
  auto e = co_await stream->readEvent();
  if (!e.ok()) co_return e.status();
  if (!e->has_value()) co_return std::optional<CaptureEvent>();
  CaptureEvent out;
  if ((*e)->gap) {
    out.kind = CaptureEvent::Kind::kGap;
    out.gap_bytes = (*e)->gap->bytes();
    out.gap_packets = (*e)->gap->packets();
    co_return out;
  }
  out.kind = header_seen_ ? CaptureEvent::Kind::kPacket : CaptureEvent::Kind::kHeader;
  header_seen_ = true;
  out.bytes = std::move((*e)->data);
  co_return out;
}

absl::Status Capture::finish() {
  if (!stream_) return noStream();
  return stream_->halfClose();
}

void Capture::stop() { stop(ErrorCode::kCancelled, "capture stopped by the client"); }

void Capture::stop(ErrorCode code, std::string_view why) {
  if (stream_) stream_->reset(static_cast<v1::ErrorCode>(static_cast<int>(code)), why);
}

}  // namespace siphon::client
