// Least privilege: the capabilities siphon-agent keeps after start-up, and
// the start-up drop itself (docs/SECURITY.md, "Capabilities").
//
// planCapabilities() is pure: from the mode and flags it says which
// capabilities the agent keeps (permitted = effective), which of them its
// iptables children get through the ambient set, and why each is kept.
// dropCapabilities() applies a plan to the calling process. It must run
// while the process has one thread: capabilities, the bounding set and the
// securebits are per thread, so a thread started before the drop would keep
// everything.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/server/config.h"
#include "agent/target/target.h"

namespace siphon::agent::caps {

// Bit N stands for capability N (CAP_* of <linux/capability.h>).
using CapSet = uint64_t;

constexpr CapSet bit(int cap) { return CapSet{1} << cap; }

// "CAP_SYS_ADMIN" for 21; "CAP_42" for one this build does not name.
std::string capName(int cap);
// Names in capability order, joined by ',' ("" for none).
std::string formatCapSet(CapSet set);

// What the agent will do, as far as capabilities go.
struct Needs {
  TargetMode mode = TargetMode::kTargeted;
  FsMode fs_mode = FsMode::kReadOnly;
  std::string steal_backend = "auto";  // --steal-backend: auto, sk_lookup, iptables
  std::string iptables_mode = "auto";  // --iptables: auto, nft, legacy
  int listen_port = 0;                 // --listen's port (0: picked by the kernel)
};

struct Plan {
  CapSet keep = 0;         // permitted, effective and bounding set
  CapSet inheritable = 0;  // what children may be given (a subset of keep)
  // One line per kept capability: "CAP_X: reason".
  std::vector<std::string> reasons;
};

absl::StatusOr<Plan> planCapabilities(const Needs& needs);

// What the children get in their ambient set (each also needs it in the
// agent's inheritable set, see Plan::inheritable). An iptables run: the
// netns was entered before exec; iptables-nft talks nfnetlink
// (CAP_NET_ADMIN), iptables-legacy opens a raw socket (CAP_NET_RAW) to
// setsockopt its tables (CAP_NET_ADMIN).
constexpr CapSet kIptablesAmbient = bit(12) /*NET_ADMIN*/ | bit(13) /*NET_RAW*/;
// The iptables guard (the agent binary re-executed) enters the netns
// itself (setns: CAP_SYS_ADMIN) and then runs iptables.
constexpr CapSet kGuardAmbient = kIptablesAmbient | bit(21) /*SYS_ADMIN*/;
// The file helper (the agent binary re-executed, agent/files/fs_helper.h)
// takes the target's ids (CAP_SETUID, CAP_SETGID) and keeps of the file
// capabilities only those the target has itself (or, --fs-identity root,
// all of them). Never CAP_SYS_PTRACE or CAP_SYS_ADMIN.
constexpr CapSet kFsHelperAmbient = bit(6) /*SETGID*/ | bit(7) /*SETUID*/ | bit(0) /*CHOWN*/ |
                                    bit(1) /*DAC_OVERRIDE*/ | bit(2) /*DAC_READ_SEARCH*/ |
                                    bit(3) /*FOWNER*/ | bit(4) /*FSETID*/;

// Raises `set` into the calling thread's ambient set, one capability at a
// time, ignoring those that cannot be raised (not permitted or not
// inheritable: then the agent runs without the drop, as root, and the child
// gets root's capabilities from exec, or the exec'd program fails with its
// own EPERM). Async-signal-safe: for a forked child before execve().
void raiseAmbient(CapSet set) noexcept;

// Removes `set` from the calling thread's ambient, inheritable, effective
// and permitted sets, for good (the iptables guard, once in the netns, has
// no more use for CAP_SYS_ADMIN and must not pass it to iptables).
absl::Status dropFromAll(CapSet set);

struct DropResult {
  CapSet kept = 0;     // the effective set after the drop
  CapSet missing = 0;  // in the plan but not permitted at start
  bool bounding_dropped = false;
  bool securebits_set = false;
  std::vector<std::string> warnings;  // what could not be done, and why
};

// Drops everything outside plan.keep from the bounding, permitted,
// effective, inheritable and ambient sets and sets SECBIT_NOROOT (locked)
// so that exec'ing a root-owned binary gives back nothing. Tolerates a
// partial starting set: what is missing is reported, never an error.
// Without CAP_SETPCAP the bounding set and securebits stay (a warning).
// Fails only if the process has more than one thread or capset() fails.
absl::StatusOr<DropResult> dropCapabilities(const Plan& plan);

// The calling thread's sets, from /proc/self/status-equivalent capget().
struct CurrentSets {
  CapSet effective = 0, permitted = 0, inheritable = 0;
};
absl::StatusOr<CurrentSets> currentSets();

}  // namespace siphon::agent::caps
