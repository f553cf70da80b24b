#include "siphon/protocol/piped_bytes.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::protocol {

std::atomic<int64_t> PipedBytes::live_{0};

PipedBytes::PipedBytes(int read_fd, size_t size) : fd_(read_fd), size_(size) {
  if (fd_ >= 0) live_.fetch_add(1, std::memory_order_relaxed);
}

PipedBytes::~PipedBytes() {
  if (fd_ < 0) return;
  ::close(fd_);
  live_.fetch_sub(1, std::memory_order_relaxed);
}

absl::StatusOr<std::string_view> PipedBytes::materialize() {
  if (fd_ < 0) return std::string_view(bytes_);
  std::string bytes(size_, '\0');
  size_t have = 0;
  while (have < size_) {
    const ssize_t n = ::read(fd_, bytes.data() + have, size_ - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The write end is closed: 0 means the pipe held fewer bytes than said.
      return protoError(v1::INTERNAL,
                        absl::StrCat("a piped file read holds ", have, " of its ", size_,
                                     " bytes", n < 0 ? absl::StrCat(": ", std::strerror(errno)) : ""));
    }
    have += static_cast<size_t>(n);
  }
  ::close(fd_);
  fd_ = -1;
  live_.fetch_sub(1, std::memory_order_relaxed);
  bytes_ = std::move(bytes);
  return std::string_view(bytes_);
}

}  // namespace siphon::protocol
