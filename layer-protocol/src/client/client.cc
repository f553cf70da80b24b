#include "siphon/client/client.h"

#include <errno.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "siphon/transport/spawn.h"
#include "siphon/transport/tls.h"

namespace siphon::client {

using net::asio::steady_timer;
namespace asio = net::asio;


struct Client::Pending {
  explicit Pending(asio::any_io_executor ex) : done(ex) {}
  net::Signal done;
  std::optional<absl::StatusOr<v1::Response>> result;
  // A subscribe (steal, mirror): its answer is mapped to a client id as it
  // arrives, before any stream of the subscription can be handed out.
  bool subscribe = false;
  uint64_t subscription = 0;  // the client id to keep (a failover's resubscribe); 0: a new one
  v1::Request request;        // kept for a later failover
};

// One session with one agent: the protocol state, the transport that carries
// it, and what is in flight on it.
struct Link : protocol::SessionHandler, std::enable_shared_from_this<Link> {
  Link(Client& c, uint64_t gen, std::string ep)
      : client(c), generation(gen), endpoint(std::move(ep)) {}

  Client& client;
  const uint64_t generation;
  const std::string endpoint;
  std::unique_ptr<protocol::Session> session;
  std::shared_ptr<net::SessionTransport> transport;
  v1::Welcome welcome;
  absl::Status lost;    // non-OK once this session is gone
  absl::Status goaway;  // the agent ended the session
  bool retiring = false;       // its agent drains: it serves its streams until they end
  bool resubscribing = false;  // a failover is making the subscriptions again here
  uint64_t resumes = 0;
  std::map<uint64_t, std::shared_ptr<Client::Pending>> pending;
  std::map<uint64_t, std::weak_ptr<ClientStream>> streams;
  std::map<uint64_t, uint64_t> subscription_ids;  // the agent's id -> the client's
  // Streams of subscriptions (stolen, mirrored) that arrived before their
  // resubscription's answer. The streams are registered already, so what
  // comes for them meanwhile waits in them.
  std::vector<std::pair<std::shared_ptr<ClientStream>, v1::StreamOpen>> parked;

  void wake() {
    if (transport) transport->wake();
  }
  std::shared_ptr<ClientStream> stream(uint64_t id) {
    auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second.lock();
  }
  // Streams that end cleanly stay in the map until their owner lets go:
  // sweep those now and then, so a long session does not grow it.
  void add(uint64_t id, const std::shared_ptr<ClientStream>& s) {
    if (streams.size() >= prune_at) {
      std::erase_if(streams, [](const auto& e) { return e.second.expired(); });
      prune_at = std::max<size_t>(64, 2 * streams.size());
    }
    streams[id] = s;
  }
  // Streams still open on the session (what a move leaves or resets).
  size_t openStreams() const {
    size_t n = 0;
    for (const auto& [id, weak] : streams) {
      if (!weak.expired() && session && session->streamOpen(id)) ++n;
    }
    return n;
  }
  size_t prune_at = 64;

  void onResponse(v1::Response response) override { client.onResponse(*this, std::move(response)); }
  void onStreamOpen(v1::StreamOpen open) override { client.onStreamOpen(*this, std::move(open)); }
  void onDraining(v1::Draining draining) override {
    client.onDraining(*this, std::move(draining));
  }
  void onNotice(v1::SubscriptionNotice notice) override { client.onNotice(*this, std::move(notice)); }

  void onStreamAccept(v1::StreamAccept accept) override {
    if (auto s = stream(accept.stream_id())) {
      s->accepted_ = std::move(accept);
      s->writable_.notify();
    }
  }

