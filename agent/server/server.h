// The agent's listener and session registry. Accepts clients, runs the
// handshake (auth, version, new session or resume), keeps detached sessions
// for their grace period, routes requests to the services, and decides when
// the agent exits (no first client, idle, target gone, SIGTERM).
//
// Threads: everything here runs on one io_context thread; blocking work
// (reading /proc) goes to the blocking pool and comes back by post().
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/log.h"
#include "agent/common/unique_fd.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/http_endpoint.h"
#include "agent/netns/netns_worker.h"
#include "agent/server/admission.h"
#include "agent/server/agent_session.h"
#include "agent/server/config.h"
#include "agent/services/service.h"
#include "agent/target/proc_fs.h"
#include "agent/target/target.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/session_transport.h"
#include "siphon/transport/stream.h"

namespace siphon::agent {

class Server {
 public:
  // The server runs its own event loop (run()).
  Server(AgentConfig config, std::unique_ptr<Target> target, std::unique_ptr<ProcFs> procfs);
  ~Server();

  // Enters the target's network namespace on a worker thread and builds the
  // services. PERMISSION_DENIED when setns is not allowed.
  absl::Status init();
  // Instead of listen(): takes over the agent whose --handover-socket is
  // config().take_over (docs/CONTINUITY.md, "Handover"): its listener,
  // sessions, connections and steal. On any error the old agent goes on
  // and this one should exit (FAILED_PRECONDITION with the reason).
  absl::Status takeOver();
  // Binds the listener (TLS when config().tls_cert is set).
  // INVALID_ARGUMENT for TLS files that do not load (net::tls::
  // serverContext), UNAVAILABLE with the address and the reason.
  absl::Status listen();
  // "127.0.0.1:7140" as bound (port 0 resolved).
  std::string listenAddress() const;
  // The ready line of design.md §6.
  std::string readyLine() const;

  // Accepts clients and serves until an exit condition; returns the exit
  // code. Runs io.run() itself.
  int run();

  // Opens the target's container again after its process exited (on the
  // blocking pool): its next process, or NotFound while there is none yet.
  using TargetReopener = std::function<absl::StatusOr<std::unique_ptr<Target>>()>;
  // Before run(): when the target exits, adopt its container's next process
  // within config().target_restart_timeout (a target from a container).
  void followTargetRestarts(TargetReopener reopen) { reopen_ = std::move(reopen); }

  // Asks run() to end with exit code 0; safe from any thread.
  void requestStop();
  // Starts the drain SIGTERM starts; safe from any thread.
  void requestDrain(std::string reason);

  // Called by sessions.
  void handleRequest(std::shared_ptr<AgentSession> session, v1::Request request);
  void sessionEnded(const std::string& id);
  // SIGTERM was received: new streams are refused with AGENT_DRAINING.
  bool draining() const { return draining_; }
  net::asio::any_io_executor executor() { return io_.get_executor(); }
  ServiceRegistry& services() { return *services_; }
  // What services are built with (after init()); tests build their own.
  ServiceContext& serviceContext() { return *service_ctx_; }
  const AgentConfig& config() const { return config_; }
  // Operations (docs/OPERATIONS.md): the siphon_ metrics, and the
  // --metrics endpoint's address as bound ("" without --metrics).
  metrics::AgentMetrics& metrics() { return metrics_; }
  std::string metricsAddress() const;
  // Empty when /readyz is 200; otherwise why not.
  std::string notReady() const;

 private:
  // ---- handover (handover.cc) ----
  absl::Status setUpTls();
  // --handover-socket: binds it and starts the thread that serves it.
  // `replace`: a socket file there is ours to replace (the agent we took
  // over still listens on it while it exits).
  absl::Status listenHandover(bool replace);
  void handoverThread();
  void stopHandover();
  void serveHandover(UniqueFd conn);
  // Runs `f` on the event loop and waits for its result; nullopt when the
  // loop stopped first.
  template <class F>
  auto onLoop(F f) -> std::optional<decltype(f())>;
  void freezeForHandover();
  void thawAfterHandover(std::string_view why);
  std::string handoverBlocker() const;
  absl::StatusOr<std::string> exportHandover(std::vector<UniqueFd>* fds);
  absl::Status importHandover(const v1::AgentState& state, std::vector<UniqueFd>& fds);

