// Which runtimes and sockets to ask for a container, and one answer (or one
// clear error) from all of them.
//
// --runtime auto (the default) asks every runtime at each of its known
// sockets, in order (kKnownSockets: containerd, then Docker, then CRI-O; the
// /host/... paths are where an agent pod mounts the node's /run); the first
// that finds the container wins. A "containerd://ID" style ID or --runtime
// NAME limits the search to that runtime; --runtime-endpoint PATH to that one
// socket (and then needs a runtime).
//
// When nothing finds it, the error says what every attempt answered. Its code
// is the most telling one: PermissionDenied (the agent could not look) over
// NotFound (a runtime looked and has no such container) over any other error
// over Unavailable, which is the code only when no runtime answered at all.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/runtime/container_ref.h"
#include "agent/runtime/runtime_client.h"

namespace siphon::agent::runtime {

struct RuntimeOptions {
  std::optional<RuntimeKind> runtime;  // nullopt: auto
  std::string endpoint;                // empty: the runtime's known sockets
  std::string containerd_namespace = "k8s.io";
  std::chrono::milliseconds timeout = kDefaultRuntimeTimeout;
};

// The sockets tried for `kind` when no --runtime-endpoint is given, in order.
const std::vector<std::string>& knownSockets(RuntimeKind kind);

// Makes the client for one runtime at one socket. The real one
// (realClientFactory) builds the clients of runtime_client.h; tests pass
// fakes.
using RuntimeClientFactory =
    std::function<std::unique_ptr<RuntimeClient>(RuntimeKind kind, const std::string& endpoint)>;
RuntimeClientFactory realClientFactory(const RuntimeOptions& options);

class RuntimeResolver {
 public:
  RuntimeResolver(RuntimeOptions options, RuntimeClientFactory factory);

  // Resolves `container` (a bare ID or "containerd://ID"...). Errors:
  //   InvalidArgument   a malformed ID (parseContainerRef); a prefix that
  //                     names another runtime than --runtime;
  //                     --runtime-endpoint without a runtime.
  //   others            as the summary at the top of this file.
  absl::StatusOr<ResolvedContainer> resolve(std::string_view container);

  // Asks again the runtime and socket that resolved `container` before
  // (after the agent pinned the pid, to check it still belongs to it).
  absl::StatusOr<ResolvedContainer> resolveAgain(const ResolvedContainer& container);

 private:
  RuntimeOptions options_;
  RuntimeClientFactory factory_;
};

}  // namespace siphon::agent::runtime
