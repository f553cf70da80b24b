// RealProcFs against real processes this test owns, so no root is needed:
// /proc of a process of the same user passes the ptrace "read" access check.
#include "agent/target/proc_fs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "agent/target/environ.h"
#include "agent/target/target.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

using namespace std::string_literals;

// pid_max is at most 2^22, so this pid never exists.
constexpr pid_t kNoSuchPid = 0x7ffffff0;

// A `/bin/cat` child with exactly the given environment, killed and reaped in
// every path. spawn() returns once cat has echoed a byte back: posix_spawn
// alone is not enough, because the vfork-style parent resumes as soon as the
// kernel swaps in the new mm, before execve has laid out the environment
// (/proc/PID/environ reads empty in that window). A byte round trip proves the
// child runs its own code, with no sleeps or retries.
class EchoChild {
 public:
  explicit EchoChild(std::vector<std::string> env) : env_(std::move(env)) {}
  ~EchoChild() { killAndReap(); }
  EchoChild(const EchoChild&) = delete;
  EchoChild& operator=(const EchoChild&) = delete;

  ::testing::AssertionResult spawn() {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      return ::testing::AssertionFailure() << "pipe2: " << std::strerror(errno);
    }
    UniqueFd in_read(in[0]), out_write(out[1]);
    stdin_.reset(in[1]);
    stdout_.reset(out[0]);

    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    // dup2 clears O_CLOEXEC on 0 and 1; every other pipe end is closed by exec.
    ::posix_spawn_file_actions_adddup2(&actions, in_read.get(), 0);
    ::posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
    std::string prog = "/bin/cat";
    std::vector<char*> argv = {prog.data(), nullptr};
    std::vector<char*> envp;
    for (std::string& e : env_) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int err = ::posix_spawn(&pid_, prog.c_str(), &actions, nullptr, argv.data(), envp.data());
    ::posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      pid_ = 0;
      return ::testing::AssertionFailure() << "posix_spawn /bin/cat: " << std::strerror(err);
    }

    // Our copies of the child's ends go, so a dead child reads as EOF here.
    in_read.reset();
    out_write.reset();
    char c = 'x';
    if (::write(stdin_.get(), &c, 1) != 1) {
      return ::testing::AssertionFailure() << "write to cat: " << std::strerror(errno);
    }
    ssize_t n;
    while ((n = ::read(stdout_.get(), &c, 1)) < 0 && errno == EINTR) {
    }
    if (n != 1 || c != 'x') return ::testing::AssertionFailure() << "cat did not echo";
    return ::testing::AssertionSuccess();
  }

  void killAndReap() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
  }

  // Kills the child and waits until it is a zombie, without reaping it.
  void killLeavingZombie() {
    ::kill(pid_, SIGKILL);
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) < 0 &&
           errno == EINTR) {
    }
  }

  pid_t pid() const { return pid_; }

 private:
  std::vector<std::string> env_;
  UniqueFd stdin_, stdout_;
  pid_t pid_ = 0;
};

uint64_t statInode(const char* path) {
  struct stat st {};
  EXPECT_EQ(::stat(path, &st), 0) << path << ": " << std::strerror(errno);
  return st.st_ino;
}

TEST(RealProcFsTest, ReadsEnvironOfSpawnedChild) {
  EchoChild child({"SIPHON_TEST_X=1", "A=b=c"});
  ASSERT_TRUE(child.spawn());
  RealProcFs procfs;

  auto raw = procfs.readEnviron(child.pid());
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(*raw, "SIPHON_TEST_X=1\0A=b=c\0"s);

  v1::EnvRequest req;
  req.add_include("SIPHON_*");
  auto env = envFor(procfs, child.pid(), req);
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->vars_size(), 1);
  EXPECT_EQ(env->vars(0).name(), "SIPHON_TEST_X");
  EXPECT_EQ(env->vars(0).value(), "1");
}

