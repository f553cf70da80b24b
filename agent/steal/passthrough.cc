#include "agent/steal/passthrough.h"

#include <sys/socket.h>

#include <string>

#include "siphon/transport/spawn.h"

namespace siphon::agent::steal {
namespace {

namespace asio = net::asio;
using Descriptor = asio::posix::stream_descriptor;

struct Splice {
  Splice(asio::any_io_executor ex, UniqueFd a, UniqueFd b, std::function<void()> done)
      : a(ex, a.release()), b(ex, b.release()), done(std::move(done)) {}
  ~Splice() {
    net::error_code ignored;
    a.close(ignored);
    b.close(ignored);
    if (done) done();
  }
  Descriptor a;
  Descriptor b;
  std::function<void()> done;
  bool aborted = false;

  void abort() {
    if (aborted) return;
    aborted = true;
    for (Descriptor* d : {&a, &b}) {
      if (!d->is_open()) continue;
      linger l{1, 0};
      ::setsockopt(d->native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      net::error_code ignored;
      d->close(ignored);
    }
  }
};

// One direction. The last one out closes both sockets (the shared_ptr).
net::awaitable<void> pipe(std::shared_ptr<Splice> splice, bool a_to_b) {
  const std::shared_ptr<Splice> s = std::move(splice);
  Descriptor& from = a_to_b ? s->a : s->b;
  Descriptor& to = a_to_b ? s->b : s->a;
  std::string buf(64 * 1024, '\0');
  while (!s->aborted) {
    net::error_code ec;
    size_t n = co_await from.async_read_some(asio::buffer(buf),
                                             asio::redirect_error(net::use_awaitable, ec));
    if (s->aborted) break;
    if (ec == asio::error::eof) {
      ::shutdown(to.native_handle(), SHUT_WR);
      break;
    }
    if (ec) {
      s->abort();
      break;
    }
    co_await asio::async_write(to, asio::buffer(buf.data(), n),
                               asio::redirect_error(net::use_awaitable, ec));
    if (ec) {
      s->abort();
      break;
    }
  }
}

}  // namespace

void splice(asio::any_io_executor ex, UniqueFd a, UniqueFd b, std::function<void()> done) {
  auto s = std::make_shared<Splice>(ex, std::move(a), std::move(b), std::move(done));
  // A direction that fails resets both sockets of this splice (the other
  // direction then ends), nothing else.
  std::weak_ptr<Splice> weak = s;
  auto abort = [weak] {
    if (auto alive = weak.lock()) alive->abort();
  };
  net::spawn(ex, pipe(s, true), "passthrough_pipe", abort);
  net::spawn(ex, pipe(s, false), "passthrough_pipe", abort);
}

}  // namespace siphon::agent::steal
