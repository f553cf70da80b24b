#include "agent/steal/http/engine.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <vector>

#include "agent/common/log.h"
#include "siphon/status.h"
#include "agent/steal/http/detect.h"
#include "agent/steal/http/http1.h"
#include "agent/steal/http/http2.h"
#include "agent/steal/http/pool.h"
#include "agent/steal/http/tunnel.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {
namespace {

namespace asio = net::asio;

// A connection from accept() until its protocol is known, and then, when
// it is no HTTP the engine speaks, its passthrough to the application. An
// HTTP connection is handed to its protocol's engine (which registers
// itself) and this object goes.
//
// Drain while detecting: the connection passes through at once with what
// it sent so far (its requests reach the application, which the steal
// gives the port back to), rather than being closed under a client that
// has not even spoken.
class PendingConnection final : public LiveConnection,
                                public std::enable_shared_from_this<PendingConnection> {
 public:
  // `received`: bytes already read from the client (a connection another
  // agent parked while detecting).
  PendingConnection(std::shared_ptr<EngineState> state, UniqueFd client, ConnectionInfo info,
                    std::string received = {})
      : state_(std::move(state)),
        info_(std::move(info)),
        client_(adoptSocket(state_->ex, client.release())),
        timer_(state_->ex),
        unparked_(state_->ex),
        received_(std::move(received)) {}
  ~PendingConnection() override { unregister(); }

  void start() {
    state_->connections.insert(this);
    registered_ = true;
    // An exception out of detection or the passthrough aborts this
    // connection only (logged as coroutine_failed what=http_detect).
    auto self = shared_from_this();
    net::spawn(state_->ex, runHeld(self), "http_detect", [self] { self->abort(); });
    if (state_->parking) park();
  }

  void drain() override {
    drain_ = true;
    unparked_.notify();  // a parked one passes through now
    if (detecting_) {
      net::error_code ignored;
      client_.cancel(ignored);
    }
  }
  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    timer_.cancel();
    unparked_.notify();
    abortDescriptor(client_);
    if (tunnel_) tunnel_->abort();
  }
  // Detecting, or passing through: either way under way.
  bool busy() const override { return true; }

  // Detecting: stops at once, with what it read so far. Passing through:
  // not parked (a tunnel the router did not take runs to its end).
  void park() override {
    parking_ = true;
    if (detecting_ && !parked_) {
      timer_.cancel();
      net::error_code ignored;
      client_.cancel(ignored);
    }
  }
  void unpark() override {
    parking_ = false;
    unparked_.notify();
  }
  bool parked() const override { return parked_; }
  absl::StatusOr<ParkedConnection> exportParked() override {
    if (!parked_) return absl::FailedPreconditionError("an HTTP connection is not parked");
    ParkedConnection p;
    p.client = UniqueFd(::fcntl(client_.native_handle(), F_DUPFD_CLOEXEC, 3));
    if (!p.client) return lastErrnoStatus("handover: dup an HTTP client socket");
    p.info = info_;
    p.detecting = true;
    p.received = received_;
    return p;
  }

 private:
  // What net::spawn starts; GCC 12: the parameter is moved into a local
  // before the first suspension.
  static net::awaitable<void> runHeld(std::shared_ptr<PendingConnection> self_in) {
    const std::shared_ptr<PendingConnection> self = std::move(self_in);
    co_await self->run();
  }
  void unregister() {
    if (registered_) state_->connections.erase(this);
    registered_ = false;
  }

