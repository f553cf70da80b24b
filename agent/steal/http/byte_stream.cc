#include "agent/steal/http/byte_stream.h"

#include <sys/socket.h>

#include <vector>

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

namespace {

class SocketStolenStream final : public StolenStream {
 public:
  explicit SocketStolenStream(Descriptor socket) : socket_(std::move(socket)) {}

  void readSome(asio::mutable_buffer into, Done done) override {
    socket_.async_read_some(into, std::move(done));
  }
  void writeSome(std::span<const asio::const_buffer> from, Done done) override {
    // The operation keeps a copy of the sequence: a vector, whose pieces
    // outlive this call (a span would point at the caller's).
    socket_.async_write_some(std::vector<asio::const_buffer>(from.begin(), from.end()),
                             std::move(done));
  }
  void endRequest() override {
    if (socket_.is_open()) ::shutdown(socket_.native_handle(), SHUT_WR);
  }
  void cancel() override {
    net::error_code ignored;
    socket_.cancel(ignored);
  }
  void release() override {
    net::error_code ignored;
    socket_.close(ignored);
  }
  void abort() override { abortDescriptor(socket_); }
  bool isOpen() const override { return socket_.is_open(); }

 private:
  Descriptor socket_;
};

}  // namespace

std::shared_ptr<StolenStream> socketStolenStream(asio::any_io_executor ex, UniqueFd fd) {
  return std::make_shared<SocketStolenStream>(adoptSocket(ex, fd.release()));
}

ByteStream& ByteStream::operator=(ByteStream&& other) {
  if (this == &other) return *this;
  if (stolen_) stolen_->release();
  ex_ = other.ex_;
  socket_ = std::move(other.socket_);
  stolen_ = std::move(other.stolen_);
  return *this;
}

ByteStream::~ByteStream() {
  if (stolen_) stolen_->release();
}

void ByteStream::shutdownSend() {
  if (stolen_) {
    stolen_->endRequest();
  } else if (socket_.is_open()) {
    ::shutdown(socket_.native_handle(), SHUT_WR);
  }
}

void ByteStream::cancel() {
  if (stolen_) {
    stolen_->cancel();
    return;
  }
  net::error_code ignored;
  socket_.cancel(ignored);
}

void ByteStream::close() {
  if (stolen_) {
    stolen_->release();
    return;
  }
  net::error_code ignored;
  socket_.close(ignored);
}

void ByteStream::abort() {
  if (stolen_) {
    stolen_->abort();
    return;
  }
  abortDescriptor(socket_);
}

}  // namespace siphon::agent::steal::http
