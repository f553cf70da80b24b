#include "agent/steal/http/tunnel.h"

#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {

namespace asio = net::asio;

Tunnel::Tunnel(ByteStream a, std::string to_b, ByteStream b, std::string to_a)
    : a_(std::move(a)), b_(std::move(b)), to_b_(std::move(to_b)), to_a_(std::move(to_a)) {}

void Tunnel::abort() {
  if (aborted_) return;
  aborted_ = true;
  a_.abort();
  b_.abort();
}

net::awaitable<void> Tunnel::pipe(bool a_to_b) {
  ByteStream& from = a_to_b ? a_ : b_;
  ByteStream& to = a_to_b ? b_ : a_;
  std::string& pending = a_to_b ? to_b_ : to_a_;
  net::error_code ec;
  if (!pending.empty()) {
    co_await asio::async_write(to, asio::buffer(pending),
                               asio::redirect_error(net::use_awaitable, ec));
    pending.clear();
    pending.shrink_to_fit();
    if (ec) {
      abort();
      co_return;
    }
  }
  std::string buf(64 * 1024, '\0');
  while (!aborted_) {
    const size_t n = co_await from.async_read_some(asio::buffer(buf),
                                                   asio::redirect_error(net::use_awaitable, ec));
    if (aborted_) break;
    if (ec == asio::error::eof) {
      to.shutdownSend();
      break;
    }
    if (ec) {
      abort();
      break;
    }
    co_await asio::async_write(to, asio::buffer(buf.data(), n),
                               asio::redirect_error(net::use_awaitable, ec));
    if (ec) {
      abort();
      break;
    }
  }
}

net::awaitable<void> Tunnel::run() {
  auto ex = co_await asio::this_coro::executor;
  bool other_done = false;
  net::Signal signal(ex);
  // Joined, not detached: the other direction waits for it below. An
  // exception is reported like net::spawn's, and the tunnel still closes.
  asio::co_spawn(ex, pipe(true), [&other_done, &signal](std::exception_ptr e) {
    if (e) net::reportSpawnFailure("tunnel_pipe", e);
    other_done = true;
    signal.notify();
  });
  co_await pipe(false);
  while (!other_done) co_await signal.wait();
  a_.close();
  b_.close();
}

}  // namespace siphon::agent::steal::http
