#include "agent/target/environ.h"

#include <fnmatch.h>

#include <cstdint>
#include <map>
#include <utility>

#include "siphon/status.h"
#include "siphon/text.h"

namespace siphon::agent {
namespace {

bool isUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8SequenceAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
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
