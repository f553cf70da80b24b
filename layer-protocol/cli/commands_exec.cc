// `siphon exec`: a local program, any program, run as if it ran inside the
// target (docs/EXEC.md).
//
//   siphon exec [OPTIONS] -- COMMAND [ARGS...]
//
// The program runs in namespaces of its own (exec/sandbox.h): every TCP
// connection it makes arrives at siphon's listeners and is made from the
// target through the agent (client::Connections, as `siphon forward` makes
// its connections) or from this machine (loopback by default; --local,
// --remote and --remote-loopback choose per destination, exec/policy.h).
// Its UDP arrives as IP packets on a TUN device and each flow is a UDP
// connection of the agent's. Names resolve as the target resolves them: its
// resolv.conf and hosts are shown at /etc in the program's view, and the
// lookups themselves are UDP and TCP like any other traffic, sent to the
// target's nameservers from the target (a file the target lacks is what
// libc makes of it). Its environment is the target's over the local one,
// but for the variables that would choose the code run here (LD_PRELOAD,
// BASH_ENV...: exec::kCodeChoosing, unless --env-allow); its hostname is
// the target's. It holds 0, 1, 2 and --keep-fd's descriptors, nothing else
// of siphon's (exec/fds.h).
//
// siphon exits with the program's exit code (128+N for signal N); SIGINT,
// SIGTERM and SIGHUP go to its process group. A session lost for good
// (no agent left for --agent-lost-timeout) stops the program with SIGTERM
// (SIGKILL 10 s later) and exits 3 with a line that says why.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/bridge.h"
#include "cli/command.h"
#include "cli/exec_config.h"
#include "kube/kubectl.h"
#include "cli/exec_incoming.h"
#include "cli/exit_codes.h"
#include "cli/format.h"
#include "cli/json_writer.h"
#include "cli/long_running.h"
#include "cli/options.h"
#include "exec/packet.h"
#include "exec/policy.h"
#include "exec/sandbox.h"
#include "fuse/fuse_mount.h"
#include "siphon/client/connections.h"
#include "siphon/client/env.h"
#include "siphon/client/errors.h"
#include "siphon/client/files.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

extern char** environ;

namespace siphon::cli {
namespace {

namespace asio = net::asio;
using client::ErrorCode;
using exec::Via;

constexpr size_t kChunk = 64 * 1024;
// How long a connection to this machine may take to answer.
constexpr auto kLocalConnectTimeout = std::chrono::seconds(10);
// After the program ends: how long its connections may take to pass on
// what it wrote before siphon closes the session.
constexpr auto kDrainAfterExit = std::chrono::seconds(5);
// After SIGTERM for a lost session: then SIGKILL.
constexpr auto kStopGrace = std::chrono::seconds(10);
// A UDP flow with no datagram either way for this long is closed (a DNS
// one sooner: each lookup is a flow of its own).
constexpr auto kUdpIdle = std::chrono::seconds(60);
constexpr auto kDnsIdle = std::chrono::seconds(5);
// Datagrams held per flow while the agent makes its socket (and while a
// flow's writes wait), and bytes held for all flows; more are dropped, as
// a full socket buffer would. A resolver's first burst (dnsperf keeps 100
// queries in flight on one socket) fits: 64 lost 36 of every such burst.
constexpr size_t kUdpPendingMax = 1024;
constexpr size_t kUdpPendingBytes = 16 << 20;
constexpr size_t kUdpFlowsMax = 4096;

// Coroutines take their arguments by value and move them into locals first
// (GCC 12: see commands_net.cc).

struct ExecState;
void killDescendants();

// A connection of the program made by the agent: counted while it lives.
class ExecBridge : public Bridge {
 public:
  ExecBridge(net::tcp::socket local_socket, client::Connection s, std::weak_ptr<ExecState> state)
      : Bridge(std::move(local_socket), std::move(s)), state_(std::move(state)) {}

 protected:
  void finished() override;

 private:
  std::weak_ptr<ExecState> state_;
};

// A connection of the program made from this machine: two local sockets
// joined both ways, with the same semantics as Bridge (EOF is a half-close,
// a failure an abort of the other side).
struct LocalSplice : std::enable_shared_from_this<LocalSplice> {
  LocalSplice(net::tcp::socket a_in, net::tcp::socket b_in, std::weak_ptr<ExecState> s)
      : a(std::move(a_in)), b(std::move(b_in)), state(std::move(s)) {}
  net::tcp::socket a;  // the program's
  net::tcp::socket b;  // ours, to the destination
  std::weak_ptr<ExecState> state;
  int running = 2;

  void start();
  void done();
  static net::awaitable<void> pump(std::shared_ptr<LocalSplice> self, bool a_to_b);
};

struct UdpFlowState {
  exec::UdpFlow flow;  // as the program sent it (answers come from its destination)
  std::string dst;     // where it goes (a stand-in's nameserver, else the flow's)
  Via via = Via::kTarget;
  client::Connection conn;                     // kTarget, once made
  std::optional<asio::ip::udp::socket> local;  // kLocal
  std::deque<std::string> pending;             // payloads not sent yet
  std::deque<std::string> pending_packets;     // their packets, before the socket exists (ICMP)
  bool ready = false;
  bool sending = false;
  bool closed = false;
  asio::steady_timer::time_point last;
};

struct ExecState : std::enable_shared_from_this<ExecState> {
  ExecState(const CommandEnv& env, asio::any_io_executor ex)
      : executor(ex),
        connections(env.target),
        run(env, "exec", [json = env.json](std::string line) { printLine(std::move(line), json); }),
        json(env.json),
        hup(ex),
        chld(ex),
        tun(ex),
        sweep(ex) {}

