// A raw byte bridge between two byte streams, for what the HTTP engine
// stops parsing: a passthrough (a connection that is not HTTP, with the
// bytes detection already read replayed first) and an upgraded connection
// (after a 101, with whatever each side sent past the 101 exchange; the
// other side is the application or the session that stole the request).
//
// Like steal::splice() (passthrough.h), it keeps TCP semantics: EOF one way
// becomes shutdown(SHUT_WR) (or a stolen request's end) the other way, an
// error either way aborts both (TCP: RST through SO_LINGER 0; a stolen
// stream is reset). Unlike it, the owner can abort it (the
// engine stops) and await its end, so an engine connection stays
// registered, and busy, while its tunnel runs.
//
// Threads: the event loop that owns the sockets.
#pragma once

#include <memory>
#include <string>

#include "agent/steal/http/byte_stream.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

class Tunnel {
 public:
  // `to_b`: bytes already read from `a` that `b` gets first; `to_a` the
  // same the other way.
  Tunnel(ByteStream a, std::string to_b, ByteStream b, std::string to_a);
  Tunnel(const Tunnel&) = delete;
  Tunnel& operator=(const Tunnel&) = delete;

  // Runs until both directions are closed (or abort()); both streams are
  // closed when it returns. Call once; the Tunnel must outlive it.
  net::awaitable<void> run();
  // Both streams aborted now (RST, reset); run() returns soon after.
  void abort();
  // True when either side failed or abort() was called.
  bool aborted() const { return aborted_; }

 private:
  net::awaitable<void> pipe(bool a_to_b);

  ByteStream a_;
  ByteStream b_;
  std::string to_b_;
  std::string to_a_;
  bool aborted_ = false;
};

}  // namespace siphon::agent::steal::http
