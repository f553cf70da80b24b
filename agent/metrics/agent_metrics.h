// The agent's metrics (docs/OPERATIONS.md lists them): the Registry with
// every siphon_ family declared, and cheap hooks for the hot paths (bytes of
// a stream kind are one relaxed atomic add on a series found at start-up).
//
// Threads: the count*() hooks may run on any thread. setStateSource() and
// render() run on the event loop (the state source reads the server's
// sessions there).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "agent/metrics/registry.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::agent::metrics {

// What a stream carries, for the by-kind metrics.
enum class StreamKind {
  kStolen,
  kStolenRequest,
  kMirrored,
  kOutgoingTcp,
  kOutgoingUdp,
  kOutgoingUnix,
  kCapture,
  kOther,
};
inline constexpr size_t kStreamKinds = 8;
std::string_view streamKindName(StreamKind kind);
StreamKind streamKindOf(const v1::StreamOpen& open);

// Which frame carried an error to a client.
enum class ErrorFrame { kResponse, kStreamReset, kReject, kGoaway };

// The live state a scrape reports as gauges, read from the server.
struct LiveState {
  uint64_t sessions_attached = 0;
  uint64_t sessions_detached = 0;
  std::array<uint64_t, kStreamKinds> streams{};
  bool ready = false;
  uint64_t handshakes_pending = 0;  // connections not past their Hello
};

class AgentMetrics {
 public:
  AgentMetrics();

  // Called at every scrape, on the event loop.
  void setStateSource(std::function<LiveState()> source) { state_ = std::move(source); }

  // Also counts stolen/mirrored connections and stolen requests.
  void streamOpened(StreamKind kind);
  void bytesIn(StreamKind kind, uint64_t n) { bytes_in_[index(kind)]->add(n); }
  void bytesOut(StreamKind kind, uint64_t n) { bytes_out_[index(kind)]->add(n); }
  // A gap (bytes the client will never get) on a mirrored or capture stream.
  void gap(StreamKind kind, uint64_t bytes);
  // An error sent to a client.
  void errorSent(v1::ErrorCode code, ErrorFrame frame);
  // A request answered: by kind (v1::Request::BodyCase: "file", "dns"...)
  // and result ("ok" or the error, see resultName()). File requests also
  // count by operation (v1::FileRequest::OpCase). Errors count as sent.
  void requestAnswered(int body_case, int file_op_case, const v1::Response& response);
  // A resume attempt: "ok", or why it failed.
  void resume(std::string_view result);
  void session(std::string_view event);  // "opened", "ended", "lost"
  // A handover (docs/CONTINUITY.md): "given" (this agent handed over and
  // exits), "taken" (this agent took over), "refused", "failed".
  void handover(std::string_view result);
  // A connection closed at accept, before its handshake: "max_handshakes",
  // "max_handshakes_per_source" or "fd_reserve" (every slot of the rule
  // was held by a connection past its Hello).
  void handshakeRejected(std::string_view reason);
  // A connection without a complete Hello closed to make room for a newer
  // one, by the rule that was full (the same names).
  void handshakeEvicted(std::string_view reason);
  // An HTTP/2 client of a filtered steal went past a limit
  // (steal/http/http2_limits.h: "header_list", "reset_flood"...).
  void http2LimitHit(std::string_view limit);

  // "ok", the error code's name in lower case ("not_found"), or for ERRNO
  // the errno's name ("ENOENT").
  static std::string resultName(const v1::Response& response);

  std::string render() const { return registry_.render(); }
  Registry& registry() { return registry_; }

 private:
  static size_t index(StreamKind k) { return static_cast<size_t>(k); }

  Registry registry_;
  std::function<LiveState()> state_;
  const double start_time_seconds_;
  std::array<Series*, kStreamKinds> opened_{};
  std::array<Series*, kStreamKinds> bytes_in_{};
  std::array<Series*, kStreamKinds> bytes_out_{};
};

}  // namespace siphon::agent::metrics
