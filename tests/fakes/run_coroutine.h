// Runs one test coroutine on a fresh io_context: `body(executor)` until it
// finishes, or until `limit` has passed (then the test fails, instead of
// hanging). For tests that drive the client library on one event loop.
#pragma once

#include <gtest/gtest.h>

#include <chrono>

#include "siphon/transport/asio.h"

namespace siphon::fakes {

template <typename F>
void runCoroutine(F body, std::chrono::seconds limit = std::chrono::seconds(20)) {
  net::asio::io_context io;
  bool done = false;
  net::asio::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        co_await body(io.get_executor());
        done = true;
        io.stop();
      },
      net::asio::detached);
  net::asio::steady_timer timer(io, limit);
  timer.async_wait([&](net::error_code ec) {
    if (!ec) io.stop();
  });
  io.run();
  ASSERT_TRUE(done) << "the test did not finish within " << limit.count() << " s";
}

}  // namespace siphon::fakes
