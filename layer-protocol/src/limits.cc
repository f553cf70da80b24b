#include "siphon/protocol/limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::protocol {

std::string limitReached(std::string_view what, uint64_t value, std::string_view flag) {
  return absl::StrCat(asv(what), " limit of ", value, " reached (siphon-agent ", asv(flag),
                      " raises it)");
}

v1::Limits toProto(const SessionLimits& l) {
  v1::Limits p;
  p.set_max_frame_size(l.max_frame_size);
  p.set_initial_stream_window(l.initial_stream_window);
  p.set_max_streams(l.max_streams);
  p.set_max_pending_requests(l.max_pending_requests);
  p.set_replay_buffer_bytes(l.replay_buffer_bytes);
  p.set_keepalive_interval_ms(static_cast<uint32_t>(l.keepalive_interval.count()));
  p.set_keepalive_timeout_ms(static_cast<uint32_t>(l.keepalive_timeout.count()));
  p.set_session_grace_ms(static_cast<uint32_t>(l.session_grace.count()));
  p.set_max_read_size(l.max_read_size);
  return p;
}

SessionLimits fromProto(const v1::Limits& p) {
  SessionLimits l;
  if (p.max_frame_size()) l.max_frame_size = p.max_frame_size();
  if (p.initial_stream_window()) l.initial_stream_window = p.initial_stream_window();
  if (p.max_streams()) l.max_streams = p.max_streams();
  if (p.max_pending_requests()) l.max_pending_requests = p.max_pending_requests();
  if (p.replay_buffer_bytes()) l.replay_buffer_bytes = p.replay_buffer_bytes();
  if (p.keepalive_interval_ms())
    l.keepalive_interval = std::chrono::milliseconds(p.keepalive_interval_ms());
  if (p.keepalive_timeout_ms())
    l.keepalive_timeout = std::chrono::milliseconds(p.keepalive_timeout_ms());
  if (p.session_grace_ms()) l.session_grace = std::chrono::milliseconds(p.session_grace_ms());
  if (p.max_read_size()) l.max_read_size = p.max_read_size();
  return clampLimits(l);
}

SessionLimits clampLimits(SessionLimits l) {
  using std::chrono::milliseconds;
  l.max_frame_size = std::clamp(l.max_frame_size, kMinFrameSize, kMaxFrameSizeCeiling);
  l.initial_stream_window =
      std::clamp(l.initial_stream_window, kMinStreamWindow, kMaxStreamWindowCeiling);
  l.max_streams = std::clamp<uint32_t>(l.max_streams, 1, kMaxStreamsCeiling);
  l.max_pending_requests =
      std::clamp<uint32_t>(l.max_pending_requests, 1, kMaxPendingRequestsCeiling);
  l.replay_buffer_bytes = std::clamp<uint64_t>(l.replay_buffer_bytes, 2ull * l.max_frame_size,
                                               kMaxSessionBufferCeiling);
  l.max_read_size = std::clamp<uint32_t>(l.max_read_size, 1, l.max_frame_size - kReadSizeHeadroom);
  // Keepalive: the timeout first (its floor is two of the shortest
  // intervals), then the interval within it: ping at least twice per
  // timeout, never faster than the floor.
  l.keepalive_timeout =
      std::clamp(l.keepalive_timeout, 2 * kMinKeepaliveInterval, kMaxKeepaliveTimeout);
  l.keepalive_interval = std::clamp(l.keepalive_interval, kMinKeepaliveInterval,
                                    std::min(kMaxKeepaliveInterval, l.keepalive_timeout / 2));
  l.session_grace = std::clamp(l.session_grace, milliseconds(0), kMaxSessionGrace);
  return l;
}

