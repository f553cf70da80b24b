// `siphon connect` and `siphon forward`: connections made by the agent from
// inside the target (siphon/client/connections.h), joined to stdin/stdout or
// to local TCP connections.
//
//   siphon connect [--udp] HOST:PORT        stdin -> connection -> stdout (like nc)
//   siphon connect --unix PATH [--seqpacket]
//   siphon forward -L [BIND:]LPORT:HOST:PORT [-L ...]
//
// Flow control is end to end: a slow stdout or local client stops the reads
// of the stream, which stops the agent reading the target-side socket.
//
// Signals and the session's loss (long_running.h): connect ends at the first
// SIGINT/SIGTERM with exit 128+N; forward stops listening at the first and
// exits 0, or, when the session is lost for good, exits 3 with one line.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/bridge.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/format.h"
#include "cli/long_running.h"
#include "cli/options.h"
#include "siphon/client/connections.h"
#include "siphon/client/errors.h"
#include "siphon/transport/session_transport.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {
namespace {

namespace asio = net::asio;
using asio::posix::stream_descriptor;
using client::ErrorCode;

// The largest UDP payload (IPv4: 65535 - 8 - 20): one stdin read is one
// datagram, so never read more.
constexpr size_t kMaxDatagram = 65507;

// Asio makes descriptors it waits on non-blocking, which would stay so for
// the shell that shares our stdin/stdout: put the flags back at the end.
class FdFlagsGuard {
 public:
  explicit FdFlagsGuard(int fd) : fd_(fd), flags_(fcntl(fd, F_GETFL)) {}
  ~FdFlagsGuard() {
    if (flags_ >= 0) fcntl(fd_, F_SETFL, flags_);
  }
  FdFlagsGuard(const FdFlagsGuard&) = delete;
  FdFlagsGuard& operator=(const FdFlagsGuard&) = delete;

 private:
  int fd_;
  int flags_;
};

// Coroutines below take their arguments by value and move them into locals
// first: the caller's frame may be gone when they first run, and GCC 12
// drops by-value coroutine parameters the body never names.

// ------------------------------------------------------------- connect

struct ConnectFlags {
  std::string address;
  bool udp = false;
  std::string unix_path;
  bool seqpacket = false;
  std::string wait = "1s";
};

// Both directions of `siphon connect` and how they ended.
struct ConnectState : std::enable_shared_from_this<ConnectState> {
  explicit ConnectState(asio::any_io_executor ex) : in(ex), out(ex), done(ex), idle(ex) {}

  client::Connection stream;
  bool messages = false;  // one stdin read = one datagram / record
  bool udp = false;
  std::chrono::milliseconds wait{1000};
  stream_descriptor in;
  stream_descriptor out;
  net::Signal done;
  asio::steady_timer idle;
  int running = 2;
  bool stdin_done = false;
  bool finished_by_us = false;  // our own reset (UDP idle, a signal): not an error
  int exit_code = kExitOk;
  absl::Status error;  // the first failure, printed once

  void fail(const absl::Status& s, int code) {
    if (!error.ok() || finished_by_us) return;
    error = s;
    exit_code = code;
    stop();
  }
  // Ends both directions.
  void stop() {
    net::error_code ignored;
    in.close(ignored);
    idle.cancel();
  }
  void finishedOne() {
    if (--running == 0) done.notify();
  }
  // UDP has no end of stream: after stdin ends, wait `wait` for more
  // replies, counting from the last one.
  void armIdle() {
    if (!udp || !stdin_done) return;
    idle.expires_after(wait);
    idle.async_wait([weak = weak_from_this()](net::error_code ec) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->finished_by_us = true;
      self->stream.reset(ErrorCode::kCancelled, "done: no reply within the wait");
    });
  }
};

net::awaitable<void> stdinToStream(std::shared_ptr<ConnectState> state) {
  const std::shared_ptr<ConnectState> st = std::move(state);
  std::string buf(st->messages ? kMaxDatagram : kRelayChunk, '\0');
  while (true) {
    net::error_code ec;
    size_t n = co_await st->in.async_read_some(asio::buffer(buf),
                                               asio::redirect_error(net::use_awaitable, ec));
    if (ec == asio::error::eof || (!ec && n == 0)) break;
    if (ec) {
      if (ec != asio::error::operation_aborted) {
        st->stream.reset(ErrorCode::kCancelled, "the client's stdin failed");
        st->fail(absl::InternalError(absl::StrCat("read stdin: ", ec.message())), kExitError);
      }
      st->finishedOne();
      co_return;
    }
    // Message kinds (UDP, seqpacket) send one read as one datagram.
    absl::Status s = co_await st->stream.write(buf.substr(0, n));
    if (!s.ok()) {
      st->fail(s, streamExitCode(s));
      st->finishedOne();
      co_return;
    }
  }
  st->stdin_done = true;
  // "No more from me" (TCP FIN on the target side); replies keep coming.
  absl::Status s = st->stream.halfClose();
  if (!s.ok()) st->fail(s, streamExitCode(s));
  st->armIdle();
  st->finishedOne();
}

