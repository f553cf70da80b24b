// Passthrough: a connection the agent accepted but does not give to a
// session (it arrived just after an unsubscribe, or — with HTTP filters —
// no filter wanted it) goes to the original application. The agent
// connects to the original destination from inside the target, around its
// own steering (Steering::exempt), and splices the two sockets both ways.
//
// The splice keeps TCP semantics: EOF one way becomes shutdown(SHUT_WR) the
// other way; an error or reset on either side aborts both with RST, so no
// side mistakes a broken transfer for a complete one.
//
// Threads: the event loop that owns the sockets.
#pragma once

#include <functional>
#include <memory>

#include "agent/common/unique_fd.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal {

// Joins `a` and `b` (connected, non-blocking TCP sockets) until both
// directions are closed. Returns at once; the splice owns the sockets.
// `done` (optional) runs on the event loop once both sockets are closed.
void splice(net::asio::any_io_executor ex, UniqueFd a, UniqueFd b,
            std::function<void()> done = {});

}  // namespace siphon::agent::steal
