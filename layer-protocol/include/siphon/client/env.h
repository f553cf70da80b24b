// The target's environment: the container runtime's env merged with
// /proc/PID/environ. Globs are fnmatch(3) patterns on names; no include
// pattern means every variable.
//
// Threads: as the Target's (target.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/client/target.h"

namespace siphon::client {

struct EnvVar {
  std::string name;
  std::string value;
};

class Env {
 public:
  explicit Env(const Target& target);
  // Sorted by name.
  net::awaitable<absl::StatusOr<std::vector<EnvVar>>> get(std::vector<std::string> include = {},
                                                          std::vector<std::string> exclude = {});
  // One variable's value; kNotFound when the target has none of that name.
  net::awaitable<absl::StatusOr<std::string>> value(std::string name);

 private:
  std::shared_ptr<TargetCore> core_;
};

}  // namespace siphon::client
