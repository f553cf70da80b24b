// fs_guard.h through a LocalFileSystem rooted at "/" (openat2 works
// unprivileged on any directory fd): the real procfs of this process and the
// host's /dev. No root.
#include "agent/files/fs_guard.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "agent/files/file_system.h"
#include "siphon/status.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using ::testing::HasSubstr;

class FsGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = UniqueFd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_.valid());
  }

  absl::Status open(const std::string& path, int flags, bool all_processes = false) {
    LocalFileSystem fs(root_.get(), GuardOptions{all_processes});
    v1::FileRequest r;
    r.mutable_open()->set_path(path);
    r.mutable_open()->set_flags(flags);
    return fs.open(r).status();
  }

  UniqueFd root_;
};

TEST_F(FsGuardTest, NoWriteReachesAProcessMemory) {
  for (const char* p : {"/proc/self/mem", "/proc/thread-self/mem"}) {
    absl::Status s = open(p, O_RDWR);
    EXPECT_EQ(errnoOf(s), EACCES) << p << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("memory")) << s;
    EXPECT_EQ(errnoOf(open(p, O_WRONLY)), EACCES) << p;
  }
  const std::string task = "/proc/self/task/" + std::to_string(::gettid()) + "/mem";
  EXPECT_EQ(errnoOf(open(task, O_WRONLY)), EACCES);
  // truncate is a write too.
  LocalFileSystem fs(root_.get(), GuardOptions{});
  v1::FileRequest t;
  t.mutable_truncate()->set_path("/proc/self/mem");
  EXPECT_EQ(errnoOf(fs.path(t, false).status()), EACCES);
}

TEST_F(FsGuardTest, OwnProcessEntriesAreRefusedDescriptiveOnesServed) {
  for (const char* p : {"/proc/self/environ", "/proc/self/maps", "/proc/self/mem",
                        "/proc/self/auxv", "/proc/self/smaps", "/proc/thread-self/environ",
                        "/proc/self/pagemap", "/proc/self/syscall", "/proc/self/stack"}) {
    absl::Status s = open(p, O_RDONLY);
    if (errnoOf(s) == ENOENT) continue;  // a kernel without it
    EXPECT_EQ(errnoOf(s), EACCES) << p << ": " << s;
  }
  const std::string pid_path = "/proc/" + std::to_string(::getpid()) + "/environ";
  EXPECT_EQ(errnoOf(open(pid_path, O_RDONLY)), EACCES) << "by number too";
  EXPECT_TRUE(open("/proc/self/status", O_RDONLY).ok());
  EXPECT_TRUE(open("/proc/self/cmdline", O_RDONLY).ok());
  EXPECT_TRUE(open("/proc/net/dev", O_RDONLY).ok()) << "/proc/net is self/net";
  EXPECT_TRUE(open("/proc/meminfo", O_RDONLY).ok());
  // A directory listing of the fds is refused as well.
  LocalFileSystem fs(root_.get(), GuardOptions{});
  v1::FileRequest d;
  d.mutable_opendir()->set_path("/proc/self/fd");
  EXPECT_EQ(errnoOf(fs.open(d).status()), EACCES);
}

// Not the path string: a symlink the target planted reaches the same object.
TEST_F(FsGuardTest, SymlinkToOwnEnvironIsRefused) {
  testing::ScratchTree tree;
  tree.symlink("env", "/proc/self/environ");
  tree.symlink("procdir", "/proc/self");
  EXPECT_EQ(errnoOf(open(tree.inRoot("env"), O_RDONLY)), EACCES);
  EXPECT_EQ(errnoOf(open(tree.inRoot("procdir") + "/maps", O_RDONLY)), EACCES);
}

TEST_F(FsGuardTest, AllProcessesRefusesEveryPidsSecrets) {
  // A child: same uid, the kernel alone would let it be read.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  const std::string parent = "/proc/" + std::to_string(child);
  ASSERT_TRUE(open(parent + "/environ", O_RDONLY).ok()) << "the kernel refuses it already";
  absl::Status s = open(parent + "/environ", O_RDONLY, true);
  EXPECT_EQ(errnoOf(s), EACCES) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not the target's own")) << s;
  EXPECT_EQ(errnoOf(open(parent + "/mem", O_RDONLY, true)), EACCES);
  EXPECT_EQ(errnoOf(open("/proc/1/maps", O_RDONLY, true)), EACCES);
  EXPECT_EQ(errnoOf(open("/proc/1/task/1/environ", O_RDONLY, true)), EACCES);
  EXPECT_TRUE(open(parent + "/status", O_RDONLY, true).ok());
  EXPECT_TRUE(open("/proc/1/stat", O_RDONLY, true).ok());
}

TEST_F(FsGuardTest, OnlyHarmlessDevicesOpen) {
  for (const char* p : {"/dev/null", "/dev/zero", "/dev/urandom"}) {
    EXPECT_TRUE(open(p, O_RDONLY).ok()) << p;
  }
  struct stat st {};
  if (::stat("/dev/mem", &st) == 0) {
    absl::Status s = open("/dev/mem", O_RDONLY);
    EXPECT_EQ(errnoOf(s), EACCES) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("device nodes")) << s;
  }
  if (::stat("/dev/tty", &st) == 0) {
    EXPECT_EQ(errnoOf(open("/dev/tty", O_RDONLY)), EACCES);
  }
}

TEST(ProcEntriesTest, DescriptiveList) {
  EXPECT_TRUE(isDescriptiveProcEntry("status"));
  EXPECT_FALSE(isDescriptiveProcEntry("environ"));
  EXPECT_FALSE(isDescriptiveProcEntry("mem"));
  EXPECT_FALSE(isDescriptiveProcEntry("fd"));
  EXPECT_FALSE(isDescriptiveProcEntry("map_files"));
}

}  // namespace
}  // namespace siphon::agent::files
