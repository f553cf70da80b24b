// The agent's Server: listening, admission and the handshake, request
// dispatch, drain and shutdown. Over 600 lines because these share the
// server's state on one event loop (the session table, the drain deadline,
// the handshake slots) and are easiest to check read together; the pure
// parts are elsewhere: the accept decision (accept_decision.cc), admission
// limits (admission.cc), a session (agent_session.cc).
#include "agent/server/server.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/metrics/process.h"
#include "agent/server/accept_decision.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "siphon/transport/spawn.h"
#include "siphon/transport/tls.h"

#ifndef SIPHON_VERSION
#define SIPHON_VERSION "0.0.0"
#endif

namespace siphon::agent {

namespace asio = net::asio;
using net::awaitable;
using net::use_awaitable;

namespace {

// The largest first frame (the Hello) a client may send. A Hello is a few
// hundred bytes; the session's 1 MiB frames come after the handshake. Until
// then the client is not authenticated, and each connection waiting in its
// handshake holds what it sent: 64 KiB, not a frame's 1 MiB.
constexpr uint32_t kMaxHelloSize = 64 << 10;

int64_t unixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ------------------------------------------------------------------ Server

Server::Server(AgentConfig config, std::unique_ptr<Target> target, std::unique_ptr<ProcFs> procfs)
    : config_(std::move(config)),
      target_(std::move(target)),
      procfs_(std::move(procfs)),
      handshake_slots_(config_.max_handshakes, config_.max_handshakes_per_source),
      acceptor_(io_),
      first_client_timer_(io_),
      idle_timer_(io_),
      signals_(io_, SIGTERM, SIGINT),
      started_(std::chrono::steady_clock::now()) {
  metrics_.setStateSource([this] { return liveState(); });
}

Server::~Server() {
  stopHandover();
  // Blocking jobs may still post to the loop or use the services: let them
  // finish first. The same for the netns worker's queue (its tasks answer on
  // the loop): a task run after the others returns once they are done.
  blocking_pool_.join();
  if (netns_) netns_->run<bool>([] { return true; });
}

absl::Status Server::init() {
  // targetless: the agent's own namespace, no setns needed.
  int netns_fd = target_->mode() == TargetMode::kTargetless ? -1 : target_->netnsFd();
  ASSIGN_OR_RETURN(netns_, NetnsWorker::start(netns_fd));
  service_ctx_ = std::make_unique<ServiceContext>(ServiceContext{
      io_, blocking_pool_, *target_, *procfs_, *netns_, config_, {}, {}, &metrics_, {}});
  services_ = buildServices(*service_ctx_);
  return absl::OkStatus();
}

absl::Status Server::setUpTls() {
  if (!config_.tls_cert.empty() || !config_.tls_key.empty() || !config_.tls_client_ca.empty()) {
    ASSIGN_OR_RETURN(
        tls_, net::tls::serverContext({config_.tls_cert, config_.tls_key, config_.tls_client_ca}));
  }
  return absl::OkStatus();
}

absl::Status Server::listen() {
  RETURN_IF_ERROR(setUpTls());
  std::string host, port;
  RETURN_IF_ERROR(net::splitHostPort(config_.listen, &host, &port));
  net::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("--listen ", config_.listen, ": '", host,
                                                         "' is not an IP address"));
  }
  net::tcp::endpoint ep(address, static_cast<uint16_t>(std::stoul(port)));
  auto fail = [&](std::string_view what) {
    return protoError(v1::UNAVAILABLE, absl::StrCat("cannot listen on ", config_.listen, ": ",
                                                    asv(what), ": ", ec.message()));
  };
  acceptor_.open(ep.protocol(), ec);
  if (ec) return fail("socket");
  acceptor_.set_option(net::tcp::acceptor::reuse_address(true), ec);
  acceptor_.bind(ep, ec);
  if (ec) return fail("bind");
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  setFdBudget();
  RETURN_IF_ERROR(listenMetrics());
  return listenHandover(/*replace=*/false);
}

void Server::setFdBudget() {
  // The descriptor budget of admit(), from the limit main() raised.
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    fd_budget_ = fdBudgetFor(rl.rlim_cur);
  }
}

