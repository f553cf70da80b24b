// Where an HTTP/1.x message ends in a byte stream, found without holding its
// body: a Boost.Beast parser that only counts. `siphon steal` forwards a
// local server's response to the agent byte for byte, as it came, and needs
// to know where the response ends (the stream's end, a keep-alive connection
// free again, a 101's switch to raw bytes); it checks that a request ended
// where the agent's bytes did before it reuses a connection. No I/O.
//
// Call order: put() with the bytes not consumed yet, from the message's
// first byte, until done(). What put() consumes belongs to the message;
// bytes after done() belong to whatever follows it. put() consumes nothing
// until the whole header is in the bytes given (keep them, add more, call
// again). A body that ends with the connection (needEof()) ends with
// putEof(). reset() starts the next message.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon::cli {

template <bool kRequest>
class HttpScanner {
 public:
  HttpScanner();
  ~HttpScanner();
  HttpScanner(const HttpScanner&) = delete;
  HttpScanner& operator=(const HttpScanner&) = delete;

  // How many leading bytes of `bytes` belong to the message (0 until the
  // header is complete). INVALID_ARGUMENT with the parser's reason for bytes
  // that are not HTTP/1.x, or a header above 64 KiB. Bodies have no limit.
  absl::StatusOr<size_t> put(std::string_view bytes);
  // The connection ended: completes a body that runs to the end; else
  // INVALID_ARGUMENT (the message was cut short).
  absl::Status putEof();
  // For the next message. `no_body`: a response to HEAD (its Content-Length
  // describes a body that is not sent).
  void reset(bool no_body = false);

  bool headerDone() const;
  bool done() const;
  // Once headerDone():
  int status() const;               // responses
  std::string_view method() const;  // requests
  bool keepAlive() const;           // HTTP/1.1 without Connection: close, or 1.0 with keep-alive
  bool needEof() const;             // the body runs to the end of the connection
  // Header and body bytes consumed so far.
  uint64_t consumed() const { return consumed_; }

 private:
  class Parser;
  std::unique_ptr<Parser> parser_;
  uint64_t consumed_ = 0;
};

using RequestScanner = HttpScanner<true>;
using ResponseScanner = HttpScanner<false>;

}  // namespace siphon::cli
