// What the HTTP engine (engine.h) needs from the steal service: where each
// request goes, a way to the application around the steering, and a stream
// to the session that stole a request. The engine knows nothing of
// subscriptions or sessions beyond this, so it is tested with a fake.
//
// Threads: every call on the event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/outgoing/address.h"
#include "agent/steal/http/byte_stream.h"
#include "agent/steal/http/request_head.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::steal::http {

using outgoing::SockAddr;

// Limits and timings (agent flags --http-*).
struct HttpOptions {
  // A connection whose client sends nothing within this time is taken for a
  // server-first protocol (SMTP, MySQL...) and passes through untouched.
  std::chrono::milliseconds detect_timeout{500};
  // Request or response head (request line, headers) larger than this: 431
  // to the client (request), 502 (response).
  size_t max_head_bytes = 64 * 1024;
  // Bodies larger than this: 413 (request) / 502 (response). 0: no limit.
  // Bodies are streamed, never held whole, whatever the limit.
  uint64_t max_request_body = 0;
  uint64_t max_response_body = 0;
  // A client connection with no request in progress for this long is closed.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  // Passthrough pool: idle keep-alive connections to the application kept
  // per destination, and for how long.
  size_t pool_max_idle = 32;
  std::chrono::milliseconds pool_idle_timeout{std::chrono::seconds(30)};
};

// One client connection the steal took on a port with filtered steals.
struct ConnectionInfo {
  SockAddr source;       // the HTTP client
  SockAddr destination;  // the original destination (the application)
  uint16_t port = 0;     // destination's port
};

// A request some subscription's filter matched.
struct Route {
  uint64_t subscription_id = 0;
  // Later subscriptions whose filters matched too (already told).
  std::vector<uint64_t> also_matched;
};

class HttpRouter {
 public:
  virtual ~HttpRouter() = default;

  // The earliest subscription of `port` whose filter matches `head`, or
  // none: the application gets the request. Tells the other matching
  // subscriptions (FilterOverlap notices).
  virtual std::optional<Route> route(uint16_t port, const RequestHead& head) = 0;

  // Opens a StolenRequest stream to the session of `route`, where the
  // engine writes the request as HTTP/1.1 and reads the session's response
  // (byte_stream.h; `ex`: the engine's event loop). An end of stream before
  // a complete response means the session reset the stream or went away.
  // An error (the session is gone, too many streams): the engine answers
  // 502.
  virtual absl::StatusOr<std::shared_ptr<StolenStream>> openStolenRequest(
      net::asio::any_io_executor ex, const Route& route, const ConnectionInfo& conn,
      const RequestHead& head, uint64_t connection_request) = 0;

  // A connected non-blocking TCP socket to `destination`, made from inside
  // the target around the steering (the application gets it even while its
  // port is stolen), with TCP_NODELAY: the engine writes a request as head,
  // then body pieces, and a kept-alive connection must not hold the second
  // write for the application's delayed ACK.
  virtual net::awaitable<absl::StatusOr<UniqueFd>> connectApplication(SockAddr destination) = 0;

  // Whether the router joins raw connections to the application itself
  // (spliceToApplication): a connection that is not HTTP, or an upgrade
  // the application answered 101. The steal service does, so they move in
  // a handover like its other passthroughs; otherwise the engine runs a
  // tunnel of its own.
  virtual bool splicesToApplication() const { return false; }
  // Joins `client` and `application` both ways until both are closed;
  // `to_application` / `to_client`: bytes already read from one side that
  // the other gets first.
  virtual void spliceToApplication(UniqueFd client, std::string to_application,
                                   UniqueFd application, std::string to_client) {
    (void)client;
    (void)to_application;
    (void)application;
    (void)to_client;
  }
};

}  // namespace siphon::agent::steal::http
