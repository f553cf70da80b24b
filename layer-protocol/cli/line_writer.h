// Event lines (`siphon steal`'s open/close lines, JSON events) written by a
// thread of their own, so the event loop never blocks on a pipe that nobody
// reads: a full stderr would otherwise stall every connection the CLI
// bridges. The queue is bounded; lines that do not fit are dropped and
// counted, and the count is written as a line of its own once the reader
// catches up ("siphon: N lines dropped: nobody read them in time"). Lines
// queued while the thread writes go out together, in one writev(2), and
// queueing a line wakes the thread only when it sleeps. After each write
// the thread gathers for kGather before it looks again, so a busy `siphon
// steal` (a line per request, tens of thousands a second) pays a wake-up
// and a writev per kGather, not per line; a line waits at most that long.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace siphon::cli {

class LineWriter {
 public:
  // Writes to `fd` (not owned); at most `max_queued` bytes wait at once,
  // those being written included.
  explicit LineWriter(int fd, size_t max_queued = 1 << 20);
  // Waits for the queue to drain, at most about `flush_limit_ms`, then
  // leaves: a reader that never comes back cannot hold the exit.
  ~LineWriter();
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;

  // Never blocks on the fd.
  void write(std::string line);
  // For a caller that accounts for what does not fit itself (the raw bytes
  // `siphon mirror` writes to stdout, where a line about drops would
  // corrupt the output): a chunk that does not fit is refused (false), not
  // counted in dropped() and never reported on the fd. Never blocks.
  bool tryWrite(std::string chunk);
  // Bytes queued and not yet written (the chunk being written included).
  size_t queuedBytes() const;
  // Waits until what is queued is written, at most about flush_limit_ms
  // (before a line written straight to the fd, to keep the order).
  void flush();
  uint64_t dropped() const;

  static constexpr int flush_limit_ms = 2000;
  // Lines written by one writev(2) at most (IOV_MAX is 1024).
  static constexpr size_t kMaxBatch = 512;
  // How long the thread lets lines gather after a write (cut short by
  // flush(), the destructor, or a queue half full).
  static constexpr std::chrono::milliseconds kGather{2};

 private:
  void run();
  // Whether `size` more bytes keep the queue within max_queued_ (mu_ held).
  bool fits(size_t size) const;
  // Half of max_queued waits (mu_ held): the gathering pause ends.
  bool halfFull() const;
  // Nothing queued, being written or dropped and not yet said (mu_ held).
  bool drained() const;
  // Writes the batch's lines, in order, until done or the fd refuses.
  void writeAll(std::vector<std::string>& batch, std::vector<iovec>& iov) const;

  const int fd_;
  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable drained_;
  std::deque<std::string> queue_;
  size_t queued_bytes_ = 0;
  size_t writing_bytes_ = 0;  // the chunk in write(2)
  uint64_t dropped_ = 0;          // in all
  uint64_t dropped_unsaid_ = 0;   // not yet reported in a line
  bool writing_ = false;
  bool idle_ = false;  // the thread waits for lines: a writer must wake it
  bool gathering_ = false;  // the thread pauses after a write (kGather)
  int flushes_ = 0;         // flush() calls waiting: no pause
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace siphon::cli