  net::awaitable<void> run() {
    const HttpOptions& o = state_->options;
    std::string& received = received_;
    Protocol protocol = received.empty() ? Protocol::kNeedMore
                                         : detectProtocol(received, o.max_head_bytes);
    bool timed_out = false;
    detecting_ = true;
    while (protocol == Protocol::kNeedMore && !drain_ && !state_->draining) {
      // A handover parks the connection here, between reads (its bytes
      // are in `received`).
      while (parking_ && !aborted_ && !drain_ && !state_->draining) {
        parked_ = true;
        co_await unparked_.wait();
        parked_ = false;
      }
      if (aborted_) co_return;
      if (drain_ || state_->draining) break;
      // Each read gets detect_timeout: a client that has begun a request
      // line gets as long for the next piece as for the first byte.
      timer_.expires_after(o.detect_timeout);
      timer_.async_wait([weak = weak_from_this()](net::error_code ec) {
        auto self = weak.lock();
        if (ec || !self || !self->detecting_) return;
        self->timed_out_ = true;
        net::error_code ignored;
        self->client_.cancel(ignored);
      });
      const size_t old = received.size();
      received.resize(old + 4096);
      net::error_code ec;
      const size_t n = co_await client_.async_read_some(
          asio::buffer(received.data() + old, 4096), asio::redirect_error(net::use_awaitable, ec));
      received.resize(old + n);
      timer_.cancel();
      if (aborted_) co_return;
      if (timed_out_) {
        timed_out = true;
        break;
      }
      if (ec == asio::error::operation_aborted) {
        if (parking_ && !drain_ && !state_->draining) continue;  // parks
        break;                                                   // drain
      }
      if (ec == asio::error::eof) {
        // A client that sends and half-closes (or connects and closes):
        // whatever it sent goes to the application, FIN after it.
        if (received.empty()) {
          detecting_ = false;
          co_return;  // closes
        }
        eof_ = true;
        break;
      }
      if (ec) {
        detecting_ = false;
        abort();
        co_return;
      }
      protocol = detectProtocol(received, o.max_head_bytes);
    }
    detecting_ = false;

    if (!drain_ && !state_->draining && !state_->stopped) {
      if (protocol == Protocol::kHttp1) {
        unregister();
        serveHttp1(state_, UniqueFd(client_.release()), info_, std::move(received));
        co_return;
      }
      if (protocol == Protocol::kHttp2) {
        unregister();
        serveHttp2(state_, UniqueFd(client_.release()), info_, std::move(received), std::nullopt);
        co_return;
      }
    }
    log::debug("http_passthrough", {{"client", formatAddress(info_.source)},
                                    {"destination", formatAddress(info_.destination)},
                                    {"reason", timed_out ? "no client bytes in time"
                                               : protocol == Protocol::kOther ? "not http"
                                               : eof_ ? "closed before a request line"
                                                      : "draining"}});
    co_await passthrough(std::move(received));
  }

  net::awaitable<void> passthrough(std::string received) {
    if (state_->stopped) {
      abort();
      co_return;
    }
    absl::StatusOr<UniqueFd> app = co_await state_->router.connectApplication(info_.destination);
    if (aborted_) co_return;
    if (!app.ok()) {
      log::info("http_passthrough_failed", {{"destination", formatAddress(info_.destination)},
                                            {"error", std::string(app.status().message())}});
      abort();  // as the application's own refusal would: an RST
      co_return;
    }
    // The steal service's splice where it takes one (it moves in a
    // handover); else a tunnel of the engine's own.
    if (state_->router.splicesToApplication()) {
      net::error_code ignored;
      UniqueFd client(client_.release(ignored));
      state_->router.spliceToApplication(std::move(client), std::move(received), std::move(*app),
                                         std::string());
      co_return;
    }
    Descriptor app_socket = adoptSocket(state_->ex, app->release());
    tunnel_ = std::make_shared<Tunnel>(ByteStream(std::move(client_)), std::move(received),
                                       ByteStream(std::move(app_socket)), std::string());
    co_await tunnel_->run();
  }

  std::shared_ptr<EngineState> state_;
  ConnectionInfo info_;
  Descriptor client_;
  asio::steady_timer timer_;
  std::shared_ptr<Tunnel> tunnel_;
  net::Signal unparked_;
  std::string received_;
  bool registered_ = false;
  bool parking_ = false;
  bool parked_ = false;
  bool detecting_ = false;
  bool timed_out_ = false;
  bool drain_ = false;
  bool aborted_ = false;
  bool eof_ = false;
};

}  // namespace

