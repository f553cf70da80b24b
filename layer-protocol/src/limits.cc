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
  return l;
}

SessionLimits negotiateLimits(const v1::Limits& asked, const SessionLimits& agent) {
  SessionLimits l = agent;
  auto pick = [](auto ask, auto own) { return ask ? std::min<decltype(own)>(ask, own) : own; };
  // A frame must hold at least a small data frame; below that the session
  // could not move a byte.
  l.max_frame_size =
      std::max<uint32_t>(pick(asked.max_frame_size(), agent.max_frame_size), kMinFrameSize);
  l.initial_stream_window =
      std::max<uint32_t>(pick(asked.initial_stream_window(), agent.initial_stream_window), 1024);
  l.max_streams = pick(asked.max_streams(), agent.max_streams);
  l.max_pending_requests = pick(asked.max_pending_requests(), agent.max_pending_requests);
  l.replay_buffer_bytes = std::max<uint64_t>(
      pick(asked.replay_buffer_bytes(), agent.replay_buffer_bytes), 2ull * l.max_frame_size);
  // A read's bytes travel in one Response frame: a read as large as a frame
  // would make a frame above the maximum and end the session.
  l.max_read_size = std::min<uint32_t>(pick(asked.max_read_size(), agent.max_read_size),
                                       l.max_frame_size - kReadSizeHeadroom);
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
  // default interval) would drop every idle session. Ping at least twice per
  // timeout.
  l.keepalive_interval = std::min(l.keepalive_interval, l.keepalive_timeout / 2);
  return l;
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
