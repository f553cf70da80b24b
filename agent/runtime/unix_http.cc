#include "agent/runtime/unix_http.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/common/unique_fd.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using boost::system::error_code;
using Socket = asio::local::stream_protocol::socket;

std::string seconds(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return absl::StrCat(d.count() / 1000, "s");
  return absl::StrCat(d.count(), "ms");
}

// The connect() errors a runtime socket gives, as resolver.h ranks them.
absl::Status connectError(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::UnavailableError("no such socket");
    case ECONNREFUSED:
      // Also a regular file or a stale socket with nobody behind it.
      return absl::UnavailableError("connection refused (is the runtime running?)");
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          "permission denied (the agent needs root, or write access to the socket)");
    default:
      return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(err)));
  }
}

absl::Status checkPathLength(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path is longer than ", sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  if (path.empty()) return absl::InvalidArgumentError("empty socket path");
  return absl::OkStatus();
}

}  // namespace

absl::Status probeUnixSocket(const std::string& socket_path) {
  RETURN_IF_ERROR(checkPathLength(socket_path));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return lastErrnoStatus("socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  // A unix connect never waits for the peer's accept(): it succeeds once the
  // listener's backlog has room, or fails at once.
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return connectError(errno);
  return absl::OkStatus();
}

absl::StatusOr<HttpAnswer> unixHttpGet(const std::string& socket_path, const std::string& target,
                                       const std::string& host, std::chrono::milliseconds timeout,
                                       size_t max_body) {
  RETURN_IF_ERROR(checkPathLength(socket_path));
  asio::io_context io(1);
  Socket socket(io);
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, host);
  request.set(http::field::user_agent, "siphon-agent");
  request.set(http::field::accept, "application/json");
  request.set(http::field::connection, "close");
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(max_body);

  // One chain of plain callbacks; io.run_for() bounds it in time. `stage`
  // is where the chain is, or where it failed.
  enum class Stage { kConnect, kWrite, kRead };
  Stage stage = Stage::kConnect;
  bool done = false;
  error_code failure;
  auto finish = [&](const error_code& ec) {
    failure = ec;
    done = true;
  };
  auto on_body = [&](const error_code& ec, size_t) { finish(ec); };
  auto on_header = [&](const error_code& ec, size_t) {
    if (ec) return finish(ec);
    // Beast 1.74's eager parse (what async_read does) drops the body_limit
    // error of a too large Content-Length: check it here, between header and
    // body. Chunked bodies run into the limit by themselves.
    if (parser.content_length() && *parser.content_length() > max_body) {
      return finish(http::error::body_limit);
    }
    http::async_read(socket, buffer, parser, on_body);
  };
  auto on_written = [&](const error_code& ec, size_t) {
    if (ec) return finish(ec);
    stage = Stage::kRead;
    http::async_read_header(socket, buffer, parser, on_header);
  };
  auto on_connected = [&](const error_code& ec) {
    if (ec) return finish(ec);
    stage = Stage::kWrite;
    http::async_write(socket, request, on_written);
  };
  socket.async_connect(asio::local::stream_protocol::endpoint(socket_path), on_connected);
  io.run_for(timeout);
  if (!done) {
    error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();  // the aborted handlers, which only record the abort
    const char* where = stage == Stage::kConnect ? "connecting"
                        : stage == Stage::kWrite ? "sending the request"
                                                 : "waiting for the answer";
    return absl::UnavailableError(
        absl::StrCat("no answer within ", seconds(timeout), " (", where, ")"));
  }
  if (failure) {
    if (stage == Stage::kConnect) {
      if (failure.category() == boost::system::system_category()) {
        return connectError(failure.value());
      }
      return absl::UnavailableError(absl::StrCat("connect: ", failure.message()));
    }
    if (failure == http::error::body_limit) {
      return absl::InternalError(absl::StrCat("answer larger than ", max_body, " bytes"));
    }
    if (failure == http::error::end_of_stream || failure == http::error::partial_message ||
        failure == asio::error::eof || failure == asio::error::connection_reset ||
        failure == asio::error::broken_pipe) {
      return absl::UnavailableError(absl::StrCat(
          "the runtime closed the connection before a complete answer (", failure.message(), ")"));
    }
    if (failure.category() == http::make_error_code(http::error::bad_version).category()) {
      return absl::InternalError(absl::StrCat("malformed HTTP answer: ", failure.message()));
    }
    return absl::UnavailableError(
        absl::StrCat(stage == Stage::kWrite ? "sending the request: " : "reading the answer: ",
                     failure.message()));
  }
  http::response<http::string_body> response = parser.release();
  HttpAnswer answer;
  answer.status = response.result_int();
  answer.reason = std::string(response.reason());
  answer.content_type = std::string(response[http::field::content_type]);
  answer.body = std::move(response.body());
  return answer;
}

}  // namespace siphon::agent::runtime
