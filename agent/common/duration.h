// Durations on the command line: "30s", "500ms", "2m", "1h", "0".
#pragma once

#include <chrono>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon::agent {

absl::StatusOr<std::chrono::milliseconds> parseDuration(std::string_view text);

}  // namespace siphon::agent
