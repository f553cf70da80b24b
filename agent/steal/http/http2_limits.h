// What one HTTP/2 client connection may make the engine hold or do
// (http2.cc), as small pieces that do no I/O:
//
//   HeaderBlockBudget  one header block (a request head, or its trailers)
//                      as it is decoded: RFC 7541 4.1 sizes a header list
//                      as name + value + 32 per field. HPACK lets a 16 KiB
//                      frame of one-byte indices decode to megabytes, so
//                      the limit is on the decoded list, checked before a
//                      field is stored.
//   EventBudget        a token bucket for what a peer may repeat (resets,
//                      PING, SETTINGS, refused header blocks): `burst` at
//                      once, refilled at `per_second`. An honest client
//                      stays far below; a flood spends it whatever the
//                      machine's speed, since a flood of N > burst events
//                      would have to last (N - burst) / per_second seconds
//                      to get through.
//
// Threads: the owner's (the event loop).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace siphon::agent::steal::http {

// RFC 7541 4.1: the size of a header field in a header list.
inline constexpr size_t kHeaderFieldOverhead = 32;
// Fields in one HTTP/2 header block, whatever their size (the byte limit
// is --http-max-head, HttpOptions::max_head_bytes).
inline constexpr size_t kHttp2MaxHeaderFields = 256;

class HeaderBlockBudget {
 public:
  HeaderBlockBudget(size_t max_bytes, size_t max_fields)
      : max_bytes_(max_bytes), max_fields_(max_fields) {}

  // A new header block begins (the request head, then the trailers).
  void reset() {
    bytes_ = 0;
    fields_ = 0;
  }
  // One more decoded field: false (nothing counted) when it would take the
  // block past either limit.
  bool add(size_t name_len, size_t value_len) {
    const size_t size = name_len + value_len + kHeaderFieldOverhead;
    if (fields_ + 1 > max_fields_ || size > max_bytes_ || bytes_ > max_bytes_ - size) {
      return false;
    }
    bytes_ += size;
    ++fields_;
    return true;
  }
  size_t bytes() const { return bytes_; }
  size_t fields() const { return fields_; }

 private:
  size_t max_bytes_;
  size_t max_fields_;
  size_t bytes_ = 0;
  size_t fields_ = 0;
};

class EventBudget {
 public:
  using Clock = std::chrono::steady_clock;

  EventBudget(uint32_t burst, uint32_t per_second)
      : burst_(burst), per_second_(per_second), tokens_(burst) {}

  // One event at `now`: false once the budget is spent (the event is over
  // the limit).
  bool take(Clock::time_point now) {
    if (started_) {
      const auto elapsed = std::chrono::duration<double>(now - last_).count();
      if (elapsed > 0) tokens_ = std::min<double>(burst_, tokens_ + elapsed * per_second_);
    }
    started_ = true;
    last_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  uint32_t burst_;
  uint32_t per_second_;
  double tokens_;
  bool started_ = false;
  Clock::time_point last_{};
};

// Why a client connection or stream was refused, for the counters
// (EngineState::h2_limits) and the agent's metrics.
enum class Http2Limit {
  kHeaderList,     // a header block past the limits: RST_STREAM
  kHeaderFlood,    // too many such blocks: GOAWAY ENHANCE_YOUR_CALM
  kContinuations,  // too many CONTINUATION frames in one block: GOAWAY
  kControlFlood,   // too many PING / SETTINGS / PRIORITY frames: GOAWAY
  kResetFlood,     // too many streams reset before their response: GOAWAY
  kProtocol,       // a fatal protocol error (flooded output, bad preface): GOAWAY
  kPoolFull,       // too many requests waiting on one application connection: 503
};
inline constexpr size_t kHttp2Limits = 7;

inline std::string_view http2LimitName(Http2Limit l) {
  switch (l) {
    case Http2Limit::kHeaderList:
      return "header_list";
    case Http2Limit::kHeaderFlood:
      return "header_flood";
    case Http2Limit::kContinuations:
      return "continuation_flood";
    case Http2Limit::kControlFlood:
      return "control_flood";
    case Http2Limit::kResetFlood:
      return "reset_flood";
    case Http2Limit::kProtocol:
      return "protocol_error";
    case Http2Limit::kPoolFull:
      return "pool_full";
  }
  return "unknown";
}

}  // namespace siphon::agent::steal::http
