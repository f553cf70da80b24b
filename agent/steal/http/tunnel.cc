#include "agent/steal/http/tunnel.h"

#include <sys/socket.h>

#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {

namespace asio = net::asio;

Descriptor adoptSocket(asio::any_io_executor ex, int fd) {
  int family = AF_UNSPEC;
  socklen_t len = sizeof(family);
  ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &family, &len);
  return Descriptor(ex, asio::generic::stream_protocol(family, SOCK_STREAM), fd);
}

void abortDescriptor(Descriptor& d) {
  if (!d.is_open()) return;
  linger l{1, 0};
  // Fails harmlessly (ENOPROTOOPT is not returned; unix sockets ignore it).
  ::setsockopt(d.native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  net::error_code ignored;
  d.close(ignored);
}

Tunnel::Tunnel(Descriptor a, std::string to_b, Descriptor b, std::string to_a)
    : a_(std::move(a)), b_(std::move(b)), to_b_(std::move(to_b)), to_a_(std::move(to_a)) {}

void Tunnel::abort() {
  if (aborted_) return;
  aborted_ = true;
  abortDescriptor(a_);
  abortDescriptor(b_);
}

net::awaitable<void> Tunnel::pipe(bool a_to_b) {
  Descriptor& from = a_to_b ? a_ : b_;
  Descriptor& to = a_to_b ? b_ : a_;
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
      ::shutdown(to.native_handle(), SHUT_WR);
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
  net::error_code ignored;
  a_.close(ignored);
  b_.close(ignored);
}

}  // namespace siphon::agent::steal::http
