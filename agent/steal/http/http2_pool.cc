// HTTP/2 connections to the application (nghttp2 client sessions, prior
// knowledge), shared by the HTTP/2 client connections: each request the
// filters leave to the application becomes a stream on one of them, its
// headers, data and trailers passed through both ways (gRPC lives on
// trailers).
//
// Flow control: NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE here too. Response bytes
// are consumed (WINDOW_UPDATE to the application) only once the client
// side sent them, so a slow client holds at most one stream window
// (kPoolStreamWindow) of the shared connection's window (kPoolConnectionWindow).
// Request bytes are taken from the exchange only as the application's
// windows allow (a deferred data provider resumed when bytes arrive).
#include <nghttp2/nghttp2.h>

#include <array>
#include <charconv>

#include "agent/common/log.h"
#include "agent/outgoing/address.h"
#include "agent/steal/http/http2.h"
#include "agent/steal/http/http2_exchange.h"
#include "agent/steal/http/http2_wire.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {

namespace asio = net::asio;

namespace {

constexpr int32_t kPoolStreamWindow = 64 * 1024;
constexpr int32_t kPoolConnectionWindow = 16 * 1024 * 1024;
// Requests on one application connection (open, waiting for the
// connection, or queued by nghttp2 past the application's
// SETTINGS_MAX_CONCURRENT_STREAMS). Every HTTP/2 client connection to the
// destination shares it, so no client's limit bounds it: past this a
// request is answered 503.
constexpr size_t kMaxAppConnectionStreams = 1024;

}  // namespace

class AppStream;

class Http2AppConnection : public Http2Wire,
                           public std::enable_shared_from_this<Http2AppConnection> {
 public:
  Http2AppConnection(asio::any_io_executor ex, std::weak_ptr<Http2AppPool> pool,
                     SockAddr destination)
      : Http2Wire(ex, "steal_http2_app_error", ""),
        ex_(ex),
        pool_(std::move(pool)),
        destination_(destination) {}

  void start(HttpRouter& router) {
    auto self = shared_from_this();
    net::spawn(ex_, holding(self, &router), "steal_http2_app_connect", [self] { self->close(); });
  }

  // Takes new streams (not failed, no GOAWAY either way).
  bool usable() const { return !dead_ && !goaway_; }
  // Requests on it now (open or waiting).
  size_t outstanding() const { return streams_.size() + pending_.size(); }
  bool dead() const { return dead_; }

  void open(std::shared_ptr<Http2Exchange> x, int attempt);
  void close();

  // For AppStream.
  nghttp2_session* session() const { return session_; }
  void streamDone(AppStream* s);

 private:
  friend class AppStream;
  // connect(), the connection alive while it runs.
  static net::awaitable<void> holding(std::shared_ptr<Http2AppConnection> self,
                                      HttpRouter* router) {
    // A frame variable: GCC 12 may drop a by-value coroutine parameter.
    const auto keep = std::move(self);
    co_await keep->connect(*router);
  }
  net::awaitable<void> connect(HttpRouter& router);
  bool initSession();
  void submit(const std::shared_ptr<AppStream>& s);
  net::awaitable<void> readLoop();
  net::awaitable<void> writeLoop();
  void maybeRetire();

  // Http2Wire.
  bool wireClosed() const override { return dead_; }
  void wireClose() override { close(); }
  bool wireIdle(bool session_done) override {
    if (session_done) close();
    return session_done;
  }

  static Http2AppConnection* self(void* ud) { return static_cast<Http2AppConnection*>(ud); }
  static AppStream* stream(nghttp2_session* session, int32_t id) {
    return static_cast<AppStream*>(nghttp2_session_get_stream_user_data(session, id));
  }
  static int onHeader(nghttp2_session*, const nghttp2_frame*, const uint8_t*, size_t,
                      const uint8_t*, size_t, uint8_t, void*);
  static int onFrameRecv(nghttp2_session*, const nghttp2_frame*, void*);
  static int onDataChunk(nghttp2_session*, uint8_t, int32_t, const uint8_t*, size_t, void*);
  static int onStreamClose(nghttp2_session*, int32_t, uint32_t, void*);
  static ssize_t readRequest(nghttp2_session*, int32_t, uint8_t*, size_t, uint32_t*,
                             nghttp2_data_source*, void*);

  asio::any_io_executor ex_;
  std::weak_ptr<Http2AppPool> pool_;
  SockAddr destination_;
  bool connected_ = false;
  bool dead_ = false;
  bool goaway_ = false;
  std::vector<std::shared_ptr<AppStream>> pending_;  // until connected
  std::map<AppStream*, std::shared_ptr<AppStream>> streams_;
};

