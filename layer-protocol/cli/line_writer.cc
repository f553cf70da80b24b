#include "cli/line_writer.h"

#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace siphon::cli {

LineWriter::LineWriter(int fd, size_t max_queued)
    : fd_(fd), max_queued_(max_queued), thread_([this] { run(); }) {}

LineWriter::~LineWriter() {
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait_for(lock, std::chrono::milliseconds(flush_limit_ms),
                    [this] { return drained(); });
  stop_ = true;
  const bool stuck = !drained();
  lock.unlock();
  cv_.notify_all();
  // A writer stuck in write(2) on a pipe nobody reads would hold the exit
  // for ever: leave it; the process is about to end.
  if (stuck) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void LineWriter::write(std::string line) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fits(line.size())) {
      queued_bytes_ += line.size();
      queue_.push_back(std::move(line));
    } else {
      // Said once the reader catches up, even if no line follows.
      ++dropped_;
      ++dropped_unsaid_;
    }
    wake = idle_ || (gathering_ && halfFull());
  }
  if (wake) cv_.notify_one();
}

bool LineWriter::tryWrite(std::string chunk) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fits(chunk.size())) return false;
    queued_bytes_ += chunk.size();
    queue_.push_back(std::move(chunk));
    wake = idle_ || (gathering_ && halfFull());
  }
  if (wake) cv_.notify_one();
  return true;
}

// The batch in write(2) counts: the thread takes everything queued at
// once, so without it the bound would let twice max_queued_ wait.
bool LineWriter::fits(size_t size) const {
  return queued_bytes_ + writing_bytes_ + size <= max_queued_;
}

bool LineWriter::halfFull() const { return (queued_bytes_ + writing_bytes_) * 2 > max_queued_; }

bool LineWriter::drained() const {
  return queue_.empty() && !writing_ && dropped_unsaid_ == 0;
}

size_t LineWriter::queuedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_ + writing_bytes_;
}

void LineWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  ++flushes_;  // no gathering pause while a flush waits
  cv_.notify_all();
  drained_.wait_for(lock, std::chrono::milliseconds(flush_limit_ms),
                    [this] { return drained(); });
  --flushes_;
}

uint64_t LineWriter::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void LineWriter::run() {
  std::vector<std::string> batch;
  std::vector<iovec> iov;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    idle_ = true;
    cv_.wait(lock, [this] { return stop_ || !queue_.empty() || dropped_unsaid_ > 0; });
    idle_ = false;
    if (queue_.empty() && dropped_unsaid_ == 0) return;  // stopping, all written
    // Everything queued goes out in one write(2) (up to kMaxBatch lines):
    // a busy `siphon steal` queues a line per request, thousands a second,
    // and neither a wake-up nor a system call per line is worth paying.
    // Writers do not wake this thread while it is busy (idle_): it looks
    // at the queue again before it sleeps.
    batch.clear();
    size_t bytes = 0;
    while (!queue_.empty() && batch.size() < kMaxBatch) {
      bytes += queue_.front().size();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    queued_bytes_ -= bytes;
    if (dropped_unsaid_ > 0 && queue_.empty()) {
      // The reader caught up: say what it missed, after these lines.
      batch.push_back(absl::StrCat("siphon: ", dropped_unsaid_,
                                   dropped_unsaid_ == 1 ? " line" : " lines",
                                   " dropped: nobody read them in time\n"));
      bytes += batch.back().size();
      dropped_unsaid_ = 0;
    }
    writing_ = true;
    writing_bytes_ = bytes;
    lock.unlock();
    writeAll(batch, iov);
    lock.lock();
    writing_ = false;
    writing_bytes_ = 0;
    if (drained()) drained_.notify_all();
    // Let the next lines gather before looking again (kGather).
    gathering_ = true;
    cv_.wait_for(lock, kGather, [this] { return stop_ || flushes_ > 0 || halfFull(); });
    gathering_ = false;
  }
}

void LineWriter::writeAll(std::vector<std::string>& batch, std::vector<iovec>& iov) const {
  iov.clear();
  for (auto& line : batch) {
    if (!line.empty()) iov.push_back({line.data(), line.size()});
  }
  size_t first = 0;
  while (first < iov.size()) {
    ssize_t n = ::writev(fd_, &iov[first], static_cast<int>(iov.size() - first));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stdout/stderr: nothing more to say
    auto left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {  // a short write inside a line
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

}  // namespace siphon::cli
