// net::spawn(): co_spawn for detached coroutines, agent and client alike.
//
// asio::detached drops the exception_ptr a coroutine ends with, so an
// exception that escapes an accept loop or a handshake used to vanish: the
// loop stopped serving and nothing said why. spawn() catches it at the top:
// it reports the failure (the program's reporter, see below) and calls
// `on_failure`, which ends only what the coroutine belonged to (one session,
// one connection, one subscription), never the whole program. A coroutine
// that ends normally, or by an exception it caught itself, calls nothing.
//
// The reporter is process-wide: by default one line on stderr
// ("siphon: coroutine NAME failed: WHAT"); the agent installs its
// rate-limited log event at start-up (setSpawnFailureReporter). Set it
// before any coroutine runs.
//
// Threads: the completion (reporter and on_failure) runs on `ex`, like the
// coroutine itself.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include "siphon/transport/asio.h"

namespace siphon::net {

// `what` is the name given to spawn(), `error` the exception's text.
using SpawnFailureReporter = void (*)(std::string_view what, std::string_view error);
void setSpawnFailureReporter(SpawnFailureReporter reporter);

// The text of an exception_ptr: a std::exception's what(), else
// "unknown exception".
std::string describeException(std::exception_ptr e);
// Reports through the installed reporter (the completion of spawn()).
void reportSpawnFailure(std::string_view what, std::exception_ptr e);

// Starts `coroutine` on `ex` detached; see the top of the file. `what` names
// the coroutine in the report ("accept_loop", "handshake", ...).
template <typename Executor, typename T>
void spawn(Executor&& ex, awaitable<T> coroutine, std::string_view what,
           std::function<void()> on_failure = {}) {
  asio::co_spawn(std::forward<Executor>(ex), std::move(coroutine),
                 [what = std::string(what), on_failure = std::move(on_failure)](
                     std::exception_ptr e, auto&&...) {
                   if (!e) return;
                   reportSpawnFailure(what, e);
                   if (on_failure) on_failure();
                 });
}

}  // namespace siphon::net
