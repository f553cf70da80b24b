// `siphon mirror`: a copy of every TCP connection to a port of the target
// (a mirror Subscription, siphon/client/subscriptions.h). The application
// keeps serving its connections; this client gets their bytes, read-only,
// one MirroredConnection each, and prints them or replays them.
//
//   siphon mirror --port P [--to HOST:PORT | --stdout] [--both]
//
// Order of events:
//  1. The signals are armed and the session's events taken (long_running.h)
//     before the subscribe; connections that arrive before its answer wait
//     in the Subscription (not yet accepted).
//  2. "mirror: port P ..." once subscribed (scripts wait for it).
//  3. Per mirrored connection: accepted as the Subscription hands it out
//     (the agent has no credit to send before, and what it cannot send
//     becomes gaps), an "opened" line,
//     then its records in order: to stdout (mirror_output.h, StdoutFramer:
//     markers between runs), or with --to, the client->server bytes to a
//     fresh connection to HOST:PORT per mirrored connection (its answers
//     are read and thrown away). A gap is one line; the end one "closed"
//     line with the counts.
//  4. First SIGINT/SIGTERM: unsubscribe, end the streams, give the replays
//     a moment to write what they hold, the summary, exit 0. A second
//     signal ends the replays at once.
//  5. With several --agent: after a move to another agent (target.h,
//     kMoved) the port is mirrored there under the same subscription, and
//     that agent's connections arrive as new streams; one "agent A ...;
//     moved to agent B" line.
//
// Nothing waits on stdout or stderr: without --to the streams are read as
// fast as they come (so the agent never falls behind because of us);
// stdout and stderr are written by threads of their own through bounded
// queues (LineWriter), and what does not fit is dropped and said in a line
// (and in the summary), never silently. With --to, a connection's stream
// is read only as fast as its replay server takes the bytes, beyond a
// queue of Replay::kHighWater: a burst waits in the stream's credit and
// the agent's buffer, and what overflows that is a gap the agent reports.
// A replay server that takes nothing for Replay::kStallLimit has failed:
// its connection's bytes are then read at full speed and not replayed.
#include <unistd.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/line_writer.h"
#include "cli/long_running.h"
#include "cli/mirror_output.h"
#include "cli/mirror_replay.h"
#include "cli/steal_spec.h"
#include "siphon/client/errors.h"
#include "siphon/client/subscriptions.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {
namespace {

namespace asio = net::asio;
using Clock = asio::steady_timer::clock_type;
using client::Direction;
using client::ErrorCode;
using client::MirrorEvent;
using client::SubscriptionEvent;

// Raw bytes that may wait for stdout before chunks are dropped.
constexpr size_t kStdoutQueueBytes = 16 << 20;
// At the stop: how long the replays may go on writing what they hold.
constexpr auto kStopGrace = std::chrono::seconds(2);

struct MirrorFlags {
  std::string port;
  std::string to;
  bool to_stdout = false;
  bool both = false;
  MirrorSpec spec;  // set by the subcommand's callback
};

// One mirrored connection.
struct Mirrored {
  MirrorConnection conn;
  client::MirroredConnection mirrored;
  MirrorCounts counts;
  std::shared_ptr<Replay> replay;
  // stdout: bytes not written since the last line about it, per direction.
  uint64_t unwritten[2] = {0, 0};
};

struct MirrorState {
  MirrorState(const CommandEnv& env, MirrorSpec s)
      : json(env.json),
        timeout(env.timeout),
        spec(std::move(s)),
        run(env, "mirror", [this](std::string line) { print(std::move(line)); }) {
    if (!spec.to) out = std::make_unique<LineWriter>(STDOUT_FILENO, kStdoutQueueBytes);
  }

  bool json;
  std::chrono::milliseconds timeout;
  MirrorSpec spec;
  std::vector<net::tcp::endpoint> endpoints;  // of --to

  // stderr lines, and (without --to) the raw bytes on stdout: threads of
  // their own, so neither can stall the streams this loop reads.
  LineWriter err{STDERR_FILENO};
  std::unique_ptr<LineWriter> out;
  StdoutFramer framer;
  // Signals, the session's events, the main loop's wake-up: only runMirror
  // waits on it.
  LongRunning run;

  client::Subscription subscription;
  bool subscribed = false;
  std::map<uint64_t, std::shared_ptr<Mirrored>> live;  // by connection id
  size_t starting = 0;  // spawned serve coroutines that have not run yet
  uint64_t next_connection = 0;
  MirrorTotals totals;

  void print(std::string line) { err.write(std::move(line)); }

