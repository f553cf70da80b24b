// What the agent reads from /proc about a process: its environment, handles on
// its network namespace and root directory, and a pidfd to watch it exit.
//
// Everything that touches /proc goes through ProcFs so Target and the env
// service are unit-tested with a fake (tests/fakes/fake_proc_fs.h), no root.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"

namespace siphon::agent {

// Enough for any real container environment (a few KiB), small enough to bound
// the memory of one env request. execve itself allows argv+envp up to a quarter
// of the stack rlimit (2 MiB with the default 8 MiB), so a larger environ is
// possible in theory; it gets a clear error, never a truncated answer.
inline constexpr size_t kDefaultMaxEnvironBytes = size_t{1} << 20;

// A namespace as the kernel tells one from another: the device and inode
// of its /proc/PID/ns/* file.
struct NamespaceId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const NamespaceId&) const = default;
};

// Error codes common to every method (messages name the path or call, e.g.
// "open /proc/4242/ns/net: Permission denied"; the errno is kept, see
// siphon/status.h):
//   NotFound          the process does not exist (ENOENT, ESRCH), or it is a
//                     zombie whose namespaces are already gone.
//   PermissionDenied  EACCES/EPERM: another user's process without
//                     CAP_SYS_PTRACE (ptrace "read" access rule of /proc).
// Implementations are stateless after construction and safe to call from any
// thread. The calls block briefly on procfs; keep them off the event loop when
// the answer can be large (readEnviron).
class ProcFs {
 public:
  virtual ~ProcFs() = default;

  // Raw bytes of /proc/PID/environ: NUL-terminated NAME=VALUE entries as the
  // process received them from execve (later setenv() calls are not visible).
  // ResourceExhausted above the implementation's byte cap.
  virtual absl::StatusOr<std::string> readEnviron(pid_t pid) = 0;

  // /proc/PID/ns/net opened O_RDONLY|O_CLOEXEC: an fd for setns(CLONE_NEWNET).
  virtual absl::StatusOr<UniqueFd> openNetns(pid_t pid) = 0;

  // /proc/PID/root opened O_PATH|O_DIRECTORY|O_CLOEXEC: the dirfd that
  // openat2(RESOLVE_IN_ROOT) resolves container paths against.
  virtual absl::StatusOr<UniqueFd> openRoot(pid_t pid) = 0;

  // pidfd_open(2). Unimplemented when the kernel predates Linux 5.3.
  virtual absl::StatusOr<UniqueFd> openPidfd(pid_t pid) = 0;

  // st_ino of an open fd (for a netns fd: the N of "net:[N]").
  virtual absl::StatusOr<uint64_t> inodeOf(int fd) = 0;

  // True once the process behind `pidfd` has exited (a pidfd polls readable
  // from then on, zombie or reaped). Never blocks.
  virtual absl::StatusOr<bool> hasExited(int pidfd) = 0;

  // Whether /proc/PID is there. A zombie still counts as existing.
  virtual bool processExists(pid_t pid) = 0;

  // The agent's own pid (whose namespaces a targetless agent uses).
  virtual pid_t selfPid() = 0;

  // Every process /proc lists (its numeric entries: thread-group leaders,
  // no threads), ascending. Processes come and go while the caller looks at
  // them: a later call about one of them may answer NotFound.
  virtual absl::StatusOr<std::vector<pid_t>> listPids() = 0;

  // /proc/PID/cgroup as text: one "HIERARCHY-ID:CONTROLLERS:PATH" line per
  // hierarchy (cgroup v1), or the single "0::PATH" line of cgroup v2. Paths
  // are relative to the reader's cgroup namespace root. ResourceExhausted
  // above 64 KiB (a real file is a few hundred bytes).
  virtual absl::StatusOr<std::string> readCgroup(pid_t pid) = 0;

  // /proc/PID/comm without its newline: the name the process gave itself
  // (at most 15 bytes). A runtime's setup process names itself here before
  // it becomes the container's program ("runc:[2:INIT]").
  virtual absl::StatusOr<std::string> readComm(pid_t pid) = 0;

  // /proc/PID/status as text (its Uid, Gid, Groups and Cap* lines are the
  // process's credentials: agent/target/credentials.h). ResourceExhausted
  // above 64 KiB (a real one is under 2 KiB).
  virtual absl::StatusOr<std::string> readStatus(pid_t pid) = 0;

  // The user namespace of `pid` (stat of /proc/PID/ns/user).
  virtual absl::StatusOr<NamespaceId> userNamespace(pid_t pid) = 0;
};

// ProcFs over a real procfs mount.
class RealProcFs : public ProcFs {
 public:
  explicit RealProcFs(std::string proc_root = "/proc",
                      size_t max_environ_bytes = kDefaultMaxEnvironBytes);

  absl::StatusOr<std::string> readEnviron(pid_t pid) override;
  absl::StatusOr<UniqueFd> openNetns(pid_t pid) override;
  absl::StatusOr<UniqueFd> openRoot(pid_t pid) override;
  absl::StatusOr<UniqueFd> openPidfd(pid_t pid) override;
  absl::StatusOr<uint64_t> inodeOf(int fd) override;
  absl::StatusOr<bool> hasExited(int pidfd) override;
  bool processExists(pid_t pid) override;
  pid_t selfPid() override;
  absl::StatusOr<std::vector<pid_t>> listPids() override;
  absl::StatusOr<std::string> readCgroup(pid_t pid) override;
  absl::StatusOr<std::string> readComm(pid_t pid) override;
  absl::StatusOr<std::string> readStatus(pid_t pid) override;
  absl::StatusOr<NamespaceId> userNamespace(pid_t pid) override;

 private:
  // A whole /proc file of at most `cap` bytes; above it, ResourceExhausted
  // "read PATH: WHAT larger than the CAP-byte limit".
  absl::StatusOr<std::string> readCapped(const std::string& path, size_t cap,
                                         std::string_view what);

  std::string path(pid_t pid, const char* leaf) const;

  std::string proc_root_;
  size_t max_environ_bytes_;
};

}  // namespace siphon::agent
