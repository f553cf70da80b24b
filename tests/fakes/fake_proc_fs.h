// A ProcFs with scripted processes, for tests that must not need root or
// depend on the machine's processes.
//
// Fds it hands out are real (each a fresh open of /dev/null), so UniqueFd
// closes them as usual; inodeOf() and hasExited() answer from the script.
// A pidfd pins the process it was opened for: once that process is
// replaced at the same pid (reusePid), the pidfd says exited, as the
// kernel's does, while /proc/PID reads answer for the newcomer.
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/target/proc_fs.h"
#include "siphon/status.h"

namespace siphon::fakes {

struct FakeProcess {
  std::string environ;       // raw bytes readEnviron returns
  uint64_t netns_inode = 0;  // what inodeOf says for its netns fd
  uint64_t root_inode = 0;   // what inodeOf says for its root fd
  // A non-zero errno makes that call fail as the kernel would.
  int environ_errno = 0;
  int netns_errno = 0;
  int root_errno = 0;
  int pidfd_errno = 0;
  bool exited = false;  // hasExited() on its pidfd
  std::string cgroup;   // raw text readCgroup returns
  int cgroup_errno = 0;
  std::string comm = "app";  // what readComm returns
  // What readStatus returns: uid and gid 0, every capability.
  std::string status =
      "Name:\tapp\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n"
      "CapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n";
  int status_errno = 0;
  uint64_t user_ns = kInitUserNs;  // userNamespace()'s inode (device 1)
  static constexpr uint64_t kInitUserNs = 4026531837;
  // Called by readStatus() just after it read (a test's pid reuse between
  // two lookups). Runs once, then is cleared.
  std::function<void()> after_status_read;
};

class FakeProcFs : public agent::ProcFs {
 public:
  // Adds (or replaces) process `pid` and returns it for further scripting.
  FakeProcess& addProcess(pid_t pid, FakeProcess process = {}) {
    generations_[pid] = ++next_generation_;
    return processes_[pid] = std::move(process);
  }
  // Process `pid` exits and `next` takes its pid: pidfds opened before say
  // exited; /proc/PID answers for `next`.
  FakeProcess& reusePid(pid_t pid, FakeProcess next) { return addProcess(pid, std::move(next)); }
  void removeProcess(pid_t pid) { processes_.erase(pid); }
  FakeProcess& process(pid_t pid) { return processes_.at(pid); }
  void setSelfPid(pid_t pid) { self_pid_ = pid; }

  // Paths in messages are those RealProcFs would print with "/proc".
  absl::StatusOr<std::string> readEnviron(pid_t pid) override {
    const std::string what = absl::StrCat("open /proc/", pid, "/environ");
    auto it = processes_.find(pid);
    if (it == processes_.end()) return errnoStatus(ENOENT, what);
    if (it->second.environ_errno != 0) return errnoStatus(it->second.environ_errno, what);
    return it->second.environ;
  }

  absl::StatusOr<agent::UniqueFd> openNetns(pid_t pid) override {
    return openFor(pid, Kind::kNetns, "ns/net");
  }
  absl::StatusOr<agent::UniqueFd> openRoot(pid_t pid) override {
    return openFor(pid, Kind::kRoot, "root");
  }

  absl::StatusOr<agent::UniqueFd> openPidfd(pid_t pid) override {
    const std::string what = absl::StrCat("pidfd_open(", pid, ")");
    auto it = processes_.find(pid);
    if (it == processes_.end()) return errnoStatus(ESRCH, what);
    if (it->second.pidfd_errno == ENOSYS) {
      return absl::UnimplementedError(absl::StrCat(what, ": not supported by this kernel"));
    }
    if (it->second.pidfd_errno != 0) return errnoStatus(it->second.pidfd_errno, what);
    return handOut(pid, Kind::kPidfd);
  }

  absl::StatusOr<uint64_t> inodeOf(int fd) override {
    auto it = fds_.find(fd);
    if (it == fds_.end()) return errnoStatus(EBADF, absl::StrCat("fstat fd ", fd));
    auto p = processes_.find(it->second.pid);
    if (p == processes_.end()) return uint64_t{0};
    return it->second.kind == Kind::kNetns ? p->second.netns_inode : p->second.root_inode;
  }

