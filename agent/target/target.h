// The process the agent works for, entered once at start-up: handles on its
// network namespace and root directory, and a pidfd to notice its exit.
//
// Other areas take what they need from here: the NetnsWorker setns()es into
// netnsFd(), files resolve paths against rootFd(), the main loop watches
// pidfd(). A socket or an O_PATH fd keeps its namespace or root for life, so
// these fds stay valid even after the target exits.
//
// A restarted container (same pod, so the same network namespace; a new
// process and a new root) is adopted in place (adopt()): rootFd() keeps its
// number, which then names the new root, so whoever holds the number reads
// the new container's files from then on without being told; pid(),
// runtimeEnv() and identity() answer for the new process. What holds more
// than the number (the file helper, a copy of the root) is told by the
// server.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/target/credentials.h"
#include "agent/target/proc_fs.h"
#include "siphon/v1/handshake.pb.h"
#include "siphon/v1/services.pb.h"

namespace siphon::agent {

enum class TargetMode {
  kTargeted,    // a PID on the node (from --pid or a container runtime)
  kEphemeral,   // an ephemeral container inside the target pod; as kTargeted
  kTargetless,  // no target: the agent's own namespaces
};

// "targeted", "ephemeral", "targetless" (the TargetDescription.mode strings).
std::string_view targetModeName(TargetMode mode);
// The inverse; InvalidArgument for anything else.
absl::StatusOr<TargetMode> parseTargetMode(std::string_view name);

struct TargetSpec {
  TargetMode mode = TargetMode::kTargeted;
  pid_t pid = 0;  // > 0 for kTargeted/kEphemeral, 0 for kTargetless
  // Only reported in describe(); resolving them to a pid happens elsewhere
  // (agent/runtime/).
  std::string container_id;
  std::string runtime;  // "containerd", "docker", "cri-o", or empty
  // The container's environment as its runtime configured it (sorted by
  // name); the env service merges it under /proc/PID/environ. Empty when the
  // target did not come from a runtime, or the runtime does not tell (CRI-O).
  std::vector<v1::EnvVar> runtime_env;
};

// Whose identity the file helper takes (agent/files/fs_helper.h): the
// target process's credentials and whether it shares the agent's user
// namespace, read while the target's pidfd pinned it (Target::identity).
struct TargetIdentity {
  pid_t pid = 0;
  Credentials credentials;
  // The helper takes ids as numbers of the agent's user namespace; a
  // target in another one would need its uid_map (not supported).
  bool in_agent_user_namespace = true;
};

class Target {
 public:
  // Opens the target's pidfd, netns and root.
  //
  // Errors, each with a message meant for the operator:
  //   InvalidArgument   pid <= 0 when a target is needed, or a pid given with
  //                     kTargetless.
  //   NotFound          "target process 4242 does not exist", or "... has
  //                     exited" (a zombie, or it died while being entered).
  //   PermissionDenied  "open /proc/4242/ns/net: Permission denied (the agent
  //                     needs CAP_SYS_ADMIN and CAP_SYS_PTRACE)".
  //   Unimplemented     no pidfd_open (kernel older than 5.3).
  // A targeted target requires a pidfd: the agent must exit with its target,
  // and every other kernel feature it uses (sk_lookup: 5.9) is newer anyway.
  // Kernel errors keep their errno payload (siphon/status.h).
  static absl::StatusOr<std::unique_ptr<Target>> open(ProcFs& procfs, TargetSpec spec);

  TargetMode mode() const { return mode_; }
  // The target's pid; for kTargetless the agent's own. Any thread.
  pid_t pid() const { return pid_.load(std::memory_order_acquire); }
  int netnsFd() const { return netns_.get(); }
  // The same number for the agent's life (adopt() moves it to a new root).
  int rootFd() const { return root_.get(); }
  // -1 for kTargetless: there is no other process to watch. The event
  // loop's only: adopt() replaces it.
  int pidfd() const { return pidfd_.get(); }
  bool hasPidfd() const { return pidfd_.valid(); }
  // The container's env from its runtime (TargetSpec::runtime_env) of the
  // process now adopted. Any thread.
  std::vector<v1::EnvVar> runtimeEnv() const;
  // The identity of the process that is the target now: its /proc/PID
  // status and user namespace, read while the pidfd pins it. The reads go
  // by pid number, so the pidfd is asked afterwards whether the process
  // still lives: if it does, the pid was never free in between and the
  // numbers are its own, never those of a process that reused the pid.
  // Read at each call (a target may change its ids after its start, as an
  // entrypoint that drops root does), on the pidfd of the process adopted
  // last.
  //   Unavailable (errno EAGAIN)  the target process has exited: between a
  //                     container's restart and the adoption of its next
  //                     process (or for good). Nobody's identity is lent.
  //   FailedPrecondition targetless: there is no other process.
  //   the reads' errors otherwise (NotFound, InvalidArgument for a status
  //   that does not parse).
  // `procfs`: the /proc the target was opened through. Any thread.
  absl::StatusOr<TargetIdentity> identity(ProcFs& procfs) const;
  // How many restarts were adopted.
  uint32_t restarts() const { return restarts_.load(std::memory_order_acquire); }

  // Makes `next` (the same container's new process, opened by open()) the
  // target: its pid, pidfd, root (dup3()ed onto rootFd()'s number) and
  // runtime env. FailedPrecondition, and nothing changes, when `next` is in
  // another network namespace (the pod itself is gone or was recreated:
  // the steering and sockets made in this one would serve no one).
  absl::Status adopt(std::unique_ptr<Target> next);
  uint64_t netnsInode() const { return netns_inode_; }
  // "net:[4026531840]", as the kernel names the namespace in /proc/PID/ns/net
  // (and as the ready line prints it).
  std::string netnsLabel() const;
  // As opened (the first process's pid and env: see pid(), runtimeEnv()).
  const TargetSpec& spec() const { return spec_; }

  v1::TargetDescription describe() const;

 private:
  Target(TargetSpec spec, pid_t pid, UniqueFd pidfd, UniqueFd netns, UniqueFd root,
         uint64_t netns_inode);

  TargetSpec spec_;  // as opened; never changes
  mutable std::mutex mu_;
  std::vector<v1::EnvVar> runtime_env_;  // under mu_: adopt() replaces it
  TargetMode mode_;
  std::atomic<pid_t> pid_;
  UniqueFd pidfd_;  // replaced by adopt() under mu_ (identity() reads it there)
  UniqueFd netns_;
  UniqueFd root_;
  uint64_t netns_inode_;
  std::atomic<uint32_t> restarts_{0};
};

}  // namespace siphon::agent
