// The client side of HTTP/2 filtered steals: an nghttp2 server session on
// the stolen connection. Each stream's request is routed once its head is
// complete; its body and response flow through an Http2Exchange.
//
// Flow control: NGHTTP2_OPT_NO_AUTO_WINDOW_UPDATE, so the client gets
// WINDOW_UPDATE only for bytes the upstream took (Http2Exchange::takeRequest
// -> nghttp2_session_consume). A stream's request buffer is thus bounded by
// its window (kStreamWindow), and one stalled stream holds at most that much
// of the connection window (kConnectionWindow): the others go on. Output is
// produced (nghttp2_session_mem_send) only once the previous write is done,
// and response data only from what the upstream gave (a deferred data
// provider resumed when bytes arrive).
//
// Limits (http2_limits.h): what one client can make the agent hold or do.
//   - a header block (request head, or trailers) is counted as it is
//     decoded, name + value + 32 per field (RFC 7541 4.1), before a field
//     is stored: past HttpOptions::max_head_bytes (--http-max-head, also
//     advertised as SETTINGS_MAX_HEADER_LIST_SIZE, which nghttp2 does not
//     enforce) or kHttp2MaxHeaderFields the stream is reset (RST_STREAM
//     INTERNAL_ERROR, nghttp2's answer to a refused header block, which it
//     then decodes without emitting a field, keeping HPACK in step);
//   - streams: SETTINGS_MAX_CONCURRENT_STREAMS, enforced by nghttp2
//     (REFUSED_STREAM past it);
//   - what a client may repeat, each an EventBudget whose exhaustion ends
//     the connection with GOAWAY(ENHANCE_YOUR_CALM): header blocks refused
//     for size, streams ended before their response (reset by the client,
//     or by nghttp2 for a rule it broke: the "rapid reset" class), PING /
//     SETTINGS / PRIORITY frames, and more than kMaxContinuations
//     CONTINUATION frames after one HEADERS;
//   - a fatal error of nghttp2 (flooded ACK queue, bad preface) ends it
//     with GOAWAY too, rather than a silent close.
// After that GOAWAY nothing more the client sends is read into nghttp2;
// the connection closes once it is sent (kCloseLinger at most).
//
// Over 600 lines: nghttp2's callbacks, the per-stream exchanges and the
// peer bounds (docs/SECURITY.md) share one connection's session state.
#include "agent/steal/http/http2.h"

#include <nghttp2/nghttp2.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <charconv>

#include "agent/common/log.h"
#include "agent/outgoing/address.h"
#include "agent/steal/http/http2_exchange.h"
#include "agent/steal/http/http2_limits.h"
#include "agent/steal/http/http2_wire.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {

namespace asio = net::asio;

