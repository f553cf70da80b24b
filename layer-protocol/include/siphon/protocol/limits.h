// Limits of a session, negotiated in the handshake (Hello.requested_limits,
// Welcome.limits): the agent answers each with min(asked, its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "siphon/protocol/codec.h"
#include "siphon/v1/handshake.pb.h"

namespace siphon::protocol {

// Room a Request or Response needs around the bytes of a file read or write
// (envelope, ids, tags); max_read_size is kept this far below max_frame_size
// so the largest read still fits in one frame.
inline constexpr uint32_t kReadSizeHeadroom = 1024;

// Bounds of the agent's limit flags (validateAgentLimits): below the floor a
// session could not work, above the ceiling a value is a typo, not a plan.
inline constexpr uint32_t kMinFrameSize = 4096;
inline constexpr uint32_t kMaxFrameSizeCeiling = 16u << 20;
inline constexpr uint32_t kMaxStreamsCeiling = 1u << 20;
inline constexpr uint32_t kMaxPendingRequestsCeiling = 1u << 20;
inline constexpr uint64_t kMaxSessionBufferCeiling = 4ull << 30;

// Floors and ceilings of the negotiated values (clampLimits), the same for
// both roles: a hostile client cannot drive the agent, nor a hostile agent
// the client, with a value no session needs.
//  - keepalive: a ping costs a frame and a wake-up each way; below 100 ms a
//    peer asking 0 or 1 ms would have the event loop ping every turn, and
//    above 10 minutes a dead peer would hold its session for hours. The
//    timeout is at least two intervals (an idle peer is only heard when it
//    pings) and at most an hour.
//  - stream window: below 16 KiB a stream moves a frame and a WindowUpdate
//    per few hundred bytes (the credit returns in quarter-window steps);
//    above 16 MiB the window is no flow control at all.
//  - grace: at most a day of holding a detached session.
inline constexpr std::chrono::milliseconds kMinKeepaliveInterval{100};
inline constexpr std::chrono::milliseconds kMaxKeepaliveInterval{10 * 60 * 1000};
inline constexpr std::chrono::milliseconds kMaxKeepaliveTimeout{60 * 60 * 1000};
inline constexpr uint32_t kMinStreamWindow = 16 * 1024;
inline constexpr uint32_t kMaxStreamWindowCeiling = 16u << 20;
inline constexpr std::chrono::milliseconds kMaxSessionGrace{24 * 60 * 60 * 1000};

// The message of a limit error: the limit, its value and the agent flag
// that raises it ("stream limit of 8 reached (siphon-agent --max-streams raises
// it)").
std::string limitReached(std::string_view what, uint64_t value, std::string_view flag);

struct SessionLimits {
  uint32_t max_frame_size = kDefaultMaxFrameSize;
  uint32_t initial_stream_window = 256 * 1024;
  uint32_t max_streams = 1024;
  uint32_t max_pending_requests = 1024;
  // Unacked bytes a side keeps for replay (sent or not: the agent's
  // --max-session-buffer); when full, streams get no credit (their sockets
  // stop being read: TCP backpressure), nothing is dropped. Answers may take
  // up to twice it (Session::reserveResponse, sendResponse).
  uint64_t replay_buffer_bytes = 16 * 1024 * 1024;
  std::chrono::milliseconds keepalive_interval{5000};
  std::chrono::milliseconds keepalive_timeout{20000};
  std::chrono::milliseconds session_grace{60000};
  uint32_t max_read_size = kDefaultMaxFrameSize - kReadSizeHeadroom;
  // Receive windows, each side's own (not negotiated): a stream whose reader
  // keeps up grows its window from initial_stream_window up to
  // max_stream_window (fewer WindowUpdates, so fewer wake-ups per byte, and
  // a window that covers the path), while the growth of all streams of the
  // session stays within window_growth_budget. What a session may hold for
  // readers that stop is so bounded by streams x initial window + budget.
  uint32_t max_stream_window = 16 * 1024 * 1024;
  uint64_t window_growth_budget = 32 * 1024 * 1024;
};

v1::Limits toProto(const SessionLimits& limits);
// Fields left at 0 take the default; the result is clampLimits()'d, so what
// a (hostile) agent puts in its Welcome binds the client only within the
// floors and ceilings.
SessionLimits fromProto(const v1::Limits& limits);
// Each limit: the smaller of the two, where `asked` sets it (non-zero).
// Grace is the agent's own. Then clampLimits().
SessionLimits negotiateLimits(const v1::Limits& asked, const SessionLimits& agent);
// Every negotiated value into its bounds: a value outside is clamped to the
// nearest bound, not refused (a client that asks too much or too little
// still gets a session, and the Welcome tells it what holds):
// max_frame_size in [kMinFrameSize, kMaxFrameSizeCeiling],
// initial_stream_window in [kMinStreamWindow, kMaxStreamWindowCeiling],
// max_streams and max_pending_requests in [1, their ceilings], the replay
// buffer in [two frames, kMaxSessionBufferCeiling], keepalive_interval in
// [kMinKeepaliveInterval, kMaxKeepaliveInterval], keepalive_timeout in
// [2 x interval, kMaxKeepaliveTimeout] (the interval comes down to half a
// shorter timeout first), session_grace at most kMaxSessionGrace, and
// max_read_size in [1, max_frame_size - kReadSizeHeadroom].
SessionLimits clampLimits(SessionLimits limits);

// The agent's own limits as its flags set them: INVALID_ARGUMENT naming the
// flag for a value out of its bounds (zero, above the ceilings above), a read
// size above the frame size less kReadSizeHeadroom, a session buffer
// smaller than two frames, or a keepalive outside the bounds of clampLimits.
absl::Status validateAgentLimits(const SessionLimits& limits);

}  // namespace siphon::protocol
