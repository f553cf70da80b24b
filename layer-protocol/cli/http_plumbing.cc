#include "cli/http_plumbing.h"

#include <sys/socket.h>

#include <cerrno>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cli/bridge.h"
#include "cli/format.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {

namespace asio = net::asio;

namespace {

// Request bytes kept for a retry on a new connection. A pooled connection
// that the server closed while idle fails on the first write or read, long
// before this much went out; a request larger than this is not retried.
constexpr size_t kReplayMax = 1 << 20;

}  // namespace

std::string badGatewayResponse(std::string_view to, std::string_view why) {
  const std::string body =
      absl::StrCat("siphon steal: the local server ", asv(to), " did not answer: ", asv(why), "\n");
  return absl::StrCat("HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n",
                      "Content-Length: ", body.size(), "\r\n\r\n", body);
}

// ------------------------------------------------------------ LocalPool

LocalPool::LocalPool(asio::any_io_executor ex, std::string to,
                     std::vector<net::tcp::endpoint> endpoints,
                     std::chrono::milliseconds connect_timeout)
    : LocalPool(ex, to, dialEndpoints(std::move(endpoints), connect_timeout, to)) {}

LocalPool::LocalPool(asio::any_io_executor ex, std::string to, LocalDialer dial)
    : ex_(std::move(ex)), to_(std::move(to)), dial_(std::move(dial)) {}

std::optional<net::tcp::socket> LocalPool::takeIdle() {
  while (!idle_.empty()) {
    net::tcp::socket s = std::move(idle_.back());
    idle_.pop_back();
    // A server closes idle keep-alive connections on its own timeout; its
    // FIN (or RST) waits unread on ours. Between responses it sends
    // nothing else, so anything readable means the connection is done.
    char c;
    const ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return s;
    net::error_code ignored;
    s.close(ignored);
  }
  return std::nullopt;
}

net::awaitable<absl::StatusOr<net::tcp::socket>> LocalPool::connect() {
  net::tcp::socket s(ex_);
  absl::Status connected = co_await dial_(s);
  if (!connected.ok()) co_return connected;
  co_return std::move(s);
}

void LocalPool::giveBack(net::tcp::socket s) {
  if (idle_.size() >= kMaxIdle) {
    net::error_code ignored;
    s.close(ignored);
    return;
  }
  idle_.push_back(std::move(s));
}

void LocalPool::closeAll() {
  for (auto& s : idle_) {
    net::error_code ignored;
    s.close(ignored);
  }
  idle_.clear();
}

// ------------------------------------------------------------ Exchange

Exchange::Exchange(asio::any_io_executor ex, client::Connection stream,
                   std::shared_ptr<LocalPool> pool, RequestEvent event, bool head, Done done)
    : stream_(std::move(stream)),
      pool_(std::move(pool)),
      event_(std::move(event)),
      head_(head),
      done_(std::move(done)),
      local_(std::move(ex)),
      pump_changed_(local_.get_executor()),
      switched_(local_.get_executor()) {}

void Exchange::start() {
  net::spawn(local_.get_executor(), run(shared_from_this()), "http_exchange",
             [self = shared_from_this()] { self->end("the exchange failed inside the client"); });
}

void Exchange::end(std::string_view why) {
  if (ended_) return;
  ended_ = true;
  noteError(std::string(why));
  stream_.reset(client::ErrorCode::kCancelled, why);
  abortLocal();
}

void Exchange::noteError(std::string why) {
  if (event_.error.empty()) event_.error = std::move(why);
}

void Exchange::abortLocal() { abortSocket(local_); }

void Exchange::streamFailed(const absl::Status& s) {
  if (stream_failed_) return;
  stream_failed_ = true;
  if (client::errorCode(s) == client::ErrorCode::kAgentLost) {
    noteError("the session with the agent is lost");
  } else {
    noteError(absl::StrCat("reset by the agent: ", statusText(s)));
  }
  if (on_stream_error) on_stream_error(s);
  abortLocal();
}

void Exchange::halfCloseStream() {
  absl::Status s = stream_.halfClose();
  if (!s.ok() && on_stream_error) on_stream_error(s);
}

void Exchange::resetStream(std::string why) {
  noteError(why);
  stream_failed_ = true;
  stream_.reset(client::ErrorCode::kCancelled, why);
  abortLocal();
}

net::awaitable<bool> Exchange::toStream(std::string bytes_in) {
  std::string bytes = std::move(bytes_in);
  const size_t n = bytes.size();
  absl::Status s = co_await stream_.write(std::move(bytes));
  if (!s.ok()) {
    streamFailed(s);
    co_return false;
  }
  event_.out += n;
  co_return true;
}