SessionLimits negotiateLimits(const v1::Limits& asked, const SessionLimits& agent) {
  SessionLimits l = agent;
  auto pick = [](auto ask, auto own) { return ask ? std::min<decltype(own)>(ask, own) : own; };
  // The floors (clampLimits) keep the session able to move data: a frame
  // holds at least a small data frame, the replay buffer two frames.
  l.max_frame_size = pick(asked.max_frame_size(), agent.max_frame_size);
  l.initial_stream_window = pick(asked.initial_stream_window(), agent.initial_stream_window);
  l.max_streams = pick(asked.max_streams(), agent.max_streams);
  l.max_pending_requests = pick(asked.max_pending_requests(), agent.max_pending_requests);
  l.replay_buffer_bytes = pick(asked.replay_buffer_bytes(), agent.replay_buffer_bytes);
  // A read's bytes travel in one Response frame: a read as large as a frame
  // would make a frame above the maximum and end the session (clampLimits).
  l.max_read_size = pick(asked.max_read_size(), agent.max_read_size);
  // Keepalive: the client may ask for faster pings and a shorter timeout.
  if (asked.keepalive_interval_ms()) {
    l.keepalive_interval = std::min(agent.keepalive_interval,
                                    std::chrono::milliseconds(asked.keepalive_interval_ms()));
  }
  if (asked.keepalive_timeout_ms()) {
    l.keepalive_timeout =
        std::min(agent.keepalive_timeout, std::chrono::milliseconds(asked.keepalive_timeout_ms()));
  }
  // A peer is declared lost after keepalive_timeout of silence, and an idle
  // peer is only heard when it pings: a shorter timeout alone (with the
  // default interval) would drop every idle session. clampLimits() pings at
  // least twice per timeout, and no faster than kMinKeepaliveInterval (a
  // 0 or 1 ms ask would have the agent ping every turn of its event loop).
  return clampLimits(l);
}

}  // namespace siphon::protocol

namespace siphon::protocol {

absl::Status validateAgentLimits(const SessionLimits& l) {
  auto bad = [](std::string_view flag, uint64_t value, std::string_view rule) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat(asv(flag), " ", value, ": ", asv(rule)));
  };
  if (l.max_frame_size < kMinFrameSize || l.max_frame_size > kMaxFrameSizeCeiling) {
    return bad("--max-frame-size", l.max_frame_size / 1024,
               absl::StrCat("must be between ", kMinFrameSize / 1024, " and ",
                            kMaxFrameSizeCeiling / 1024, " KiB"));
  }
  if (l.max_streams == 0 || l.max_streams > kMaxStreamsCeiling) {
    return bad("--max-streams", l.max_streams,
               absl::StrCat("must be between 1 and ", kMaxStreamsCeiling));
  }
  if (l.max_pending_requests == 0 || l.max_pending_requests > kMaxPendingRequestsCeiling) {
    return bad("--max-pending-requests", l.max_pending_requests,
               absl::StrCat("must be between 1 and ", kMaxPendingRequestsCeiling));
  }
  if (l.max_read_size == 0 || l.max_read_size > l.max_frame_size - kReadSizeHeadroom) {
    return bad("--max-read-size", l.max_read_size / 1024,
               absl::StrCat("must be at least 1 KiB and at most --max-frame-size less 1 KiB (",
                            (l.max_frame_size - kReadSizeHeadroom) / 1024,
                            " KiB): a read's answer travels in one frame"));
  }
  if (l.keepalive_interval < kMinKeepaliveInterval ||
      l.keepalive_interval > kMaxKeepaliveInterval) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("--keepalive-interval ", l.keepalive_interval.count(),
                                   " ms: must be between ", kMinKeepaliveInterval.count(),
                                   " ms and ", kMaxKeepaliveInterval.count() / 60000,
                                   " min (faster pings would keep the agent busy)"));
  }
  if (l.keepalive_timeout < 2 * l.keepalive_interval ||
      l.keepalive_timeout > kMaxKeepaliveTimeout) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("--keepalive-timeout ", l.keepalive_timeout.count(),
                                   " ms: must be between twice --keepalive-interval (",
                                   2 * l.keepalive_interval.count(), " ms) and ",
                                   kMaxKeepaliveTimeout.count() / 60000, " min"));
  }
  if (l.replay_buffer_bytes < 2ull * l.max_frame_size ||
      l.replay_buffer_bytes > kMaxSessionBufferCeiling) {
    return bad(
        "--max-session-buffer", l.replay_buffer_bytes / 1024,
        absl::StrCat("must be between two frames (", 2ull * l.max_frame_size / 1024,
                     " KiB, see --max-frame-size) and ", kMaxSessionBufferCeiling / 1024, " KiB"));
  }
  return absl::OkStatus();
}

}  // namespace siphon::protocol