  void onStreamData(uint64_t id, std::string_view payload) override {
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
  void onStreamGap(v1::StreamGap gap) override {
    auto s = stream(gap.stream_id());
    if (!s) return;  // nobody reads it; a gap holds no credit
    s->incoming_.push_back(StreamEvent{std::string(), std::move(gap)});
    s->readable_.notify();
  }

  void onStreamDatagram(v1::StreamDatagram datagram) override {
    auto s = stream(datagram.stream_id());
    if (!s) {
      session->consumed(datagram.stream_id(), datagram.payload().size());
      return;
    }
    s->datagrams_.push_back(std::move(datagram));
    s->readable_.notify();
  }

  void onStreamHalfClose(uint64_t id) override {
    if (auto s = stream(id)) {
      s->eof_ = true;
      s->readable_.notify();
    }
  }

  void onStreamReset(uint64_t id, v1::Error error) override {
    auto it = streams.find(id);
    if (it == streams.end()) return;
    if (auto s = it->second.lock()) {
      s->error_ = fromProtoError(error);
      s->readable_.notify();
      s->writable_.notify();
    }
    streams.erase(it);
  }

  void onStreamWritable(uint64_t id) override {
    if (auto s = stream(id)) s->writable_.notify();
  }

  void onGoaway(v1::Goaway g) override {
    // OK or no code still ends the session: never leave goaway OK here.
    v1::ErrorCode code = g.code();
    if (code == v1::ERROR_CODE_UNSPECIFIED || code == v1::OK) code = v1::CANCELLED;
    goaway = protoError(code, absl::StrCat("the agent ended the session: ", g.message()));
  }

  // Fails every request and stream in flight with `why`; returns how many
  // of each.
  std::pair<size_t, size_t> failAll(const absl::Status& why) {
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
};

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


// ------------------------------------------------------------------- Client

std::shared_ptr<Client> Client::create(asio::any_io_executor ex, ClientOptions options) {
  return std::shared_ptr<Client>(new Client(std::move(ex), std::move(options)));
}

Client::Client(asio::any_io_executor ex, ClientOptions options)
    : ex_(std::move(ex)), options_(std::move(options)), moved_(ex_) {}

Client::~Client() = default;

const v1::Welcome& Client::welcome() const {
  static const v1::Welcome kNone;
  return link_ ? link_->welcome : kNone;
}

std::string Client::endpoint() const { return link_ ? link_->endpoint : std::string(); }

uint64_t Client::resumeCountForTest() const { return link_ ? link_->resumes : 0; }

net::awaitable<absl::StatusOr<net::Stream>> Client::dial(const std::string& endpoint,
                                                              bool* refused,
                                                              std::chrono::milliseconds limit) {
  const auto connect_timeout = limit.count() > 0 ? std::min(limit, options_.connect_timeout)
                                                 : options_.connect_timeout;
  std::string host, port;
  CO_RETURN_IF_ERROR(net::splitHostPort(endpoint, &host, &port));
  const bool want_tls = !options_.tls_ca.empty() || !options_.tls_cert.empty() ||
                        !options_.tls_key.empty() || !options_.tls_server_name.empty();
  if (want_tls && !tls_) {
    // Bad files are the caller's to fix: INVALID_ARGUMENT, never retried.
    CO_ASSIGN_OR_RETURN(
        tls_, net::tls::clientContext({options_.tls_ca, options_.tls_cert, options_.tls_key}));
  }
  net::tcp::resolver resolver(ex_);
  net::error_code ec;
  auto results =
      co_await resolver.async_resolve(host, port, asio::redirect_error(net::use_awaitable, ec));
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat(endpoint, ": ", ec.message()));
  net::tcp::socket socket(ex_);
  steady_timer watchdog(ex_);
  auto fired = std::make_shared<bool>(false);
  watchdog.expires_after(connect_timeout);
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
                                                       connect_timeout.count(), " ms"));
  }
  if (ec == asio::error::connection_refused && refused) *refused = true;
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat(endpoint, ": ", ec.message()));
  if (!tls_) co_return net::Stream(std::move(socket));
  net::Stream stream(std::move(socket), *tls_);
  const auto handshake_timeout = limit.count() > 0 ? std::min(limit, options_.handshake_timeout)
                                                   : options_.handshake_timeout;
  absl::Status s = co_await net::tls::connect(
      stream, options_.tls_server_name.empty() ? host : options_.tls_server_name,
      handshake_timeout);
  if (!s.ok()) {
    // A failed verification or an alert is final (UNAUTHENTICATED: the
    // same agent would answer the same); a cut is retried.
    co_return protoError(errorCodeOf(s),
                         absl::StrCat("the agent at ", endpoint, ": ", s.message()));
  }
  co_return std::move(stream);
}

