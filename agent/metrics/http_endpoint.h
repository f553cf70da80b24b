// The operator's HTTP endpoint (--metrics HOST:PORT): GET /metrics (the
// Prometheus text format), /healthz and /readyz. HTTP/1.1 with keep-alive,
// Boost.Beast on the agent's event loop: the handlers read the agent's
// state there without locks, and /healthz answering proves the loop runs.
//
// Hostile or slow clients: a request's head is bounded (8 KiB, no body),
// every read and write has a deadline (then the connection closes), and
// past max_connections new connections are closed at once. Nothing here
// blocks the loop: each connection is one coroutine.
//
// Call order: listen(), then start(); stop() closes the listener and every
// connection. All on the event loop's thread (listen() also before it runs).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::metrics {

class HttpEndpoint {
 public:
  struct Handlers {
    // The /metrics body (text format 0.0.4).
    std::function<std::string()> metrics;
    // Empty when ready; otherwise why not ("draining: SIGTERM"), the
    // body of /readyz's 503.
    std::function<std::string()> not_ready;
  };
  struct Options {
    std::chrono::milliseconds io_timeout{10000};  // per request read, per response write
    size_t max_connections = 32;
    uint32_t max_header_bytes = 8 << 10;
  };

  HttpEndpoint(net::asio::any_io_executor ex, Handlers handlers, Options options);
  HttpEndpoint(net::asio::any_io_executor ex, Handlers handlers)
      : HttpEndpoint(std::move(ex), std::move(handlers), Options{}) {}
  ~HttpEndpoint();

  // Binds HOST:PORT (port 0 picks one). UNAVAILABLE with the reason.
  absl::Status listen(std::string_view host_port);
  // As bound: "127.0.0.1:9090".
  std::string address() const;
  void start();
  void stop();

  // Shared with the connection coroutines, which may outlive the endpoint.
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace siphon::agent::metrics
