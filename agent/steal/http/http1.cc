// HTTP/1 filtered steals: the connection that parses requests off a stolen
// connection, routes each one (to the client or on to the original
// destination) and writes the responses back in order. Over 600 lines
// because the parser, the exchange and the pipelining order share one
// connection's state; the routing decision itself is in the engine.
#include "agent/steal/http/http1.h"

#include <fcntl.h>
#include <strings.h>
#include <sys/socket.h>

#include <array>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "agent/common/log.h"
#include "agent/steal/http/http2.h"
#include "agent/steal/http/pool.h"
#include "agent/steal/http/tunnel.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {
namespace {

namespace asio = net::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

using RequestParser = bhttp::request_parser<bhttp::buffer_body>;
using ResponseParser = bhttp::response_parser<bhttp::buffer_body>;

// Body pieces: what is read from one side before it is written to the
// other. Two per exchange (request and response body) at most.
constexpr size_t kPiece = 64 * 1024;
// A connection closed while its client may still be sending (an error
// answered before the body was read, a server that answered early) reads
// and drops for this long after its FIN, so the client reads the answer
// before an RST (data left unread at close) could destroy it.
constexpr auto kLinger = std::chrono::seconds(2);

std::string str(beast::string_view s) { return std::string(s.data(), s.size()); }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated tokens of every `name` header.
template <class Fields>
std::vector<std::string> tokens(const Fields& fields, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& f : fields) {
    if (!iequals({f.name_string().data(), f.name_string().size()}, name)) continue;
    std::string_view v(f.value().data(), f.value().size());
    while (!v.empty()) {
      const size_t comma = v.find(',');
      const std::string_view t = trim(v.substr(0, comma));
      if (!t.empty()) out.emplace_back(t);
      v = comma == std::string_view::npos ? std::string_view() : v.substr(comma + 1);
    }
  }
  return out;
}

bool hasToken(const std::vector<std::string>& list, std::string_view t) {
  for (const auto& s : list) {
    if (iequals(s, t)) return true;
  }
  return false;
}

template <class Fields>
std::optional<std::string> header(const Fields& fields, std::string_view name) {
  for (const auto& f : fields) {
    if (iequals({f.name_string().data(), f.name_string().size()}, name)) return str(f.value());
  }
  return std::nullopt;
}

// Headers about one connection, not the message (RFC 9110 §7.6.1), those the
// Connection header names, and the framing the agent writes itself.
bool hopByHop(std::string_view name, const std::vector<std::string>& connection) {
  static constexpr std::string_view kNames[] = {
      "connection", "keep-alive",     "proxy-connection",  "te",
      "upgrade",    "http2-settings", "transfer-encoding", "content-length"};
  for (std::string_view n : kNames) {
    if (iequals(name, n)) return true;
  }
  return hasToken(connection, name);
}

template <class Fields>
void appendFields(std::string& out, const Fields& fields, size_t skip, size_t count,
                  const std::vector<std::string>& connection) {
  size_t i = 0;
  for (const auto& f : fields) {
    if (i++ < skip) continue;
    if (i > skip + count) break;
    const std::string_view name(f.name_string().data(), f.name_string().size());
    if (hopByHop(name, connection)) continue;
    out.append(name);
    out += ": ";
    out.append(f.value().data(), f.value().size());
    out += "\r\n";
  }
}

template <class Fields>
size_t fieldCount(const Fields& fields) {
  return static_cast<size_t>(std::distance(fields.begin(), fields.end()));
}

std::string hex(size_t n) {
  char buf[24];
  const int len = std::snprintf(buf, sizeof(buf), "%zx\r\n", n);
  return std::string(buf, static_cast<size_t>(len));
}

std::string leftover(const beast::flat_buffer& b) {
  return std::string(static_cast<const char*>(b.data().data()), b.size());
}

// No limit is the largest one: Beast 1.74 compares the length with the
// optional limit itself, and any length is "greater" than boost::none.
uint64_t bodyLimit(uint64_t limit) {
  return limit == 0 ? std::numeric_limits<uint64_t>::max() : limit;
}

// Why an upstream read failed, in words for the 502 body.
std::string reason(const net::error_code& ec) {
  if (ec == bhttp::error::end_of_stream || ec == asio::error::eof) return "closed";
  if (ec == bhttp::error::partial_message) return "closed in the middle of the response";
  if (ec == asio::error::connection_reset) return "reset";
  return ec.message();
}

enum class Outcome { kKeepAlive, kClose, kRetry };

// One request and its response. The response side runs in the
// connection's coroutine; the request body, when there is one, in a
// coroutine of its own (forwardBody), both at once.
struct Exchange {
  Exchange(asio::any_io_executor ex, size_t buffer_limit)
      : upstream(ex), upstream_in(buffer_limit), body_signal(ex) {}

