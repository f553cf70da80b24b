// An HTTP/2 stream stolen by a session: the request goes to the session's
// StolenRequest stream as HTTP/1.1, the session's HTTP/1.1 response comes
// back (Boost.Beast's basic_parser, fed by hand so the body is streamed and
// the chunked trailers are seen).
//
// One writer (request head, body, end) and one reader (response) per
// stream. The reader stops reading while kResponseBuffer bytes wait for
// the client; the stream's window then fills and stops the session: only
// this stream waits.
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <limits>

#include "agent/common/log.h"
#include "agent/steal/http/http2_exchange.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal::http {

namespace {

namespace asio = net::asio;
namespace bhttp = boost::beast::http;

constexpr size_t kResponseBuffer = 64 * 1024;
constexpr size_t kWriteChunk = 64 * 1024;

// The request head as HTTP/1.1 (RFC 9113 8.3.1: :authority becomes Host;
// cookies split by HTTP/2 are joined again, 8.2.3). `chunked`: the body is
// sent chunked (the client gave no content-length).
std::string requestHead(const Http2Exchange& x, bool* chunked) {
  std::string out = x.method + " " + x.path + " HTTP/1.1\r\n";
  std::string host = x.authority;
  bool has_length = false;
  std::string cookie;
  for (const auto& [name, value] : x.headers) {
    if (name == "host") {
      if (host.empty()) host = value;
      continue;
    }
    if (isConnectionSpecific(name)) continue;
    if (name == "cookie") {
      if (!cookie.empty()) cookie += "; ";
      cookie += value;
      continue;
    }
    if (name == "content-length") has_length = true;
  }
  out += "Host: " + host + "\r\n";
  for (const auto& [name, value] : x.headers) {
    if (name == "host" || name == "cookie" || isConnectionSpecific(name)) continue;
    out += name + ": " + value + "\r\n";
  }
  if (!cookie.empty()) out += "cookie: " + cookie + "\r\n";
  *chunked = false;
  if (!has_length) {
    if (x.body_follows) {
      out += "Transfer-Encoding: chunked\r\n";
      *chunked = true;
    } else if (x.method == "POST" || x.method == "PUT" || x.method == "PATCH") {
      out += "Content-Length: 0\r\n";
    }
  }
  out += "\r\n";
  return out;
}

// An HTTP/1.1 response, its body delivered as it is parsed.
class StolenResponseParser : public bhttp::basic_parser<false> {
 public:
  int status = 0;
  HeaderList headers;
  HeaderList trailers;
  bool head_done = false;
  std::string body;  // parsed, not yet handed on

 private:
  void on_request_impl(bhttp::verb, boost::string_view, boost::string_view, int,
                       boost::beast::error_code&) override {}
  void on_response_impl(int code, boost::string_view, int, boost::beast::error_code&) override {
    status = code;
  }
  void on_field_impl(bhttp::field, boost::string_view name, boost::string_view value,
                     boost::beast::error_code&) override {
    (head_done ? trailers : headers)
        .emplace_back(lowerCase(std::string_view(name.data(), name.size())),
                      std::string(value.data(), value.size()));
  }
  void on_header_impl(boost::beast::error_code&) override { head_done = true; }
  void on_body_init_impl(const boost::optional<std::uint64_t>&,
                         boost::beast::error_code&) override {}
  size_t on_body_impl(boost::string_view b, boost::beast::error_code&) override {
    body.append(b.data(), b.size());
    return b.size();
  }
  void on_chunk_header_impl(std::uint64_t, boost::string_view, boost::beast::error_code&) override {
  }
  size_t on_chunk_body_impl(std::uint64_t, boost::string_view b,
                            boost::beast::error_code&) override {
    body.append(b.data(), b.size());
    return b.size();
  }
  void on_finish_impl(boost::beast::error_code&) override {}
};

// The HTTP/1.1 response's headers as HTTP/2 ones: lower case, without the
// connection's own (and those the Connection header names).
HeaderList responseHeaders(const HeaderList& in) {
  std::vector<std::string> named;
  for (const auto& [name, value] : in) {
    if (name != "connection") continue;
    size_t pos = 0;
    while (pos <= value.size()) {
      size_t comma = value.find(',', pos);
      if (comma == std::string::npos) comma = value.size();
      std::string token = value.substr(pos, comma - pos);
      const size_t b = token.find_first_not_of(" \t");
      const size_t e = token.find_last_not_of(" \t");
      if (b != std::string::npos) named.push_back(lowerCase(token.substr(b, e - b + 1)));
      pos = comma + 1;
    }
  }
  HeaderList out;
  for (const auto& [name, value] : in) {
    if (isConnectionSpecific(name) || name == "host") continue;
    if (std::find(named.begin(), named.end(), name) != named.end()) continue;
    out.emplace_back(name, value);
  }
  return out;
}

class StolenUpstream : public Http2Upstream, public std::enable_shared_from_this<StolenUpstream> {
 public:
  StolenUpstream(asio::any_io_executor ex, std::shared_ptr<Http2Exchange> x,
                 std::shared_ptr<StolenStream> stolen)
      : x_(std::move(x)),
        sock_(ex, std::move(stolen)),
        write_wake_(ex),
        read_wake_(ex),
        head_request_(x_->method == "HEAD") {}

