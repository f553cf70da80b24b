#include "agent/files/fs_guard.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/common/root_path.h"
#include "agent/common/unique_fd.h"
#include "siphon/status.h"

namespace siphon::agent::files {
namespace {

// procfs gives its root directory this inode number (PROC_ROOT_INO).
constexpr ino_t kProcRootIno = 1;

absl::Status refuse(std::string_view path, std::string_view why) {
  return errnoRefusal(EACCES, absl::StrCat("open ", asv(path), ": ", asv(why)));
}

bool isNumber(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool allowedDevice(dev_t rdev) {
  if (major(rdev) != 1) return false;
  const unsigned m = minor(rdev);
  return m == 3 || m == 5 || m == 7 || m == 8 || m == 9;
}

absl::Status checkDevice(const struct stat& st, std::string_view path) {
  if ((S_ISCHR(st.st_mode) && !allowedDevice(st.st_rdev)) || S_ISBLK(st.st_mode)) {
    return refuse(path,
                  "device nodes other than null, zero, full, random and urandom are not served");
  }
  return absl::OkStatus();
}

UniqueFd openUnder(int dirfd, const std::string& path, int flags) {
  UniqueFd fd;
  (void)openInRoot(dirfd, path, flags, 0, &fd);
  return fd;
}

bool sameObject(int fd, const struct stat& st) {
  struct stat other {};
  return ::fstat(fd, &other) == 0 && other.st_dev == st.st_dev && other.st_ino == st.st_ino;
}

}  // namespace

bool isDescriptiveProcEntry(std::string_view entry) {
  // Readable by anyone for any process (mode 0444, no ptrace check) or
  // about namespaces and limits only: nothing of memory, environment,
  // mappings, fds, stacks or registers.
  static constexpr std::array<std::string_view, 22> kDescriptive = {
      "stat",    "statm",         "status",    "comm",       "cmdline",   "cgroup",
      "cpuset",  "mountinfo",     "mounts",    "mountstats", "limits",    "oom_score",
      "oom_adj", "oom_score_adj", "loginuid",  "sessionid",  "schedstat", "uid_map",
      "gid_map", "projid_map",    "setgroups", "net"};
  for (std::string_view d : kDescriptive) {
    if (d == entry) return true;
  }
  return false;
}

absl::Status checkBeforeOpen(int pathfd, std::string_view path) {
  struct stat st {};
  if (::fstat(pathfd, &st) != 0) return lastErrnoStatus(absl::StrCat("open ", asv(path)));
  return checkDevice(st, path);
}

absl::Status checkOpened(int fd, int flags, int root_fd, std::string_view path,
                         const GuardOptions& options) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return lastErrnoStatus(absl::StrCat("open ", asv(path)));
  // Again after the open: the node may have been swapped since the check.
  if (auto s = checkDevice(st, path); !s.ok()) return s;
  struct statfs sf {};
  if (::fstatfs(fd, &sf) != 0) return lastErrnoStatus(absl::StrCat("open ", asv(path)));
  if (sf.f_type != PROC_SUPER_MAGIC) return absl::OkStatus();

  const bool writes = (flags & O_ACCMODE) != O_RDONLY || (flags & (O_TRUNC | O_APPEND)) != 0;
  // Where the kernel says the object is, as the target's mount namespace
  // names it ("/proc/12/task/13/mem"): /proc/self and thread-self are
  // already numbers here.
  char link[4096];
  const std::string self_fd = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = ::readlink(self_fd.c_str(), link, sizeof link - 1);
  if (n <= 0) return refuse(path, "a /proc object the agent cannot place");
  const std::vector<std::string> parts =
      absl::StrSplit(absl::string_view(link, static_cast<size_t>(n)), '/', absl::SkipEmpty());

  // The target's /proc, if that is the procfs instance the object is in.
  UniqueFd proc = openUnder(root_fd, "/proc", O_PATH | O_DIRECTORY);
  struct stat proc_st {};
  const bool in_target_proc = proc.valid() && ::fstat(proc.get(), &proc_st) == 0 &&
                              proc_st.st_ino == kProcRootIno && proc_st.st_dev == st.st_dev;
  // The pid component: the first number whose tail, looked up from that
  // /proc, is this very object.
  size_t pid_at = parts.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!isNumber(parts[i])) continue;
    if (!in_target_proc) {
      pid_at = i;  // cannot check: assume the worst
      break;
    }
    std::string tail;
    for (size_t k = i; k < parts.size(); ++k) absl::StrAppend(&tail, k == i ? "" : "/", parts[k]);
    struct open_how how {};
    how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
    const long cand = ::syscall(SYS_openat2, proc.get(), tail.c_str(), &how, sizeof how);
    if (cand < 0) continue;
    UniqueFd c(static_cast<int>(cand));
    if (sameObject(c.get(), st)) {
      pid_at = i;
      break;
    }
  }
  if (pid_at == parts.size()) {
    // Not under a process (/proc/net/..., /proc/sys/...), or a number that
    // is not the pid of this object: only an object of the target's /proc
    // gets this far without a process.
    if (in_target_proc) return absl::OkStatus();
    return refuse(path, "a /proc object the agent cannot place");
  }
  size_t entry_at = pid_at + 1;
  if (entry_at + 1 < parts.size() && parts[entry_at] == "task" && isNumber(parts[entry_at + 1])) {
    entry_at += 2;
  }
  if (entry_at >= parts.size()) return absl::OkStatus();  // the /proc/PID directory itself
  const std::string& entry = parts[entry_at];
  if (entry == "mem" && writes) {
    return refuse(path, "nothing is written to a process's memory through files");
  }
  bool ours = options.all_processes || !in_target_proc;
  if (!ours) {
    char self[64];
    const ssize_t m = ::readlinkat(proc.get(), "self", self, sizeof self - 1);
    ours = m > 0 && std::string_view(self, static_cast<size_t>(m)) == parts[pid_at];
  }
  if (ours && (writes || !isDescriptiveProcEntry(entry))) {
    return refuse(path,
                  options.all_processes
                      ? "the file service does not serve the memory, environment, mappings or "
                        "fds of processes (/proc/PID/" +
                            entry +
                            ") with powers that are not "
                            "the target's own"
                      : "the file service does not serve its own /proc/PID/" + entry);
  }
  return absl::OkStatus();
}

}  // namespace siphon::agent::files
