// Text helpers shared by the agent and the CLI: UTF-8 checks, JSON string
// escaping, durations on command lines.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon {

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629 table
// 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or 0. The
// same rules as the validator protobuf runs on proto3 strings.
size_t utf8SequenceAt(std::string_view s, size_t i);

// `s` with each maximal run of bytes that starts no valid sequence replaced
// by one U+FFFD, so it can travel in a proto3 string.
std::string toUtf8Lossy(std::string_view s);

// Appends `s` as a quoted JSON string. '"', '\\' and every control character
// (U+0000..U+001F, and U+007F) are escaped; well-formed UTF-8 passes through
// unchanged. Bytes that are not well-formed UTF-8 (stray continuation bytes,
// overlong forms, surrogates, values above U+10FFFF, truncated sequences)
// become U+FFFD each, so the output is always valid JSON in valid UTF-8 even
// when a process's environment holds arbitrary bytes.
void appendJsonString(std::string& out, std::string_view s);
std::string jsonString(std::string_view s);

// "500ms", "5s", "1.5s", "2m", "1h", or a bare number of seconds ("10", "0").
// INVALID_ARGUMENT naming the input otherwise; zero is allowed (callers that
// need a positive duration check for it).
absl::StatusOr<std::chrono::milliseconds> parseDuration(std::string_view text);

}  // namespace siphon