net::awaitable<absl::Status> Client::handshake(Link& link, net::Stream& socket, bool resume,
                                               std::string* leftover,
                                               std::chrono::milliseconds limit) {
  v1::ResumeRequest r;
  if (resume) {
    r.set_session_id(link.welcome.session_id());
    r.set_resume_token(link.welcome.resume_token());
    r.set_last_seq_received(link.session->receivedCount());
  }
  v1::Frame hello = protocol::makeHello(options_.client_name, options_.token,
                                        protocol::toProto(options_.limits), resume ? &r : nullptr);
  CO_RETURN_IF_ERROR(co_await net::writeFrame(socket, hello));
  const auto timeout = limit.count() > 0 ? std::min(limit, options_.handshake_timeout)
                                         : options_.handshake_timeout;
  auto first = co_await net::readFirstFrame(socket, timeout, protocol::kDefaultMaxFrameSize);
  if (!first.ok()) {
    if (socket.tls() && errorCodeOf(first.status()) == v1::UNAUTHENTICATED) {
      // TLS 1.3: the agent checks the client's certificate after the
      // client's side of the handshake is done, and says no with an alert.
      co_return protoError(
          v1::UNAUTHENTICATED,
          absl::StrCat("the agent at ", link.endpoint, " refused the TLS connection (",
                       first.status().message(),
                       "): does it need a client certificate (--tls-cert/--tls-key) signed by "
                       "its --tls-client-ca?"));
    }
    co_return first.status();
  }
  auto welcome = protocol::welcomeFrom(first->frame);
  if (!welcome.ok()) {
    if (!socket.tls() && errorCodeOf(welcome.status()) == v1::UNAUTHENTICATED &&
        sv(welcome.status().message()).find(net::tls::kPlainClientMessage) != std::string::npos) {
      co_return protoError(v1::UNAUTHENTICATED,
                           absl::StrCat("the agent at ", link.endpoint,
                                        " speaks TLS: give --tls-ca FILE (and --tls-cert/"
                                        "--tls-key if it asks for a client certificate)"));
    }
    co_return welcome.status();
  }
  auto version = protocol::negotiateVersion(protocol::currentVersion(), welcome->version());
  if (!version.ok()) co_return version.status();
  if (resume) {
    if (!welcome->resumed()) {
      co_return protoError(v1::RESUME_FAILED, "the agent answered with a new session");
    }
    CO_RETURN_IF_ERROR(link.session->resume(welcome->last_seq_received(), protocol::Clock::now()));
  } else {
    link.welcome = *std::move(welcome);
    link.session = std::make_unique<protocol::Session>(protocol::Role::kClient,
                                                       protocol::fromProto(link.welcome.limits()));
  }
  *leftover = std::move(first->leftover);
  co_return absl::OkStatus();
}

net::awaitable<absl::StatusOr<std::shared_ptr<Link>>> Client::open(const std::string& endpoint,
                                                                   net::Stream* socket,
                                                                   std::string* leftover) {
  auto dialled = co_await dial(endpoint);
  if (!dialled.ok()) co_return dialled.status();
  auto link = std::make_shared<Link>(*this, ++generations_, endpoint);
  absl::Status s = co_await handshake(*link, *dialled, /*resume=*/false, leftover);
  if (!s.ok()) {
    if (errorCodeOf(s) == v1::UNAVAILABLE || errorCodeOf(s) == v1::TIMEOUT) {
      co_return protoError(errorCodeOf(s), absl::StrCat(endpoint, ": ", s.message()));
    }
    co_return s;
  }
  *socket = std::move(*dialled);
  co_return link;
}

void Client::start(std::shared_ptr<Link> link, net::Stream socket, std::string leftover) {
  // An exception escaping the transports loses that link (the session's
  // continuity code decides what follows), never the process.
  auto self = shared_from_this();
  net::spawn(ex_, runTransports(self, link, std::move(socket), std::move(leftover)),
             "client_transports", [self, link] {
               self->linkLost(link, protoError(v1::INTERNAL, "the client's transport failed"));
             });
}

net::awaitable<absl::Status> Client::connect() {
  if (options_.endpoints.empty()) {
    co_return protoError(v1::INVALID_ARGUMENT, "no agent address given");
  }
  std::vector<std::string> failures;
  std::optional<v1::ErrorCode> busy;  // the first full or draining agent's code
  for (const auto& endpoint : options_.endpoints) {
    net::Stream socket(net::tcp::socket{ex_});
    std::string leftover;
    auto link = co_await open(endpoint, &socket, &leftover);
    if (!link.ok()) {
      // A Reject is the agent's considered answer, and another endpoint of
      // the same target would say the same; except that this agent is full
      // or draining, where the next one may take the session.
      const v1::ErrorCode code = errorCodeOf(link.status());
      const bool full = code == v1::TOO_MANY_SESSIONS || code == v1::AGENT_DRAINING;
      if (code != v1::UNAVAILABLE && code != v1::TIMEOUT && !full) co_return link.status();
      if (full && options_.endpoints.size() == 1) co_return link.status();
      if (full) {
        if (!busy) busy = code;
        failures.push_back(absl::StrCat(endpoint, ": ", link.status().message()));
      } else {
        failures.push_back(std::string(link.status().message()));
      }
      continue;
    }
    link_ = *link;
    start(link_, std::move(socket), std::move(leftover));
    co_return absl::OkStatus();
  }
  if (busy) {
    co_return protoError(*busy,
                         absl::StrCat("no agent took the session: ", absl::StrJoin(failures, "; ")));
  }
  co_return protoError(v1::UNAVAILABLE,
                       absl::StrCat("cannot reach the agent: ", absl::StrJoin(failures, "; ")));
}

