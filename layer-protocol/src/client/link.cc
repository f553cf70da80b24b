// Links: dialling an agent (TCP, then TLS when asked), the handshake that
// opens or resumes a session, running a Link's transports, and resuming
// after a cut. What to try next and when to give up is LinkLifecycle's
// (link_lifecycle.h, no I/O); runLifecycle() carries its steps out.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/link.h"
#include "client/link_lifecycle.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "siphon/transport/spawn.h"
#include "siphon/transport/tls.h"

namespace siphon::client {

using net::asio::steady_timer;
namespace asio = net::asio;

net::awaitable<absl::StatusOr<net::Stream>> Client::dial(const std::string& endpoint,
                                                              bool* refused,
                                                              std::chrono::milliseconds limit,
                                                              bool after_cut) {
  const auto connect_timeout = limit.count() > 0 ? std::min(limit, options_.connect_timeout)
                                                 : options_.connect_timeout;
  std::string address = endpoint;
  if (options_.resolve_endpoint) {
    auto resolved = co_await options_.resolve_endpoint(endpoint, after_cut);
    if (!resolved.ok()) {
      co_return protoError(v1::UNAVAILABLE,
                           absl::StrCat(endpoint, ": ", resolved.status().message()));
    }
    address = *std::move(resolved);
    // A refusal is the local forwarder's (it is gone), not the agent's.
    refused = nullptr;
  }
  std::string host, port;
  CO_RETURN_IF_ERROR(net::splitHostPort(address, &host, &port));
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
  v1::Frame hello = protocol::makeHello(options_.client_name,
                                        options_.token_for ? options_.token_for(link.endpoint)
                                                           : options_.token,
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
    if (welcome->handovers() > link.welcome.handovers()) {
      // The agent process that held the session handed it to a new one
      // (docs/CONTINUITY.md, "Handover"): that is why the connection was cut.
      link.welcome.set_handovers(welcome->handovers());
      link.handed_over = true;
    }
  } else {
    link.welcome = *std::move(welcome);
    link.session = std::make_unique<protocol::Session>(protocol::Role::kClient,
                                                       protocol::fromProto(link.welcome.limits()));
  }
  // 1.2: the agent's streams may carry data before we accept them (a
  // stolen connection's first bytes come with its StreamOpen); they wait
  // in the ClientStream until its acceptor takes it.
  link.session->allowEarlyData(false, version->minor() >= protocol::kEarlyDataMinor);
  *leftover = std::move(first->leftover);
  co_return absl::OkStatus();
}

net::awaitable<absl::StatusOr<Client::Reached>> Client::runLifecycle(
    LinkLifecycle plan_in, std::shared_ptr<Link> resuming_in) {
  LinkLifecycle plan = std::move(plan_in);
  const std::shared_ptr<Link> resuming = std::move(resuming_in);
  std::shared_ptr<Link> link = resuming;
  std::optional<net::Stream> socket;
  std::string leftover;
  steady_timer sleeper(ex_);
  using Kind = LinkLifecycle::Step::Kind;
  LinkLifecycle::Step step = plan.start(protocol::Clock::now());
  while (true) {
    // A resume or a move stops when the client closes; a connect answers.
    if (closing_ && plan.goal() != LinkLifecycle::Goal::kConnect) {
      co_return protoError(v1::CANCELLED, "client closed the session");
    }
    switch (step.kind) {
      case Kind::kDial: {
        bool refused = false;
        auto dialled = co_await dial(step.endpoint, &refused, step.limit,
                                     plan.goal() != LinkLifecycle::Goal::kConnect);
        if (dialled.ok()) socket.emplace(std::move(*dialled));
        step = plan.onDialed(dialled.status(), refused, protocol::Clock::now());
        break;
      }
      case Kind::kHandshake: {
        if (!resuming) link = std::make_shared<Link>(*this, ++generations_, step.endpoint);
        absl::Status s = co_await handshake(*link, *socket, step.resume, &leftover, step.limit);
        step = plan.onHandshake(s, protocol::Clock::now());
        break;
      }
      case Kind::kWait: {
        sleeper.expires_after(step.wait);
        net::error_code ec;
        co_await sleeper.async_wait(asio::redirect_error(net::use_awaitable, ec));
        step = plan.onWaited(protocol::Clock::now());
        break;
      }
      case Kind::kDone:
        co_return Reached{std::move(link), std::move(*socket), std::move(leftover)};
      case Kind::kFail:
        co_return step.status;
    }
  }
}

LinkBackoff Client::backoff() const {
  return {options_.reconnect_backoff_initial, options_.reconnect_backoff_max};
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
  auto reached = co_await runLifecycle(LinkLifecycle::connect(options_.endpoints), nullptr);
  if (!reached.ok()) co_return reached.status();
  link_ = std::move(reached->link);
  start(link_, std::move(reached->socket), std::move(reached->leftover));
  co_return absl::OkStatus();
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
    // Ended here (Client::dropSession): nothing to resume.
    if (!link->lost.ok()) co_return;
    const AfterTransport after = afterTransport(closing_, link->goaway, options_.reconnect, why);
    if (after.kind == AfterTransport::Kind::kStop) co_return;
    link->session->onTransportLost();
    if (after.kind == AfterTransport::Kind::kLose) {
      linkLost(link, after.why);
      co_return;
    }
    // With another agent to go to, a session that cannot be resumed within
    // the keepalive timeout is given up for a new one there; else the
    // agent's grace is the limit.
    const bool may_move =
        (canFailover() || (options_.replicas && nextReplica() != nullptr)) && link_ == link;
    const protocol::SessionLimits& limits = link->session->limits();
    auto next = co_await runLifecycle(
        LinkLifecycle::resume(link->endpoint,
                              may_move ? limits.keepalive_timeout : limits.session_grace,
                              /*bounded=*/may_move, backoff()),
        link);
    if (closing_) co_return;
    if (!next.ok()) {
      linkLost(link, next.status());
      co_return;
    }
    ++link->resumes;
    socket = std::move(next->socket);
    leftover = std::move(next->leftover);
    if (link->handed_over) {
      link->handed_over = false;
      why = absl::UnavailableError("the agent was handed over to a new agent process");
    }
    if (on_resumed_ && link == link_) on_resumed_(why);
  }
}

}  // namespace siphon::client