// One request on an application connection: the exchange's upstream.
class AppStream : public Http2Upstream, public std::enable_shared_from_this<AppStream> {
 public:
  AppStream(std::shared_ptr<Http2AppConnection> conn, std::shared_ptr<Http2Exchange> x, int attempt)
      : conn_(std::move(conn)), x_(std::move(x)), attempt_(attempt) {}

  void requestUpdated() override {
    if (stream_id_ > 0 && deferred_ && conn_->session() != nullptr) {
      deferred_ = false;
      nghttp2_session_resume_data(conn_->session(), stream_id_);
      conn_->kick();
    }
  }
  void responseTaken(size_t n) override {
    if (stream_id_ > 0 && conn_->session() != nullptr) {
      nghttp2_session_consume(conn_->session(), stream_id_, n);
      conn_->kick();
    }
  }
  void cancel() override {
    if (!x_) return;
    // Response bytes the client will never take still hold the
    // application connection's window.
    if (stream_id_ > 0 && conn_->session() != nullptr && !x_->response_body.empty()) {
      nghttp2_session_consume(conn_->session(), stream_id_, x_->response_body.size());
    }
    x_.reset();
    if (stream_id_ > 0 && open_ && conn_->session() != nullptr) {
      nghttp2_submit_rst_stream(conn_->session(), NGHTTP2_FLAG_NONE, stream_id_, NGHTTP2_CANCEL);
      conn_->kick();
    }
    if (stream_id_ <= 0) conn_->streamDone(this);
  }

  // The stream ended on the application's side (closed, reset, or the
  // connection died) with `error_code`.
  void closed(uint32_t error_code) {
    open_ = false;
    auto x = std::move(x_);
    if (x && !x->response_ended && !x->failed) {
      // GOAWAY or REFUSED_STREAM before the application processed it:
      // nothing was sent or taken, so it may go on another connection.
      const bool untouched = !took_request_ && x->status == 0 && x->response_bytes == 0;
      auto pool = conn_->pool_.lock();
      if (error_code == NGHTTP2_REFUSED_STREAM && untouched && attempt_ < 2 && pool) {
        // The exchange gets a new upstream on another connection.
        pool->open(conn_->destination_, x, attempt_ + 1);
        return;
      }
      x->respondFailure(error_code == NGHTTP2_NO_ERROR ? uint32_t{NGHTTP2_INTERNAL_ERROR}
                                                       : error_code);
    }
  }

  std::shared_ptr<Http2AppConnection> conn_;
  std::shared_ptr<Http2Exchange> x_;
  int attempt_;
  int32_t stream_id_ = 0;
  bool open_ = false;
  bool deferred_ = false;
  bool took_request_ = false;
  // The response head, until complete.
  int status_ = 0;
  HeaderList headers_;
  HeaderList trailers_;
};

void Http2AppConnection::open(std::shared_ptr<Http2Exchange> x, int attempt) {
  auto s = std::make_shared<AppStream>(shared_from_this(), x, attempt);
  x->upstream = s;
  if (dead_) {
    s->closed(NGHTTP2_INTERNAL_ERROR);
    return;
  }
  if (!connected_) {
    pending_.push_back(s);
    return;
  }
  submit(s);
}

void Http2AppConnection::submit(const std::shared_ptr<AppStream>& s) {
  const Http2Exchange& x = *s->x_;
  std::vector<nghttp2_nv> nva;
  const std::string scheme = x.scheme.empty() ? "http" : x.scheme;
  nva.push_back(nv(":method", x.method));
  if (x.method != "CONNECT") {
    nva.push_back(nv(":scheme", scheme));
    nva.push_back(nv(":path", x.path));
  }
  if (!x.authority.empty()) nva.push_back(nv(":authority", x.authority));
  for (const auto& [name, value] : x.headers) {
    if (name == "host" && !x.authority.empty()) continue;
    if (isConnectionSpecific(name) && !(name == "te" && value == "trailers")) continue;
    nva.push_back(nv(name, value));
  }
  nghttp2_data_provider prd;
  prd.source.ptr = s.get();
  prd.read_callback = &readRequest;
  const bool body = x.body_follows || !x.request_body.empty();
  const int32_t id = nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(),
                                            body ? &prd : nullptr, s.get());
  if (id < 0) {
    log::warn("steal_http2_app_submit_failed", {{"error", nghttp2_strerror(id)}});
    s->closed(NGHTTP2_INTERNAL_ERROR);
    return;
  }
  s->stream_id_ = id;
  s->open_ = true;
  streams_[s.get()] = s;
  kick();
}

void Http2AppConnection::streamDone(AppStream* s) {
  std::erase_if(pending_, [s](const auto& p) { return p.get() == s; });
  streams_.erase(s);
  maybeRetire();
}