  asio::any_io_executor executor;
  client::Connections connections;
  LongRunning run;
  bool json = false;
  exec::Routes routes;
  // Stand-ins for the target's loopback nameservers (exec/policy.h):
  // always sent to the target, to the address they stand for.
  std::map<std::string, std::string> stand_ins;
  // Where a destination the program used goes: a stand-in to the target's
  // nameserver, anything else where the routes say.
  Via resolve(std::string* address, uint16_t port) const {
    auto it = stand_ins.find(*address);
    if (it == stand_ins.end()) return routes.route(*address, port);
    *address = it->second;
    return Via::kTarget;
  }
  pid_t pid = -1;
  std::vector<std::shared_ptr<net::tcp::acceptor>> acceptors;
  asio::signal_set hup;
  asio::signal_set chld;
  asio::posix::stream_descriptor tun;
  asio::steady_timer sweep;
  std::map<exec::UdpFlow, std::shared_ptr<UdpFlowState>> flows;
  size_t udp_pending_bytes = 0;  // in every flow's pending and pending_packets
  size_t connections_open = 0;
  std::optional<int> exit_code;  // the program's, once it ended
  bool stopping = false;         // the program ended: no new work
  // A signal that came before the program ran: sent to it once it does.
  int pending_signal = 0;
  std::shared_ptr<ExecIncoming> incoming;

  static void printLine(std::string line, bool json) {
    (void)json;
    if (!line.empty() && line.back() != '\n') line.push_back('\n');
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
  void event(JsonLine line) {
    if (!json) return;
    printLine(line.take(), true);
  }
  void connectionEvent(std::string_view proto, const exec::Destination& d, Via via,
                       const absl::Status& s) {
    if (!json) return;
    JsonLine line("connection");
    line.add("protocol", proto)
        .add("to", hostPort(d.address, d.port))
        .add("via", via == Via::kTarget ? "target" : "local")
        .addBool("ok", s.ok());
    if (!s.ok()) line.add("error", sv(s.message()));
    event(std::move(line));
  }

  // Reaps the program and every orphan of it (siphon is their subreaper),
  // never a child whose owner reaps it (kube::ownedChild: a --target
  // session's kubectl calls, port-forwards and pod watch).
  void reap() {
    if (pid <= 0) return;
    while (true) {
      int status = 0;
      pid_t r = exit_code ? 0 : ::waitpid(pid, &status, WNOHANG);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        // Peeked first: a child of someone else's stays for its owner.
        siginfo_t next{};
        if (::waitid(P_ALL, 0, &next, WEXITED | WNOHANG | WNOWAIT) != 0) {
          if (errno == EINTR) continue;
          break;
        }
        if (next.si_pid <= 0 || kube::ownedChild(next.si_pid)) break;
        r = ::waitpid(next.si_pid, &status, WNOHANG);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
      }
      if (r == pid && !exit_code) {
        exit_code = exec::exitCodeOf(status);
        // What it leaves goes with it: nothing of the program outlives it.
        killDescendants();
        stopServing();
        run.notify();
      }
    }
  }
  void armChld() {
    chld.async_wait([weak = weak_from_this()](net::error_code ec, int) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->reap();
      if (!self->exit_code) self->armChld();
    });
  }
  void armHup() {
    hup.async_wait([weak = weak_from_this()](net::error_code ec, int signo) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->signalProgram(signo);
      self->armHup();
    });
  }
  void signalProgram(int signo) {
    if (pid <= 0) {
      pending_signal = signo;
      return;
    }
    if (!exit_code) ::kill(-pid, signo);
  }
  // No new connections or datagrams (the program is gone).
  void stopServing() {
    stopping = true;
    net::error_code ignored;
    for (auto& a : acceptors) a->close(ignored);
    tun.close(ignored);
    sweep.cancel();
    for (auto& [flow, f] : flows) closeFlow(*f);
    flows.clear();
  }
  void connectionDone() {
    if (connections_open > 0) --connections_open;
    run.notify();
  }
  size_t open() const { return connections_open + (incoming ? incoming->open() : 0); }

  // ------------------------------------------------------------ UDP
  void closeFlow(UdpFlowState& f) {
    if (f.closed) return;
    f.closed = true;
    while (!f.pending.empty()) popPending(f);
    if (f.conn.stream()) f.conn.reset(ErrorCode::kCancelled, "the program's UDP flow ended");
    if (f.local) {
      net::error_code ignored;
      f.local->close(ignored);
    }
  }
  // The oldest pending datagram, out of the count.
  std::string popPending(UdpFlowState& f) {
    std::string payload = std::move(f.pending.front());
    f.pending.pop_front();
    udp_pending_bytes -= payload.size() + f.pending_packets.front().size();
    f.pending_packets.pop_front();
    return payload;
  }
  void writeTun(const std::string& packet) {
    if (!tun.is_open()) return;
    // A TUN write takes the whole packet or fails: a datagram lost, as UDP
    // may lose one.
    (void)!::write(tun.native_handle(), packet.data(), packet.size());
  }
  void armSweep() {
    sweep.expires_after(std::chrono::seconds(1));
    sweep.async_wait([weak = weak_from_this()](net::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->stopping) return;
      const auto now = asio::steady_timer::clock_type::now();
      for (auto it = self->flows.begin(); it != self->flows.end();) {
        UdpFlowState& f = *it->second;
        const auto idle = f.flow.dst_port == 53 ? kDnsIdle : kUdpIdle;
        if (f.ready && !f.sending && now - f.last > idle) {
          self->closeFlow(f);
          it = self->flows.erase(it);
        } else {
          ++it;
        }
      }
      self->armSweep();
    });
  }
  void dropFlow(const std::shared_ptr<UdpFlowState>& f) {
    closeFlow(*f);
    auto it = flows.find(f->flow);
    if (it != flows.end() && it->second == f) flows.erase(it);
  }
};

