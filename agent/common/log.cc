#include "agent/common/log.h"

#include <sys/time.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"
#include "siphon/text.h"

namespace siphon::agent::log {
namespace {

std::atomic<Format> g_format{Format::kText};
std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mu;

std::string_view levelName(Level l) {
  switch (l) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

std::string nowUtc() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  gmtime_r(&tv.tv_sec, &t);
  char buf[64];
  size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &t);
  snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(tv.tv_usec / 1000));
  return buf;
}

bool needsQuotes(std::string_view v) {
  if (v.empty()) return true;
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || static_cast<unsigned char>(c) < 0x20) return true;
  }
  return false;
}

}  // namespace

absl::Status parseFormat(std::string_view name, Format* out) {
  if (name == "text") {
    *out = Format::kText;
  } else if (name == "json") {
    *out = Format::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log format '", asv(name), "' (want text or json)"));
  }
  return absl::OkStatus();
}

absl::Status parseLevel(std::string_view name, Level* out) {
  if (name == "debug" || name == "trace") {
    *out = Level::kDebug;
  } else if (name == "info") {
    *out = Level::kInfo;
  } else if (name == "warn" || name == "warning") {
    *out = Level::kWarn;
  } else if (name == "error") {
    *out = Level::kError;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log level '", asv(name), "' (want debug, info, warn or error)"));
  }
  return absl::OkStatus();
}

absl::Status init(Format format, std::string_view level) {
  Level l;
  if (absl::Status s = parseLevel(level, &l); !s.ok()) return s;
  g_format = format;
  g_level = l;
  return absl::OkStatus();
}

std::string formatLine(Format format, Level level, std::string_view name,
                       std::initializer_list<Field> fields, std::string_view time) {
  std::string line;
  if (format == Format::kJson) {
    absl::StrAppend(&line, "{\"time\":\"", asv(time), "\",\"level\":\"", asv(levelName(level)),
                    "\",\"event\":", jsonString(name));
    for (const auto& f : fields) {
      absl::StrAppend(&line, ",", jsonString(f.key), ":");
      if (f.quoted) {
        absl::StrAppend(&line, jsonString(f.value));
      } else {
        absl::StrAppend(&line, f.value);
      }
    }
    line += "}";
    return line;
  }
  absl::StrAppend(&line, asv(time), " ", asv(levelName(level)), " ", asv(name));
  for (const auto& f : fields) {
    absl::StrAppend(&line, " ", f.key, "=");
    if (f.quoted && needsQuotes(f.value)) {
      absl::StrAppend(&line, jsonString(f.value));
    } else {
      absl::StrAppend(&line, f.value);
    }
  }
  return line;
}

bool enabled(Level level) { return level >= g_level.load(std::memory_order_relaxed); }

void event(Level level, std::string_view name, std::initializer_list<Field> fields) {
  if (level < g_level.load()) return;
  std::string line = formatLine(g_format.load(), level, name, fields, nowUtc());
  line += '\n';
  std::lock_guard<std::mutex> lock(g_mu);
  fwrite(line.data(), 1, line.size(), stderr);
  fflush(stderr);
}

uint64_t Throttle::hit(std::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(key);
  if (it == counts_.end()) it = counts_.emplace(std::string(key), 0).first;
  const uint64_t n = ++it->second;
  return (n & (n - 1)) == 0 ? n : 0;
}

void coroutineFailed(std::string_view what, std::string_view error) {
  static Throttle throttle;
  const uint64_t n = throttle.hit(what);
  if (n == 0) return;
  log::error("coroutine_failed", {{"what", what}, {"error", error}, {"count", n}});
}

}  // namespace siphon::agent::log