net::awaitable<void> Client::runTransports(std::shared_ptr<Client> self,
                                           std::shared_ptr<Link> link_in, net::Stream socket,
                                           std::string leftover) {
  // GCC 12 drops coroutine parameters the body never names: hold the owner
  // in a frame variable so it outlives every suspension.
  const auto keep_alive = std::move(self);
  const std::shared_ptr<Link> link = std::move(link_in);
  while (true) {
    link->transport = std::make_shared<net::SessionTransport>(
        std::move(socket), *link->session, static_cast<protocol::SessionHandler&>(*link),
        leftover);
    if (closing_) {
      // close() came before this transport existed: end the session now.
      link->session->sendGoaway(v1::CANCELLED, "client closed the session");
      link->transport->closeAfterFlush();
    }
    link->transport->wake();
    absl::Status why = co_await link->transport->run();
    if (closing_) co_return;
    link->session->onTransportLost();
    if (!link->goaway.ok()) {
      linkLost(link, link->goaway);
      co_return;
    }
    if (!options_.reconnect) {
      linkLost(link, why);
      co_return;
    }
    auto next = co_await reconnect(*link);
    if (closing_) co_return;
    if (!next.ok()) {
      linkLost(link, next.status());
      co_return;
    }
    ++link->resumes;
    socket = std::move(next->first);
    leftover = std::move(next->second);
    if (on_resumed_ && link == link_) on_resumed_(why);
  }
}

