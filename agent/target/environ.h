// The target's environment as the env service answers it: the runtime's
// container env merged with /proc/PID/environ (the process wins), filtered by
// include/exclude globs, sorted by name.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/target/proc_fs.h"
#include "siphon/v1/services.pb.h"

namespace siphon::agent {

// Parses the raw bytes of /proc/PID/environ (NUL-separated NAME=VALUE).
//  - An entry without '=' or with an empty name is skipped: the process can
//    hold such junk in its initial environment, but getenv() never finds it.
//  - A value may contain '='; the name ends at the first one.
//  - A missing terminator after the last entry is tolerated; empty entries
//    are skipped.
//  - Duplicates: the first one wins, as glibc getenv() scans from the start.
//  - EnvVar fields are proto3 strings, which a peer refuses to parse unless
//    they are UTF-8: invalid sequences in a value become U+FFFD, and an entry
//    whose name is not UTF-8 is skipped (no client could name it anyway).
// The result is sorted by name (bytewise). Nothing makes it fail today; it
// returns a status, as module boundaries do, so a stricter check later does
// not change its callers.
absl::StatusOr<std::vector<v1::EnvVar>> parseEnviron(std::string_view raw);

// The same rules for an environment given as a list of "NAME=VALUE" strings,
// as container runtimes keep it (the OCI spec's process.env, Docker's
// Config.Env). The first of duplicates wins: the list becomes the execve
// envp of the container's process, where getenv() finds the first.
absl::StatusOr<std::vector<v1::EnvVar>> parseEnvList(const std::vector<std::string>& entries);

// Every name of either list (both sorted by name, as the parsers return
// them), with the process's value where both have it: /proc/PID/environ is
// what the process really started with (an entrypoint may have changed the
// runtime's value, e.g. `env FOO=x app`), while the runtime's env adds what
// the process does not show (a wrapper that cleared its environment, or a
// process started later with another one). The result is sorted by name.
std::vector<v1::EnvVar> mergeEnv(const std::vector<v1::EnvVar>& runtime_env,
                                 const std::vector<v1::EnvVar>& process_env);

// Include/exclude filter on variable names with fnmatch(3) globs (no flags:
// '*' and '?' also match '/', and a leading '.' is not special).
// An empty include list includes everything; exclude wins over include.
// A malformed pattern (e.g. an unclosed '[') is not an error: fnmatch treats
// it as it does, typically as literal characters.
class EnvFilter {
 public:
  EnvFilter() = default;
  EnvFilter(std::vector<std::string> include, std::vector<std::string> exclude);
  static EnvFilter fromRequest(const v1::EnvRequest& request);

  bool matches(std::string_view name) const;

 private:
  std::vector<std::string> include_;
  std::vector<std::string> exclude_;
};

// The vars `filter` lets through, in order (callers pass them sorted).
v1::EnvResponse filterEnv(const std::vector<v1::EnvVar>& vars, const EnvFilter& filter);

// The env of `pid`: /proc/PID/environ merged over `runtime_env` (mergeEnv),
// filtered by the request, sorted by name. Errors are those of
// ProcFs::readEnviron (NotFound, PermissionDenied, ResourceExhausted), with
// the path in the message; the runtime env alone is never a fallback, since
// an unreadable environ means the target is gone or out of reach.
absl::StatusOr<v1::EnvResponse> envFor(ProcFs& procfs, pid_t pid, const v1::EnvRequest& request,
                                       const std::vector<v1::EnvVar>& runtime_env = {});

}  // namespace siphon::agent
