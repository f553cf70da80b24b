#include "agent/steal/session_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "siphon/status.h"

namespace siphon::agent::steal {

namespace asio = net::asio;

namespace {

// Read bytes at the front of the buffer are dropped once they are this
// many and at least half of it.
constexpr size_t kCompactAt = 64 * 1024;

v1::Error cancelled(std::string_view why) {
  v1::Error e;
  e.set_code(v1::CANCELLED);
  e.set_message(std::string(why));
  return e;
}

}  // namespace

SessionStolenStream::SessionStolenStream(asio::any_io_executor ex, uint64_t stream_id,
                                         std::weak_ptr<SessionHost> host)
    : ex_(std::move(ex)), id_(stream_id), host_(std::move(host)) {}

void SessionStolenStream::complete(Done done, net::error_code ec, size_t n) {
  asio::post(ex_, [done = std::move(done), ec, n]() mutable { done(ec, n); });
}

void SessionStolenStream::start() {
  if (started_) return;
  started_ = true;
  if (end_after_start_) endRequest();
  tryWrite();
}

void SessionStolenStream::onAccept(const v1::StreamAccept&) { start(); }

// ------------------------------------------------- session -> engine

void SessionStolenStream::readSome(asio::mutable_buffer into, Done done) {
  if (read_done_) {
    complete(std::move(done), asio::error::in_progress, 0);
    return;
  }
  read_into_ = into;
  read_done_ = std::move(done);
  tryRead();
}

void SessionStolenStream::tryRead() {
  if (!read_done_) return;
  const size_t avail = in_.size() - in_offset_;
  if (avail > 0) {
    const size_t n = std::min(avail, read_into_.size());
    std::memcpy(read_into_.data(), in_.data() + in_offset_, n);
    in_offset_ += n;
    if (in_offset_ == in_.size()) {
      in_.clear();
      in_offset_ = 0;
    } else if (in_offset_ >= kCompactAt && in_offset_ * 2 >= in_.size()) {
      in_.erase(0, in_offset_);
      in_offset_ = 0;
    }
    bytes_out_ += n;
    if (protocol::Session* s = host_.session()) {
      s->consumed(id_, n);
      host_.wake();
    }
    complete(std::exchange(read_done_, nullptr), {}, n);
    return;
  }
  if (response_ended_) {
    complete(std::exchange(read_done_, nullptr), asio::error::eof, 0);
  } else if (over_) {
    complete(std::exchange(read_done_, nullptr), asio::error::connection_reset, 0);
  }
  // Otherwise the next Data, HalfClose or Reset completes it.
}

void SessionStolenStream::onData(std::string_view payload) {
  if (over_) return;
  if (released_) {
    // Past the response the engine read whole: dropped, the credit given
    // back, until the session's HalfClose.
    if (protocol::Session* s = host_.session()) s->consumed(id_, payload.size());
    return;
  }
  if (read_done_ && in_.size() == in_offset_) {
    // A read waits and nothing is buffered: straight into its buffer; only
    // what does not fit is kept.
    const size_t n = std::min(payload.size(), read_into_.size());
    std::memcpy(read_into_.data(), payload.data(), n);
    bytes_out_ += n;
    if (protocol::Session* s = host_.session()) {
      s->consumed(id_, n);
      host_.wake();
    }
    in_.assign(payload.substr(n));
    in_offset_ = 0;
    complete(std::exchange(read_done_, nullptr), {}, n);
    return;
  }
  in_.append(payload);
  tryRead();
}

void SessionStolenStream::onHalfClose() {
  auto self = shared_from_this();  // maybeFinish() may drop the session's hold
  if (over_) return;
  response_ended_ = true;
  tryRead();
  maybeFinish();
}

void SessionStolenStream::onReset(const v1::Error& error) {
  auto self = shared_from_this();
  if (over_) return;
  log::debug("steal_request_stream_reset", {{"stream", id_}, {"error", error.message()}});
  over_ = true;
  host_.release(id_);
  ended();
}

void SessionStolenStream::close() {
  auto self = shared_from_this();
  over_ = true;
  ended();
}

// ------------------------------------------------- engine -> session

void SessionStolenStream::writeSome(std::span<const asio::const_buffer> from, Done done) {
  if (write_) {
    complete(std::move(done), asio::error::in_progress, 0);
    return;
  }
  if (over_) {
    complete(std::move(done), asio::error::connection_reset, 0);
    return;
  }
  if (request_ended_ || released_) {
    complete(std::move(done), asio::error::broken_pipe, 0);
    return;
  }
  PendingWrite w;
  w.count = std::min(from.size(), w.pieces.size());
  std::copy_n(from.begin(), w.count, w.pieces.begin());
  w.done = std::move(done);
  write_.emplace(std::move(w));
  tryWrite();
}

void SessionStolenStream::tryWrite() {
  if (!write_ || !started_ || over_) return;
  auto self = shared_from_this();
  protocol::Session* s = host_.session();
  if (s == nullptr) {
    close();
    return;
  }
  size_t total = 0;
  for (size_t i = 0; i < write_->count; ++i) total += write_->pieces[i].size();
  if (total == 0) {
    complete(std::move(write_->done), {}, 0);
    write_.reset();
    return;
  }
  const size_t credit = s->sendCredit(id_);
  if (credit == 0) return;  // onWritable() comes back
  const size_t n = std::min({credit, total, kMaxWrite});
  std::string buf;
  buf.reserve(n);
  for (size_t i = 0; i < write_->count && buf.size() < n; ++i) {
    const auto& p = write_->pieces[i];
    buf.append(static_cast<const char*>(p.data()), std::min(p.size(), n - buf.size()));
  }
  host_.sent(id_, n);
  if (absl::Status st = s->sendData(id_, std::move(buf)); !st.ok()) {
    v1::Error e;
    e.set_code(v1::INTERNAL);
    e.set_message(absl::StrCat("stream ", id_, ": ", st.message()));
    resetWith(e);
    return;
  }
  bytes_in_ += n;
  host_.wake();
  Done done = std::move(write_->done);
  write_.reset();
  complete(std::move(done), {}, n);
}

void SessionStolenStream::onWritable() { tryWrite(); }

void SessionStolenStream::endRequest() {
  auto self = shared_from_this();
  if (over_ || request_ended_ || released_) return;
  if (!started_) {
    end_after_start_ = true;
    return;
  }
  request_ended_ = true;
  if (protocol::Session* s = host_.session(); s != nullptr && s->halfClose(id_).ok()) {
    host_.wake();
  }
  maybeFinish();
}

// ------------------------------------------------------------ endings

void SessionStolenStream::cancel() {
  if (read_done_) complete(std::exchange(read_done_, nullptr), asio::error::operation_aborted, 0);
  if (write_) {
    complete(std::move(write_->done), asio::error::operation_aborted, 0);
    write_.reset();
  }
}

void SessionStolenStream::release() {
  if (released_) return;
  auto self = shared_from_this();
  released_ = true;
  cancel();
  if (over_) return;
  if (!request_ended_) {
    resetWith(cancelled("the agent ended the request before it was whole"));
    return;
  }
  // The rest of the response, if any, is dropped (onData).
  const size_t unread = in_.size() - in_offset_;
  in_.clear();
  in_offset_ = 0;
  if (protocol::Session* s = host_.session(); s != nullptr && unread > 0) {
    s->consumed(id_, unread);
    host_.wake();
  }
}

void SessionStolenStream::abort() {
  auto self = shared_from_this();
  released_ = true;
  cancel();
  if (!over_) resetWith(cancelled("the agent gave up on the request"));
}

void SessionStolenStream::resetWith(const v1::Error& error) {
  over_ = true;
  log::debug("steal_request_stream_failed", {{"stream", id_}, {"error", error.message()}});
  if (host_.session() != nullptr) {
    host_.reset(id_, error);
    host_.wake();
  }
  host_.release(id_);
  ended();
}

void SessionStolenStream::ended() {
  in_.clear();
  in_offset_ = 0;
  tryRead();
  if (write_) {
    complete(std::move(write_->done), asio::error::connection_reset, 0);
    write_.reset();
  }
}

void SessionStolenStream::maybeFinish() {
  if (over_ || !request_ended_ || !response_ended_) return;
  // Both ways ended: the session already forgot the stream.
  over_ = true;
  host_.release(id_);
}

}  // namespace siphon::agent::steal
