// How many inotify watches and instances the agent's file watches
// (file_watches.h) may hold, all sessions together: --max-file-watches and
// --max-file-watch-instances, checked against what the node allows.
//
// Why agent-wide: the kernel's inotify limits (fs.inotify.max_user_watches,
// max_user_instances) are per user, and on a node the user is often uid 0,
// whose budget kubelet, containerd and systemd share: a client watching
// without end would starve them (their own watches fail ENOSPC/EMFILE).
// The file helper makes the instances with the target's identity, so the
// kernel charges them to the target's user (file_system.h); for a target
// that runs as uid 0 that is still uid 0's budget, so the agent's own cap
// is what keeps the node's components whole. The defaults take a quarter
// of each node limit; a flag may take more, never past the node's limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace siphon::agent::files {

// Where the node's inotify limits are read (init user namespace's).
inline constexpr char kInotifySysctlDir[] = "/proc/sys/fs/inotify";

// The kernel's own defaults, assumed when the sysctls cannot be read.
inline constexpr uint64_t kKernelDefaultMaxUserWatches = 8192;
inline constexpr uint64_t kKernelDefaultMaxUserInstances = 128;

struct NodeInotifyLimits {
  uint64_t max_user_watches = kKernelDefaultMaxUserWatches;
  uint64_t max_user_instances = kKernelDefaultMaxUserInstances;
};

// max_user_watches and max_user_instances under `dir`; a file that is
// missing or does not hold a positive number keeps the kernel's default.
NodeInotifyLimits readNodeInotifyLimits(const std::string& dir = kInotifySysctlDir);

struct WatchBudget {
  uint32_t watches = 0;    // watches of all sessions together
  uint32_t instances = 0;  // inotify instances (one per watching session)
};

// The agent's budget on a node with `node`'s limits: each flag given
// (`watches`, `instances`), or a quarter of the node's limit (at least
// 1). InvalidArgument naming the flag for 0 or a value above the node's
// limit ("--max-file-watches 100000: above this node's
// fs.inotify.max_user_watches (8192), which the node's other processes of
// the same user share").
absl::StatusOr<WatchBudget> watchBudget(std::optional<uint64_t> watches,
                                        std::optional<uint64_t> instances,
                                        const NodeInotifyLimits& node);

}  // namespace siphon::agent::files