// Every process left of the program (its process group, and what it
// started in sessions of their own: orphans come to siphon, the
// subreaper): killed and reaped.
void killDescendants() {
  // The program and all it starts live in the sandbox's network namespace;
  // siphon's own helpers (the kubectl port-forward of --target) in ours.
  std::error_code own_ec;
  const auto own_netns = std::filesystem::read_symlink("/proc/self/ns/net", own_ec);
  for (int round = 0; round < 50; ++round) {
    std::vector<pid_t> children;
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      std::ifstream in(task.path() / "children");
      pid_t child;
      while (in >> child) {
        std::error_code child_ec;
        const auto netns = std::filesystem::read_symlink(
            std::filesystem::path("/proc") / std::to_string(child) / "ns/net", child_ec);
        if (!own_ec && !child_ec && netns == own_netns) continue;
        children.push_back(child);
      }
    }
    if (children.empty()) return;
    for (pid_t child : children) ::kill(child, SIGKILL);
    // Each one's death makes its own children ours: the next round.
    for (pid_t child : children) {
      while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }
}

void ExecBridge::finished() {
  if (auto s = state_.lock()) s->connectionDone();
}

void LocalSplice::start() {
  auto ex = a.get_executor();
  auto fail = [self = shared_from_this()] {
    abortSocket(self->a);
    abortSocket(self->b);
  };
  net::spawn(ex, pump(shared_from_this(), true), "exec_local_a_to_b", fail);
  net::spawn(ex, pump(shared_from_this(), false), "exec_local_b_to_a", fail);
}

void LocalSplice::done() {
  if (--running > 0) return;
  net::error_code ignored;
  a.close(ignored);
  b.close(ignored);
  if (auto s = state.lock()) s->connectionDone();
}

net::awaitable<void> LocalSplice::pump(std::shared_ptr<LocalSplice> self_in, bool a_to_b) {
  const std::shared_ptr<LocalSplice> self = std::move(self_in);
  net::tcp::socket& from = a_to_b ? self->a : self->b;
  net::tcp::socket& to = a_to_b ? self->b : self->a;
  std::string buf(kChunk, '\0');
  while (true) {
    net::error_code ec;
    const size_t n = co_await from.async_read_some(asio::buffer(buf),
                                                   asio::redirect_error(net::use_awaitable, ec));
    if (ec == asio::error::eof) {
      net::error_code ignored;
      to.shutdown(net::tcp::socket::shutdown_send, ignored);
      break;
    }
    if (ec) {
      // A reset one side is a reset the other.
      abortSocket(to);
      abortSocket(from);
      break;
    }
    co_await asio::async_write(to, asio::buffer(buf.data(), n),
                               asio::redirect_error(net::use_awaitable, ec));
    if (ec) {
      abortSocket(to);
      abortSocket(from);
      break;
    }
  }
  self->done();
}

// One connection of the program: made where the routes say, or reset (the
// program sees the connection fail as the network failed it).
net::awaitable<void> serveConnection(std::shared_ptr<ExecState> state_in,
                                     std::shared_ptr<net::tcp::socket> socket_in) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const std::shared_ptr<net::tcp::socket> sock = std::move(socket_in);
  auto dest = exec::originalDestination(sock->native_handle());
  if (!dest.ok()) {
    abortSocket(*sock);
    st->connectionDone();
    co_return;
  }
  const Via via = st->resolve(&dest->address, dest->port);
  net::error_code ec;
  sock->set_option(net::tcp::no_delay(true), ec);
  if (via == Via::kLocal) {
    net::tcp::socket out(st->executor);
    auto address = asio::ip::make_address(dest->address, ec);
    absl::Status s;
    if (ec) {
      s = absl::InvalidArgumentError(ec.message());
    } else {
      // (No co_await inside ?: with GCC 12.)
      std::vector<net::tcp::endpoint> endpoints;
      endpoints.emplace_back(address, dest->port);
      s = co_await connectLocal(out, std::move(endpoints), kLocalConnectTimeout,
                                hostPort(dest->address, dest->port));
    }
    st->connectionEvent("tcp", *dest, via, s);
    if (!s.ok() || st->stopping) {
      abortSocket(*sock);
      st->connectionDone();
      co_return;
    }
    std::make_shared<LocalSplice>(std::move(*sock), std::move(out), st)->start();
    co_return;
  }
  auto connection = co_await st->connections.connectTcp(dest->address, dest->port);
  st->connectionEvent("tcp", *dest, via, connection.status());
  if (!connection.ok() || st->stopping) {
    abortSocket(*sock);
    st->run.checkLost(connection.status());
    st->connectionDone();
    co_return;
  }
  std::make_shared<ExecBridge>(std::move(*sock), *std::move(connection), st)->start();
}

net::awaitable<void> acceptLoop(std::shared_ptr<ExecState> state_in,
                                std::shared_ptr<net::tcp::acceptor> acceptor_in) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const std::shared_ptr<net::tcp::acceptor> acc = std::move(acceptor_in);
  while (!st->stopping) {
    auto sock = std::make_shared<net::tcp::socket>(st->executor);
    net::error_code ec;
    co_await acc->async_accept(*sock, asio::redirect_error(net::use_awaitable, ec));
    if (st->stopping || ec == asio::error::operation_aborted) break;
    if (ec) {
      // EMFILE and the like: say so, and keep serving (a moment later).
      printError(absl::StrCat("exec: accept: ", ec.message()));
      asio::steady_timer pause(st->executor, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(net::use_awaitable, ec));
      continue;
    }
    ++st->connections_open;
    net::spawn(st->executor, serveConnection(st, sock), "exec_connection", [st, sock] {
      abortSocket(*sock);
      st->connectionDone();
    });
  }
}

// ------------------------------------------------------------ UDP