void Http2AppConnection::maybeRetire() {
  if (goaway_ && !dead_ && streams_.empty() && pending_.empty()) close();
}

net::awaitable<void> Http2AppConnection::connect(HttpRouter& router) {
  try {
    auto fd = co_await router.connectApplication(destination_);
    if (dead_) co_return;
    if (!fd.ok()) {
      log::warn("steal_http2_app_connect_failed",
                {{"destination", outgoing::formatAddress(destination_)},
                 {"error", fd.status().ToString()}});
      close();
      co_return;
    }
    sock_.assign(fd->release());
    if (!initSession()) {
      close();
      co_return;
    }
    connected_ = true;
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& s : pending) {
      if (s->x_) submit(s);
    }
    auto self = shared_from_this();
    net::spawn(ex_, readLoop(), "steal_http2_app_read", [self] { self->close(); });
    net::spawn(ex_, writeLoop(), "steal_http2_app_write", [self] { self->close(); });
  } catch (const std::exception& e) {
    log::error("steal_http2_app_error", {{"error", e.what()}});
    close();
  }
}

bool Http2AppConnection::initSession() {
  const auto callbacks = [](nghttp2_session_callbacks* cbs) {
    nghttp2_session_callbacks_set_on_header_callback(cbs, &onHeader);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &onFrameRecv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &onDataChunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &onStreamClose);
  };
  if (!newHttp2Session(&session_, /*server=*/false, callbacks, this)) return false;
  std::array<nghttp2_settings_entry, 2> iv{{
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kPoolStreamWindow)},
  }};
  return submitHttp2Settings(session_, iv, kPoolConnectionWindow);
}

int Http2AppConnection::onHeader(nghttp2_session* session, const nghttp2_frame* frame,
                                 const uint8_t* name, size_t namelen, const uint8_t* value,
                                 size_t valuelen, uint8_t, void*) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  AppStream* s = stream(session, frame->hd.stream_id);
  if (s == nullptr) return 0;
  const std::string_view n = sv(name, namelen);
  const std::string_view v = sv(value, valuelen);
  if (frame->headers.cat == NGHTTP2_HCAT_RESPONSE) {
    if (n == ":status") {
      s->status_ = 0;
      std::from_chars(v.data(), v.data() + v.size(), s->status_);
      s->headers_.clear();
    } else if (!n.starts_with(':')) {
      s->headers_.emplace_back(n, v);
    }
  } else if (frame->headers.cat == NGHTTP2_HCAT_HEADERS) {
    s->trailers_.emplace_back(n, v);
  }
  return 0;
}

int Http2AppConnection::onFrameRecv(nghttp2_session* session, const nghttp2_frame* frame,
                                    void* ud) {
  auto* c = self(ud);
  if (frame->hd.type == NGHTTP2_GOAWAY) {
    c->goaway_ = true;
    if (auto pool = c->pool_.lock()) pool->forget(c);
    c->maybeRetire();
    return 0;
  }
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  AppStream* s = stream(session, frame->hd.stream_id);
  if (s == nullptr) return 0;
  const bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  std::shared_ptr<Http2Exchange> x = s->x_;
  if (!x) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_RESPONSE) {
    if (s->status_ >= 100 && s->status_ < 200) return 0;  // interim: not passed on
    x->respondHead(s->status_, std::move(s->headers_), end);
    return 0;
  }
  if (end) x->respondEnd(std::move(s->trailers_));
  return 0;
}

int Http2AppConnection::onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id,
                                    const uint8_t* data, size_t len, void*) {
  AppStream* s = stream(session, stream_id);
  if (s == nullptr || !s->x_ || !s->x_->respondData(sv(data, len))) {
    nghttp2_session_consume(session, stream_id, len);
  }
  return 0;
}

int Http2AppConnection::onStreamClose(nghttp2_session* session, int32_t stream_id,
                                      uint32_t error_code, void* ud) {
  auto* c = self(ud);
  AppStream* s = stream(session, stream_id);
  if (s == nullptr) return 0;
  auto keep = s->shared_from_this();
  s->closed(error_code);
  c->streams_.erase(s);
  c->maybeRetire();
  return 0;
}

