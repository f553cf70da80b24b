// SessionStolenStream: a stolen HTTP request's stream of a session, as the
// HTTP engine's StolenStream (http/byte_stream.h). The engine's writes
// become the stream's Data frames and its reads take the session's Data
// straight from the receive path: no socket between them.
//
// Flow control as SocketPump's:
//  engine -> session: a write takes at most the stream's send credit; at 0
//    it waits for onWritable().
//  session -> engine: Data waits here until the engine reads it, and only
//    what it read is consumed() (credit for the peer): the stream's window
//    bounds what waits here, and an engine that stops reading (an HTTP/2
//    client that reads slowly) stops the session's sender for this stream
//    only.
//
// Endings: endRequest() is the stream's HalfClose; the session's HalfClose
// is eof for the engine. The stream is over when both are done, or on a
// Reset either way, or when the session ends (the engine then reads
// connection_reset). release() before the request is whole, and abort(),
// reset the stream (CANCELLED). After release() with the request whole,
// what the session still sends is dropped until its HalfClose.
//
// Threads: everything on the event loop that owns the session's streams.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "agent/services/service.h"
#include "agent/services/session_host.h"
#include "agent/steal/http/byte_stream.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal {

class SessionStolenStream final : public http::StolenStream,
                                  public StreamEndpoint,
                                  public std::enable_shared_from_this<SessionStolenStream> {
 public:
  // The most one write sends: a request body piece.
  static constexpr size_t kMaxWrite = 64 * 1024;

  // `stream_id`: a stream of `host` the agent opened. Register it
  // (SessionHost::registerStream) and call start() once the stream takes
  // data (with early data at once, otherwise onAccept() does).
  SessionStolenStream(net::asio::any_io_executor ex, uint64_t stream_id,
                      std::weak_ptr<SessionHost> host);

  uint64_t streamId() const { return id_; }
  void start();

  // http::StolenStream
  void readSome(net::asio::mutable_buffer into, Done done) override;
  void writeSome(std::span<const net::asio::const_buffer> from, Done done) override;
  void endRequest() override;
  void cancel() override;
  void release() override;
  void abort() override;
  bool isOpen() const override { return !over_ && !released_; }
  // Reset, both ways ended, or its session gone: no longer registered.
  bool over() const { return over_; }

  // StreamEndpoint
  void onData(std::string_view payload) override;
  void onHalfClose() override;
  void onReset(const v1::Error& error) override;
  void onWritable() override;
  void onAccept(const v1::StreamAccept& accept) override;
  void close() override;

  // Counters, for tests and logs.
  uint64_t bytesIn() const { return bytes_in_; }    // engine -> session
  uint64_t bytesOut() const { return bytes_out_; }  // session -> engine

 private:
  struct PendingWrite {
    std::array<net::asio::const_buffer, 8> pieces;
    size_t count = 0;
    Done done;
  };

  // Runs `done` on the loop, later.
  void complete(Done done, net::error_code ec, size_t n);
  void tryRead();
  void tryWrite();
  // The stream is over (Reset either way, the session's end): waiting
  // operations end with connection_reset.
  void ended();
  void maybeFinish();
  // Resets the stream (sent to the session, if it is still there).
  void resetWith(const v1::Error& error);

  net::asio::any_io_executor ex_;
  uint64_t id_;
  HostRef host_;

  bool started_ = false;
  bool over_ = false;          // reset, finished or the session ended
  bool released_ = false;      // the engine is done with it
  bool request_ended_ = false;   // HalfClose sent
  bool end_after_start_ = false; // endRequest() came before start()
  bool response_ended_ = false;  // HalfClose received

  std::string in_;  // the session's bytes the engine has not read yet
  size_t in_offset_ = 0;
  net::asio::mutable_buffer read_into_;
  Done read_done_;
  std::optional<PendingWrite> write_;

  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
};

}  // namespace siphon::agent::steal
