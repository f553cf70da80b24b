#include "siphon/client/client.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"

namespace siphon::client {

using net::asio::steady_timer;
namespace asio = net::asio;

// ------------------------------------------------------------- ClientStream

ClientStream::ClientStream(std::shared_ptr<Client> client, uint64_t id)
    : client_(std::move(client)), id_(id), readable_(client_->ex_), writable_(client_->ex_) {}

net::awaitable<absl::StatusOr<std::optional<std::string>>> ClientStream::read() {
  while (true) {
    if (!incoming_.empty()) {
      std::string chunk = std::move(incoming_.front());
      incoming_.pop_front();
      // Credit goes back only as the application reads: a reader that stops
      // stops the agent reading this stream's socket, nothing else.
      if (client_->session_) {
        client_->session_->consumed(id_, chunk.size());
        client_->wake();
      }
      co_return std::optional<std::string>(std::move(chunk));
    }
    if (!error_.ok()) co_return error_;
    if (eof_) co_return std::optional<std::string>();
    co_await readable_.wait();
  }
}

net::awaitable<absl::Status> ClientStream::write(std::string data) {
  while (!data.empty()) {
    if (!error_.ok()) co_return error_;
    if (!client_->lost_.ok()) co_return client_->lost_;
    size_t credit = client_->session_->sendCredit(id_);
    if (credit == 0) {
      if (!client_->session_->streamOpen(id_)) {
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
    absl::Status s = client_->session_->sendData(id_, std::move(chunk));
    if (!s.ok()) co_return s;
    client_->wake();
  }
  co_return absl::OkStatus();
}

net::awaitable<absl::Status> ClientStream::writeMessage(std::string data) {
  const protocol::SessionLimits& limits = client_->session_->limits();
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
    if (!client_->lost_.ok()) co_return client_->lost_;
    if (!client_->session_->streamOpen(id_)) {
      co_return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", id_, " is closed"));
    }
    if (client_->session_->sendCredit(id_, std::max<size_t>(data.size(), 1)) >= data.size()) break;
    co_await writable_.wait();
  }
  absl::Status s = client_->session_->sendData(id_, std::move(data));
  if (s.ok()) client_->wake();
  co_return s;
}

net::awaitable<absl::StatusOr<std::optional<v1::StreamDatagram>>> ClientStream::readDatagram() {
  while (true) {
    if (!datagrams_.empty()) {
      v1::StreamDatagram d = std::move(datagrams_.front());
      datagrams_.pop_front();
      if (client_->session_) {
        client_->session_->consumed(id_, d.payload().size());
        client_->wake();
      }
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
    if (!client_->lost_.ok()) co_return client_->lost_;
    if (!client_->session_->streamOpen(id_)) {
      co_return protoError(v1::STREAM_CLOSED, absl::StrCat("stream ", id_, " is closed"));
    }
    // A datagram goes whole: wait until the credit covers all of it.
    if (client_->session_->sendCredit(id_, std::max<size_t>(size, 1)) >= size) break;
    co_await writable_.wait();
  }
  v1::StreamDatagram d;
  d.set_stream_id(id_);
  *d.mutable_peer() = std::move(peer);
  d.set_payload(std::move(payload));
  absl::Status s = client_->session_->sendDatagram(std::move(d));
  if (s.ok()) client_->wake();
  co_return s;
}

absl::Status ClientStream::halfClose() {
  if (!client_->lost_.ok()) return client_->lost_;
  RETURN_IF_ERROR(client_->session_->halfClose(id_));
  client_->wake();
  return absl::OkStatus();
}

void ClientStream::reset(v1::ErrorCode code, std::string_view message) {
  if (client_->session_) {
    client_->session_->resetStream(id_, toProtoError(protoError(code, message)));
    client_->wake();
  }
  if (error_.ok()) error_ = protoError(v1::CANCELLED, "stream reset by this client");
  readable_.notify();
  writable_.notify();
}

// ------------------------------------------------------------------- Client

std::shared_ptr<Client> Client::create(asio::any_io_executor ex, ClientOptions options) {
  return std::shared_ptr<Client>(new Client(std::move(ex), std::move(options)));
}

Client::Client(asio::any_io_executor ex, ClientOptions options)
    : ex_(std::move(ex)), options_(std::move(options)) {}

Client::~Client() = default;

void Client::wake() {
  if (transport_) transport_->wake();
}

net::awaitable<absl::StatusOr<net::tcp::socket>> Client::dial(const std::string& endpoint) {
  std::string host, port;
  CO_RETURN_IF_ERROR(net::splitHostPort(endpoint, &host, &port));
  net::tcp::resolver resolver(ex_);
  net::error_code ec;
  auto results =
      co_await resolver.async_resolve(host, port, asio::redirect_error(net::use_awaitable, ec));
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat(endpoint, ": ", ec.message()));
  net::tcp::socket socket(ex_);
  steady_timer watchdog(ex_);
  auto fired = std::make_shared<bool>(false);
  watchdog.expires_after(options_.connect_timeout);
  watchdog.async_wait([fired, &socket](net::error_code e) {
    if (!e && !*fired) {
      *fired = true;
      net::error_code ignored;
      socket.close(ignored);
    }
  });
  co_await asio::async_connect(socket, results, asio::redirect_error(net::use_awaitable, ec));
  bool timed_out = *fired;
  *fired = true;  // disarm
  watchdog.cancel();
  if (timed_out) {
    co_return protoError(v1::UNAVAILABLE, absl::StrCat(endpoint, ": no answer within ",
                                                       options_.connect_timeout.count(), " ms"));
  }
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat(endpoint, ": ", ec.message()));
  co_return std::move(socket);
}

net::awaitable<absl::Status> Client::handshake(net::tcp::socket& socket, bool resume,
                                               std::string* leftover) {
  v1::ResumeRequest r;
  if (resume) {
    r.set_session_id(welcome_.session_id());
    r.set_resume_token(welcome_.resume_token());
    r.set_last_seq_received(session_->receivedCount());
  }
  v1::Frame hello = protocol::makeHello(options_.client_name, options_.token,
                                        protocol::toProto(options_.limits), resume ? &r : nullptr);
  CO_RETURN_IF_ERROR(co_await net::writeFrame(socket, hello));
  auto first = co_await net::readFirstFrame(socket, options_.handshake_timeout,
                                            protocol::kDefaultMaxFrameSize);
  if (!first.ok()) co_return first.status();
  auto welcome = protocol::welcomeFrom(first->frame);
  if (!welcome.ok()) co_return welcome.status();
  auto version = protocol::negotiateVersion(protocol::currentVersion(), welcome->version());
  if (!version.ok()) co_return version.status();
  if (resume) {
    if (!welcome->resumed()) {
      co_return protoError(v1::RESUME_FAILED, "the agent answered with a new session");
    }
    CO_RETURN_IF_ERROR(session_->resume(welcome->last_seq_received(), protocol::Clock::now()));
  } else {
    welcome_ = *std::move(welcome);
    session_ = std::make_unique<protocol::Session>(protocol::Role::kClient,
                                                   protocol::fromProto(welcome_.limits()));
  }
  *leftover = std::move(first->leftover);
  co_return absl::OkStatus();
}

net::awaitable<absl::Status> Client::connect() {
  if (options_.endpoints.empty()) {
    co_return protoError(v1::INVALID_ARGUMENT, "no agent address given");
  }
  std::vector<std::string> failures;
  for (const auto& endpoint : options_.endpoints) {
    auto socket = co_await dial(endpoint);
    if (!socket.ok()) {
      failures.push_back(std::string(socket.status().message()));
      continue;
    }
    std::string leftover;
    absl::Status s = co_await handshake(*socket, /*resume=*/false, &leftover);
    if (!s.ok()) {
      // A Reject is the agent's considered answer; another endpoint of the
      // same target would say the same.
      if (errorCodeOf(s) != v1::UNAVAILABLE && errorCodeOf(s) != v1::TIMEOUT) co_return s;
      failures.push_back(absl::StrCat(endpoint, ": ", s.message()));
      continue;
    }
    endpoint_ = endpoint;
    asio::co_spawn(ex_, runTransports(shared_from_this(), std::move(*socket), std::move(leftover)),
                   asio::detached);
    co_return absl::OkStatus();
  }
  co_return protoError(v1::UNAVAILABLE,
                       absl::StrCat("cannot reach the agent: ", absl::StrJoin(failures, "; ")));
}

net::awaitable<void> Client::runTransports(std::shared_ptr<Client> self, net::tcp::socket socket,
                                           std::string leftover) {
  // GCC 12 drops coroutine parameters the body never names: hold the owner
  // in a frame variable so it outlives every suspension.
  const auto keep_alive = std::move(self);
  while (true) {
    transport_ = std::make_shared<net::SessionTransport>(
        std::move(socket), *session_, static_cast<SessionHandler&>(*this), leftover);
    if (closing_) {
      // close() came before this transport existed: end the session now.
      session_->sendGoaway(v1::CANCELLED, "client closed the session");
      transport_->closeAfterFlush();
    }
    transport_->wake();
    absl::Status why = co_await transport_->run();
    if (closing_) co_return;
    session_->onTransportLost();
    if (!goaway_.ok()) {
      sessionLost(goaway_);
      co_return;
    }
    if (!options_.reconnect) {
      sessionLost(why);
      co_return;
    }
    auto next = co_await reconnect();
    if (closing_) co_return;
    if (!next.ok()) {
      sessionLost(next.status());
      co_return;
    }
    ++resumes_;
    socket = std::move(next->first);
    leftover = std::move(next->second);
  }
}

net::awaitable<absl::StatusOr<std::pair<net::tcp::socket, std::string>>> Client::reconnect() {
  auto deadline = steady_timer::clock_type::now() + session_->limits().session_grace;
  auto backoff = options_.reconnect_backoff_initial;
  steady_timer sleeper(ex_);
  absl::Status last = protoError(v1::UNAVAILABLE, "no reconnect attempt made");
  while (!closing_ && steady_timer::clock_type::now() < deadline) {
    // The session lives on the agent that made it: resume there.
    auto socket = co_await dial(endpoint_);
    if (socket.ok()) {
      std::string leftover;
      absl::Status s = co_await handshake(*socket, /*resume=*/true, &leftover);
      if (s.ok()) co_return std::make_pair(std::move(*socket), std::move(leftover));
      v1::ErrorCode code = errorCodeOf(s);
      if (code != v1::UNAVAILABLE && code != v1::TIMEOUT) co_return s;  // final answer
      last = s;
    } else {
      last = socket.status();
    }
    sleeper.expires_after(backoff);
    net::error_code ec;
    co_await sleeper.async_wait(asio::redirect_error(net::use_awaitable, ec));
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
  co_return last;
}

void Client::sessionLost(const absl::Status& why) {
  if (!lost_.ok()) return;
  lost_ = protoError(v1::AGENT_LOST, absl::StrCat("session with the agent at ", endpoint_,
                                                  " lost: ", why.message()));
  for (auto& [id, p] : pending_) {
    p->result = lost_;
    p->done.notify();
  }
  for (auto& [id, weak] : streams_) {
    if (auto s = weak.lock()) {
      if (s->error_.ok()) s->error_ = lost_;
      s->readable_.notify();
      s->writable_.notify();
    }
  }
  if (on_lost_ && !closing_) {
    // Moved out first: the handler may drop the last reference to its owner.
    auto handler = std::move(on_lost_);
    handler(lost_);
  }
}

net::awaitable<absl::StatusOr<v1::Response>> Client::call(v1::Request request,
                                                          std::chrono::milliseconds timeout) {
  if (!lost_.ok()) co_return lost_;
  if (!session_) co_return protoError(v1::FAILED_PRECONDITION, "not connected");
  auto id = session_->sendRequest(std::move(request));
  if (!id.ok()) co_return id.status();
  auto pending = std::make_shared<Pending>(ex_);
  pending_[*id] = pending;
  wake();
  auto deadline = steady_timer::clock_type::now() + timeout;
  while (!pending->result && steady_timer::clock_type::now() < deadline) {
    co_await pending->done.wait(deadline);
  }
  pending_.erase(*id);
  if (!pending->result) {
    co_return protoError(v1::TIMEOUT, absl::StrCat("no response to request ", *id, " within ",
                                                   timeout.count(), " ms"));
  }
  co_return std::move(*pending->result);
}

net::awaitable<absl::StatusOr<std::shared_ptr<ClientStream>>> Client::openStream(
    v1::StreamOpen open) {
  if (!lost_.ok()) co_return lost_;
  if (!session_) co_return protoError(v1::FAILED_PRECONDITION, "not connected");
  auto id = session_->openStream(std::move(open));
  if (!id.ok()) co_return id.status();
  auto stream = std::make_shared<ClientStream>(shared_from_this(), *id);
  streams_[*id] = stream;
  wake();
  while (!stream->accepted_ && stream->error_.ok()) co_await stream->writable_.wait();
  if (!stream->error_.ok()) {
    streams_.erase(*id);
    co_return stream->error_;
  }
  co_return stream;
}

absl::Status Client::acceptStream(ClientStream& stream) {
  if (!lost_.ok()) return lost_;
  v1::StreamAccept accept;
  accept.set_stream_id(stream.id());
  RETURN_IF_ERROR(session_->acceptStream(std::move(accept)));
  wake();
  return absl::OkStatus();
}

void Client::close() {
  if (closing_) return;
  closing_ = true;
  if (session_ && transport_ && !transport_->closed()) {
    session_->sendGoaway(v1::CANCELLED, "client closed the session");
    transport_->closeAfterFlush();
  }
  if (lost_.ok()) sessionLost(protoError(v1::CANCELLED, "client closed the session"));
}

void Client::cutTransportForTest() {
  if (transport_) transport_->close();
}

// ------------------------------------------------------- SessionHandler

void Client::onResponse(v1::Response response) {
  auto it = pending_.find(response.request_id());
  if (it == pending_.end()) return;  // timed out meanwhile
  if (response.has_error() && response.error().code() != v1::OK) {
    it->second->result = fromProtoError(response.error());
  } else {
    it->second->result = std::move(response);
  }
  it->second->done.notify();
}

void Client::onStreamOpen(v1::StreamOpen open) {
  if (!acceptor_) {
    session_->resetStream(
        open.stream_id(),
        toProtoError(protoError(v1::UNIMPLEMENTED, "this client accepts no streams")));
    return;
  }
  auto stream = std::make_shared<ClientStream>(shared_from_this(), open.stream_id());
  streams_[open.stream_id()] = stream;
  acceptor_(std::move(stream), std::move(open));
}

void Client::onStreamAccept(v1::StreamAccept accept) {
  auto it = streams_.find(accept.stream_id());
  if (it == streams_.end()) return;
  if (auto s = it->second.lock()) {
    s->accepted_ = std::move(accept);
    s->writable_.notify();
  }
}

void Client::onStreamData(uint64_t id, std::string_view payload) {
  auto it = streams_.find(id);
  auto s = it == streams_.end() ? nullptr : it->second.lock();
  if (!s) {
    // Nobody reads it any more: hand the credit back so the peer is not stuck.
    session_->consumed(id, payload.size());
    return;
  }
  if (s->incoming_.empty() && s->sink_) {
    size_t taken = std::min(s->sink_(payload), payload.size());
    if (taken > 0) {
      session_->consumed(id, taken);
      payload.remove_prefix(taken);
    }
    if (payload.empty()) return;
  }
  s->incoming_.emplace_back(payload);
  s->readable_.notify();
}

void Client::onStreamDatagram(v1::StreamDatagram datagram) {
  auto it = streams_.find(datagram.stream_id());
  auto s = it == streams_.end() ? nullptr : it->second.lock();
  if (!s) {
    session_->consumed(datagram.stream_id(), datagram.payload().size());
    return;
  }
  s->datagrams_.push_back(std::move(datagram));
  s->readable_.notify();
}

void Client::onStreamHalfClose(uint64_t id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (auto s = it->second.lock()) {
    s->eof_ = true;
    s->readable_.notify();
  }
}

void Client::onStreamReset(uint64_t id, v1::Error error) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (auto s = it->second.lock()) {
    s->error_ = fromProtoError(error);
    s->readable_.notify();
    s->writable_.notify();
  }
  streams_.erase(it);
}

void Client::onStreamWritable(uint64_t id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  if (auto s = it->second.lock()) s->writable_.notify();
}

void Client::onDraining(v1::Draining draining) {
  if (on_draining_) on_draining_(draining);
}

void Client::onGoaway(v1::Goaway goaway) {
  // OK or no code still ends the session: never leave goaway_ OK here.
  v1::ErrorCode code = goaway.code();
  if (code == v1::ERROR_CODE_UNSPECIFIED || code == v1::OK) code = v1::CANCELLED;
  goaway_ = protoError(code, absl::StrCat("the agent ended the session: ", goaway.message()));
}

}  // namespace siphon::client
