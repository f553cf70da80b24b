// Reading and writing single frames on a socket or a Stream (plain or TLS),
// for the handshake (before a Session exists). Instantiated for tcp::socket
// and Stream.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/stream.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::net {

struct FirstFrame {
  v1::Frame frame;
  std::string leftover;  // bytes after the frame, for the session
};

// Reads exactly one frame, with a deadline. UNAVAILABLE on I/O failure,
// TIMEOUT past the deadline, PROTOCOL_ERROR / FRAME_TOO_LARGE on bad bytes,
// UNAUTHENTICATED when a TLS peer ends the connection with an alert (an
// agent refusing the client's certificate says so here, in TLS 1.3).
template <typename S>
awaitable<absl::StatusOr<FirstFrame>> readFirstFrame(S& socket, std::chrono::milliseconds timeout,
                                                     uint32_t max_frame_size);

// Waits until the peer has sent its first bytes (or closed the
// connection), reading nothing: OK then, TIMEOUT ("no bytes within N ms")
// past `timeout`, UNAVAILABLE when the wait fails (the socket closed under
// it). The agent's short first deadline of a handshake, before TLS or the
// Hello's read: a TLS ClientHello counts as bytes.
awaitable<absl::Status> waitFirstBytes(tcp::socket& socket, std::chrono::milliseconds timeout);

// Writes one frame. UNAVAILABLE on failure.
template <typename S>
awaitable<absl::Status> writeFrame(S& socket, const v1::Frame& frame);

}  // namespace siphon::net
