// The one place that includes Boost.Asio for our code, with the coroutine
// pieces Boost 1.74 has (no as_tuple, deferred, awaitable ||, channels).
#pragma once

#include <boost/asio.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <utility>  // GCC 12 + Boost 1.74 coroutines need it before Asio.

namespace siphon::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
template <typename T = void>
using awaitable = asio::awaitable<T>;
using asio::use_awaitable;
using boost::system::error_code;

// A timer used as a wake-up signal: wait() returns when notify() is called
// (or the timer is destroyed). Boost 1.74 has no channels.
class Signal {
 public:
  explicit Signal(asio::any_io_executor ex) : timer_(ex) {
    timer_.expires_at(asio::steady_timer::time_point::max());
  }
  void notify() { timer_.cancel(); }
  // Waits for notify() or `deadline`, whichever is first.
  awaitable<void> wait(
      asio::steady_timer::time_point deadline = asio::steady_timer::time_point::max()) {
    timer_.expires_at(deadline);
    error_code ec;
    co_await timer_.async_wait(asio::redirect_error(use_awaitable, ec));
  }

 private:
  asio::steady_timer timer_;
};

}  // namespace siphon::net
