// `siphon steal`: the agent steals ports of the target (a steal
// Subscription, siphon/client/subscriptions.h) and hands every connection
// to them to this client (a kConnection event); each is joined to a fresh
// connection to a local server. With --filter-* flags the steal is
// HTTP-filtered: the agent takes only the requests that match, and hands
// over each as a connection of its own (kRequest), served by the HTTP
// plumbing (http_plumbing.h) on pooled connections to the local server.
//
//   siphon steal --port P --to HOST:PORT [--port P2 --to HOST2:PORT2 ...] [--flush-connections]
//                [--filter-header 'Name: regex'...] [--filter-path RE] [--filter-method M]
//                [--filter-any]
//
// Order of events:
//  1. The signals are armed and the session's events taken (long_running.h)
//     before the first subscribe. Connections that arrive before every port
//     is subscribed wait in their Subscription (not yet accepted): a failed
//     start resets them (unsubscribe) instead of serving half of the ports.
//  2. Every port is subscribed in turn; a refusal (PORT_BUSY...) undoes the
//     ones made and exits 1.
//  3. "stealing port ..." lines, once all are up (scripts wait for them).
//  4. Per connection (accepted as its Subscription hands it out): connect
//     to its --to, bridge both ways with half-close kept (a FIN travels as
//     a FIN, a reset as a reset).
//     Per stolen request: the plumbing writes the
//     request to the --to and the response back; one "request" line at
//     its end. Overlap notices (another subscription got requests this
//     filter matched) are one line each.
//  5. First SIGINT/SIGTERM: unsubscribe every port, let open connections
//     run to their end; a second one ends them. Then the summary, exit 0.
//     A session lost for good ends everything with exit 3.
//  6. With several --agent: when the agent drains or is lost beyond resume,
//     the client moves to another one and steals the ports again there
//     (target.h, kMoved); one "agent A ...; moved to agent B" line, and
//     serving goes on. Connections of a lost agent are reset; those of a
//     draining one finish there.
//
// Flow control is end to end, as in `forward`: a slow local server stops
// the reads of its stream, which stops the agent reading the remote client.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/bridge.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/http_plumbing.h"
#include "cli/line_writer.h"
#include "cli/long_running.h"
#include "cli/steal_spec.h"
#include "siphon/client/errors.h"
#include "siphon/client/subscriptions.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {
namespace {

namespace asio = net::asio;
using client::ErrorCode;
using client::SubscriptionEvent;

struct StealFlags {
  std::vector<std::string> ports;
  std::vector<std::string> tos;
  bool flush = false;
  FilterFlags filter_flags;
  // Set by the subcommand's callback.
  std::vector<StealRoute> routes;
  std::optional<client::HttpFilter> filter;
};

// One --port with its local server: the resolved endpoints (all of them:
// "localhost" may be ::1 and 127.0.0.1, and the server may listen on only
// one), the pool for stolen requests, and its subscription once made.
struct Route {
  StealRoute route;
  std::vector<net::tcp::endpoint> endpoints;
  std::shared_ptr<LocalPool> pool;
  client::Subscription subscription;
  bool subscribed = false;  // and not given back, nor lost in a move
};

// Why a stream read or write failed, for the close line. A lost session is
// told once, at exit; the line only says so.
std::string streamFailure(const absl::Status& s) {
  if (client::errorCode(s) == ErrorCode::kAgentLost) return "the session with the agent is lost";
  return absl::StrCat("reset by the agent: ", statusText(s));
}

struct StealState;

// One stolen connection, bridged to a local connection (bridge.h) once that
// connects. The hooks note the first failure for the close line and watch
// for the session's loss.
struct Stolen : Bridge {
  Stolen(asio::any_io_executor ex, client::Connection c, StolenEvent e,
         std::weak_ptr<StealState> st)
      : Bridge(net::tcp::socket(ex), std::move(c)), event(std::move(e)), state(std::move(st)) {}

