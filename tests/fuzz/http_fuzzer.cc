// libFuzzer target: the first bytes of a connection to a port with filtered
// steals, as the HTTP engine handles them before any socket is involved:
//
//   - protocol detection (detectProtocol) over the bytes as they arrive:
//     once it decides, more bytes never change the answer;
//   - the HTTP/1 head as http1.cc reads it: a Boost.Beast request parser
//     with the engine's head and body limits, fed in pieces, the head turned
//     into a RequestHead, its accessors, and the steal filters matched
//     against it; then the body read into fixed pieces as forwardBody does
//     (chunked framing, trailers).
//
// The first byte picks the limits and the size of the pieces; the rest is
// what the client sent.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/steal/http/detect.h"
#include "agent/steal/http/filter.h"
#include "agent/steal/http/request_head.h"
#include "google/protobuf/stubs/logging.h"
#include "siphon/v1/services.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace siphon::agent::steal::http {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using fuzz::check;

using RequestParser = bhttp::request_parser<bhttp::buffer_body>;

std::string str(beast::string_view s) { return std::string(s.data(), s.size()); }

const std::vector<std::shared_ptr<const RequestFilter>>& filters() {
  static const std::vector<std::shared_ptr<const RequestFilter>> all = [] {
    std::vector<std::shared_ptr<const RequestFilter>> out;
    v1::HttpFilter a;
    auto* h = a.add_headers();
    h->set_name("x-user");
    h->set_value_regex("^(alice|bob)$");
    a.set_path_regex("^/api/");
    v1::HttpFilter b;
    b.set_method("POST");
    b.set_path_regex("upload\\?id=[0-9]+$");
    b.set_match_any(true);
    auto* h2 = b.add_headers();
    h2->set_name("Host");
    h2->set_value_regex(".*\\.internal");
    for (const v1::HttpFilter& f : {a, b}) {
      auto c = RequestFilter::compile(f);
      check(c.ok(), "the fixed filters compile");
      out.push_back(*c);
    }
    return out;
  }();
  return all;
}

void fuzzDetect(std::string_view bytes, size_t max_line) {
  // Detection runs on everything read so far, after each read: the pieces
  // are prefixes. A decision must not change with more bytes.
  Protocol decided = Protocol::kNeedMore;
  size_t step = bytes.size() / 7 + 1;
  for (size_t n = 0;; n = std::min(n + step, bytes.size())) {
    Protocol p = detectProtocol(bytes.substr(0, n), max_line);
    if (decided != Protocol::kNeedMore) check(p == decided, "detection never changes its mind");
    decided = p;
    if (n == bytes.size()) break;
  }
  if (decided == Protocol::kHttp2) {
    check(bytes.substr(0, kHttp2Preface.size()) == kHttp2Preface, "HTTP/2 only with the preface");
  }
}

void useHead(const RequestHead& head) {
  std::string_view path = head.path();
  std::string_view pq = head.pathAndQuery();
  check(pq.substr(0, path.size()) == path, "the path starts the path and query");
  check(path.find('?') == std::string_view::npos, "the path stops at the query");
  (void)head.values("host");
  (void)head.values("x-user");
  (void)head.protocol();
  for (const auto& f : filters()) (void)f->matches(head);
}