// Sends what a flow holds, in order, one datagram at a time.
net::awaitable<void> sendFlow(std::shared_ptr<ExecState> state_in,
                              std::shared_ptr<UdpFlowState> flow_in) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const std::shared_ptr<UdpFlowState> f = std::move(flow_in);
  f->sending = true;
  while (!f->pending.empty() && !f->closed) {
    std::string payload = st->popPending(*f);
    if (f->via == Via::kTarget) {
      absl::Status s = co_await f->conn.write(std::move(payload));
      if (!s.ok()) {
        st->run.checkLost(s);
        st->dropFlow(f);
        break;
      }
    } else {
      net::error_code ec;
      co_await f->local->async_send(asio::buffer(payload),
                                    asio::redirect_error(net::use_awaitable, ec));
      if (ec && ec != asio::error::connection_refused) {
        st->dropFlow(f);
        break;
      }
    }
  }
  f->sending = false;
}

// The answers of a flow, back to the program as packets.
net::awaitable<void> receiveFlow(std::shared_ptr<ExecState> state_in,
                                 std::shared_ptr<UdpFlowState> flow_in) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const std::shared_ptr<UdpFlowState> f = std::move(flow_in);
  std::string buf;
  while (!f->closed) {
    std::string payload;
    if (f->via == Via::kTarget) {
      auto chunk = co_await f->conn.read();
      if (!chunk.ok() || !chunk->has_value()) {
        // The destination refused (ICMP to the agent's socket): the same
        // to the program's. Anything else ends the flow quietly.
        if (!chunk.ok() && !f->closed && absl::StrContains(chunk.status().message(), "refused")) {
          exec::UdpFlow sent = f->flow;  // the program's datagram, as it went
          std::swap(sent.src, sent.dst);
          std::swap(sent.src_port, sent.dst_port);
          st->writeTun(exec::buildPortUnreachable(f->flow, exec::buildUdpReply(sent, "")));
        }
        if (!chunk.ok()) st->run.checkLost(chunk.status());
        break;
      }
      payload = std::move(**chunk);
    } else {
      buf.resize(65536);
      net::error_code ec;
      const size_t n = co_await f->local->async_receive(
          asio::buffer(buf), asio::redirect_error(net::use_awaitable, ec));
      if (ec == asio::error::connection_refused) continue;
      if (ec) break;
      payload.assign(buf.data(), n);
    }
    f->last = asio::steady_timer::clock_type::now();
    st->writeTun(exec::buildUdpReply(f->flow, payload));
  }
  st->dropFlow(f);
}

net::awaitable<void> openFlow(std::shared_ptr<ExecState> state_in,
                              std::shared_ptr<UdpFlowState> flow_in) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const std::shared_ptr<UdpFlowState> f = std::move(flow_in);
  const std::string dst = f->dst;
  const exec::Destination dest{dst, f->flow.dst_port, false};
  absl::Status status;
  if (f->via == Via::kTarget) {
    auto conn = co_await st->connections.connectUdp(dst, f->flow.dst_port);
    status = conn.status();
    if (conn.ok()) f->conn = *std::move(conn);
  } else {
    net::error_code ec;
    auto address = asio::ip::make_address(dst, ec);
    if (!ec) {
      f->local.emplace(st->executor);
      f->local->open(address.is_v6() ? asio::ip::udp::v6() : asio::ip::udp::v4(), ec);
      if (!ec) f->local->connect(asio::ip::udp::endpoint(address, f->flow.dst_port), ec);
    }
    if (ec) status = absl::UnavailableError(absl::StrCat("udp ", dst, ": ", ec.message()));
  }
  st->connectionEvent("udp", dest, f->via, status);
  if (!status.ok() || f->closed) {
    // Unreachable from where it would be sent: the program hears so.
    if (!status.ok()) {
      for (const std::string& packet : f->pending_packets) {
        st->writeTun(exec::buildPortUnreachable(f->flow, packet));
      }
      st->run.checkLost(status);
    }
    st->dropFlow(f);
    co_return;
  }
  f->ready = true;
  f->last = asio::steady_timer::clock_type::now();
  net::spawn(st->executor, receiveFlow(st, f), "exec_udp_receive", [st, f] { st->dropFlow(f); });
  co_await sendFlow(st, f);
}

void onDatagram(const std::shared_ptr<ExecState>& st, std::string packet) {
  auto udp = exec::parseUdp(packet);
  if (!udp) return;  // not a whole UDP datagram (router solicitations...)
  std::shared_ptr<UdpFlowState>& slot = st->flows[udp->flow];
  const bool fresh = slot == nullptr;
  if (fresh) {
    if (st->flows.size() > kUdpFlowsMax) {
      st->flows.erase(udp->flow);
      return;  // dropped, as a full table would
    }
    slot = std::make_shared<UdpFlowState>();
    slot->flow = udp->flow;
    slot->dst = udp->flow.dstAddress();
    slot->via = st->resolve(&slot->dst, udp->flow.dst_port);
  }
  std::shared_ptr<UdpFlowState> f = slot;
  f->last = asio::steady_timer::clock_type::now();
  std::string quoted = f->ready ? std::string() : packet;
  if (f->pending.size() >= kUdpPendingMax ||
      st->udp_pending_bytes + udp->payload.size() + quoted.size() > kUdpPendingBytes) {
    return;
  }
  st->udp_pending_bytes += udp->payload.size() + quoted.size();
  f->pending.emplace_back(udp->payload);
  f->pending_packets.push_back(std::move(quoted));
  if (fresh) {
    net::spawn(st->executor, openFlow(st, f), "exec_udp_open", [st, f] { st->dropFlow(f); });
  } else if (f->ready && !f->sending) {
    net::spawn(st->executor, sendFlow(st, f), "exec_udp_send", [st, f] { st->dropFlow(f); });
  }
}

