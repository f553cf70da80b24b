// The agent's listener and session registry. Accepts clients, runs the
// handshake (auth, version, new session or resume), keeps detached sessions
// for their grace period, routes requests to the services, and decides when
// the agent exits (no first client, idle, target gone, SIGTERM).
//
// Threads: everything here runs on one io_context thread; blocking work
// (reading /proc) goes to the blocking pool and comes back by post().
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/common/log.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/http_endpoint.h"
#include "agent/netns/netns_worker.h"
#include "agent/server/admission.h"
#include "agent/server/config.h"
#include "agent/services/service.h"
#include "agent/target/proc_fs.h"
#include "agent/target/target.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/session_transport.h"
#include "siphon/transport/stream.h"

namespace siphon::agent {

class Server;

// One client session: outlives its transports; detached while the client is
// away, gone after the grace period.
class AgentSession : public std::enable_shared_from_this<AgentSession>,
                     public protocol::SessionHandler {
 public:
  AgentSession(Server& server, std::string id, std::string resume_token, std::string client_name,
               protocol::SessionLimits limits);

  const std::string& id() const { return id_; }
  const std::string& resumeToken() const { return resume_token_; }
  const std::string& clientName() const { return client_name_; }
  protocol::Session& session() { return session_; }
  bool attached() const { return transport_ != nullptr && !transport_->closed(); }
  // Had a transport and lost it: waiting for a resume within the grace.
  bool detached() const { return transport_ != nullptr && transport_->closed() && !ended_; }
  std::chrono::steady_clock::time_point created() const { return created_; }

  // Runs a new transport for this session (after the handshake) for
  // `attachment` (protocol::Session::attachment() after the handshake's
  // resume(), 0 for a new session). False, and `stream` closed without a
  // frame, when a later resume superseded it or the session ended.
  bool attach(net::Stream stream, std::string leftover, uint64_t attachment);
  // The Welcome of the resume that made `attachment` could not be written:
  // the session is detached again, unless a later resume holds it.
  void resumeFailed(uint64_t attachment);
  // A resume is taking the session over: call before Session::resume(). A
  // transport still attached (half-open: the client gave it up, the agent
  // has not noticed yet) is closed first, so it neither handles frames nor
  // writes any past the resume point (they would be handled twice, or
  // counted as sent and never replayed). The grace period holds until
  // attach(), should the handshake fail.
  void detachForResume();
  // Sends a response, if the session still exists.
  void respond(v1::Response response);
  // The error answer to request `request_id`; `context` (when given) goes
  // before the status's message ("steal port 80: ...").
  void respondError(uint64_t request_id, const absl::Status& status,
                    std::string_view context = {});
  // Ends the session now: transport closed, removed from the registry.
  void end(std::string_view reason);
  // Ends a session that is lost (not resumed within the grace period, a
  // failed resume, a protocol error): its streams are reset with AGENT_LOST
  // first, so their sockets in the target abort (RST) instead of closing
  // as if complete.
  void lose(std::string_view reason);
  // Queue a Draining notice.
  void notifyDraining(int64_t deadline_unix_ms, std::string_view reason);
  bool ended() const { return ended_; }

  // Streams: the endpoint gets the peer's frames for `stream_id` until it
  // is unregistered, the stream is reset, or the session ends.
  void registerStream(uint64_t stream_id, std::shared_ptr<StreamEndpoint> endpoint);
  void unregisterStream(uint64_t stream_id);
  // Streams open in either sense: with an endpoint, or known to the
  // protocol session (an outgoing connect still under way, say).
  size_t streamCount() const { return std::max(streams_.size(), session_.streamCount()); }
  // Resets every stream with `error`: the client hears it, the sockets
  // close with RST (the end of a drain).
  void resetStreams(const v1::Error& error);
  // Resets one stream with `error` and counts it (siphon_errors_sent_total,
  // frame "stream_reset"). Services reset through here, not session().
  // Queues the frame: wake() after it from outside a callback.
  void resetStream(uint64_t stream_id, const v1::Error& error);
  // Call after queueing frames on session() from outside a callback.
  void wake();

