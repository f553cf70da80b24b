#include "agent/common/capabilities.h"

#include <dirent.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "agent/common/unique_fd.h"
#include "siphon/status.h"

namespace siphon::agent::caps {
namespace {

constexpr std::array<const char*, 41> kNames = {"CAP_CHOWN",
                                                "CAP_DAC_OVERRIDE",
                                                "CAP_DAC_READ_SEARCH",
                                                "CAP_FOWNER",
                                                "CAP_FSETID",
                                                "CAP_KILL",
                                                "CAP_SETGID",
                                                "CAP_SETUID",
                                                "CAP_SETPCAP",
                                                "CAP_LINUX_IMMUTABLE",
                                                "CAP_NET_BIND_SERVICE",
                                                "CAP_NET_BROADCAST",
                                                "CAP_NET_ADMIN",
                                                "CAP_NET_RAW",
                                                "CAP_IPC_LOCK",
                                                "CAP_IPC_OWNER",
                                                "CAP_SYS_MODULE",
                                                "CAP_SYS_RAWIO",
                                                "CAP_SYS_CHROOT",
                                                "CAP_SYS_PTRACE",
                                                "CAP_SYS_PACCT",
                                                "CAP_SYS_ADMIN",
                                                "CAP_SYS_BOOT",
                                                "CAP_SYS_NICE",
                                                "CAP_SYS_RESOURCE",
                                                "CAP_SYS_TIME",
                                                "CAP_SYS_TTY_CONFIG",
                                                "CAP_MKNOD",
                                                "CAP_LEASE",
                                                "CAP_AUDIT_WRITE",
                                                "CAP_AUDIT_CONTROL",
                                                "CAP_SETFCAP",
                                                "CAP_MAC_OVERRIDE",
                                                "CAP_MAC_ADMIN",
                                                "CAP_SYSLOG",
                                                "CAP_WAKE_ALARM",
                                                "CAP_BLOCK_SUSPEND",
                                                "CAP_AUDIT_READ",
                                                "CAP_PERFMON",
                                                "CAP_BPF",
                                                "CAP_CHECKPOINT_RESTORE"};
static_assert(CAP_CHECKPOINT_RESTORE == kNames.size() - 1, "capability names out of step");

bool has(CapSet set, int cap) { return (set & bit(cap)) != 0; }

struct RawSets {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
};

CapSet join(uint32_t lo, uint32_t hi) { return CapSet{lo} | (CapSet{hi} << 32); }

absl::Status capsetRaw(const CurrentSets& sets) {
  RawSets raw;
  raw.data[0].effective = static_cast<uint32_t>(sets.effective);
  raw.data[1].effective = static_cast<uint32_t>(sets.effective >> 32);
  raw.data[0].permitted = static_cast<uint32_t>(sets.permitted);
  raw.data[1].permitted = static_cast<uint32_t>(sets.permitted >> 32);
  raw.data[0].inheritable = static_cast<uint32_t>(sets.inheritable);
  raw.data[1].inheritable = static_cast<uint32_t>(sets.inheritable >> 32);
  if (::syscall(SYS_capset, &raw.header, raw.data) != 0) {
    return lastErrnoStatus(absl::StrCat("capset(permitted=", formatCapSet(sets.permitted),
                                        " inheritable=", formatCapSet(sets.inheritable), ")"));
  }
  return absl::OkStatus();
}

// Threads of this process, from /proc/self/task.
absl::StatusOr<int> threadCount() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return lastErrnoStatus("open /proc/self/task");
  int n = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n;
}

// The highest capability this kernel knows: PR_CAPBSET_READ says EINVAL past it.
int lastCap() {
  int last = -1;
  for (int cap = 0; cap < 64 && ::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; ++cap) last = cap;
  return last;
}

}  // namespace

std::string capName(int cap) {
  if (cap >= 0 && static_cast<size_t>(cap) < kNames.size()) return kNames[cap];
  return absl::StrCat("CAP_", cap);
}

std::string formatCapSet(CapSet set) {
  std::string out;
  for (int cap = 0; cap < 64; ++cap) {
    if (!has(set, cap)) continue;
    if (!out.empty()) out += ',';
    out += capName(cap);
  }
  return out;
}