  std::unique_ptr<RequestParser> request;
  size_t request_fields = 0;  // fields of the head (those after are trailers)
  RequestHead head;
  std::optional<Route> route;  // set: the request was stolen
  ByteStream upstream;         // the stolen request's stream, or the application
  bool reused = false;         // upstream came from the pool
  beast::flat_buffer upstream_in;

  bool has_body = false;
  bool chunked_body = false;  // the body goes upstream chunked (no length known)
  bool upgrade = false;
  std::string upgrade_value;
  bool is_head = false;
  bool client_keep_alive = false;
  bool client_http11 = false;

  // Request body (forwardBody).
  bool body_running = false;
  bool body_complete = false;  // all read from the client and written upstream
  bool upstream_write_failed = false;
  unsigned client_error = 0;  // 413: over max_request_body
  bool client_failed = false;
  net::Signal body_signal;

  bool interim_sent = false;      // a 1xx went to the client
  bool response_started = false;  // a byte of the final response went to the client
};

class Http1Connection final : public LiveConnection,
                              public std::enable_shared_from_this<Http1Connection> {
 public:
  Http1Connection(std::shared_ptr<EngineState> state, UniqueFd client, ConnectionInfo info,
                  std::string received, uint64_t requests)
      : state_(std::move(state)),
        info_(std::move(info)),
        client_(adoptSocket(state_->ex, client.release())),
        in_(state_->options.max_head_bytes + kPiece),
        idle_timer_(state_->ex),
        unparked_(state_->ex),
        requests_(requests) {
    const size_t n = asio::buffer_copy(in_.prepare(received.size()), asio::buffer(received));
    in_.commit(n);
  }
  ~Http1Connection() override { state_->connections.erase(this); }

  void start() {
    state_->connections.insert(this);
    // An exception out of the connection's loop aborts this connection only.
    auto self = shared_from_this();
    net::spawn(state_->ex, runHeld(self), "http1_connection", [self] { self->abort(); });
    if (state_->parking) park();
  }

  void drain() override {
    drain_ = true;
    unparked_.notify();
    // Idle (waiting for a request): closes at once. Busy: the response
    // says Connection: close, and the loop ends after it.
    if (reading_head_) cancelClient();
  }

  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    idle_timer_.cancel();
    abortDescriptor(client_);
    if (current_) current_->upstream.abort();
    if (tunnel_) tunnel_->abort();
    unparked_.notify();
  }

  bool busy() const override { return busy_; }

  // Waiting for a request: stops now (what was read of it stays in in_).
  // Busy: stops once the response is out, before the next request is read.
  void park() override {
    parking_ = true;
    if (reading_head_) cancelClient();
  }
  void unpark() override {
    parking_ = false;
    unparked_.notify();
  }
  bool parked() const override { return parked_; }
  absl::StatusOr<ParkedConnection> exportParked() override {
    if (!parked_) return absl::FailedPreconditionError("an HTTP/1 connection is not parked");
    ParkedConnection p;
    p.client = UniqueFd(::fcntl(client_.native_handle(), F_DUPFD_CLOEXEC, 3));
    if (!p.client) return lastErrnoStatus("handover: dup an HTTP/1 client socket");
    p.info = info_;
    p.received = leftover(in_);
    p.requests = requests_;
    return p;
  }

 private:
  // What net::spawn starts: `self` keeps the connection alive meanwhile.
  // GCC 12: by-value coroutine parameters are moved into locals before the
  // first suspension.
  static net::awaitable<void> runHeld(std::shared_ptr<Http1Connection> self_in) {
    const std::shared_ptr<Http1Connection> self = std::move(self_in);
    co_await self->run();
  }
  static net::awaitable<void> forwardBodyHeld(std::shared_ptr<Http1Connection> self_in,
                                              std::shared_ptr<Exchange> x_in) {
    const std::shared_ptr<Http1Connection> self = std::move(self_in);
    const std::shared_ptr<Exchange> x = std::move(x_in);
    co_await self->forwardBody(x);
  }
  net::awaitable<void> run();
  net::awaitable<void> serveRequests();
  // bhttp::async_read_header's work, one read at a time, so that a park()
  // stops it between reads: Beast's composed read starts its next read
  // after a cancel() that came between two, and would wait for the client.
  // The same errors as Beast's; operation_aborted when parking.
  net::awaitable<net::error_code> readHead(RequestParser& parser);
  net::awaitable<bool> exchange(std::unique_ptr<RequestParser> parser);
  // Gives `x` an application connection from `pool` (`fresh`: a new one,
  // never an idle one). nullopt when it did; else what exchange() returns:
  // false when aborted, or the 502's answer when the application cannot be
  // reached.
  net::awaitable<std::optional<bool>> connectApplication(std::shared_ptr<Exchange> x,
                                                         std::shared_ptr<Http1AppPool> pool,
                                                         bool fresh);
  net::awaitable<Outcome> forwardResponse(std::shared_ptr<Exchange> x, net::error_code head_ec);
  net::awaitable<Outcome> upstreamFailed(std::shared_ptr<Exchange> x, net::error_code ec,
                                         bool got_some);
  net::awaitable<void> forwardBody(std::shared_ptr<Exchange> x);
  net::awaitable<bool> waitBody(std::shared_ptr<Exchange> x);
  // Answers with an error of the agent's own; true when the connection
  // stays open.
  net::awaitable<bool> answer(std::shared_ptr<Exchange> x, unsigned status, std::string message);
  net::awaitable<void> closeClient();
  net::awaitable<net::error_code> writeClient(std::string_view bytes);
  // `head` (may be empty), then `n` bytes of body, as a chunk when
  // `chunked`: one gathered write.
  template <class Stream>
  net::awaitable<net::error_code> writeBody(Stream& to, std::string_view head, const char* data,
                                            size_t n, bool chunked);
  net::awaitable<net::error_code> writeAll(Descriptor& to, const char* data, size_t n);
  // Ends the request body's coroutine if it still runs (it reads the
  // client socket, which only one coroutine may do).
  net::awaitable<void> stopBody(std::shared_ptr<Exchange> x);

  // A head read cut short (a handover parks the connection): Beast has
  // taken the request line out of in_ once it was whole, the fields not
  // before the head is complete. The request line goes back in front, as
  // the client sent it (Beast takes exactly "METHOD SP target SP
  // HTTP/1.x CRLF"), so in_ holds every byte of the request so far.
  void keepPartialHead(const RequestParser& parser) {
    const auto& partial = parser.get();
    if (parser.is_header_done() || partial.method_string().empty()) return;
    std::string bytes = str(partial.method_string()) + " " + str(partial.target()) +
                        (partial.version() == 10 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n");
    bytes += leftover(in_);
    in_.consume(in_.size());
    in_.commit(asio::buffer_copy(in_.prepare(bytes.size()), asio::buffer(bytes)));
  }

  void cancelClient() {
    net::error_code ignored;
    client_.cancel(ignored);
  }
  void armIdleTimer() {
    idle_timer_.expires_after(state_->options.idle_timeout);
    idle_timer_.async_wait([weak = weak_from_this()](net::error_code ec) {
      if (ec) return;
      auto self = weak.lock();
      if (self && self->reading_head_) {
        log::debug("http_idle_timeout", {{"client", formatAddress(self->info_.source)}});
        self->cancelClient();
      }
    });
  }
  bool closing() const { return drain_ || state_->draining; }
  std::string destination() const { return formatAddress(info_.destination); }

  std::shared_ptr<EngineState> state_;
  ConnectionInfo info_;
  Descriptor client_;
  beast::flat_buffer in_;
  asio::steady_timer idle_timer_;
  net::Signal unparked_;
  uint64_t requests_ = 0;
  bool parking_ = false;
  bool parked_ = false;
  // The socket went to the steal service's splice (an upgrade to the
  // application): nothing of it is this connection's any more.
  bool handed_off_ = false;
  bool reading_head_ = false;
  bool busy_ = false;
  bool drain_ = false;
  bool aborted_ = false;
  bool lingered_ = false;  // the client's remaining bytes were already read
  std::shared_ptr<Exchange> current_;
  std::shared_ptr<Tunnel> tunnel_;
};

