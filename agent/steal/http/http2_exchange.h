// One HTTP/2 client stream (a request and its response) between the client
// connection (http2.cc) and where the request was routed: the session that
// stole it (http2_stolen.cc) or the application (http2_pool.cc).
//
// The exchange holds what is in transit, bounded both ways:
//   request body   received from the client, not yet taken by the upstream.
//                  The client is credited (WINDOW_UPDATE) only for bytes
//                  the upstream took (takeRequest), so at most one stream
//                  window waits here.
//   response body  given by the upstream, not yet sent to the client. The
//                  upstream reads more only once the client side took bytes
//                  (Http2Upstream::responseTaken): the application's stream
//                  window, or a fixed cap for a session, bounds it.
//
// Call order: the client side creates it, fills the request head, sets
// `upstream`; the upstream calls respondHead() once (not for 1xx), then
// respondData()*, then respondEnd() or respondFailure() (any time, once).
// The client side calls Http2Upstream::cancel() when the stream is gone.
//
// Threads: the event loop only.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/steal/http/byte_stream.h"
#include "agent/steal/http/http2_limits.h"
#include "agent/steal/http/router.h"

namespace siphon::agent::steal::http {

// Bytes per read from a socket of the HTTP/2 paths (client, application,
// a stolen request's session).
inline constexpr size_t kHttp2ReadChunk = 16 * 1024;

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// Bytes waiting to be passed on, taken from the front.
class ByteQueue {
 public:
  size_t size() const { return data_.size() - head_; }
  bool empty() const { return size() == 0; }
  std::string_view view() const { return std::string_view(data_).substr(head_); }
  void append(std::string_view bytes) { data_.append(bytes); }
  void consume(size_t n) {
    head_ += n;
    if (head_ >= data_.size()) {
      data_.clear();
      head_ = 0;
    } else if (head_ > 64 * 1024 && head_ > data_.size() / 2) {
      data_.erase(0, head_);
      head_ = 0;
    }
  }
  // Copies up to `max` bytes to `out` and consumes them.
  size_t take(uint8_t* out, size_t max) {
    const size_t n = std::min(max, size());
    std::memcpy(out, data_.data() + head_, n);
    consume(n);
    return n;
  }
  void clear() {
    data_.clear();
    head_ = 0;
  }

 private:
  std::string data_;
  size_t head_ = 0;
};

class Http2Exchange;

// Where a request went (the session or the application).
class Http2Upstream {
 public:
  virtual ~Http2Upstream() = default;
  // More request body, the trailers or the request's end are in the
  // exchange.
  virtual void requestUpdated() = 0;
  // The client side sent `n` bytes of the response body: room for more.
  virtual void responseTaken(size_t n) = 0;
  // The client stream is gone (done, reset, or the connection closed):
  // release everything; no call on the exchange after this.
  virtual void cancel() = 0;
};

// The client connection's side of an exchange (implemented by http2.cc).
class Http2ClientSide {
 public:
  virtual ~Http2ClientSide() = default;
  // The upstream took `n` request body bytes: credit the client.
  virtual void requestTaken(Http2Exchange& x, size_t n) = 0;
  // The response changed (head, data, end or failure): submit or resume it.
  virtual void responseUpdated(Http2Exchange& x) = 0;
};

class Http2Exchange {
 public:
  Http2Exchange(std::weak_ptr<Http2ClientSide> client, int32_t stream_id, HttpOptions options)
      : header_block(options.max_head_bytes, kHttp2MaxHeaderFields),
        client_(std::move(client)),
        stream_id_(stream_id),
        options_(options) {}

  int32_t streamId() const { return stream_id_; }
  const HttpOptions& options() const { return options_; }

  // --- The request (filled by the client side).
  std::string method;
  std::string scheme;
  std::string authority;
  std::string path;
  HeaderList headers;  // regular headers, lower case, in order
  // The request has a body to come (its HEADERS did not end the stream).
  bool body_follows = false;
  ByteQueue request_body;  // received, not yet taken by the upstream
  uint64_t request_bytes = 0;
  HeaderList request_trailers;
  bool request_ended = false;
  // The header block being decoded (the head, then the trailers): checked
  // before each field is stored.
  HeaderBlockBudget header_block;

  // The upstream took `n` bytes from request_body.
  void takeRequest(size_t n) {
    request_body.consume(n);
    creditRequest(n);
  }
  // The upstream took `n` bytes already removed from request_body.
  void creditRequest(size_t n) {
    if (auto c = client_.lock()) c->requestTaken(*this, n);
  }

  // --- The response (filled by the upstream through the calls below).
  int status = 0;  // 0: no head yet
  HeaderList response_headers;
  ByteQueue response_body;  // not yet sent to the client
  uint64_t response_bytes = 0;
  HeaderList response_trailers;
  bool response_ended = false;
  bool failed = false;
  // HTTP/2 error code for a failure after the head was sent.
  uint32_t fail_code = 2;  // INTERNAL_ERROR
  // respondRefused(): the status and body of the failure (0: 502).
  int refused_status = 0;
  std::string refused_why;

  // `ended`: the response has no body and no trailers (HEADERS ends the
  // stream: no empty DATA frame after a 204 or a HEAD response).
  void respondHead(int code, HeaderList h, bool ended = false) {
    if (failed || status != 0) return;
    status = code;
    response_headers = std::move(h);
    response_ended = ended;
    notify();
  }
  // False (and the exchange failed) when max_response_body is exceeded.
  bool respondData(std::string_view data) {
    if (failed || response_ended) return false;
    response_bytes += data.size();
    if (options_.max_response_body != 0 && response_bytes > options_.max_response_body) {
      respondFailure();
      return false;
    }
    response_body.append(data);
    notify();
    return true;
  }
  void respondEnd(HeaderList trailers) {
    if (failed || response_ended) return;
    response_trailers = std::move(trailers);
    response_ended = true;
    notify();
  }
  // 502 when the head was not sent yet, else RST_STREAM(code).
  void respondFailure(uint32_t code = 2) {
    if (failed || response_ended) return;
    failed = true;
    fail_code = code;
    notify();
  }
  // The request is not taken (the upstream has too much waiting): answered
  // `status` with `why` as the body, before any head.
  void respondRefused(int code, std::string why) {
    if (failed || response_ended || status != 0) return;
    refused_status = code;
    refused_why = std::move(why);
    respondFailure();
  }

  // --- The client side's state.
  std::shared_ptr<Http2Upstream> upstream;
  bool head_submitted = false;
  bool data_deferred = false;
  bool response_sent = false;    // the response's END_STREAM went out
  bool closed = false;           // the client stream is gone
  bool discard_request = false;  // further request bytes are dropped (credited at once)

 private:
  void notify() {
    if (auto c = client_.lock()) c->responseUpdated(*this);
  }

  std::weak_ptr<Http2ClientSide> client_;
  int32_t stream_id_;
  HttpOptions options_;
};

// Creates the upstream for a stolen request: `stolen` is the session's
// StolenRequest stream. Writes the request as HTTP/1.1, reads the HTTP/1.1
// response (http2_stolen.cc).
std::shared_ptr<Http2Upstream> startStolenUpstream(net::asio::any_io_executor ex,
                                                   std::shared_ptr<Http2Exchange> x,
                                                   std::shared_ptr<StolenStream> stolen);

// HTTP/1.1 header names that are about one connection, never passed on
// between HTTP/1.1 and HTTP/2 (RFC 9113 8.2.2); `name` in lower case.
bool isConnectionSpecific(std::string_view name);

std::string lowerCase(std::string_view s);

}  // namespace siphon::agent::steal::http