absl::StatusOr<Plan> planCapabilities(const Needs& needs) {
  const std::string& backend = needs.steal_backend;
  if (backend != "auto" && backend != "sk_lookup" && backend != "iptables") {
    return absl::InvalidArgumentError(absl::StrCat("unknown steal backend \"", backend, "\""));
  }
  const std::string& flavor = needs.iptables_mode;
  if (flavor != "auto" && flavor != "nft" && flavor != "legacy") {
    return absl::InvalidArgumentError(absl::StrCat("unknown iptables flavour \"", flavor, "\""));
  }
  Plan plan;
  auto keep = [&plan](int cap, std::string_view why) {
    plan.keep |= bit(cap);
    plan.reasons.push_back(absl::StrCat(capName(cap), ": ", asv(why)));
  };
  const bool has_target = needs.mode != TargetMode::kTargetless;
  const bool iptables = backend != "sk_lookup";

  // Every mode: the mirror engine, the steal listeners and the iptables
  // children enter the netns of the target (targetless: the agent's own,
  // through the same fd, and setns asks for it even then).
  keep(CAP_SYS_ADMIN,
       "setns(CLONE_NEWNET) into the target's netns (netns worker, mirror engine thread, "
       "iptables children); it also passes bpf_capable() and perfmon_capable() for loading "
       "the TC and sk_lookup programs, so CAP_BPF and CAP_PERFMON add nothing");
  keep(CAP_NET_ADMIN,
       "TC attach of the mirror program (netlink/tcx), SOCK_DESTROY of a stolen port's "
       "connections (sock_diag), SO_MARK of the iptables passthrough sockets, and the iptables "
       "children (nfnetlink, IPT_SO_SET_REPLACE)");
  keep(CAP_NET_RAW,
       "AF_PACKET sockets of capture; the raw socket iptables-legacy sets its tables through "
       "(also for the start-up removal of stale chains)");
  if (has_target) {
    keep(CAP_SYS_PTRACE,
         "ptrace read access to the target for /proc/PID/environ (and /proc/PID/root, ns/net "
         "at start): needed when the target has another uid or capabilities the agent lacks");
  }
  if (has_target || needs.fs_mode != FsMode::kOff) {
    keep(CAP_DAC_READ_SEARCH,
         has_target ? "open /proc/PID/environ (mode 0400, owned by the target's uid); read and "
                      "search files of other users in the target's root"
                    : "read and search files of other users in the agent's root (--fs-mode)");
  }
  if (needs.fs_mode == FsMode::kReadWrite) {
    keep(CAP_DAC_OVERRIDE, "--fs-mode rw: write, create and delete files of other users");
    keep(CAP_FOWNER,
         "--fs-mode rw: chmod and utimes on files of other users, unlink in sticky dirs");
    keep(CAP_CHOWN, "--fs-mode rw: chown");
    keep(CAP_FSETID, "--fs-mode rw: chmod keeps the setgid bit of another group's file");
  }
  if (needs.fs_mode != FsMode::kOff) {
    keep(CAP_SETUID,
         "--fs-mode: the file helper takes the target's uid (setresuid) before it serves a "
         "file (passed to it in the ambient set only)");
    keep(CAP_SETGID, "--fs-mode: the file helper takes the target's gids (setresgid, setgroups)");
  }
  if (needs.listen_port > 0 && needs.listen_port < 1024) {
    keep(CAP_NET_BIND_SERVICE, "--listen on a port below 1024");
  }
  // Whatever the backend, the agent removes at start the chains a killed
  // predecessor left (iptables-save and -restore of both flavours); only
  // the iptables backend starts the guard, which enters the netns itself.
  plan.inheritable = (iptables ? kGuardAmbient : kIptablesAmbient) & plan.keep;
  if (needs.fs_mode != FsMode::kOff) plan.inheritable |= kFsHelperAmbient & plan.keep;
  return plan;
}

void raiseAmbient(CapSet set) noexcept {
  for (int cap = 0; cap < 64; ++cap) {
    if (has(set, cap)) ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0);
  }
}