  void start() {
    auto self = shared_from_this();
    const auto end = [self] { self->fail(); };
    net::spawn(sock_.get_executor(), holding(self, &StolenUpstream::writeLoop),
               "steal_http2_stolen_write", end);
    net::spawn(sock_.get_executor(), holding(self, &StolenUpstream::readLoop),
               "steal_http2_stolen_read", end);
  }

  void requestUpdated() override {
    write_pending_ = true;
    write_wake_.notify();
  }
  void responseTaken(size_t) override {
    read_pending_ = true;
    read_wake_.notify();
  }
  void cancel() override {
    if (!x_) return;
    x_.reset();
    // Before the whole response came: the session's stream is reset, so
    // it stops sending what nobody reads.
    if (response_ended_) {
      sock_.close();
    } else {
      sock_.abort();
    }
    requestUpdated();
    responseTaken(0);
  }

 private:
  // Runs `loop`, the upstream alive while it does.
  static net::awaitable<void> holding(std::shared_ptr<StolenUpstream> self,
                                      net::awaitable<void> (StolenUpstream::*loop)()) {
    // A frame variable: GCC 12 may drop a by-value coroutine parameter.
    const auto keep = std::move(self);
    co_await (keep.get()->*loop)();
  }

  net::awaitable<void> writeLoop() {
    try {
      if (!x_) co_return;  // cancelled before this coroutine ran
      bool chunked = false;
      std::string out = requestHead(*x_, &chunked);
      bool ended = false;
      while (x_ && !ended) {
        write_pending_ = false;
        size_t taken = 0;
        if (!x_->request_body.empty()) {
          std::string_view chunk = x_->request_body.view().substr(0, kWriteChunk);
          taken = chunk.size();
          if (chunked) {
            char size[24];
            out.append(size, static_cast<size_t>(
                                 std::snprintf(size, sizeof size, "%zx\r\n", chunk.size())));
            out.append(chunk);
            out += "\r\n";
          } else {
            out.append(chunk);
          }
        }
        if (x_->request_ended && x_->request_body.size() == taken) {
          ended = true;
          if (chunked) {
            out += "0\r\n";
            for (const auto& [name, value] : x_->request_trailers) {
              if (isConnectionSpecific(name)) continue;
              out += name + ": " + value + "\r\n";
            }
            out += "\r\n";
          }
        }
        if (out.empty()) {
          if (!write_pending_) co_await write_wake_.wait();
          continue;
        }
        net::error_code ec;
        co_await asio::async_write(sock_, asio::buffer(out),
                                   asio::redirect_error(net::use_awaitable, ec));
        out.clear();
        if (!x_) co_return;
        if (ec) {
          // The session stopped reading (it may have answered already):
          // the rest of the request is dropped, the response still read.
          x_->discard_request = true;
          x_->takeRequest(x_->request_body.size());
          co_return;
        }
        if (taken > 0) x_->takeRequest(taken);
      }
      if (x_) sock_.shutdownSend();
    } catch (const std::exception& e) {
      log::error("steal_http2_stolen_error", {{"error", e.what()}});
      fail();
    }
  }

