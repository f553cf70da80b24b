// The process the agent works for, entered once at start-up: handles on its
// network namespace and root directory, and a pidfd to notice its exit.
//
// Other areas take what they need from here: the NetnsWorker setns()es into
// netnsFd(), files resolve paths against rootFd(), the main loop watches
// pidfd(). A socket or an O_PATH fd keeps its namespace or root for life, so
// these fds stay valid even after the target exits.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
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
  // The target's pid; for kTargetless the agent's own.
  pid_t pid() const { return pid_; }
  int netnsFd() const { return netns_.get(); }
  int rootFd() const { return root_.get(); }
  // -1 for kTargetless: there is no other process to watch.
  int pidfd() const { return pidfd_.get(); }
  bool hasPidfd() const { return pidfd_.valid(); }
  uint64_t netnsInode() const { return netns_inode_; }
  // "net:[4026531840]", as the kernel names the namespace in /proc/PID/ns/net
  // (and as the ready line prints it).
  std::string netnsLabel() const;
  const TargetSpec& spec() const { return spec_; }

  v1::TargetDescription describe() const;

 private:
  Target(TargetSpec spec, pid_t pid, UniqueFd pidfd, UniqueFd netns, UniqueFd root,
         uint64_t netns_inode);

  TargetSpec spec_;
  TargetMode mode_;
  pid_t pid_;
  UniqueFd pidfd_;
  UniqueFd netns_;
  UniqueFd root_;
  uint64_t netns_inode_;
};

}  // namespace siphon::agent
