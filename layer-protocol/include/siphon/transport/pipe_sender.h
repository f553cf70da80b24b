// Sends a piped file read (protocol/piped_bytes.h) into a TCP socket
// without copying it: tee(2) from the data's pipe into a pipe of our own
// (the data stays where it is, for a replay after a resume), then
// splice(2) from ours into the socket. The socket's skbs then hold the
// file's pages; over loopback the receiver's copy is the only one.
//
// Threads: one per socket's executor (the SessionTransport's writer).
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "siphon/protocol/piped_bytes.h"
#include "siphon/transport/asio.h"

namespace siphon::net {

class PipeSender {
 public:
  PipeSender() = default;
  ~PipeSender();
  PipeSender(const PipeSender&) = delete;
  PipeSender& operator=(const PipeSender&) = delete;

  // Sends `data`'s bytes from the start into `socket` (made non-blocking),
  // waiting for room as needed. Returns how many went: all of them, or
  // fewer (0 when splicing is not possible here: a socket or pipe that
  // cannot, a descriptor limit), in which case the caller sends the rest
  // from data.materialize(). An error is the socket's (the transport is
  // dead; what went is unknown to the peer, which the session replays).
  awaitable<absl::StatusOr<size_t>> send(tcp::socket& socket, protocol::PipedBytes& data);

  // False once a splice into this transport's socket was refused (the
  // sender then leaves every frame to the caller).
  bool usable() const { return !disabled_; }

 private:
  // A scratch pipe at least `size` bytes large; false when none can be had.
  bool ready(size_t size);
  void drop();

  int read_ = -1, write_ = -1;
  size_t capacity_ = 0;
  bool disabled_ = false;
};

}  // namespace siphon::net
