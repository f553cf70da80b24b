// HTTP/1.x client connections of filtered steals (Boost.Beast parsers).
// Requests are read one at a time; each is routed (HttpRouter::route) to
// the session that stole it or to the application (pool.h), and its
// response goes back before the next request is read, so pipelined
// requests are answered in order. Both sides get canonical HTTP/1.1:
// hop-by-hop headers removed, bodies framed by Content-Length when known,
// else chunked. Bodies stream in pieces both ways at once (a server may
// answer before it read the whole body); neither is ever held whole.
//
// Answers the agent makes itself: 400 (malformed request), 431 (head over
// max_head_bytes), 413 (body over max_request_body), 502 (the session or
// the application failed before a response began: a short text/plain body
// naming the agent and the reason). Once a response has begun, a failure
// aborts the client connection (RST): never a truncated answer that could
// pass for a whole one, never a hang.
//
// Threads: the event loop only.
#pragma once

#include <memory>
#include <string>

#include "agent/common/unique_fd.h"
#include "agent/steal/http/engine_state.h"

namespace siphon::agent::steal::http {

// Serves `client` as HTTP/1 until it closes. `received`: the bytes
// detection already read (the start of the first request). `requests`:
// requests already served on it (a connection another agent parked).
// Registers itself in `state->connections` while it lives.
void serveHttp1(std::shared_ptr<EngineState> state, UniqueFd client, ConnectionInfo info,
                std::string received, uint64_t requests = 0);

}  // namespace siphon::agent::steal::http
