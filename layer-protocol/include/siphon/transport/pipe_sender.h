// Sends a piped file read (protocol/piped_bytes.h) into a TCP socket
// without copying it: tee(2) from the data's pipe into a pipe of our own
// (the data stays where it is, for a replay after a resume), then
// splice(2) from ours into the socket. The socket's skbs then hold the
// file's pages; over loopback the receiver's copy is the only one.
//
// PipeReceiver is the other end: the bytes of a file read answer the
// session wants piped (Session::pipeWanted) go from the socket into a new
// pipe by splice(2), which takes the skbs' pages without copying them, and
// the pipe goes to the caller (the mount splices it into /dev/fuse).
//
// Threads: one per socket's executor (the SessionTransport's writer and
// reader).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

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

class PipeReceiver {
 public:
  struct Received {
    // All `n` bytes, in a pipe; or null when they could not be spliced:
    // then `partial` holds what was taken from the socket before that (the
    // caller feeds it to the session, which takes the rest in memory).
    std::shared_ptr<protocol::PipedBytes> piped;
    std::string partial;
  };
  // Takes the next `n` bytes of `socket` (made non-blocking) into a pipe,
  // waiting for them as needed; `progress` is called as bytes come (a
  // slow link's read may take longer than a keepalive timeout). An error
  // is the socket's (or its end).
  awaitable<absl::StatusOr<Received>> receive(tcp::socket& socket, size_t n,
                                              std::function<void()> progress = {});

  // False once no pipe of the size could be had (an unprivileged process
  // past fs.pipe-max-size): the caller reads in memory from then on.
  bool usable() const { return !disabled_; }

 private:
  bool disabled_ = false;
};

}  // namespace siphon::net