  StolenEvent event;  // bytes and the first failure accumulate here
  std::weak_ptr<StealState> state;
  bool ended = false;  // ended by us (second signal, lost session)

  void noteError(std::string why) {
    if (event.error.empty()) event.error = std::move(why);
  }
  // Tells the agent to reset the remote client's connection. The session
  // ignores a reset of a stream that is already gone.
  void resetStream(ErrorCode code, std::string_view why) { stream.reset(code, why); }
  // Ends both ways at once (second signal, lost session).
  void end(std::string_view why) {
    ended = true;
    noteError(std::string(why));
    resetStream(ErrorCode::kCancelled, why);
    abortLocal();
  }

 protected:
  void localFailed(const net::error_code& ec) override;
  void streamFailed(const absl::Status& s) override;
  void halfCloseFailed(const absl::Status& s) override;
  void finished() override;
};

struct StealState {
  explicit StealState(const CommandEnv& env)
      : json(env.json),
        connect_timeout(env.timeout),
        out(json ? STDOUT_FILENO : STDERR_FILENO),
        run(env, "steal", [this](std::string line) { print(std::move(line)); }) {}

  bool json;
  std::chrono::milliseconds connect_timeout;
  // Event lines go through a thread of their own: a stderr (or stdout)
  // that nobody reads must not stall the connections this loop bridges.
  // stdout is for --json; a closed stdout is not worth dying for here.
  LineWriter out;
  // Signals, the session's events, the main loop's wake-up: only runSteal
  // waits on it.
  LongRunning run;

  std::vector<Route> routes;
  std::map<uint64_t, std::shared_ptr<Stolen>> live;        // by stream id, connecting or open
  std::map<uint64_t, std::shared_ptr<Exchange>> requests;  // stolen requests, by stream id
  // Spawned serveStolen coroutines that have not run yet: co_spawn starts
  // them later, and until then they are in no map.
  size_t starting = 0;
  StealTotals totals;

  void print(std::string line) { out.write(std::move(line)); }

  void endAll(std::string_view why) {
    // On a copy: `live` must not change under the loop, whatever end()
    // reaches into.
    std::vector<std::shared_ptr<Stolen>> all;
    for (auto& [id, c] : live) all.push_back(c);
    for (auto& c : all) c->end(why);
    std::vector<std::shared_ptr<Exchange>> exchanges;
    for (auto& [id, x] : requests) exchanges.push_back(x);
    for (auto& x : exchanges) x->end(why);
  }