void fuzzHttp1(std::string_view bytes, size_t head_limit, uint64_t body_limit, size_t piece) {
  RequestParser parser;
  parser.header_limit(static_cast<uint32_t>(head_limit));
  parser.body_limit(body_limit);
  beast::error_code ec;
  // The head, from a buffer that grows by `piece` bytes at a time (as
  // reads fill the connection's buffer), until the parser has the header.
  size_t used = 0;
  size_t have = 0;
  while (!parser.is_header_done()) {
    if (have == bytes.size()) return;  // the client stops: partial_message
    have = std::min(bytes.size(), have + piece);
    std::string window(bytes.substr(used, have - used));  // exactly sized for ASan
    size_t n = parser.put(boost::asio::buffer(window), ec);
    if (ec == bhttp::error::need_more) {
      ec = {};
      used += n;
      continue;
    }
    if (ec) return;  // 400/431/413 in the engine
    used += n;
  }
  const auto& req = parser.get();
  RequestHead head;
  head.method = str(req.method_string());
  head.target = str(req.target());
  head.version = req.version() >= 11 ? 11 : 10;
  size_t fields = 0;
  for (const auto& f : req) {
    head.headers.emplace_back(str(f.name_string()), str(f.value()));
    ++fields;
  }
  check(!head.method.empty(), "a parsed request has a method");
  useHead(head);

  // The body, in pieces of a fixed buffer (buffer_body), as forwardBody.
  std::vector<char> body_buf(piece);
  uint64_t body_bytes = 0;
  std::string_view rest = bytes.substr(used);
  size_t at = 0;
  size_t take = piece;  // grows while the parser needs more than a piece at once
  while (!parser.is_done()) {
    parser.get().body().data = body_buf.data();
    parser.get().body().size = body_buf.size();
    if (at == rest.size()) {
      parser.put_eof(ec);  // the client closed
      break;
    }
    std::string window(rest.substr(at, take));
    const size_t n = parser.put(boost::asio::buffer(window), ec);
    at += n;
    body_bytes += body_buf.size() - parser.get().body().size;
    if (ec == bhttp::error::need_buffer) {
      ec = {};
      continue;
    }
    if (ec == bhttp::error::need_more) {
      ec = {};
      if (n > 0) {
        take = piece;
      } else if (at + take >= rest.size()) {
        parser.put_eof(ec);
        break;
      } else {
        take += piece;
      }
      continue;
    }
    if (ec) break;
  }
  if (body_limit != UINT64_MAX) check(body_bytes <= body_limit, "the body limit holds");
  if (parser.is_done()) {
    size_t all = 0;
    for (auto it = parser.get().begin(); it != parser.get().end(); ++it) ++all;
    check(all >= fields, "trailers only add fields");
  }
}

std::vector<std::string> seeds() {
  return {
      std::string("\x00", 1) +
          "GET /api/v1/users?id=7 HTTP/1.1\r\nHost: svc\r\nX-User: alice\r\n\r\n",
      std::string("\x01", 1) +
          "POST http://db.internal/upload?id=42 HTTP/1.1\r\nHost: db.internal\r\n"
          "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
      std::string("\x02", 1) +
          "PUT /x HTTP/1.0\r\nContent-Length: 5\r\n\r\nabcdeGET / HTTP/1.1\r\n\r\n",
      std::string("\x03", 1) + std::string(kHttp2Preface) + std::string("\0\0\0\4\0\0\0\0\0", 9),
      std::string("\x04", 1) +
          "GET / HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
          "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
      std::string("\x05", 1) + "get key\r\n",
      std::string("\x06", 1) + "*3\r\n$3\r\nSET\r\n",
      std::string("\x07", 1) + "GET /a HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
  };
}

}  // namespace
}  // namespace siphon::agent::steal::http

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  siphon::fuzz::writeSeedsIfAsked(siphon::agent::steal::http::seeds());
  (void)siphon::agent::steal::http::filters();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace siphon::agent::steal::http;
  siphon::fuzz::Input in(std::string_view(reinterpret_cast<const char*>(data), size));
  const uint8_t knobs = in.byte();
  // Small limits and pieces too, so short inputs reach them.
  const size_t head_limit = (knobs & 1) ? 64 : 64 * 1024;
  const uint64_t body_limit = (knobs & 2) ? 16 : UINT64_MAX;
  const size_t piece = (knobs & 4) ? 61 : 4096;
  const size_t max_line = (knobs & 8) ? 16 : 64 * 1024;
  fuzzDetect(in.rest(), max_line);
  fuzzHttp1(in.rest(), head_limit, body_limit, piece);
  return 0;
}
