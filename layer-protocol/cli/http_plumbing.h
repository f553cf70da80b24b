// The HTTP plumbing of `siphon steal` for stolen requests
// (StreamOpen{stolen_request}, proto/siphon/v1/streams.proto): each stream
// carries one request as HTTP/1.1 bytes, then the agent's half-close; it
// goes to the local server (--to) on a connection of that server's pool,
// and the server's response goes back on the stream, byte for byte as the
// server sent it, then our half-close. After a 101 the stream and the
// connection are joined as raw bytes both ways (FIN as half-close), as the
// connection bridge (bridge.h) does.
//
// - Bodies are never held: a Beast parser (http_scan.h) only finds where
//   the response ends while its bytes are forwarded.
// - Flow control is end to end: the stream is read only as fast as the
//   local server takes the bytes, and the server is read only as fast as
//   the stream's credit allows.
// - A connection goes back to the pool when its request was exactly one
//   whole request, its response ended cleanly with keep-alive and nothing
//   after it. A pooled connection that fails before any response byte (the
//   server closed it while it was idle) is retried once on a new
//   connection, with the request bytes written so far (kept up to 1 MiB).
// - The local server unreachable, or gone before any response byte: the
//   stream is answered with a 502 (text/plain, naming the server and the
//   error), so the HTTP client gets an answer rather than a reset. Once
//   response bytes went out, a failure resets the stream (the agent aborts
//   the client's connection: a cut response never passes for a whole one).
//
// Everything runs on the client's event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/bridge.h"
#include "cli/http_scan.h"
#include "cli/steal_spec.h"
#include "siphon/client/connections.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

// Connections to one local server (one --to).
class LocalPool {
 public:
  LocalPool(net::asio::any_io_executor ex, std::string to,
            std::vector<net::tcp::endpoint> endpoints, std::chrono::milliseconds connect_timeout);
  // The same, with the server reached through `dial` (bridge.h).
  LocalPool(net::asio::any_io_executor ex, std::string to, LocalDialer dial);

  const std::string& to() const { return to_; }
  // The most recently pooled connection that the server has not closed
  // meanwhile (nothing to read on it, no FIN, no error), or nullopt.
  std::optional<net::tcp::socket> takeIdle();
  // A new connection, to the first endpoint that answers within the connect
  // timeout. UNAVAILABLE "connect 127.0.0.1:9000: Connection refused".
  net::awaitable<absl::StatusOr<net::tcp::socket>> connect();
  // Keeps `s` for the next request (at most kMaxIdle; more are closed).
  void giveBack(net::tcp::socket s);
  void closeAll();

  size_t idleCount() const { return idle_.size(); }
  // As many as the requests an HTTP/2 load keeps in flight (32 connections
  // of 10 streams in the bench): with 32, most stolen requests opened and
  // closed a local connection of their own (7,800 requests/s against
  // 10,400 with 256).
  static constexpr size_t kMaxIdle = 256;

 private:
  net::asio::any_io_executor ex_;
  std::string to_;
  LocalDialer dial_;
  std::vector<net::tcp::socket> idle_;  // most recent last
};

// One stolen request, from the accepted stream to its end both ways.
//
// Call order: construct once the stream is accepted, start() once; end()
// at any time after. `done` is called once, when both directions are over
// and the connection is back in the pool or closed.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  using Done = std::function<void(Exchange&)>;
  // `event`: who, what and where, for the line; its status, byte counts and
  // error are filled in here. `head`: the request is a HEAD (its response
  // has no body whatever its Content-Length says).
  Exchange(net::asio::any_io_executor ex, client::Connection stream,
           std::shared_ptr<LocalPool> pool, RequestEvent event, bool head, Done done);

  void start();
  // Ends both ways at once (a second signal, a lost session): the stream is
  // reset with CANCELLED and the local connection aborted.
  void end(std::string_view why);

  const RequestEvent& event() const { return event_; }
  // The HTTP client did not get the local server's whole answer (a 502 of
  // ours, a reset, a cut).
  bool failed() const { return !event_.error.empty(); }
  uint64_t streamId() const { return stream_.streamId(); }
  // The local connection came from the pool, or was retried after that.
  bool reusedForTest() const { return reused_; }

  // Told about every stream failure (to notice a lost session).
  std::function<void(const absl::Status&)> on_stream_error;

 private:
  enum class Step { kMore, kDone, kUpgraded, kFailed };

  static net::awaitable<void> run(std::shared_ptr<Exchange> self);
  static net::awaitable<void> pump(std::shared_ptr<Exchange> self);
  net::awaitable<void> readResponse();
  net::awaitable<Step> forward(std::string& pending);
  net::awaitable<bool> switchConnection();
  net::awaitable<void> answer502(std::string why);
  net::awaitable<bool> toStream(std::string bytes);
  void scanRequest(std::string_view bytes);
  void halfCloseStream();
  void resetStream(std::string why);
  void streamFailed(const absl::Status& s);
  void noteError(std::string why);
  void abortLocal();

  client::Connection stream_;
  std::shared_ptr<LocalPool> pool_;
  RequestEvent event_;
  bool head_;
  Done done_;
  net::tcp::socket local_;

  // The request side (pump: stream -> local).
  RequestScanner request_;
  std::string request_pending_;  // bytes before a complete request header
  bool request_whole_ = false;   // the bytes so far are exactly one whole request
  bool request_bad_ = false;     // not one request: never reuse the connection
  bool stream_eof_ = false;      // the agent half-closed
  bool pump_done_ = false;
  bool pump_writing_ = false;
  bool discard_ = false;  // the local side is gone: request bytes are dropped
  net::Signal pump_changed_;

  // Retrying a pooled connection that turned out dead.
  bool reused_ = false;
  bool replayable_ = false;  // a retry is still possible: replay_ holds every byte written
  std::string replay_;
  bool switching_ = false;
  net::Signal switched_;

  // The response side (local -> stream).
  ResponseScanner response_;
  bool got_response_byte_ = false;
  bool upgraded_ = false;
  bool response_done_ = false;
  bool keep_alive_ = false;  // the response allows another request on the connection
  bool stream_failed_ = false;
  bool ended_ = false;
};

// The 502 we answer for a local server that did not: its whole bytes.
std::string badGatewayResponse(std::string_view to, std::string_view why);

}  // namespace siphon::cli