  absl::StatusOr<bool> hasExited(int pidfd) override {
    auto it = fds_.find(pidfd);
    if (it == fds_.end() || it->second.kind != Kind::kPidfd) {
      return errnoStatus(EBADF, absl::StrCat("poll pidfd ", pidfd));
    }
    auto p = processes_.find(it->second.pid);
    return p == processes_.end() || p->second.exited ||
           generations_[it->second.pid] != it->second.generation;
  }

  bool processExists(pid_t pid) override { return processes_.count(pid) != 0; }
  pid_t selfPid() override { return self_pid_; }

  // Ascending, as std::map keeps them.
  absl::StatusOr<std::vector<pid_t>> listPids() override {
    if (list_errno_ != 0) return errnoStatus(list_errno_, "opendir /proc");
    std::vector<pid_t> pids;
    for (const auto& [pid, process] : processes_) pids.push_back(pid);
    return pids;
  }
  void setListErrno(int err) { list_errno_ = err; }

  absl::StatusOr<std::string> readCgroup(pid_t pid) override {
    const std::string what = absl::StrCat("open /proc/", pid, "/cgroup");
    auto it = processes_.find(pid);
    if (it == processes_.end()) return errnoStatus(ENOENT, what);
    if (it->second.cgroup_errno != 0) return errnoStatus(it->second.cgroup_errno, what);
    return it->second.cgroup;
  }

  absl::StatusOr<std::string> readComm(pid_t pid) override {
    auto it = processes_.find(pid);
    if (it == processes_.end()) return errnoStatus(ENOENT, absl::StrCat("open /proc/", pid, "/comm"));
    return it->second.comm;
  }

  absl::StatusOr<std::string> readStatus(pid_t pid) override {
    const std::string what = absl::StrCat("open /proc/", pid, "/status");
    auto it = processes_.find(pid);
    if (it == processes_.end()) return errnoStatus(ENOENT, what);
    if (it->second.status_errno != 0) return errnoStatus(it->second.status_errno, what);
    std::string status = it->second.status;
    if (auto hook = std::exchange(it->second.after_status_read, nullptr)) hook();
    return status;
  }

  absl::StatusOr<agent::NamespaceId> userNamespace(pid_t pid) override {
    auto it = processes_.find(pid);
    if (it == processes_.end()) {
      return errnoStatus(ENOENT, absl::StrCat("stat /proc/", pid, "/ns/user"));
    }
    return agent::NamespaceId{1, it->second.user_ns};
  }

 private:
  enum class Kind { kNetns, kRoot, kPidfd };
  struct Handed {
    pid_t pid;
    Kind kind;
    uint64_t generation;  // of the process at `pid` when handed out
  };

  absl::StatusOr<agent::UniqueFd> openFor(pid_t pid, Kind kind, const char* leaf) {
    const std::string what = absl::StrCat("open /proc/", pid, "/", leaf);
    auto it = processes_.find(pid);
    if (it == processes_.end()) return errnoStatus(ENOENT, what);
    const int err = kind == Kind::kNetns ? it->second.netns_errno : it->second.root_errno;
    if (err != 0) return errnoStatus(err, what);
    return handOut(pid, kind);
  }

  absl::StatusOr<agent::UniqueFd> handOut(pid_t pid, Kind kind) {
    agent::UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!fd) return lastErrnoStatus("open /dev/null");
    // A number closed earlier may come back: the newest owner wins.
    fds_[fd.get()] = Handed{pid, kind, generations_[pid]};
    return fd;
  }

  std::map<pid_t, FakeProcess> processes_;
  std::map<int, Handed> fds_;
  std::map<pid_t, uint64_t> generations_;  // of the process at each pid
  uint64_t next_generation_ = 0;
  pid_t self_pid_ = 1000;
  int list_errno_ = 0;
};

// A fake /proc whose processes all have `root` (a real directory, a
// test's scratch tree) as their root, for file service tests.
class RootedProcFs : public FakeProcFs {
 public:
  explicit RootedProcFs(std::string root) : root_(std::move(root)) {}
  absl::StatusOr<agent::UniqueFd> openRoot(pid_t) override {
    agent::UniqueFd fd(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd) return lastErrnoStatus("open " + root_);
    return fd;
  }

 private:
  std::string root_;
};

}  // namespace siphon::fakes