  // Operations (docs/OPERATIONS.md). Opens a stream the agent starts
  // (stolen, mirrored...) on session(), noting its kind for the metrics.
  absl::StatusOr<uint64_t> openStream(v1::StreamOpen open);
  // Hooks of the services: `n` payload bytes sent to the client on
  // `stream_id`; a gap of `bytes` sent on it.
  void countSent(uint64_t stream_id, uint64_t n);
  void countGap(uint64_t stream_id, uint64_t bytes);
  metrics::AgentMetrics& metrics();
  uint64_t bytesIn() const { return bytes_in_; }
  uint64_t bytesOut() const { return bytes_out_; }
  // Streams with an endpoint, by kind (added to `out`).
  void countStreams(std::array<uint64_t, metrics::kStreamKinds>& out) const;
  // The log line of a limit this session hit ("limit_hit": the 1st, 2nd,
  // 4th... hit of each code, so a client cannot flood the log with them).
  // The protocol session's limits come here by themselves; services call it
  // for theirs (--max-open-files).
  void logLimitHit(const absl::Status& hit);

  // SessionHandler
  void onRequest(v1::Request request) override;
  void onStreamOpen(v1::StreamOpen open) override;
  void onStreamAccept(v1::StreamAccept accept) override;
  void onStreamData(uint64_t stream_id, std::string_view payload) override;
  void onStreamDatagram(v1::StreamDatagram datagram) override;
  void onStreamHalfClose(uint64_t stream_id) override;
  void onStreamReset(uint64_t stream_id, v1::Error error) override;
  void onStreamWritable(uint64_t stream_id) override;
  void onGoaway(v1::Goaway goaway) override;

 private:
  StreamEndpoint* endpoint(uint64_t stream_id);

  void transportEnded(uint64_t generation, const absl::Status& why);
  // Ends the session at `deadline` unless a transport attaches first.
  void armGrace(std::chrono::steady_clock::time_point deadline);

  Server& server_;
  std::string id_;
  std::string resume_token_;
  std::string client_name_;
  protocol::Session session_;
  std::shared_ptr<net::SessionTransport> transport_;
  uint64_t generation_ = 0;
  net::asio::steady_timer grace_timer_;
  std::chrono::steady_clock::time_point grace_deadline_;
  std::chrono::steady_clock::time_point created_;
  bool ended_ = false;
  bool client_closed_ = false;
  std::map<uint64_t, std::shared_ptr<StreamEndpoint>> streams_;
  // Operations: stream kinds (set when the stream is opened, dropped with
  // its endpoint), requests in flight (kind, file op) and stream bytes.
  metrics::StreamKind kindOf(uint64_t stream_id) const;
  std::map<uint64_t, metrics::StreamKind> stream_kinds_;
  std::map<uint64_t, std::pair<int, int>> request_kinds_;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  std::map<v1::ErrorCode, uint64_t> limit_hits_;  // per code, for logLimitHit
};

class Server {
 public:
  // The server runs its own event loop (run()).
  Server(AgentConfig config, std::unique_ptr<Target> target, std::unique_ptr<ProcFs> procfs);
  ~Server();

  // Enters the target's network namespace on a worker thread and builds the
  // services. PERMISSION_DENIED when setns is not allowed.
  absl::Status init();
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
  net::awaitable<void> acceptLoop();
  // --metrics: binds the operator's HTTP endpoint (listen() calls it).
  absl::Status listenMetrics();
  // Admits an accepted connection to a handshake slot, or closes it at once
  // (a cap, the fd reserve; docs/SECURITY.md#handshake-admission).
  void admit(net::tcp::socket socket);
  net::awaitable<void> handshake(net::tcp::socket socket, HandshakeSlots::Slot slot);
  net::awaitable<void> watchSignals();
  net::awaitable<void> watchTarget();
  void armIdleTimer();
  void shutdown(int exit_code, std::string_view reason);
  void startDrain(std::string_view reason);
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
  bool had_client_ = false;
  bool draining_ = false;
  std::chrono::steady_clock::time_point drain_deadline_;
  bool stopping_ = false;
  int exit_code_ = kExitOk;
};

}  // namespace siphon::agent
