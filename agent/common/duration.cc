#include "agent/common/duration.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent {

absl::StatusOr<std::chrono::milliseconds> parseDuration(std::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad duration '", asv(text), "' (want a number with ms, s, m or h, e.g. 30s)"));
  };
  if (text.empty()) return bad();
  size_t i = 0;
  uint64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    n = n * 10 + static_cast<uint64_t>(text[i] - '0');
    if (n > (uint64_t{1} << 40)) return bad();
    ++i;
  }
  if (i == 0) return bad();
  std::string_view unit = text.substr(i);
  uint64_t ms;
  if (unit == "ms") {
    ms = n;
  } else if (unit == "s") {
    ms = n * 1000;
  } else if (unit == "m") {
    ms = n * 60 * 1000;
  } else if (unit == "h") {
    ms = n * 3600 * 1000;
  } else if (unit.empty() && n == 0) {
    ms = 0;
  } else {
    return bad();
  }
  return std::chrono::milliseconds(ms);
}

}  // namespace siphon::agent
