// The steal service: subscriptions (ports, HTTP filters), the steering that
// brings the ports' connections to the agent (sk_lookup or iptables), and
// the routing of each stolen connection (to a subscribed session, or on to
// the original destination). Over 600 lines because one class,
// StealServiceImpl, owns the subscriptions, the steering and the live
// connections, shared by the event loop and the steering strand (the
// sections are marked below); the backends are steal_backends.cc, the
// socket pump agent/streams/socket_pump.cc.
#include "agent/steal/steal_service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <future>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/netns/netns_worker.h"
#include "agent/outgoing/address.h"
#include "agent/steal/http/engine.h"
#include "agent/steal/passthrough.h"
#include "agent/steal/session_stream.h"
#include "agent/steal/subscriptions.h"
#include "agent/streams/socket_pump.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal {
namespace {

namespace asio = net::asio;
using outgoing::portOf;
using outgoing::SockAddr;

using Clock = std::chrono::steady_clock;

constexpr auto kPassthroughConnectTimeout = std::chrono::seconds(10);
// How long the listeners stay open once a drain removed the steering.
constexpr auto kDrainListenerLinger = std::chrono::milliseconds(200);
// FilterOverlap notices: at most one per subscription this often.
constexpr auto kOverlapNoticeInterval = std::chrono::seconds(1);

http::HttpOptions httpOptions(const AgentConfig& c) {
  http::HttpOptions o;
  o.detect_timeout = c.http_detect_timeout;
  o.max_head_bytes = c.http_max_head_bytes;
  o.max_request_body = c.http_max_request_body;
  o.max_response_body = c.http_max_response_body;
  o.idle_timeout = c.http_idle_timeout;
  return o;
}

int64_t millisBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

void noDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void abortiveClose(UniqueFd fd) {
  if (!fd) return;
  linger l{1, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
}

// A TCP listener of `family` on the wildcard address, port 0, in the
// target's netns. sk_lookup: the listener must be created inside the target
// netns (from another namespace bpf_sk_assign succeeds but the handshake
// never completes). iptables: REDIRECT delivers to the address the packet
// came in on, hence the wildcard.
absl::StatusOr<UniqueFd> makeListener(NetnsRunner& netns, int family, uint16_t* port) {
  ASSIGN_OR_RETURN(UniqueFd fd, netns.socketSync(family, SOCK_STREAM, IPPROTO_TCP));
  int one = 1;
  if (family == AF_INET6 &&
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) {
    return lastErrnoStatus("steal listener: IPV6_V6ONLY");
  }
  // Accepted sockets inherit it: one that ends in TIME_WAIT holds the
  // application's port (its local address), and without SO_REUSEADDR it
  // would keep the application from binding that port again for a minute.
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    return lastErrnoStatus("steal listener: SO_REUSEADDR");
  }
  const SockAddr any = outgoing::wildcardAddress(family);
  const char* what = family == AF_INET ? "0.0.0.0:0" : "[::]:0";
  if (::bind(fd.get(), any.get(), any.len) != 0) {
    return lastErrnoStatus(absl::StrCat("steal listener: bind ", what));
  }
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    return lastErrnoStatus(absl::StrCat("steal listener: listen on ", what));
  }
  ASSIGN_OR_RETURN(SockAddr bound, outgoing::localAddress(fd.get()));
  *port = portOf(bound);
  return fd;
}

