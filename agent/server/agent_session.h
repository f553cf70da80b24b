// AgentSession: one client session of the agent. It outlives its
// transports (detached while the client is away, gone after the grace
// period), routes the client's requests and streams to the services, and is
// the SessionHost (agent/services/session_host.h) those services see.
//
// Threads: everything here runs on the server's io_context thread.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/services/service.h"
#include "agent/services/session_host.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/session_transport.h"
#include "siphon/transport/stream.h"

namespace siphon::agent {

class Server;

// One client session: outlives its transports; detached while the client is
// away, gone after the grace period.
class AgentSession : public std::enable_shared_from_this<AgentSession>,
                     public SessionHost,
                     public protocol::SessionHandler {
 public:
  AgentSession(Server& server, std::string id, std::string resume_token, std::string client_name,
               protocol::SessionLimits limits);

  const std::string& id() const override { return id_; }
  const std::string& resumeToken() const { return resume_token_; }
  const std::string& clientName() const override { return client_name_; }
  protocol::Session& session() override { return session_; }
  bool attached() const { return transport_ != nullptr && !transport_->closed(); }
  // Had a transport and lost it: waiting for a resume within the grace.
  // (A session a handover brought counts too, until its client resumes.)
  bool detached() const {
    return !ended_ && (transport_ != nullptr ? transport_->closed() : restored_);
  }
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
  // SessionHost (agent/services/session_host.h): what services see.
  void respond(v1::Response response) override;
  void respond(v1::Response response, std::shared_ptr<protocol::PipedBytes> data) override;
  // Ends the session now: transport closed, removed from the registry.
  void end(std::string_view reason);
  // Ends a session that is lost (not resumed within the grace period, a
  // failed resume, a protocol error): its streams are reset with AGENT_LOST
  // first, so their sockets in the target abort (RST) instead of closing
  // as if complete.
  void lose(std::string_view reason);
  // Queue a Draining notice.
  void notifyDraining(int64_t deadline_unix_ms, std::string_view reason);
  // The minor protocol version of the handshake that made or resumed it.
  void setProtocolMinor(uint32_t minor) { protocol_minor_ = minor; }
  // Queue a TargetRestarted notice, to a client of protocol 1.1 or later
  // (an older one would take the unknown frame for a protocol error).
  void notifyTargetRestarted(const v1::TargetRestarted& restarted);
  bool ended() const override { return ended_; }

  // Streams: the endpoint gets the peer's frames for `stream_id` until it
  // is unregistered, the stream is reset, or the session ends.
  void registerStream(uint64_t stream_id, std::shared_ptr<StreamEndpoint> endpoint) override;
  void unregisterStream(uint64_t stream_id) override;
  // Streams open in either sense: with an endpoint, or known to the
  // protocol session (an outgoing connect still under way, say).
  size_t streamCount() const { return std::max(streams_.size(), session_.streamCount()); }
  // Whether stream `stream_id` has its endpoint (a handover's check that a
  // service took the streams it exported).
  bool hasEndpoint(uint64_t stream_id) const { return streams_.contains(stream_id); }
  // Resets every stream with `error`: the client hears it, the sockets
  // close with RST (the end of a drain).
  void resetStreams(const v1::Error& error);
  // Resets one stream with `error` and counts it (siphon_errors_sent_total,
  // frame "stream_reset"). Services reset through here, not session().
  // Queues the frame: wake() after it from outside a callback.
  void resetStream(uint64_t stream_id, const v1::Error& error) override;
  // Call after queueing frames on session() from outside a callback.
  void wake() override;

  // Operations (docs/OPERATIONS.md). Opens a stream the agent starts
  // (stolen, mirrored...) on session(), noting its kind for the metrics.
  absl::StatusOr<uint64_t> openStream(v1::StreamOpen open) override;
  // Hooks of the services: `n` payload bytes sent to the client on
  // `stream_id`; a gap of `bytes` sent on it.
  void countSent(uint64_t stream_id, uint64_t n) override;
  void countGap(uint64_t stream_id, uint64_t bytes) override;
  metrics::AgentMetrics& metrics();
  uint64_t bytesIn() const { return bytes_in_; }
  uint64_t bytesOut() const { return bytes_out_; }
  // Streams with an endpoint, by kind (added to `out`).
  void countStreams(std::array<uint64_t, metrics::kStreamKinds>& out) const;
  // The log line of a limit this session hit ("limit_hit": the 1st, 2nd,
  // 4th... hit of each code, so a client cannot flood the log with them).
  // The protocol session's limits come here by themselves; services call it
  // for theirs (--max-open-files).
  void logLimitHit(const absl::Status& hit) override;

  // Handover (docs/CONTINUITY.md, "Handover"). freezeForHandover() cuts
  // the transport (the client resumes against whichever agent accepts it
  // next) and freezes every stream's endpoint; thawAfterHandover() undoes
  // the freeze when the handover failed.
  void freezeForHandover();
  void thawAfterHandover();
  // Why the session cannot move now ("" when it can): answers it owes.
  std::string handoverBlocker() const;
  absl::Status exportState(v1::SessionExport* out, std::vector<UniqueFd>* fds);
  // The session exportState() described, on the new agent: detached, its
  // streams' endpoints frozen until startAfterHandover().
  static absl::StatusOr<std::shared_ptr<AgentSession>> restore(Server& server,
                                                               const v1::SessionExport& state,
                                                               std::vector<UniqueFd>& fds);
  void startAfterHandover();
  // Handovers this session went through (the Welcome of a resume says it).
  uint64_t handovers() const { return handovers_; }
  void setHandovers(uint64_t n) { handovers_ = n; }

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
  // The request metrics of an answer about to go.
  void countAnswer(const v1::Response& response);
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
  uint32_t protocol_minor_ = 0;
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
  uint64_t handovers_ = 0;
  bool frozen_ = false;
  // Restored by a handover (detached until its client resumes).
  bool restored_ = false;
  // Frozen for a handover: the grace it has left (armed again on a thaw).
  std::chrono::milliseconds grace_left_{0};
};

}  // namespace siphon::agent