net::awaitable<void> Http1Connection::run() {
  try {
    co_await serveRequests();
    busy_ = false;
    current_.reset();
    if (!aborted_ && !handed_off_) co_await closeClient();
  } catch (const std::exception& e) {
    log::warn("http1_connection_failed",
              {{"client", formatAddress(info_.source)}, {"error", e.what()}});
    abort();
  }
  busy_ = false;
}

net::awaitable<void> Http1Connection::serveRequests() {
  const HttpOptions& o = state_->options;
  while (true) {
    busy_ = false;
    // A handover parks the connection here, between requests.
    while (parking_ && !aborted_ && !closing()) {
      parked_ = true;
      co_await unparked_.wait();
      parked_ = false;
    }
    if (aborted_ || closing()) co_return;
    auto parser = std::make_unique<RequestParser>();
    parser->header_limit(static_cast<uint32_t>(std::min<size_t>(o.max_head_bytes, UINT32_MAX)));
    parser->body_limit(bodyLimit(o.max_request_body));
    net::error_code ec;
    reading_head_ = true;
    armIdleTimer();
    ec = co_await readHead(*parser);
    reading_head_ = false;
    idle_timer_.cancel();
    if (aborted_) co_return;
    if (ec == asio::error::operation_aborted && parking_ && !closing()) {
      keepPartialHead(*parser);
      continue;  // parks
    }
    if (ec) {
      // The client closed between requests, went idle, or the agent drains.
      if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
          ec == asio::error::eof || ec == asio::error::operation_aborted ||
          ec == asio::error::connection_reset) {
        co_return;
      }
      busy_ = true;
      if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
        co_await answer(nullptr, 431,
                        "siphon-agent: the request head is larger than " +
                            std::to_string(o.max_head_bytes) + " bytes\n");
      } else if (ec == bhttp::error::body_limit) {
        co_await answer(nullptr, 413,
                        "siphon-agent: the request body is larger than " +
                            std::to_string(o.max_request_body) + " bytes\n");
      } else {
        co_await answer(nullptr, 400,
                        "siphon-agent: malformed HTTP request: " + ec.message() + "\n");
      }
      co_return;
    }
    busy_ = true;
    ++requests_;
    const bool keep = co_await exchange(std::move(parser));
    if (current_) co_await stopBody(current_);
    current_.reset();
    if (!keep) co_return;
  }
}

