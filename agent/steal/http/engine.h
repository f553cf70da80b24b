// The HTTP engine of filtered steals: every connection the steal takes on a
// port that has filtered subscriptions comes here. Per connection:
//
//   detect   the client's first bytes, within HttpOptions::detect_timeout:
//            the HTTP/2 preface -> HTTP/2 (http2.h); an HTTP/1.x request
//            line -> HTTP/1 (below); anything else, or nothing in time (a
//            server-first protocol) -> passthrough: the bytes already read
//            and all that follows go to the application untouched.
//   HTTP/1   requests are read one after the other (Boost.Beast parser).
//            Each is routed (HttpRouter::route): to the session that stole
//            it (a StolenRequest stream), or to the application through a
//            pooled keep-alive connection. The response goes back before
//            the next request is read, so pipelined requests are answered
//            in order. Bodies stream both ways with flow control (never held
//            whole). An upgrade (WebSocket, Connection: Upgrade) answered
//            101 bridges the connection's raw bytes to where the request
//            went. An h2c upgrade (Upgrade: h2c, no body) switches the
//            connection to HTTP/2.
//   errors   the session gone before its response: 502 with a short body
//            naming the agent; a response already begun: the connection is
//            aborted (RST), never a hang. Limits: 431, 413, 502.
//   handover park(): no connection takes a new request; an HTTP/1 one
//            stops once its response is out, a detecting one at once, with
//            what each read of the next request kept (exportParked); an
//            HTTP/2 one is sent GOAWAY and closes once its streams are
//            done (its client reconnects, to whichever agent accepts).
//            Another agent adopt()s the parked ones; unpark() goes on here.
//
// Threads: the event loop only.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "agent/common/unique_fd.h"
#include "agent/steal/http/engine_state.h"
#include "agent/steal/http/router.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

class HttpEngine {
 public:
  HttpEngine(net::asio::any_io_executor ex, HttpRouter& router, HttpOptions options);
  ~HttpEngine();  // aborts what is left
  HttpEngine(const HttpEngine&) = delete;
  HttpEngine& operator=(const HttpEngine&) = delete;

  // Takes a connection the steal accepted (non-blocking TCP socket).
  void serve(UniqueFd client, ConnectionInfo info);
  // Drain: no new request is taken; connections close once what is under
  // way is done (idle ones at once).
  void drain();
  // Every connection is closed now.
  void stop();
  // Connections with a request, tunnel or passthrough under way.
  size_t inFlight() const;
  // Connections served now (any state).
  size_t connections() const;

  // Handover (see above). unparked(): connections not parked yet (requests
  // under way, HTTP/2 streams finishing, tunnels).
  void park();
  void unpark();
  size_t unparked() const;
  // While every connection is parked: a copy of each one's socket and state.
  absl::StatusOr<std::vector<ParkedConnection>> exportParked();
  // Serves connections another agent parked, each from where it stopped.
  void adopt(std::vector<ParkedConnection> connections);
  // HTTP/2 clients refused for going past a limit (http2_limits.h), by
  // Http2Limit; `observer` hears each one as it happens (the agent's
  // metrics). Set the observer before serving.
  std::array<uint64_t, kHttp2Limits> http2Limits() const;
  void onHttp2Limit(std::function<void(Http2Limit)> observer);

 private:
  std::shared_ptr<EngineState> state_;
};

}  // namespace siphon::agent::steal::http