absl::StatusOr<CurrentSets> currentSets() {
  RawSets raw;
  if (::syscall(SYS_capget, &raw.header, raw.data) != 0) return lastErrnoStatus("capget");
  return CurrentSets{join(raw.data[0].effective, raw.data[1].effective),
                     join(raw.data[0].permitted, raw.data[1].permitted),
                     join(raw.data[0].inheritable, raw.data[1].inheritable)};
}

absl::Status dropFromAll(CapSet set) {
  for (int cap = 0; cap < 64; ++cap) {
    if (has(set, cap)) ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, cap, 0, 0);
  }
  ASSIGN_OR_RETURN(CurrentSets now, currentSets());
  return capsetRaw({now.effective & ~set, now.permitted & ~set, now.inheritable & ~set});
}

absl::StatusOr<DropResult> dropCapabilities(const Plan& plan) {
  ASSIGN_OR_RETURN(int threads, threadCount());
  if (threads != 1) {
    return absl::InternalError(absl::StrCat("capability drop with ", threads,
                                            " threads: the others would keep everything"));
  }
  ASSIGN_OR_RETURN(CurrentSets start, currentSets());
  DropResult result;
  const CapSet keep = plan.keep & start.permitted;
  result.missing = plan.keep & ~start.permitted;

  // CAP_SETPCAP must be effective for the bounding set and the securebits.
  const bool setpcap = has(start.permitted, CAP_SETPCAP);
  if (setpcap && !has(start.effective, CAP_SETPCAP)) {
    RETURN_IF_ERROR(
        capsetRaw({start.effective | bit(CAP_SETPCAP), start.permitted, start.inheritable}));
  }
  if (setpcap) {
    result.bounding_dropped = true;
    for (int cap = 0, last = lastCap(); cap <= last; ++cap) {
      if (has(keep, cap) || ::prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 1) continue;
      if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
        result.bounding_dropped = false;
        result.warnings.push_back(
            absl::StrCat("bounding set: drop ", capName(cap), ": ", std::strerror(errno)));
      }
    }
    // NOROOT: exec of a root-owned binary gives nothing beyond the ambient
    // set. KEEP_CAPS off and NO_SETUID_FIXUP off: a setuid() away from 0
    // clears every set. All three locked, so nothing can undo them. A bit
    // someone locked before us keeps its value (changing it is EPERM).
    const int now = ::prctl(PR_GET_SECUREBITS, 0, 0, 0, 0);
    if (now < 0) {
      result.warnings.push_back(absl::StrCat("PR_GET_SECUREBITS: ", std::strerror(errno)));
    } else {
      unsigned bits = static_cast<unsigned>(now);
      auto want = [&bits](unsigned bit_value, unsigned locked, bool on) {
        if ((bits & locked) != 0) return;
        bits = on ? (bits | bit_value) : (bits & ~bit_value);
        bits |= locked;
      };
      want(SECBIT_NOROOT, SECBIT_NOROOT_LOCKED, true);
      want(SECBIT_KEEP_CAPS, SECBIT_KEEP_CAPS_LOCKED, false);
      want(SECBIT_NO_SETUID_FIXUP, SECBIT_NO_SETUID_FIXUP_LOCKED, false);
      if (::prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) {
        result.warnings.push_back(absl::StrCat("PR_SET_SECUREBITS: ", std::strerror(errno)));
      } else {
        result.securebits_set = (bits & SECBIT_NOROOT) != 0;
        if (!result.securebits_set) {
          // (Through a string_view: GCC 12 at -O3 warns falsely, -Warray-bounds,
          // on moving a string made from this literal.)
          constexpr std::string_view kLockedOff =
              "SECBIT_NOROOT was locked off before the agent started";
          result.warnings.emplace_back(kLockedOff);
        }
      }
    }
  } else if (start.permitted != 0) {
    result.warnings.push_back(
        "no CAP_SETPCAP: the bounding set and securebits stay as they are (a root-owned "
        "program the agent runs may regain capabilities)");
  }

  // Ambient capabilities would survive into every exec: none until a child
  // raises its own.
  ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  RETURN_IF_ERROR(capsetRaw({keep, keep, plan.inheritable & keep}));
  ASSIGN_OR_RETURN(CurrentSets after, currentSets());
  result.kept = after.effective;
  return result;
}

}  // namespace siphon::agent::caps
