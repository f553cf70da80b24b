// The byte stream a protocol connection runs on: a plain TCP socket, or TLS
// over one (OpenSSL through asio::ssl). It is an Asio AsyncReadStream and
// AsyncWriteStream, so frame_io, SessionTransport and asio::async_write take
// it as they take a socket. The plain path is the socket's own operations
// behind one branch: no copy, no virtual call, no extra allocation.
//
// Shutdown and close act on the TCP socket underneath: no TLS close_notify
// is sent. A session's end is said by Goaway, and a cut transport (ss -K, a
// reset) must surface as an I/O error either way, so that the session
// resumes on a new connection.
//
// Threads: like a socket, one executor; at most one read and one write in
// flight (asio::ssl::stream allows that pair).
#pragma once

#include <boost/asio/ssl.hpp>
#include <memory>
#include <utility>

#include "siphon/transport/asio.h"

namespace siphon::net {

namespace ssl = asio::ssl;
using TlsStream = ssl::stream<tcp::socket>;

class Stream {
 public:
  using executor_type = tcp::socket::executor_type;

  // Plain TCP. Implicit: a connected socket is a plain stream.
  Stream(tcp::socket socket) : socket_(std::move(socket)) {}  // NOLINT(runtime/explicit)
  // TLS over `socket`, with `context`'s settings; the TLS handshake is still
  // to be done (tls::accept / tls::connect in tls.h). OpenSSL holds a
  // reference on the context for the stream's life.
  Stream(tcp::socket socket, ssl::context& context)
      : socket_(socket.get_executor()),
        tls_(std::make_unique<TlsStream>(std::move(socket), context)) {}

  Stream(Stream&&) = default;
  Stream& operator=(Stream&&) = default;

  bool tls() const { return tls_ != nullptr; }
  // The TLS stream; only when tls().
  TlsStream& tlsStream() { return *tls_; }
  // The TCP socket underneath.
  tcp::socket& socket() { return tls_ ? tls_->next_layer() : socket_; }
  const tcp::socket& socket() const { return tls_ ? tls_->next_layer() : socket_; }

  executor_type get_executor() { return socket().get_executor(); }

  template <typename MutableBuffers, typename Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    return asio::async_initiate<Token, void(error_code, size_t)>(
        [this](auto handler, const MutableBuffers& b) {
          if (tls_) {
            tls_->async_read_some(b, std::move(handler));
          } else {
            socket_.async_read_some(b, std::move(handler));
          }
        },
        token, buffers);
  }

  // With TLS, only the first non-empty buffer of a sequence is written per
  // call (asio::ssl), each as its own record: gather into one buffer first
  // where that matters (SessionTransport does).
  template <typename ConstBuffers, typename Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    return asio::async_initiate<Token, void(error_code, size_t)>(
        [this](auto handler, const ConstBuffers& b) {
          if (tls_) {
            tls_->async_write_some(b, std::move(handler));
          } else {
            socket_.async_write_some(b, std::move(handler));
          }
        },
        token, buffers);
  }

  // Ends every operation in flight with operation_aborted.
  void cancel(error_code& ec) { socket().cancel(ec); }
  // Shuts the TCP connection down both ways and closes it.
  void close() {
    error_code ignored;
    socket().shutdown(tcp::socket::shutdown_both, ignored);
    socket().close(ignored);
  }
  tcp::endpoint remote_endpoint(error_code& ec) const { return socket().remote_endpoint(ec); }
  // As a socket's, on the TCP socket underneath.
  void shutdown(tcp::socket::shutdown_type what, error_code& ec) { socket().shutdown(what, ec); }
  void close(error_code& ec) { socket().close(ec); }

 private:
  tcp::socket socket_;  // the connection when plain; unused (never opened) with TLS
  std::unique_ptr<TlsStream> tls_;
};

}  // namespace siphon::net