absl::Status Server::listenMetrics() {
  if (config_.metrics_listen.empty()) return absl::OkStatus();
  http_ = std::make_unique<metrics::HttpEndpoint>(
      io_.get_executor(), metrics::HttpEndpoint::Handlers{[this] { return metrics_.render(); },
                                                          [this] { return notReady(); }});
  RETURN_IF_ERROR(http_->listen(config_.metrics_listen));
  log::info("metrics_listening", {{"address", http_->address()}});
  return absl::OkStatus();
}

std::string Server::metricsAddress() const { return http_ ? http_->address() : ""; }

std::string Server::notReady() const {
  if (stopping_) return "the agent is exiting";
  if (draining_) return absl::StrCat("draining (", drain_reason_, ")");
  if (!services_) return "the target is not entered yet";
  if (!acceptor_.is_open()) return "the client listener is not up yet";
  return "";
}

metrics::LiveState Server::liveState() const {
  metrics::LiveState st;
  st.ready = notReady().empty();
  st.handshakes_pending = handshake_slots_.pending();
  for (const auto& [id, s] : sessions_) {
    if (s->attached()) {
      ++st.sessions_attached;
    } else {
      ++st.sessions_detached;
    }
    s->countStreams(st.streams);
  }
  return st;
}

std::string Server::listenAddress() const {
  net::error_code ec;
  auto ep = acceptor_.local_endpoint(ec);
  if (ec) return config_.listen;
  if (ep.address().is_v6()) return absl::StrCat("[", ep.address().to_string(), "]:", ep.port());
  return absl::StrCat(ep.address().to_string(), ":", ep.port());
}

std::string Server::readyLine() const {
  return absl::StrCat("siphon-agent ready version=", SIPHON_VERSION, " listen=", listenAddress(),
                      " target_pid=", target_->pid(), " netns=", target_->netnsLabel(),
                      http_ ? absl::StrCat(" metrics=", http_->address()) : "");
}

int Server::run() {
  // Without its accept loop the agent serves no one new: it exits and is
  // restarted, rather than lingering deaf.
  net::spawn(io_, acceptLoop(), "accept_loop",
             [this] { shutdown(kExitInternal, "the accept loop failed"); });
  if (http_) http_->start();
  net::spawn(io_, watchSignals(), "watch_signals");
  if (target_->hasPidfd()) net::spawn(io_, watchTarget(), "watch_target");
  if (config_.first_client_timeout.count() > 0) {
    first_client_timer_.expires_after(config_.first_client_timeout);
    first_client_timer_.async_wait([this](net::error_code ec) {
      if (ec || had_client_ || stopping_) return;
      log::error("no_client",
                 {{"timeout_ms", static_cast<int64_t>(config_.first_client_timeout.count())}});
      shutdown(kExitNoClient, "no client connected within --first-client-timeout");
    });
  }
  io_.run();
  return exit_code_;
}