  void finished(const std::shared_ptr<Stolen>& c) {
    live.erase(c->stream.streamId());
    run.notify();
  }
  // Connections and requests not yet finished, started or not.
  bool busy() const { return !live.empty() || !requests.empty() || starting > 0; }
  uint64_t open() const { return live.size() + requests.size() + starting; }
};

// ------------------------------------------------------------ bridging

// The local socket failed: the remote client's connection is reset, not
// closed cleanly. operation_aborted means we closed it ourselves (end()),
// and the reason is noted already.
void Stolen::localFailed(const net::error_code& ec) {
  if (ec == asio::error::operation_aborted || ended) return;
  noteError(absl::StrCat("local: ", ec.message()));
  resetStream(ErrorCode::kCancelled,
              absl::StrCat("the local server ", event.to, " failed: ", ec.message()));
  abortLocal();
}

void Stolen::streamFailed(const absl::Status& s) {
  // Our own reset (local failure, end()) is noted already.
  if (!ended) noteError(streamFailure(s));
  if (auto st = state.lock()) st->run.checkLost(s);
  abortLocal();
}

void Stolen::halfCloseFailed(const absl::Status& s) {
  if (auto st = state.lock()) st->run.checkLost(s);
}

void Stolen::finished() {
  event.in = to_local;
  event.out = to_stream;
  auto st = state.lock();
  if (!st) return;
  st->totals.in += event.in;
  st->totals.out += event.out;
  st->print(closeLine(event, st->json));
  st->finished(std::static_pointer_cast<Stolen>(shared_from_this()));
}

// Who and where a stolen connection or request comes from, into `event`
// for its lines; the port and the local server are its route's.
template <typename Event>
void describeStolen(const Route& route, const SubscriptionEvent& e, Event* event) {
  if (!e.source.ip.empty()) event->source = e.source.text();
  if (!e.destination.ip.empty()) event->destination = e.destination.text();
  event->port = route.route.port;
  event->to = route.route.to();
}

// A connection that never reached the bridging: the agent resets the remote
// client's connection.
void failStolen(const std::shared_ptr<StealState>& st, const std::shared_ptr<Stolen>& c,
                ErrorCode code, std::string failure) {
  c->resetStream(code, failure);
  c->abortLocal();
  c->event.error = std::move(failure);
  ++st->totals.failed;
  st->print(failedLine(c->event, st->json));
  st->finished(c);
}

// One stolen connection, from its event to both directions running.
net::awaitable<void> serveStolen(std::shared_ptr<StealState> state, size_t index,
                                 client::Connection connection_in, StolenEvent event_in) {
  const std::shared_ptr<StealState> st = std::move(state);
  auto ex = co_await asio::this_coro::executor;
  const Route& route = st->routes[index];
  auto c = std::make_shared<Stolen>(ex, std::move(connection_in), std::move(event_in), st);
  st->live[c->stream.streamId()] = c;
  --st->starting;

  if (st->run.ending() || !st->run.lost().ok()) {
    failStolen(st, c, ErrorCode::kCancelled, "siphon steal is ending");
    co_return;
  }
  absl::Status connected =
      co_await connectLocal(c->local, route.endpoints, st->connect_timeout, c->event.to);
  if (c->ended) {
    // end() reset the stream and noted why.
    failStolen(st, c, ErrorCode::kCancelled, c->event.error);
    co_return;
  }
  if (!connected.ok()) {
    failStolen(st, c, ErrorCode::kUnavailable, std::string(connected.message()));
    co_return;
  }
  ++st->totals.connections;
  st->print(openLine(c->event, st->json));
  c->start();
}

// ------------------------------------------------------------ requests

// One stolen HTTP request: its connection is accepted (the plumbing answers
// even a local server that is down, with a 502), and served by an Exchange.
void serveRequest(const std::shared_ptr<StealState>& st, size_t index, SubscriptionEvent e) {
  const Route& route = st->routes[index];
  RequestEvent event;
  event.method = e.request.method;
  event.path = e.request.path;
  describeStolen(route, e, &event);
  if (st->run.ending() || !st->run.lost().ok()) {
    e.connection.reset(ErrorCode::kCancelled, "siphon steal is ending");
    event.error = "siphon steal is ending";
    ++st->totals.requests;
    ++st->totals.requests_failed;
    st->print(requestLine(event, st->json));
    st->run.notify();
    return;
  }
  std::weak_ptr<StealState> weak = st;
  auto x = std::make_shared<Exchange>(st->run.target().client()->executor(), e.connection,
                                      route.pool, std::move(event), e.request.method == "HEAD",
                                      [weak](Exchange& done) {
                                        auto state = weak.lock();
                                        if (!state) return;
                                        ++state->totals.requests;
                                        if (done.failed()) ++state->totals.requests_failed;
                                        state->totals.in += done.event().in;
                                        state->totals.out += done.event().out;
                                        state->print(requestLine(done.event(), state->json));
                                        state->requests.erase(done.streamId());
                                        state->run.notify();
                                      });
  x->on_stream_error = [weak](const absl::Status& s) {
    if (auto state = weak.lock()) state->run.checkLost(s);
  };
  st->requests[x->streamId()] = x;
  x->start();
}

// ------------------------------------------------------- subscriptions

// What one port's Subscription hands out, in order, until it is over
// (given back, lost, or not made again after a move).
net::awaitable<void> serveSubscription(std::shared_ptr<StealState> state, size_t index) {
  const std::shared_ptr<StealState> st = std::move(state);
  auto ex = co_await asio::this_coro::executor;
  while (true) {
    auto e = co_await st->routes[index].subscription.next();
    if (!e.ok()) break;
    const Route& route = st->routes[index];
    switch (e->kind) {
      case SubscriptionEvent::Kind::kConnection: {
        StolenEvent event;
        describeStolen(route, *e, &event);
        client::Connection connection = e->connection;
        ++st->starting;
        // A connection that throws is reset; the others go on.
        net::spawn(ex, serveStolen(st, index, connection, std::move(event)), "steal_connection",
                   [connection]() mutable {
                     connection.reset(ErrorCode::kInternal, "the client failed");
                   });
        break;
      }
      case SubscriptionEvent::Kind::kRequest:
        serveRequest(st, index, std::move(*e));
        break;
      case SubscriptionEvent::Kind::kOverlap: {
        // A request this filter matched went to an earlier subscription of
        // the port (another session's, usually).
        OverlapEvent o;
        o.port = route.route.port;
        o.taken_by = e->overlap.taken_by;
        o.client = e->overlap.taken_by_client;
        o.requests = e->overlap.requests;
        o.method = e->overlap.method;
        o.path = e->overlap.path;
        st->print(overlapLine(o, st->json));
        break;
      }
      case SubscriptionEvent::Kind::kMirrored:
        e->mirrored.stop(ErrorCode::kUnimplemented, "siphon steal takes no mirrored connections");
        break;
      case SubscriptionEvent::Kind::kDraining:
      case SubscriptionEvent::Kind::kMoved:
      case SubscriptionEvent::Kind::kLost:
      case SubscriptionEvent::Kind::kTargetRestarted:
        break;  // the session's events say it (onLinkEvent)
    }
  }
  st->run.notify();
}

// ------------------------------------------------------------ the session

// Draining and moves, as lines. A move made every subscription again on the
// new agent, or said why not (Subscription::status()).
void onLinkEvent(StealState& st, const client::LinkEvent& e) {
  using Kind = client::LinkEvent::Kind;
  if (e.kind == Kind::kDraining) {
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    st.print(drainingLine(e.reason, std::max<int64_t>(0, (e.deadline_unix_ms - now_ms) / 1000),
                          st.open(), st.json));
    return;
  }
  if (e.kind == Kind::kTargetRestarted) {
    st.print(targetRestartedLine({e.previous_pid, e.pid, e.reason, e.down_ms, e.restarts},
                                 "the steal goes on", st.json));
    return;
  }
  if (e.kind != Kind::kMoved) return;
  AgentMove move{e.from, e.to, e.reason, e.draining, e.streams, 0, 0};
  std::vector<std::string> lines;
  for (Route& r : st.routes) {
    if (!r.subscribed) continue;
    const absl::Status status = r.subscription.status();
    if (status.ok()) {
      ++move.ports_back;
      continue;
    }
    ++move.ports_lost;
    r.subscribed = false;
    lines.push_back(restealFailedLine(r.route.port, e.to, statusText(status), st.json));
  }
  st.print(movedLine(move, st.json));
  for (auto& line : lines) st.print(std::move(line));
  if (move.ports_back == 0 && move.ports_lost > 0) {
    st.run.end(absl::FailedPreconditionError(
        absl::StrCat("no port could be stolen again on agent ", e.to)));
  }
}

// ------------------------------------------------------------ the command

// Gives every subscription back. A lost session is left to the caller (the
// agent drops a lost session's subscriptions itself); other failures are
// printed. Returns the exit code.
net::awaitable<int> unsubscribeAll(std::shared_ptr<StealState> state) {
  const std::shared_ptr<StealState> st = std::move(state);
  int rc = kExitOk;
  for (Route& r : st->routes) {
    if (!st->run.lost().ok()) break;
    if (!r.subscribed) continue;
    r.subscribed = false;
    absl::Status s = co_await r.subscription.unsubscribe();
    if (s.ok()) continue;
    st->run.checkLost(s);
    if (!st->run.lost().ok()) break;
    Failure f = requestFailure(absl::StrCat("unsubscribe port ", r.route.port), s);
    st->out.flush();  // keep the order of the lines before it
    printError(f.message);
    rc = f.exit_code;
  }
  co_return rc;
}

net::awaitable<int> runSteal(const CommandEnv& env, const StealFlags& flags) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<StealState>(env);