TEST(RealProcFsTest, EnvironAboveTheCapIsAnErrorNotATruncation) {
  EchoChild child({"SIPHON_TEST_X=1", "A=b=c"});
  ASSERT_TRUE(child.spawn());
  RealProcFs procfs("/proc", 8);
  auto raw = procfs.readEnviron(child.pid());
  ASSERT_FALSE(raw.ok());
  EXPECT_EQ(raw.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(raw.status().message().find("8-byte limit"), absl::string_view::npos) << raw.status();
}

TEST(RealProcFsTest, MissingProcessIsNotFound) {
  RealProcFs procfs;
  EXPECT_FALSE(procfs.processExists(kNoSuchPid));
  EXPECT_FALSE(procfs.processExists(0));

  auto environ = procfs.readEnviron(kNoSuchPid);
  ASSERT_FALSE(environ.ok());
  EXPECT_EQ(environ.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(environ.status().message(), "open /proc/2147483632/environ: No such file or directory");

  auto netns = procfs.openNetns(kNoSuchPid);
  ASSERT_FALSE(netns.ok());
  EXPECT_EQ(netns.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(errnoOf(netns.status()), ENOENT);

  auto root = procfs.openRoot(kNoSuchPid);
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().code(), absl::StatusCode::kNotFound);

  auto pidfd = procfs.openPidfd(kNoSuchPid);
  ASSERT_FALSE(pidfd.ok());
  EXPECT_EQ(pidfd.status().code(), absl::StatusCode::kNotFound);
}

TEST(RealProcFsTest, ProcRootIsUsedForEveryPath) {
  RealProcFs procfs("/nonexistent-proc");
  EXPECT_FALSE(procfs.processExists(::getpid()));
  auto netns = procfs.openNetns(::getpid());
  ASSERT_FALSE(netns.ok());
  EXPECT_EQ(netns.status().message(), "open /nonexistent-proc/" + std::to_string(::getpid()) +
                                          "/ns/net: No such file or directory");
}

TEST(RealProcFsTest, ListPidsHasOurselvesAndOurChildAscending) {
  EchoChild child({"X=1"});
  ASSERT_TRUE(child.spawn());
  RealProcFs procfs;
  auto pids = procfs.listPids();
  ASSERT_TRUE(pids.ok()) << pids.status();
  EXPECT_TRUE(std::is_sorted(pids->begin(), pids->end()));
  EXPECT_NE(std::find(pids->begin(), pids->end(), ::getpid()), pids->end());
  EXPECT_NE(std::find(pids->begin(), pids->end(), child.pid()), pids->end());
  // "self", "net", "sys"... are not processes; threads are not listed.
  for (pid_t p : *pids) EXPECT_GT(p, 0);
}

TEST(RealProcFsTest, ListPidsOfAMissingProcIsAnError) {
  RealProcFs procfs("/nonexistent-proc");
  auto pids = procfs.listPids();
  ASSERT_EQ(pids.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pids.status().message(), "opendir /nonexistent-proc: No such file or directory");
}

TEST(RealProcFsTest, ReadCgroupOfOurselvesIsTheKernelsText) {
  RealProcFs procfs;
  auto cgroup = procfs.readCgroup(::getpid());
  ASSERT_TRUE(cgroup.ok()) << cgroup.status();
  std::ifstream in("/proc/self/cgroup");
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(*cgroup, expected.str());
  // "0::/path" (v2) or "N:controllers:/path" lines (v1).
  EXPECT_NE(cgroup->find(":/"), std::string::npos);
}

TEST(RealProcFsTest, ReadCgroupOfAMissingProcessIsNotFound) {
  RealProcFs procfs;
  auto cgroup = procfs.readCgroup(kNoSuchPid);
  ASSERT_EQ(cgroup.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cgroup.status().message(),
            "open /proc/" + std::to_string(kNoSuchPid) + "/cgroup: No such file or directory");
}

TEST(RealProcFsTest, OwnNetnsInodeMatchesStat) {
  RealProcFs procfs;
  EXPECT_TRUE(procfs.processExists(::getpid()));
  EXPECT_EQ(procfs.selfPid(), ::getpid());
  auto netns = procfs.openNetns(::getpid());
  ASSERT_TRUE(netns.ok()) << netns.status();
  EXPECT_NE(::fcntl(netns->get(), F_GETFD) & FD_CLOEXEC, 0);
  auto inode = procfs.inodeOf(netns->get());
  ASSERT_TRUE(inode.ok()) << inode.status();
  EXPECT_EQ(*inode, statInode("/proc/self/ns/net"));
}

TEST(RealProcFsTest, OwnRootIsAnOPathDirectoryOnSlash) {
  RealProcFs procfs;
  auto root = procfs.openRoot(::getpid());
  ASSERT_TRUE(root.ok()) << root.status();
  const int flags = ::fcntl(root->get(), F_GETFL);
  EXPECT_EQ(flags & O_PATH, O_PATH);
  EXPECT_NE(::fcntl(root->get(), F_GETFD) & FD_CLOEXEC, 0);
  auto inode = procfs.inodeOf(root->get());
  ASSERT_TRUE(inode.ok()) << inode.status();
  EXPECT_EQ(*inode, statInode("/"));
}

TEST(RealProcFsTest, InodeOfBadFdIsAnError) {
  RealProcFs procfs;
  auto inode = procfs.inodeOf(-1);
  ASSERT_FALSE(inode.ok());
  EXPECT_EQ(errnoOf(inode.status()), EBADF);
}

TEST(RealProcFsTest, PidfdReportsExitOfChild) {
  EchoChild child({"X=1"});
  ASSERT_TRUE(child.spawn());
  RealProcFs procfs;
  auto pidfd = procfs.openPidfd(child.pid());
  ASSERT_TRUE(pidfd.ok()) << pidfd.status();

  auto before = procfs.hasExited(pidfd->get());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(*before);

  child.killAndReap();
  auto after = procfs.hasExited(pidfd->get());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*after);
}

TEST(RealProcFsTest, OtherUsersProcessIsPermissionDenied) {
  struct stat st {};
  ASSERT_EQ(::stat("/proc/1", &st), 0);
  if (::geteuid() == 0 || st.st_uid == ::geteuid()) {
    GTEST_SKIP() << "needs to run as a user other than the owner of pid 1 "
                    "(e.g. setpriv --reuid=65534 --regid=65534 --clear-groups)";
  }
  RealProcFs procfs;
  auto netns = procfs.openNetns(1);
  ASSERT_FALSE(netns.ok());
  EXPECT_EQ(netns.status().code(), absl::StatusCode::kPermissionDenied);
  auto environ = procfs.readEnviron(1);
  ASSERT_FALSE(environ.ok());
  EXPECT_EQ(environ.status().code(), absl::StatusCode::kPermissionDenied);

  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargeted, 1, "", "", {}});
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(target.status().message(),
            "open /proc/1/ns/net: Permission denied (the agent needs CAP_SYS_ADMIN and "
            "CAP_SYS_PTRACE)");
}