net::awaitable<void> streamToStdout(std::shared_ptr<ConnectState> state) {
  const std::shared_ptr<ConnectState> st = std::move(state);
  while (true) {
    auto chunk = co_await st->stream.read();
    if (!chunk.ok()) {
      st->fail(chunk.status(), streamExitCode(chunk.status()));
      break;
    }
    if (!chunk->has_value()) break;  // the target side closed its end
    net::error_code ec;
    co_await asio::async_write(st->out, asio::buffer(**chunk),
                               asio::redirect_error(net::use_awaitable, ec));
    if (ec) {
      st->stream.reset(ErrorCode::kCancelled, "the client's stdout is closed");
      st->fail(absl::InternalError(absl::StrCat("write stdout: ", ec.message())), kExitError);
      break;
    }
    st->armIdle();
  }
  st->finishedOne();
}

net::awaitable<int> runConnect(const CommandEnv& env, const ConnectFlags& flags) {
  auto ex = co_await asio::this_coro::executor;
  client::Connections connections(env.target);
  absl::StatusOr<client::Connection> connection;
  auto state = std::make_shared<ConnectState>(ex);
  state->messages = flags.udp || flags.seqpacket;
  state->udp = flags.udp;
  state->wait = *parseDuration(flags.wait);

  if (!flags.unix_path.empty()) {
    if (flags.seqpacket) {
      connection = co_await connections.connectSeqpacket(flags.unix_path);
    } else {
      connection = co_await connections.connectUnix(flags.unix_path);
    }
  } else {
    std::string host, port;
    // Checked at parse time (connect's callback); cannot fail here.
    (void)net::splitHostPort(flags.address, &host, &port);
    const auto port_number = static_cast<uint16_t>(std::stoul(port));
    if (flags.udp) {
      connection = co_await connections.connectUdp(host, port_number);
    } else {
      connection = co_await connections.connectTcp(host, port_number);
    }
  }
  if (!connection.ok()) {
    // The agent's message names the connection and the reason ("connect
    // 10.0.0.1:80 from the target: Connection refused").
    printError(std::string(connection.status().message()));
    co_return streamExitCode(connection.status());
  }
  state->stream = *std::move(connection);

  // A closed pipe on stdout is an error to report, not a signal to die of
  // (LongRunning::start ignores SIGPIPE).
  LongRunning run(env, "connect");
  run.on_stop = [state](int signo) {
    state->finished_by_us = true;
    state->exit_code = 128 + signo;
    state->stream.reset(ErrorCode::kCancelled, "interrupted");
    state->stop();
  };
  run.start();
  FdFlagsGuard in_flags(STDIN_FILENO);
  FdFlagsGuard out_flags(STDOUT_FILENO);
  state->in.assign(::dup(STDIN_FILENO));
  state->out.assign(::dup(STDOUT_FILENO));

  // A direction that throws fails the command (once) and counts as ended,
  // so the wait below still finishes.
  auto fail = [state] {
    state->fail(absl::InternalError("connect: a copy loop failed"), kExitError);
    state->finishedOne();
  };
  net::spawn(ex, stdinToStream(state), "connect_stdin", fail);
  net::spawn(ex, streamToStdout(state), "connect_stdout", fail);
  while (state->running > 0) co_await state->done.wait();

  run.finish();
  net::error_code ignored;
  state->idle.cancel();
  state->in.close(ignored);
  state->out.close(ignored);
  if (!state->error.ok()) printError(std::string(state->error.message()));
  co_return state->exit_code;
}

// ------------------------------------------------------------- forward

struct ForwardSpec {
  std::string bind = "127.0.0.1";
  uint16_t local_port = 0;
  std::string host;
  uint16_t port = 0;
};