  void writeStdout(Mirrored& c, Direction d, std::string_view bytes) {
    const int i = directionIndex(d);
    if (out->tryWrite(framer.frame(c.conn, d, bytes))) {
      reportUnwritten(c, d);
      return;
    }
    framer.notWritten(c.conn, d, bytes.size());
    c.counts.not_written[i] += bytes.size();
    c.unwritten[i] += bytes.size();
  }
  // One line per run of chunks stdout could not take, once it takes one
  // again (or the connection ends).
  void reportUnwritten(Mirrored& c, Direction d) {
    uint64_t& n = c.unwritten[directionIndex(d)];
    if (n == 0) return;
    print(notWrittenLine(c.conn, d, n, json));
    n = 0;
  }

  // Ends every copy (stop, lost session); their coroutines print the rest.
  void resetAll(std::string_view why) {
    std::vector<std::shared_ptr<Mirrored>> all;
    for (auto& [id, c] : live) all.push_back(c);
    for (auto& c : all) c->mirrored.stop(ErrorCode::kCancelled, why);
  }
  void abortReplays() {
    for (auto& [id, c] : live) {
      if (c->replay) c->replay->abort();
    }
  }
  bool busy() const { return !live.empty() || starting > 0; }
};

// How a copy ended, for its closed line: a record the agent got wrong is
// said as such, the rest as closeReason() words them.
std::string endReason(const absl::Status& end) {
  if (client::errorCode(end) == ErrorCode::kProtocolError &&
      absl::StartsWith(end.message(), "malformed mirror record")) {
    return absl::StrCat("malformed record from the agent: ", end.message());
  }
  return closeReason(end);
}

// One mirrored connection, from its event to its end.
net::awaitable<void> serveMirrored(std::shared_ptr<MirrorState> state,
                                   client::MirroredConnection mirrored) {
  const std::shared_ptr<MirrorState> st = std::move(state);
  auto ex = co_await asio::this_coro::executor;

  auto c = std::make_shared<Mirrored>();
  c->conn = mirrorConnection(++st->next_connection, mirrored);
  c->mirrored = std::move(mirrored);
  st->live[c->conn.id] = c;
  --st->starting;
  ++st->totals.connections;
  st->print(openedLine(c->conn, st->json));

  absl::Status end;  // OK: the agent's half-close
  std::string reason;
  if (st->run.stopRequested()) {
    c->mirrored.stop(ErrorCode::kCancelled, "siphon mirror is ending");
    reason = "mirror stopped";
  }

  if (reason.empty() && st->spec.to) {
    std::weak_ptr<MirrorState> weak = st;
    std::weak_ptr<Mirrored> weak_c = c;
    c->replay = std::make_shared<Replay>(
        ex, dialEndpoints(st->endpoints, st->timeout, st->spec.to->to()),
        [weak, weak_c](std::string why) {
          auto s = weak.lock();
          auto m = weak_c.lock();
          if (s && m) s->print(replayFailedLine(m->conn, s->spec.to->to(), why, s->json));
        });
    c->replay->start();
  }

  uint64_t handled = 0;
  while (reason.empty()) {
    // next() returns at once while events are queued: let the other
    // connections and the replay writers run now and then.
    if (++handled % 64 == 0) co_await asio::post(ex, net::use_awaitable);
    auto event = co_await c->mirrored.next();
    if (!event.ok()) {
      end = event.status();
      break;
    }
    if (!*event) break;
    const MirrorEvent& e = **event;
    const Direction d = e.direction;
    switch (e.kind) {
      case MirrorEvent::Kind::kGap:
        c->counts.gaps[directionIndex(d)] += e.gap_bytes;
        st->print(gapLine(c->conn, d, e.gap_bytes, st->json));
        // The replay server gets the bytes on both sides of the hole (the
        // gap line says where it is); stdout gets a marker naming it.
        if (st->out) st->framer.lost(c->conn, d, e.gap_bytes);
        break;
      case MirrorEvent::Kind::kFin:
        if (d == Direction::kClientToServer && c->replay) c->replay->finish();
        break;
      case MirrorEvent::Kind::kData:
        c->counts.bytes[directionIndex(d)] += e.bytes.size();
        if (c->replay) {
          if (d == Direction::kClientToServer) {
            c->replay->push(e.bytes);
            // A replay server behind by kHighWater holds this stream's
            // reads: the burst waits in its credit, not in our memory.
            co_await c->replay->waitForRoom();
          }
        } else if (d == Direction::kClientToServer || st->spec.both) {
          st->writeStdout(*c, d, e.bytes);
        }
        break;
    }
  }
  if (reason.empty()) reason = endReason(end);
  st->run.checkLost(end);

  if (c->replay) {
    c->replay->finish();
    const auto wait = st->run.stopRequested() ? std::chrono::milliseconds(kStopGrace) : st->timeout;
    co_await c->replay->waitDone(Clock::now() + wait);
    if (!c->replay->done()) {
      c->replay->abort();
      co_await c->replay->waitDone(Clock::now() + std::chrono::seconds(1));
    }
    c->counts.replayed = c->replay->written();
    c->counts.not_replayed = c->replay->dropped();
  }
  if (st->out) {
    st->reportUnwritten(*c, Direction::kClientToServer);
    st->reportUnwritten(*c, Direction::kServerToClient);
    st->framer.forget(c->conn.id);
  }
  addCounts(st->totals.counts, c->counts);
  st->print(closedLine(c->conn, c->counts, reason, c->replay != nullptr, st->json));
  st->live.erase(c->conn.id);
  st->run.notify();
}

// What the Subscription hands out, in order, until it is over (given back,
// lost, or not made again after a move).
net::awaitable<void> serveSubscription(std::shared_ptr<MirrorState> state) {
  const std::shared_ptr<MirrorState> st = std::move(state);
  auto ex = co_await asio::this_coro::executor;
  while (true) {
    auto e = co_await st->subscription.next();
    if (!e.ok()) break;
    if (e->kind != SubscriptionEvent::Kind::kMirrored) continue;  // the session's: onLinkEvent
    ++st->starting;
    client::MirroredConnection mirrored = e->mirrored;
    // A connection that throws is reset; the others go on.
    net::spawn(ex, serveMirrored(st, std::move(e->mirrored)), "mirror_connection",
               [mirrored]() mutable { mirrored.stop(ErrorCode::kInternal, "the client failed"); });
  }
  st->run.notify();
}

// Draining and moves, as lines. After a move (several --agent) the port is
// mirrored again on the new agent under the same subscription; its
// connections come as new ones.
void onLinkEvent(MirrorState& st, const client::LinkEvent& e) {
  using Kind = client::LinkEvent::Kind;
  if (e.kind == Kind::kDraining) {
    st.print(mirrorDrainingLine(e.reason, st.json));
    return;
  }
  if (e.kind == Kind::kTargetRestarted) {
    st.print(targetRestartedLine({e.previous_pid, e.pid, e.reason, e.down_ms, e.restarts},
                                 "the mirror goes on", st.json));
    return;
  }
  if (e.kind != Kind::kMoved) return;
  AgentMove move{e.from, e.to, e.reason, e.draining, e.streams, 0, 0};
  st.print(movedLine(move, st.json));
  if (!st.subscribed) return;
  const absl::Status status = st.subscription.status();
  if (status.ok()) return;
  st.subscribed = false;
  st.print(remirrorFailedLine(st.spec.port, e.to, statusText(status), st.json));
  st.run.end(absl::FailedPreconditionError(
      absl::StrCat("port ", st.spec.port, " could not be mirrored again on agent ", e.to)));
}

// The subscribe failed: one line, the exit code.
int subscribeFailed(const MirrorState& st, const absl::Status& s) {
  const std::string what = absl::StrCat("mirror port ", st.spec.port);
  if (client::errorCode(s) == ErrorCode::kUnimplemented) {
    printError(absl::StrCat(what, " failed: this agent does not mirror (", statusText(s),
                            "); it needs a siphon-agent with the mirror service"));
    return kExitError;
  }
  Failure f = requestFailure(what, s);
  printError(f.message);
  return f.exit_code;
}

net::awaitable<int> runMirror(const CommandEnv& env, const MirrorSpec& spec) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<MirrorState>(env, spec);

