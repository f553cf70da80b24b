// Runs one connected stream (TCP, or TLS after its handshake) for a
// protocol::Session: a reader coroutine that
// feeds received bytes to the session, a writer coroutine that drains the
// session's frames with gathered writes, and a keepalive ticker. The session
// and its handler are owned by the caller and must outlive run().
//
// Threads: everything runs on the socket's executor (one event loop).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/pipe_sender.h"
#include "siphon/transport/stream.h"

namespace siphon::net {

class SessionTransport : public std::enable_shared_from_this<SessionTransport> {
 public:
  // `initial` holds bytes already read past the handshake frame. A plain
  // tcp::socket converts to a Stream.
  SessionTransport(Stream stream, protocol::Session& session,
                   protocol::SessionHandler& handler, std::string initial);

  // Runs until the transport ends. OK when close() ended it; otherwise why
  // it died (peer closed, I/O error, protocol error, keepalive timeout).
  // A protocol error is sent to the peer as Goaway before closing.
  awaitable<absl::Status> run();

  // Call after queueing frames on the session from outside the handler.
  void wake() { writer_signal_.notify(); }
  // Ends the transport; run() returns OK. Frames already handed to the
  // socket may or may not arrive (the session replays what is unacked).
  void close();
  // Writes what the session has queued (a Goaway, say), then closes.
  void closeAfterFlush();
  // Writes what the session has queued, shuts down the sending side and
  // reads on until the peer closes (its end of the connection: it has read
  // everything, the Goaway included) or `bound` passes, then closes. On a
  // relayed path (a kubectl port-forward) the peer's close is the one sign
  // that the relay has carried the bytes. TLS: as closeAfterFlush().
  void closeAfterFlushAndPeer(std::chrono::milliseconds bound);
  bool closed() const { return closed_; }
  // Until close() has run (for whatever reason), or `deadline`.
  awaitable<void> waitClosed(asio::steady_timer::time_point deadline);

  // Unsent bytes the socket may hold before the writer waits
  // (TCP_NOTSENT_LOWAT), and the most one write takes from the session.
  static constexpr size_t kUnsentInSocket = 128 * 1024;
  static constexpr size_t kBatchBytes = 256 * 1024;
  // The send buffer the session asks for (SO_SNDBUF), when the machine
  // allows more than TCP's autotuning reaches (tcp_wmem's maximum): the
  // buffer holds what is in flight (the unsent part stays within
  // kUnsentInSocket), and a buffer smaller than what the congestion control
  // wants in flight on a long fast path leaves it waiting for room with
  // nothing unsent: every sample application-limited, BBR never leaves its
  // start-up, a round trip of queue at the bottleneck. 0: leave it to
  // autotuning.
  static constexpr long kMaxSendBuffer = 16l << 20;
  static int sendBufferSize();
  std::string peer() const { return peer_; }

 private:
  awaitable<void> writer(std::shared_ptr<SessionTransport> self);
  awaitable<void> ticker(std::shared_ptr<SessionTransport> self);
  void fail(absl::Status status);
  // Tells the session the path's round-trip time (the socket's smoothed
  // RTT, TCP_INFO), at most every kRttPeriod.
  void notePathRtt();
  static constexpr std::chrono::milliseconds kRttPeriod{100};

  Stream stream_;
  std::string gathered_;  // TLS: the batch in one buffer, one record per 16 KiB
  PipeSender pipes_;      // plain TCP: piped file reads go by splice
  PipeReceiver pipes_in_;  // and come so, when the session wants them piped
  protocol::Session& session_;
  protocol::SessionHandler& handler_;
  std::string initial_;
  std::string peer_;
  Signal writer_signal_;
  Signal done_signal_;  // the writer or the ticker finished
  Signal closed_signal_;  // close() ran
  asio::steady_timer linger_timer_;  // closeAfterFlushAndPeer()'s bound
  std::chrono::milliseconds linger_bound_{0};
  bool linger_ = false;  // after the flush, wait for the peer's close
  asio::steady_timer tick_timer_;
  std::chrono::steady_clock::time_point rtt_noted_{};
  bool closed_ = false;
  bool close_after_flush_ = false;
  bool writer_done_ = false;
  bool ticker_done_ = false;
  absl::Status status_;
};

// "host:port" / "[v6]:port" -> parts. INVALID_ARGUMENT naming the input.
absl::Status splitHostPort(const std::string& in, std::string* host, std::string* port);

}  // namespace siphon::net
