// A raw byte bridge between two sockets, for what the HTTP engine stops
// parsing: a passthrough (a connection that is not HTTP, with the bytes
// detection already read replayed first) and an upgraded connection (after
// a 101, with whatever each side sent past the 101 exchange).
//
// Like steal::splice() (passthrough.h), it keeps TCP semantics: EOF one way
// becomes shutdown(SHUT_WR) the other way, an error either way aborts both
// (TCP: RST through SO_LINGER 0). Unlike it, the owner can abort it (the
// engine stops) and await its end, so an engine connection stays
// registered, and busy, while its tunnel runs.
//
// Threads: the event loop that owns the sockets.
#pragma once

#include <memory>
#include <string>

#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

// Sockets as Asio's generic stream sockets, not posix::stream_descriptor:
// their writes are sendmsg(MSG_NOSIGNAL), so a peer that closed gives
// EPIPE, never a SIGPIPE that would kill the agent.
using Descriptor = net::asio::generic::stream_protocol::socket;

// Adopts a connected stream socket (TCP or unix) of any family.
Descriptor adoptSocket(net::asio::any_io_executor ex, int fd);

// Closes `d` with an RST when it is a TCP socket (SO_LINGER 0); a unix
// socket just closes.
void abortDescriptor(Descriptor& d);

class Tunnel {
 public:
  // `to_b`: bytes already read from `a` that `b` gets first; `to_a` the
  // same the other way.
  Tunnel(Descriptor a, std::string to_b, Descriptor b, std::string to_a);
  Tunnel(const Tunnel&) = delete;
  Tunnel& operator=(const Tunnel&) = delete;

  // Runs until both directions are closed (or abort()); the sockets are
  // closed when it returns. Call once; the Tunnel must outlive it.
  net::awaitable<void> run();
  // Both sockets closed now (RST); run() returns soon after.
  void abort();
  // True when either side failed or abort() was called.
  bool aborted() const { return aborted_; }

 private:
  net::awaitable<void> pipe(bool a_to_b);

  Descriptor a_;
  Descriptor b_;
  std::string to_b_;
  std::string to_a_;
  bool aborted_ = false;
};

}  // namespace siphon::agent::steal::http