  // Resolve every --to first: a typo fails before any port is taken from
  // the target.
  for (const StealRoute& route : flags.routes) {
    net::tcp::resolver resolver(ex);
    net::error_code ec;
    auto results = co_await resolver.async_resolve(route.host, std::to_string(route.to_port),
                                                   asio::redirect_error(net::use_awaitable, ec));
    if (ec || results.empty()) {
      printError(absl::StrCat("steal: cannot resolve ", route.host, ": ",
                              ec ? ec.message() : "no address"));
      co_return kExitError;
    }
    Route r;
    r.route = route;
    for (const auto& e : results) r.endpoints.push_back(e.endpoint());
    r.pool = std::make_shared<LocalPool>(ex, route.to(), r.endpoints, env.timeout);
    st->routes.push_back(std::move(r));
  }
  st->totals.filtered = flags.filter.has_value();

  // Before the first subscribe: dying of a signal would leave the ports
  // stolen until the agent's session grace runs out.
  std::weak_ptr<StealState> weak = st;
  st->run.on_end = [weak](int) {
    if (auto s = weak.lock()) s->endAll("ended by siphon steal (interrupted)");
  };
  st->run.on_event = [weak](const client::LinkEvent& e) {
    if (auto s = weak.lock()) onLinkEvent(*s, e);
  };
  st->run.start();

