// Helpers shared by the libFuzzer targets: invariant checks that abort (so
// libFuzzer keeps the input), a source of small choices read from the input,
// and the SIPHON_FUZZ_WRITE_SEEDS mechanism that writes a target's built-in
// seeds to a directory (scripts/fuzz.sh; tests/fuzz/corpus/ holds copies).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace siphon::fuzz {

inline void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// Takes bytes off the front of the input for decisions, so the rest is the
// payload: the choices a seed makes are its first bytes.
class Input {
 public:
  explicit Input(std::string_view in) : in_(in) {}
  uint8_t byte() {
    if (in_.empty()) return 0;
    uint8_t b = static_cast<uint8_t>(in_.front());
    in_.remove_prefix(1);
    return b;
  }
  // A value in [0, n].
  size_t upTo(size_t n) {
    const size_t high = byte();  // two statements: the order of the reads matters
    const size_t v = (high << 8) | byte();
    return n == 0 ? 0 : v % (n + 1);
  }
  // Up to `n` bytes (a length byte first), for a second string.
  std::string_view shortString(size_t n = 255) {
    size_t len = byte();
    if (len > n) len = n;
    if (len > in_.size()) len = in_.size();
    std::string_view s = in_.substr(0, len);
    in_.remove_prefix(len);
    return s;
  }
  std::string_view rest() const { return in_; }

 private:
  std::string_view in_;
};

// When SIPHON_FUZZ_WRITE_SEEDS names a directory: writes `seeds` there as
// seed-0, seed-1... and exits (0, or 1 when a file cannot be written).
inline void writeSeedsIfAsked(const std::vector<std::string>& seeds) {
  const char* dir = std::getenv("SIPHON_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return;
  int i = 0;
  for (const std::string& seed : seeds) {
    std::string path = std::string(dir) + "/seed-" + std::to_string(i++);
    std::ofstream out(path, std::ios::binary);
    out << seed;
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::exit(1);
    }
  }
  std::fprintf(stderr, "wrote %d seeds to %s\n", i, dir);
  std::exit(0);
}

}  // namespace siphon::fuzz