namespace {

constexpr int32_t kStreamWindow = 64 * 1024;
constexpr int32_t kConnectionWindow = 2 * 1024 * 1024;
constexpr uint32_t kMaxConcurrentStreams = 128;
// After a GOAWAY and the last stream, how long the client has to close
// before the agent does.
constexpr auto kCloseLinger = std::chrono::seconds(2);

// CONTINUATION frames after one HEADERS (a block of 9 frames of 16 KiB
// is far more than --http-max-head allows anyway). nghttp2's own check
// (mem_recv fails, nothing sent) stays behind ours.
constexpr size_t kMaxContinuations = 8;
constexpr size_t kNghttp2MaxContinuations = 64;
// Header blocks refused for size, before the connection is.
constexpr uint32_t kHeaderRefusalBurst = 8;
constexpr uint32_t kHeaderRefusalsPerSecond = 1;
// Streams that end before their response (rapid reset), before the
// connection does. nghttp2's own limit on RST_STREAM frames (1000, 33/s)
// stays behind it.
constexpr uint32_t kResetBurst = 200;
constexpr uint32_t kResetsPerSecond = 50;
// PING, SETTINGS (each costs an ACK) and PRIORITY frames.
constexpr uint32_t kControlBurst = 200;
constexpr uint32_t kControlPerSecond = 20;

constexpr std::string_view kAgentName = "siphon-agent";

// base64url (RFC 4648 §5), padding optional: HTTP2-Settings.
std::optional<std::string> base64UrlDecode(std::string_view in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') {
      v = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      v = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      v = c - '0' + 52;
    } else if (c == '-' || c == '+') {
      v = 62;
    } else if (c == '_' || c == '/') {
      v = 63;
    } else if (c == '=') {
      break;
    } else {
      return std::nullopt;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

class ServerConnection : public LiveConnection,
                         public Http2ClientSide,
                         public Http2Wire,
                         public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(std::shared_ptr<EngineState> state, UniqueFd fd, ConnectionInfo info)
      : Http2Wire(state->ex, "steal_http2_error", "steal_http2_send_error"),
        state_(std::move(state)),
        info_(std::move(info)),
        idle_timer_(state_->ex),
        linger_timer_(state_->ex),
        header_refusals_(kHeaderRefusalBurst, kHeaderRefusalsPerSecond),
        resets_(kResetBurst, kResetsPerSecond),
        control_(kControlBurst, kControlPerSecond) {
    sock_.assign(fd.release());
  }

  bool init(std::string received, std::optional<H2cUpgrade> upgrade) {
    const auto callbacks = [](nghttp2_session_callbacks* cbs) {
      nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, &onBeginFrame);
      nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &onBeginHeaders);
      nghttp2_session_callbacks_set_on_header_callback(cbs, &onHeader);
      nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &onFrameRecv);
      nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &onDataChunk);
      nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &onStreamClose);
      nghttp2_session_callbacks_set_on_frame_send_callback(cbs, &onFrameSend);
    };
    const auto options = [](nghttp2_option* opt) {
      nghttp2_option_set_max_continuations(opt, kNghttp2MaxContinuations);
    };
    if (!newHttp2Session(&session_, /*server=*/true, callbacks, this, options)) return false;

    if (upgrade) {
      auto settings = base64UrlDecode(upgrade->settings);
      if (!settings) return false;
      auto x = std::make_shared<Http2Exchange>(weak_from_this(), 1, state_->options);
      const bool head = upgrade->head.method == "HEAD";
      if (nghttp2_session_upgrade2(session_, reinterpret_cast<const uint8_t*>(settings->data()),
                                   settings->size(), head ? 1 : 0, x.get()) != 0) {
        return false;
      }
      // RFC 7540 3.2: the 101 goes first; the server preface follows it.
      preamble_ = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
      x->method = upgrade->head.method;
      x->scheme = "http";
      x->path = upgrade->head.target;
      for (const auto& [name, value] : upgrade->head.headers) {
        std::string n = lowerCase(name);
        if (n == "host") {
          if (x->authority.empty()) x->authority = value;
          continue;
        }
        if (isConnectionSpecific(n) || n == "http2-settings") continue;
        x->headers.emplace_back(std::move(n), value);
      }
      x->request_ended = true;
      streams_[1] = x;
      upgrade_head_ = std::move(upgrade->head);
      upgrade_stream_ = x;
    }

    std::array<nghttp2_settings_entry, 3> iv{{
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, static_cast<uint32_t>(kStreamWindow)},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
         static_cast<uint32_t>(std::min<size_t>(state_->options.max_head_bytes, UINT32_MAX))},
    }};
    if (!submitHttp2Settings(session_, iv, kConnectionWindow)) return false;
    received_ = std::move(received);
    return true;
  }

  void start() {
    state_->connections.insert(this);
    pool()->clientOpened();
    pool_counted_ = true;
    auto self = shared_from_this();
    const auto end = [self] { self->close(); };
    net::spawn(state_->ex, holding(self, &ServerConnection::readLoop), "steal_http2_read", end);
    net::spawn(state_->ex, holding(self, &ServerConnection::writeLoop), "steal_http2_write", end);
    net::spawn(state_->ex, holding(self, &ServerConnection::idleLoop), "steal_http2_idle", end);
    if (upgrade_stream_) {
      auto x = std::move(upgrade_stream_);
      route(x, upgrade_head_);
    }
    if (state_->stopped) {
      abort();
    } else if (state_->draining || state_->parking) {
      drain();  // parking: HTTP/2 connections do not move (LiveConnection::park)
    }
    armIdle();
  }

  // LiveConnection.
  void drain() override {
    if (closed_ || draining_) return;
    draining_ = true;
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                          nullptr, 0);
    kick();
  }
  void abort() override { close(); }
  bool busy() const override { return !streams_.empty(); }

  // Http2ClientSide.
  void requestTaken(Http2Exchange& x, size_t n) override {
    if (closed_) return;
    nghttp2_session_consume(session_, x.streamId(), n);
    kick();
  }

  void responseUpdated(Http2Exchange& x) override {
    if (closed_ || x.closed) return;
    if (x.failed) {
      if (!x.head_submitted && x.refused_status != 0) {
        localResponse(x, x.refused_status, x.refused_why);
      } else if (!x.head_submitted) {
        localResponse(x, 502,
                      "the request's session or the application went away before answering");
      } else {
        nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, x.streamId(), x.fail_code);
      }
    } else if (x.status != 0 && !x.head_submitted) {
      submitResponse(x);
    } else if (x.head_submitted && x.data_deferred) {
      x.data_deferred = false;
      nghttp2_session_resume_data(session_, x.streamId());
    }
    kick();
  }

 private:
  std::shared_ptr<Http2AppPool> pool() {
    if (!state_->h2_pool) state_->h2_pool = std::make_shared<Http2AppPool>(state_);
    return state_->h2_pool;
  }

  // Runs `loop`, the connection alive while it does.
  static net::awaitable<void> holding(std::shared_ptr<ServerConnection> self,
                                      net::awaitable<void> (ServerConnection::*loop)()) {
    // A frame variable: GCC 12 may drop a by-value coroutine parameter.
    const auto keep = std::move(self);
    co_await (keep.get()->*loop)();
  }

  static ServerConnection* self(void* user_data) {
    return static_cast<ServerConnection*>(user_data);
  }
  Http2Exchange* exchange(int32_t stream_id) {
    return static_cast<Http2Exchange*>(nghttp2_session_get_stream_user_data(session_, stream_id));
  }

  // --- nghttp2 callbacks (inside mem_recv / mem_send).
  // Every frame's header, before its payload: the frames a client may
  // repeat are counted here.
  static int onBeginFrame(nghttp2_session*, const nghttp2_frame_hd* hd, void* ud) {
    auto* c = self(ud);
    if (c->calm_) return 0;
    const bool ack = (hd->flags & NGHTTP2_FLAG_ACK) != 0;
    switch (hd->type) {
      case NGHTTP2_HEADERS:
        c->continuations_ = 0;
        break;
      case NGHTTP2_CONTINUATION:
        if (++c->continuations_ > kMaxContinuations) c->calm(Http2Limit::kContinuations);
        break;
      case NGHTTP2_PING:
      case NGHTTP2_SETTINGS:
        if (!ack && !c->control_.take(EventBudget::Clock::now())) {
          c->calm(Http2Limit::kControlFlood);
        }
        break;
      case NGHTTP2_PRIORITY:
        if (!c->control_.take(EventBudget::Clock::now())) c->calm(Http2Limit::kControlFlood);
        break;
      default:
        break;
    }
    return 0;
  }

  static int onBeginHeaders(nghttp2_session* session, const nghttp2_frame* frame, void* ud) {
    auto* c = self(ud);
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    // The connection is being closed: no new stream is taken (nghttp2
    // resets it and skips its block).
    if (c->calm_) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST) {
      // Trailers: a block of their own, under the same limits.
      if (Http2Exchange* x = c->exchange(frame->hd.stream_id)) x->header_block.reset();
      return 0;
    }
    auto x = std::make_shared<Http2Exchange>(c->weak_from_this(), frame->hd.stream_id,
                                             c->state_->options);
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, x.get());
    c->streams_[frame->hd.stream_id] = std::move(x);
    c->armIdle();
    return 0;
  }

  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* ud) {
    auto* c = self(ud);
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    Http2Exchange* x = c->exchange(frame->hd.stream_id);
    if (x == nullptr) return 0;
    if (!x->header_block.add(namelen, valuelen)) return c->refuseHeaderBlock(*x);
    c->state_->h2_header_block_high_water =
        std::max(c->state_->h2_header_block_high_water, x->header_block.bytes());
    const std::string_view n = sv(name, namelen);
    const std::string_view v = sv(value, valuelen);
    if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      if (n == ":method") {
        x->method = v;
      } else if (n == ":scheme") {
        x->scheme = v;
      } else if (n == ":authority") {
        x->authority = v;
      } else if (n == ":path") {
        x->path = v;
      } else if (!n.starts_with(':')) {
        x->headers.emplace_back(n, v);
      }
    } else {
      x->request_trailers.emplace_back(n, v);
    }
    return 0;
  }

  static int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* ud) {
    auto* c = self(ud);
    const bool end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
    auto it = c->streams_.find(frame->hd.stream_id);
    if (it == c->streams_.end()) return 0;
    std::shared_ptr<Http2Exchange> x = it->second;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
      x->body_follows = !end;
      x->request_ended = end;
      if (!c->calm_) c->route(x, std::nullopt);
      return 0;
    }
    if (end && !x->request_ended) {
      x->request_ended = true;
      if (x->upstream) x->upstream->requestUpdated();
    }
    return 0;
  }

  static int onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data,
                         size_t len, void* ud) {
    auto* c = self(ud);
    Http2Exchange* x = c->exchange(stream_id);
    if (x == nullptr || x->discard_request || x->closed) {
      nghttp2_session_consume(session, stream_id, len);
      return 0;
    }
    x->request_bytes += len;
    const uint64_t limit = c->state_->options.max_request_body;
    if (limit != 0 && x->request_bytes > limit) {
      nghttp2_session_consume(session, stream_id, len);
      c->requestTooLarge(*x);
      return 0;
    }
    x->request_body.append(sv(data, len));
    if (x->upstream) x->upstream->requestUpdated();
    return 0;
  }

  static int onStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t, void* ud) {
    auto* c = self(ud);
    auto it = c->streams_.find(stream_id);
    if (it == c->streams_.end()) return 0;
    std::shared_ptr<Http2Exchange> x = std::move(it->second);
    c->streams_.erase(it);
    x->closed = true;
    // Ended before its response, not for a failure of ours: the client
    // reset it, or broke a rule nghttp2 reset it for. Each such stream was
    // routed (a session stream opened, or an application stream) for
    // nothing.
    if (!x->response_sent && !x->failed && !c->calm_ &&
        !c->resets_.take(EventBudget::Clock::now())) {
      c->calm(Http2Limit::kResetFlood);
    }
    // Bytes the upstream will never take still hold the connection window.
    if (!x->request_body.empty()) {
      nghttp2_session_consume(session, stream_id, x->request_body.size());
      x->request_body.clear();
    }
    if (auto up = std::move(x->upstream)) up->cancel();
    c->armIdle();
    c->kick();
    return 0;
  }

  static int onFrameSend(nghttp2_session* session, const nghttp2_frame* frame, void* ud) {
    auto* c = self(ud);
    if ((frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) ||
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) {
      return 0;
    }
    Http2Exchange* x = c->exchange(frame->hd.stream_id);
    if (x != nullptr) x->response_sent = true;
    // RFC 9113 8.1: a complete response before the complete request; the
    // rest of the request is not wanted.
    if (x != nullptr && !x->request_ended) {
      x->discard_request = true;
      nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
    }
    return 0;
  }

  static ssize_t readResponse(nghttp2_session* session, int32_t stream_id, uint8_t* buf,
                              size_t length, uint32_t* data_flags, nghttp2_data_source* source,
                              void*) {
    auto* x = static_cast<Http2Exchange*>(source->ptr);
    if (x->failed) return NGHTTP2_ERR_DEFERRED;  // the RST_STREAM is queued
    const size_t n = x->response_body.take(buf, length);
    if (n > 0 && x->upstream) x->upstream->responseTaken(n);
    if (x->response_body.empty() && x->response_ended) {
      endHttp2Data(session, stream_id, x->response_trailers, data_flags);
      return static_cast<ssize_t>(n);
    }
    if (n == 0) {
      x->data_deferred = true;
      return NGHTTP2_ERR_DEFERRED;
    }
    return static_cast<ssize_t>(n);
  }

  // --- Requests.
  // The request head is complete: route it, or answer it here.
  void route(std::shared_ptr<Http2Exchange> x, std::optional<RequestHead> given) {
    if (x->method == "CONNECT" && x->path.empty()) x->path = x->authority;
    RequestHead head;
    if (given) {
      head = std::move(*given);
    } else {
      head.method = x->method;
      head.target = x->path;
      head.version = 20;
      if (!x->authority.empty()) head.headers.emplace_back("host", x->authority);
      for (const auto& h : x->headers) {
        if (h.first == "host" && !x->authority.empty()) continue;
        head.headers.push_back(h);
      }
    }
    const uint64_t limit = state_->options.max_request_body;
    if (limit != 0) {
      for (std::string_view v : head.values("content-length")) {
        uint64_t cl = 0;
        std::from_chars(v.data(), v.data() + v.size(), cl);
        if (cl > limit) {
          requestTooLarge(*x);
          return;
        }
      }
    }
    const uint64_t n = ++requests_;
    std::optional<Route> r = state_->router.route(info_.port, head);
    if (!r) {
      pool()->open(info_.destination, x);
      return;
    }
    auto stolen = state_->router.openStolenRequest(state_->ex, *r, info_, head, n);
    if (!stolen.ok()) {
      log::warn("steal_http2_session_unavailable",
                {{"subscription", r->subscription_id}, {"error", stolen.status().ToString()}});
      localResponse(*x, 502, "the session that stole this request is unavailable");
      return;
    }
    x->upstream = startStolenUpstream(state_->ex, x, std::move(*stolen));
  }

  // A header block past the limits (inside onHeader). What the stream
  // stored goes now; nghttp2 resets the stream and decodes the rest of the
  // block without emitting it.
  int refuseHeaderBlock(Http2Exchange& x) {
    state_->h2Limit(Http2Limit::kHeaderList);
    log::debug("steal_http2_header_block_refused",
               {{"stream", static_cast<int64_t>(x.streamId())},
                {"bytes", static_cast<int64_t>(x.header_block.bytes())},
                {"fields", static_cast<int64_t>(x.header_block.fields())}});
    x.headers = {};
    x.request_trailers = {};
    x.discard_request = true;
    if (!header_refusals_.take(EventBudget::Clock::now())) calm(Http2Limit::kHeaderFlood);
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }

  // The client went past a limit it may not repeat: GOAWAY with `code`
  // (nghttp2 then ignores all it sends), no new stream, and the
  // connection closes once the GOAWAY is sent, or after kCloseLinger for a
  // client that does not read it.
  void calm(Http2Limit limit, uint32_t code = NGHTTP2_ENHANCE_YOUR_CALM) {
    if (calm_ || closed_) return;
    calm_ = true;
    state_->h2Limit(limit);
    static log::Throttle throttle;  // a flood of connections, each refused
    if (const uint64_t n = throttle.hit(http2LimitName(limit)); n != 0) {
      log::info("steal_http2_client_refused", {{"limit", http2LimitName(limit)},
                                               {"source", outgoing::formatAddress(info_.source)},
                                               {"count", n}});
    }
    nghttp2_session_terminate_session(session_, code);
    kick();
    linger_timer_.expires_after(kCloseLinger);
    auto self = shared_from_this();
    linger_timer_.async_wait([self](const net::error_code& ec) {
      if (ec != asio::error::operation_aborted) self->close();
    });
  }

  void requestTooLarge(Http2Exchange& x) {
    x.discard_request = true;
    if (!x.request_body.empty()) {
      nghttp2_session_consume(session_, x.streamId(), x.request_body.size());
      x.request_body.clear();
    }
    if (auto up = std::move(x.upstream)) up->cancel();
    if (!x.head_submitted) {
      localResponse(x, 413, "request body too large");
    } else {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, x.streamId(), NGHTTP2_INTERNAL_ERROR);
      kick();
    }
  }

  // A response made here (502, 413): the upstream is dropped.
  void localResponse(Http2Exchange& x, int status, std::string_view why) {
    if (auto up = std::move(x.upstream)) up->cancel();
    x.failed = false;
    x.status = status;
    x.response_body.clear();
    std::string body = std::string(kAgentName) + ": " + std::string(why) + "\n";
    x.response_headers = {{"content-type", "text/plain; charset=utf-8"},
                          {"content-length", std::to_string(body.size())}};
    x.response_body.append(body);
    x.response_trailers.clear();
    x.response_ended = true;
    submitResponse(x);
    kick();
  }

  void submitResponse(Http2Exchange& x) {
    x.head_submitted = true;
    const std::string status = std::to_string(x.status);
    std::vector<nghttp2_nv> nva;
    nva.push_back(nv(":status", status));
    for (const auto& [name, value] : x.response_headers) nva.push_back(nv(name, value));
    const bool no_body = x.response_ended && x.response_body.empty() && x.response_trailers.empty();
    nghttp2_data_provider prd;
    prd.source.ptr = &x;
    prd.read_callback = &readResponse;
    const int rv = nghttp2_submit_response(session_, x.streamId(), nva.data(), nva.size(),
                                           no_body ? nullptr : &prd);
    if (rv != 0) {
      nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, x.streamId(), NGHTTP2_INTERNAL_ERROR);
    }
  }

  // --- I/O.
  net::awaitable<void> readLoop() {
    try {
      if (!received_.empty()) {
        std::string in = std::move(received_);
        if (!feed(in)) co_return;
      }
      std::vector<char> buf(kHttp2ReadChunk);
      while (!closed_) {
        net::error_code ec;
        const size_t n = co_await sock_.async_read_some(
            asio::buffer(buf), asio::redirect_error(net::use_awaitable, ec));
        if (ec) {
          close();
          co_return;
        }
        // The client's last bytes after our GOAWAY.
        if (finishing_ || calm_) continue;
        if (!feed(std::string_view(buf.data(), n))) co_return;
      }
    } catch (const std::exception& e) {
      log::error("steal_http2_error", {{"error", e.what()}});
      close();
    }
  }

  bool feed(std::string_view in) {
    const ssize_t rv =
        nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(in.data()), in.size());
    if (rv < 0) {
      log::debug("steal_http2_client_error", {{"error", nghttp2_strerror(static_cast<int>(rv))}});
      // Flooding (ACKs it does not read, CONTINUATIONs past nghttp2's own
      // limit) is told apart from other fatal errors.
      const bool flood = rv == NGHTTP2_ERR_FLOODED || rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS;
      calm(flood ? Http2Limit::kControlFlood : Http2Limit::kProtocol,
           flood ? NGHTTP2_ENHANCE_YOUR_CALM : NGHTTP2_PROTOCOL_ERROR);
    }
    kick();
    return true;
  }

  // Http2Wire.
  bool wireClosed() const override { return closed_; }
  void wireClose() override { close(); }
  bool wireIdle(bool session_done) override {
    if (session_done || (draining_ && streams_.empty())) {
      finish();
      return true;
    }
    return false;
  }

  // Everything is sent, nothing is under way: close writing, give the
  // client kCloseLinger to close its end (so our GOAWAY is read, not lost to
  // an RST for unread bytes), then close.
  void finish() {
    if (closed_ || finishing_) return;
    finishing_ = true;
    net::error_code ec;
    sock_.native_non_blocking(true, ec);
    ::shutdown(sock_.native_handle(), SHUT_WR);
    linger_timer_.expires_after(kCloseLinger);
    auto self = shared_from_this();
    linger_timer_.async_wait([self](const net::error_code&) { self->close(); });
  }

  // The connection's idle timer: set while no stream is under way.
  void armIdle() {
    if (closed_) return;
    if (streams_.empty()) {
      idle_timer_.expires_after(state_->options.idle_timeout);
    } else {
      idle_timer_.expires_at(asio::steady_timer::time_point::max());
    }
  }

  net::awaitable<void> idleLoop() {
    while (!closed_) {
      net::error_code ec;
      co_await idle_timer_.async_wait(asio::redirect_error(net::use_awaitable, ec));
      if (closed_) co_return;
      if (!ec && streams_.empty() &&
          idle_timer_.expiry() <= asio::steady_timer::clock_type::now()) {
        drain();
        co_return;
      }
    }
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    state_->connections.erase(this);
    auto streams = std::move(streams_);
    streams_.clear();
    for (auto& [id, x] : streams) {
      x->closed = true;
      if (auto up = std::move(x->upstream)) up->cancel();
    }
    net::error_code ec;
    sock_.close(ec);
    idle_timer_.cancel();
    linger_timer_.cancel();
    kick();
    if (pool_counted_) {
      pool_counted_ = false;
      pool()->clientClosed();
    }
  }

  std::shared_ptr<EngineState> state_;
  ConnectionInfo info_;
  std::map<int32_t, std::shared_ptr<Http2Exchange>> streams_;
  std::string received_;
  RequestHead upgrade_head_;
  std::shared_ptr<Http2Exchange> upgrade_stream_;
  asio::steady_timer idle_timer_;
  asio::steady_timer linger_timer_;
  uint64_t requests_ = 0;
  bool closed_ = false;
  bool draining_ = false;
  bool finishing_ = false;
  bool pool_counted_ = false;
  // Limits (top of the file).
  EventBudget header_refusals_;
  EventBudget resets_;
  EventBudget control_;
  size_t continuations_ = 0;
  bool calm_ = false;  // GOAWAY for a limit: nothing more is read or routed
};

}  // namespace

bool isConnectionSpecific(std::string_view name) {
  return name == "connection" || name == "keep-alive" || name == "proxy-connection" ||
         name == "transfer-encoding" || name == "upgrade" || name == "te";
}

std::string lowerCase(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

void serveHttp2(std::shared_ptr<EngineState> state, UniqueFd client, ConnectionInfo info,
                std::string received, std::optional<H2cUpgrade> upgrade) {
  const std::string source = outgoing::formatAddress(info.source);
  auto conn = std::make_shared<ServerConnection>(state, std::move(client), std::move(info));
  if (!conn->init(std::move(received), std::move(upgrade))) {
    log::warn("steal_http2_setup_failed", {{"source", source}});
    return;  // the socket closes with the connection
  }
  conn->start();
}

}  // namespace siphon::agent::steal::http
