// Reading and writing single frames on a socket, for the handshake (before a
// Session exists).
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "siphon/transport/asio.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::net {

struct FirstFrame {
  v1::Frame frame;
  std::string leftover;  // bytes after the frame, for the session
};

// Reads exactly one frame, with a deadline. UNAVAILABLE on I/O failure,
// TIMEOUT past the deadline, PROTOCOL_ERROR / FRAME_TOO_LARGE on bad bytes.
awaitable<absl::StatusOr<FirstFrame>> readFirstFrame(tcp::socket& socket,
                                                     std::chrono::milliseconds timeout,
                                                     uint32_t max_frame_size);

// Writes one frame. UNAVAILABLE on failure.
awaitable<absl::Status> writeFrame(tcp::socket& socket, const v1::Frame& frame);

}  // namespace siphon::net