// "[BIND:]LPORT:HOST:PORT"; IPv6 addresses in brackets; BIND "*" or empty
// is every address (0.0.0.0).
absl::StatusOr<ForwardSpec> parseForwardSpec(std::string_view in) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad forward '", std::string(in),
                                                   "': ", std::string(why),
                                                   " (want [BIND:]LPORT:HOST:PORT)"));
  };
  std::vector<std::string> parts(1);
  int depth = 0;
  for (char c : in) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0 || depth > 1) return bad("unbalanced brackets");
    if (c == ':' && depth == 0) {
      parts.emplace_back();
    } else {
      parts.back().push_back(c);
    }
  }
  if (depth != 0) return bad("unbalanced brackets");
  if (parts.size() != 3 && parts.size() != 4) return bad("wrong number of ':'-separated parts");
  auto unbracket = [](std::string s) {
    if (s.size() >= 2 && s.front() == '[' && s.back() == ']') return s.substr(1, s.size() - 2);
    return s;
  };
  auto port = [](const std::string& s, uint16_t* out) {
    uint32_t v = 0;
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos ||
        !absl::SimpleAtoi(s, &v) || v > 65535) {
      return false;
    }
    *out = static_cast<uint16_t>(v);
    return true;
  };
  ForwardSpec spec;
  size_t i = 0;
  if (parts.size() == 4) {
    spec.bind = unbracket(parts[i++]);
    if (spec.bind.empty() || spec.bind == "*") spec.bind = "0.0.0.0";
  }
  if (!port(parts[i++], &spec.local_port))
    return bad("local port must be a number from 0 to 65535");
  spec.host = unbracket(parts[i++]);
  if (spec.host.empty()) return bad("no target host");
  if (!port(parts[i], &spec.port) || spec.port == 0) {
    return bad("target port must be a number from 1 to 65535");
  }
  return spec;
}

struct ForwardState {
  explicit ForwardState(const CommandEnv& env) : connections(env.target), run(env, "forward", LongRunning::toStderr()) {}
  client::Connections connections;
  // Signals and the session's loss; only runForward waits on it.
  LongRunning run;
  std::vector<std::shared_ptr<net::tcp::acceptor>> acceptors;
  bool stopping = false;
  int exit_code = kExitOk;

  void stop(int code) {
    if (stopping) return;
    stopping = true;
    exit_code = code;
    net::error_code ignored;
    for (auto& a : acceptors) a->close(ignored);
    run.notify();
  }
};

net::awaitable<void> forwardOne(std::shared_ptr<ForwardState> state,
                                std::shared_ptr<net::tcp::socket> socket, ForwardSpec spec_in) {
  const std::shared_ptr<ForwardState> st = std::move(state);
  const std::shared_ptr<net::tcp::socket> sock = std::move(socket);
  const ForwardSpec spec = std::move(spec_in);
  auto connection = co_await st->connections.connectTcp(spec.host, spec.port);
  if (!connection.ok()) {
    if (!st->stopping) printError(std::string(connection.status().message()));
    net::error_code ignored;
    sock->set_option(asio::socket_base::linger(true, 0), ignored);
    sock->close(ignored);
    // Without a session no connection can work again: stop.
    if (client::errorCode(connection.status()) == ErrorCode::kAgentLost) {
      st->stop(kExitUnreachable);
    }
    co_return;
  }
  // Each accepted connection and its stream, both ways (bridge.h's defaults:
  // a failure on one side aborts the other).
  std::make_shared<Bridge>(std::move(*sock), *std::move(connection))->start();
}

net::awaitable<void> acceptLoop(std::shared_ptr<ForwardState> state,
                                std::shared_ptr<net::tcp::acceptor> acceptor, ForwardSpec spec_in) {
  const std::shared_ptr<ForwardState> st = std::move(state);
  const std::shared_ptr<net::tcp::acceptor> acc = std::move(acceptor);
  const ForwardSpec spec = std::move(spec_in);
  auto ex = co_await asio::this_coro::executor;
  while (!st->stopping) {
    auto sock = std::make_shared<net::tcp::socket>(ex);
    net::error_code ec;
    co_await acc->async_accept(*sock, asio::redirect_error(net::use_awaitable, ec));
    if (st->stopping || ec == asio::error::operation_aborted) break;
    if (ec) {
      // EMFILE and the like: say so, and keep serving (a moment later).
      printError(absl::StrCat("forward: accept: ", ec.message()));
      asio::steady_timer pause(ex, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(net::use_awaitable, ec));
      continue;
    }
    // One forwarded connection that throws closes that connection only.
    net::spawn(ex, forwardOne(st, sock, spec), "forward_connection", [sock] {
      net::error_code ignored;
      sock->close(ignored);
    });
  }
}

std::string endpointText(const net::tcp::endpoint& ep) {
  std::string ip = ep.address().to_string();
  return hostPort(ip, ep.port());
}