ssize_t Http2AppConnection::readRequest(nghttp2_session* session, int32_t stream_id, uint8_t* buf,
                                        size_t length, uint32_t* data_flags,
                                        nghttp2_data_source* source, void*) {
  auto* s = static_cast<AppStream*>(source->ptr);
  const std::shared_ptr<Http2Exchange> x = s->x_;
  if (!x) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  const size_t n = x->request_body.take(buf, length);
  if (n > 0) {
    s->took_request_ = true;
    x->creditRequest(n);
  }
  if (x->request_body.empty() && x->request_ended) {
    endHttp2Data(session, stream_id, x->request_trailers, data_flags);
    return static_cast<ssize_t>(n);
  }
  if (n == 0) {
    s->deferred_ = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  return static_cast<ssize_t>(n);
}

net::awaitable<void> Http2AppConnection::readLoop() {
  auto self = shared_from_this();
  try {
    std::vector<char> buf(kHttp2ReadChunk);
    while (!dead_) {
      net::error_code ec;
      const size_t n = co_await sock_.async_read_some(asio::buffer(buf),
                                                      asio::redirect_error(net::use_awaitable, ec));
      if (dead_) co_return;
      if (ec) {
        log::debug(
            "steal_http2_app_closed",
            {{"destination", outgoing::formatAddress(destination_)}, {"error", ec.message()}});
        close();
        co_return;
      }
      const ssize_t rv =
          nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(buf.data()), n);
      if (rv < 0) {
        log::warn("steal_http2_app_protocol_error",
                  {{"error", nghttp2_strerror(static_cast<int>(rv))}});
        close();
        co_return;
      }
      kick();
    }
  } catch (const std::exception& e) {
    log::error("steal_http2_app_error", {{"error", e.what()}});
    close();
  }
}

net::awaitable<void> Http2AppConnection::writeLoop() {
  auto self = shared_from_this();
  co_await Http2Wire::writeLoop();
}

void Http2AppConnection::close() {
  if (dead_) return;
  dead_ = true;
  auto keep = shared_from_this();
  if (auto pool = pool_.lock()) pool->forget(this);
  net::error_code ec;
  sock_.close(ec);
  kick();
  // Streams not answered in full get 502 or RST (or, untouched, another
  // connection).
  auto pending = std::move(pending_);
  pending_.clear();
  auto streams = std::move(streams_);
  streams_.clear();
  for (auto& s : pending) s->closed(NGHTTP2_REFUSED_STREAM);
  for (auto& [p, s] : streams) s->closed(NGHTTP2_INTERNAL_ERROR);
}

Http2AppPool::Http2AppPool(std::weak_ptr<EngineState> state) : state_(std::move(state)) {}

Http2AppPool::~Http2AppPool() = default;

void Http2AppPool::open(const SockAddr& destination, std::shared_ptr<Http2Exchange> x,
                        int attempt) {
  auto state = state_.lock();
  if (!state) {
    x->respondFailure();
    return;
  }
  const std::string key = outgoing::formatAddress(destination);
  auto it = live_.find(key);
  if (it != live_.end() && !it->second->usable()) {
    live_.erase(it);
    it = live_.end();
  }
  if (it == live_.end()) {
    auto conn = std::make_shared<Http2AppConnection>(state->ex, weak_from_this(), destination);
    it = live_.emplace(key, conn).first;
    all_.push_back(conn);
    std::erase_if(all_, [](const auto& w) { return w.expired(); });
    conn->start(state->router);
  }
  if (it->second->outstanding() >= kMaxAppConnectionStreams) {
    state->h2Limit(Http2Limit::kPoolFull);
    x->respondRefused(503, "too many requests are waiting for the application");
    return;
  }
  it->second->open(std::move(x), attempt);
}

void Http2AppPool::forget(Http2AppConnection* conn) {
  for (auto it = live_.begin(); it != live_.end(); ++it) {
    if (it->second.get() == conn) {
      live_.erase(it);
      return;
    }
  }
}

void Http2AppPool::clientOpened() {
  ++clients_;
  ++idle_generation_;
}

void Http2AppPool::clientClosed() {
  if (clients_ > 0) --clients_;
  if (clients_ > 0) return;
  auto state = state_.lock();
  if (!state || state->draining || state->stopped) {
    closeAll();
    return;
  }
  // Kept for the next client connection a while.
  const uint64_t generation = ++idle_generation_;
  auto timer = std::make_shared<asio::steady_timer>(state->ex, state->options.pool_idle_timeout);
  timer->async_wait([self = weak_from_this(), timer, generation](const net::error_code&) {
    auto pool = self.lock();
    if (pool && pool->clients_ == 0 && pool->idle_generation_ == generation) pool->closeAll();
  });
}

void Http2AppPool::closeAll() {
  live_.clear();
  auto all = std::move(all_);
  all_.clear();
  for (auto& w : all) {
    if (auto c = w.lock()) c->close();
  }
}

size_t Http2AppPool::connectionsForTest() const {
  size_t n = 0;
  for (const auto& w : all_) {
    if (auto c = w.lock(); c && !c->dead()) ++n;
  }
  return n;
}

}  // namespace siphon::agent::steal::http
