// The replay of one mirrored connection's client->server bytes to a local
// server (`siphon mirror --to`, `siphon exec --mirror`): a connection of its
// own, a writer draining a bounded queue, a reader throwing the answers
// away. push() never blocks; the caller waits in waitForRoom() before it
// reads more of the stream once kHighWater waits, so a burst (a mirror
// catching up after a stall, a server pausing) waits in the stream's
// credit and the agent's buffer, whose overflow is a gap the agent
// reports, not here. A server that takes nothing for kStallLimit fails the
// replay; bytes beyond kQueueBytes (a caller that does not wait), or after
// a failure, are dropped and counted.
//
// Call order: start(), push() and waitForRoom()..., finish() (the FIN
// after what is queued) or abort() (now); waitDone() until the writer is
// over.
//
// Threads: the executor it is made with (the client's event loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "cli/bridge.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

class Replay : public std::enable_shared_from_this<Replay> {
 public:
  // Client->server bytes that may wait for one replay server.
  static constexpr size_t kQueueBytes = 8 << 20;
  // What may wait before waitForRoom() holds its caller.
  static constexpr size_t kHighWater = 2 << 20;
  // A connected server that takes none of what waits for this long has
  // failed (it stopped reading): the stream is read at full speed again.
  static constexpr auto kStallLimit = std::chrono::seconds(10);
  // After the client->server FIN went to the replay server: how long its
  // answer may still come before the connection is closed.
  static constexpr auto kLinger = std::chrono::seconds(5);

  // `dial` reaches the server (its own timeout bounds the connect);
  // `on_fail` gets the first failure, once (not an abort()).
  Replay(net::asio::any_io_executor ex, LocalDialer dial, std::function<void(std::string)> on_fail);

  void start();
  void push(std::string_view bytes);
  // Returns once less than kHighWater waits, or the replay failed, was
  // aborted or finished (dialling is bounded by the dialer).
  net::awaitable<void> waitForRoom();
  void finish();
  // Ends the replay now, without a line: what it holds is not replayed.
  void abort();
  net::awaitable<void> waitDone(net::asio::steady_timer::time_point deadline);

  bool done() const { return done_; }
  uint64_t written() const { return written_; }
  uint64_t dropped() const { return dropped_; }

 private:
  static net::awaitable<void> run(std::shared_ptr<Replay> self_in);
  net::awaitable<void> write();
  static net::awaitable<void> discardAnswers(std::shared_ptr<Replay> self_in);
  void fail(std::string why);
  void dropQueue();
  void closeSocket(bool reset);

  net::tcp::socket socket_;
  net::asio::steady_timer timer_;  // the linger
  net::Signal wake_;               // the writer waits on it
  net::Signal finished_;           // waitDone() waits on it
  net::Signal room_;               // waitForRoom() waits on it
  LocalDialer dial_;
  std::function<void(std::string)> on_fail_;
  std::deque<std::string> queue_;
  size_t queued_ = 0;     // in queue_
  size_t in_flight_ = 0;  // in the writer's async_write
  bool connecting_ = false;
  bool connected_ = false;
  bool writing_ = false;
  uint64_t written_ = 0;
  // When the server last took bytes (or the connection was made).
  net::asio::steady_timer::time_point progress_at_;
  uint64_t dropped_ = 0;
  bool finishing_ = false;
  bool failed_ = false;
  bool done_ = false;
};

}  // namespace siphon::cli
