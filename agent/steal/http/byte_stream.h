// The byte streams the HTTP engine reads and writes besides its client:
// a socket (the application, a passthrough's other end) or a StolenStream,
// the request stream of the session that stole a request, which the
// engine writes the request to as HTTP/1.1 and reads the session's
// response from. A stolen request used to be one end of a socketpair with
// a SocketPump on the other: two more sockets, their reactor turns and
// copies on every request. A StolenStream moves the bytes between the
// engine and the session's frames directly (agent/steal/session_stream.h).
//
// ByteStream joins both for Beast and Asio's composed operations
// (AsyncReadStream, AsyncWriteStream): async_read_some/async_write_some
// go straight to the socket when it is one.
//
// Threads: the event loop that owns the engine.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "absl/functional/any_invocable.h"
#include "agent/common/unique_fd.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

// Sockets as Asio's generic stream sockets, not posix::stream_descriptor:
// their writes are sendmsg(MSG_NOSIGNAL), so a peer that closed gives
// EPIPE, never a SIGPIPE that would kill the agent.
using Descriptor = net::asio::generic::stream_protocol::socket;

// Adopts a connected stream socket (TCP or unix) of any family.
Descriptor adoptSocket(net::asio::any_io_executor ex, int fd);

// Closes `d` with an RST when it is a TCP socket (SO_LINGER 0); a unix
// socket just closes.
void abortDescriptor(Descriptor& d);

// One stolen request's stream, as the engine sees it. Every completion
// runs later on the event loop, never inside the call that started it.
class StolenStream {
 public:
  using Done = absl::AnyInvocable<void(net::error_code, size_t)>;
  virtual ~StolenStream() = default;

  // Reads at most `into.size()` bytes of the response. Ends with eof once
  // the session ended it, connection_reset when the session reset the
  // stream or went away, operation_aborted after cancel(). One at a time.
  virtual void readSome(net::asio::mutable_buffer into, Done done) = 0;
  // Writes some of `from` (at least a byte, or an error): the request. One
  // at a time.
  virtual void writeSome(std::span<const net::asio::const_buffer> from, Done done) = 0;
  // The request is whole (a HalfClose); reading goes on.
  virtual void endRequest() = 0;
  // The read and write under way end with operation_aborted.
  virtual void cancel() = 0;
  // The engine is done with the stream: a stream whose request is whole
  // ends as the session ends its response (what else comes is dropped);
  // one whose request is not is reset.
  virtual void release() = 0;
  // Resets the stream now (the engine gave up on the exchange).
  virtual void abort() = 0;
  // Neither released nor aborted nor ended by the session.
  virtual bool isOpen() const = 0;
};

// A StolenStream over a connected socket (the stream's session at the
// other end of it): what the engine's tests use for a session.
std::shared_ptr<StolenStream> socketStolenStream(net::asio::any_io_executor ex, UniqueFd fd);

class ByteStream {
 public:
  using executor_type = net::asio::any_io_executor;

  // Nothing yet (is_open() false).
  explicit ByteStream(executor_type ex) : ex_(ex), socket_(ex) {}
  // A socket: the application or a client.
  explicit ByteStream(Descriptor socket) : ex_(socket.get_executor()), socket_(std::move(socket)) {}
  // A stolen request's stream.
  ByteStream(executor_type ex, std::shared_ptr<StolenStream> stolen)
      : ex_(ex), socket_(ex), stolen_(std::move(stolen)) {}
  ByteStream(ByteStream&&) = default;
  ByteStream& operator=(ByteStream&& other);
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;
  // A stolen stream not given up on is released.
  ~ByteStream();

  executor_type get_executor() const { return ex_; }
  bool is_open() const { return stolen_ ? stolen_->isOpen() : socket_.is_open(); }
  // The socket, when this is one (a pooled application connection goes
  // back to its pool as a socket); nullptr for a stolen stream.
  Descriptor* socket() { return stolen_ ? nullptr : &socket_; }

  // End of what this side sends: shutdown(SHUT_WR), or the request's end.
  void shutdownSend();
  void cancel();
  // Done with it: the socket closes; a stolen stream is released.
  void close();
  // Given up: an RST on a TCP socket; a stolen stream is reset.
  void abort();

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    if (!stolen_) return socket_.async_read_some(buffers, std::forward<Token>(token));
    return net::asio::async_initiate<Token, void(net::error_code, size_t)>(
        [](auto handler, StolenStream* s, net::asio::mutable_buffer into, executor_type ex) {
          s->readSome(into, completion(std::move(handler), ex));
        },
        token, stolen_.get(), firstBuffer(buffers), ex_);
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    if (!stolen_) return socket_.async_write_some(buffers, std::forward<Token>(token));
    return net::asio::async_initiate<Token, void(net::error_code, size_t)>(
        [](auto handler, StolenStream* s, const ConstBuffers& b, executor_type ex) {
          // At most this many pieces per write (a chunk's size line, data
          // and end, a head before them): a write may take fewer bytes.
          std::array<net::asio::const_buffer, 8> pieces;
          size_t n = 0;
          for (auto it = net::asio::buffer_sequence_begin(b);
               it != net::asio::buffer_sequence_end(b) && n < pieces.size(); ++it) {
            const net::asio::const_buffer piece(*it);
            if (piece.size() > 0) pieces[n++] = piece;
          }
          s->writeSome(std::span(pieces.data(), n), completion(std::move(handler), ex));
        },
        token, stolen_.get(), buffers, ex_);
  }

 private:
  template <class MutableBuffers>
  static net::asio::mutable_buffer firstBuffer(const MutableBuffers& buffers) {
    for (auto it = net::asio::buffer_sequence_begin(buffers);
         it != net::asio::buffer_sequence_end(buffers); ++it) {
      const net::asio::mutable_buffer b(*it);
      if (b.size() > 0) return b;
    }
    return {};
  }

  // The handler, run on its own executor (a composed operation's), kept
  // counted as work there until it runs.
  template <class Handler>
  static StolenStream::Done completion(Handler handler, executor_type ex) {
    auto handler_ex = net::asio::get_associated_executor(handler, ex);
    auto work = net::asio::prefer(handler_ex, net::asio::execution::outstanding_work.tracked);
    return [h = std::move(handler), work = std::move(work)](net::error_code ec,
                                                           size_t n) mutable {
      net::asio::dispatch(work, [h = std::move(h), ec, n]() mutable { h(ec, n); });
    };
  }

  executor_type ex_;
  Descriptor socket_;
  std::shared_ptr<StolenStream> stolen_;
};

}  // namespace siphon::agent::steal::http