net::awaitable<net::error_code> Http1Connection::readHead(RequestParser& parser) {
  while (true) {
    if (in_.size() > 0) {
      net::error_code ec;
      in_.consume(parser.put(in_.data(), ec));
      if (ec && ec != bhttp::error::need_more) co_return ec;
      if (parser.is_header_done()) co_return net::error_code();
    }
    if (parking_) co_return asio::error::operation_aborted;
    if (in_.size() >= in_.max_size()) co_return bhttp::error::buffer_overflow;
    net::error_code ec;
    const size_t n = co_await client_.async_read_some(
        in_.prepare(std::min<size_t>(kPiece, in_.max_size() - in_.size())),
        asio::redirect_error(net::use_awaitable, ec));
    in_.commit(n);
    if (ec == asio::error::eof) {
      if (!parser.got_some() && in_.size() == 0) co_return bhttp::error::end_of_stream;
      net::error_code eof_ec;
      parser.put_eof(eof_ec);
      co_return eof_ec ? eof_ec : net::error_code(bhttp::error::partial_message);
    }
    if (ec) co_return ec;
  }
}

net::awaitable<bool> Http1Connection::exchange(std::unique_ptr<RequestParser> parser) {
  const HttpOptions& o = state_->options;
  auto x = std::make_shared<Exchange>(state_->ex, o.max_head_bytes + kPiece);
  current_ = x;
  x->request = std::move(parser);
  const auto& req = x->request->get();
  x->request_fields = fieldCount(req);
  x->head.method = str(req.method_string());
  x->head.target = str(req.target());
  x->head.version = req.version() >= 11 ? 11 : 10;
  for (const auto& f : req) x->head.headers.emplace_back(str(f.name_string()), str(f.value()));
  x->has_body = !x->request->is_done();
  x->chunked_body = x->has_body && !x->request->content_length();
  x->is_head = req.method() == bhttp::verb::head;
  x->client_keep_alive = req.keep_alive();
  x->client_http11 = req.version() >= 11;
  const std::vector<std::string> connection = tokens(req, "connection");
  const std::vector<std::string> upgrade = tokens(req, "upgrade");
  x->upgrade = !upgrade.empty() && hasToken(connection, "upgrade");
  if (x->upgrade) {
    for (const auto& u : upgrade) {
      if (!x->upgrade_value.empty()) x->upgrade_value += ", ";
      x->upgrade_value += u;
    }
    if (upgrade.size() == 1 && iequals(upgrade.front(), "h2c")) {
      x->upgrade = false;
      // RFC 9113 §3.2 (h2c, RFC 7540 §3.2): a request without a body
      // switches the connection to HTTP/2; the HTTP/2 side answers the 101
      // and serves this request as stream 1. Otherwise (a body, no
      // settings, a drain) the upgrade is ignored, as a server may, and the
      // request served in HTTP/1.1.
      const std::optional<std::string> settings = header(req, "http2-settings");
      if (settings && !x->has_body && !closing() && !state_->stopped) {
        log::debug("http_h2c_upgrade", {{"client", formatAddress(info_.source)}});
        H2cUpgrade h2c{x->head, *settings};
        std::string rest = leftover(in_);
        in_.consume(in_.size());
        net::error_code ignored;
        idle_timer_.cancel();
        const int fd = client_.release(ignored);
        serveHttp2(state_, UniqueFd(fd), info_, std::move(rest), std::move(h2c));
        co_return false;
      }
    }
  }
  if (state_->stopped) {
    abort();
    co_return false;
  }

  x->route = state_->router.route(info_.port, x->head);
  if (log::enabled(log::Level::kDebug)) {  // per request: no fields built for nothing
    log::debug("http_request", {{"client", formatAddress(info_.source)},
                                {"method", x->head.method},
                                {"target", x->head.target},
                                {"request", requests_},
                                {"stolen_by", x->route ? x->route->subscription_id : 0}});
  }
  std::shared_ptr<Http1AppPool> pool;
  if (x->route) {
    absl::StatusOr<std::shared_ptr<StolenStream>> stolen =
        state_->router.openStolenRequest(state_->ex, *x->route, info_, x->head, requests_);
    if (!stolen.ok()) {
      co_return co_await answer(
          x, 502,
          "siphon-agent: the session that stole this request could not take it: " +
              std::string(stolen.status().message()) + "\n");
    }
    x->upstream = ByteStream(state_->ex, std::move(*stolen));
  } else {
    pool = Http1AppPool::of(*state_);
    if (std::optional<bool> keep = co_await connectApplication(x, pool, /*fresh=*/false)) {
      co_return *keep;
    }
  }

  // The request as canonical HTTP/1.1.
  std::string head = x->head.method + " " + x->head.target + " HTTP/1.1\r\n";
  appendFields(head, req, 0, x->request_fields, connection);
  if (x->upgrade) head += "Upgrade: " + x->upgrade_value + "\r\nConnection: Upgrade\r\n";
  if (x->has_body) {
    head += x->chunked_body
                ? std::string("Transfer-Encoding: chunked\r\n")
                : "Content-Length: " + std::to_string(*x->request->content_length()) + "\r\n";
  } else if (x->request->content_length()) {
    head += "Content-Length: 0\r\n";
  }
  head += "\r\n";

  for (int attempt = 0;; ++attempt) {
    net::error_code ec;
    co_await asio::async_write(x->upstream, asio::buffer(head),
                               asio::redirect_error(net::use_awaitable, ec));
    if (aborted_) co_return false;
    if (!ec) {
      if (x->has_body) {
        x->body_running = true;
        auto self = shared_from_this();
        net::spawn(state_->ex, forwardBodyHeld(self, x), "http1_request_body",
                   [self] { self->abort(); });
      } else {
        // The session reads the request up to its end of stream; an
        // upgrade's stream stays open for the raw bytes after a 101.
        if (x->route && !x->upgrade) x->upstream.shutdownSend();
        x->body_complete = true;
      }
    }
    const Outcome outcome = co_await forwardResponse(x, ec);
    if (outcome != Outcome::kRetry || attempt > 0) co_return outcome == Outcome::kKeepAlive;
    // A pooled connection the application had closed meanwhile; the
    // request (no body) went nowhere: once more on a new connection.
    log::debug("http_pool_retry", {{"destination", destination()}});
    if (std::optional<bool> keep = co_await connectApplication(x, pool, /*fresh=*/true)) {
      co_return *keep;
    }
    x->upstream_in.consume(x->upstream_in.size());
  }
}

