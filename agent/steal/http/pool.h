// Keep-alive HTTP/1.1 connections to the application, for the requests no
// filter took: one pool per engine, idle connections kept per destination
// (HttpOptions::pool_max_idle each, closed after pool_idle_timeout), so a
// busy client connection does not cost the application a connection per
// request.
//
// An idle connection can die while pooled (the application closes idle
// keep-alive connections on its own schedule): acquire() checks it first
// (EOF or stray bytes waiting: closed, next one). A request can still race
// the application's close; the HTTP/1 engine retries such a request once on
// a fresh connection when it is safe (no body, no response byte).
//
// Threads: the event loop only.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/steal/http/router.h"
#include "agent/steal/http/tunnel.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

struct EngineState;

struct AppConnection {
  Descriptor socket;
  bool reused = false;  // came from the pool (may have died meanwhile)
};

class Http1AppPool : public std::enable_shared_from_this<Http1AppPool> {
 public:
  Http1AppPool(net::asio::any_io_executor ex, size_t max_idle,
               std::chrono::milliseconds idle_timeout);
  ~Http1AppPool();

  // The pool of `state`, made on first use.
  static std::shared_ptr<Http1AppPool> of(EngineState& state);

  // An idle live connection to `destination`, else a new one through
  // `router` (its error as is). `fresh`: skip the idle ones.
  net::awaitable<absl::StatusOr<AppConnection>> acquire(HttpRouter& router, SockAddr destination,
                                                        bool fresh = false);
  // Gives back a connection whose last exchange ended cleanly (complete
  // response, keep-alive); closed instead when the pool is full or closed.
  void release(const SockAddr& destination, Descriptor socket);
  // Closes every idle connection; later releases close theirs (drain, stop).
  void close();

  size_t idleForTest() const;
  size_t connectsForTest() const { return connects_; }

 private:
  struct Idle {
    Descriptor socket;
    std::chrono::steady_clock::time_point since;
  };
  void sweep();
  void armSweeper();

  net::asio::any_io_executor ex_;
  size_t max_idle_;
  std::chrono::milliseconds idle_timeout_;
  // Most recently released last: acquire() takes from the back (the
  // warmest), the sweeper closes from the front.
  std::map<std::string, std::deque<Idle>> idle_;
  net::asio::steady_timer sweeper_;
  bool sweeper_armed_ = false;
  bool closed_ = false;
  size_t connects_ = 0;
};

}  // namespace siphon::agent::steal::http