// Thread rule: each member belongs to one thread, as marked below.
//   Event loop (ctx_.io): subscriptions, sessions, accept loops, the HTTP
//     engine, and what it needs of the steering: io_steering_ (for the
//     per-connection calls exempt/unexempt/originalDestination) and
//     io_backend_ (its name, for Subscribed and session listings), both
//     set by startAccepting(), which the strand posts once the steering
//     exists. It never reads steering_ nor calls the steering's other
//     methods: the pool may be inside addPort() at that moment, and
//     steering.h lets an implementation rely on one call at a time.
//   Strand (strand_, on the blocking pool): steering_ (created there by
//     ensureSteering(), which may block: listeners in the netns, processes
//     for iptables) and port_refs_; addPort/removePort/stop run there only.
//   Both: stopped_ (atomic).
// The destructor runs once the pool is joined (Server::~Server).
class StealServiceImpl final : public StealService,
                               public http::HttpRouter,
                               public std::enable_shared_from_this<StealServiceImpl> {
 public:
  StealServiceImpl(ServiceContext& ctx, SteeringFactory factory, FlushFunction flush)
      : ctx_(ctx),
        factory_(std::move(factory)),
        flush_(std::move(flush)),
        strand_(asio::make_strand(ctx.blocking)),
        table_([&ctx] { return ctx.subscription_ids.next(); }) {}

  ~StealServiceImpl() override {
    if (engine_) engine_->stop();
    // The blocking pool has been joined by now (Server::~Server): nothing
    // else touches the steering.
    if (steering_) steering_->stop();
  }

  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    if (request.has_steal()) {
      subscribe(std::move(session), request.request_id(), request.steal());
    } else if (request.has_unsubscribe()) {
      unsubscribe(std::move(session), request.request_id(), request.unsubscribe());
    } else {
      session->respondError(request.request_id(),
                            protoError(v1::INTERNAL, "steal service: unexpected request"));
    }
  }

  bool ownsSubscription(uint64_t id, const std::string& session_id) const override {
    const Subscription* s = table_.find(id);
    return s != nullptr && s->session_id == session_id;
  }

  void describeSubscriptions(
      const std::string& session_id,
      google::protobuf::RepeatedPtrField<v1::SubscriptionSummary>* out) const override {
    for (const Subscription* sub : table_.ofSession(session_id)) {
      v1::SubscriptionSummary& d = *out->Add();
      d.set_subscription_id(sub->id);
      d.set_kind("steal");
      d.set_port(sub->port);
      if (sub->filter) d.set_filter(sub->filter->description());
      // io_backend_, not steering_->name(): steering_ is the strand's.
      if (sub->active) d.set_backend(io_backend_);
    }
  }

  void sessionEnded(const std::string& session_id) override {
    sessions_.erase(session_id);
    for (const Subscription& s : table_.removeSession(session_id)) {
      overlaps_.erase(s.id);
      log::info("steal_unsubscribed", {{"session", session_id},
                                       {"port", static_cast<int>(s.port)},
                                       {"reason", "session ended"}});
      // A reserved (not yet active) subscription is given back by its
      // pending subscribe, which finds it gone.
      if (s.active) releasePort(s.port);
    }
  }

  net::awaitable<absl::StatusOr<UniqueFd>> connectPassthrough(SockAddr destination) override {
    const SockAddr dst = destination;
    CO_ASSIGN_OR_RETURN(UniqueFd fd, co_await ctx_.netns.socket(dst.family(), SOCK_STREAM, 0));
    const std::string label = outgoing::formatAddress(dst);
    if (!io_steering_) {
      // No steering (never started, or stopped): a plain connect reaches the
      // application.
    } else {
      absl::Status s = io_steering_->exempt(fd.get());
      if (!s.ok()) co_return s;
    }
    auto done = [&](absl::Status s) -> absl::Status {
      if (io_steering_) io_steering_->unexempt(fd.get());
      return s;
    };
    if (::connect(fd.get(), dst.get(), dst.len) != 0 && errno != EINPROGRESS) {
      co_return done(lastErrnoStatus(absl::StrCat("passthrough connect ", label)));
    }
    // Wait for the connect, bounded.
    int dup_fd = ::dup(fd.get());
    if (dup_fd < 0) co_return done(lastErrnoStatus("passthrough: dup"));
    asio::posix::stream_descriptor waiter(ctx_.io, dup_fd);
    asio::steady_timer timer(ctx_.io);
    timer.expires_after(kPassthroughConnectTimeout);
    bool timed_out = false;
    timer.async_wait([&](net::error_code ec) {
      if (ec) return;
      timed_out = true;
      net::error_code ignored;
      waiter.cancel(ignored);
    });
    net::error_code ec;
    co_await waiter.async_wait(asio::posix::stream_descriptor::wait_write,
                               asio::redirect_error(net::use_awaitable, ec));
    timer.cancel();
    if (timed_out) {
      co_return done(protoError(
          v1::TIMEOUT, absl::StrCat("passthrough connect ", label, ": no answer within 10 s")));
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) co_return done(errnoStatus(err, absl::StrCat("passthrough connect ", label)));
    (void)done(absl::OkStatus());
    co_return std::move(fd);
  }

  void stopSteering() override {
    stopped_ = true;
    if (engine_) engine_->stop();
    // The accept loops end; connections still queued on the listeners are
    // reset when the listeners close.
    for (auto& a : acceptors_) {
      net::error_code ignored;
      a->close(ignored);
    }
    acceptors_.clear();
    auto self = shared_from_this();
    asio::post(strand_, [self] {
      if (self->steering_) self->steering_->stop();
    });
  }

  // Splices held frozen go too (each holds this service through its count:
  // kept, they would keep each other).
  void agentStopping() override {
    frozen_splices_.clear();
    stopSteering();
  }

  // SIGTERM: the steering goes first, so new connections reach the
  // application from the kernel; then what the listeners still hold
  // (arrived before the steering was gone) is accepted and passed through,
  // and they close. Stolen connections in flight go on.
  void agentDraining() override {
    if (draining_ || stopped_) return;
    draining_ = true;
    // HTTP connections of filtered steals: each finishes the request under
    // way (its response says Connection: close), idle ones close now.
    if (engine_) engine_->drain();
    auto self = shared_from_this();
    const auto asked = Clock::now();
    asio::post(strand_, [self, asked] {
      // Each port's steering goes; the rest of it (sk_lookup's program,
      // iptables' chains, which keep conntrack for the redirected connections)
      // stays until agentStopping().
      if (self->steering_) {
        const auto began = Clock::now();
        const size_t ports = self->port_refs_.size();
        for (const auto& [port, refs] : self->port_refs_) {
          absl::Status s = self->steering_->removePort(port);
          if (!s.ok()) {
            log::warn("steal_drain_remove_failed",
                      {{"port", static_cast<int64_t>(port)}, {"error", sv(s.message())}});
          }
        }
        self->port_refs_.clear();
        // Until this line new connections may still be stolen: how long
        // the strand took to get here (queued work) and the removal itself
        // (an iptables-restore per family, or a map update).
        const auto done = Clock::now();
        log::info("steal_drain_steering_removed",
                  {{"ports", static_cast<uint64_t>(ports)},
                   {"queued_ms", millisBetween(asked, began)},
                   {"took_ms", millisBetween(began, done)}});
      }
      // A handshake the steering started just before it went ends in the
      // listener's queue a moment later: the accept loop keeps taking (and
      // passing through) connections a little longer, then the listeners
      // close, so no client in the middle of connecting meets a reset.
      asio::post(self->ctx_.io, [self] {
        auto t = std::make_shared<asio::steady_timer>(self->ctx_.io);
        t->expires_after(kDrainListenerLinger);
        t->async_wait([self, t](net::error_code) { self->closeListeners(); });
      });
    });
  }

  // ---- handover (event loop, but importState: before the loop runs) ----

  // Before the freeze, sessions still live: the accept loops stop (new
  // connections wait in the listeners' queues for whichever agent accepts
  // next) and the HTTP engine's connections park once the request under
  // way is answered (its session is still there to answer it).
  void prepareHandover() override {
    if (accept_paused_) return;
    accept_paused_ = true;
    ++accept_generation_;
    for (auto& a : acceptors_) {
      net::error_code ignored;
      a->cancel(ignored);
    }
    if (engine_) engine_->park();
  }

  // Passthroughs stop where they are (held here while frozen: parked, no
  // coroutine holds them).
  void freeze() override {
    prepareHandover();
    frozen_ = true;
    for (const auto& weak : splices_) {
      if (auto s = weak.lock()) {
        s->freeze();
        frozen_splices_.push_back(std::move(s));
      }
    }
  }

  // Also undoes a prepareHandover() that no freeze followed.
  void thaw() override {
    if (!accept_paused_) return;
    accept_paused_ = false;
    frozen_ = false;
    ++accept_generation_;
    for (auto& a : acceptors_) spawnAcceptLoop(a);
    if (engine_) engine_->unpark();
    thawSplices();
  }

  std::string handoverBlocker() const override {
    if (draining_ || stopped_) return "the agent is draining";
    // HTTP connections park once their request is answered; HTTP/2 ones
    // and upgraded ones to a session close (GOAWAY; the end of the tunnel).
    if (engine_) {
      if (const size_t n = engine_->unparked(); n > 0) {
        return absl::StrCat(n, " HTTP connections of filtered steals with a request, an HTTP/2 "
                               "stream or an upgraded tunnel under way");
      }
    }
    // A stolen request's stream the engine is done with stays with its
    // session until the client's half-close (which follows its response at
    // once); it does not move, so it must end before the freeze cuts the
    // client off.
    size_t ending = 0;
    for (const auto& w : stolen_requests_) {
      if (auto s = w.lock(); s && !s->over()) ++ending;
    }
    if (ending > 0) return absl::StrCat(ending, " stolen HTTP requests ending");
    for (const Subscription* s : table_.all()) {
      if (!s->active) return absl::StrCat("a steal of port ", s->port, " is being set up");
    }
    // Passthroughs move once parked (a freeze cancels what they wait on);
    // one still connecting to the application has nothing to move yet.
    if (frozen_) {
      if (passthroughs_ > frozen_splices_.size()) {
        return absl::StrCat(passthroughs_ - frozen_splices_.size(),
                            " passthroughs connecting to the application");
      }
      size_t moving = 0;
      for (const auto& s : frozen_splices_) moving += !s->finished() && !s->parked() ? 1 : 0;
      if (moving > 0) return absl::StrCat(moving, " passthroughs stopping");
    }
    return "";
  }

  absl::Status exportState(v1::AgentState* out, std::vector<UniqueFd>* fds) override {
    v1::StealExport& st = *out->mutable_steal();
    st.set_listener_v4(-1);
    st.set_listener_v6(-1);
    for (auto& a : acceptors_) {
      auto bound = outgoing::localAddress(a->native_handle());
      if (!bound.ok()) return bound.status();
      int d = ::fcntl(a->native_handle(), F_DUPFD_CLOEXEC, 3);
      if (d < 0) return lastErrnoStatus("handover: dup a steal listener");
      const auto index = static_cast<int32_t>(fds->size());
      fds->emplace_back(d);
      if (bound->family() == AF_INET6) {
        st.set_listener_v6(index);
      } else {
        st.set_listener_v4(index);
      }
    }
    st.set_listener_v4_port(listener_ports_.first);
    st.set_listener_v6_port(listener_ports_.second);
    for (const Subscription* s : table_.all()) {
      v1::StealSubscriptionExport& e = *st.add_subscriptions();
      e.set_id(s->id);
      e.set_port(s->port);
      e.set_session_id(s->session_id);
      e.set_client_name(s->client_name);
      if (s->filter) *e.mutable_http_filter() = s->filter->spec();
    }
    if (st.subscriptions_size() > 0 && st.listener_v4() < 0) {
      return absl::FailedPreconditionError("steal: subscriptions without a listener");
    }
    if (engine_) {
      ASSIGN_OR_RETURN(std::vector<http::ParkedConnection> parked, engine_->exportParked());
      for (http::ParkedConnection& c : parked) {
        v1::HttpConnectionExport& e = *st.add_http_connections();
        e.set_client(static_cast<int32_t>(fds->size()));
        fds->push_back(std::move(c.client));
        e.set_detecting(c.detecting);
        e.set_received(std::move(c.received));
        *e.mutable_source() = outgoing::toProto(c.info.source);
        *e.mutable_destination() = outgoing::toProto(c.info.destination);
        e.set_requests(c.requests);
      }
    }
    for (const auto& splice : frozen_splices_) {
      if (splice->finished()) continue;
      ASSIGN_OR_RETURN(SpliceState state, splice->exportState());
      v1::PassthroughExport& p = *st.add_passthroughs();
      p.set_client(static_cast<int32_t>(fds->size()));
      fds->push_back(std::move(state.a));
      p.set_application(static_cast<int32_t>(fds->size()));
      fds->push_back(std::move(state.b));
      p.set_client_to_application(std::move(state.a_to_b));
      p.set_application_to_client(std::move(state.b_to_a));
      p.set_client_done(state.a_to_b_done);
      p.set_application_done(state.b_to_a_done);
    }
    return absl::OkStatus();
  }

  // Builds this agent's steering around the old agent's listeners, beside
  // the old agent's steering (both send each new connection to the same
  // listeners: no moment in which a port reaches nobody), with every port
  // the old agent steered. Called before the event loop runs.
  absl::Status importState(
      const v1::AgentState& in, std::vector<UniqueFd>& fds,
      const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) override {
    const v1::StealExport& st = in.steal();
    for (const v1::PassthroughExport& p : st.passthroughs()) {
      const auto ok = [&fds](int32_t i) {
        return i >= 0 && static_cast<size_t>(i) < fds.size() && fds[static_cast<size_t>(i)];
      };
      if (!ok(p.client()) || !ok(p.application()) || p.client() == p.application()) {
        return absl::InvalidArgumentError("handover: a passthrough's sockets are missing");
      }
      SpliceState state;
      state.a = std::move(fds[static_cast<size_t>(p.client())]);
      state.b = std::move(fds[static_cast<size_t>(p.application())]);
      state.a_to_b = p.client_to_application();
      state.b_to_a = p.application_to_client();
      state.a_to_b_done = p.client_done();
      state.b_to_a_done = p.application_done();
      ++passthroughs_;
      auto self = shared_from_this();
      const std::shared_ptr<void> counted(nullptr, [self](void*) { --self->passthroughs_; });
      auto splice = restoreSplice(ctx_.io.get_executor(), std::move(state), [counted] {});
      splices_.push_back(splice);
      frozen_splices_.push_back(std::move(splice));
    }
    if (st.listener_v4() < 0) {
      if (st.subscriptions_size() > 0) {
        return absl::InvalidArgumentError("handover: steal subscriptions without a listener");
      }
      return absl::OkStatus();
    }
    auto take = [&fds](int32_t i) -> UniqueFd {
      if (i < 0 || static_cast<size_t>(i) >= fds.size()) return UniqueFd();
      return std::move(fds[static_cast<size_t>(i)]);
    };
    auto v4 = std::make_shared<UniqueFd>(take(st.listener_v4()));
    auto v6 = std::make_shared<UniqueFd>(take(st.listener_v6()));
    if (!*v4) return absl::InvalidArgumentError("handover: the steal listener is missing");
    Listeners listeners;
    listeners.v4 = v4->get();
    listeners.v6 = *v6 ? v6->get() : -1;
    listeners.v4_port = static_cast<uint16_t>(st.listener_v4_port());
    listeners.v6_port = static_cast<uint16_t>(st.listener_v6_port());
    std::vector<uint16_t> ports;
    std::map<uint64_t, std::shared_ptr<const http::RequestFilter>> filters;
    for (const auto& s : st.subscriptions()) {
      if (s.port() == 0 || s.port() > 65535) {
        return absl::InvalidArgumentError(absl::StrCat("handover: steal port ", s.port()));
      }
      if (!sessions.contains(s.session_id())) {
        return absl::InvalidArgumentError(
            absl::StrCat("handover: steal of port ", s.port(), " names no session"));
      }
      if (s.has_http_filter()) {
        auto f = http::RequestFilter::compile(s.http_filter());
        if (!f.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "handover: the filter of the steal of port ", s.port(), ": ", f.status().message()));
        }
        filters[s.id()] = std::move(*f);
      }
      // A steering reference per subscription (filtered steals of one port
      // hold one each), as subscribe() takes them.
      ports.push_back(static_cast<uint16_t>(s.port()));
    }
    std::vector<http::ParkedConnection> parked;
    for (const v1::HttpConnectionExport& c : st.http_connections()) {
      const int32_t i = c.client();
      if (i < 0 || static_cast<size_t>(i) >= fds.size() || !fds[static_cast<size_t>(i)]) {
        return absl::InvalidArgumentError("handover: an HTTP connection's socket is missing");
      }
      auto source = outgoing::fromProto(c.source());
      auto destination = outgoing::fromProto(c.destination());
      if (!source.ok() || !destination.ok()) {
        return absl::InvalidArgumentError("handover: an HTTP connection's addresses are bad");
      }
      http::ParkedConnection p;
      p.client = std::move(fds[static_cast<size_t>(i)]);
      p.info = http::ConnectionInfo{*source, *destination, portOf(*destination)};
      p.detecting = c.detecting();
      p.received = c.received();
      p.requests = c.requests();
      parked.push_back(std::move(p));
    }
    if (!parked.empty() && filters.empty()) {
      return absl::InvalidArgumentError("handover: HTTP connections without a filtered steal");
    }
    std::promise<absl::Status> built;
    std::string backend;
    auto self = shared_from_this();
    asio::post(strand_, [self, &built, &backend, listeners, ports] {
      auto steering = self->factory_(listeners);
      if (!steering.ok()) {
        built.set_value(steering.status());
        return;
      }
      self->steering_ = std::move(*steering);
      backend = std::string(self->steering_->name());
      for (uint16_t port : ports) {
        absl::Status s = self->acquirePort(port);
        if (!s.ok()) {
          built.set_value(s);
          return;
        }
      }
      built.set_value(absl::OkStatus());
    });
    RETURN_IF_ERROR(built.get_future().get());
    for (const auto& e : st.subscriptions()) {
      Subscription s;
      s.id = e.id();
      s.port = static_cast<uint16_t>(e.port());
      s.session_id = e.session_id();
      s.client_name = e.client_name();
      if (auto f = filters.find(e.id()); f != filters.end()) s.filter = f->second;
      RETURN_IF_ERROR(table_.restore(std::move(s)));
      sessions_[e.session_id()] = sessions.at(e.session_id());
    }
    log::info("steal_started", {{"backend", backend},
                                {"listener_v4", static_cast<int>(listeners.v4_port)},
                                {"listener_v6", static_cast<int>(listeners.v6_port)},
                                {"handover", true},
                                {"subscriptions", static_cast<int64_t>(st.subscriptions_size())},
                                {"http_connections", static_cast<uint64_t>(parked.size())},
                                {"passthroughs", static_cast<int64_t>(st.passthroughs_size())}});
    io_steering_ = steering_.get();
    io_backend_ = backend;
    listener_ports_ = {listeners.v4_port, listeners.v6_port};
    imported_listeners_ = {v4, v6};
    if (!filters.empty()) ensureEngine();
    imported_http_ = std::move(parked);
    return absl::OkStatus();
  }

  void startAfterHandover() override {
    thawSplices();
    if (engine_) engine_->adopt(std::move(imported_http_));
    imported_http_.clear();
    auto listeners = std::move(imported_listeners_);
    for (auto& fd : listeners) {
      if (!fd || !*fd || stopped_) continue;
      auto d = std::make_shared<asio::posix::stream_descriptor>(ctx_.io, fd->release());
      acceptors_.push_back(d);
      spawnAcceptLoop(d);
    }
  }

  // The new agent took over: this agent's steering goes now (the new one's
  // steers the same listeners), before the new agent accepts anything.
  // Blocks the event loop for that long: the agent is frozen and exits.
  void handedOver() override {
    std::promise<void> done;
    auto self = shared_from_this();
    asio::post(strand_, [self, &done] {
      if (self->steering_) self->steering_->stop();
      done.set_value();
    });
    done.get_future().wait();
  }

  // Passthroughs running, and the listeners while a drain keeps them open.
  size_t inFlight() const override {
    return passthroughs_ + (draining_ && !acceptors_.empty() ? 1 : 0) +
           (engine_ ? engine_->inFlight() : 0);
  }

  // ---- http::HttpRouter (event loop) ----

  std::optional<http::Route> route(uint16_t port, const http::RequestHead& head) override {
    std::optional<http::Route> out;
    const Subscription* winner = nullptr;
    for (const Subscription* s : table_.matching(port, head)) {
      if (!liveSession(s->session_id)) continue;
      if (!out) {
        out.emplace();
        out->subscription_id = s->id;
        winner = s;
        continue;
      }
      out->also_matched.push_back(s->id);
      noteOverlap(*s, *winner, head);
    }
    return out;
  }

  absl::StatusOr<std::shared_ptr<http::StolenStream>> openStolenRequest(
      asio::any_io_executor ex, const http::Route& route, const http::ConnectionInfo& conn,
      const http::RequestHead& head, uint64_t connection_request) override {
    const Subscription* sub = table_.find(route.subscription_id);
    std::shared_ptr<SessionHost> session = sub ? liveSession(sub->session_id) : nullptr;
    if (!sub || !session) {
      return protoError(v1::UNAVAILABLE, "the session that stole this request is gone");
    }
    v1::StreamOpen open;
    v1::StolenRequest& r = *open.mutable_stolen_request();
    r.set_subscription_id(sub->id);
    *r.mutable_source() = outgoing::toProto(conn.source);
    *r.mutable_destination() = outgoing::toProto(conn.destination);
    r.set_protocol(head.protocol());
    r.set_method(head.method);
    r.set_path(head.target);
    r.set_connection_request(connection_request);
    for (uint64_t id : route.also_matched) r.add_also_matched(id);
    auto id = session->openStream(std::move(open));  // counts the stream's kind
    if (!id.ok()) {
      log::warn("steal_request_refused", {{"session", session->id()},
                                          {"source", outgoing::formatAddress(conn.source)},
                                          {"error", sv(id.status().message())}});
      return id.status();
    }
    // The engine reads and writes the stream itself: no socket between.
    auto stream = std::make_shared<SessionStolenStream>(std::move(ex), *id, session);
    session->registerStream(*id, stream);
    std::erase_if(stolen_requests_, [](const auto& w) {
      auto s = w.lock();
      return !s || s->over();
    });
    stolen_requests_.push_back(stream);
    // Early data (protocol 1.2): the request goes with the StreamOpen, not
    // a round trip later.
    if (session->session().sendsEarly()) stream->start();
    session->wake();
    if (log::enabled(log::Level::kDebug)) {  // per request
      log::debug("steal_request", {{"session", session->id()},
                                   {"stream", *id},
                                   {"subscription", sub->id},
                                   {"source", outgoing::formatAddress(conn.source)},
                                   {"method", head.method},
                                   {"target", head.target.substr(0, 200)}});
    }
    return stream;
  }

  net::awaitable<absl::StatusOr<UniqueFd>> connectApplication(SockAddr destination) override {
    auto fd = co_await connectPassthrough(destination);
    // Requests go out as head, then body pieces, on kept-alive connections:
    // no Nagle delay between them (router.h asks for it).
    if (fd.ok()) noDelay(fd->get());
    co_return fd;
  }

  // The engine's raw connections to the application are this service's
  // passthroughs: drains wait for them, handovers move them.
  bool splicesToApplication() const override { return true; }
  void spliceToApplication(UniqueFd client, std::string to_application, UniqueFd application,
                           std::string to_client) override {
    SpliceState state;
    state.a = std::move(client);
    state.b = std::move(application);
    state.a_to_b = std::move(to_application);
    state.b_to_a = std::move(to_client);
    ++passthroughs_;
    auto self = shared_from_this();
    const std::shared_ptr<void> counted(nullptr, [self](void*) { --self->passthroughs_; });
    auto handle = restoreSplice(ctx_.io.get_executor(), std::move(state), [counted] {});
    std::erase_if(splices_, [](const auto& w) { return w.expired(); });
    splices_.push_back(handle);
    if (frozen_) {
      frozen_splices_.push_back(std::move(handle));  // stays parked
    } else {
      handle->thaw();
    }
  }

  // Starts the accept loops (event loop) once the steering exists.
  void startAccepting(std::shared_ptr<UniqueFd> v4, std::shared_ptr<UniqueFd> v6,
                      Steering* steering, std::string backend, Listeners listeners) {
    io_steering_ = steering;
    io_backend_ = std::move(backend);
    listener_ports_ = {listeners.v4_port, listeners.v6_port};
    if (stopped_) return;  // the listeners close with their last owner
    for (auto& fd : {v4, v6}) {
      if (!fd || !*fd) continue;
      auto d = std::make_shared<asio::posix::stream_descriptor>(ctx_.io, fd->release());
      acceptors_.push_back(d);
      spawnAcceptLoop(d);
    }
  }

 private:
  void subscribe(std::shared_ptr<SessionHost> session, uint64_t request_id,
                 const v1::StealSubscribe& req) {
    if (req.port() == 0 || req.port() > 65535) {
      session->respondError(
          request_id, protoError(v1::INVALID_ARGUMENT,
                                 absl::StrCat("steal: port ", req.port(), " is not 1 to 65535")));
      return;
    }
    std::shared_ptr<const http::RequestFilter> filter;
    if (req.has_http_filter()) {
      auto compiled = http::RequestFilter::compile(req.http_filter());
      if (!compiled.ok()) {
        session->respondError(request_id, compiled.status(),
                              absl::StrCat("steal port ", req.port()));
        return;
      }
      filter = std::move(*compiled);
    }
    if (stopped_ || draining_) {
      session->respondError(
          request_id, protoError(v1::AGENT_DRAINING,
                                 "steal: the agent is shutting down; steal through another agent"));
      return;
    }
    const auto port = static_cast<uint16_t>(req.port());
    auto sub = table_.reserve(port, session->id(), session->clientName(), filter);
    if (!sub.ok()) {
      session->respondError(request_id, sub.status());
      return;
    }
    sessions_[session->id()] = session;
    const uint64_t id = sub->id;
    const bool flush = req.flush_connections();
    auto self = shared_from_this();
    std::weak_ptr<SessionHost> weak = session;
    asio::post(strand_, [self, weak, id, port, flush, request_id] {
      int flushed = -1;
      absl::Status s = self->ensureSteering();
      if (s.ok()) s = self->acquirePort(port);
      std::string backend = self->steering_ ? std::string(self->steering_->name()) : "";
      if (s.ok() && flush) {
        // After the steering has the port: the clients whose connections are
        // destroyed reconnect and are stolen.
        auto n = self->flush_(port);
        if (n.ok()) {
          flushed = *n;
        } else {
          log::warn("steal_flush_failed",
                    {{"port", static_cast<int>(port)}, {"error", sv(n.status().message())}});
        }
      }
      // Moved, not copied: a copy would leave this thread to drop its share
      // of the Status while the event loop reads it (TSan saw that race on
      // the refcount of Debian's abseil payloads).
      asio::post(self->ctx_.io, [self, weak, id, port, request_id, s = std::move(s),
                                 backend = std::move(backend), flushed] {
        self->subscribed(weak, id, port, request_id, s, backend, flushed);
      });
    });
  }

  void subscribed(std::weak_ptr<SessionHost> weak, uint64_t id, uint16_t port, uint64_t request_id,
                  const absl::Status& status, const std::string& backend, int flushed) {
    auto session = weak.lock();
    const Subscription* sub = table_.find(id);
    if (!status.ok()) {
      if (sub) (void)table_.remove(id, sub->session_id);
      if (session) session->respondError(request_id, status, absl::StrCat("steal port ", port));
      log::warn("steal_subscribe_failed",
                {{"port", static_cast<int>(port)}, {"error", sv(status.message())}});
      return;
    }
    if (!sub || !session || session->ended() || !table_.activate(id)) {
      // The session ended while the steering took the port: give it back.
      if (sub) (void)table_.remove(id, sub->session_id);
      releasePort(port);
      return;
    }
    if (sub->filter) ensureEngine();
    log::info("steal_subscribed",
              {{"session", session->id()},
               {"port", static_cast<int>(port)},
               {"subscription", id},
               {"backend", backend},
               {"filter", sub->filter ? sub->filter->description() : std::string()},
               {"flushed", static_cast<int64_t>(flushed)}});
    v1::Response r;
    r.set_request_id(request_id);
    r.mutable_subscribed()->set_subscription_id(id);
    r.mutable_subscribed()->set_backend(backend);
    session->respond(std::move(r));
  }

  void unsubscribe(std::shared_ptr<SessionHost> session, uint64_t request_id,
                   const v1::Unsubscribe& req) {
    auto removed = table_.remove(req.subscription_id(), session->id());
    if (!removed.ok()) {
      session->respondError(request_id, removed.status());
      return;
    }
    overlaps_.erase(removed->id);
    log::info("steal_unsubscribed", {{"session", session->id()},
                                     {"port", static_cast<int>(removed->port)},
                                     {"reason", "unsubscribe"}});
    // Answer once the application has its port back.
    auto self = shared_from_this();
    std::weak_ptr<SessionHost> weak = session;
    const uint16_t port = removed->port;
    const bool active = removed->active;
    asio::post(strand_, [self, weak, port, active, request_id] {
      absl::Status s = active ? self->releasePortOnStrand(port) : absl::OkStatus();
      // Moved, not copied (see the mirror service's subscribe).
      asio::post(self->ctx_.io, [weak, request_id, s = std::move(s)] {
        auto session = weak.lock();
        if (!session) return;
        v1::Response r;
        r.set_request_id(request_id);
        if (s.ok()) {
          r.mutable_unsubscribed();
        } else {
          *r.mutable_error() = toProtoError(s);
        }
        session->respond(std::move(r));
      });
    });
  }

  // Joins `fd` to the agent-opened stream `id` of `session` with a
  // SocketPump. A socket the pump cannot take resets the stream.
  absl::Status pumpStream(const std::shared_ptr<SessionHost>& host, uint64_t id, UniqueFd fd,
                          const streams::SocketPump::Options& opt) {
    SessionHost& session = *host;
    auto pump = std::make_shared<streams::SocketPump>(ctx_.io.get_executor(), id, host, opt);
    absl::Status attached = pump->attach(std::move(fd));
    if (!attached.ok()) {
      session.resetStream(id, toProtoError(attached));
    } else {
      session.registerStream(id, pump);
      // Early data (protocol 1.2): what the connection's client already
      // sent goes now, with the StreamOpen, not after the accept.
      if (session.session().sendsEarly()) pump->start();
    }
    session.wake();
    return attached;
  }

  std::shared_ptr<SessionHost> liveSession(const std::string& session_id) const {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return nullptr;
    auto session = it->second.lock();
    return session && !session->ended() ? session : nullptr;
  }

  // `loser`'s filter matched a request `winner` (earlier) took: tell its
  // session, at most once per kOverlapNoticeInterval, counting the rest.
  void noteOverlap(const Subscription& loser, const Subscription& winner,
                   const http::RequestHead& head) {
    Overlap& o = overlaps_[loser.id];
    if (o.pending.requests() == 0) {
      o.pending.set_taken_by(winner.id);
      o.pending.set_taken_by_client(winner.client_name);
      o.pending.set_method(head.method);
      o.pending.set_path(head.target.substr(0, 512));
    }
    o.pending.set_requests(o.pending.requests() + 1);
    const auto now = Clock::now();
    if (now - o.last_sent >= kOverlapNoticeInterval) {
      sendOverlap(loser.id);
      return;
    }
    if (o.timer_set) return;
    o.timer_set = true;
    auto t = std::make_shared<asio::steady_timer>(ctx_.io);
    t->expires_at(o.last_sent + kOverlapNoticeInterval);
    std::weak_ptr<StealServiceImpl> weak = shared_from_this();
    const uint64_t id = loser.id;
    t->async_wait([weak, t, id](net::error_code) {
      if (auto self = weak.lock()) {
        auto it = self->overlaps_.find(id);
        if (it == self->overlaps_.end()) return;
        it->second.timer_set = false;
        self->sendOverlap(id);
      }
    });
  }

  void sendOverlap(uint64_t id) {
    auto it = overlaps_.find(id);
    if (it == overlaps_.end() || it->second.pending.requests() == 0) return;
    const Subscription* sub = table_.find(id);
    std::shared_ptr<SessionHost> session = sub ? liveSession(sub->session_id) : nullptr;
    if (!session) {
      overlaps_.erase(it);
      return;
    }
    v1::SubscriptionNotice n;
    n.set_subscription_id(id);
    *n.mutable_overlap() = std::move(it->second.pending);
    it->second.pending.Clear();
    it->second.last_sent = Clock::now();
    log::info("steal_filter_overlap", {{"session", session->id()},
                                       {"subscription", id},
                                       {"taken_by", n.overlap().taken_by()},
                                       {"requests", n.overlap().requests()}});
    session->session().sendNotice(std::move(n));
    session->wake();
  }

  // ---- strand side ----

  absl::Status ensureSteering() {
    if (steering_) return absl::OkStatus();
    if (stopped_) return protoError(v1::AGENT_DRAINING, "the agent is shutting down");
    Listeners listeners;
    ASSIGN_OR_RETURN(UniqueFd v4, makeListener(ctx_.netns, AF_INET, &listeners.v4_port));
    listeners.v4 = v4.get();
    auto v6 = makeListener(ctx_.netns, AF_INET6, &listeners.v6_port);
    if (v6.ok()) {
      listeners.v6 = v6->get();
    } else {
      log::info("steal_no_ipv6", {{"reason", sv(v6.status().message())}});
    }
    auto steering = factory_(listeners);
    if (!steering.ok()) return steering.status();
    steering_ = std::move(*steering);
    log::info("steal_started", {{"backend", std::string(steering_->name())},
                                {"listener_v4", static_cast<int>(listeners.v4_port)},
                                {"listener_v6", static_cast<int>(listeners.v6_port)}});
    auto v4_fd = std::make_shared<UniqueFd>(std::move(v4));
    auto v6_fd = std::make_shared<UniqueFd>(v6.ok() ? std::move(*v6) : UniqueFd());
    auto self = shared_from_this();
    Steering* raw = steering_.get();
    // The event loop gets its own copy of the name: it never calls into
    // the steering while the strand may (thread rule above).
    std::string backend(steering_->name());
    asio::post(ctx_.io, [self, v4_fd, v6_fd, raw, backend, listeners] {
      self->startAccepting(v4_fd, v6_fd, raw, backend, listeners);
    });
    return absl::OkStatus();
  }

  absl::Status acquirePort(uint16_t port) {
    int& refs = port_refs_[port];
    if (refs == 0) {
      absl::Status s = steering_->addPort(port);
      if (!s.ok()) {
        port_refs_.erase(port);
        return s;
      }
    }
    ++refs;
    return absl::OkStatus();
  }

  absl::Status releasePortOnStrand(uint16_t port) {
    auto it = port_refs_.find(port);
    if (it == port_refs_.end()) return absl::OkStatus();
    if (--it->second > 0) return absl::OkStatus();
    port_refs_.erase(it);
    absl::Status s = steering_ ? steering_->removePort(port) : absl::OkStatus();
    if (!s.ok()) {
      log::error("steal_release_failed",
                 {{"port", static_cast<int>(port)}, {"error", sv(s.message())}});
    }
    return s;
  }

  void releasePort(uint16_t port) {
    auto self = shared_from_this();
    asio::post(strand_, [self, port] { (void)self->releasePortOnStrand(port); });
  }

  // ---- event loop: connections ----

  // The accept loop of `listener`. Every stolen port needs it: one that
  // fails (reported as coroutine_failed) starts again after a breath while
  // the listener is open, rather than leaving the ports stolen with nobody
  // accepting.
  void spawnAcceptLoop(std::shared_ptr<asio::posix::stream_descriptor> listener) {
    std::weak_ptr<StealServiceImpl> weak = shared_from_this();
    std::weak_ptr<asio::posix::stream_descriptor> weak_listener = listener;
    net::spawn(ctx_.io, acceptLoop(shared_from_this(), listener), "steal_accept_loop",
               [weak, weak_listener] {
                 auto self = weak.lock();
                 if (!self) return;
                 auto t = std::make_shared<asio::steady_timer>(self->ctx_.io);
                 t->expires_after(std::chrono::milliseconds(100));
                 t->async_wait([weak, weak_listener, t](net::error_code) {
                   auto self = weak.lock();
                   auto listener = weak_listener.lock();
                   if (!self || !listener || !listener->is_open() || self->stopped_) return;
                   self->spawnAcceptLoop(listener);
                 });
               });
  }

  static net::awaitable<void> acceptLoop(std::shared_ptr<StealServiceImpl> service,
                                         std::shared_ptr<asio::posix::stream_descriptor> l) {
    const auto self = std::move(service);
    const auto listener = std::move(l);
    // A handover's freeze ends this loop; a thaw starts another.
    const uint64_t generation = self->accept_generation_;
    while (!self->stopped_ && !self->accept_paused_ && generation == self->accept_generation_) {
      net::error_code ec;
      co_await listener->async_wait(asio::posix::stream_descriptor::wait_read,
                                    asio::redirect_error(net::use_awaitable, ec));
      if (ec || self->stopped_ || self->accept_paused_ ||
          generation != self->accept_generation_) {
        break;
      }
      // Accept everything queued: a burst of connections costs one wake-up.
      while (true) {
        SockAddr peer;
        peer.len = sizeof(peer.storage);
        int fd = ::accept4(listener->native_handle(), peer.get(), &peer.len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          // A failure with one connection (an exception from the steering
          // or the session) ends that connection only: its socket closes as
          // the exception unwinds; the loop serves the next ones.
          try {
            self->onAccepted(UniqueFd(fd), peer);
          } catch (...) {
            net::reportSpawnFailure("steal_connection", std::current_exception());
          }
          continue;
        }
        if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) break;
        // EMFILE and friends: the connection waits in the queue; breathe.
        log::warn("steal_accept_failed", {{"error", sv(lastErrnoStatus("accept").message())}});
        asio::steady_timer t(self->ctx_.io);
        t.expires_after(std::chrono::milliseconds(100));
        co_await t.async_wait(asio::redirect_error(net::use_awaitable, ec));
        break;
      }
    }
  }

  void onAccepted(UniqueFd fd, const SockAddr& peer) {
    auto original = io_steering_->originalDestination(fd.get());
    if (!original.ok()) {
      log::warn("steal_no_destination", {{"source", outgoing::formatAddress(peer)},
                                         {"error", sv(original.status().message())}});
      abortiveClose(std::move(fd));
      return;
    }
    const uint16_t port = portOf(*original);
    if (port == listener_ports_.first || port == listener_ports_.second) {
      // Someone connected to the listener's own port: not a stolen
      // connection, and a passthrough would loop back here.
      abortiveClose(std::move(fd));
      return;
    }
    const Subscription* sub = table_.activeForPort(port);
    if (!sub && engine_ && !draining_ && table_.hasActiveFiltered(port)) {
      // Filtered steals: the HTTP engine routes each request on its own.
      engine_->serve(std::move(fd), http::ConnectionInfo{peer, *original, port});
      return;
    }
    std::shared_ptr<SessionHost> session;
    if (sub) {
      auto it = sessions_.find(sub->session_id);
      if (it != sessions_.end()) session = it->second.lock();
    }
    if (!session || session->ended() || draining_) {
      // Accepted just after the port was given back (or the drain began):
      // the application gets it.
      passthrough(std::move(fd), *original, peer);
      return;
    }
    v1::StreamOpen open;
    v1::StolenConnection& stolen = *open.mutable_stolen();
    stolen.set_subscription_id(sub->id);
    *stolen.mutable_source() = outgoing::toProto(peer);
    *stolen.mutable_destination() = outgoing::toProto(*original);
    auto id = session->openStream(std::move(open));  // counts the stream's kind
    if (!id.ok()) {
      // The session has too many streams: the client's connection fails
      // loudly (RST) rather than reaching an application the user stole it
      // from.
      log::warn("steal_connection_refused", {{"session", session->id()},
                                             {"source", outgoing::formatAddress(peer)},
                                             {"error", sv(id.status().message())}});
      abortiveClose(std::move(fd));
      return;
    }
    // Bytes leave as the session delivers them; batching already happened
    // in the frames. Nagle would hold a small answer for the client's ACK.
    noDelay(fd.get());
    streams::SocketPump::Options opt;
    opt.kind = streams::SocketPump::Kind::kStream;
    opt.tcp = true;
    opt.label = outgoing::formatAddress(peer);
    if (!pumpStream(session, *id, std::move(fd), opt).ok()) return;
    if (log::enabled(log::Level::kDebug)) {  // per connection
      log::debug("steal_connection", {{"session", session->id()},
                                      {"stream", *id},
                                      {"source", outgoing::formatAddress(peer)},
                                      {"destination", outgoing::formatAddress(*original)}});
    }
  }

  // Event loop, draining: everything queued goes to the application, then
  // the listeners close.
  void closeListeners() {
    for (auto& a : acceptors_) {
      while (true) {
        SockAddr peer;
        peer.len = sizeof(peer.storage);
        int fd = ::accept4(a->native_handle(), peer.get(), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR) continue;
        if (fd < 0) break;
        onAccepted(UniqueFd(fd), peer);
      }
      net::error_code ignored;
      a->close(ignored);
    }
    acceptors_.clear();
    stopped_ = true;
  }

  void passthrough(UniqueFd fd, const SockAddr& original, const SockAddr& peer) {
    auto self = shared_from_this();
    auto held = std::make_shared<UniqueFd>(std::move(fd));
    // A failure resets this client's connection (while the passthrough
    // still holds it; the splice resets its own), nothing else.
    net::spawn(ctx_.io, passthroughOne(self, held, original, peer), "steal_passthrough",
               [held] { abortiveClose(std::move(*held)); });
  }

  static net::awaitable<void> passthroughOne(std::shared_ptr<StealServiceImpl> service,
                                             std::shared_ptr<UniqueFd> accepted, SockAddr original,
                                             SockAddr peer) {
    const auto self = std::move(service);
    const auto in = std::move(accepted);
    const SockAddr dst = original;
    const SockAddr src = peer;
    ++self->passthroughs_;  // a drain waits for it from here
    // Uncounted when the last holder goes: this frame (an error, or an
    // exception unwinding it) or the splice once both sockets closed.
    const std::shared_ptr<void> counted(nullptr, [self](void*) { --self->passthroughs_; });
    auto out = co_await self->connectPassthrough(dst);
    if (!out.ok()) {
      log::warn("steal_passthrough_failed",
                {{"source", outgoing::formatAddress(src)}, {"error", sv(out.status().message())}});
      abortiveClose(std::move(*in));
      co_return;
    }
    if (log::enabled(log::Level::kDebug)) {  // per connection
      log::debug("steal_passthrough", {{"source", outgoing::formatAddress(src)},
                                       {"destination", outgoing::formatAddress(dst)}});
    }
    auto handle = splice(self->ctx_.io.get_executor(), std::move(*in), std::move(*out), [counted] {});
    std::erase_if(self->splices_, [](const auto& w) { return w.expired(); });
    self->splices_.push_back(handle);
    if (self->frozen_) {
      // Connected while frozen (it was connecting at the freeze).
      handle->freeze();
      self->frozen_splices_.push_back(std::move(handle));
    }
  }

  void ensureEngine() {
    if (engine_) return;
    engine_ = std::make_unique<http::HttpEngine>(ctx_.io.get_executor(), *this,
                                                 httpOptions(ctx_.config));
    if (ctx_.metrics != nullptr) {
      engine_->onHttp2Limit(
          [m = ctx_.metrics](http::Http2Limit l) { m->http2LimitHit(http::http2LimitName(l)); });
    }
  }

  void thawSplices() {
    auto frozen = std::move(frozen_splices_);
    frozen_splices_.clear();
    for (auto& s : frozen) s->thaw();
  }

  ServiceContext& ctx_;
  SteeringFactory factory_;
  FlushFunction flush_;
  asio::strand<asio::thread_pool::executor_type> strand_;

  // Event loop.
  SubscriptionTable table_;
  std::map<std::string, std::weak_ptr<SessionHost>> sessions_;
  std::vector<std::shared_ptr<asio::posix::stream_descriptor>> acceptors_;
  Steering* io_steering_ = nullptr;  // set once the steering exists
  std::string io_backend_;           // its name(), copied on the strand
  std::pair<uint16_t, uint16_t> listener_ports_{0, 0};
  std::atomic<bool> stopped_{false};
  bool draining_ = false;    // event loop
  size_t passthroughs_ = 0;  // splices running (event loop)
  // Handover (event loop): the splices, and those held while frozen.
  std::vector<std::weak_ptr<SpliceHandle>> splices_;
  std::vector<std::shared_ptr<SpliceHandle>> frozen_splices_;
  // Handover (event loop): frozen, the accept loops of which generation
  // run, and the old agent's listeners until the new agent serves.
  // accept_paused_: from prepareHandover() to thaw(); frozen_: from
  // freeze().
  bool accept_paused_ = false;
  bool frozen_ = false;
  uint64_t accept_generation_ = 0;
  std::vector<std::shared_ptr<UniqueFd>> imported_listeners_;
  // The stolen requests' streams (a handover waits for them to end).
  std::vector<std::weak_ptr<SessionStolenStream>> stolen_requests_;
  // The old agent's parked HTTP connections until the new agent serves.
  std::vector<http::ParkedConnection> imported_http_;
  // Created with the first filtered subscription (event loop).
  std::unique_ptr<http::HttpEngine> engine_;
  // FilterOverlap notices waiting for their interval, per subscription.
  struct Overlap {
    v1::FilterOverlap pending;  // requests == 0: nothing waiting
    Clock::time_point last_sent{};
    bool timer_set = false;
  };
  std::map<uint64_t, Overlap> overlaps_;

  // Strand.
  std::unique_ptr<Steering> steering_;
  std::map<uint16_t, int> port_refs_;
};

}  // namespace

std::shared_ptr<StealService> makeStealService(ServiceContext& ctx, SteeringFactory factory,
                                               FlushFunction flush) {
  return std::make_shared<StealServiceImpl>(ctx, std::move(factory), std::move(flush));
}

}  // namespace siphon::agent::steal
