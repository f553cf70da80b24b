#include "cli/exec_incoming.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/format.h"
#include "cli/http_plumbing.h"
#include "cli/mirror_replay.h"
#include "exec/listeners.h"
#include "exec/sandbox.h"
#include "siphon/client/client.h"
#include "siphon/client/errors.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {

namespace asio = net::asio;
using Clock = asio::steady_timer::clock_type;
using client::ErrorCode;
using client::SubscriptionEvent;

namespace {

// How often the program's listeners are read (--incoming): a port is
// taken this long after the program listens, at most.
constexpr auto kWatchEvery = std::chrono::milliseconds(250);
// A refused connect to the program's listener is tried again this often
// (until the connect timeout): it may be starting.
constexpr auto kRetryRefused = std::chrono::milliseconds(50);

std::string programPort(uint16_t port) { return absl::StrCat("the program's port ", port); }

std::string readAll(const std::string& path, bool* ok) {
  std::ifstream in(path);
  *ok = static_cast<bool>(in);
  std::stringstream text;
  if (*ok) text << in.rdbuf();
  return text.str();
}

}  // namespace

net::awaitable<absl::Status> dialInside(net::tcp::socket& socket,
                                        std::shared_ptr<const int> connector_in,
                                        std::vector<std::string> addresses_in, uint16_t port,
                                        std::chrono::milliseconds timeout) {
  const std::shared_ptr<const int> connector = std::move(connector_in);
  const std::vector<std::string> addresses = std::move(addresses_in);
  const auto deadline = Clock::now() + timeout;
  // As in connectLocal(): the watchdog holds the watch weakly, so a late
  // handler never closes a socket this frame no longer owns.
  struct Watch {
    explicit Watch(asio::any_io_executor ex) : timer(std::move(ex)) {}
    asio::steady_timer timer;
    net::tcp::socket* socket = nullptr;
    bool timed_out = false;
  };
  auto watch = std::make_shared<Watch>(socket.get_executor());
  std::string last = "no listener";
  while (true) {
    for (const std::string& address : addresses) {
      if (*connector < 0) {
        co_return protoError(v1::UNAVAILABLE, "the program's namespace is not there yet");
      }
      auto fd = exec::connectInside(*connector, address, port);
      if (!fd.ok()) co_return protoError(v1::UNAVAILABLE, sv(fd.status().message()));
      net::error_code ec;
      socket.assign(address.find(':') != std::string::npos ? net::tcp::v6() : net::tcp::v4(), *fd,
                    ec);
      if (ec) {
        ::close(*fd);
        co_return protoError(v1::UNAVAILABLE,
                             absl::StrCat("connect to ", programPort(port), ": ", ec.message()));
      }
      // A connect to a listener on this machine is answered at once, unless
      // its backlog is full (the SYN is dropped and sent again): the
      // deadline bounds that.
      watch->socket = &socket;
      watch->timer.expires_at(deadline);
      watch->timer.async_wait([weak = std::weak_ptr<Watch>(watch)](net::error_code e) {
        auto w = weak.lock();
        if (e || !w || w->socket == nullptr) return;
        w->timed_out = true;
        net::error_code ignored;
        w->socket->close(ignored);
      });
      co_await socket.async_wait(net::tcp::socket::wait_write,
                                 asio::redirect_error(net::use_awaitable, ec));
      watch->socket = nullptr;
      watch->timer.cancel();
      if (watch->timed_out) {
        co_return protoError(v1::UNAVAILABLE,
                             absl::StrCat("connect to ", programPort(port), ": no answer within ",
                                          timeout.count(), " ms"));
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (ec) {
        err = ec.value();
      } else if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
      if (err == 0) {
        socket.set_option(net::tcp::no_delay(true), ec);
        co_return absl::OkStatus();
      }
      net::error_code ignored;
      socket.close(ignored);
      if (ec == asio::error::operation_aborted) {
        co_return protoError(v1::CANCELLED, "the delivery was ended");
      }
      last = std::strerror(err);
      if (err != ECONNREFUSED) break;
    }
    if (Clock::now() + kRetryRefused >= deadline) {
      co_return protoError(v1::UNAVAILABLE,
                           absl::StrCat("connect to ", programPort(port), ": ", last));
    }
    asio::steady_timer pause(socket.get_executor(), kRetryRefused);
    net::error_code ignored;
    co_await pause.async_wait(asio::redirect_error(net::use_awaitable, ignored));
  }
}

struct ExecIncoming::Route {
  IncomingPort port;
  std::vector<std::string> addresses;  // where the program's listener is reached
  bool automatic = false;              // --incoming: while the program listens
  client::Subscription subscription;
  std::shared_ptr<LocalPool> pool;  // stolen requests (a filtered steal)
  bool subscribed = false;
};

namespace {

// A stolen connection joined to the program's.
class IncomingBridge : public Bridge {
 public:
  IncomingBridge(net::tcp::socket local_socket, client::Connection s,
                 std::function<void(const absl::Status&)> check_lost, std::function<void()> done)
      : Bridge(std::move(local_socket), std::move(s)),
        check_lost_(std::move(check_lost)),
        done_(std::move(done)) {}

 protected:
  void streamFailed(const absl::Status& s) override {
    if (check_lost_) check_lost_(s);
    Bridge::streamFailed(s);
  }
  void halfCloseFailed(const absl::Status& s) override {
    if (check_lost_) check_lost_(s);
  }
  void finished() override {
    if (done_) done_();
  }

 private:
  std::function<void(const absl::Status&)> check_lost_;
  std::function<void()> done_;
};

}  // namespace

ExecIncoming::ExecIncoming(const client::Target& target, std::chrono::milliseconds connect_timeout,
                           std::optional<client::HttpFilter> filter, IncomingHooks hooks)
    : executor_(target.client()->executor()),
      subscriptions_(target),
      connect_timeout_(connect_timeout),
      filter_(std::move(filter)),
      hooks_(std::move(hooks)),
      connector_(std::make_shared<int>(-1)),
      watch_timer_(executor_) {}

ExecIncoming::~ExecIncoming() {
  if (*connector_ >= 0) ::close(*connector_);
}

LocalDialer ExecIncoming::dialerFor(const Route& route) const {
  return [connector = std::shared_ptr<const int>(connector_), addresses = route.addresses,
          port = route.port.local, timeout = connect_timeout_](net::tcp::socket& s) {
    return dialInside(s, connector, addresses, port, timeout);
  };
}

std::string ExecIncoming::subscribedLine(const Route& route) const {
  const IncomingPort& p = route.port;
  std::string what = p.mirror  ? absl::StrCat("mirroring port ", p.port)
                     : filter_ ? absl::StrCat("stealing HTTP requests to port ", p.port,
                                              " that match ", filterText(*filter_))
                               : absl::StrCat("stealing port ", p.port);
  return absl::StrCat("exec: ", what, " -> ", programPort(p.local), " (backend ",
                      route.subscription.backend(), ")",
                      route.automatic ? ", while the program listens" : "");
}

net::awaitable<absl::Status> ExecIncoming::subscribeRoute(std::shared_ptr<Route> route_in) {
  const std::shared_ptr<Route> route = std::move(route_in);
  absl::StatusOr<client::Subscription> sub;
  if (route->port.mirror) {
    client::MirrorSpec spec;
    spec.port = route->port.port;
    sub = co_await subscriptions_.mirror(spec);
  } else {
    client::StealSpec spec;
    spec.port = route->port.port;
    spec.filter = filter_;
    sub = co_await subscriptions_.steal(std::move(spec));
  }
  if (!sub.ok()) {
    if (hooks_.check_lost) hooks_.check_lost(sub.status());
    co_return sub.status();
  }
  route->subscription = *std::move(sub);
  route->subscribed = true;
  if (!route->port.mirror && filter_) {
    route->pool =
        std::make_shared<LocalPool>(executor_, programPort(route->port.local), dialerFor(*route));
  }
  if (hooks_.line) hooks_.line(subscribedLine(*route));
  if (hooks_.event) {
    JsonLine e("subscribed");
    e.add("mode", route->port.mirror ? "mirror" : "steal")
        .add("port", static_cast<uint64_t>(route->port.port))
        .add("local", static_cast<uint64_t>(route->port.local))
        .add("backend", route->subscription.backend())
        .addBool("automatic", route->automatic);
    if (filter_ && !route->port.mirror) e.add("filter", filterText(*filter_));
    hooks_.event(std::move(e));
  }
  co_return absl::OkStatus();
}

net::awaitable<absl::Status> ExecIncoming::subscribe(IncomingPort p) {
  auto route = std::make_shared<Route>();
  route->port = p;
  // Where a program listens for PORT: its IPv4 loopback or wildcard, else
  // an IPv6 one.
  route->addresses = {"127.0.0.1", "::1"};
  absl::Status s = co_await subscribeRoute(route);
  if (!s.ok()) {
    co_return absl::Status(
        s.code(), absl::StrCat(p.mirror ? "mirror" : "steal", " port ", p.port, ": ", s.message()));
  }
  routes_[p.port] = route;
  if (started_) net::spawn(executor_, serve(shared_from_this(), route), "exec_incoming");
  co_return absl::OkStatus();
}

void ExecIncoming::start(int connector, pid_t pid, IncomingMode mode,
                         std::set<uint16_t> own_ports) {
  *connector_ = connector;
  pid_ = pid;
  mode_ = mode;
  own_ports_ = std::move(own_ports);
  started_ = true;
  for (auto& [port, route] : routes_) {
    net::spawn(executor_, serve(shared_from_this(), route), "exec_incoming");
  }
  if (mode_ != IncomingMode::kOff) {
    net::spawn(executor_, watch(shared_from_this()), "exec_incoming_watch");
  }
}

void ExecIncoming::done() {
  if (open_ > 0) --open_;
  if (hooks_.changed) hooks_.changed();
}

void ExecIncoming::deliveryEvent(const Route& route, const std::string& from,
                                 const absl::Status& s) {
  if (!hooks_.event) return;
  JsonLine e("connection");
  e.add("protocol", "tcp")
      .add("direction", route.port.mirror ? "mirrored" : "incoming")
      .add("from", from)
      .add("port", static_cast<uint64_t>(route.port.port))
      .add("local", static_cast<uint64_t>(route.port.local))
      .addBool("ok", s.ok());
  if (!s.ok()) e.add("error", sv(s.message()));
  hooks_.event(std::move(e));
}

net::awaitable<void> ExecIncoming::serve(std::shared_ptr<ExecIncoming> self_in,
                                         std::shared_ptr<Route> route_in) {
  const std::shared_ptr<ExecIncoming> self = std::move(self_in);
  const std::shared_ptr<Route> route = std::move(route_in);
  auto ex = self->executor_;
  while (true) {
    auto e = co_await route->subscription.next();
    if (!e.ok()) break;
    switch (e->kind) {
      case SubscriptionEvent::Kind::kConnection: {
        client::Connection connection = e->connection;
        ++self->open_;
        net::spawn(ex, serveConnection(self, route, *std::move(e)), "exec_incoming_connection",
                   [self, connection]() mutable {
                     connection.reset(ErrorCode::kInternal, "the client failed");
                     self->done();
                   });
        break;
      }
      case SubscriptionEvent::Kind::kRequest:
        self->serveRequest(route, *std::move(e));
        break;
      case SubscriptionEvent::Kind::kMirrored: {
        client::MirroredConnection mirrored = e->mirrored;
        ++self->open_;
        net::spawn(ex, serveMirrored(self, route, *std::move(e)), "exec_incoming_mirrored",
                   [self, mirrored]() mutable {
                     mirrored.stop(ErrorCode::kInternal, "the client failed");
                     self->done();
                   });
        break;
      }
      case SubscriptionEvent::Kind::kOverlap:
        if (self->hooks_.line) {
          self->hooks_.line(absl::StrCat("exec: port ", route->port.port, ": ", e->overlap.requests,
                                         " request(s) this filter matched went to subscription ",
                                         e->overlap.taken_by, " (", e->overlap.taken_by_client,
                                         ") first"));
        }
        break;
      case SubscriptionEvent::Kind::kDraining:
      case SubscriptionEvent::Kind::kMoved:
      case SubscriptionEvent::Kind::kLost:
      case SubscriptionEvent::Kind::kTargetRestarted:
        break;  // the session's events say it
    }
  }
  if (self->hooks_.changed) self->hooks_.changed();
}

net::awaitable<void> ExecIncoming::serveConnection(std::shared_ptr<ExecIncoming> self_in,
                                                   std::shared_ptr<Route> route_in,
                                                   SubscriptionEvent e_in) {
  const std::shared_ptr<ExecIncoming> self = std::move(self_in);
  const std::shared_ptr<Route> route = std::move(route_in);
  SubscriptionEvent e = std::move(e_in);
  std::weak_ptr<ExecIncoming> weak = self;
  auto bridge = std::make_shared<IncomingBridge>(
      net::tcp::socket(self->executor_), e.connection,
      [weak](const absl::Status& s) {
        if (auto me = weak.lock(); me && me->hooks_.check_lost) me->hooks_.check_lost(s);
      },
      [weak] {
        if (auto me = weak.lock()) me->done();
      });
  const LocalDialer dial = self->dialerFor(*route);
  absl::Status s = co_await dial(bridge->local);
  self->deliveryEvent(*route, e.source.text(), s);
  if (!s.ok()) {
    // The remote client's connection is reset: the program did not take it.
    e.connection.reset(ErrorCode::kUnavailable, sv(s.message()));
    self->done();
    co_return;
  }
  bridge->start();
}

void ExecIncoming::serveRequest(const std::shared_ptr<Route>& route, SubscriptionEvent e) {
  RequestEvent event;
  event.method = e.request.method;
  event.path = e.request.path;
  event.source = e.source.text();
  event.port = route->port.port;
  event.to = route->pool ? route->pool->to() : programPort(route->port.local);
  if (!route->pool || released_) {
    e.connection.reset(ErrorCode::kCancelled, "siphon exec is ending");
    return;
  }
  ++open_;
  std::weak_ptr<ExecIncoming> weak = shared_from_this();
  auto x = std::make_shared<Exchange>(executor_, e.connection, route->pool, std::move(event),
                                      e.request.method == "HEAD", [weak](Exchange& x) {
                                        auto self = weak.lock();
                                        if (!self) return;
                                        if (self->hooks_.event) {
                                          const RequestEvent& r = x.event();
                                          JsonLine line("request");
                                          line.add("from", r.source)
                                              .add("port", static_cast<uint64_t>(r.port))
                                              .add("method", r.method)
                                              .add("path", r.path)
                                              .add("status", static_cast<uint64_t>(r.status))
                                              .addBool("ok", !x.failed());
                                          if (!r.error.empty()) line.add("error", r.error);
                                          self->hooks_.event(std::move(line));
                                        }
                                        self->done();
                                      });
  x->on_stream_error = [weak](const absl::Status& s) {
    if (auto self = weak.lock(); self && self->hooks_.check_lost) self->hooks_.check_lost(s);
  };
  x->start();
}

net::awaitable<void> ExecIncoming::serveMirrored(std::shared_ptr<ExecIncoming> self_in,
                                                 std::shared_ptr<Route> route_in,
                                                 SubscriptionEvent e_in) {
  const std::shared_ptr<ExecIncoming> self = std::move(self_in);
  const std::shared_ptr<Route> route = std::move(route_in);
  SubscriptionEvent e = std::move(e_in);
  const std::string from = e.source.text();
  std::weak_ptr<ExecIncoming> weak = self;
  auto failure = std::make_shared<std::string>();
  auto replay = std::make_shared<Replay>(self->executor_, self->dialerFor(*route),
                                         [failure](std::string why) { *failure = why; });
  replay->start();
  uint64_t gap = 0;
  while (true) {
    auto record = co_await e.mirrored.next();
    if (!record.ok()) {
      if (self->hooks_.check_lost) self->hooks_.check_lost(record.status());
      break;
    }
    if (!record->has_value()) break;
    const client::MirrorEvent& r = **record;
    if (r.direction == client::Direction::kServerToClient) continue;
    if (r.kind == client::MirrorEvent::Kind::kData) {
      replay->push(r.bytes);
      co_await replay->waitForRoom();  // the program is slow: the stream waits
    } else if (r.kind == client::MirrorEvent::Kind::kGap) {
      gap += r.gap_bytes;  // the bytes on both sides of the hole still go
    } else {
      replay->finish();
    }
  }
  replay->finish();
  co_await replay->waitDone(Clock::now() + self->connect_timeout_ + Replay::kLinger);
  if (!replay->done()) replay->abort();
  const absl::Status s = failure->empty() ? absl::OkStatus() : absl::UnavailableError(*failure);
  if (self->hooks_.event) {
    JsonLine line("mirrored");
    line.add("from", from)
        .add("port", static_cast<uint64_t>(route->port.port))
        .add("local", static_cast<uint64_t>(route->port.local))
        .add("replayed", replay->written())
        .add("not_replayed", replay->dropped())
        .add("gap", gap)
        .addBool("ok", s.ok());
    if (!s.ok()) line.add("error", sv(s.message()));
    self->hooks_.event(std::move(line));
  }
  if (!s.ok() && self->hooks_.line) {
    self->hooks_.line(absl::StrCat("exec: a mirrored connection from ", from, " to port ",
                                   route->port.port, " was not replayed whole to ",
                                   programPort(route->port.local), " (", *failure, ")"));
  }
  self->done();
}

// ------------------------------------------------------------ --incoming

net::awaitable<void> ExecIncoming::watch(std::shared_ptr<ExecIncoming> self_in) {
  const std::shared_ptr<ExecIncoming> self = std::move(self_in);
  while (!self->released_) {
    co_await self->rescan();
    if (self->released_) break;
    self->watch_timer_.expires_after(kWatchEvery);
    net::error_code ec;
    co_await self->watch_timer_.async_wait(asio::redirect_error(net::use_awaitable, ec));
  }
}

net::awaitable<void> ExecIncoming::rescan() {
  // The program's own view of its namespace: /proc/PID/net is the
  // namespace of PID (the program, whose pid stays siphon's child until
  // it is reaped).
  bool ok4 = false, ok6 = false;
  const std::string base = absl::StrCat("/proc/", pid_, "/net/");
  const std::string tcp4 = readAll(base + "tcp", &ok4);
  const std::string tcp6 = readAll(base + "tcp6", &ok6);
  if (!ok4 && !ok6) co_return;  // gone
  std::map<uint16_t, exec::Listener> listening;
  for (bool v6 : {false, true}) {
    for (exec::Listener& l : exec::parseListeners(v6 ? tcp6 : tcp4, v6)) {
      if (own_ports_.count(l.port) > 0) continue;
      // One address per port: the IPv4 one first (a dual-stack wildcard
      // shows in tcp6 only, and is reached on ::1).
      listening.emplace(l.port, std::move(l));
    }
  }
  // Ports the explicit --steal/--mirror deliver to are theirs.
  std::set<uint16_t> explicit_local;
  for (const auto& [port, route] : routes_) {
    if (!route->automatic) explicit_local.insert(route->port.local);
  }
  // Stopped listening: given back.
  for (auto it = routes_.begin(); it != routes_.end();) {
    const std::shared_ptr<Route> route = it->second;
    if (!route->automatic || listening.count(route->port.local) > 0) {
      ++it;
      continue;
    }
    it = routes_.erase(it);
    if (!route->subscribed) continue;
    route->subscribed = false;
    absl::Status s = co_await route->subscription.unsubscribe();
    if (!s.ok() && hooks_.check_lost) hooks_.check_lost(s);
    if (hooks_.line) {
      hooks_.line(absl::StrCat("exec: port ", route->port.port,
                               " given back (the program stopped listening)"));
    }
    if (hooks_.event) {
      hooks_.event(
          std::move(JsonLine("released").add("port", static_cast<uint64_t>(route->port.port))));
    }
  }
  for (auto it = refused_.begin(); it != refused_.end();) {
    it = listening.count(*it) > 0 ? std::next(it) : refused_.erase(it);
  }
  // Started listening: taken.
  for (const auto& [port, listener] : listening) {
    if (released_) break;
    if (routes_.count(port) > 0 || explicit_local.count(port) > 0 || refused_.count(port) > 0) {
      continue;
    }
    auto route = std::make_shared<Route>();
    route->port = IncomingPort{port, port, mode_ == IncomingMode::kMirror};
    route->addresses = {listener.dialAddress()};
    route->automatic = true;
    absl::Status s = co_await subscribeRoute(route);
    if (!s.ok()) {
      refused_.insert(port);
      if (hooks_.line) {
        hooks_.line(absl::StrCat("exec: the program listens on port ", port, ", which cannot be ",
                                 route->port.mirror ? "mirrored" : "stolen", ": ", statusText(s)));
      }
      continue;
    }
    if (released_) {
      (void)co_await route->subscription.unsubscribe();
      break;
    }
    routes_[port] = route;
    net::spawn(executor_, serve(shared_from_this(), route), "exec_incoming");
  }
}

void ExecIncoming::onMoved(const std::string& agent) {
  for (auto& [port, route] : routes_) {
    if (!route->subscribed) continue;
    const absl::Status s = route->subscription.status();
    if (s.ok()) continue;
    route->subscribed = false;
    if (hooks_.line) {
      hooks_.line(absl::StrCat("exec: port ", port, " is not ",
                               route->port.mirror ? "mirrored" : "stolen", " on agent ", agent,
                               ": ", statusText(s)));
    }
  }
}

net::awaitable<void> ExecIncoming::releaseAll(bool session_lost) {
  released_ = true;
  watch_timer_.cancel();
  for (auto& [port, route] : routes_) {
    if (!route->subscribed) continue;
    route->subscribed = false;
    if (session_lost) continue;
    absl::Status s = co_await route->subscription.unsubscribe();
    if (!s.ok() && hooks_.check_lost) hooks_.check_lost(s);
    if (hooks_.event) {
      hooks_.event(std::move(JsonLine("released").add("port", static_cast<uint64_t>(port))));
    }
  }
  for (auto& [port, route] : routes_) {
    if (route->pool) route->pool->closeAll();
  }
}

}  // namespace siphon::cli