net::awaitable<void> tunLoop(std::shared_ptr<ExecState> state_in) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  std::string buf(65536, '\0');
  while (!st->stopping && st->tun.is_open()) {
    net::error_code ec;
    co_await st->tun.async_wait(asio::posix::descriptor_base::wait_read,
                                asio::redirect_error(net::use_awaitable, ec));
    if (ec || st->stopping) break;
    // Every packet there is now, then wait again.
    for (int i = 0; i < 256; ++i) {
      const ssize_t n = ::read(st->tun.native_handle(), buf.data(), buf.size());
      if (n <= 0) break;
      onDatagram(st, buf.substr(0, static_cast<size_t>(n)));
    }
  }
}

// ------------------------------------------------------------ set-up

std::string trimmed(std::string s) {
  absl::StripAsciiWhitespace(&s);
  return s;
}

// A temporary directory (mode 0755: the program, run as the caller, reads
// its files), removed with this object.
struct TempDir {
  std::string path;
  ~TempDir() {
    if (path.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  absl::Status make() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(base && *base ? base : "/tmp", "/siphon-exec-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno)));
    }
    path = pattern;
    ::chmod(path.c_str(), 0755);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> write(const std::string& name, const std::string& content) {
    const std::string file = absl::StrCat(path, "/", name);
    std::ofstream out(file, std::ios::binary);
    out << content;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("write ", file, ": ", std::strerror(errno)));
    ::chmod(file.c_str(), 0644);
    return file;
  }
};

// The target's resolv.conf for the program. Without UDP (no TUN device for
// this user) lookups are made over TCP (`options use-vc`), which the
// program's namespace steers like any connection.
std::string resolvConfFor(std::string content, bool udp) {
  if (udp) return content;
  if (!content.empty() && content.back() != '\n') content.push_back('\n');
  return content + "# siphon exec: no UDP for this program; lookups over TCP\noptions use-vc\n";
}

std::string commandLine(const std::vector<std::string>& argv) { return absl::StrJoin(argv, " "); }

// --fs-remote / --fs-root: one FUSE mount of the target's root
// (fuse/fuse_mount.h, as `siphon fs mount`) at a staging directory of
// siphon's, shown to the program by bind mounts in its namespace
// (exec::MountOverlay). Once the program's namespace holds it, the staging
// mount is detached from this machine's tree, so nothing of it shows here
// and it ends with the program's namespace; then serve() ends by itself.
struct ExecFiles {
  std::string base, staging, scratch;
  std::unique_ptr<fuse::FuseMount> mount;
  bool serving = false;
  absl::Status served;

  // Directories are removed with rmdir only: never a walk that could enter
  // the mount and remove the target's files.
  ~ExecFiles() {
    mount.reset();
    if (!scratch.empty()) {
      for (int i = 0; i < 1024; ++i) {
        if (::rmdir(absl::StrCat(scratch, "/", i).c_str()) != 0 && errno == ENOENT) break;
      }
      ::rmdir(scratch.c_str());
    }
    if (!staging.empty()) ::rmdir(staging.c_str());
    if (!base.empty()) ::rmdir(base.c_str());
  }

  absl::Status makeDirs() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/siphon-exec-fs-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno)));
    }
    base = pattern;
    // The program follows the mount's absolute symlinks into the staging
    // directory: it must be able to walk there.
    ::chmod(base.c_str(), 0755);
    for (std::string* dir : {&staging, &scratch}) {
      *dir = absl::StrCat(base, dir == &staging ? "/root" : "/scratch");
      if (::mkdir(dir->c_str(), 0755) != 0) {
        return absl::InternalError(absl::StrCat("mkdir ", *dir, ": ", std::strerror(errno)));
      }
    }
    return absl::OkStatus();
  }

  // The staging mount out of this machine's tree (MNT_DETACH; a user
  // through fusermount3 -u -z, which may unmount a user's own mounts).
  void detachHere() const { (void)fuse::detachMount(staging); }
};

net::awaitable<void> serveFiles(std::shared_ptr<ExecFiles> files_in,
                                std::shared_ptr<ExecState> state_in) {
  const std::shared_ptr<ExecFiles> files = std::move(files_in);
  const std::shared_ptr<ExecState> st = std::move(state_in);
  files->served = co_await files->mount->serve();
  files->serving = false;
  st->run.notify();
}

// Ends the files' mount. Once the program ran, serve() ends by itself when
// its namespace (the last holder of the mount) is gone, given a moment;
// stop() ends it otherwise. Bounded.
net::awaitable<void> stopFiles(std::shared_ptr<ExecFiles> fs_in,
                               std::shared_ptr<ExecState> state_in, bool program_ran) {
  const std::shared_ptr<ExecFiles> fs = std::move(fs_in);
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const auto until = asio::steady_timer::clock_type::now() + std::chrono::seconds(2);
  while (program_ran && fs->serving && asio::steady_timer::clock_type::now() < until) {
    co_await st->run.wait(asio::steady_timer::clock_type::now() + std::chrono::milliseconds(50));
  }
  if (fs->serving && fs->mount) fs->mount->stop();
  const auto stop_until = asio::steady_timer::clock_type::now() + std::chrono::seconds(5);
  while (fs->serving && asio::steady_timer::clock_type::now() < stop_until) {
    co_await st->run.wait(asio::steady_timer::clock_type::now() + std::chrono::milliseconds(50));
  }
  if (!fs->serving) fs->mount.reset();
}

// A run that ends before the program ran: its ports given back, its files'
// mount ended, the session's hooks off. Returns `code`.
net::awaitable<int> endBeforeStart(std::shared_ptr<ExecState> state_in,
                                   std::shared_ptr<ExecFiles> fs_in, int code) {
  const std::shared_ptr<ExecState> st = std::move(state_in);
  const std::shared_ptr<ExecFiles> fs = std::move(fs_in);
  co_await st->incoming->releaseAll(!st->run.lost().ok());
  if (fs) co_await stopFiles(fs, st, /*program_ran=*/false);
  st->run.finish();
  co_return code;
}

