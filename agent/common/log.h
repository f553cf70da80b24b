// Agent logs: one event per line on stderr, as text or JSON
// (--log-format json). stdout is kept for the ready line.
//
//   2026-11-29T23:59:00.123Z info session_opened session=3f2a client="siphon"
//   {"time":"2026-11-29T23:59:00.123Z","level":"info","event":"session_opened",...}
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace siphon::agent::log {

enum class Format { kText, kJson };
enum class Level { kDebug, kInfo, kWarn, kError };

absl::Status init(Format format, std::string_view level);
absl::Status parseFormat(std::string_view name, Format* out);
// "debug" (or "trace"), "info", "warn" (or "warning"), "error".
absl::Status parseLevel(std::string_view name, Level* out);

struct Field {
  Field(std::string_view k, std::string_view v) : key(k), value(v), quoted(true) {}
  Field(std::string_view k, const char* v) : key(k), value(v), quoted(true) {}
  Field(std::string_view k, const std::string& v) : key(k), value(v), quoted(true) {}
  Field(std::string_view k, int64_t v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(std::string_view k, uint64_t v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(std::string_view k, int v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(std::string_view k, unsigned v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(std::string_view k, long long v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(std::string_view k, bool v) : key(k), value(v ? "true" : "false"), quoted(false) {}
  std::string key;
  std::string value;
  bool quoted;
};

void event(Level level, std::string_view name, std::initializer_list<Field> fields = {});
// Whether events of `level` are written. Fields are built (strings
// formatted and copied) before event() can drop them: a debug line on a
// per-request path asks first.
bool enabled(Level level);
inline void debug(std::string_view name, std::initializer_list<Field> f = {}) {
  event(Level::kDebug, name, f);
}
inline void info(std::string_view name, std::initializer_list<Field> f = {}) {
  event(Level::kInfo, name, f);
}
inline void warn(std::string_view name, std::initializer_list<Field> f = {}) {
  event(Level::kWarn, name, f);
}
inline void error(std::string_view name, std::initializer_list<Field> f = {}) {
  event(Level::kError, name, f);
}

// For events a peer can repeat at will (a rejected handshake, a limit hit, a
// coroutine that fails per connection): hit() counts one more occurrence of
// `key` and returns the count when this occurrence should be logged (the
// 1st, 2nd, 4th, 8th... of that key), 0 otherwise, so the log grows with the
// logarithm of a flood, and each line says how many there have been.
// Thread-safe.
class Throttle {
 public:
  uint64_t hit(std::string_view key);

 private:
  std::mutex mu_;
  std::map<std::string, uint64_t, std::less<>> counts_;
};

// The agent's reporter for net::spawn() (siphon/transport/spawn.h):
// `coroutine_failed what=NAME error=TEXT count=N`, throttled per NAME.
void coroutineFailed(std::string_view what, std::string_view error);

// Formats one line (no newline) as init() configured; exposed for tests.
std::string formatLine(Format format, Level level, std::string_view name,
                       std::initializer_list<Field> fields, std::string_view time);

}  // namespace siphon::agent::log
