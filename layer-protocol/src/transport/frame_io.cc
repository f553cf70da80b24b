#include "siphon/transport/frame_io.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "siphon/protocol/codec.h"
#include "siphon/status.h"
#include "siphon/transport/tls.h"

namespace siphon::net {
namespace {

struct Watch {
  bool fired = false;  // the deadline passed and cancelled the socket's operations
  bool done = false;   // the operation ended first
};

// Cancels `socket`'s operations when `timeout` passes, unless the caller
// marks the watch done first. Shared, since a completion already queued may
// run after the caller returns.
template <typename S>
std::shared_ptr<Watch> armWatchdog(asio::steady_timer& watchdog, S& socket,
                                   std::chrono::milliseconds timeout) {
  auto watch = std::make_shared<Watch>();
  watchdog.expires_after(timeout);
  watchdog.async_wait([watch, &socket](error_code ec) {
    if (!ec && !watch->done) {
      watch->fired = true;
      error_code ignored;
      socket.cancel(ignored);
    }
  });
  return watch;
}

}  // namespace

template <typename S>
awaitable<absl::StatusOr<FirstFrame>> readFirstFrame(S& socket, std::chrono::milliseconds timeout,
                                                     uint32_t max_frame_size) {
  protocol::FrameDecoder decoder(max_frame_size);
  // The watchdog closes the socket at the deadline, which ends the read.
  asio::steady_timer watchdog(socket.get_executor());
  auto watch = armWatchdog(watchdog, socket, timeout);
  auto disarm = [&] {
    watch->done = true;
    watchdog.cancel();
  };
  while (true) {
    auto next = decoder.next();
    if (!next.ok()) {
      disarm();
      co_return next.status();
    }
    if (next->has_value()) {
      disarm();
      FirstFrame out;
      auto& decoded = **next;
      if (decoded.is_data) {
        co_return protoError(v1::PROTOCOL_ERROR, "stream data before the handshake");
      }
      out.frame = std::move(decoded.frame);
      out.leftover = decoder.takeBuffered();
      co_return out;
    }
    auto buf = decoder.prepare(4096);
    error_code ec;
    size_t n = co_await socket.async_read_some(asio::buffer(buf.data(), buf.size()),
                                               asio::redirect_error(use_awaitable, ec));
    if (watch->fired) {
      co_return protoError(v1::TIMEOUT,
                           absl::StrCat("no handshake frame within ", timeout.count(), " ms"));
    }
    if (ec) {
      disarm();
      if (tls::isTlsError(ec)) {
        co_return protoError(v1::UNAUTHENTICATED, absl::StrCat("TLS: ", ec.message()));
      }
      co_return protoError(v1::UNAVAILABLE,
                           ec == asio::error::eof || ec == ssl::error::stream_truncated
                               ? std::string("connection closed during the handshake")
                               : absl::StrCat("read during the handshake: ", ec.message()));
    }
    decoder.commit(n);
  }
}

awaitable<absl::Status> waitFirstBytes(tcp::socket& socket, std::chrono::milliseconds timeout) {
  // As in readFirstFrame: the watchdog cancels the wait at the deadline.
  asio::steady_timer watchdog(socket.get_executor());
  auto watch = armWatchdog(watchdog, socket, timeout);
  error_code ec;
  co_await socket.async_wait(tcp::socket::wait_read, asio::redirect_error(use_awaitable, ec));
  watch->done = true;
  watchdog.cancel();
  if (watch->fired) {
    co_return protoError(v1::TIMEOUT, absl::StrCat("no bytes within ", timeout.count(), " ms"));
  }
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat("wait for bytes: ", ec.message()));
  co_return absl::OkStatus();
}

template <typename S>
awaitable<absl::Status> writeFrame(S& socket, const v1::Frame& frame) {
  std::string bytes = protocol::encodeFrame(frame);
  error_code ec;
  co_await asio::async_write(socket, asio::buffer(bytes), asio::redirect_error(use_awaitable, ec));
  if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat("write: ", ec.message()));
  co_return absl::OkStatus();
}

template awaitable<absl::StatusOr<FirstFrame>> readFirstFrame<tcp::socket>(
    tcp::socket&, std::chrono::milliseconds, uint32_t);
template awaitable<absl::StatusOr<FirstFrame>> readFirstFrame<Stream>(Stream&,
                                                                      std::chrono::milliseconds,
                                                                      uint32_t);
template awaitable<absl::Status> writeFrame<tcp::socket>(tcp::socket&, const v1::Frame&);
template awaitable<absl::Status> writeFrame<Stream>(Stream&, const v1::Frame&);

}  // namespace siphon::net
