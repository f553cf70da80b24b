// The runtimes' answers, parsed (exposed for tests; the clients use them).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent::runtime {

// Docker Engine, GET /containers/{id}/json (the fields the agent reads).
struct DockerInspect {
  std::string id;                // "Id": the full 64-hex ID
  bool running = false;          // "State.Running" (true while paused too)
  pid_t pid = 0;                 // "State.Pid", when running
  std::vector<std::string> env;  // "Config.Env" ("NAME=VALUE"; null is empty)
};
// InvalidArgument naming the field for malformed JSON or a field of the
// wrong type (a running container without a valid State.Pid included).
absl::StatusOr<DockerInspect> parseDockerInspect(std::string_view body);

// CRI-O, GET /containers/{id} on its socket: {"name", "pid", "image",
// "sandbox", "labels", "annotations", ...}; no env. "pid" is 0 for a
// container that is not running.
struct CrioInspect {
  pid_t pid = 0;  // 0: not running
};
absl::StatusOr<CrioInspect> parseCrioInspect(std::string_view body);

// The "process.env" list of an OCI runtime spec (config.json), as
// containerd stores it in Container.spec. A spec without a process (or
// without env) has an empty env.
absl::StatusOr<std::vector<std::string>> parseOciSpecEnv(std::string_view spec_json);

}  // namespace siphon::agent::runtime
