// What every connection the HTTP engine serves shares: the router, the
// options, the drain flag, and the registry of live connections (drain,
// stop, the count a drain waits for). HTTP/1 (http1.cc) and HTTP/2
// (http2.cc) connections both register here.
//
// Threads: the event loop only.
#pragma once

#include <memory>
#include <set>

#include "agent/steal/http/router.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

class LiveConnection {
 public:
  virtual ~LiveConnection() = default;
  // The agent drains: take no new request, finish what is under way, then
  // close (HTTP/1: the response gets "Connection: close"; an idle
  // connection closes at once. HTTP/2: GOAWAY, then close once the streams
  // under way are done).
  virtual void drain() = 0;
  // Close now, aborting what is under way (the agent stops).
  virtual void abort() = 0;
  // A request, an upgraded tunnel or a passthrough is under way: a drain
  // waits for it.
  virtual bool busy() const = 0;
};

class Http2AppPool;  // http2.h
class Http1AppPool;  // pool.h

struct EngineState {
  EngineState(net::asio::any_io_executor executor, HttpRouter& r, HttpOptions o)
      : ex(std::move(executor)), router(r), options(o) {}

  net::asio::any_io_executor ex;
  HttpRouter& router;
  HttpOptions options;
  bool draining = false;
  bool stopped = false;
  // Registered by each connection while it lives (it removes itself).
  std::set<LiveConnection*> connections;
  // HTTP/2 connections to the application, shared by the HTTP/2 client
  // connections (created by http2.cc on first use).
  std::shared_ptr<Http2AppPool> h2_pool;
  // Keep-alive HTTP/1.1 connections to the application, shared by the
  // HTTP/1 client connections (pool.h, made on first use).
  std::shared_ptr<Http1AppPool> h1_pool;
};

}  // namespace siphon::agent::steal::http