void Exchange::scanRequest(std::string_view bytes) {
  if (request_bad_) return;
  if (!request_pending_.empty()) {
    request_pending_.append(bytes.data(), bytes.size());
    bytes = request_pending_;
  }
  size_t used = 0;
  while (used < bytes.size()) {
    if (request_.done()) {
      // More than one request, or raw bytes after an upgrade.
      request_bad_ = true;
      break;
    }
    auto n = request_.put(bytes.substr(used));
    if (!n.ok()) {
      request_bad_ = true;
      break;
    }
    if (*n == 0) break;
    used += *n;
  }
  if (request_bad_) {
    request_pending_.clear();
    request_whole_ = false;
    return;
  }
  std::string rest(bytes.substr(used));
  request_pending_ = std::move(rest);
  request_whole_ = request_.done() && request_pending_.empty();
}

// Runs the exchange; it holds the Exchange alive until the end.
net::awaitable<void> Exchange::run(std::shared_ptr<Exchange> self_in) {
  const std::shared_ptr<Exchange> self = std::move(self_in);
  Exchange& x = *self;

  std::optional<net::tcp::socket> idle = x.pool_->takeIdle();
  if (idle) {
    x.local_ = std::move(*idle);
    x.reused_ = true;
    x.replayable_ = true;
  } else {
    auto fresh = co_await x.pool_->connect();
    if (fresh.ok()) x.local_ = std::move(*fresh);
    if (!fresh.ok() && !x.ended_) {
      // The pump drops the request; the HTTP client gets our 502.
      x.discard_ = true;
      net::spawn(x.local_.get_executor(), pump(self), "http_pump",
                 [self] { self->end("the request pump failed inside the client"); });
      co_await x.answer502(std::string(fresh.status().message()));
    }
  }
  if (x.local_.is_open() && !x.ended_) {
    net::spawn(x.local_.get_executor(), pump(self), "http_pump",
               [self] { self->end("the request pump failed inside the client"); });
    co_await x.readResponse();
  } else if (x.ended_) {
    x.pump_done_ = true;
  }
  while (!x.pump_done_) co_await x.pump_changed_.wait();

  const bool reusable = !x.ended_ && !x.stream_failed_ && x.event_.error.empty() &&
                        x.response_done_ && x.keep_alive_ && !x.upgraded_ && x.stream_eof_ &&
                        x.request_whole_ && x.local_.is_open();
  if (reusable) {
    x.pool_->giveBack(std::move(x.local_));
  } else {
    net::error_code ignored;
    x.local_.close(ignored);
  }
  if (x.done_) x.done_(x);
}

// The agent's bytes to the local server, as they come.
net::awaitable<void> Exchange::pump(std::shared_ptr<Exchange> self_in) {
  const std::shared_ptr<Exchange> self = std::move(self_in);
  Exchange& x = *self;
  while (true) {
    auto chunk = co_await x.stream_.read();
    if (!chunk.ok()) {
      if (!x.ended_) x.streamFailed(chunk.status());
      break;
    }
    if (!chunk->has_value()) {
      x.stream_eof_ = true;
      // Before an upgrade the connection stays open for the response (and
      // the next request); after it, the FIN is the client's.
      if (x.upgraded_ && x.local_.is_open()) {
        net::error_code ignored;
        x.local_.shutdown(net::tcp::socket::shutdown_send, ignored);
      }
      break;
    }
    std::string bytes = std::move(**chunk);
    x.event_.in += bytes.size();
    x.scanRequest(bytes);
    while (x.switching_) co_await x.switched_.wait();
    if (x.discard_ || x.ended_) continue;  // read on: the agent waits for its credit
    if (x.replayable_) {
      x.replay_ += bytes;
      if (x.replay_.size() > kReplayMax) {
        x.replayable_ = false;
        // clear + shrink, not swap with an empty string: GCC 12 misreads
        // that swap as a memcpy of over 1 MiB into the small buffer.
        x.replay_.clear();
        x.replay_.shrink_to_fit();
      }
    }
    net::error_code ec;
    x.pump_writing_ = true;
    co_await asio::async_write(x.local_, asio::buffer(bytes),
                               asio::redirect_error(net::use_awaitable, ec));
    x.pump_writing_ = false;
    x.pump_changed_.notify();
    if (!ec || x.ended_) continue;
    if (x.switching_ || x.replayable_) {
      // A pooled connection the server had closed. The bytes are in
      // replay_; the response side sees the failure too (at the latest on
      // the closed socket) and moves to a new connection.
      if (!x.switching_) x.abortLocal();
      continue;
    }
    // The response side answers (a 502 before any response byte, else a
    // reset) when its read fails on the aborted socket; the rest of the
    // request is dropped.
    x.noteError(absl::StrCat("write: ", ec.message()));
    x.discard_ = true;
    x.abortLocal();
  }
  x.pump_done_ = true;
  x.pump_changed_.notify();
}

