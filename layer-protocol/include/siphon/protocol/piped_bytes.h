// A file read's bytes held in a pipe instead of memory: the agent splices
// them from the file into the pipe (page references, no copy), and the
// transport tees them from there into the socket (tee + splice: no copy
// either), so a read that goes out once, or again on a resume, is never
// copied in the agent. The frame's head is written as usual; the pipe
// stands for the data that follows it (OutFrame::piped).
//
// The pipe holds references to the file's page cache, not a snapshot: a
// write to the file before the bytes reach the client can show in them,
// as it would had the read run that much later (it runs, at the latest,
// when the client receives it). Their number is fixed when the pipe is
// filled.
//
// Not thread-safe: made on any thread, then used on one event loop.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon::protocol {

class PipedBytes {
 public:
  // Takes the read end of a pipe holding exactly `size` bytes (its write
  // end already closed).
  PipedBytes(int read_fd, size_t size);
  ~PipedBytes();
  PipedBytes(const PipedBytes&) = delete;
  PipedBytes& operator=(const PipedBytes&) = delete;

  size_t size() const { return size_; }
  // The pipe, or -1 once materialize() emptied it.
  int fd() const { return fd_; }
  bool materialized() const { return fd_ < 0; }

  // The bytes in memory: read out of the pipe the first time (which closes
  // it), for a transport that cannot splice (TLS) or a splice that failed.
  // INTERNAL when the pipe does not hold `size` bytes.
  absl::StatusOr<std::string_view> materialize();

  // Pipes held by every PipedBytes of the process: the agent keeps them
  // within a budget of its descriptors.
  static int64_t live() { return live_.load(std::memory_order_relaxed); }

 private:
  int fd_;
  size_t size_;
  std::string bytes_;
  static std::atomic<int64_t> live_;
};

}  // namespace siphon::protocol