net::awaitable<std::optional<bool>> Http1Connection::connectApplication(
    std::shared_ptr<Exchange> exchange, std::shared_ptr<Http1AppPool> pool, bool fresh) {
  const std::shared_ptr<Exchange> x = exchange;
  absl::StatusOr<AppConnection> conn =
      co_await pool->acquire(state_->router, info_.destination, fresh);
  if (aborted_) co_return false;
  if (!conn.ok()) {
    co_return co_await answer(x, 502,
                              "siphon-agent: the application at " + destination() +
                                  " could not be reached: " + std::string(conn.status().message()) +
                                  "\n");
  }
  x->upstream = ByteStream(std::move(conn->socket));
  x->reused = conn->reused;  // never for a fresh one
  co_return std::nullopt;
}

net::awaitable<Outcome> Http1Connection::forwardResponse(std::shared_ptr<Exchange> exchange,
                                                         net::error_code head_ec) {
  const std::shared_ptr<Exchange> x = exchange;
  const HttpOptions& o = state_->options;
  if (head_ec) co_return co_await upstreamFailed(x, head_ec, false);

  std::unique_ptr<ResponseParser> rp;
  while (true) {
    rp = std::make_unique<ResponseParser>();
    rp->header_limit(static_cast<uint32_t>(std::min<size_t>(o.max_head_bytes, UINT32_MAX)));
    rp->body_limit(bodyLimit(o.max_response_body));
    if (x->is_head) rp->skip(true);
    net::error_code ec;
    co_await bhttp::async_read_header(x->upstream, x->upstream_in, *rp,
                                      asio::redirect_error(net::use_awaitable, ec));
    if (aborted_) co_return Outcome::kClose;
    if (ec) co_return co_await upstreamFailed(x, ec, rp->got_some());
    const unsigned status = rp->get().result_int();
    if (status == 101 || status / 100 != 1) break;
    // 100 Continue and other interim answers: HTTP/1.0 clients know none.
    if (!x->client_http11) continue;
    std::string interim =
        "HTTP/1.1 " + std::to_string(status) + " " + str(rp->get().reason()) + "\r\n";
    appendFields(interim, rp->get(), 0, fieldCount(rp->get()), tokens(rp->get(), "connection"));
    interim += "\r\n";
    x->interim_sent = true;
    if (co_await writeClient(interim)) {
      abort();
      co_return Outcome::kClose;
    }
  }

  auto& res = rp->get();
  const unsigned status = res.result_int();
  const std::vector<std::string> connection = tokens(res, "connection");
  const size_t fields = fieldCount(res);
  std::string reason_phrase = str(res.reason());
  if (reason_phrase.empty()) reason_phrase = str(bhttp::obsolete_reason(res.result()));

  if (status == 101) {
    if (!x->upgrade) {
      co_return co_await upstreamFailed(x, bhttp::error::bad_status, false);
    }
    // A body sent with the upgrade request goes first; the client's bytes
    // after it belong to the new protocol.
    if (!co_await waitBody(x) || !x->body_complete) {
      abort();
      co_return Outcome::kClose;
    }
    std::string out = "HTTP/1.1 101 " + reason_phrase + "\r\n";
    appendFields(out, res, 0, fields, connection);
    const std::vector<std::string> up = tokens(res, "upgrade");
    std::string value;
    for (const auto& u : up) value += (value.empty() ? "" : ", ") + u;
    out += "Upgrade: " + (value.empty() ? x->upgrade_value : value) +
           "\r\nConnection: Upgrade\r\n\r\n";
    x->response_started = true;
    if (co_await writeClient(out)) {
      abort();
      co_return Outcome::kClose;
    }
    log::debug("http_upgraded", {{"client", formatAddress(info_.source)},
                                 {"protocol", x->upgrade_value},
                                 {"stolen", x->route.has_value()}});
    if (!x->route && state_->router.splicesToApplication() && x->upstream.socket() != nullptr) {
      // To the application: the steal service's splice (it moves in a
      // handover), this connection is done.
      net::error_code ignored;
      UniqueFd client(client_.release(ignored));
      UniqueFd app(x->upstream.socket()->release(ignored));
      state_->router.spliceToApplication(std::move(client), leftover(in_), std::move(app),
                                         leftover(x->upstream_in));
      in_.consume(in_.size());
      handed_off_ = true;
      co_return Outcome::kClose;
    }
    tunnel_ = std::make_shared<Tunnel>(ByteStream(std::move(client_)), leftover(in_),
                                       std::move(x->upstream),
                                       leftover(x->upstream_in));
    in_.consume(in_.size());
    co_await tunnel_->run();
    tunnel_.reset();
    lingered_ = true;
    co_return Outcome::kClose;
  }

  // The final response.
  const bool no_body = x->is_head || status == 204 || status == 304;
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase + "\r\n";
  appendFields(out, res, 0, fields, connection);
  bool chunk_out = false;
  bool close_after = false;
  if (no_body) {
    // A HEAD or 304 answer's length describes the resource, not this message.
    if (status != 204) {
      if (auto cl = header(res, "content-length")) out += "Content-Length: " + *cl + "\r\n";
    }
  } else if (rp->content_length()) {
    out += "Content-Length: " + std::to_string(*rp->content_length()) + "\r\n";
  } else if (x->client_http11) {
    out += "Transfer-Encoding: chunked\r\n";
    chunk_out = true;
  } else {
    close_after = true;  // an HTTP/1.0 client reads it to the end of the connection
  }
  // A request body still on its way (the server answered early, or
  // refused a 100-continue): the connection closes after this answer, as
  // where the body ends cannot be trusted.
  const bool keep = x->client_keep_alive && !close_after && !closing() && !x->body_running;
  if (!keep) {
    out += "Connection: close\r\n";
  } else if (!x->client_http11) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  x->response_started = true;
  // The server's body bytes already read with its head (a small answer
  // comes in one segment): the head waits for that first piece and both go
  // in one write, a system call per answer fewer. Only then: a head whose
  // body is not here yet (a stream of events, a slow server) goes at once.
  bool head_waits = !rp->is_done() && x->upstream_in.size() > 0;
  if (!head_waits && co_await writeClient(out)) {
    abort();
    co_return Outcome::kClose;
  }

  if (!rp->is_done()) {
    // Not zeroed: most answers are far smaller than a piece, and clearing
    // 64 KiB per answer was 2% of the agent's passthrough profile.
    auto buf = std::make_unique_for_overwrite<char[]>(kPiece);
    while (!rp->is_done()) {
      rp->get().body().data = buf.get();
      rp->get().body().size = kPiece;
      net::error_code ec;
      co_await bhttp::async_read_some(x->upstream, x->upstream_in, *rp,
                                      asio::redirect_error(net::use_awaitable, ec));
      if (aborted_) co_return Outcome::kClose;
      if (ec == bhttp::error::need_buffer) ec = {};
      const size_t n = kPiece - rp->get().body().size;
      if (head_waits) {
        // Parsed from what was buffered: no wait on the server happened.
        head_waits = false;
        if (co_await writeBody(client_, out, buf.get(), n, chunk_out)) {
          abort();
          co_return Outcome::kClose;
        }
      } else if (n > 0) {
        const net::error_code wec = co_await writeBody(client_, {}, buf.get(), n, chunk_out);
        if (wec) {
          abort();
          co_return Outcome::kClose;
        }
      }
      if (ec) {
        // The response began: an RST tells the client it is incomplete.
        log::info(
            "http_response_aborted",
            {{"client", formatAddress(info_.source)},
             {"stolen", x->route.has_value()},
             {"error", x->client_error ? std::string("request body over the limit") : reason(ec)}});
        abort();
        co_return Outcome::kClose;
      }
    }
    if (chunk_out) {
      std::string last = "0\r\n";
      appendFields(last, res, fields, fieldCount(res) - fields, connection);
      last += "\r\n";
      if (co_await writeClient(last)) {
        abort();
        co_return Outcome::kClose;
      }
    }
  }

  // The response is whole. The request body should be too; a server that
  // answered early gets a moment to take the rest.
  const bool body_read = co_await waitBody(x);
  if (aborted_) co_return Outcome::kClose;
  const bool reusable = !x->route && x->body_complete && rp->keep_alive() &&
                        x->upstream_in.size() == 0 && !x->client_error;
  if (reusable) {
    Http1AppPool::of(*state_)->release(info_.destination, std::move(*x->upstream.socket()));
  } else {
    x->upstream.close();
  }
  co_return keep&& body_read && x->request->is_done() && !x->client_failed ? Outcome::kKeepAlive
                                                                           : Outcome::kClose;
}