  net::awaitable<void> acceptLoop();
  // The descriptor budget of admit(), from RLIMIT_NOFILE (listen(), a
  // handover's import).
  void setFdBudget();
  // --metrics: binds the operator's HTTP endpoint (listen() calls it).
  absl::Status listenMetrics();
  // Admits an accepted connection to a handshake slot, evicting the one of
  // a full cap that has waited longest without a complete Hello, or closes
  // it at once when there is none (docs/SECURITY.md#handshake-admission).
  void admit(net::tcp::socket socket);
  // The eviction's log line and metric.
  void noteEviction(const HandshakeSlots::Eviction& evicted);
  // `socket` is shared with the slot's eviction callback (which resets it).
  net::awaitable<void> handshake(std::shared_ptr<net::Stream> socket, HandshakeSlots::Slot slot);
  net::awaitable<void> watchSignals();
  net::awaitable<void> watchTarget();
  // The target exited: asks reopen_ for the container's next process until
  // one comes (adopted: onTargetBack) or `deadline` passes (the agent exits).
  void awaitTargetBack(pid_t old_pid, std::chrono::steady_clock::time_point exited_at,
                       std::chrono::steady_clock::time_point deadline);
  void onTargetBack(std::unique_ptr<Target> next, pid_t old_pid,
                    std::chrono::steady_clock::time_point exited_at);
  void armIdleTimer();
  void shutdown(int exit_code, std::string_view reason);
  // Drains, then exits with `exit_code` (SIGTERM: 0).
  void startDrain(std::string_view reason, int exit_code = kExitOk);
  net::awaitable<void> watchDrain(std::string reason);
  // Streams of every session plus what the services still relay.
  size_t inFlight() const;
  v1::InfoResponse info(const AgentSession& session) const;
  v1::SessionsResponse listSessions(const AgentSession& asking) const;
  metrics::LiveState liveState() const;
  std::string newId(size_t bytes) const;

  AgentConfig config_;
  std::unique_ptr<Target> target_;
  std::unique_ptr<ProcFs> procfs_;
  // Before the sessions and the services, so it outlives their hooks.
  metrics::AgentMetrics metrics_;
  // Before the loop: a handshake's frame, destroyed with the loop, holds a
  // slot. Log lines a peer can repeat per connection go through throttle_.
  HandshakeSlots handshake_slots_;
  FdBudget fd_budget_;
  log::Throttle throttle_;
  net::asio::thread_pool blocking_pool_{2};
  std::unique_ptr<NetnsWorker> netns_;
  std::unique_ptr<ServiceContext> service_ctx_;
  // The loop, declared between what the services use (above) and what uses
  // the loop (below). Handlers still queued when the server goes (a timer a
  // service armed, say) often hold a service: the loop destroys them, and
  // with them the service, while the pool, the netns worker and the context
  // the service uses still exist; the sockets and timers below go first.
  net::asio::io_context io_{1};
  net::tcp::acceptor acceptor_;
  std::shared_ptr<net::ssl::context> tls_;  // set: the listener speaks TLS
  std::unique_ptr<ServiceRegistry> services_;
  net::asio::steady_timer first_client_timer_;
  net::asio::steady_timer idle_timer_;
  net::asio::signal_set signals_;
  std::map<std::string, std::shared_ptr<AgentSession>> sessions_;
  std::chrono::steady_clock::time_point started_;
  std::unique_ptr<metrics::HttpEndpoint> http_;  // --metrics
  std::string drain_reason_;
  int drain_exit_code_ = kExitOk;
  TargetReopener reopen_;  // empty: the agent exits with its target
  // Waits between asking for the target's next process.
  net::asio::steady_timer target_retry_timer_{io_};
  bool had_client_ = false;
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_deadline_;
  bool stopping_ = false;
  int exit_code_ = kExitOk;
  // Handover: the event loop's flag (no accepts, handshakes end without a
  // session), this agent's line's handover count, the socket's thread.
  bool handover_frozen_ = false;
  uint64_t handovers_ = 0;
  UniqueFd handover_listener_;
  ino_t handover_inode_ = 0;  // of the socket file we bound (unlinked at exit if still ours)
  std::atomic<bool> handover_stop_{false};
  std::atomic<int> handover_conn_{-1};  // the handover being served (to wake it at exit)
  std::thread handover_thread_;
};

}  // namespace siphon::agent