awaitable<void> Server::acceptLoop() {
  while (!stopping_ && !handover_frozen_) {
    net::error_code ec;
    net::tcp::socket socket =
        co_await acceptor_.async_accept(asio::redirect_error(use_awaitable, ec));
    if (stopping_) break;
    if (handover_frozen_) {
      // Accepted as the freeze began: the client's handshake would find
      // no one; it reconnects to whichever agent accepts next.
      break;
    }
    if (ec) {
      if (ec == asio::error::operation_aborted) break;
      // EMFILE and friends: log, breathe, go on; the listener must not die.
      if (uint64_t n = throttle_.hit("accept_failed")) {
        log::warn("accept_failed", {{"error", ec.message()}, {"count", n}});
      }
      asio::steady_timer t(io_);
      t.expires_after(std::chrono::milliseconds(100));
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    admit(std::move(socket));
  }
}

void Server::admit(net::tcp::socket socket) {
  net::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // reset already: the socket closes here
  const std::string source = remote.address().to_string();
  // Shared with the slot's eviction callback, which resets the connection
  // whatever step of its handshake it is in (TLS or the Hello): the step's
  // read ends with operation_aborted and the handshake sees evicted().
  // Plain here; the handshake puts TLS over it.
  auto stream = std::make_shared<net::Stream>(std::move(socket));
  // Closed with an RST (linger 0), so neither side keeps the connection in
  // FIN_WAIT or TIME_WAIT; before a byte is read or written when refused.
  auto reset = [](net::Stream& s) {
    net::error_code ignored;
    s.socket().set_option(asio::socket_base::linger(true, 0), ignored);
    s.socket().close(ignored);
  };
  const auto now = std::chrono::steady_clock::now();
  HandshakeSlots::Admission a =
      handshake_slots_.admit(source, now, [weak = std::weak_ptr<net::Stream>(stream), reset] {
        if (auto s = weak.lock()) reset(*s);
      });
  // The descriptors are counted only when the admission adds a connection:
  // one that took an evicted connection's place leaves the count as it was
  // (the evicted socket is closed already), so a flood past the caps costs
  // no read of /proc per accept. The accepted socket is among those
  // counted. Past the reserve the newcomer takes the place of the oldest
  // connection without a Hello, as past a cap: still no more descriptors.
  if (a.slot.held() && a.evicted.rule == HandshakeSlots::Refusal::kNone && fd_budget_.limit > 0 &&
      !fd_budget_.admits(metrics::countOpenFds()) &&
      !handshake_slots_.evictOldest(a.slot, HandshakeSlots::Refusal::kFdReserve, now, &a.evicted)) {
    a.slot.release();
    a.refused = HandshakeSlots::Refusal::kFdReserve;
  }
  if (a.evicted.rule != HandshakeSlots::Refusal::kNone) noteEviction(a.evicted);
  if (a.slot.held()) {
    // The stream and the slot live in the coroutine's frame: an exception
    // escaping it closes that connection and frees its slot, nothing else.
    net::spawn(io_, handshake(std::move(stream), std::move(a.slot)), "handshake");
    return;
  }
  // Refused: every slot of the full rule is held by a connection past its
  // Hello (which ends within a write), or the reserve is reached with no
  // other connection waiting.
  reset(*stream);
  const std::string_view reason = HandshakeSlots::refusalName(a.refused);
  metrics_.handshakeRejected(reason);
  // A flood must not flood the log: the 1st, 2nd, 4th... refusal of each
  // reason is logged, with the count so far.
  if (uint64_t n = throttle_.hit(absl::StrCat("handshake_refused:", asv(reason)))) {
    log::warn("handshake_refused",
              {{"reason", reason},
               {"peer", source},
               {"count", n},
               {"pending", static_cast<uint64_t>(handshake_slots_.pending())},
               {"pending_from_peer", static_cast<uint64_t>(handshake_slots_.pendingFrom(source))}});
  }
}

void Server::noteEviction(const HandshakeSlots::Eviction& evicted) {
  const std::string_view reason = HandshakeSlots::refusalName(evicted.rule);
  metrics_.handshakeEvicted(reason);
  // Throttled like the refusals. waited_ms: how long the evicted peer had
  // waited; a few ms under a steady flood says it reopens faster than a
  // client's Hello round trip, which only a client's own address helps.
  if (uint64_t n = throttle_.hit(absl::StrCat("handshake_evicted:", asv(reason)))) {
    log::warn("handshake_evicted",
              {{"reason", reason},
               {"peer", evicted.source},
               {"waited_ms",
                static_cast<int64_t>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(evicted.waited).count())},
               {"count", n},
               {"pending", static_cast<uint64_t>(handshake_slots_.pending())},
               {"pending_from_peer",
                static_cast<uint64_t>(handshake_slots_.pendingFrom(evicted.source))}});
  }
}

std::string Server::newId(size_t bytes) const {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Without randomness session tokens would be guessable: a broken
      // invariant, not an operating condition.
      perror("siphon-agent: getrandom");
      abort();
    }
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

