// `siphon steal`: the agent steals ports of the target (StealSubscribe) and
// hands every connection to them to this client as a stream
// (StreamOpen{stolen}); each is joined to a fresh connection to a local
// server. With --filter-* flags the steal is HTTP-filtered: the agent takes
// only the requests that match, and hands over each as a stream of its own
// (StreamOpen{stolen_request}), served by the HTTP plumbing
// (http_plumbing.h) on pooled connections to the local server.
//
//   siphon steal --port P --to HOST:PORT [--port P2 --to HOST2:PORT2 ...] [--flush-connections]
//                [--filter-header 'Name: regex'...] [--filter-path RE] [--filter-method M]
//                [--filter-any]
//
// Order of events:
//  1. The stream acceptor is set before the first subscribe, so no
//     connection the agent steals finds this client without one. Streams
//     that arrive before every port is subscribed wait (not yet accepted):
//     a failed start resets them instead of serving half of the ports.
//  2. Every port is subscribed in turn; a refusal (PORT_BUSY...) undoes the
//     ones made and exits 1.
//  3. "stealing port ..." lines, once all are up (scripts wait for them).
//  4. Per connection: connect to its --to, accept the stream, bridge both
//     ways with half-close kept (a FIN travels as a FIN, a reset as a reset).
//     Per stolen request: accept the stream, then the plumbing writes the
//     request to the --to and the response back; one "request" line at
//     its end. Overlap notices (another subscription got requests this
//     filter matched) are one line each.
//  5. First SIGINT/SIGTERM: unsubscribe every port, let open connections
//     run to their end; a second one ends them. Then the summary, exit 0.
//     A session lost for good ends everything with exit 3.
//  6. With several --agent: when the agent drains or is lost beyond resume,
//     the client moves to another one and steals the ports again there
//     (client.h, failover); one "agent A ...; moved to agent B" line, and
//     serving goes on. Connections of a lost agent are reset; those of a
//     draining one finish there.
//
// Flow control is end to end, as in `forward`: a slow local server stops
// the reads of its stream, which stops the agent reading the remote client.
#include <signal.h>
#include <unistd.h>

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
#include "cli/steal_spec.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {
namespace {

namespace asio = net::asio;

struct StealFlags {
  std::vector<std::string> ports;
  std::vector<std::string> tos;
  bool flush = false;
  FilterFlags filter_flags;
  // Set by the subcommand's callback.
  std::vector<StealRoute> routes;
  std::optional<v1::HttpFilter> filter;
};

// A route with its resolved local endpoints (all of them: "localhost" may
// be ::1 and 127.0.0.1, and the server may listen on only one).
struct Target {
  StealRoute route;
  std::vector<net::tcp::endpoint> endpoints;
};

// "CODE: message", as the lines show a failed status.
std::string statusText(const absl::Status& s) {
  return absl::StrCat(errorCodeName(errorCodeOf(s)), ": ", s.message());
}

// Why a stream read or write failed, for the close line. A lost session is
// told once, at exit; the line only says so.
std::string streamFailure(const absl::Status& s) {
  if (errorCodeOf(s) == v1::AGENT_LOST) return "the session with the agent is lost";
  return absl::StrCat("reset by the agent: ", statusText(s));
}

// One stolen connection: its stream and the local connection it is joined to.
struct StealState;

// One stolen connection: the stream the agent opened, bridged to a local
// connection (bridge.h) once that connects. The hooks note the first
// failure for the close line and watch for the session's loss.
struct Stolen : Bridge {
  Stolen(asio::any_io_executor ex, std::shared_ptr<client::ClientStream> s, StolenEvent e,
         std::weak_ptr<StealState> st)
      : Bridge(net::tcp::socket(ex), std::move(s)), event(std::move(e)), state(std::move(st)) {}

  StolenEvent event;  // bytes and the first failure accumulate here
  std::weak_ptr<StealState> state;
  bool ended = false;  // ended by us (second signal, lost session)