// Moves the request to a new connection after a pooled one failed before
// any response byte. False when that failed too (answered with a 502).
net::awaitable<bool> Exchange::switchConnection() {
  replayable_ = false;
  switching_ = true;
  abortLocal();  // a write in progress fails at once
  while (pump_writing_) co_await pump_changed_.wait();
  auto fresh = co_await pool_->connect();
  bool ok = fresh.ok() && !ended_;
  std::string why;
  if (fresh.ok()) {
    local_ = std::move(*fresh);
    const std::string replay = std::move(replay_);
    replay_.clear();
    net::error_code ec;
    if (!replay.empty()) {
      co_await asio::async_write(local_, asio::buffer(replay),
                                 asio::redirect_error(net::use_awaitable, ec));
    }
    if (ec) {
      ok = false;
      why = absl::StrCat("write: ", ec.message());
    }
  } else {
    why = std::string(fresh.status().message());
  }
  switching_ = false;
  switched_.notify();
  if (!ok && !ended_) {
    discard_ = true;
    co_await answer502(absl::StrCat("an idle connection failed, and a new one too: ", why));
  }
  co_return ok;
}

net::awaitable<void> Exchange::answer502(std::string why_in) {
  const std::string why = std::move(why_in);
  replayable_ = false;
  discard_ = true;
  abortLocal();
  noteError(why);
  event_.status = 502;
  if (co_await toStream(badGatewayResponse(pool_->to(), why))) halfCloseStream();
}

// The local server's bytes to the stream: the response, then raw bytes
// after a 101.
net::awaitable<void> Exchange::readResponse() {
  ResponseScanner& scan = response_;
  std::string pending;
  // Not zeroed: most answers are a few hundred bytes, and clearing 64 KiB
  // per exchange was 2 % of `siphon steal`'s profile under load.
  const auto buf = std::make_unique_for_overwrite<char[]>(kRelayChunk);
  while (true) {
    net::error_code ec;
    const size_t n = co_await local_.async_read_some(asio::buffer(buf.get(), kRelayChunk),
                                                     asio::redirect_error(net::use_awaitable, ec));
    if (ended_ || stream_failed_) co_return;
    if (ec) {
      if (upgraded_) {
        if (ec == asio::error::eof) {
          halfCloseStream();
        } else {
          resetStream(absl::StrCat("the local server ", pool_->to(), " failed: ", ec.message()));
        }
        co_return;
      }
      if (!got_response_byte_) {
        if (replayable_) {
          if (co_await switchConnection()) continue;
          co_return;
        }
        // Named first: GCC 12 mishandles a conditional's temporaries in a
        // co_await's arguments.
        std::string why = event_.error;
        if (ec == asio::error::eof) {
          why = "closed the connection without answering";
        } else if (why.empty()) {
          why = absl::StrCat("read: ", ec.message());
        }
        co_await answer502(std::move(why));
        co_return;
      }
      if (ec == asio::error::eof && scan.needEof() && scan.putEof().ok()) {
        // A response without Content-Length or chunked: it ends here.
        response_done_ = true;
        keep_alive_ = false;
        halfCloseStream();
        co_return;
      }
      resetStream(absl::StrCat("the local server ", pool_->to(), " cut its response short: ",
                               ec == asio::error::eof ? "closed the connection" : ec.message()));
      co_return;
    }
    if (!got_response_byte_) {
      got_response_byte_ = true;
      replayable_ = false;
      std::string().swap(replay_);
      if (request_.headerDone() && request_.method() == "HEAD") head_ = true;
      scan.reset(head_);
    }
    if (upgraded_) {
      if (!co_await toStream(std::string(buf.get(), n))) co_return;
      continue;
    }
    pending.append(buf.get(), n);
    const Step step = co_await forward(pending);
    if (step == Step::kDone || step == Step::kFailed) co_return;
  }
}

// Forwards what `pending` holds of the response; what is left waits for
// more bytes.
net::awaitable<Exchange::Step> Exchange::forward(std::string& pending) {
  ResponseScanner& scan = response_;
  while (!pending.empty()) {
    auto n = scan.put(pending);
    if (!n.ok()) {
      if (event_.out == 0) {
        co_await answer502(std::string(n.status().message()));
      } else {
        resetStream(absl::StrCat("the local server ", pool_->to(), ": ", n.status().message()));
      }
      co_return Step::kFailed;
    }
    if (*n > 0) {
      std::string head = pending.substr(0, *n);
      pending.erase(0, *n);
      if (!co_await toStream(std::move(head))) co_return Step::kFailed;
    }
    if (scan.headerDone() && scan.status() >= 200) event_.status = scan.status();
    if (!scan.done()) {
      if (*n == 0) break;  // a header or chunk line still incomplete
      continue;
    }
    const int status = scan.status();
    if (status == 101) {
      // An upgrade: raw bytes both ways from here.
      upgraded_ = true;
      event_.status = 101;
      if (!pending.empty() && !co_await toStream(std::move(pending))) co_return Step::kFailed;
      pending.clear();
      if (stream_eof_ && local_.is_open()) {
        net::error_code ignored;
        local_.shutdown(net::tcp::socket::shutdown_send, ignored);
      }
      co_return Step::kUpgraded;
    }
    if (status < 200) {
      // 100 Continue, 103 Early Hints: the final response follows.
      scan.reset(head_);
      continue;
    }
    response_done_ = true;
    keep_alive_ = scan.keepAlive() && pending.empty();
    halfCloseStream();
    co_return Step::kDone;
  }
  co_return Step::kMore;
}

}  // namespace siphon::cli