awaitable<void> Server::handshake(std::shared_ptr<net::Stream> stream, HandshakeSlots::Slot slot) {
  // Held until the handshake ends, whichever way it ends (the frame's end);
  // the stream in a frame variable too (GCC 12 and coroutine parameters).
  HandshakeSlots::Slot held = std::move(slot);
  const std::shared_ptr<net::Stream> owned = std::move(stream);
  net::Stream& socket = *owned;
  // One deadline from accept() to the Hello: the TLS handshake and the
  // Hello share it, so a peer that dribbles both holds its slot no longer
  // than --handshake-timeout.
  const auto deadline = std::chrono::steady_clock::now() + config_.handshake_timeout;
  auto left = [deadline] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  net::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  std::string peer = ec ? "?" : absl::StrCat(remote.address().to_string(), ":", remote.port());
  // TLS over the socket here, not in admit(): should it throw (SSL_new),
  // this connection ends, not the accept loop. The eviction callback
  // reaches the socket under either.
  if (tls_) socket = net::Stream(std::move(socket.socket()), *tls_);
  // An evicted connection was reset by admit() and its step ended with an
  // error: it ends here, without a log line of its own (noteEviction's).
  auto failed = [&](const absl::Status& status) {
    if (held.evicted()) return;
    // Per connection, at a peer's will: throttled (1st, 2nd, 4th...).
    if (uint64_t n =
            throttle_.hit(absl::StrCat("handshake_failed:", errorCodeName(errorCodeOf(status))))) {
      log::info("handshake_failed",
                {{"peer", peer}, {"error", sv(status.message())}, {"count", n}});
    }
  };
  // A short first deadline, for the first bytes (the TLS ClientHello or
  // the Hello's): a client sends them at once, a flood's idle connection
  // never. It frees an idle connection's slot and descriptor long before
  // --handshake-timeout, and without a newcomer to evict it.
  absl::Status bytes = co_await net::waitFirstBytes(
      socket.socket(), std::min(config_.handshake_first_bytes_timeout, config_.handshake_timeout));
  if (!bytes.ok()) {
    failed(bytes);
    socket.close();
    co_return;
  }
  if (socket.tls()) {
    absl::Status tls = co_await net::tls::accept(socket, left());
    if (held.evicted()) co_return;
    if (!tls.ok()) {
      // Per connection, at a peer's will: throttled (1st, 2nd, 4th...).
      if (uint64_t n = throttle_.hit("tls_handshake_failed")) {
        log::warn("tls_handshake_failed",
                  {{"peer", peer}, {"error", sv(tls.message())}, {"count", n}});
      }
      if (errorCodeOf(tls) == v1::FAILED_PRECONDITION) {
        // A plain client: take its Hello (closing on unread bytes would
        // reset the connection before it reads the answer), then tell it
        // why in plain.
        (void)co_await net::readFirstFrame(socket.socket(), left(), kMaxHelloSize);
        if (held.evicted()) co_return;
        (void)co_await net::writeFrame(
            socket.socket(),
            protocol::makeReject(v1::UNAUTHENTICATED, std::string(net::tls::kPlainClientMessage)));
      }
      socket.close();
      co_return;
    }
  }
  // Parameters by reference: GCC 12 destroys by-value parameters of lambda
  // coroutines twice.
  auto reject = [&](v1::ErrorCode code, const std::string& message) -> awaitable<void> {
    if (uint64_t n = throttle_.hit(absl::StrCat("client_rejected:", errorCodeName(code)))) {
      log::warn("client_rejected",
                {{"peer", peer}, {"code", errorCodeName(code)}, {"reason", message}, {"count", n}});
    }
    metrics_.errorSent(code, metrics::ErrorFrame::kReject);
    // Best effort: the peer may be gone already, and the socket closes either way.
    (void)co_await net::writeFrame(socket, protocol::makeReject(code, message));
    net::error_code ignored;
    socket.shutdown(net::tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
  };

  auto first = co_await net::readFirstFrame(socket, left(), kMaxHelloSize);
  if (held.evicted()) co_return;
  if (!first.ok()) {
    v1::ErrorCode code = errorCodeOf(first.status());
    if (code == v1::PROTOCOL_ERROR || code == v1::FRAME_TOO_LARGE) {
      co_await reject(code, std::string(first.status().message()));
    } else {
      failed(first.status());
    }
    co_return;
  }
  // A whole frame came: what is left (the answer) takes one write, so the
  // connection is never evicted from here on; it still holds its slot.
  held.helloReceived();
  // A handover froze the agent: the client reconnects and meets whichever
  // agent serves then (the socket closes here, before any answer).
  if (stopping_ || handover_frozen_) co_return;
  if (!first->frame.has_hello()) {
    co_await reject(v1::PROTOCOL_ERROR, "the first frame must be Hello");
    co_return;
  }
  const v1::Hello& hello = first->frame.hello();
  // The decision has no I/O (accept_decision.h); what it needs is gathered
  // here, every session only when a new one would pass --max-sessions.
  auto view = [](AgentSession& s) {
    return SessionView{.id = s.id(),
                       .resume_token = s.resumeToken(),
                       .detached = s.detached(),
                       .received = s.session().receivedCount(),
                       .streams = s.streamCount(),
                       .created = s.created()};
  };
  AcceptState state;
  state.agent_version = protocol::currentVersion();
  state.insecure_no_auth = config_.insecure_no_auth;
  state.token = config_.token;
  state.draining = draining_;
  state.max_sessions = config_.max_sessions;
  state.session_grace = config_.limits.session_grace;
  state.limits = config_.limits;
  state.session_count = sessions_.size();
  if (hello.has_resume()) {
    if (auto it = sessions_.find(hello.resume().session_id()); it != sessions_.end()) {
      state.resumed = view(*it->second);
    }
  }
  std::vector<SessionView> views;
  if (!hello.has_resume() && sessions_.size() >= config_.max_sessions) {
    for (const auto& [id, s] : sessions_) views.push_back(view(*s));
    state.sessions = views;
  }
  const AcceptDecision decision = decideAccept(hello, state);
  if (decision.kind == AcceptDecision::Kind::kReject) {
    co_await reject(decision.code, decision.message);
    if (!decision.resume_outcome.empty()) metrics_.resume(decision.resume_outcome);
    co_return;
  }
  const v1::Version* version = &decision.version;
  v1::Frame welcome_frame;
  v1::Welcome& welcome = *welcome_frame.mutable_welcome();
  *welcome.mutable_version() = *version;
  welcome.set_agent_version(SIPHON_VERSION);
  *welcome.mutable_target() = target_->describe();
  for (v1::Feature f : services_->features()) welcome.add_features(f);

  std::shared_ptr<AgentSession> session;
  uint64_t attachment = 0;
  if (decision.resume) {
    session = sessions_.at(hello.resume().session_id());
    session->detachForResume();
    absl::Status s =
        session->session().resume(hello.resume().last_seq_received(), protocol::Clock::now());
    if (!s.ok()) {
      co_await reject(v1::RESUME_FAILED, std::string(s.message()));
      session->lose("resume failed");
      metrics_.resume("replay_failed");
      co_return;
    }
    welcome.set_resumed(true);
    welcome.set_last_seq_received(session->session().receivedCount());
    // Another resume of the session may run while this Welcome is written:
    // the later one wins (attach() refuses this one then).
    attachment = session->session().attachment();
  } else {
    if (decision.kind == AcceptDecision::Kind::kEvict) {
      const std::shared_ptr<AgentSession> evicted = sessions_.at(decision.evict_session_id);
      log::warn("session_evicted",
                {{"session", evicted->id()},
                 {"client", evicted->clientName()},
                 {"reason", "session limit reached; it was detached and had sent nothing"}});
      evicted->end("evicted: detached with nothing to resume, at the session limit");
    }
    session = std::make_shared<AgentSession>(*this, newId(8), newId(24), hello.client_name(),
                                             decision.limits);
    sessions_[session->id()] = session;
  }
  session->setProtocolMinor(version->minor());
  // 1.2: a stolen connection's first bytes go with its StreamOpen, not a
  // round trip later after the client's accept.
  session->session().allowEarlyData(version->minor() >= protocol::kEarlyDataMinor, false);
  welcome.set_session_id(session->id());
  welcome.set_resume_token(session->resumeToken());
  welcome.set_handovers(session->handovers());
  *welcome.mutable_limits() = protocol::toProto(session->session().limits());

  // The Welcome goes out before the session's own frames: write it here,
  // then hand the socket to the session's transport.
  absl::Status w = co_await net::writeFrame(socket, welcome_frame);
  if (!w.ok()) {
    log::info("handshake_failed",
              {{"session", session->id()}, {"peer", peer}, {"error", sv(w.message())}});
    if (welcome.resumed()) metrics_.resume("handshake_failed");
    if (!welcome.resumed()) {
      session->end("handshake failed");
    } else {
      // Detached again, its grace deadline unchanged (detachForResume): a
      // client whose resumes keep failing does not extend it.
      session->resumeFailed(attachment);
    }
    co_return;
  }
  if (session->ended() || handover_frozen_) co_return;
  if (welcome.resumed() && session->session().attachment() != attachment) {
    log::info("resume_superseded", {{"session", session->id()}, {"peer", peer}});
    metrics_.resume("superseded");
    co_return;  // the socket closes: a later resume holds the session
  }
  had_client_ = true;
  first_client_timer_.cancel();
  idle_timer_.cancel();
  if (welcome.resumed()) {
    metrics_.resume("ok");
  } else {
    metrics_.session("opened");
  }
  log::info(welcome.resumed() ? "session_resumed" : "session_opened",
            {{"session", session->id()},
             {"client", hello.client_name()},
             {"peer", peer},
             {"version", protocol::versionString(*version)}});
  session->attach(std::move(socket), std::move(first->leftover), attachment);
}

void Server::handleRequest(std::shared_ptr<AgentSession> session, v1::Request request) {
  v1::Response response;
  response.set_request_id(request.request_id());
  if (request.body_case() == v1::Request::kInfo) {
    *response.mutable_info() = info(*session);
  } else if (request.body_case() == v1::Request::kSessions) {
    *response.mutable_sessions() = listSessions(*session);
  } else if (RequestService* service = services_->request(request.body_case())) {
    service->handle(std::move(session), std::move(request));
    return;
  } else if (request.body_case() == v1::Request::BODY_NOT_SET) {
    *response.mutable_error() =
        toProtoError(protoError(v1::INVALID_ARGUMENT, "request with no body"));
  } else {
    std::string name = request.GetDescriptor()->FindFieldByNumber(request.body_case())->name();
    *response.mutable_error() = toProtoError(protoError(
        v1::UNIMPLEMENTED,
        absl::StrCat("request '", name, "' is not implemented by agent ", SIPHON_VERSION)));
  }
  session->respond(std::move(response));
}

v1::InfoResponse Server::info(const AgentSession& session) const {
  v1::InfoResponse r;
  r.set_agent_version(SIPHON_VERSION);
  *r.mutable_protocol_version() = protocol::currentVersion();
  *r.mutable_target() = target_->describe();
  for (v1::Feature f : services_->features()) r.add_features(f);
  r.set_sessions(static_cast<uint32_t>(sessions_.size()));
  r.set_session_id(session.id());
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) r.set_hostname(host);
  r.set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - started_)
                      .count());
  *r.mutable_limits() = protocol::toProto(const_cast<AgentSession&>(session).session().limits());
  return r;
}