net::awaitable<Outcome> Http1Connection::upstreamFailed(std::shared_ptr<Exchange> exchange,
                                                        net::error_code ec, bool got_some) {
  const std::shared_ptr<Exchange> x = exchange;
  const HttpOptions& o = state_->options;
  if (x->client_failed || x->response_started) {
    log::info("http_response_aborted", {{"client", formatAddress(info_.source)},
                                        {"stolen", x->route.has_value()},
                                        {"error", reason(ec)}});
    abort();
    co_return Outcome::kClose;
  }
  if (x->client_error == 413) {
    co_await answer(x, 413,
                    "siphon-agent: the request body is larger than " +
                        std::to_string(o.max_request_body) + " bytes\n");
    co_return Outcome::kClose;
  }
  if (!x->route && x->reused && !x->has_body && !got_some && !x->interim_sent) {
    x->upstream.close();
    co_return Outcome::kRetry;
  }
  std::string message;
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
    message = "the response head is larger than " + std::to_string(o.max_head_bytes) + " bytes";
  } else if (ec == bhttp::error::body_limit) {
    message = "the response body is larger than " + std::to_string(o.max_response_body) + " bytes";
  } else if (ec == bhttp::error::bad_status) {
    message = "it answered 101 Switching Protocols to a request that asked for no upgrade";
  } else if (x->route) {
    message = "went away before answering (" + reason(ec) + ")";
  } else {
    message = "closed the connection before answering (" + reason(ec) + ")";
  }
  const std::string who =
      x->route ? "the session that stole this request" : "the application at " + destination();
  log::info("http_bad_gateway",
            {{"client", formatAddress(info_.source)}, {"upstream", who}, {"error", message}});
  const bool keep = co_await answer(x, 502, "siphon-agent: " + who + " " + message + "\n");
  co_return keep ? Outcome::kKeepAlive : Outcome::kClose;
}

