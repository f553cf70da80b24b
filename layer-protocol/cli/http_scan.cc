#include "cli/http_scan.h"

#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::cli {

namespace http = boost::beast::http;

// Beast's parser with callbacks that keep the start line and drop the rest:
// the caller has the bytes already and forwards them itself.
template <bool kRequest>
class HttpScanner<kRequest>::Parser : public http::basic_parser<kRequest> {
 public:
  explicit Parser(bool no_body) {
    this->eager(true);
    this->header_limit(64 * 1024);
    // Not boost::none: Boost 1.74 compares a Content-Length with the
    // optional limit as `len > limit`, which is true for none.
    this->body_limit(std::numeric_limits<std::uint64_t>::max());
    if (no_body) this->skip(true);
  }

  int status = 0;
  std::string method;

 private:
  void on_request_impl(http::verb, boost::beast::string_view method_str, boost::beast::string_view,
                       int, boost::beast::error_code&) override {
    method.assign(method_str.data(), method_str.size());
  }
  void on_response_impl(int code, boost::beast::string_view, int,
                        boost::beast::error_code&) override {
    status = code;
  }
  void on_field_impl(http::field, boost::beast::string_view, boost::beast::string_view,
                     boost::beast::error_code&) override {}
  void on_header_impl(boost::beast::error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&,
                         boost::beast::error_code&) override {}
  size_t on_body_impl(boost::beast::string_view body, boost::beast::error_code&) override {
    return body.size();
  }
  void on_chunk_header_impl(std::uint64_t, boost::beast::string_view,
                            boost::beast::error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, boost::beast::string_view body,
                            boost::beast::error_code&) override {
    return body.size();
  }
  void on_finish_impl(boost::beast::error_code&) override {}
};

template <bool kRequest>
HttpScanner<kRequest>::HttpScanner() : parser_(std::make_unique<Parser>(false)) {}

template <bool kRequest>
HttpScanner<kRequest>::~HttpScanner() = default;

template <bool kRequest>
absl::StatusOr<size_t> HttpScanner<kRequest>::put(std::string_view bytes) {
  // Beast asserts on a put() after the end: nothing more belongs to it.
  if (bytes.empty() || parser_->is_done()) return size_t{0};
  boost::beast::error_code ec;
  const size_t n = parser_->put(boost::asio::const_buffer(bytes.data(), bytes.size()), ec);
  if (ec && ec != http::error::need_more) {
    return protoError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("not an HTTP/1.x ", kRequest ? "request" : "response", ": ", ec.message()));
  }
  consumed_ += n;
  return n;
}

template <bool kRequest>
absl::Status HttpScanner<kRequest>::putEof() {
  if (parser_->is_done()) return absl::OkStatus();
  boost::beast::error_code ec;
  parser_->put_eof(ec);
  if (ec) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("the ", kRequest ? "request" : "response",
                                                         " was cut short: ", ec.message()));
  }
  return absl::OkStatus();
}

template <bool kRequest>
void HttpScanner<kRequest>::reset(bool no_body) {
  parser_ = std::make_unique<Parser>(no_body);
  consumed_ = 0;
}

template <bool kRequest>
bool HttpScanner<kRequest>::headerDone() const {
  return parser_->is_header_done();
}
template <bool kRequest>
bool HttpScanner<kRequest>::done() const {
  return parser_->is_done();
}
template <bool kRequest>
int HttpScanner<kRequest>::status() const {
  return parser_->status;
}
template <bool kRequest>
std::string_view HttpScanner<kRequest>::method() const {
  return parser_->method;
}
template <bool kRequest>
bool HttpScanner<kRequest>::keepAlive() const {
  return parser_->is_header_done() && parser_->keep_alive();
}
template <bool kRequest>
bool HttpScanner<kRequest>::needEof() const {
  return parser_->is_header_done() && parser_->need_eof();
}

template class HttpScanner<true>;
template class HttpScanner<false>;

}  // namespace siphon::cli