net::awaitable<int> runExec(const CommandEnv& env, const ExecFlags& flags) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<ExecState>(env, ex);

  // The routes (checked at parse time).
  std::vector<exec::AddressRule> rules;
  for (const auto& r : flags.local) rules.push_back(*exec::parseAddressRule(r, Via::kLocal));
  for (const auto& r : flags.remote) rules.push_back(*exec::parseAddressRule(r, Via::kTarget));
  st->routes = exec::Routes(std::move(rules), flags.remote_loopback);

  // What the program is to see of the target.
  std::vector<std::pair<std::string, std::string>> target_env;
  if (!flags.no_target_env) {
    client::Env target_vars(env.target);
    auto vars = co_await target_vars.get();
    if (!vars.ok()) co_return reportFailure("exec: the target's environment", vars.status());
    for (auto& v : *vars) target_env.emplace_back(std::move(v.name), std::move(v.value));
  }
  client::Files files(env.target);
  std::string hostname = flags.hostname;
  if (hostname.empty()) {
    auto text = co_await files.readFile("/etc/hostname");
    if (text.ok()) hostname = trimmed(*text);
    if (hostname.empty()) {
      for (const auto& [name, value] : target_env) {
        if (name == "HOSTNAME") hostname = value;
      }
    }
  }
  const bool udp = !flags.no_udp && ::access("/dev/net/tun", R_OK | W_OK) == 0;
  const int tun_errno = errno;
  TempDir dir;
  std::vector<exec::FileOverlay> overlays;
  if (!flags.local_dns) {
    if (absl::Status s = dir.make(); !s.ok()) {
      printError(absl::StrCat("exec: ", s.message()));
      co_return kExitError;
    }
    for (const char* path : {"/etc/resolv.conf", "/etc/hosts"}) {
      const bool resolv = absl::EndsWith(path, "resolv.conf");
      auto text = co_await files.readFile(path);
      if (!text.ok()) {
        // What a missing file means to libc (a FROM scratch image run
        // outside Kubernetes has neither): no hosts entries, the resolver's
        // defaults. The program runs, told so in one line.
        const int err = client::errnoValue(text.status());
        if (!exec::absentToTheResolver(err)) {
          // A failure of the moment, which libc would report to the program.
          Failure f = requestFailure(absl::StrCat("exec: the target's ", path), text.status());
          printError(f.message + " (--local-dns runs the program with this machine's)");
          co_return f.exit_code;
        }
        const char* meaning = resolv ? "the resolver's defaults" : "no entries";
        if (st->json) {
          st->event(std::move(JsonLine("target_file")
                                  .add("path", path)
                                  .add("error", std::strerror(err))
                                  .add("shown", meaning)));
        } else {
          printError(absl::StrCat("exec: the target's ", path, ": ", std::strerror(err),
                                  "; the program's has ", meaning, ", as libc reads it"));
        }
        text = std::string();
      }
      if (resolv) {
        // Lookups go where the target's go, a nameserver on its loopback too.
        exec::ShownResolvConf shown = exec::standInNameservers(*text);
        *text = std::move(shown.text);
        st->stand_ins = std::move(shown.stand_ins);
      }
      auto file = dir.write(resolv ? "resolv.conf" : "hosts",
                            resolv ? resolvConfFor(*std::move(text), udp) : *std::move(text));
      if (!file.ok()) {
        printError(absl::StrCat("exec: ", file.status().message()));
        co_return kExitError;
      }
      // The local path must exist to be covered; a machine without one
      // keeps none.
      if (::access(path, F_OK) == 0) overlays.push_back({*file, path});
    }
  }
  if (!udp && !flags.no_udp && !env.json) {
    printError(absl::StrCat("exec: the program's UDP stays in its own namespace (/dev/net/tun: ",
                            std::strerror(tun_errno),
                            "); its lookups go over TCP. Run as root, or make /dev/net/tun "
                            "readable and writable (mode 0666), to carry UDP"));
  }

  // Signals: INT and TERM (LongRunning) and HUP go to the program, which
  // decides; its end ends siphon. Armed before it starts: a signal that
  // comes while it starts is kept and sent to it once it runs (dying of
  // it would leave the program running unsteered, and ports stolen).
  st->run.on_stop = [weak = std::weak_ptr<ExecState>(st)](int signo) {
    if (auto s = weak.lock()) s->signalProgram(signo);
  };
  st->run.on_end = st->run.on_stop;
  st->run.on_event = [weak = std::weak_ptr<ExecState>(st)](const client::LinkEvent& e) {
    auto s = weak.lock();
    if (!s) return;
    using Kind = client::LinkEvent::Kind;
    if (e.kind == Kind::kMoved) {
      if (s->json) {
        s->event(std::move(JsonLine("moved")
                               .add("from", e.from)
                               .add("to", e.to)
                               .add("reason", e.reason)
                               .add("connections_reset", static_cast<uint64_t>(e.streams))));
      } else {
        printError(absl::StrCat("exec: moved to agent ", e.to, " (", e.reason, "); ",
                                plural(e.streams, "connection"), " of the old agent ",
                                e.draining ? "finish there" : "reset"));
      }
      if (s->incoming) s->incoming->onMoved(e.to);
    } else if (e.kind == Kind::kTargetRestarted) {
      // The program keeps its connections and ports; files it had open
      // under --fs-remote/--fs-root answer EBADF (they were the old root's).
      if (s->json) {
        s->event(std::move(JsonLine("target_restarted")
                               .add("previous_pid", static_cast<int64_t>(e.previous_pid))
                               .add("pid", static_cast<int64_t>(e.pid))
                               .add("down_ms", e.down_ms)));
      } else {
        printError("exec: " + client::targetRestartedText(e));
      }
    } else if (e.kind == Kind::kLost && s->json) {
      s->event(std::move(JsonLine("lost").add("reason", sv(e.status.message()))));
    }
  };
  net::error_code ec;
  st->run.start();
  st->hup.add(SIGHUP, ec);
  st->armHup();

  // Incoming traffic: the ports named are taken before the program runs
  // (a refusal ends the run before anything ran); what comes meanwhile
  // waits in the subscriptions.
  {
    IncomingHooks hooks;
    std::weak_ptr<ExecState> weak = st;
    hooks.line = [weak](std::string line) {
      auto s = weak.lock();
      if (s && !s->json) printError(line);
    };
    hooks.event = [weak](JsonLine line) {
      if (auto s = weak.lock()) s->event(std::move(line));
    };
    hooks.check_lost = [weak](const absl::Status& status) {
      if (auto s = weak.lock()) s->run.checkLost(status);
    };
    hooks.changed = [weak] {
      if (auto s = weak.lock()) s->run.notify();
    };
    st->incoming = std::make_shared<ExecIncoming>(env.target, env.timeout, flags.http_filter,
                                                  std::move(hooks));
  }
  for (const IncomingPort& p : flags.incoming_ports) {
    absl::Status s = co_await st->incoming->subscribe(p);
    if (!s.ok()) {
      printError(absl::StrCat("exec: ", s.message()));
      co_return co_await endBeforeStart(st, nullptr, streamExitCode(s));
    }
  }
  if (st->run.stopRequested()) {
    // Interrupted before the program ran: nothing to pass the signal to.
    co_return co_await endBeforeStart(st, nullptr, 128 + st->run.lastSignal());
  }

  // The target's files in the program's view: each path checked in the
  // target, then one mount of its root.
  std::shared_ptr<ExecFiles> fs;
  std::vector<exec::MountOverlay> mounts;
  if (!flags.fs_remote.empty() || !flags.fs_root.empty()) {
    for (const std::string& path : flags.fs_remote) {
      auto stat = co_await files.stat(path);
      if (!stat.ok()) {
        printError(absl::StrCat("exec: --fs-remote ", path, ": ", statusText(stat.status())));
        co_return co_await endBeforeStart(st, nullptr, kExitError);
      }
      mounts.push_back({"", path, stat->isDirectory()});
    }
    fs = std::make_shared<ExecFiles>();
    if (absl::Status s = fs->makeDirs(); !s.ok()) {
      printError(absl::StrCat("exec: ", s.message()));
      co_return co_await endBeforeStart(st, nullptr, kExitError);
    }
    for (auto& m : mounts) m.source = fs->staging + m.target;
    if (!flags.fs_root.empty()) mounts.push_back({fs->staging, flags.fs_root, true});
    fuse::MountOptions options;
    options.mountpoint = fs->staging;
    options.read_only = flags.fs_ro;
    // Detached here once the program's namespace holds it (ExecFiles).
    options.end_on_unmount_here = false;
    auto mount = fuse::FuseMount::mount(env.target, options);
    if (!mount.ok()) {
      printError(absl::StrCat("exec: --fs-remote/--fs-root need a FUSE mount, and ",
                              mount.status().message()));
      co_return co_await endBeforeStart(st, nullptr, kExitError);
    }
    fs->mount = *std::move(mount);
    fs->serving = true;
    net::spawn(ex, serveFiles(fs, st), "exec_files", [fs] { fs->serving = false; });
  }

  std::vector<std::string> local_env;
  for (char** e = environ; e && *e; ++e) local_env.emplace_back(*e);
  exec::EnvOverlay overlay{flags.env_include, flags.env_exclude, flags.env_set, flags.env_allow};
  exec::OverlaidEnvironment program_env = exec::overlayEnvironment(local_env, target_env, overlay);
  if (!program_env.left_out.empty()) {
    // The target chose them; they would choose the code run here.
    const std::string names = absl::StrJoin(program_env.left_out, ", ");
    if (st->json) {
      st->event(std::move(JsonLine("env_left_out").add("names", names)));
    } else {
      printError(absl::StrCat("exec: the target's ", names,
                              " left out: they choose code that runs on this machine "
                              "(--env-allow NAME takes one)"));
    }
  }
  exec::SandboxSpec spec;
  spec.argv = flags.command;
  spec.env = std::move(program_env.env);
  spec.keep_fds = flags.keep_fds;
  spec.hostname = hostname;
  spec.files = overlays;
  spec.mounts = mounts;
  if (fs) spec.scratch = fs->scratch;
  spec.udp = udp;
  // Orphans of the program come to siphon, which reaps them and, when the
  // program ends, ends them: a daemon it started is not left running.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Started on a thread of its own: the set-up walks into the files' FUSE
  // mount (the --fs-remote bind mounts), which this event loop serves.
  struct Started {
    std::mutex mu;
    std::optional<absl::StatusOr<exec::Sandbox>> box;
  };
  auto started = std::make_shared<Started>();
  std::thread([spec, started, ex, weak = std::weak_ptr<ExecState>(st)] {
    absl::StatusOr<exec::Sandbox> result = exec::startSandbox(spec);
    {
      std::lock_guard<std::mutex> lock(started->mu);
      started->box = std::move(result);
    }
    asio::post(ex, [weak] {
      if (auto s = weak.lock()) s->run.notify();
    });
  }).detach();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(started->mu);
      if (started->box) break;
    }
    co_await st->run.wait(asio::steady_timer::clock_type::now() + std::chrono::milliseconds(100));
  }
  absl::StatusOr<exec::Sandbox> box = [&] {
    std::lock_guard<std::mutex> lock(started->mu);
    return std::move(*started->box);
  }();
  if (!box.ok()) {
    printError(absl::StrCat("exec: ", box.status().message()));
    // As a shell says it: 127 not found, 126 found but not runnable.
    const int code = absl::IsNotFound(box.status())           ? 127
                     : absl::IsPermissionDenied(box.status()) ? 126
                                                              : kExitError;
    co_return co_await endBeforeStart(st, fs, code);
  }
  st->pid = box->pid();
  if (fs) {
    fs->detachHere();
    if (st->json) {
      JsonLine line("files");
      for (const auto& m : mounts)
        line.add(m.target == flags.fs_root ? "root" : "remote", m.target);
      st->event(std::move(line.add("mode", flags.fs_ro ? "ro" : "rw")));
    }
  }
  std::error_code cleanup_ignored;
  std::filesystem::remove_all(dir.path, cleanup_ignored);  // the bind mounts hold the files
  dir.path.clear();

  // siphon's own listeners in the program's namespace are not the
  // program's (--incoming).
  std::set<uint16_t> own_ports;
  for (int fd : {box->tcp4(), box->tcp6()}) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (fd < 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) continue;
    own_ports.insert(ntohs(ss.ss_family == AF_INET6
                               ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port));
  }
  if (box->tcp4() >= 0) {
    st->acceptors.push_back(
        std::make_shared<net::tcp::acceptor>(ex, net::tcp::v4(), box->releaseTcp4()));
  }
  if (box->tcp6() >= 0) {
    st->acceptors.push_back(
        std::make_shared<net::tcp::acceptor>(ex, net::tcp::v6(), box->releaseTcp6()));
  }
  if (box->tun() >= 0) st->tun.assign(box->releaseTun(), ec);
  st->incoming->start(box->releaseConnector(), st->pid, flags.incoming_mode, std::move(own_ports));

  st->chld.add(SIGCHLD, ec);
  st->armChld();
  st->reap();  // it may have ended before SIGCHLD was watched
  if (st->pending_signal != 0) st->signalProgram(st->pending_signal);

  if (st->json) {
    st->event(std::move(JsonLine("started")
                            .add("pid", static_cast<uint64_t>(st->pid))
                            .add("command", commandLine(flags.command))
                            .add("hostname", hostname)
                            .addBool("udp", udp)));
  }
  for (auto& acc : st->acceptors) {
    net::spawn(ex, acceptLoop(st, acc), "exec_accept", [st] { st->stopServing(); });
  }
  if (st->tun.is_open()) {
    net::spawn(ex, tunLoop(st), "exec_tun", [] {});
    st->armSweep();
  }

  // Until the program ends. A lost session stops it: SIGTERM, then SIGKILL.
  std::optional<asio::steady_timer::time_point> kill_at;
  while (!st->exit_code) {
    if (!st->run.lost().ok() && !kill_at) {
      printError(absl::StrCat("exec: ", st->run.lost().message(), "; stopping ",
                              flags.command.front(), " (SIGTERM)"));
      st->signalProgram(SIGTERM);
      kill_at = asio::steady_timer::clock_type::now() + kStopGrace;
    }
    if (kill_at && asio::steady_timer::clock_type::now() >= *kill_at) {
      st->signalProgram(SIGKILL);
      kill_at = asio::steady_timer::time_point::max();
    }
    // A bounded wait: a notify while nobody waits is not kept.
    co_await st->run.wait(asio::steady_timer::clock_type::now() + std::chrono::milliseconds(200));
    st->reap();
  }
  st->stopServing();
  // Its ports are given back at once: the target's application has them
  // again.
  co_await st->incoming->releaseAll(!st->run.lost().ok());
  // Its connections pass on what it wrote, then end (its sockets are
  // closed); not longer than kDrainAfterExit.
  const auto drain_until = asio::steady_timer::clock_type::now() + kDrainAfterExit;
  while (st->open() > 0 && asio::steady_timer::clock_type::now() < drain_until) {
    co_await st->run.wait(std::min(
        drain_until, asio::steady_timer::clock_type::now() + std::chrono::milliseconds(100)));
  }
  // The program's namespace is gone, and the mount with it.
  if (fs) co_await stopFiles(fs, st, /*program_ran=*/true);
  const bool lost = !st->run.lost().ok();
  if (st->json) {
    st->event(std::move(JsonLine("exited")
                            .add("code", static_cast<uint64_t>(*st->exit_code))
                            .addBool("session_lost", lost)));
  }
  st->run.finish();
  net::error_code ignored;
  st->hup.cancel(ignored);
  st->chld.cancel(ignored);
  if (lost) co_return kExitUnreachable;
  co_return *st->exit_code;
}

