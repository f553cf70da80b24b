#include "agent/target/target.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "siphon/status.h"
#include "tests/fakes/fake_proc_fs.h"

namespace siphon::agent {
namespace {

constexpr pid_t kPid = 4242;

TargetSpec targeted(pid_t pid) { return TargetSpec{TargetMode::kTargeted, pid, "", "", {}}; }

TEST(TargetModeTest, NamesRoundTrip) {
  for (TargetMode m : {TargetMode::kTargeted, TargetMode::kEphemeral, TargetMode::kTargetless}) {
    auto parsed = parseTargetMode(targetModeName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_EQ(targetModeName(TargetMode::kTargetless), "targetless");
  auto bad = parseTargetMode("sidecar");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TargetTest, OpensTargetedProcess) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).netns_inode = 4026532001;
  auto target =
      Target::open(procfs, TargetSpec{TargetMode::kTargeted, kPid, "abc123", "containerd", {}});
  ASSERT_TRUE(target.ok()) << target.status();
  const Target& t = **target;
  EXPECT_EQ(t.mode(), TargetMode::kTargeted);
  EXPECT_EQ(t.pid(), kPid);
  EXPECT_GE(t.netnsFd(), 0);
  EXPECT_GE(t.rootFd(), 0);
  EXPECT_TRUE(t.hasPidfd());
  EXPECT_GE(t.pidfd(), 0);
  EXPECT_EQ(t.netnsInode(), 4026532001u);
  EXPECT_EQ(t.netnsLabel(), "net:[4026532001]");

  v1::TargetDescription d = t.describe();
  EXPECT_EQ(d.mode(), "targeted");
  EXPECT_EQ(d.pid(), kPid);
  EXPECT_EQ(d.netns_inode(), 4026532001u);
  EXPECT_EQ(d.container_id(), "abc123");
  EXPECT_EQ(d.runtime(), "containerd");
}

TEST(TargetTest, EphemeralBehavesAsTargetedAndSaysSo) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(1).netns_inode = 77;
  auto target = Target::open(procfs, TargetSpec{TargetMode::kEphemeral, 1, "", "", {}});
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_TRUE((*target)->hasPidfd());
  EXPECT_EQ((*target)->describe().mode(), "ephemeral");
}

TEST(TargetTest, TargetlessUsesAgentsOwnNamespaces) {
  fakes::FakeProcFs procfs;
  procfs.setSelfPid(321);
  procfs.addProcess(321).netns_inode = 4026531840;
  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargetless, 0, "", "", {}});
  ASSERT_TRUE(target.ok()) << target.status();
  const Target& t = **target;
  EXPECT_EQ(t.mode(), TargetMode::kTargetless);
  EXPECT_EQ(t.pid(), 321);
  EXPECT_FALSE(t.hasPidfd());
  EXPECT_EQ(t.pidfd(), -1);
  EXPECT_GE(t.netnsFd(), 0);
  EXPECT_GE(t.rootFd(), 0);
  EXPECT_EQ(t.describe().mode(), "targetless");
  EXPECT_EQ(t.describe().pid(), 321);
  EXPECT_EQ(t.describe().netns_inode(), 4026531840u);
}

TEST(TargetTest, TargetlessRejectsAPid) {
  fakes::FakeProcFs procfs;
  auto target = Target::open(procfs, TargetSpec{TargetMode::kTargetless, kPid, "", "", {}});
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TargetTest, NonPositivePidIsInvalidArgument) {
  fakes::FakeProcFs procfs;
  for (pid_t pid : {0, -1}) {
    auto target = Target::open(procfs, targeted(pid));
    ASSERT_FALSE(target.ok());
    EXPECT_EQ(target.status().code(), absl::StatusCode::kInvalidArgument) << pid;
  }
}

TEST(TargetTest, MissingProcessIsNotFound) {
  fakes::FakeProcFs procfs;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(), "target process 4242 does not exist");
}

TEST(TargetTest, ZombieIsNotFoundAndSaysExited) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).netns_errno = ENOENT;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(),
            "target process 4242 has exited (open /proc/4242/ns/net: No such file or directory)");
}

TEST(TargetTest, NetnsEaccesIsPermissionDeniedWithCapabilityHint) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).netns_errno = EACCES;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(target.status().message(),
            "open /proc/4242/ns/net: Permission denied (the agent needs CAP_SYS_ADMIN and "
            "CAP_SYS_PTRACE)");
  EXPECT_EQ(errnoOf(target.status()), EACCES);
}

TEST(TargetTest, NetnsEpermIsPermissionDeniedToo) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).netns_errno = EPERM;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(target.status().message(),
            "open /proc/4242/ns/net: Operation not permitted (the agent needs CAP_SYS_ADMIN and "
            "CAP_SYS_PTRACE)");
  EXPECT_EQ(errnoOf(target.status()), EPERM);
}

TEST(TargetTest, RootEaccesIsPermissionDenied) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).root_errno = EACCES;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(target.status().message(),
            "open /proc/4242/root: Permission denied (the agent needs CAP_SYS_ADMIN and "
            "CAP_SYS_PTRACE)");
}

TEST(TargetTest, NoPidfdSupportFailsClearly) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).pidfd_errno = ENOSYS;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(TargetTest, OtherErrorsPassThroughUnchanged) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).netns_errno = EMFILE;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(target.status().message(), "open /proc/4242/ns/net: Too many open files");
}

TEST(TargetTest, ExitWhileEnteringIsNotFound) {
  // The pid may have been recycled between pidfd_open and the /proc opens:
  // the fds cannot be trusted to belong to the process the pidfd pins.
  fakes::FakeProcFs procfs;
  procfs.addProcess(kPid).exited = true;
  auto target = Target::open(procfs, targeted(kPid));
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(),
            "target process 4242 has exited while the agent was entering it");
}

}  // namespace
}  // namespace siphon::agent