v1::SessionsResponse Server::listSessions(const AgentSession& asking) const {
  v1::SessionsResponse r;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [id, s] : sessions_) {
    v1::SessionSummary& out = *r.add_sessions();
    out.set_session_id(id);
    out.set_client_name(s->clientName());
    out.set_age_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - s->created()).count());
    out.set_attached(s->attached());
    out.set_state(s->attached() ? "attached" : "detached");
    out.set_streams(static_cast<uint32_t>(s->streamCount()));
    out.set_bytes_in(s->bytesIn());
    out.set_bytes_out(s->bytesOut());
    out.set_handovers(s->handovers());
    out.set_current(s.get() == &asking);
    services_->describeSubscriptions(id, out.mutable_subscriptions());
    for (const auto& sub : out.subscriptions()) {
      if (sub.kind() == "steal") out.add_stolen_ports(sub.port());
      if (sub.kind() == "mirror") out.add_mirrored_ports(sub.port());
    }
  }
  return r;
}

void Server::requestStop() {
  asio::post(io_, [this] { shutdown(kExitOk, "stop requested"); });
}

void Server::requestDrain(std::string reason) {
  asio::post(io_, [this, reason = std::move(reason)] { startDrain(reason); });
}

void Server::sessionEnded(const std::string& id) {
  sessions_.erase(id);
  services_->sessionEnded(id);
  if (sessions_.empty()) armIdleTimer();
}