net::awaitable<absl::StatusOr<std::pair<net::Stream, std::string>>> Client::reconnect(
    Link& link) {
  // With another agent to go to, a session that cannot be resumed within
  // the keepalive timeout is given up for a new one there; else the
  // agent's grace is the limit.
  const bool may_move = canFailover() && link_.get() == &link;
  const auto limit =
      may_move ? link.session->limits().keepalive_timeout : link.session->limits().session_grace;
  auto deadline = steady_timer::clock_type::now() + limit;
  auto backoff = options_.reconnect_backoff_initial;
  steady_timer sleeper(ex_);
  absl::Status last = protoError(v1::UNAVAILABLE, "no reconnect attempt made");
  while (!closing_ && steady_timer::clock_type::now() < deadline) {
    // The session lives on the agent that made it: resume there.
    // Moving on is bounded by the deadline: no attempt may outlast it.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - steady_timer::clock_type::now());
    const auto attempt = may_move ? std::max(left, std::chrono::milliseconds(1))
                                  : std::chrono::milliseconds(0);
    bool refused = false;
    auto socket = co_await dial(link.endpoint, &refused, attempt);
    if (socket.ok()) {
      std::string leftover;
      absl::Status s = co_await handshake(link, *socket, /*resume=*/true, &leftover, attempt);
      if (s.ok()) co_return std::make_pair(std::move(*socket), std::move(leftover));
      v1::ErrorCode code = errorCodeOf(s);
      if (code != v1::UNAVAILABLE && code != v1::TIMEOUT) co_return s;  // final answer
      last = s;
    } else if (refused) {
      // Nothing listens there: the agent, and the session with it, is gone.
      co_return protoError(v1::UNAVAILABLE,
                           absl::StrCat(socket.status().message(), ": the agent is gone"));
    } else {
      last = socket.status();
    }
    sleeper.expires_after(backoff);
    net::error_code ec;
    co_await sleeper.async_wait(asio::redirect_error(net::use_awaitable, ec));
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
  if (steady_timer::clock_type::now() >= deadline) {
    last = protoError(errorCodeOf(last),
                      absl::StrCat("no resume within ", limit.count(), " ms: ", last.message()));
  }
  co_return last;
}

bool Client::canFailover() const {
  return options_.failover && options_.endpoints.size() > 1 && !closing_;
}

void Client::linkLost(const std::shared_ptr<Link>& link, const absl::Status& why) {
  if (!link->lost.ok()) return;
  // The code stays AGENT_LOST (what every caller checks); the text names a
  // typed cause, above all an expired session.
  const v1::ErrorCode cause = errorCodeOf(why);
  std::string text;
  if (cause == v1::SESSION_EXPIRED) {
    text = absl::StrCat("the session expired (SESSION_EXPIRED): the agent at ", link->endpoint,
                        " no longer holds it, as it was not resumed within the agent's grace "
                        "period: ",
                        why.message());
  } else if (cause == v1::UNAVAILABLE || cause == v1::TIMEOUT || cause == v1::AGENT_LOST) {
    text = absl::StrCat("session with the agent at ", link->endpoint, " lost: ", why.message());
  } else {
    text = absl::StrCat("session with the agent at ", link->endpoint, " lost (",
                        errorCodeName(cause), "): ", why.message());
  }
  link->lost = protoError(v1::AGENT_LOST, text);
  auto [requests, streams] = link->failAll(link->lost);
  if (link != link_ || closing_ || !lost_.ok()) return;
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
  // The other endpoints in order after the one left, then (not when it
  // drains) that one again: a replacement agent may answer at its address.
  std::vector<std::string> order;
  const auto& all = options_.endpoints;
  size_t at = std::find(all.begin(), all.end(), from->endpoint) - all.begin();
  for (size_t i = 1; i <= all.size(); ++i) {
    const std::string& ep = all[(at + i) % all.size()];
    if (ep == from->endpoint && draining) continue;
    order.push_back(ep);
  }
  const auto deadline = steady_timer::clock_type::now() + options_.failover_timeout;
  auto backoff = options_.reconnect_backoff_initial;
  steady_timer sleeper(ex_);
  std::shared_ptr<Link> next;
  std::vector<std::string> failures;
  while (!closing_ && !next && !order.empty() && steady_timer::clock_type::now() < deadline) {
    failures.clear();
    for (const auto& ep : order) {
      net::Stream socket(net::tcp::socket{ex_});
      std::string leftover;
      auto link = co_await open(ep, &socket, &leftover);
      if (closing_) break;
      if (!link.ok()) {
        failures.push_back(std::string(link.status().message()));
        continue;
      }
      next = *link;
      next->resubscribing = true;
      link_ = next;
      start(next, std::move(socket), std::move(leftover));
      break;
    }
    if (next || closing_) break;
    sleeper.expires_after(backoff);
    net::error_code ec;
    co_await sleeper.async_wait(asio::redirect_error(net::use_awaitable, ec));
    backoff = std::min(backoff * 2, options_.reconnect_backoff_max);
  }
  if (closing_) {
    moving_ = false;
    moved_.notify();
    co_return;
  }
  if (!next) {
    moving_ = false;
    moved_.notify();
    if (draining && from->lost.ok()) {
      // No other agent: stay with the draining one while it lasts.
      if (on_draining_) on_draining_(*draining);
      co_return;
    }
    sessionLost(protoError(
        v1::AGENT_LOST,
        absl::StrCat(from->lost.message(), "; no other agent answered",
                     failures.empty() ? "" : ": ", absl::StrJoin(failures, "; "))));
    co_return;
  }
  if (draining) {
    from->retiring = true;
    retiring_.push_back(from);
  }
  ++failovers_;
  event.to = next->endpoint;
  // The subscriptions, again, under their ids.
  std::vector<uint64_t> ids;
  for (const auto& [id, sub] : subscriptions_) {
    if (sub.generation != 0) ids.push_back(id);
  }
  for (uint64_t id : ids) {
    auto it = subscriptions_.find(id);
    if (it == subscriptions_.end()) continue;  // unsubscribed meanwhile
    v1::Request request = it->second.request;
    it->second.generation = 0;  // gone until the new agent says otherwise
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
                   on_lost = std::exchange(on_lost_, nullptr),
                   on_failover = std::exchange(on_failover_, nullptr),
                   on_resumed = std::exchange(on_resumed_, nullptr)] {});
}

net::awaitable<bool> Client::waitForMove(std::chrono::steady_clock::time_point deadline) {
  while (moving_ && lost_.ok() && steady_timer::clock_type::now() < deadline) {
    co_await moved_.wait(deadline);
  }
  co_return !moving_;
}