  client::Subscriptions subscriptions(env.target);
  int exit_code = kExitOk;
  std::vector<std::string> lines;
  for (size_t i = 0; i < st->routes.size() && !st->run.stopRequested(); ++i) {
    Route& r = st->routes[i];
    client::StealSpec spec;
    spec.port = r.route.port;
    spec.flush_connections = flags.flush;
    // The library keeps the subscription as asked to steal the port again
    // on another agent (a move): the filter goes with it.
    spec.filter = flags.filter;
    auto sub = co_await subscriptions.steal(std::move(spec));
    if (!sub.ok()) {
      Failure f = requestFailure(absl::StrCat("steal port ", r.route.port), sub.status());
      printError(f.message);
      exit_code = f.exit_code;
      st->run.checkLost(sub.status());
      break;
    }
    r.subscription = *std::move(sub);
    r.subscribed = true;
    lines.push_back(stealingLine(r.route, r.subscription.backend(), r.subscription.id(), st->json,
                                 flags.filter ? &*flags.filter : nullptr));
  }

  if (exit_code != kExitOk) {
    // Nothing was served yet: the connections waiting in the subscriptions
    // are reset with them, not half-served.
    (void)co_await unsubscribeAll(st);
    st->run.finish();
    co_return exit_code;
  }

  for (const auto& line : lines) st->print(line);
  for (size_t i = 0; i < st->routes.size(); ++i) {
    if (!st->routes[i].subscribed) continue;
    net::spawn(ex, serveSubscription(st, i), "steal_subscription");
  }

  while (st->run.running()) co_await st->run.wait();
  exit_code = co_await unsubscribeAll(st);
  if (st->busy() && !st->run.ending() && st->run.lost().ok()) {
    st->print(stoppingLine(st->live.size() + st->starting, st->json, st->requests.size()));
  }
  while (st->busy() && st->run.lost().ok()) co_await st->run.wait();
  if (!st->run.lost().ok()) {
    st->endAll("the session with the agent is lost");
    // The connections' coroutines see their sockets and streams closed and
    // print their last lines.
    while (st->busy()) co_await st->run.wait();
    st->out.flush();
    st->run.reportLost();
    exit_code = st->run.exitCode(exit_code);
  }