void Server::armIdleTimer() {
  if (config_.idle_timeout.count() == 0 || stopping_) return;
  idle_timer_.expires_after(config_.idle_timeout);
  idle_timer_.async_wait([this](net::error_code ec) {
    if (ec || stopping_ || !sessions_.empty()) return;
    log::info("idle_timeout", {{"timeout_ms", static_cast<int64_t>(config_.idle_timeout.count())}});
    shutdown(kExitOk, "idle: no session for --idle-timeout");
  });
}

awaitable<void> Server::watchSignals() {
  int count = 0;
  while (!stopping_) {
    net::error_code ec;
    int sig = co_await signals_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;
    if (++count == 1) {
      log::info("signal", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}, {"action", "drain"}});
      startDrain(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    } else {
      log::info("signal", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}, {"action", "exit"}});
      shutdown(kExitOk, "second signal");
    }
  }
}

awaitable<void> Server::watchTarget() {
  // The pidfd turns readable when the target exits.
  int fd = dup(target_->pidfd());
  if (fd < 0) {
    log::warn("watch_target_failed", {{"error", sv(lastErrnoStatus("dup pidfd").message())}});
    co_return;
  }
  asio::posix::stream_descriptor pidfd(io_, fd);
  net::error_code ec;
  co_await pidfd.async_wait(asio::posix::stream_descriptor::wait_read,
                            asio::redirect_error(use_awaitable, ec));
  if (ec || stopping_) co_return;
  const pid_t pid = target_->pid();
  const auto timeout = config_.target_restart_timeout;
  if (!reopen_ || timeout.count() <= 0) {
    log::info("target_exited", {{"pid", static_cast<int64_t>(pid)}});
    shutdown(kExitOk, absl::StrCat("target process ", pid, " exited"));
    co_return;
  }
  // A container's process exited: in Kubernetes the kubelet starts the
  // container again in the same pod (the same network namespace). Sessions,
  // steals and mirrors stay as they are meanwhile; connections stolen go on
  // (the steering and the agent's sockets live in the namespace, not in the
  // process), and the application's passthrough fails until it is back.
  log::info("target_exited", {{"pid", static_cast<int64_t>(pid)},
                              {"waiting_ms", static_cast<int64_t>(timeout.count())}});
  const auto now = std::chrono::steady_clock::now();
  awaitTargetBack(pid, now, now + timeout);
}

