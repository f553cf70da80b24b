// A local TCP socket joined to a connection of the session (an outgoing
// one, or a stolen one: siphon/client/connections.h), both ways, with TCP
// semantics: EOF one way becomes a half-close the other way (a client that
// shuts down writing still gets its whole answer), and a failure on one side
// is an abort on the other (RST, or a stream reset), never a clean end that
// could pass for a complete transfer. `siphon forward` and `siphon steal`
// bridge each of their connections with it; they differ only in the hooks.
//
// Call order: construct, connect `local` if it is not yet, then start().
// Everything runs on the client's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "siphon/client/connections.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

// Bytes per read when the CLI relays a connection or a stream.
inline constexpr size_t kRelayChunk = 64 * 1024;

// Closes `s` with RST (SO_LINGER 0): the peer sees an abort, never a clean
// end that could pass for a complete transfer. A closed socket is left as is.
void abortSocket(net::tcp::socket& s);

// Connects `socket` to the first of `endpoints` that answers within
// `timeout`, with TCP_NODELAY (requests and answers are often small).
// UNAVAILABLE "connect 127.0.0.1:9000: Connection refused" or "connect
// 127.0.0.1:9000: no answer within 5000 ms" (`to` names the server).
// Closing `socket` meanwhile ends the attempt. Runs on the socket's executor.
net::awaitable<absl::Status> connectLocal(net::tcp::socket& socket,
                                          std::vector<net::tcp::endpoint> endpoints,
                                          std::chrono::milliseconds timeout, std::string to);

// How a command reaches its local server: connects the (closed) `socket`
// it is given, with connectLocal()'s errors. `siphon steal` and `siphon
// mirror` dial endpoints of this machine (dialEndpoints); `siphon exec`
// dials the program's listeners inside its namespace. A dialer is called
// on the socket's executor, and what it captures is copied into each call
// (the coroutine may outlive the function object).
using LocalDialer = std::function<net::awaitable<absl::Status>(net::tcp::socket&)>;
LocalDialer dialEndpoints(std::vector<net::tcp::endpoint> endpoints,
                          std::chrono::milliseconds timeout, std::string to);

class Bridge : public std::enable_shared_from_this<Bridge> {
 public:
  Bridge(net::tcp::socket local_socket, client::Connection s)
      : local(std::move(local_socket)), stream(std::move(s)) {}
  virtual ~Bridge() = default;

  // Spawns the two directions; the last one to end closes `local` and calls
  // finished().
  void start();

  // Closes the local socket with RST (SO_LINGER 0).
  void abortLocal() { abortSocket(local); }

  net::tcp::socket local;
  client::Connection stream;
  uint64_t to_stream = 0;  // bytes from the local socket into the stream
  uint64_t to_local = 0;   // bytes from the stream to the local socket

 protected:
  // The local socket failed (read or write): by default the stream is reset
  // with CANCELLED and the local socket aborted.
  virtual void localFailed(const net::error_code& ec);
  // The stream failed (the agent reset it, or the session is lost): by
  // default the local socket is aborted.
  virtual void streamFailed(const absl::Status& s);
  // The local EOF could not be passed on as a half-close.
  virtual void halfCloseFailed(const absl::Status& s) { (void)s; }
  // Both directions are over and `local` is closed.
  virtual void finished() {}

 private:
  static net::awaitable<void> localToStream(std::shared_ptr<Bridge> bridge);
  static net::awaitable<void> streamToLocal(std::shared_ptr<Bridge> bridge);
  void directionDone();
  // Stream bytes straight to the local socket while streamToLocal() holds
  // nothing (see Connection::setSink): no copy, no hop through the queue.
  size_t sendDirect(std::string_view payload);

  int running_ = 2;
  bool to_local_busy_ = false;  // streamToLocal() is writing a queued chunk
};

}  // namespace siphon::cli
