// From a container to an open Target, in the two modes that name one:
//   targeted --container-id ID  the runtime says which pid (RuntimeResolver)
//   ephemeral [--container-id ID]  the agent shares the pod's PID namespace
//                               and finds the pid by cgroup (cgroup_scan.h),
//                               or takes PID 1
//
// Between learning the pid and opening it, the process may exit and its pid
// be reused. Target::open pins the process with a pidfd; asking again
// afterwards (the runtime, or the pid's cgroup) proves the pinned process is
// the container's. If the answer changed (the container restarted), the
// whole step is retried, up to kEnterAttempts times.
#pragma once

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/runtime/resolver.h"
#include "agent/target/proc_fs.h"
#include "agent/target/target.h"

namespace siphon::agent::runtime {

inline constexpr int kEnterAttempts = 3;

// targeted --container-id: resolves `container` and opens its process as a
// kTargeted Target whose spec carries the container ID, the runtime's name
// and the runtime's env. Errors: those of RuntimeResolver::resolve and of
// Target::open; Aborted when the container kept changing its pid.
absl::StatusOr<std::unique_ptr<Target>> openContainerTarget(ProcFs& procfs,
                                                            RuntimeResolver& resolver,
                                                            std::string_view container);

// ephemeral: with an empty `container`, PID 1 of the agent's PID namespace;
// else the process findContainerPid() finds for the ID of `container` (bare
// or "containerd://ID"; the prefix only names the runtime in describe()).
// No runtime env: an ephemeral agent has no runtime socket.
// Errors: InvalidArgument for a malformed ID; NotFound from the scan;
// FailedPrecondition when PID 1 is the agent itself (it does not share the
// target's PID namespace); those of Target::open.
absl::StatusOr<std::unique_ptr<Target>> openEphemeralTarget(ProcFs& procfs,
                                                            std::string_view container);

}  // namespace siphon::agent::runtime