  st->run.finish();
  for (auto& r : st->routes) r.pool->closeAll();
  st->print(summaryLine(st->totals, st->json));
  co_return exit_code;
}

}  // namespace

void addStealCommands(CLI::App& app, std::vector<Command>& out) {
  auto flags = std::make_shared<StealFlags>();
  CLI::App* steal = app.add_subcommand(
      "steal",
      "Steal connections to ports of the target and serve each from a local server; runs until "
      "SIGINT/SIGTERM");
  steal->add_option("-p,--port", flags->ports, "Port of the target to steal (1-65535); repeatable")
      ->type_name("PORT")
      ->required()
      ->allow_extra_args(false);
  steal
      ->add_option("--to", flags->tos,
                   "HOST:PORT of the local server for the --port at the same position "
                   "([ADDR]:PORT for IPv6); one per --port; each connect may take up to "
                   "--timeout")
      ->type_name("HOST:PORT")
      ->required()
      ->allow_extra_args(false);
  steal->add_flag("--flush-connections", flags->flush,
                  "Also destroy connections to the port(s) established before the steal, so "
                  "their clients reconnect and get stolen");
  steal
      ->add_option("--filter-header", flags->filter_flags.headers,
                   "Steal only HTTP requests with this header (name case-insensitive) and a "
                   "value the RE2 regex matches (unanchored); repeatable")
      ->type_name("'NAME: REGEX'")
      ->allow_extra_args(false);
  steal
      ->add_option("--filter-path", flags->filter_flags.path,
                   "Steal only HTTP requests whose path, or path?query, the RE2 regex matches "
                   "(unanchored: ^/api/ for a prefix)")
      ->type_name("REGEX")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  steal
      ->add_option("--filter-method", flags->filter_flags.method,
                   "Steal only HTTP requests with this method (exactly: GET, POST...)")
      ->type_name("METHOD")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  steal->add_flag("--filter-any", flags->filter_flags.any,
                  "A request matching any one filter is stolen (default: all of them must "
                  "match)");
  steal->footer(
      "Each stolen connection is connected to its --to and bridged both ways until either side "
      "closes. On stderr: 'stealing port P -> HOST:PORT (backend B)' once every port is taken, "
      "then 'open SRC -> :P => HOST:PORT' and 'close SRC -> :P in=BYTES out=BYTES' per "
      "connection (in: from the remote client, out: to it). With --json: one JSON object per "
      "line on stdout instead. The first SIGINT/SIGTERM gives the ports back and waits for open "
      "connections to end, a second one ends them; then a summary.\n\n"
      "With --filter-* the steal takes HTTP requests, not connections: only the requests that "
      "match (the filter applies to every --port); the others, and anything that is not HTTP, "
      "reach the application. Several sessions may steal one port with different filters. Each "
      "request is sent to its --to (connections kept alive and reused) and the response "
      "returned; a --to that cannot be reached is answered with a 502. One line per request: "
      "'request SRC METHOD PATH -> HOST:PORT: STATUS in=BYTES out=BYTES'.\n\n"
      "Example: siphon steal --port 80 --to 127.0.0.1:8080 --port 443 --to 127.0.0.1:8443\n"
      "Example: siphon steal --port 80 --to 127.0.0.1:8080 --filter-header 'x-user: ^alice$'");
  steal->callback([flags] {
    auto routes = pairStealRoutes(flags->ports, flags->tos);
    if (!routes.ok()) throw CLI::ValidationError("steal", std::string(routes.status().message()));
    flags->routes = *std::move(routes);
    auto filter = parseStealFilter(flags->filter_flags);
    if (!filter.ok()) throw CLI::ValidationError("steal", std::string(filter.status().message()));
    flags->filter = *std::move(filter);
  });
  out.push_back({steal, [flags](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runSteal(env, *flags);
                 }});
}

}  // namespace siphon::cli