// ------------------------------------------------------------ requests

namespace {

// The file or directory handle a file request names, with the operation's
// name (for errors), or nullopt; and the same field set.
#define SIPHON_HANDLE_OPS(X)                                                             \
  X(kRead, read, fd) X(kPread, pread, fd) X(kWrite, write, fd) X(kPwrite, pwrite, fd)    \
  X(kSeek, seek, fd) X(kClose, close, fd) X(kFstat, fstat, fd) X(kFtruncate, ftruncate, fd) \
  X(kReaddir, readdir, dir) X(kClosedir, closedir, dir)

std::optional<uint64_t> handleOf(const v1::FileRequest& f, std::string_view* op) {
  switch (f.op_case()) {
#define X(kCase, name, field) \
  case v1::FileRequest::kCase: \
    *op = #name;               \
    return f.name().field();
    SIPHON_HANDLE_OPS(X)
#undef X
    default:
      return std::nullopt;
  }
}

void setHandle(v1::FileRequest& f, uint64_t value) {
  switch (f.op_case()) {
#define X(kCase, name, field)             \
  case v1::FileRequest::kCase:            \
    f.mutable_##name()->set_##field(value); \
    return;
    SIPHON_HANDLE_OPS(X)
#undef X
    default:
      return;
  }
}
#undef SIPHON_HANDLE_OPS

bool opensHandle(const v1::Request& r) {
  return r.has_file() && (r.file().has_open() || r.file().has_opendir());
}
bool closesHandle(const v1::Request& r) {
  return r.has_file() && (r.file().has_close() || r.file().has_closedir());
}
bool subscribes(const v1::Request& r) { return r.has_steal() || r.has_mirror(); }

// The client's number for an agent's handle or subscription id: the agent's
// own on the first session (so logs on both sides agree), a number above
// every one handed out so far on later ones.
template <typename Map>
uint64_t clientId(const Map& used, uint64_t agent_id, uint64_t generation, uint64_t* next) {
  if (generation == 1 && used.count(agent_id) == 0) {
    *next = std::max(*next, agent_id);
    return agent_id;
  }
  do {
    ++*next;
  } while (used.count(*next) != 0);
  return *next;
}

}  // namespace

std::shared_ptr<Link> Client::linkOf(uint64_t generation) const {
  if (link_ && link_->generation == generation) return link_;
  for (const auto& weak : retiring_) {
    auto l = weak.lock();
    if (l && l->generation == generation) return l;
  }
  return nullptr;
}

net::awaitable<absl::StatusOr<v1::Response>> Client::call(v1::Request request,
                                                          std::chrono::milliseconds timeout) {
  if (!lost_.ok()) co_return lost_;
  if (!link_) co_return protoError(v1::FAILED_PRECONDITION, "not connected");
  const auto deadline = steady_timer::clock_type::now() + timeout;
  if (!co_await waitForMove(deadline)) {
    if (!lost_.ok()) co_return lost_;
    co_return protoError(v1::TIMEOUT, absl::StrCat("no agent to send request to within ",
                                                   timeout.count(), " ms: moving to another"));
  }
  std::shared_ptr<Link> link = link_;

  // Handles are this client's numbers: a handle of a lost session stays
  // invalid, and a handle goes to the session that opened it.
  std::optional<uint64_t> handle;
  if (request.has_file()) {
    std::string_view op;
    handle = handleOf(request.file(), &op);
    auto it = handle ? handles_.find(*handle) : handles_.end();
    if (it != handles_.end()) {
      link = linkOf(it->second.generation);
      if (!link || !link->lost.ok()) {
        std::string where = it->second.endpoint;
        if (closesHandle(request)) handles_.erase(it);
        co_return errnoStatus(
            EBADF, absl::StrCat(asv(op), " fd ", *handle, " (opened on the agent at ", where,
                                ", whose session is lost; handles are never reopened behind "
                                "your back)"));
      }
      setHandle(*request.mutable_file(), it->second.agent_fd);
    } else if (handle && link->generation != 1) {
      co_return errnoStatus(EBADF, absl::StrCat(asv(op), " fd ", *handle));
    }
    // Else, on the first session, a handle this client did not hand out
    // goes as given: the agent judges it.
  }
  // Subscription ids, too, are this client's (the same rules).
  std::optional<uint64_t> unsubscribing;
  if (request.has_unsubscribe()) {
    const uint64_t id = request.unsubscribe().subscription_id();
    auto it = subscriptions_.find(id);
    if (it != subscriptions_.end()) {
      link = linkOf(it->second.generation);
      if (!link || !link->lost.ok()) {
        // It did not come back after a failover: nothing holds it any more.
        subscriptions_.erase(it);
        v1::Response r;
        r.mutable_unsubscribed();
        co_return r;
      }
      request.mutable_unsubscribe()->set_subscription_id(it->second.agent_id);
      unsubscribing = id;
    } else if (link->generation != 1) {
      co_return protoError(v1::NOT_FOUND, absl::StrCat("no subscription ", id, " in this client"));
    }
  }
  const bool opens = opensHandle(request);
  const bool closes = closesHandle(request);
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - steady_timer::clock_type::now());
  auto response = co_await callOn(link, std::move(request),
                                  std::max(left, std::chrono::milliseconds(1)), 0);
  if (closes) handles_.erase(*handle);
  if (unsubscribing && (response.ok() || errorCodeOf(response.status()) == v1::NOT_FOUND)) {
    auto it = subscriptions_.find(*unsubscribing);
    if (it != subscriptions_.end()) {
      link->subscription_ids.erase(it->second.agent_id);
      subscriptions_.erase(it);
    }
  }
  if (opens && response.ok() && response->has_file() && response->file().has_opened()) {
    const uint64_t h = clientId(handles_, response->file().opened().fd(), link->generation,
                                &next_handle_);
    handles_[h] = Handle{link->generation, response->file().opened().fd(), link->endpoint};
    response->mutable_file()->mutable_opened()->set_fd(h);
  }
  co_return response;
}

