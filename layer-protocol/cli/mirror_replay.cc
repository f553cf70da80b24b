#include "cli/mirror_replay.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {

namespace asio = net::asio;
using Clock = asio::steady_timer::clock_type;

Replay::Replay(asio::any_io_executor ex, LocalDialer dial, std::function<void(std::string)> on_fail)
    : socket_(ex),
      timer_(ex),
      wake_(ex),
      finished_(ex),
      room_(ex),
      dial_(std::move(dial)),
      on_fail_(std::move(on_fail)) {}

void Replay::start() {
  net::spawn(socket_.get_executor(), run(shared_from_this()), "mirror_replay",
             [self = shared_from_this()] { self->fail("the replay failed"); });
}

void Replay::push(std::string_view bytes) {
  if (failed_ || finishing_) {
    dropped_ += bytes.size();
    return;
  }
  if (connected_ && !writing_ && queue_.empty()) {
    // Straight into the socket while nothing waits: the queue then holds
    // only what the server's side did not take, so its bound measures the
    // server, not how long this loop took to let the writer run.
    net::error_code ec;
    const size_t n = socket_.write_some(asio::buffer(bytes.data(), bytes.size()), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      dropped_ += bytes.size();
      fail(absl::StrCat("write: ", ec.message()));
      return;
    }
    written_ += n;
    if (n > 0) progress_at_ = Clock::now();
    bytes.remove_prefix(n);
    if (bytes.empty()) return;
  }
  if (queued_ + in_flight_ + bytes.size() > kQueueBytes) {
    dropped_ += bytes.size();
    fail(absl::StrCat("it read too slowly: ", kQueueBytes >> 20, " MiB waited for it"));
    return;
  }
  queued_ += bytes.size();
  queue_.emplace_back(bytes);
  wake_.notify();
}

net::awaitable<void> Replay::waitForRoom() {
  while (!failed_ && !finishing_ && queued_ + in_flight_ >= kHighWater) {
    if (!connected_) {
      co_await room_.wait();  // the dial ends either way, and says so
      continue;
    }
    const auto deadline = progress_at_ + kStallLimit;
    if (Clock::now() >= deadline) {
      fail(absl::StrCat("it took none of the ", queued_ + in_flight_, " bytes waiting for ",
                        std::chrono::duration_cast<std::chrono::seconds>(kStallLimit).count(),
                        " s"));
      break;
    }
    co_await room_.wait(deadline);
  }
}

void Replay::finish() {
  finishing_ = true;
  wake_.notify();
  room_.notify();
}

void Replay::abort() {
  if (done_) return;
  if (!failed_) {
    failed_ = true;
    dropQueue();
  }
  closeSocket(/*reset=*/true);
  wake_.notify();
  room_.notify();
}

net::awaitable<void> Replay::waitDone(Clock::time_point deadline) {
  while (!done_ && Clock::now() < deadline) co_await finished_.wait(deadline);
}

net::awaitable<void> Replay::run(std::shared_ptr<Replay> self_in) {
  const std::shared_ptr<Replay> self = std::move(self_in);
  co_await self->write();
  self->done_ = true;
  self->finished_.notify();
}

net::awaitable<void> Replay::write() {
  // The dialer bounds the connect (a server that never answers must not
  // hold the bytes for ever); abort() meanwhile closes the socket.
  connecting_ = true;
  absl::Status connected = co_await dial_(socket_);
  connecting_ = false;
  if (failed_) co_return;  // aborted meanwhile
  if (!connected.ok()) {
    fail(std::string(connected.message()));
    co_return;
  }
  net::error_code ec;
  socket_.set_option(net::tcp::no_delay(true), ec);
  socket_.non_blocking(true, ec);  // for push()'s direct writes
  connected_ = true;
  progress_at_ = Clock::now();
  room_.notify();
  net::spawn(socket_.get_executor(), discardAnswers(shared_from_this()), "mirror_replay_reader",
             [self = shared_from_this()] { self->fail("the replay's reader failed"); });

  while (true) {
    while (queue_.empty() && !finishing_ && !failed_) co_await wake_.wait();
    if (failed_) co_return;
    if (queue_.empty()) {
      // Every byte is out: pass the FIN on, and give the answer a while.
      socket_.shutdown(net::tcp::socket::shutdown_send, ec);
      timer_.expires_after(kLinger);
      timer_.async_wait([self = shared_from_this()](net::error_code e) {
        if (!e) self->closeSocket(false);
      });
      co_return;
    }
    std::string chunk = std::move(queue_.front());
    queue_.pop_front();
    queued_ -= chunk.size();
    in_flight_ = chunk.size();
    writing_ = true;
    const size_t n = co_await asio::async_write(socket_, asio::buffer(chunk),
                                                asio::redirect_error(net::use_awaitable, ec));
    writing_ = false;
    in_flight_ = 0;
    written_ += n;
    dropped_ += chunk.size() - n;
    if (n > 0) progress_at_ = Clock::now();
    // waitForRoom() needs waking only once the backlog is below the mark:
    // a stall it finds by its own deadline, rechecked against progress_at_.
    if (queued_ + in_flight_ < kHighWater) room_.notify();
    if (ec) {
      fail(absl::StrCat("write: ", ec.message()));  // nothing said if aborted already
      co_return;
    }
    if (failed_) co_return;
  }
}

net::awaitable<void> Replay::discardAnswers(std::shared_ptr<Replay> self_in) {
  const std::shared_ptr<Replay> self = std::move(self_in);
  std::vector<char> buf(64 * 1024);
  net::error_code ec;
  while (!ec && self->socket_.is_open()) {
    (void)co_await self->socket_.async_read_some(asio::buffer(buf),
                                                 asio::redirect_error(net::use_awaitable, ec));
  }
  // The server closed (or reset) its side: once our bytes are out too,
  // nothing is left to do with the socket.
  if (self->done_) self->closeSocket(false);
}

void Replay::fail(std::string why) {
  if (failed_) return;
  failed_ = true;
  dropQueue();
  closeSocket(true);
  wake_.notify();
  room_.notify();
  if (on_fail_) on_fail_(std::move(why));
}

void Replay::dropQueue() {
  dropped_ += queued_;
  queued_ = 0;
  queue_.clear();
}

void Replay::closeSocket(bool reset) {
  net::error_code ignored;
  if (!socket_.is_open()) return;
  if (reset) socket_.set_option(asio::socket_base::linger(true, 0), ignored);
  socket_.close(ignored);
  timer_.cancel();
}

}  // namespace siphon::cli