void Server::awaitTargetBack(pid_t old_pid, std::chrono::steady_clock::time_point exited_at,
                             std::chrono::steady_clock::time_point deadline) {
  if (stopping_) return;
  // The runtime's answer and the /proc opens block: on the pool.
  asio::post(blocking_pool_, [this, old_pid, exited_at, deadline] {
    auto next = std::make_shared<absl::StatusOr<std::unique_ptr<Target>>>(reopen_());
    asio::post(io_, [this, next, old_pid, exited_at, deadline] {
      if (stopping_) return;
      if (next->ok()) {
        onTargetBack(std::move(**next), old_pid, exited_at);
        return;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const std::string why = absl::StrCat(
            "target process ", old_pid, " exited and its container had no new process within ",
            config_.target_restart_timeout.count(), " ms (", next->status().message(), ")");
        log::info("target_not_back", {{"pid", static_cast<int64_t>(old_pid)},
                                      {"error", sv(next->status().message())}});
        shutdown(kExitOk, why);
        return;
      }
      // Often enough that a restart is adopted in well under a second, and
      // a runtime is asked a few times a second at most.
      target_retry_timer_.expires_after(std::min<std::chrono::steady_clock::duration>(
          std::chrono::milliseconds(200), deadline - now));
      target_retry_timer_.async_wait([this, old_pid, exited_at, deadline](net::error_code ec) {
        if (!ec) awaitTargetBack(old_pid, exited_at, deadline);
      });
    });
  });
}

void Server::onTargetBack(std::unique_ptr<Target> next, pid_t old_pid,
                          std::chrono::steady_clock::time_point exited_at) {
  const pid_t new_pid = next->pid();
  const uint64_t new_netns = next->netnsInode();
  if (absl::Status s = target_->adopt(std::move(next)); !s.ok()) {
    // The pod is gone or was recreated: nothing steered in this namespace
    // reaches anyone any more. Clients are told and the agent drains.
    log::warn("target_netns_gone", {{"pid", static_cast<int64_t>(new_pid)},
                                    {"netns", absl::StrCat("net:[", new_netns, "]")},
                                    {"was", target_->netnsLabel()}});
    startDrain(sv(s.message()), kExitTargetNetnsGone);
    return;
  }
  const int64_t down_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - exited_at)
                              .count();
  // Who holds more of the old target than the root fd's number (which
  // names the new root already): the file helper starts again.
  for (const auto& hook : service_ctx_->target_restarted) hook(new_pid);
  v1::TargetRestarted restarted;
  *restarted.mutable_target() = target_->describe();
  restarted.set_previous_pid(static_cast<int32_t>(old_pid));
  restarted.set_restarts(target_->restarts());
  restarted.set_down_ms(down_ms);
  for (auto& [id, session] : sessions_) session->notifyTargetRestarted(restarted);
  log::info("target_restarted", {{"pid", static_cast<int64_t>(new_pid)},
                                 {"previous_pid", static_cast<int64_t>(old_pid)},
                                 {"restarts", static_cast<uint64_t>(target_->restarts())},
                                 {"down_ms", down_ms},
                                 {"sessions", static_cast<uint64_t>(sessions_.size())}});
  net::spawn(io_, watchTarget(), "watch_target");
}

