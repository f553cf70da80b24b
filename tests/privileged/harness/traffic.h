// Byte traffic for the privileged tests: blocking socket helpers and a
// deterministic byte stream both ends of a transfer can check without
// holding it. Header-only.
#pragma once

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

namespace siphon::harness {

// Receive and send timeouts: a bug fails the test instead of hanging it.
inline void setTimeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Writes all of `data` to a socket (no SIGPIPE) or a pipe; false on an
// error or a timeout.
inline bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}
inline bool writeAll(int fd, const char* data, size_t n) {
  return writeAll(fd, std::string_view(data, n));
}

// Reads to EOF into `out`; false on an error (a reset, a timeout).
inline bool readAll(int fd, std::string* out) {
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    out->append(buf, static_cast<size_t>(n));
  }
}

// A deterministic endless byte stream (xorshift64*).
class Pattern {
 public:
  explicit Pattern(uint64_t seed) : s_(seed | 1) {}
  void fill(char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (left_ == 0) {
        s_ ^= s_ >> 12;
        s_ ^= s_ << 25;
        s_ ^= s_ >> 27;
        word_ = s_ * 2685821657736338717ULL;
        left_ = 8;
      }
      p[i] = static_cast<char>(word_ & 0xff);
      word_ >>= 8;
      --left_;
    }
  }

 private:
  uint64_t s_;
  uint64_t word_ = 0;
  int left_ = 0;
};

// Writes `total` bytes of Pattern(seed) to fd (a socket or a pipe), counting
// them in `sent`, then half-closes (a socket, when `shutdown_after`).
inline bool sendPattern(int fd, uint64_t seed, uint64_t total,
                        std::atomic<uint64_t>* sent = nullptr, bool shutdown_after = true) {
  Pattern p(seed);
  // No more than is sent: hundreds of these at once (each on its thread)
  // must not each zero a MiB, which under ASan takes seconds.
  std::string buf(static_cast<size_t>(std::min<uint64_t>(total, 1 << 20)), '\0');
  while (total > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(total, buf.size()));
    p.fill(buf.data(), n);
    if (!writeAll(fd, buf.data(), n)) return false;
    total -= n;
    if (sent) *sent += n;
  }
  return !shutdown_after || ::shutdown(fd, SHUT_WR) == 0;
}

}  // namespace siphon::harness
