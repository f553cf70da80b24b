// HTTP/2 connections of filtered steals (nghttp2), prior knowledge or after
// an h2c upgrade. The agent is the server to the client: each stream (one
// request) is routed on its own (HttpRouter::route):
//   - to the session that stole it: a StolenRequest stream carrying the
//     request as HTTP/1.1 (":authority" as Host, body chunked unless
//     content-length was given, trailers as chunk trailers); the session's
//     HTTP/1.1 response becomes the HTTP/2 response (headers, data,
//     trailers);
//   - to the application: over an HTTP/2 connection to it (prior
//     knowledge), shared by the client connections to that destination
//     (Http2AppPool), headers, data and trailers passed through.
// Streams interleave: a slow stream never holds the others (per-stream
// flow control both ways, bounded buffers).
//
// Threads: the event loop only.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/common/unique_fd.h"
#include "agent/steal/http/engine_state.h"
#include "agent/steal/http/request_head.h"

namespace siphon::agent::steal::http {

// An HTTP/1.1 request that asked for h2c (Upgrade: h2c, HTTP2-Settings) and
// has no body: the HTTP/2 side answers 101 and serves it as stream 1.
struct H2cUpgrade {
  RequestHead head;
  std::string settings;  // the HTTP2-Settings header's value (base64url)
};

// Serves `client` as HTTP/2 until it closes. `received`: bytes already read
// from it (with prior knowledge, beginning with the preface; after an
// upgrade, whatever followed the upgrade request). Registers itself in
// `state->connections` while it lives.
void serveHttp2(std::shared_ptr<EngineState> state, UniqueFd client, ConnectionInfo info,
                std::string received, std::optional<H2cUpgrade> upgrade);

class Http2Exchange;       // http2_exchange.h
class Http2AppConnection;  // http2_pool.cc

// HTTP/2 connections (prior knowledge) to the application, one live
// connection per destination, shared by every HTTP/2 client connection of
// the engine: each request the filters leave to the application is a stream
// on it. A connection that fails or sends GOAWAY takes no new stream; the
// next request opens a new one. The pool closes its connections once no
// HTTP/2 client connection is left for HttpOptions::pool_idle_timeout (at
// once when the engine drains or stops).
//
// Created by the first HTTP/2 client connection that needs it and kept in
// EngineState::h2_pool. Threads: the event loop only.
class Http2AppPool : public std::enable_shared_from_this<Http2AppPool> {
 public:
  explicit Http2AppPool(std::weak_ptr<EngineState> state);
  ~Http2AppPool();
  Http2AppPool(const Http2AppPool&) = delete;
  Http2AppPool& operator=(const Http2AppPool&) = delete;

  // Sends the exchange's request to `destination` (its response comes back
  // through the exchange); the exchange's upstream is set at once. A request
  // the application cannot get (no connection, GOAWAY before it was taken
  // twice) is answered 502. `attempt`: 2 for a request refused by a
  // connection that went away (REFUSED_STREAM), which is not retried again.
  void open(const SockAddr& destination, std::shared_ptr<Http2Exchange> exchange, int attempt = 1);

  // An HTTP/2 client connection began / ended (the pool's connections live
  // while there are some, and pool_idle_timeout after).
  void clientOpened();
  void clientClosed();

  // Connections to the application now (any state).
  size_t connectionsForTest() const;

 private:
  friend class Http2AppConnection;
  void forget(Http2AppConnection* conn);
  void closeAll();

  std::weak_ptr<EngineState> state_;
  std::map<std::string, std::shared_ptr<Http2AppConnection>> live_;  // by destination
  std::vector<std::weak_ptr<Http2AppConnection>> all_;
  size_t clients_ = 0;
  uint64_t idle_generation_ = 0;
};

}  // namespace siphon::agent::steal::http