net::awaitable<absl::StatusOr<v1::Response>> Client::callOn(std::shared_ptr<Link> link_in,
                                                            v1::Request request,
                                                            std::chrono::milliseconds timeout,
                                                            uint64_t subscription) {
  const std::shared_ptr<Link> link = std::move(link_in);
  if (!link->lost.ok()) co_return link->lost;
  auto pending = std::make_shared<Pending>(ex_);
  if (subscribes(request)) {
    pending->subscribe = true;
    pending->subscription = subscription;
    pending->request = request;
  }
  auto id = link->session->sendRequest(std::move(request));
  if (!id.ok()) co_return id.status();
  link->pending[*id] = pending;
  link->wake();
  auto deadline = steady_timer::clock_type::now() + timeout;
  while (!pending->result && steady_timer::clock_type::now() < deadline) {
    co_await pending->done.wait(deadline);
  }
  link->pending.erase(*id);
  if (!pending->result) {
    co_return protoError(v1::TIMEOUT, absl::StrCat("no response to request ", *id, " within ",
                                                   timeout.count(), " ms"));
  }
  co_return std::move(*pending->result);
}

net::awaitable<absl::StatusOr<std::shared_ptr<ClientStream>>> Client::openStream(
    v1::StreamOpen open) {
  if (!lost_.ok()) co_return lost_;
  if (!link_) co_return protoError(v1::FAILED_PRECONDITION, "not connected");
  (void)co_await waitForMove(steady_timer::clock_type::now() + options_.failover_timeout);
  if (!lost_.ok()) co_return lost_;
  const std::shared_ptr<Link> link = link_;
  if (!link->lost.ok()) co_return link->lost;
  auto id = link->session->openStream(std::move(open));
  if (!id.ok()) co_return id.status();
  auto stream = std::make_shared<ClientStream>(shared_from_this(), link, *id);
  link->add(*id, stream);
  link->wake();
  while (!stream->accepted_ && stream->error_.ok()) co_await stream->writable_.wait();
  if (!stream->error_.ok()) {
    link->streams.erase(*id);
    co_return stream->error_;
  }
  co_return stream;
}

absl::Status Client::acceptStream(ClientStream& stream) {
  Link& link = *stream.link_;
  if (!link.lost.ok()) return link.lost;
  v1::StreamAccept accept;
  accept.set_stream_id(stream.id());
  RETURN_IF_ERROR(link.session->acceptStream(std::move(accept)));
  link.wake();
  return absl::OkStatus();
}

