#include "agent/target/target.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

// What a privileged agent lacks when /proc of another process says EACCES or
// EPERM: setns() needs CAP_SYS_ADMIN, and /proc/PID/{ns,root,environ} of a
// process of another user need ptrace read access, i.e. CAP_SYS_PTRACE.
constexpr char kCapsHint[] = " (the agent needs CAP_SYS_ADMIN and CAP_SYS_PTRACE)";

// `status` with another message; code and payloads (the errno) are kept.
absl::Status withMessage(const absl::Status& status, std::string_view message) {
  absl::Status out(status.code(), absl::string_view(message.data(), message.size()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::Status notExist(pid_t pid) {
  return absl::NotFoundError(absl::StrCat("target process ", pid, " does not exist"));
}

// Turns the failure of one step of entering `pid` into the operator's message.
absl::Status explain(ProcFs& procfs, pid_t pid, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      if (!procfs.processExists(pid)) return notExist(pid);
      // /proc/PID is still there but its namespaces are not: a zombie.
      return withMessage(
          status, absl::StrCat("target process ", pid, " has exited (", status.message(), ")"));
    case absl::StatusCode::kPermissionDenied:
      return withMessage(status, absl::StrCat(status.message(), kCapsHint));
    default:
      return status;
  }
}

}  // namespace

std::string_view targetModeName(TargetMode mode) {
  switch (mode) {
    case TargetMode::kTargeted:
      return "targeted";
    case TargetMode::kEphemeral:
      return "ephemeral";
    case TargetMode::kTargetless:
      return "targetless";
  }
  return "unknown";
}

absl::StatusOr<TargetMode> parseTargetMode(std::string_view name) {
  for (TargetMode m : {TargetMode::kTargeted, TargetMode::kEphemeral, TargetMode::kTargetless}) {
    if (targetModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown target mode \"", absl::string_view(name.data(), name.size()),
                   "\" (expected targeted, ephemeral or targetless)"));
}

Target::Target(TargetSpec spec, pid_t pid, UniqueFd pidfd, UniqueFd netns, UniqueFd root,
               uint64_t netns_inode)
    : spec_(std::move(spec)),
      mode_(spec_.mode),
      pid_(pid),
      pidfd_(std::move(pidfd)),
      netns_(std::move(netns)),
      root_(std::move(root)),
      netns_inode_(netns_inode) {
  runtime_env_ = spec_.runtime_env;
}

absl::StatusOr<std::unique_ptr<Target>> Target::open(ProcFs& procfs, TargetSpec spec) {
  if (spec.mode == TargetMode::kTargetless) {
    if (spec.pid != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("targetless mode takes no target pid (got ", spec.pid, ")"));
    }
    const pid_t self = procfs.selfPid();
    ASSIGN_OR_RETURN(UniqueFd netns, procfs.openNetns(self));
    ASSIGN_OR_RETURN(UniqueFd root, procfs.openRoot(self));
    ASSIGN_OR_RETURN(uint64_t inode, procfs.inodeOf(netns.get()));
    return std::unique_ptr<Target>(
        new Target(std::move(spec), self, UniqueFd(), std::move(netns), std::move(root), inode));
  }

  const pid_t pid = spec.pid;
  if (pid <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("target pid must be a positive process id (got ", pid, ") in ",
                     std::string(targetModeName(spec.mode)), " mode"));
  }

  // The pidfd comes first: it pins this process. If the process is still
  // alive after the /proc opens below, its pid was never recycled in between,
  // so the netns and root fds belong to it and not to a newcomer.
  auto pidfd = procfs.openPidfd(pid);
  if (!pidfd.ok()) return explain(procfs, pid, pidfd.status());
  auto netns = procfs.openNetns(pid);
  if (!netns.ok()) return explain(procfs, pid, netns.status());
  auto root = procfs.openRoot(pid);
  if (!root.ok()) return explain(procfs, pid, root.status());
  ASSIGN_OR_RETURN(uint64_t inode, procfs.inodeOf(netns->get()));

  ASSIGN_OR_RETURN(bool exited, procfs.hasExited(pidfd->get()));
  if (exited) {
    return absl::NotFoundError(
        absl::StrCat("target process ", pid, " has exited while the agent was entering it"));
  }
  return std::unique_ptr<Target>(new Target(std::move(spec), pid, std::move(*pidfd),
                                            std::move(*netns), std::move(*root), inode));
}

std::vector<v1::EnvVar> Target::runtimeEnv() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runtime_env_;
}

absl::Status Target::adopt(std::unique_ptr<Target> next) {
  if (next->netns_inode_ != netns_inode_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the target's new process ", next->pid(), " is in network namespace net:[",
        next->netns_inode_, "], not net:[", netns_inode_, "]: the pod was recreated"));
  }
  // dup3 replaces what the number names in one step: a reader holding the
  // number sees the old root or the new one, never a closed or reused fd.
  if (::dup3(next->root_.get(), root_.get(), O_CLOEXEC) < 0) {
    return lastErrnoStatus("adopting the target's new root: dup3");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The pid and the pidfd change together for identity().
    pidfd_ = std::move(next->pidfd_);
    runtime_env_ = std::move(next->spec_.runtime_env);
    pid_.store(next->pid(), std::memory_order_release);
  }
  restarts_.fetch_add(1, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::StatusOr<TargetIdentity> Target::identity(ProcFs& procfs) const {
  if (mode_ == TargetMode::kTargetless) {
    return absl::FailedPreconditionError("targetless: there is no target process");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const pid_t pid = pid_.load(std::memory_order_acquire);
  auto down = [pid] {
    return errnoRefusal(EAGAIN, absl::StrCat("the target process ", pid,
                                             " has exited: file access waits for its "
                                             "container's next process"));
  };
  // Asked first too, only for the clearer error: a pid freed already may
  // be another process's, whose /proc then reads fine.
  ASSIGN_OR_RETURN(bool exited, procfs.hasExited(pidfd_.get()));
  if (exited) return down();
  TargetIdentity id;
  id.pid = pid;
  auto status = procfs.readStatus(pid);
  auto ns = procfs.userNamespace(pid);
  auto ours = procfs.userNamespace(procfs.selfPid());
  // The pin: alive now, so alive through the reads above.
  ASSIGN_OR_RETURN(exited, procfs.hasExited(pidfd_.get()));
  if (exited) return down();
  if (!status.ok()) return status.status();
  if (!ns.ok()) return ns.status();
  if (!ours.ok()) return ours.status();
  ASSIGN_OR_RETURN(id.credentials, parseProcStatus(*status));
  id.in_agent_user_namespace = *ns == *ours;
  return id;
}

std::string Target::netnsLabel() const { return absl::StrCat("net:[", netns_inode_, "]"); }

v1::TargetDescription Target::describe() const {
  v1::TargetDescription d;
  d.set_mode(std::string(targetModeName(mode_)));
  d.set_pid(static_cast<int32_t>(pid()));
  d.set_netns_inode(netns_inode_);
  d.set_container_id(spec_.container_id);
  d.set_runtime(spec_.runtime);
  return d;
}

}  // namespace siphon::agent