net::awaitable<void> Http1Connection::forwardBody(std::shared_ptr<Exchange> exchange) {
  const std::shared_ptr<Exchange> x = exchange;
  auto self = shared_from_this();
  try {
    auto buf = std::make_unique_for_overwrite<char[]>(kPiece);  // not zeroed
    RequestParser& p = *x->request;
    net::error_code ec;
    while (!p.is_done() && !aborted_) {
      p.get().body().data = buf.get();
      p.get().body().size = kPiece;
      co_await bhttp::async_read_some(client_, in_, p,
                                      asio::redirect_error(net::use_awaitable, ec));
      if (aborted_) break;
      if (ec == bhttp::error::need_buffer) ec = {};
      const size_t n = kPiece - p.get().body().size;
      // Once the upstream stopped taking the body (it answered, failed, or
      // the agent answered instead), the rest is read and dropped, so the
      // client's writes do not block before it reads the answer.
      if (n > 0 && !x->upstream_write_failed) {
        const net::error_code wec =
            co_await writeBody(x->upstream, {}, buf.get(), n, x->chunked_body);
        if (wec) x->upstream_write_failed = true;
      }
      if (ec) {
        if (ec == bhttp::error::body_limit) {
          x->client_error = 413;
          log::info("http_request_body_limit", {{"client", formatAddress(info_.source)},
                                                {"limit", state_->options.max_request_body}});
        } else {
          x->client_failed = true;  // the client closed or reset mid-body
        }
        // Ends the response read: the request will never be whole.
        x->upstream.cancel();
        break;
      }
    }
    if (p.is_done() && !aborted_ && !x->upstream_write_failed) {
      net::error_code wec;
      if (x->chunked_body) {
        std::string last = "0\r\n";
        appendFields(last, p.get(), x->request_fields, fieldCount(p.get()) - x->request_fields,
                     tokens(p.get(), "connection"));
        last += "\r\n";
        co_await asio::async_write(x->upstream, asio::buffer(last),
                                   asio::redirect_error(net::use_awaitable, wec));
      }
      if (!wec && x->route && !x->upgrade && x->upstream.is_open()) x->upstream.shutdownSend();
      x->body_complete = !wec;
    }
  } catch (const std::exception& e) {
    log::warn("http1_body_failed", {{"error", e.what()}});
    x->client_failed = true;
  }
  x->body_running = false;
  x->body_signal.notify();
}

