#include "agent/target/environ.h"

#include <fnmatch.h>

#include <cstdint>
#include <map>
#include <utility>

#include "siphon/status.h"

namespace siphon::agent {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at s[i], or 0 if there is none
// (bad lead byte, truncated, overlong, surrogate, above U+10FFFF): the same
// rules as the validator protobuf runs on proto3 strings.
size_t utf8SequenceAt(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return len;
}

bool isUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8SequenceAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// Each maximal run of bytes that starts no valid sequence becomes one U+FFFD.
std::string toUtf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool in_bad_run = false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8SequenceAt(s, i);
    if (n == 0) {
      if (!in_bad_run) out.append(kReplacement);
      in_bad_run = true;
      ++i;
      continue;
    }
    in_bad_run = false;
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

bool matchesAny(const std::vector<std::string>& patterns, const std::string& name) {
  for (const std::string& p : patterns) {
    // Non-zero is either FNM_NOMATCH or an error; neither is a match.
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<v1::EnvVar>> parseEnviron(std::string_view raw) {
  // std::map: emplace keeps the first of duplicates and the order is bytewise.
  std::map<std::string, std::string, std::less<>> vars;
  while (!raw.empty()) {
    const size_t end = raw.find('\0');
    const std::string_view entry = raw.substr(0, end);
    raw = end == std::string_view::npos ? std::string_view() : raw.substr(end + 1);

    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    const std::string_view name = entry.substr(0, eq);
    if (!isUtf8(name) || vars.find(name) != vars.end()) continue;
    vars.emplace(std::string(name), toUtf8Lossy(entry.substr(eq + 1)));
  }

  std::vector<v1::EnvVar> out;
  out.reserve(vars.size());
  for (auto& [name, value] : vars) {
    v1::EnvVar& v = out.emplace_back();
    v.set_name(name);
    v.set_value(std::move(value));
  }
  return out;
}

EnvFilter::EnvFilter(std::vector<std::string> include, std::vector<std::string> exclude)
    : include_(std::move(include)), exclude_(std::move(exclude)) {}

EnvFilter EnvFilter::fromRequest(const v1::EnvRequest& request) {
  return EnvFilter(std::vector<std::string>(request.include().begin(), request.include().end()),
                   std::vector<std::string>(request.exclude().begin(), request.exclude().end()));
}

bool EnvFilter::matches(std::string_view name) const {
  const std::string n(name);  // fnmatch wants a NUL-terminated string
  if (matchesAny(exclude_, n)) return false;
  return include_.empty() || matchesAny(include_, n);
}

v1::EnvResponse filterEnv(const std::vector<v1::EnvVar>& vars, const EnvFilter& filter) {
  v1::EnvResponse response;
  for (const v1::EnvVar& v : vars) {
    if (filter.matches(v.name())) *response.add_vars() = v;
  }
  return response;
}

absl::StatusOr<v1::EnvResponse> envFor(ProcFs& procfs, pid_t pid, const v1::EnvRequest& request) {
  ASSIGN_OR_RETURN(std::string raw, procfs.readEnviron(pid));
  ASSIGN_OR_RETURN(std::vector<v1::EnvVar> vars, parseEnviron(raw));
  return filterEnv(vars, EnvFilter::fromRequest(request));
}

}  // namespace siphon::agent
