// What every connection the HTTP engine serves shares: the router, the
// options, the drain flag, and the registry of live connections (drain,
// stop, the count a drain waits for). HTTP/1 (http1.cc) and HTTP/2
// (http2.cc) connections both register here.
//
// Threads: the event loop only.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/steal/http/http2_limits.h"
#include "agent/steal/http/router.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

// A client connection parked for a handover (docs/CONTINUITY.md section 8):
// no request under way, what was read of the next one kept. Another agent
// process goes on serving it from here.
struct ParkedConnection {
  UniqueFd client;
  ConnectionInfo info;
  // Its protocol is not known yet (detection goes on with `received`);
  // else HTTP/1.
  bool detecting = false;
  std::string received;   // read from the client, not parsed yet
  uint64_t requests = 0;  // requests served on it so far
};

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
  // Handover: take no new request; once what is under way is done, stop
  // reading (parked()) until unpark(). The default drains (HTTP/2: GOAWAY,
  // the client opens a new connection, which the next agent serves).
  virtual void park() { drain(); }
  virtual void unpark() {}
  virtual bool parked() const { return false; }
  // While parked: a copy of the socket and what the connection holds.
  virtual absl::StatusOr<ParkedConnection> exportParked() {
    return absl::FailedPreconditionError("this connection does not park");
  }
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
  bool parking = false;  // a handover: connections park (LiveConnection::park)
  // Registered by each connection while it lives (it removes itself).
  std::set<LiveConnection*> connections;
  // HTTP/2 connections to the application, shared by the HTTP/2 client
  // connections (created by http2.cc on first use).
  std::shared_ptr<Http2AppPool> h2_pool;
  // Keep-alive HTTP/1.1 connections to the application, shared by the
  // HTTP/1 client connections (pool.h, made on first use).
  std::shared_ptr<Http1AppPool> h1_pool;

  // HTTP/2 clients refused for going past a limit (http2_limits.h), by
  // limit; `on_h2_limit` (the agent's metrics) hears each one.
  std::array<uint64_t, kHttp2Limits> h2_limits{};
  std::function<void(Http2Limit)> on_h2_limit;
  void h2Limit(Http2Limit l) {
    ++h2_limits[static_cast<size_t>(l)];
    if (on_h2_limit) on_h2_limit(l);
  }
  // The largest decoded header block any HTTP/2 stream held (bytes as
  // RFC 7541 counts them), for tests of the bound.
  size_t h2_header_block_high_water = 0;
};

}  // namespace siphon::agent::steal::http
