#include "agent/runtime/runtime_target.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/runtime/cgroup_scan.h"
#include "agent/runtime/container_ref.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {

absl::StatusOr<std::unique_ptr<Target>> openContainerTarget(ProcFs& procfs,
                                                            RuntimeResolver& resolver,
                                                            std::string_view container) {
  pid_t last_pid = 0;
  absl::Status gone;  // the last "process gone" error, if that is how it ended
  for (int attempt = 0; attempt < kEnterAttempts; ++attempt) {
    ASSIGN_OR_RETURN(ResolvedContainer resolved, resolver.resolve(container));
    last_pid = resolved.pid;
    gone = absl::OkStatus();
    TargetSpec spec;
    spec.mode = TargetMode::kTargeted;
    spec.pid = resolved.pid;
    spec.container_id = resolved.container_id;
    spec.runtime = resolved.runtime;
    spec.runtime_env = resolved.env;
    auto target = Target::open(procfs, std::move(spec));
    if (!target.ok()) {
      // The container's process is gone: ask the runtime again (it may have
      // restarted the container); anything else is final.
      if (target.status().code() != absl::StatusCode::kNotFound) return target.status();
      gone = target.status();
      continue;
    }
    // The pidfd pins the process now: if the runtime still names this pid,
    // the pid was not reused in between.
    ASSIGN_OR_RETURN(ResolvedContainer again, resolver.resolveAgain(resolved));
    if (again.pid == resolved.pid) return target;
  }
  if (!gone.ok()) return gone;
  return absl::AbortedError(absl::StrCat(
      "container ", asv(container), " changed its process while the agent entered it (",
      kEnterAttempts, " attempts, last pid ", last_pid, "); is it restarting?"));
}

absl::StatusOr<std::unique_ptr<Target>> openEphemeralTarget(ProcFs& procfs,
                                                            std::string_view container) {
  TargetSpec base;
  base.mode = TargetMode::kEphemeral;
  if (container.empty()) {
    if (procfs.selfPid() == 1) {
      return absl::FailedPreconditionError(
          "ephemeral mode: PID 1 is the agent itself, so it does not share the target's PID "
          "namespace; run it as an ephemeral container with kubectl debug --target=CONTAINER "
          "(or in a pod with shareProcessNamespace), or give --container-id");
    }
    base.pid = 1;
    return Target::open(procfs, std::move(base));
  }

  ASSIGN_OR_RETURN(ContainerRef ref, parseContainerRef(container));
  base.container_id = ref.id;
  if (ref.runtime) base.runtime = std::string(runtimeName(*ref.runtime));
  pid_t last_pid = 0;
  absl::Status gone;
  for (int attempt = 0; attempt < kEnterAttempts; ++attempt) {
    ASSIGN_OR_RETURN(pid_t pid, findContainerPid(procfs, ref.id));
    last_pid = pid;
    gone = absl::OkStatus();
    TargetSpec spec = base;
    spec.pid = pid;
    auto target = Target::open(procfs, std::move(spec));
    if (!target.ok()) {
      if (target.status().code() != absl::StatusCode::kNotFound) return target.status();
      gone = target.status();
      continue;
    }
    // Pinned: the pid still in the container's cgroup is the same process.
    auto cgroup = procfs.readCgroup(pid);
    if (cgroup.ok() && cgroupNamesContainer(*cgroup, ref.id)) return target;
  }
  if (!gone.ok()) return gone;
  return absl::AbortedError(absl::StrCat("container ", ref.id,
                                         " changed its process while the agent entered it (",
                                         kEnterAttempts, " attempts, last pid ", last_pid, ")"));
}

}  // namespace siphon::agent::runtime