HttpEngine::HttpEngine(net::asio::any_io_executor ex, HttpRouter& router, HttpOptions options)
    : state_(std::make_shared<EngineState>(std::move(ex), router, options)) {}

HttpEngine::~HttpEngine() { stop(); }

void HttpEngine::serve(UniqueFd client, ConnectionInfo info) {
  if (state_->stopped) return;  // closes it
  // Responses go out as a head, then body pieces: with Nagle the second
  // small write of a keep-alive connection waits for the client's delayed
  // ACK (40 ms a request).
  int one = 1;
  ::setsockopt(client.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto c = std::make_shared<PendingConnection>(state_, std::move(client), std::move(info));
  c->start();
  if (state_->draining) c->drain();
}

void HttpEngine::drain() {
  state_->draining = true;
  // drain() may close a connection, which may then leave the set.
  const std::vector<LiveConnection*> all(state_->connections.begin(), state_->connections.end());
  for (LiveConnection* c : all) {
    if (state_->connections.count(c)) c->drain();
  }
  if (state_->h1_pool) state_->h1_pool->close();
}

void HttpEngine::stop() {
  state_->draining = true;
  state_->stopped = true;
  const std::vector<LiveConnection*> all(state_->connections.begin(), state_->connections.end());
  for (LiveConnection* c : all) {
    if (state_->connections.count(c)) c->abort();
  }
  if (state_->h1_pool) state_->h1_pool->close();
}

size_t HttpEngine::inFlight() const {
  size_t n = 0;
  for (const LiveConnection* c : state_->connections) n += c->busy() ? 1 : 0;
  return n;
}

size_t HttpEngine::connections() const { return state_->connections.size(); }

void HttpEngine::park() {
  state_->parking = true;
  const std::vector<LiveConnection*> all(state_->connections.begin(), state_->connections.end());
  for (LiveConnection* c : all) {
    if (state_->connections.count(c)) c->park();
  }
  // Idle connections to the application stay: after a thaw they serve
  // again; after a handover they close with this process (an idle
  // keep-alive connection closing is nothing to the application).
}

void HttpEngine::unpark() {
  if (!state_->parking) return;
  state_->parking = false;
  const std::vector<LiveConnection*> all(state_->connections.begin(), state_->connections.end());
  for (LiveConnection* c : all) {
    if (state_->connections.count(c)) c->unpark();
  }
}

size_t HttpEngine::unparked() const {
  size_t n = 0;
  for (const LiveConnection* c : state_->connections) n += c->parked() ? 0 : 1;
  return n;
}

absl::StatusOr<std::vector<ParkedConnection>> HttpEngine::exportParked() {
  std::vector<ParkedConnection> out;
  for (LiveConnection* c : state_->connections) {
    absl::StatusOr<ParkedConnection> p = c->exportParked();
    if (!p.ok()) return p.status();
    out.push_back(std::move(*p));
  }
  return out;
}

void HttpEngine::adopt(std::vector<ParkedConnection> connections) {
  for (ParkedConnection& p : connections) {
    if (state_->stopped) return;  // the rest close
    if (p.detecting) {
      auto c = std::make_shared<PendingConnection>(state_, std::move(p.client), std::move(p.info),
                                                   std::move(p.received));
      c->start();
      if (state_->draining) c->drain();
    } else {
      serveHttp1(state_, std::move(p.client), std::move(p.info), std::move(p.received),
                 p.requests);
    }
  }
}

std::array<uint64_t, kHttp2Limits> HttpEngine::http2Limits() const { return state_->h2_limits; }

void HttpEngine::onHttp2Limit(std::function<void(Http2Limit)> observer) {
  state_->on_h2_limit = std::move(observer);
}

}  // namespace siphon::agent::steal::http