net::awaitable<bool> Http1Connection::waitBody(std::shared_ptr<Exchange> exchange) {
  const std::shared_ptr<Exchange> x = exchange;
  const auto deadline = std::chrono::steady_clock::now() + kLinger;
  while (x->body_running && std::chrono::steady_clock::now() < deadline) {
    co_await x->body_signal.wait(deadline);
  }
  co_return !x->body_running;
}

net::awaitable<void> Http1Connection::stopBody(std::shared_ptr<Exchange> exchange) {
  const std::shared_ptr<Exchange> x = exchange;
  if (x->body_running) cancelClient();
  while (x->body_running) co_await x->body_signal.wait();
}

net::awaitable<bool> Http1Connection::answer(std::shared_ptr<Exchange> exchange, unsigned status,
                                             std::string message) {
  const std::shared_ptr<Exchange> x = exchange;
  if (x) {
    x->upstream_write_failed = true;  // the body, if any, is read and dropped
    // A session's stream is reset: its response is no longer wanted.
    if (x->route) {
      x->upstream.abort();
    } else {
      x->upstream.close();
    }
    x->response_started = true;
  }
  // Kept open only when nothing of the request is left unread.
  const bool keep = x && !x->has_body && x->client_keep_alive && !closing();
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " +
                    str(bhttp::obsolete_reason(static_cast<bhttp::status>(status))) +
                    "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
                    std::to_string(message.size()) + "\r\n";
  out += keep ? (x->client_http11 ? "" : "Connection: keep-alive\r\n") : "Connection: close\r\n";
  out += "\r\n";
  if (!(x && x->is_head)) out += message;
  if (co_await writeClient(out)) {
    abort();
    co_return false;
  }
  if (x && x->body_running) co_await waitBody(x);
  co_return keep;
}

net::awaitable<void> Http1Connection::closeClient() {
  if (!client_.is_open()) co_return;
  ::shutdown(client_.native_handle(), SHUT_WR);
  if (!lingered_) {
    // Read and drop what the client still sends until its FIN, so unread
    // bytes at close() do not turn our FIN into an RST that could destroy
    // the answer before the client read it.
    asio::steady_timer timer(state_->ex);
    timer.expires_after(kLinger);
    timer.async_wait([weak = weak_from_this()](net::error_code ec) {
      auto self = weak.lock();
      if (!ec && self) self->cancelClient();
    });
    std::vector<char> buf(16 * 1024);
    while (!aborted_) {
      net::error_code ec;
      co_await client_.async_read_some(asio::buffer(buf),
                                       asio::redirect_error(net::use_awaitable, ec));
      if (ec) break;
    }
    timer.cancel();
  }
  net::error_code ignored;
  client_.close(ignored);
}

net::awaitable<net::error_code> Http1Connection::writeClient(std::string_view bytes) {
  co_return co_await writeAll(client_, bytes.data(), bytes.size());
}

net::awaitable<net::error_code> Http1Connection::writeAll(Descriptor& to, const char* data,
                                                          size_t n) {
  net::error_code ec;
  co_await asio::async_write(to, asio::buffer(data, n),
                             asio::redirect_error(net::use_awaitable, ec));
  co_return ec;
}

template <class Stream>
net::awaitable<net::error_code> Http1Connection::writeBody(Stream& to, std::string_view head,
                                                           const char* data, size_t n,
                                                           bool chunked) {
  const std::string size = chunked && n > 0 ? hex(n) : std::string();
  std::array<asio::const_buffer, 4> buffers;
  size_t count = 0;
  if (!head.empty()) buffers[count++] = asio::buffer(head.data(), head.size());
  if (n > 0 && chunked) {
    buffers[count++] = asio::buffer(size);
    buffers[count++] = asio::buffer(data, n);
    buffers[count++] = asio::buffer("\r\n", 2);
  } else if (n > 0) {
    buffers[count++] = asio::buffer(data, n);
  }
  net::error_code ec;
  co_await asio::async_write(to, std::span(buffers.data(), count),
                             asio::redirect_error(net::use_awaitable, ec));
  co_return ec;
}

}  // namespace

void serveHttp1(std::shared_ptr<EngineState> state, UniqueFd client, ConnectionInfo info,
                std::string received, uint64_t requests) {
  auto c = std::make_shared<Http1Connection>(std::move(state), std::move(client), std::move(info),
                                             std::move(received), requests);
  c->start();
}

}  // namespace siphon::agent::steal::http
