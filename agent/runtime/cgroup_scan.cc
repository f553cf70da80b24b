#include "agent/runtime/cgroup_scan.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

// Longest first where one is a prefix of another.
constexpr std::string_view kPrefixes[] = {"cri-containerd-", "crio-", "docker-", "libpod-"};

bool componentNames(std::string_view component, std::string_view id) {
  if (component == id) return true;
  if (component.size() > 6 && component.substr(component.size() - 6) == ".scope") {
    component.remove_suffix(6);
  }
  // conmon, CRI-O's per-container monitor, lives in crio-conmon-<ID>.scope.
  if (component.substr(0, 12) == "crio-conmon-") return false;
  for (std::string_view prefix : kPrefixes) {
    if (component.substr(0, prefix.size()) == prefix) {
      return component.substr(prefix.size()) == id;
    }
  }
  return component == id;
}

// runc's own processes name themselves "runc:[0:PARENT]", "runc:[1:CHILD]"
// and "runc:[2:INIT]" (nsexec) until the last one execs the container's
// program. They are in the container's cgroup before the root is pivoted,
// so entering one would serve the node's files as the container's.
bool isRuntimeSetup(std::string_view comm) { return comm.substr(0, 5) == "runc:"; }

}  // namespace

bool cgroupNamesContainer(std::string_view cgroup_file, std::string_view id) {
  if (id.empty()) return false;
  while (!cgroup_file.empty()) {
    const size_t nl = cgroup_file.find('\n');
    std::string_view line = cgroup_file.substr(0, nl);
    cgroup_file = nl == std::string_view::npos ? std::string_view() : cgroup_file.substr(nl + 1);
    // "ID:CONTROLLERS:PATH"; the path is everything after the second ':'
    // (it may hold ':' itself).
    const size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    const size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view path = line.substr(c2 + 1);
    while (!path.empty()) {
      const size_t slash = path.find('/');
      const std::string_view component = path.substr(0, slash);
      path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
      if (!component.empty() && componentNames(component, id)) return true;
    }
  }
  return false;
}

absl::StatusOr<pid_t> findContainerPid(ProcFs& procfs, std::string_view id) {
  ASSIGN_OR_RETURN(std::vector<pid_t> pids, procfs.listPids());
  const pid_t self = procfs.selfPid();
  size_t looked = 0;
  size_t starting = 0;
  pid_t found = 0;
  for (pid_t pid : pids) {
    if (pid == self) continue;
    auto cgroup = procfs.readCgroup(pid);
    // Gone since the listing, or unreadable: not a process we could enter.
    if (!cgroup.ok()) continue;
    ++looked;
    if (!cgroupNamesContainer(*cgroup, id) || (found != 0 && pid > found)) continue;
    auto comm = procfs.readComm(pid);
    if (!comm.ok()) continue;
    if (isRuntimeSetup(*comm)) {
      ++starting;
      continue;
    }
    found = pid;
  }
  if (found != 0) return found;
  if (starting != 0) {
    // NotFound as well: a caller that waits for the container (a restart)
    // looks again; one that does not says what it saw.
    return absl::NotFoundError(absl::StrCat(
        "container ", asv(id), " is still being started: its ", starting,
        " process(es) are the runtime's setup (runc), not yet the container's program"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no process of container ", asv(id), " among the ", looked,
      " processes this agent sees (by their /proc/PID/cgroup); in ephemeral mode the agent "
      "must share the target's PID namespace (kubectl debug --target=CONTAINER, or the pod's "
      "shareProcessNamespace)"));
}

}  // namespace siphon::agent::runtime
