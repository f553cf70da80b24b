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

#include <memory>
#include <optional>
#include <string>

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

}  // namespace siphon::agent::steal::http
