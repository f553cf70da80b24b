// The pure parts of the CLI's option handling: agent addresses, the token,
// durations. No I/O except reading the token file.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::cli {

// The agents to try, in order: every --agent value, else the SIPHON_AGENT
// environment variable (`env_value`, nullopt when unset). Each value may hold
// several comma-separated HOST:PORT entries ("[v6]:port" for IPv6); blanks
// around entries and empty entries are ignored. INVALID_ARGUMENT names the
// first malformed entry (port 0 included: it cannot be dialled), or says that
// no address was given at all.
absl::StatusOr<std::vector<std::string>> parseAgentList(const std::vector<std::string>& flags,
                                                        std::optional<std::string_view> env_value);

// `s` without trailing whitespace (spaces, tabs, CR, LF...): token files are
// usually written by editors or `echo`, which add a newline.
std::string trimTrailingWhitespace(std::string s);

// The token from `path`, trailing whitespace stripped. INVALID_ARGUMENT when
// the file cannot be read (with the path and strerror) or holds nothing but
// whitespace.
absl::StatusOr<std::string> readTokenFile(const std::string& path);

// "250ms", "5s", "2m", "1h", or a bare number of seconds ("10"); a decimal
// point is allowed ("1.5s"). INVALID_ARGUMENT for anything else, or for a
// duration that is not positive.
absl::StatusOr<std::chrono::milliseconds> parseDuration(std::string_view s);

}  // namespace siphon::cli