void Client::close() {
  if (closing_) return;
  closing_ = true;
  std::vector<std::shared_ptr<Link>> links;
  if (link_) links.push_back(link_);
  for (auto& weak : retiring_) {
    if (auto l = weak.lock()) links.push_back(l);
  }
  for (auto& l : links) {
    if (l->session && l->transport && !l->transport->closed()) {
      l->session->sendGoaway(v1::CANCELLED, "client closed the session");
      l->transport->closeAfterFlush();
    }
  }
  if (lost_.ok()) sessionLost(protoError(v1::CANCELLED, "client closed the session"));
}

void Client::cutTransportForTest() {
  if (link_ && link_->transport) link_->transport->close();
}

// ------------------------------------------------------- from the Links

void Client::onResponse(Link& link, v1::Response response) {
  auto it = link.pending.find(response.request_id());
  if (it == link.pending.end()) return;  // timed out meanwhile
  Pending& p = *it->second;
  if (response.has_error() && response.error().code() != v1::OK) {
    p.result = fromProtoError(response.error());
  } else {
    if (p.subscribe && response.has_subscribed()) {
      // Mapped now, in the same dispatch: a stream of this subscription may
      // follow in the very next frame.
      const uint64_t agent_id = response.subscribed().subscription_id();
      const uint64_t id = p.subscription != 0
                              ? p.subscription
                              : clientId(subscriptions_, agent_id, link.generation,
                                         &next_subscription_);
      subscriptions_[id] = Subscription{std::move(p.request), link.generation, agent_id};
      link.subscription_ids[agent_id] = id;
      response.mutable_subscribed()->set_subscription_id(id);
    }
    p.result = std::move(response);
  }
  p.done.notify();
}

namespace {

// The subscription (the agent's id) a stream the agent opens belongs to;
// nullopt for kinds that belong to none.
std::optional<uint64_t> subscriptionOf(const v1::StreamOpen& open) {
  if (open.has_stolen()) return open.stolen().subscription_id();
  if (open.has_mirrored()) return open.mirrored().subscription_id();
  if (open.has_stolen_request()) return open.stolen_request().subscription_id();
  return std::nullopt;
}

void setSubscription(v1::StreamOpen& open, uint64_t id) {
  if (open.has_stolen()) open.mutable_stolen()->set_subscription_id(id);
  if (open.has_mirrored()) open.mutable_mirrored()->set_subscription_id(id);
  if (open.has_stolen_request()) open.mutable_stolen_request()->set_subscription_id(id);
}

}  // namespace

void Client::onNotice(Link& link, v1::SubscriptionNotice notice) {
  if (&link != link_.get() || !on_notice_) return;
  // In this client's ids, as everything else it hands out (taken_by stays
  // the agent's: it is usually another client's).
  auto it = link.subscription_ids.find(notice.subscription_id());
  notice.set_subscription_id(it == link.subscription_ids.end() ? 0 : it->second);
  on_notice_(notice);
}

void Client::onStreamOpen(Link& link, v1::StreamOpen open) {
  auto stream =
      std::make_shared<ClientStream>(shared_from_this(), link.shared_from_this(), open.stream_id());
  // Registered before anything else: frames that come before the acceptor
  // takes it (a mirror's gaps) or while it is parked wait in it.
  link.add(open.stream_id(), stream);
  const std::optional<uint64_t> agent_id = subscriptionOf(open);
  if (agent_id && link.resubscribing && !link.subscription_ids.contains(*agent_id)) {
    link.parked.emplace_back(std::move(stream), std::move(open));
    return;
  }
  handOver(link, std::move(stream), std::move(open));
}

void Client::handOver(Link& link, std::shared_ptr<ClientStream> stream, v1::StreamOpen open) {
  if (const std::optional<uint64_t> agent_id = subscriptionOf(open)) {
    auto it = link.subscription_ids.find(*agent_id);
    // Unknown: 0, which no subscription of this client has.
    setSubscription(open, it == link.subscription_ids.end() ? 0 : it->second);
  }
  if (!acceptor_) {
    stream->reset(v1::UNIMPLEMENTED, "this client accepts no streams");
    return;
  }
  acceptor_(std::move(stream), std::move(open));
}

void Client::onDraining(Link& link, v1::Draining draining) {
  if (&link == link_.get() && !moving_ && canFailover()) {
    FailoverEvent event;
    event.from = link.endpoint;
    event.reason = absl::StrCat("draining (", draining.reason(), ")");
    event.draining = true;
    event.streams = link.openStreams();
    spawnFailover(link.shared_from_this(), std::move(event), std::move(draining));
    return;
  }
  if (&link == link_.get() && on_draining_) on_draining_(draining);
}

}  // namespace siphon::client
