// SessionHost: what a service sees of one client session, and all it sees.
// The agent's implementation is AgentSession (agent/server/agent_session.h);
// unit tests give services a fake (tests/fakes/agent/fake_session_host.h).
// Services never name the concrete session, so they build and test without
// the server, its listener or its handshake.
//
// What a session offers a service:
//   - who it is: id() (logs, per-session state such as file handles and
//     subscriptions), clientName() (`siphon sessions`, overlap notices);
//   - answers: respond() / respondError(), exactly once per request;
//   - streams: the protocol::Session for accepting, opening and sending
//     (session()), registerStream() so the peer's frames for a stream reach
//     its endpoint, unregisterStream(), resetStream(), openStream() for the
//     streams the agent opens (stolen, mirrored);
//   - wake() after queueing frames from outside a session callback;
//   - operations hooks: countSent(), countGap(), logLimitHit().
//
// Threads: every method on the event loop. A service that goes to another
// thread posts back before it touches the session.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "siphon/protocol/session.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::agent {

class StreamEndpoint;

class SessionHost {
 public:
  virtual ~SessionHost() = default;

  virtual const std::string& id() const = 0;
  virtual const std::string& clientName() const = 0;
  // The session is gone for good: its endpoints were closed, frames queued
  // on session() go nowhere, registerStream() closes what it is given.
  virtual bool ended() const = 0;
  // The protocol state machine of the session: limits(), acceptStream(),
  // sendCredit(), sendData(), consumed()... Lives as long as the host.
  virtual protocol::Session& session() = 0;

  // Sends the answer to a request (dropped once the session ended).
  virtual void respond(v1::Response response) = 0;
  // A file read's answer whose bytes are in a pipe (protocol/piped_bytes.h):
  // `response` holds its FileData without data. The default reads the pipe
  // into the answer and respond()s it (a fake's way); AgentSession sends
  // the pipe itself.
  virtual void respond(v1::Response response, std::shared_ptr<protocol::PipedBytes> data);
  // The error answer to request `request_id`; `context` (when given) goes
  // before the status's message ("steal port 80: ...").
  void respondError(uint64_t request_id, const absl::Status& status, std::string_view context = {});

  // The endpoint gets the peer's frames for `stream_id` until it is
  // unregistered, the stream is reset, or the session ends (close()).
  virtual void registerStream(uint64_t stream_id, std::shared_ptr<StreamEndpoint> endpoint) = 0;
  virtual void unregisterStream(uint64_t stream_id) = 0;
  // Opens a stream the agent starts (stolen, mirrored...) on session(),
  // noting its kind for the metrics. The session's stream limit applies.
  virtual absl::StatusOr<uint64_t> openStream(v1::StreamOpen open) = 0;
  // Resets one stream with `error` and counts it. Services reset through
  // here, not session(). Queues the frame: wake() after it from outside a
  // callback.
  virtual void resetStream(uint64_t stream_id, const v1::Error& error) = 0;
  // Call after queueing frames on session() from outside a callback.
  virtual void wake() = 0;

  // Operations (docs/OPERATIONS.md): `n` payload bytes sent to the client on
  // `stream_id`; a gap of `bytes` reported on it; a limit of the service's
  // own hit (--max-open-files), for the throttled `limit_hit` log line.
  virtual void countSent(uint64_t stream_id, uint64_t n) = 0;
  virtual void countGap(uint64_t stream_id, uint64_t bytes) = 0;
  virtual void logLimitHit(const absl::Status& hit) = 0;
};

// A stream's hold on its session (SocketPump, CaptureStream): weak, so a
// stream never keeps an ended session alive. Every call does nothing once
// the session is gone; session() is null once it ended.
class HostRef {
 public:
  HostRef() = default;
  explicit HostRef(std::weak_ptr<SessionHost> host) : host_(std::move(host)) {}

  // The session carrying the stream; nullptr once it has ended.
  protocol::Session* session() const {
    auto h = host_.lock();
    return h && !h->ended() ? &h->session() : nullptr;
  }
  std::shared_ptr<SessionHost> lock() const { return host_.lock(); }
  // Frames were queued from outside a session callback: send them.
  void wake() const {
    if (auto h = host_.lock()) h->wake();
  }
  // The stream is over: stop routing its frames to the endpoint.
  void release(uint64_t stream_id) const {
    if (auto h = host_.lock()) h->unregisterStream(stream_id);
  }
  void reset(uint64_t stream_id, const v1::Error& error) const {
    if (auto h = host_.lock()) h->resetStream(stream_id, error);
  }
  void sent(uint64_t stream_id, uint64_t n) const {
    if (auto h = host_.lock()) h->countSent(stream_id, n);
  }
  void gap(uint64_t stream_id, uint64_t bytes) const {
    if (auto h = host_.lock()) h->countGap(stream_id, bytes);
  }

 private:
  std::weak_ptr<SessionHost> host_;
};

}  // namespace siphon::agent
