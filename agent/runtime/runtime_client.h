// agent/runtime: turning a container ID into the target process, through the
// container runtime that runs it.
//
//   runtime_client.h  RuntimeClient: one runtime at one socket (this file),
//                     and the real clients: containerd (gRPC), Docker and
//                     CRI-O (HTTP over the unix socket)
//   container_ref.h   "ID" / "containerd://ID" / "docker://ID" / "cri-o://ID"
//   resolver.h        which runtimes and sockets to ask (--runtime auto...)
//   runtime_target.h  resolve, then open the Target (targeted and ephemeral)
//   cgroup_scan.h     ephemeral mode: the container's process from /proc/*/cgroup
//   unix_http.h       HTTP/1.1 GET over a unix socket (Docker, CRI-O)
//   json.h, inspect.h reading the runtimes' JSON answers
//
// Resolution happens once, at start-up, before the event loop runs: every
// client here is synchronous and bounded by its timeout.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/v1/services.pb.h"

namespace siphon::agent::runtime {

enum class RuntimeKind { kContainerd, kDocker, kCrio };

// "containerd", "docker", "cri-o": the names of --runtime and of the
// Kubernetes containerID prefixes ("cri-o://").
std::string_view runtimeName(RuntimeKind kind);
// The inverse; InvalidArgument for anything else ("auto" included: callers
// handle it first).
absl::StatusOr<RuntimeKind> parseRuntimeName(std::string_view name);

// What a runtime says about a running container.
struct ResolvedContainer {
  pid_t pid = 0;  // the container's init process, in the agent's PID namespace
  // The container's configured environment, sorted by name (parseEnvList):
  // containerd's OCI spec process.env, Docker's Config.Env. Empty for CRI-O,
  // whose inspect endpoint has no env.
  std::vector<v1::EnvVar> env;
  std::string runtime;       // runtimeName()
  std::string container_id;  // as the runtime names it (Docker: the full ID)
  std::string endpoint;      // the socket that answered
};

// One runtime behind one unix socket.
//
// resolve() errors; each message names the runtime, the socket and the ID,
// e.g. "container abc not found in containerd namespace k8s.io
// (/run/containerd/containerd.sock)":
//   NotFound          no such container, or it has no running process.
//   PermissionDenied  the socket refuses the agent (EACCES on connect, or the
//                     runtime's own permission error).
//   Unavailable       nothing to talk to: no socket at the path, nobody
//                     listening, or no answer within the timeout.
//   InvalidArgument   the socket path is too long for a unix address.
//   Internal          the runtime answered something this client cannot read
//                     (malformed JSON, an unexpected HTTP status).
// Blocking; call from one thread at a time.
class RuntimeClient {
 public:
  virtual ~RuntimeClient() = default;
  virtual RuntimeKind kind() const = 0;
  virtual const std::string& endpoint() const = 0;
  virtual absl::StatusOr<ResolvedContainer> resolve(std::string_view container_id) = 0;
};

// How long one resolve() may take in all (connect, request, answer).
inline constexpr std::chrono::milliseconds kDefaultRuntimeTimeout{10000};

// containerd: Containers.Get (the OCI spec, for the env) and Tasks.Get (the
// pid) over gRPC, in `ns` (sent as the "containerd-namespace" metadata).
std::unique_ptr<RuntimeClient> makeContainerdClient(
    std::string socket, std::string ns, std::chrono::milliseconds timeout = kDefaultRuntimeTimeout);

// Docker Engine: GET /containers/{id}/json (State.Pid, State.Running,
// Config.Env, Id).
std::unique_ptr<RuntimeClient> makeDockerClient(
    std::string socket, std::chrono::milliseconds timeout = kDefaultRuntimeTimeout);

// CRI-O's info endpoint: GET /containers/{id} (pid). No env.
std::unique_ptr<RuntimeClient> makeCrioClient(
    std::string socket, std::chrono::milliseconds timeout = kDefaultRuntimeTimeout);

}  // namespace siphon::agent::runtime
