// containerd's two calls the agent needs (Containers.Get for the OCI spec's
// env, Tasks.Get for the pid), over gRPC on containerd's socket.
//
// Only `siphon-containerd` (containerd_main.cc), the helper the agent runs
// for each resolution, links this and with it gRPC: the agent itself never
// loads gRPC, which mapped 2.6 MiB of library pages into every agent
// whether or not it resolved anything through containerd.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace siphon::agent::runtime {

struct ContainerdTask {
  pid_t pid = 0;
  // The container's OCI runtime spec (config.json), when containerd holds
  // one; its process.env is the container's configured env.
  std::string oci_spec;
};

// The container `id` in containerd namespace `ns` and its running (or
// paused) task. NOT_FOUND for no such container or no live task,
// PERMISSION_DENIED, UNAVAILABLE (no answer within `timeout`, containerd
// down), INTERNAL; each message names the socket and the call.
absl::StatusOr<ContainerdTask> queryContainerd(const std::string& socket, const std::string& ns,
                                               const std::string& id,
                                               std::chrono::milliseconds timeout);

// The helper's output and its reading back (containerd_answer.cc, in the
// agent). On success: "pid N\nspec LEN\n" and the spec's LEN bytes. On a
// failure: "error CODE MESSAGE" (CODE: absl::StatusCode's number).
std::string formatContainerdAnswer(const absl::StatusOr<ContainerdTask>& answer);
absl::StatusOr<ContainerdTask> parseContainerdAnswer(std::string_view out);

}  // namespace siphon::agent::runtime