  // Resolve --to first: a typo fails before the agent starts copying.
  if (spec.to) {
    net::tcp::resolver resolver(ex);
    net::error_code ec;
    auto results = co_await resolver.async_resolve(spec.to->host, std::to_string(spec.to->to_port),
                                                   asio::redirect_error(net::use_awaitable, ec));
    if (ec || results.empty()) {
      printError(absl::StrCat("mirror: cannot resolve ", spec.to->host, ": ",
                              ec ? ec.message() : "no address"));
      co_return kExitError;
    }
    for (const auto& r : results) st->endpoints.push_back(r.endpoint());
  }

  std::weak_ptr<MirrorState> weak = st;
  // A second signal ends the replays at once.
  st->run.on_end = [weak](int) {
    if (auto s = weak.lock()) s->abortReplays();
  };
  st->run.on_event = [weak](const client::LinkEvent& e) {
    if (auto s = weak.lock()) onLinkEvent(*s, e);
  };
  st->run.start();

  client::Subscriptions subscriptions(env.target);
  auto sub = co_await subscriptions.mirror(client::MirrorSpec{spec.port, spec.both});
  if (!sub.ok()) {
    st->run.finish();
    co_return subscribeFailed(*st, sub.status());
  }
  st->subscription = *std::move(sub);
  st->subscribed = true;
  st->print(mirroringLine(spec, st->subscription.backend(), st->subscription.id(), st->json));
  net::spawn(ex, serveSubscription(st), "mirror_subscription");