  void noteError(std::string why) {
    if (event.error.empty()) event.error = std::move(why);
  }
  // Tells the agent to reset the remote client's connection. The session
  // ignores a reset of a stream that is already gone.
  void resetStream(v1::ErrorCode code, std::string_view why) { stream->reset(code, why); }
  // Ends both ways at once (second signal, lost session).
  void end(std::string_view why) {
    ended = true;
    noteError(std::string(why));
    resetStream(v1::CANCELLED, why);
    abortLocal();
  }

 protected:
  void localFailed(const net::error_code& ec) override;
  void streamFailed(const absl::Status& s) override;
  void halfCloseFailed(const absl::Status& s) override;
  void finished() override;
};

struct StealState {
  StealState(asio::any_io_executor ex, const CommandEnv& env)
      : client(env.client),
        json(env.json),
        connect_timeout(env.timeout),
        done(ex),
        signals(ex, SIGINT, SIGTERM) {}

  std::shared_ptr<client::Client> client;
  bool json;
  std::chrono::milliseconds connect_timeout;
  // Only runSteal waits on it: net::Signal is one timer, and a second
  // waiter's wait() would cancel the first's.
  net::Signal done;
  asio::signal_set signals;

  std::vector<Target> targets;
  std::vector<std::shared_ptr<LocalPool>> pools;  // one per target, for stolen requests
  std::map<uint64_t, size_t> subscriptions;       // subscription id -> targets index
  bool started = false;                           // every port subscribed
  std::vector<std::pair<std::shared_ptr<client::ClientStream>, v1::StreamOpen>> waiting;
  std::map<uint64_t, std::shared_ptr<Stolen>> live;        // by stream id, connecting or open
  std::map<uint64_t, std::shared_ptr<Exchange>> requests;  // stolen requests, by stream id
  // Spawned serveStolen coroutines that have not run yet: co_spawn starts
  // them later, and until then they are in no map.
  size_t starting = 0;
  StealTotals totals;

  bool stop_requested = false;  // first signal
  bool ending = false;          // second signal: end open connections
  absl::Status lost;            // the session is gone for good

  // Event lines go through a thread of their own: a stderr (or stdout)
  // that nobody reads must not stall the connections this loop bridges.
  // stdout is for --json; a closed stdout is not worth dying for here.
  LineWriter out{json ? STDOUT_FILENO : STDERR_FILENO};
  void print(std::string line) { out.write(std::move(line)); }

  void sessionLost(const absl::Status& s) {
    if (!lost.ok()) return;
    lost = s;
    done.notify();
  }
  // A stream or request failed with AGENT_LOST: that session is gone, but
  // the client may have moved to another agent; only its own loss counts.
  void checkLost(const absl::Status& s) {
    if (errorCodeOf(s) == v1::AGENT_LOST && !client->lostStatus().ok()) {
      sessionLost(client->lostStatus());
    }
  }

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
    live.erase(c->stream->id());
    done.notify();
  }
  // Connections and requests not yet finished, started or not.
  bool busy() const { return !live.empty() || !requests.empty() || starting > 0; }
};

// ------------------------------------------------------------ bridging

// The local socket failed: the remote client's connection is reset, not
// closed cleanly. operation_aborted means we closed it ourselves (end()),
// and the reason is noted already.
void Stolen::localFailed(const net::error_code& ec) {
  if (ec == asio::error::operation_aborted || ended) return;
  noteError(absl::StrCat("local: ", ec.message()));
  resetStream(v1::CANCELLED,
              absl::StrCat("the local server ", event.to, " failed: ", ec.message()));
  abortLocal();
}

void Stolen::streamFailed(const absl::Status& s) {
  // Our own reset (local failure, end()) is noted already.
  if (!ended) noteError(streamFailure(s));
  if (auto st = state.lock()) st->checkLost(s);
  abortLocal();
}

