#include "cli/bridge.h"

#include <sys/socket.h>

#include <cerrno>
#include <string>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {

namespace asio = net::asio;

namespace {
}  // namespace

void Bridge::start() {
  auto ex = local.get_executor();
  stream.setSink([weak = weak_from_this()](std::string_view payload) -> size_t {
    auto b = weak.lock();
    return b ? b->sendDirect(payload) : 0;
  });
  // A pump that throws ends this bridged connection, both sides.
  auto fail = [self = shared_from_this()] {
    self->abortLocal();
    self->stream.reset(client::ErrorCode::kInternal, "the bridge failed");
  };
  net::spawn(ex, localToStream(shared_from_this()), "bridge_local_to_stream", fail);
  net::spawn(ex, streamToLocal(shared_from_this()), "bridge_stream_to_local", fail);
}

size_t Bridge::sendDirect(std::string_view payload) {
  if (to_local_busy_ || !local.is_open()) return 0;
  ssize_t n =
      ::send(local.native_handle(), payload.data(), payload.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // Any failure leaves the bytes queued: streamToLocal() waits for room or
  // meets the same error and handles it.
  if (n <= 0) return 0;
  to_local += static_cast<uint64_t>(n);
  return static_cast<size_t>(n);
}

net::awaitable<absl::Status> connectLocal(net::tcp::socket& socket,
                                          std::vector<net::tcp::endpoint> endpoints,
                                          std::chrono::milliseconds timeout, std::string to) {
  // The watchdog's handler may run after this frame is gone (it fired as
  // the connect completed): it holds the watch weakly, and the watch dies
  // with the frame, so a late handler never closes a socket now in use.
  struct Watch {
    Watch(asio::any_io_executor ex, net::tcp::socket* s) : timer(std::move(ex)), socket(s) {}
    asio::steady_timer timer;
    net::tcp::socket* socket;
    bool timed_out = false;
  };
  auto watch = std::make_shared<Watch>(socket.get_executor(), &socket);
  watch->timer.expires_after(timeout);
  watch->timer.async_wait([weak = std::weak_ptr<Watch>(watch)](net::error_code ec) {
    auto self = weak.lock();
    if (ec || !self) return;
    self->timed_out = true;
    net::error_code ignored;
    self->socket->close(ignored);
  });
  net::error_code ec;
  co_await asio::async_connect(socket, endpoints, asio::redirect_error(net::use_awaitable, ec));
  watch->timer.cancel();
  if (watch->timed_out) {
    co_return protoError(v1::UNAVAILABLE, absl::StrCat("connect ", to, ": no answer within ",
                                                       timeout.count(), " ms"));
  }
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat("connect ", to, ": ", ec.message()));
  socket.set_option(net::tcp::no_delay(true), ec);
  co_return absl::OkStatus();
}

LocalDialer dialEndpoints(std::vector<net::tcp::endpoint> endpoints,
                          std::chrono::milliseconds timeout, std::string to) {
  return [endpoints = std::move(endpoints), timeout, to = std::move(to)](net::tcp::socket& s) {
    return connectLocal(s, endpoints, timeout, to);
  };
}

void abortSocket(net::tcp::socket& s) {
  if (!s.is_open()) return;
  net::error_code ignored;
  s.set_option(asio::socket_base::linger(true, 0), ignored);
  s.close(ignored);
}

void Bridge::localFailed(const net::error_code& ec) {
  stream.reset(client::ErrorCode::kCancelled,
               absl::StrCat("the local connection failed: ", ec.message()));
  abortLocal();
}

void Bridge::streamFailed(const absl::Status&) { abortLocal(); }

void Bridge::directionDone() {
  if (--running_ > 0) return;
  net::error_code ignored;
  local.close(ignored);
  finished();
}

// Coroutines take the bridge by value and move it into a local first: GCC 12
// drops by-value coroutine parameters the body never names.
net::awaitable<void> Bridge::localToStream(std::shared_ptr<Bridge> bridge) {
  const std::shared_ptr<Bridge> b = std::move(bridge);
  std::string buf(kRelayChunk, '\0');
  while (true) {
    net::error_code ec;
    size_t n = co_await b->local.async_read_some(asio::buffer(buf),
                                                 asio::redirect_error(net::use_awaitable, ec));
    if (ec == asio::error::eof) {
      // The local side is done sending; the other side may still answer.
      absl::Status s = b->stream.halfClose();
      if (!s.ok()) b->halfCloseFailed(s);
      break;
    }
    if (ec) {
      b->localFailed(ec);
      break;
    }
    absl::Status s = co_await b->stream.write(buf.substr(0, n));
    if (!s.ok()) {
      b->streamFailed(s);
      break;
    }
    b->to_stream += n;
  }
  b->directionDone();
}

net::awaitable<void> Bridge::streamToLocal(std::shared_ptr<Bridge> bridge) {
  const std::shared_ptr<Bridge> b = std::move(bridge);
  while (true) {
    auto chunk = co_await b->stream.read();
    if (!chunk.ok()) {
      b->streamFailed(chunk.status());
      break;
    }
    if (!chunk->has_value()) {
      // The other side sent FIN: pass it on, keep reading the local answer.
      net::error_code ignored;
      b->local.shutdown(net::tcp::socket::shutdown_send, ignored);
      break;
    }
    b->to_local += (*chunk)->size();
    net::error_code ec;
    b->to_local_busy_ = true;
    co_await asio::async_write(b->local, asio::buffer(**chunk),
                               asio::redirect_error(net::use_awaitable, ec));
    b->to_local_busy_ = false;
    if (ec) {
      b->localFailed(ec);
      break;
    }
  }
  b->directionDone();
}

}  // namespace siphon::cli
