// Plain HTTP/1.1 GET over a unix stream socket (Docker Engine, CRI-O), and a
// connect probe for the gRPC client. Synchronous: the work runs on a private
// io_context for at most the timeout, so a runtime that accepts and never
// answers costs the agent that long and no more.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace siphon::agent::runtime {

struct HttpAnswer {
  unsigned status = 0;  // 200, 404...
  std::string reason;   // "OK"
  std::string content_type;
  std::string body;
};

// Bigger than any inspect answer (a few KiB to a few hundred KiB).
inline constexpr size_t kMaxHttpBody = size_t{8} << 20;

// GET `target` ("/containers/abc/json") from the server on `socket_path`,
// with "Host: <host>" (Go's HTTP server refuses HTTP/1.1 requests without
// one) and "Connection: close". Chunked and Content-Length bodies both work.
// Errors (messages without the runtime's name; callers prefix it):
//   Unavailable       "no such socket", "connection refused", "no answer
//                     within 10s", or the connection dropped mid-answer.
//   PermissionDenied  "permission denied" connecting to the socket.
//   InvalidArgument   a socket path longer than a sockaddr_un holds.
//   Internal          a malformed HTTP answer, or a body over max_body.
absl::StatusOr<HttpAnswer> unixHttpGet(const std::string& socket_path, const std::string& target,
                                       const std::string& host, std::chrono::milliseconds timeout,
                                       size_t max_body = kMaxHttpBody);

// Connects to `socket_path` and hangs up: tells "no such socket" and
// "permission denied" apart before a client library (gRPC) would turn both
// into one generic "unavailable". Errors as unixHttpGet's connect errors.
absl::Status probeUnixSocket(const std::string& socket_path);

}  // namespace siphon::agent::runtime