void Server::startDrain(std::string_view reason, int exit_code) {
  if (draining_ || stopping_) return;
  draining_ = true;
  drain_exit_code_ = exit_code;
  drain_reason_ = std::string(reason);
  drain_deadline_ = std::chrono::steady_clock::now() + config_.drain_timeout;
  const int64_t deadline = unixMillis() + config_.drain_timeout.count();
  for (auto& [id, s] : sessions_) s->notifyDraining(deadline, reason);
  // New connections reach the application from now on (the steering goes
  // first); stolen and outgoing connections in flight go on.
  if (services_) services_->agentDraining();
  log::info("drain_started", {{"reason", reason},
                              {"timeout_ms", static_cast<int64_t>(config_.drain_timeout.count())},
                              {"in_flight", static_cast<uint64_t>(inFlight())}});
  // Without its watcher the drain would never end the agent.
  net::spawn(io_, watchDrain(std::string(reason)), "watch_drain",
             [this] { shutdown(kExitInternal, "the drain watcher failed"); });
}

size_t Server::inFlight() const {
  size_t n = services_ ? services_->inFlight() : 0;
  for (const auto& [id, s] : sessions_) n += s->streamCount();
  return n;
}

awaitable<void> Server::watchDrain(std::string reason) {
  const std::string why = std::move(reason);
  asio::steady_timer tick(io_);
  // The steering is undone on the blocking pool: give it a moment before
  // counting what is left (a connection it let through is then counted).
  tick.expires_after(std::chrono::milliseconds(20));
  net::error_code ec;
  co_await tick.async_wait(asio::redirect_error(use_awaitable, ec));
  while (!stopping_) {
    const size_t left = inFlight();
    if (left == 0) {
      shutdown(drain_exit_code_, absl::StrCat("drained after ", why));
      co_return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= drain_deadline_) {
      log::warn("drain_timeout",
                {{"in_flight", static_cast<uint64_t>(left)},
                 {"timeout_ms", static_cast<int64_t>(config_.drain_timeout.count())}});
      const v1::Error error = toProtoError(protoError(
          v1::AGENT_DRAINING, absl::StrCat("the agent's drain timeout (",
                                           config_.drain_timeout.count(), " ms) ran out")));
      auto sessions = sessions_;
      for (auto& [id, s] : sessions) s->resetStreams(error);
      shutdown(drain_exit_code_, absl::StrCat("drain timeout after ", why));
      co_return;
    }
    tick.expires_after(std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(50),
                                                                     drain_deadline_ - now));
    co_await tick.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

void Server::shutdown(int exit_code, std::string_view reason) {
  if (stopping_) return;
  stopping_ = true;
  exit_code_ = exit_code;
  log::info("agent_exiting", {{"reason", reason}, {"exit_code", exit_code}});
  net::error_code ec;
  acceptor_.close(ec);
  first_client_timer_.cancel();
  idle_timer_.cancel();
  target_retry_timer_.cancel();
  signals_.cancel(ec);
  // end() removes the session from the map: iterate over a copy.
  auto sessions = sessions_;
  for (auto& [id, s] : sessions) s->end(reason);
  // Then the services undo what they did to the target (the steal
  // redirection) while the loop still runs.
  if (services_) services_->agentStopping();
  // Give the Goaways a moment to reach the clients, then stop.
  auto t = std::make_shared<asio::steady_timer>(io_);
  t->expires_after(std::chrono::milliseconds(200));
  t->async_wait([this, t](net::error_code) { io_.stop(); });
}

}  // namespace siphon::agent