  while (st->run.running()) co_await st->run.wait();

  int exit_code = kExitOk;
  if (st->run.lost().ok()) {
    st->subscribed = false;
    absl::Status s = co_await st->subscription.unsubscribe();
    if (!s.ok()) st->run.checkLost(s);
    if (!s.ok() && st->run.lost().ok()) {
      Failure f = requestFailure(absl::StrCat("unsubscribe port ", spec.port), s);
      st->err.flush();  // keep the order of the lines before it
      printError(f.message);
      exit_code = f.exit_code;
    }
  }
  // New connections are refused from now on (the subscription is over);
  // the open ones end, their replays get kStopGrace to write what they hold.
  st->resetAll(st->run.lost().ok() ? "siphon mirror stopped"
                                   : "the session with the agent is lost");
  const auto grace_end = Clock::now() + kStopGrace;
  while (st->busy() && !st->run.ending() && Clock::now() < grace_end) {
    co_await st->run.wait(grace_end);
  }
  st->abortReplays();
  while (st->busy()) co_await st->run.wait();

  st->run.finish();
  if (st->out) {
    st->out->flush();
    if (size_t left = st->out->queuedBytes(); left > 0) st->print(stdoutLeftLine(left, st->json));
  }
  st->print(mirrorSummaryLine(st->totals, spec.to.has_value(), st->json));
  if (!st->run.lost().ok()) {
    st->err.flush();
    st->run.reportLost();
    exit_code = st->run.exitCode(exit_code);
  }
  co_return exit_code;
}

}  // namespace

void addMirrorCommands(CLI::App& app, std::vector<Command>& out) {
  auto flags = std::make_shared<MirrorFlags>();
  CLI::App* mirror = app.add_subcommand(
      "mirror",
      "Copy the TCP connections to a port of the target (the application keeps serving them) "
      "and print or replay their bytes; runs until SIGINT/SIGTERM");
  mirror->add_option("-p,--port", flags->port, "Port of the target to mirror (1-65535)")
      ->type_name("PORT")
      ->required();
  mirror
      ->add_option("--to", flags->to,
                   "Replay each connection's client->server bytes to a new connection to this "
                   "server (HOST:PORT, [ADDR]:PORT for IPv6); its answers are thrown away")
      ->type_name("HOST:PORT");
  mirror->add_flag("--stdout", flags->to_stdout,
                   "Write the bytes to stdout, with a marker line before each run (the default "
                   "without --to)");
  mirror->add_flag("--both", flags->both,
                   "Also the server's bytes (responses); with --stdout only");
  mirror->footer(
      "stdout: a marker line before each run of bytes, '>>> #N CLIENT -> SERVER' (the client's "
      "bytes) or '<<< #N CLIENT <- SERVER' (the server's), N numbering the connections; every "
      "marker but the first follows one added newline; a marker also follows bytes that are "
      "missing ('(N bytes missing before these)'). The bytes are written as they are.\n"
      "stderr: one line per connection opened (and whether it was joined mid-stream), per gap "
      "(bytes the agent lost and will never send), per connection closed (why, and its byte "
      "counts), per replay that failed; a summary at the end. With --json each is a JSON "
      "object. Nothing waits for stdout, stderr or a --to server: what they cannot take in time "
      "is dropped and said.\n\n"
      "Examples: siphon mirror --port 80 --both\n"
      "          siphon mirror --port 80 --to 127.0.0.1:8080");
  mirror->callback([flags] {
    auto spec = parseMirrorSpec(flags->port, flags->to, flags->to_stdout, flags->both);
    if (!spec.ok()) throw CLI::ValidationError("mirror", std::string(spec.status().message()));
    flags->spec = *std::move(spec);
  });
  out.push_back({mirror, [flags](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runMirror(env, flags->spec);
                 }});
}

}  // namespace siphon::cli
