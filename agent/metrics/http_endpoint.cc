#include "agent/metrics/http_endpoint.h"

#include <array>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/metrics/registry.h"
#include "siphon/status.h"
#include "siphon/transport/session_transport.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::metrics {

namespace asio = net::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using net::awaitable;
using net::use_awaitable;

struct HttpEndpoint::State : std::enable_shared_from_this<State> {
  State(asio::any_io_executor e, Handlers h, Options o)
      : ex(std::move(e)), handlers(std::move(h)), options(o), acceptor(ex) {}

  asio::any_io_executor ex;
  Handlers handlers;
  Options options;
  net::tcp::acceptor acceptor;
  std::set<beast::tcp_stream*> connections;
  bool stopped = false;
};

namespace {

using Response = http::response<http::string_body>;

Response answer(const http::request<http::empty_body>& req, HttpEndpoint::Handlers& handlers) {
  Response res;
  res.version(req.version());
  res.keep_alive(req.keep_alive());
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  std::string_view target(req.target().data(), req.target().size());
  target = target.substr(0, target.find('?'));
  const bool known = target == "/metrics" || target == "/healthz" || target == "/readyz";
  if (!known) {
    res.result(http::status::not_found);
    res.body() = "not found: try /metrics, /healthz or /readyz\n";
  } else if (req.method() != http::verb::get && req.method() != http::verb::head) {
    res.result(http::status::method_not_allowed);
    res.set(http::field::allow, "GET, HEAD");
    res.body() = "method not allowed\n";
  } else if (target == "/metrics") {
    res.result(http::status::ok);
    res.set(http::field::content_type,
            beast::string_view(Registry::kContentType.data(), Registry::kContentType.size()));
    res.body() = handlers.metrics ? handlers.metrics() : "";
  } else if (target == "/healthz") {
    // Answered on the event loop: an answer means the loop runs.
    res.result(http::status::ok);
    res.body() = "ok\n";
  } else {
    std::string why = handlers.not_ready ? handlers.not_ready() : "";
    if (why.empty()) {
      res.result(http::status::ok);
      res.body() = "ready\n";
    } else {
      res.result(http::status::service_unavailable);
      res.body() = absl::StrCat("not ready: ", why, "\n");
    }
  }
  res.prepare_payload();
  if (req.method() == http::verb::head) res.body().clear();  // Content-Length stays
  return res;
}

awaitable<void> serveConnection(std::shared_ptr<HttpEndpoint::State> state_in,
                                net::tcp::socket socket_in) {
  const auto state = std::move(state_in);
  beast::tcp_stream stream(std::move(socket_in));
  state->connections.insert(&stream);
  struct Unlist {
    HttpEndpoint::State& s;
    beast::tcp_stream* p;
    ~Unlist() { s.connections.erase(p); }
  } unlist{*state, &stream};

  beast::flat_buffer buffer(state->options.max_header_bytes + 1024);
  while (!state->stopped) {
    net::error_code ec;
    http::request_parser<http::empty_body> parser;
    parser.header_limit(state->options.max_header_bytes);
    parser.body_limit(0);
    // One deadline for the whole request head: a client trickling bytes
    // cannot hold the connection past it.
    stream.expires_after(state->options.io_timeout);
    co_await http::async_read(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || state->stopped) {
      break;
    }
    Response res;
    if (ec) {
      res.version(11);
      res.result(http::status::bad_request);
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = absl::StrCat("bad request: ", ec.message(), "\n");
      res.keep_alive(false);
      res.prepare_payload();
    } else {
      res = answer(parser.get(), state->handlers);
    }
    stream.expires_after(state->options.io_timeout);
    co_await http::async_write(stream, res, asio::redirect_error(use_awaitable, ec));
    if (ec || !res.keep_alive()) break;
  }
  // Closing with unread bytes would reset the connection and could destroy
  // the answer before the client reads it (a 400 for a request whose rest
  // was never read): send FIN, then drop what still comes, within bounds.
  net::error_code ignored;
  stream.socket().shutdown(net::tcp::socket::shutdown_send, ignored);
  if (!state->stopped) {
    stream.expires_after(state->options.io_timeout);
    std::array<char, 4096> sink;
    size_t dropped = 0;
    while (dropped < (1u << 20)) {
      net::error_code ec;
      size_t n = co_await stream.async_read_some(asio::buffer(sink),
                                                 asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      dropped += n;
    }
  }
  stream.socket().close(ignored);
}

awaitable<void> acceptLoop(std::shared_ptr<HttpEndpoint::State> state_in) {
  const auto state = std::move(state_in);
  while (!state->stopped) {
    net::error_code ec;
    net::tcp::socket socket =
        co_await state->acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
    if (state->stopped || ec == asio::error::operation_aborted) break;
    if (ec) {
      log::warn("metrics_accept_failed", {{"error", ec.message()}});
      asio::steady_timer t(state->ex);
      t.expires_after(std::chrono::milliseconds(100));
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    if (state->connections.size() >= state->options.max_connections) {
      // Scrapers make one connection; a crowd is a misbehaving client.
      log::warn("metrics_connection_refused",
                {{"reason", "too many connections"},
                 {"limit", static_cast<uint64_t>(state->options.max_connections)}});
      socket.close(ec);
      continue;
    }
    // A failure ends this connection: its socket is in the coroutine's
    // frame and closes with it. Nothing else to end.
    net::spawn(state->ex, serveConnection(state, std::move(socket)), "metrics_connection");
  }
}

// The accept loop; one that fails (reported as coroutine_failed) starts
// again after a breath until the endpoint stops: probes and scrapes must
// not go unanswered for good.
void spawnAcceptLoop(std::shared_ptr<HttpEndpoint::State> state) {
  std::weak_ptr<HttpEndpoint::State> weak = state;
  net::spawn(state->ex, acceptLoop(state), "metrics_accept_loop", [weak] {
    auto s = weak.lock();
    if (!s || s->stopped) return;
    auto t = std::make_shared<asio::steady_timer>(s->ex);
    t->expires_after(std::chrono::milliseconds(100));
    t->async_wait([weak, t](net::error_code) {
      auto s = weak.lock();
      if (s && !s->stopped && s->acceptor.is_open()) spawnAcceptLoop(s);
    });
  });
}

}  // namespace

HttpEndpoint::HttpEndpoint(asio::any_io_executor ex, Handlers handlers, Options options)
    : state_(std::make_shared<State>(std::move(ex), std::move(handlers), options)) {}

HttpEndpoint::~HttpEndpoint() { stop(); }

absl::Status HttpEndpoint::listen(std::string_view host_port) {
  std::string host, port;
  RETURN_IF_ERROR(net::splitHostPort(std::string(host_port), &host, &port));
  net::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("--metrics ", asv(host_port), ": '", host,
                                                         "' is not an IP address"));
  }
  unsigned long port_number = 0;
  try {
    port_number = std::stoul(port);
  } catch (const std::exception&) {
    port_number = 65536;
  }
  if (port_number > 65535) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("--metrics ", asv(host_port), ": bad port '", port, "'"));
  }
  net::tcp::endpoint ep(address, static_cast<uint16_t>(port_number));
  auto fail = [&](std::string_view what) {
    return protoError(v1::UNAVAILABLE, absl::StrCat("cannot serve metrics on ", asv(host_port),
                                                    ": ", asv(what), ": ", ec.message()));
  };
  auto& a = state_->acceptor;
  a.open(ep.protocol(), ec);
  if (ec) return fail("socket");
  a.set_option(net::tcp::acceptor::reuse_address(true), ec);
  a.bind(ep, ec);
  if (ec) return fail("bind");
  a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen");
  return absl::OkStatus();
}

std::string HttpEndpoint::address() const {
  net::error_code ec;
  auto ep = state_->acceptor.local_endpoint(ec);
  if (ec) return "";
  if (ep.address().is_v6()) return absl::StrCat("[", ep.address().to_string(), "]:", ep.port());
  return absl::StrCat(ep.address().to_string(), ":", ep.port());
}

void HttpEndpoint::start() {
  if (!state_->acceptor.is_open()) return;
  spawnAcceptLoop(state_);
}

void HttpEndpoint::stop() {
  if (state_->stopped) return;
  state_->stopped = true;
  net::error_code ec;
  state_->acceptor.close(ec);
  for (beast::tcp_stream* s : state_->connections) s->socket().close(ec);
}

}  // namespace siphon::agent::metrics