TEST(RealTargetTest, EntersOwnChild) {
  EchoChild child({"X=1"});
  ASSERT_TRUE(child.spawn());
  RealProcFs procfs;
  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargeted, child.pid(), "", "", {}});
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->pid(), child.pid());
  EXPECT_TRUE((*target)->hasPidfd());
  EXPECT_EQ((*target)->netnsInode(), statInode("/proc/self/ns/net"));
}

TEST(RealTargetTest, ZombieHasExited) {
  EchoChild child({"X=1"});
  ASSERT_TRUE(child.spawn());
  child.killLeavingZombie();
  RealProcFs procfs;
  EXPECT_TRUE(procfs.processExists(child.pid()));
  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargeted, child.pid(), "", "", {}});
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(),
            "target process " + std::to_string(child.pid()) + " has exited (open /proc/" +
                std::to_string(child.pid()) + "/ns/net: No such file or directory)");
}

TEST(RealTargetTest, MissingProcessMessage) {
  RealProcFs procfs;
  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargeted, kNoSuchPid, "", "", {}});
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(), "target process 2147483632 does not exist");
}

TEST(RealTargetTest, TargetlessIsTheAgentItself) {
  RealProcFs procfs;
  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargetless, 0, "", "", {}});
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->pid(), ::getpid());
  EXPECT_FALSE((*target)->hasPidfd());
  EXPECT_EQ((*target)->netnsInode(), statInode("/proc/self/ns/net"));
  EXPECT_EQ((*target)->describe().mode(), "targetless");
}

}  // namespace
}  // namespace siphon::agent