net::awaitable<int> runForward(const CommandEnv& env, const std::vector<std::string>& specs_text) {
  auto ex = co_await asio::this_coro::executor;
  auto state = std::make_shared<ForwardState>(env);
  std::vector<ForwardSpec> specs;
  for (const auto& text : specs_text) specs.push_back(*parseForwardSpec(text));  // checked at parse

  std::vector<std::string> lines;
  for (const auto& spec : specs) {
    net::error_code ec;
    net::tcp::resolver resolver(ex);
    auto results = co_await resolver.async_resolve(spec.bind, std::to_string(spec.local_port),
                                                   net::tcp::resolver::passive,
                                                   asio::redirect_error(net::use_awaitable, ec));
    if (ec || results.empty()) {
      printError(absl::StrCat("forward: cannot resolve ", spec.bind, ": ", ec.message()));
      state->stop(kExitError);
      co_return kExitError;
    }
    net::tcp::endpoint ep = results.begin()->endpoint();
    auto acceptor = std::make_shared<net::tcp::acceptor>(ex);
    acceptor->open(ep.protocol(), ec);
    if (!ec) acceptor->set_option(net::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor->bind(ep, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      printError(absl::StrCat("forward: cannot listen on ", endpointText(ep), ": ", ec.message()));
      state->stop(kExitError);
      co_return kExitError;
    }
    lines.push_back(absl::StrCat("forwarding ", endpointText(acceptor->local_endpoint()), " -> ",
                                 hostPort(spec.host, spec.port), " (from the target)"));
    state->acceptors.push_back(acceptor);
  }
  std::weak_ptr<ForwardState> weak = state;
  state->run.on_stop = [weak](int) {
    if (auto s = weak.lock()) s->stop(kExitOk);
  };
  state->run.start();
  for (size_t i = 0; i < specs.size(); ++i) {
    net::spawn(ex, acceptLoop(state, state->acceptors[i], specs[i]), "forward_accept",
               [state] { state->stop(kExitError); });
  }
  // Once every listener is up, so that a script can wait for these lines.
  for (const auto& line : lines) std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);

  while (!state->stopping && state->run.lost().ok()) co_await state->run.wait();
  if (!state->stopping) {
    // Gone for good: no connection could be made any more.
    state->run.reportLost();
    state->stop(state->run.exitCode(kExitOk));
  }
  state->run.finish();
  co_return state->exit_code;
}

}  // namespace

void addNetCommands(CLI::App& app, std::vector<Command>& out) {
  auto cf = std::make_shared<ConnectFlags>();
  CLI::App* connect = app.add_subcommand(
      "connect",
      "Connect from inside the target and join stdin/stdout to the connection (like nc)");
  connect->add_option("address", cf->address, "HOST:PORT as the target sees it ([v6]:PORT)");
  CLI::Option* udp = connect->add_flag(
      "-u,--udp", cf->udp, "UDP: each stdin read is one datagram, each reply one write to stdout");
  CLI::Option* unix_path = connect->add_option(
      "--unix", cf->unix_path,
      "Unix socket: a PATH inside the target's root (symlinks resolve there), or @NAME for an "
      "abstract socket of the target's network namespace");
  connect
      ->add_flag("--seqpacket", cf->seqpacket,
                 "With --unix: a SOCK_SEQPACKET socket (each stdin read is one record)")
      ->needs(unix_path);
  connect
      ->add_option("-w,--wait", cf->wait,
                   "UDP: after stdin ends, keep printing replies until none came for this long")
      ->capture_default_str();
  udp->excludes(unix_path);
  connect->callback([cf] {
    if (cf->unix_path.empty() == cf->address.empty()) {
      throw CLI::ValidationError("connect", "give either HOST:PORT or --unix PATH");
    }
    if (!cf->address.empty()) {
      std::string host, port;
      absl::Status s = net::splitHostPort(cf->address, &host, &port);
      if (s.ok() && std::stoul(port) == 0) {
        s = absl::InvalidArgumentError("port 0 cannot be connected to");
      }
      if (!s.ok()) throw CLI::ValidationError("connect", std::string(s.message()));
    }
    auto wait = parseDuration(cf->wait);
    if (!wait.ok()) {
      throw CLI::ValidationError("--wait", std::string(wait.status().message()));
    }
  });
  out.push_back({connect, [cf](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runConnect(env, *cf);
                 }});

  auto specs = std::make_shared<std::vector<std::string>>();
  CLI::App* forward = app.add_subcommand(
      "forward",
      "Listen locally and forward each connection to HOST:PORT, connected from inside the "
      "target; runs until SIGINT/SIGTERM");
  forward
      ->add_option("-L,--local", *specs,
                   "[BIND:]LPORT:HOST:PORT; BIND defaults to 127.0.0.1 (\"*\": every address), "
                   "LPORT 0 picks a free port (printed); repeatable")
      ->required()
      ->allow_extra_args(false)
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            auto spec = parseForwardSpec(s);
            return spec.ok() ? std::string() : std::string(spec.status().message());
          },
          "[BIND:]LPORT:HOST:PORT"));
  out.push_back({forward, [specs](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runForward(env, *specs);
                 }});
}

}  // namespace siphon::cli
