// Ephemeral mode: which process of the pod belongs to a container, from the
// cgroup paths in /proc/PID/cgroup. Every runtime puts a container's
// processes in a cgroup named after its ID:
//   containerd (systemd driver)  .../kubepods-burstable-pod<UID>.slice/cri-containerd-<ID>.scope
//   CRI-O (systemd driver)       .../crio-<ID>.scope (also .../crio-<ID>.scope/container)
//   Docker (systemd / cgroupfs)  /system.slice/docker-<ID>.scope, /docker/<ID>
//   kubelet cgroupfs driver      /kubepods/burstable/pod<UID>/<ID>
//   podman                       .../libpod-<ID>.scope
// with cgroup v1 ("4:memory:/docker/<ID>", one line per hierarchy) or v2
// ("0::/..."). Inside a private cgroup namespace (an ephemeral container
// under cgroup v2) other containers' paths start with "/.." but still end in
// the same component.
#pragma once

#include <sys/types.h>

#include <string_view>

#include "absl/status/statusor.h"
#include "agent/target/proc_fs.h"

namespace siphon::agent::runtime {

// Whether a path component of any line of `cgroup_file` (/proc/PID/cgroup)
// names container `id` exactly: the component itself, or it without one of
// the runtime prefixes above and a ".scope" suffix. CRI-O's monitor
// ("crio-conmon-<ID>.scope") is not the container. `id` must be non-empty.
bool cgroupNamesContainer(std::string_view cgroup_file, std::string_view id);

// The lowest pid (the container's first process, in practice its init) that
// cgroupNamesContainer() finds among procfs.listPids(), the agent's own pid
// excluded. Processes that exit during the scan are skipped.
// NotFound when none does, saying how many processes were looked at and that
// the agent must share the target's PID namespace; errors of listPids() as
// they are.
absl::StatusOr<pid_t> findContainerPid(ProcFs& procfs, std::string_view id);

}  // namespace siphon::agent::runtime
