#include "cli/line_writer.h"

#include <errno.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace siphon::cli {

LineWriter::LineWriter(int fd, size_t max_queued)
    : fd_(fd), max_queued_(max_queued), thread_([this] { run(); }) {}

LineWriter::~LineWriter() {
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait_for(lock, std::chrono::milliseconds(flush_limit_ms),
                    [this] { return queue_.empty() && !writing_; });
  stop_ = true;
  const bool stuck = !queue_.empty() || writing_;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_bytes_ + line.size() > max_queued_) {
      ++dropped_;
      ++dropped_unsaid_;
      return;
    }
    queued_bytes_ += line.size();
    queue_.push_back(std::move(line));
  }
  cv_.notify_one();
}

bool LineWriter::tryWrite(std::string chunk) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_bytes_ + chunk.size() > max_queued_) return false;
    queued_bytes_ += chunk.size();
    queue_.push_back(std::move(chunk));
  }
  cv_.notify_one();
  return true;
}

size_t LineWriter::queuedBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_ + writing_bytes_;
}

void LineWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  drained_.wait_for(lock, std::chrono::milliseconds(flush_limit_ms),
                    [this] { return queue_.empty() && !writing_; });
}

uint64_t LineWriter::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void LineWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, all written
    std::string line = std::move(queue_.front());
    queue_.pop_front();
    queued_bytes_ -= line.size();
    if (dropped_unsaid_ > 0 && queue_.empty()) {
      // The reader caught up: say what it missed, after this line.
      absl::StrAppend(&line, "siphon: ", dropped_unsaid_,
                      dropped_unsaid_ == 1 ? " line" : " lines",
                      " dropped: nobody read them in time\n");
      dropped_unsaid_ = 0;
    }
    writing_ = true;
    writing_bytes_ = line.size();
    lock.unlock();
    size_t off = 0;
    while (off < line.size()) {
      ssize_t n = ::write(fd_, line.data() + off, line.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // a closed stdout/stderr: nothing more to say
      off += static_cast<size_t>(n);
    }
    lock.lock();
    writing_ = false;
    writing_bytes_ = 0;
    if (queue_.empty()) drained_.notify_all();
  }
}

}  // namespace siphon::cli