void Stolen::halfCloseFailed(const absl::Status& s) {
  if (auto st = state.lock()) st->checkLost(s);
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

// Who and where a stolen connection or request (StolenConnection,
// StolenRequest) comes from, into `event` for its lines; the port and the
// local server are its subscription's. Returns that subscription's targets
// index, or nullopt for one whose Subscribed never reached us (a timed-out
// request): its port is then the destination's, its server "?".
template <typename Event, typename Open>
std::optional<size_t> describeStolen(const StealState& st, const Open& stolen, Event* event) {
  if (!stolen.source().ip().empty()) {
    event->source = hostPort(stolen.source().ip(), stolen.source().port());
  }
  if (!stolen.destination().ip().empty()) {
    event->destination = hostPort(stolen.destination().ip(), stolen.destination().port());
  }
  event->port = stolen.destination().port();
  event->to = "?";
  auto sub = st.subscriptions.find(stolen.subscription_id());
  if (sub == st.subscriptions.end()) return std::nullopt;
  event->port = st.targets[sub->second].route.port;
  event->to = st.targets[sub->second].route.to();
  return sub->second;
}

std::string noSubscription(uint64_t subscription_id) {
  return absl::StrCat("no subscription ", subscription_id, " in this client");
}

// A connection that never reached the bridging: the agent resets the remote
// client's connection.
void failStolen(const std::shared_ptr<StealState>& st, const std::shared_ptr<Stolen>& c,
                v1::ErrorCode code, std::string failure) {
  c->resetStream(code, failure);
  c->abortLocal();
  c->event.error = std::move(failure);
  ++st->totals.failed;
  st->print(failedLine(c->event, st->json));
  st->finished(c);
}

// One stolen connection, from its StreamOpen to both directions running.
net::awaitable<void> serveStolen(std::shared_ptr<StealState> state,
                                 std::shared_ptr<client::ClientStream> stream_in,
                                 v1::StreamOpen open_in) {
  const std::shared_ptr<StealState> st = std::move(state);
  const std::shared_ptr<client::ClientStream> stream = std::move(stream_in);
  const v1::StreamOpen open = std::move(open_in);
  auto ex = co_await asio::this_coro::executor;
  const v1::StolenConnection& stolen = open.stolen();

  StolenEvent event;
  const std::optional<size_t> index = describeStolen(*st, stolen, &event);
  const Target* target = index ? &st->targets[*index] : nullptr;
  auto c = std::make_shared<Stolen>(ex, stream, std::move(event), st);
  st->live[stream->id()] = c;
  --st->starting;

  if (!target) {
    // A subscription whose Subscribed never reached us (a timed-out
    // request): there is nowhere to send its connections.
    failStolen(st, c, v1::NOT_FOUND, noSubscription(stolen.subscription_id()));
    co_return;
  }
  if (st->ending || !st->lost.ok()) {
    failStolen(st, c, v1::CANCELLED, "siphon steal is ending");
    co_return;
  }

  absl::Status connected =
      co_await connectLocal(c->local, target->endpoints, st->connect_timeout, c->event.to);
  if (c->ended) {
    // end() reset the stream and noted why.
    failStolen(st, c, v1::CANCELLED, c->event.error);
    co_return;
  }
  if (!connected.ok()) {
    failStolen(st, c, v1::UNAVAILABLE, std::string(connected.message()));
    co_return;
  }
  absl::Status accepted = st->client->acceptStream(*stream);
  if (!accepted.ok()) {
    // Mostly: the remote client went away while we connected.
    st->checkLost(accepted);
    failStolen(st, c, v1::CANCELLED,
               absl::StrCat("the connection ended before it was accepted: ", statusText(accepted)));
    co_return;
  }

  ++st->totals.connections;
  st->print(openLine(c->event, st->json));
  c->start();
}

// ------------------------------------------------------------ requests

// A stolen request that will not be served: its stream is reset and its
// line printed.
void failRequest(const std::shared_ptr<StealState>& st,
                 const std::shared_ptr<client::ClientStream>& stream, RequestEvent event,
                 v1::ErrorCode code, std::string why) {
  stream->reset(code, why);
  event.error = std::move(why);
  ++st->totals.requests;
  ++st->totals.requests_failed;
  st->print(requestLine(event, st->json));
  st->done.notify();
}

// One stolen HTTP request: accepted at once (the plumbing answers even a
// local server that is down, with a 502), then served by an Exchange.
net::awaitable<void> serveRequest(std::shared_ptr<StealState> state,
                                  std::shared_ptr<client::ClientStream> stream_in,
                                  v1::StreamOpen open_in) {
  const std::shared_ptr<StealState> st = std::move(state);
  const std::shared_ptr<client::ClientStream> stream = std::move(stream_in);
  const v1::StreamOpen open = std::move(open_in);
  auto ex = co_await asio::this_coro::executor;
  const v1::StolenRequest& stolen = open.stolen_request();
  --st->starting;

  RequestEvent event;
  event.method = stolen.method();
  event.path = stolen.path();
  const std::optional<size_t> found = describeStolen(*st, stolen, &event);
  if (!found) {
    failRequest(st, stream, std::move(event), v1::NOT_FOUND,
                noSubscription(stolen.subscription_id()));
    co_return;
  }
  const size_t index = *found;
  if (st->ending || !st->lost.ok()) {
    failRequest(st, stream, std::move(event), v1::CANCELLED, "siphon steal is ending");
    co_return;
  }
  absl::Status accepted = st->client->acceptStream(*stream);
  if (!accepted.ok()) {
    st->checkLost(accepted);
    failRequest(st, stream, std::move(event), v1::CANCELLED,
                absl::StrCat("the request ended before it was accepted: ", statusText(accepted)));
    co_return;
  }
  auto x = std::make_shared<Exchange>(ex, stream, st->pools[index], std::move(event),
                                      stolen.method() == "HEAD",
                                      [weak = std::weak_ptr<StealState>(st)](Exchange& done) {
                                        auto state = weak.lock();
                                        if (!state) return;
                                        ++state->totals.requests;
                                        if (done.failed()) ++state->totals.requests_failed;
                                        state->totals.in += done.event().in;
                                        state->totals.out += done.event().out;
                                        state->print(requestLine(done.event(), state->json));
                                        state->requests.erase(done.streamId());
                                        state->done.notify();
                                      });
  x->on_stream_error = [weak = std::weak_ptr<StealState>(st)](const absl::Status& s) {
    if (auto state = weak.lock()) state->checkLost(s);
  };
  st->requests[stream->id()] = x;
  x->start();
}

// Hands a stream to a new serveStolen (or serveRequest) coroutine.
void spawnServe(const std::shared_ptr<StealState>& st, std::shared_ptr<client::ClientStream> stream,
                v1::StreamOpen open) {
  ++st->starting;
  if (open.has_stolen_request()) {
    net::spawn(st->signals.get_executor(), serveRequest(st, stream, std::move(open)),
               "steal_request", [stream] { stream->reset(v1::INTERNAL, "the client failed"); });
    return;
  }
  // A connection that throws is reset; the others go on.
  net::spawn(st->signals.get_executor(), serveStolen(st, stream, std::move(open)),
             "steal_connection", [stream] { stream->reset(v1::INTERNAL, "the client failed"); });
}

// What the client's stream acceptor does: runs inside Client::onStreamOpen,
// so it only starts (or parks) the work.
void onStreamOpen(const std::shared_ptr<StealState>& st,
                  std::shared_ptr<client::ClientStream> stream, v1::StreamOpen open) {
  if (!open.has_stolen() && !open.has_stolen_request()) {
    stream->reset(v1::UNIMPLEMENTED,
                  "siphon steal accepts stolen connections and stolen requests only");
    return;
  }
  if (!st->started) {
    st->waiting.emplace_back(std::move(stream), std::move(open));
    return;
  }
  spawnServe(st, std::move(stream), std::move(open));
}

void armSignals(const std::shared_ptr<StealState>& st) {
  st->signals.async_wait([weak = std::weak_ptr<StealState>(st)](net::error_code ec, int) {
    auto s = weak.lock();
    if (ec || !s) return;
    if (!s->stop_requested) {
      s->stop_requested = true;
      armSignals(s);  // the second one ends the open connections
    } else {
      s->ending = true;
      s->endAll("ended by siphon steal (interrupted)");
    }
    s->done.notify();
  });
}

// ------------------------------------------------------------ the command

// Gives every subscription back. A lost session is left to the caller (the
// agent drops a lost session's subscriptions itself); other failures are
// printed. Returns the exit code.
net::awaitable<int> unsubscribeAll(const CommandEnv& env, const std::shared_ptr<StealState>& st) {
  int rc = kExitOk;
  for (const auto& [id, index] : st->subscriptions) {
    if (!st->lost.ok()) break;
    v1::Request request;
    request.mutable_unsubscribe()->set_subscription_id(id);
    auto r = co_await env.client->call(std::move(request), env.timeout);
    if (r.ok()) continue;
    st->checkLost(r.status());
    if (!st->lost.ok()) break;
    Failure f = requestFailure(absl::StrCat("unsubscribe port ", st->targets[index].route.port),
                               r.status());
    st->out.flush();  // keep the order of the lines before it
    printError(f.message);
    rc = f.exit_code;
  }
  co_return rc;
}

net::awaitable<int> runSteal(const CommandEnv& env, const StealFlags& flags) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<StealState>(ex, env);

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
    Target t{route, {}};
    for (const auto& r : results) t.endpoints.push_back(r.endpoint());
    st->pools.push_back(std::make_shared<LocalPool>(ex, route.to(), t.endpoints, env.timeout));
    st->targets.push_back(std::move(t));
  }
  st->totals.filtered = flags.filter.has_value();

  // A closed stdout (--json | head) is a write error, not a signal to die of.
  ::signal(SIGPIPE, SIG_IGN);
  // Before the first subscribe: dying of a signal would leave the ports
  // stolen until the agent's session grace runs out.
  armSignals(st);
  // Before the first subscribe too, so that no stolen connection is reset
  // for want of an acceptor.
  env.client->setStreamAcceptor(
      [weak = std::weak_ptr<StealState>(st)](std::shared_ptr<client::ClientStream> stream,
                                             v1::StreamOpen open) {
        if (auto s = weak.lock()) {
          onStreamOpen(s, std::move(stream), std::move(open));
        } else {
          stream->reset(v1::CANCELLED, "siphon steal has ended");
        }
      });

  env.client->setDrainingHandler([weak = std::weak_ptr<StealState>(st)](const v1::Draining& d) {
    auto state = weak.lock();
    if (!state) return;
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    state->print(
        drainingLine(d.reason(), std::max<int64_t>(0, (d.deadline_unix_ms() - now_ms) / 1000),
                     state->live.size() + state->requests.size() + state->starting, state->json));
  });
  // Failover (several --agent): the client moved to another agent and made
  // the subscriptions again there, under the same ids.
  env.client->setFailoverHandler([weak = std::weak_ptr<StealState>(st)](
                                     const client::FailoverEvent& e) {
    auto state = weak.lock();
    if (!state) return;
    AgentMove move{e.from, e.to, e.reason, e.draining, e.streams, 0, 0};
    std::vector<std::string> lines;
    for (const auto& [id, status] : e.subscriptions) {
      if (status.ok()) {
        ++move.ports_back;
        continue;
      }
      ++move.ports_lost;
      auto sub = state->subscriptions.find(id);
      uint16_t port =
          sub == state->subscriptions.end() ? 0 : state->targets[sub->second].route.port;
      lines.push_back(restealFailedLine(port, e.to, statusText(status), state->json));
    }
    state->print(movedLine(move, state->json));
    for (const auto& line : lines) state->print(line);
    if (move.ports_back == 0 && move.ports_lost > 0) {
      state->sessionLost(protoError(v1::FAILED_PRECONDITION,
                                    absl::StrCat("no port could be stolen again on agent ", e.to)));
    }
  });
  // A request this filter matched went to an earlier subscription of the
  // port (another session's, usually).
  env.client->setNoticeHandler(
      [weak = std::weak_ptr<StealState>(st)](const v1::SubscriptionNotice& notice) {
        auto state = weak.lock();
        if (!state || !notice.has_overlap()) return;
        const v1::FilterOverlap& o = notice.overlap();
        OverlapEvent e;
        auto sub = state->subscriptions.find(notice.subscription_id());
        if (sub != state->subscriptions.end()) e.port = state->targets[sub->second].route.port;
        e.taken_by = o.taken_by();
        e.client = o.taken_by_client();
        e.requests = o.requests();
        e.method = o.method();
        e.path = o.path();
        state->print(overlapLine(e, state->json));
      });
  env.client->setResumedHandler([weak = std::weak_ptr<StealState>(st)](const absl::Status& cut) {
    if (auto state = weak.lock()) {
      state->print(resumedLine(state->client->endpoint(), std::string(cut.message()), state->json));
    }
  });
  // A dead agent is noticed even with no connection open.
  env.client->setLostHandler([weak = std::weak_ptr<StealState>(st)](const absl::Status& s) {
    if (auto state = weak.lock()) state->sessionLost(s);
  });

  int exit_code = kExitOk;
  std::vector<std::string> lines;
  for (size_t i = 0; i < st->targets.size() && !st->stop_requested; ++i) {
    const StealRoute& route = st->targets[i].route;
    v1::Request request;
    request.mutable_steal()->set_port(route.port);
    request.mutable_steal()->set_flush_connections(flags.flush);
    // The client keeps the request as it is to steal the port again on
    // another agent (failover): the filter goes with it.
    if (flags.filter) *request.mutable_steal()->mutable_http_filter() = *flags.filter;
    auto response = co_await callOrReport(env, std::move(request),
                                          absl::StrCat("steal port ", route.port), &exit_code);
    if (!response.ok()) {
      st->checkLost(response.status());
      break;
    }
    if (!response->has_subscribed()) {
      printError(absl::StrCat("steal port ", route.port,
                              " failed: the agent answered without a subscription"));
      exit_code = kExitError;
      break;
    }
    const v1::Subscribed& sub = response->subscribed();
    st->subscriptions[sub.subscription_id()] = i;
    lines.push_back(stealingLine(route, sub.backend(), sub.subscription_id(), st->json,
                                 flags.filter ? &*flags.filter : nullptr));
  }

  net::error_code ignored;
  if (exit_code != kExitOk) {
    // Nothing was served yet: the parked streams are reset, not half-served,
    // and later ones find no acceptor.
    env.client->setStreamAcceptor(nullptr);
    env.client->setNoticeHandler(nullptr);
    for (auto& [stream, open] : st->waiting) stream->reset(v1::CANCELLED, "siphon steal failed");
    st->waiting.clear();
    (void)co_await unsubscribeAll(env, st);
    st->signals.cancel(ignored);
    co_return exit_code;
  }

  st->started = true;
  for (const auto& line : lines) st->print(line);
  for (auto& [stream, open] : st->waiting) spawnServe(st, std::move(stream), std::move(open));
  st->waiting.clear();

  while (!st->stop_requested && st->lost.ok()) co_await st->done.wait();
  exit_code = co_await unsubscribeAll(env, st);
  if (st->busy() && !st->ending && st->lost.ok()) {
    st->print(stoppingLine(st->live.size() + st->starting, st->json, st->requests.size()));
  }
  while (st->busy() && st->lost.ok()) co_await st->done.wait();
  if (!st->lost.ok()) {
    st->endAll("the session with the agent is lost");
    // The connections' coroutines see their sockets and streams closed and
    // print their last lines.
    while (st->busy()) co_await st->done.wait();
    st->out.flush();
    printError(absl::StrCat("steal: ", st->lost.message()));
    exit_code = errorCodeOf(st->lost) == v1::AGENT_LOST ? kExitUnreachable : kExitError;
  }

  env.client->setStreamAcceptor(nullptr);
  env.client->setLostHandler(nullptr);
  env.client->setDrainingHandler(nullptr);
  env.client->setFailoverHandler(nullptr);
  env.client->setResumedHandler(nullptr);
  env.client->setNoticeHandler(nullptr);
  for (auto& pool : st->pools) pool->closeAll();
  st->signals.cancel(ignored);
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
    auto filter = parseHttpFilter(flags->filter_flags);
    if (!filter.ok()) throw CLI::ValidationError("steal", std::string(filter.status().message()));
    flags->filter = *std::move(filter);
  });
  out.push_back({steal, [flags](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runSteal(env, *flags);
                 }});
}

}  // namespace siphon::cli