  net::awaitable<void> readLoop() {
    try {
      if (!x_) co_return;
      std::string in;
      std::vector<char> buf(kHttp2ReadChunk);
      auto parser = std::make_unique<StolenResponseParser>();
      resetParser(*parser);
      bool eof = false;
      while (x_) {
        // Parse what is buffered.
        while (!in.empty() && !parser->is_done()) {
          boost::beast::error_code ec;
          const size_t n = parser->put(asio::buffer(in), ec);
          in.erase(0, n);
          if (ec == bhttp::error::need_more) break;
          if (ec) {
            log::debug("steal_http2_bad_response", {{"error", ec.message()}});
            fail();
            co_return;
          }
          if (n == 0) break;
        }
        if (parser->head_done && !head_sent_) {
          if (parser->status == 101) {
            log::debug("steal_http2_bad_response", {{"error", "101 on an HTTP/2 stream"}});
            fail();
            co_return;
          }
          if (parser->status >= 100 && parser->status < 200) {
            // Interim response: skipped, the final one follows.
            parser = std::make_unique<StolenResponseParser>();
            resetParser(*parser);
            continue;
          }
          head_sent_ = true;
          x_->respondHead(parser->status, responseHeaders(parser->headers),
                          parser->is_done() && parser->body.empty() && parser->trailers.empty());
          if (!x_) co_return;
        }
        if (!parser->body.empty()) {
          const bool ok = x_->respondData(parser->body);
          parser->body.clear();
          if (!ok || !x_) co_return;
        }
        if (parser->is_done()) {
          response_ended_ = true;
          x_->respondEnd(responseHeaders(parser->trailers));
          co_return;
        }
        if (eof) {
          boost::beast::error_code ec;
          if (parser->got_some()) parser->put_eof(ec);
          if (parser->got_some() && !ec && parser->is_done()) continue;  // ended by EOF
          log::debug("steal_http2_session_eof", {{"stream", static_cast<int64_t>(x_->streamId())},
                                                 {"response_begun", parser->got_some()},
                                                 {"head", parser->head_done}});
          fail();
          co_return;
        }
        if (!x_) co_return;
        if (x_->response_body.size() >= kResponseBuffer) {
          read_pending_ = false;
          co_await read_wake_.wait();
          continue;
        }
        net::error_code ec;
        const size_t n = co_await sock_.async_read_some(
            asio::buffer(buf), asio::redirect_error(net::use_awaitable, ec));
        if (!x_) co_return;
        if (ec) {
          eof = true;
          continue;
        }
        in.append(buf.data(), n);
      }
    } catch (const std::exception& e) {
      log::error("steal_http2_stolen_error", {{"error", e.what()}});
      fail();
    }
  }

  void resetParser(StolenResponseParser& p) {
    p.header_limit(
        static_cast<std::uint32_t>(std::min<size_t>(x_->options().max_head_bytes, UINT32_MAX)));
    // Not boost::none: Beast 1.74 compares a content length against the
    // optional itself, and any length is then "over" an unset limit.
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    p.eager(true);
    if (head_request_) p.skip(true);
  }

  void fail() {
    if (!x_) return;
    auto x = x_;
    x->respondFailure();
    cancel();
  }

  std::shared_ptr<Http2Exchange> x_;
  ByteStream sock_;
  net::Signal write_wake_;
  bool write_pending_ = false;
  net::Signal read_wake_;
  bool read_pending_ = false;
  bool head_request_;
  bool head_sent_ = false;
  bool response_ended_ = false;
};

}  // namespace

std::shared_ptr<Http2Upstream> startStolenUpstream(net::asio::any_io_executor ex,
                                                   std::shared_ptr<Http2Exchange> x,
                                                   std::shared_ptr<StolenStream> stolen) {
  auto up = std::make_shared<StolenUpstream>(std::move(ex), std::move(x), std::move(stolen));
  up->start();
  return up;
}

}  // namespace siphon::agent::steal::http
