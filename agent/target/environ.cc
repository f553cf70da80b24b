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

// The shared rules of parseEnviron and parseEnvList (see environ.h).
absl::StatusOr<std::vector<v1::EnvVar>> parseEntries(const std::vector<std::string_view>& entries) {
  // std::map: emplace keeps the first of duplicates and the order is bytewise.
  std::map<std::string, std::string, std::less<>> vars;
  for (const std::string_view entry : entries) {
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

}  // namespace

absl::StatusOr<std::vector<v1::EnvVar>> parseEnviron(std::string_view raw) {
  std::vector<std::string_view> entries;
  while (!raw.empty()) {
    const size_t end = raw.find('\0');
    entries.push_back(raw.substr(0, end));
    raw = end == std::string_view::npos ? std::string_view() : raw.substr(end + 1);
  }
  return parseEntries(entries);
}

absl::StatusOr<std::vector<v1::EnvVar>> parseEnvList(const std::vector<std::string>& entries) {
  return parseEntries(std::vector<std::string_view>(entries.begin(), entries.end()));
}

std::vector<v1::EnvVar> mergeEnv(const std::vector<v1::EnvVar>& runtime_env,
                                 const std::vector<v1::EnvVar>& process_env) {
  // Both sorted: one merge pass; on equal names the process's entry wins.
  std::vector<v1::EnvVar> out;
  out.reserve(runtime_env.size() + process_env.size());
  auto r = runtime_env.begin();
  auto p = process_env.begin();
  while (r != runtime_env.end() || p != process_env.end()) {
    if (p == process_env.end() || (r != runtime_env.end() && r->name() < p->name())) {
      out.push_back(*r++);
    } else {
      if (r != runtime_env.end() && r->name() == p->name()) ++r;
      out.push_back(*p++);
    }
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

absl::StatusOr<v1::EnvResponse> envFor(ProcFs& procfs, pid_t pid, const v1::EnvRequest& request,
                                       const std::vector<v1::EnvVar>& runtime_env) {
  ASSIGN_OR_RETURN(std::string raw, procfs.readEnviron(pid));
  ASSIGN_OR_RETURN(std::vector<v1::EnvVar> vars, parseEnviron(raw));
  if (!runtime_env.empty()) vars = mergeEnv(runtime_env, vars);
  return filterEnv(vars, EnvFilter::fromRequest(request));
}

}  // namespace siphon::agent