// 0, 1 and 2 open (/dev/null for any that is closed), as glibc makes them
// for a setuid program: the program's standard streams are never siphon's
// sockets.
void ensureStandardStreams() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0 && null != fd) {
      ::dup2(null, fd);
      ::close(null);
    }
  }
}

}  // namespace

void addExecCommand(CLI::App& app, std::vector<Command>& out, const ExecTail* tail) {
  auto flags = std::make_shared<ExecFlags>();
  CLI::App* exec = app.add_subcommand(
      "exec",
      "Run a local program as if it ran inside the target: its connections, names, "
      "environment and hostname are the target's (siphon exec [OPTIONS] -- COMMAND [ARGS...])");
  registerExecFlags(*exec, *flags);
  exec->callback([flags, exec, tail] {
    // First of all: a standard stream siphon was started without would be
    // the number its first socket gets, and the program's stdin or stdout.
    ensureStandardStreams();
    absl::Status s = finishExecFlags(*flags, *exec, *tail);
    if (!s.ok()) throw CLI::ValidationError("exec", std::string(s.message()));
  });
  out.push_back({exec,
                 [flags](const CommandEnv& env) -> net::awaitable<int> {
                   co_return co_await runExec(env, *flags);
                 },
                 [flags](client::ClientOptions& options) {
                   options.failover_timeout = flags->agent_lost_timeout_ms;
                 }});
}

}  // namespace siphon::cli
