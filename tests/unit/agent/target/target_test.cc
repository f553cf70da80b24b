#include "agent/target/target.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// The identity the file helper takes (Target::identity): read by pid, but
// only ever answered for the process the pidfd pins (issue 40, item 9).
std::string statusOf(uint32_t uid, uint32_t gid, const char* cap_eff = "0000000000000000") {
  return absl::StrCat("Name:\tapp\nUid:\t", uid, "\t", uid, "\t", uid, "\t", uid, "\nGid:\t", gid,
                      "\t", gid, "\t", gid, "\t", gid, "\nGroups:\t", gid,
                      " \nCapInh:\t0000000000000000\nCapPrm:\t", cap_eff, "\nCapEff:\t", cap_eff,
                      "\n");
}

class TargetIdentityTest : public ::testing::Test {
 protected:
  static constexpr pid_t kSelf = 1000;
  void SetUp() override {
    procfs_.setSelfPid(kSelf);
    procfs_.addProcess(kSelf);
  }
  std::unique_ptr<Target> open(pid_t pid, uint32_t uid) {
    fakes::FakeProcess p;
    p.netns_inode = 77;
    p.status = statusOf(uid, uid);
    procfs_.addProcess(pid, std::move(p));
    auto target = Target::open(procfs_, targeted(pid));
    EXPECT_TRUE(target.ok()) << target.status();
    return target.ok() ? std::move(*target) : nullptr;
  }
  // A process that is not the target, as a pid reuse brings it: root, with
  // every capability.
  static fakes::FakeProcess intruder() {
    fakes::FakeProcess p;
    p.netns_inode = 77;
    p.status = statusOf(0, 0, "000001ffffffffff");
    return p;
  }
  fakes::FakeProcFs procfs_;
};

TEST_F(TargetIdentityTest, IsTheTargetsOwnWhileItRuns) {
  std::unique_ptr<Target> target = open(kPid, 1234);
  ASSERT_NE(target, nullptr);
  auto id = target->identity(procfs_);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->pid, kPid);
  EXPECT_EQ(id->credentials.uid, (std::array<uint32_t, 4>{1234, 1234, 1234, 1234}));
  EXPECT_EQ(id->credentials.groups, (std::vector<uint32_t>{1234}));
  EXPECT_EQ(id->credentials.cap_effective, 0u);
  EXPECT_TRUE(id->in_agent_user_namespace);
  // Read again at each call: a target that changes its ids (an entrypoint
  // dropping root) is taken as it is now.
  procfs_.process(kPid).status = statusOf(4321, 4321);
  id = target->identity(procfs_);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->credentials.uid[1], 4321u);
}

TEST_F(TargetIdentityTest, APidReusedAfterTheTargetExitedLendsNoIdentity) {
  std::unique_ptr<Target> target = open(kPid, 1234);
  ASSERT_NE(target, nullptr);
  // The target exits (its container restarts) and another process gets its
  // pid before the next one is adopted: /proc/4242 is the intruder's now.
  procfs_.reusePid(kPid, intruder());
  auto id = target->identity(procfs_);
  ASSERT_FALSE(id.ok()) << "lent uid " << id->credentials.uid[1] << " of the pid's new owner";
  EXPECT_EQ(errnoOf(id.status()), EAGAIN) << id.status();
  EXPECT_EQ(errnoReason(id.status()),
            "the target process 4242 has exited: file access waits for its container's next "
            "process");
}

TEST_F(TargetIdentityTest, APidReusedBetweenTheLookupsLendsNoIdentity) {
  std::unique_ptr<Target> target = open(kPid, 1234);
  ASSERT_NE(target, nullptr);
  // The status is the target's, read just before it exits; what follows
  // (its user namespace) would be the intruder's, in another namespace.
  procfs_.process(kPid).after_status_read = [this] {
    fakes::FakeProcess p = intruder();
    p.user_ns = 4026532999;
    procfs_.reusePid(kPid, std::move(p));
  };
  auto id = target->identity(procfs_);
  ASSERT_FALSE(id.ok()) << "an identity of two processes: uid " << id->credentials.uid[1]
                        << ", the agent's user namespace " << id->in_agent_user_namespace;
  EXPECT_EQ(errnoOf(id.status()), EAGAIN) << id.status();
}

TEST_F(TargetIdentityTest, AnAdoptedRestartLendsTheNewProcesssIdentity) {
  std::unique_ptr<Target> target = open(kPid, 1234);
  ASSERT_NE(target, nullptr);
  procfs_.process(kPid).exited = true;
  EXPECT_EQ(errnoOf(target->identity(procfs_).status()), EAGAIN) << "down: nobody's identity";
  std::unique_ptr<Target> next = open(kPid + 1, 5678);
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(target->adopt(std::move(next)).ok());
  auto id = target->identity(procfs_);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->pid, kPid + 1);
  EXPECT_EQ(id->credentials.uid[1], 5678u);
  // And that process's pid, once it exits and is reused, lends nothing.
  procfs_.reusePid(kPid + 1, intruder());
  EXPECT_EQ(errnoOf(target->identity(procfs_).status()), EAGAIN);
}

TEST_F(TargetIdentityTest, SaysWhenTheTargetIsInAnotherUserNamespace) {
  fakes::FakeProcess p;
  p.user_ns = 4026532999;
  procfs_.addProcess(kPid, std::move(p));
  auto target = Target::open(procfs_, targeted(kPid));
  ASSERT_TRUE(target.ok()) << target.status();
  auto id = (*target)->identity(procfs_);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_FALSE(id->in_agent_user_namespace);
}

TEST_F(TargetIdentityTest, TargetlessHasNone) {
  auto target = Target::open(procfs_, TargetSpec{TargetMode::kTargetless, 0, "", "", {}});
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->identity(procfs_).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A restarted container (Target::adopt): the same netns, a new process and
// root. Each process's root is a real directory, so what rootFd() names can
// be told apart.
class AdoptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (std::string* dir : {&old_root_, &new_root_}) {
      char tmpl[] = "/tmp/siphon-adopt-XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      *dir = tmpl;
    }
  }
  void TearDown() override {
    ::rmdir(old_root_.c_str());
    ::rmdir(new_root_.c_str());
  }
  static ino_t inodeOfFd(int fd) {
    struct stat st {};
    return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
  }
  static ino_t inodeOfPath(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
  }
  std::unique_ptr<Target> open(fakes::RootedProcFs& procfs, pid_t pid, uint64_t netns,
                               std::string env_value) {
    procfs.addProcess(pid).netns_inode = netns;
    TargetSpec spec{TargetMode::kTargeted, pid, "ctr-1", "containerd", {}};
    v1::EnvVar var;
    var.set_name("FROM_RUNTIME");
    var.set_value(std::move(env_value));
    spec.runtime_env.push_back(var);
    auto target = Target::open(procfs, std::move(spec));
    EXPECT_TRUE(target.ok()) << target.status();
    return target.ok() ? std::move(*target) : nullptr;
  }
  std::string old_root_, new_root_;
};

TEST_F(AdoptTest, TheNewProcessIsAdoptedAndTheRootNumberNamesItsRoot) {
  fakes::RootedProcFs first(old_root_), second(new_root_);
  std::unique_ptr<Target> target = open(first, 100, 77, "one");
  ASSERT_NE(target, nullptr);
  const int root_number = target->rootFd();
  ASSERT_EQ(inodeOfFd(root_number), inodeOfPath(old_root_));
  std::unique_ptr<Target> next = open(second, 200, 77, "two");
  ASSERT_NE(next, nullptr);

  ASSERT_TRUE(target->adopt(std::move(next)).ok());
  EXPECT_EQ(target->rootFd(), root_number) << "holders of the number must see the new root";
  EXPECT_EQ(inodeOfFd(root_number), inodeOfPath(new_root_));
  EXPECT_EQ(target->pid(), 200);
  EXPECT_EQ(target->describe().pid(), 200);
  EXPECT_EQ(target->describe().container_id(), "ctr-1");
  ASSERT_EQ(target->runtimeEnv().size(), 1u);
  EXPECT_EQ(target->runtimeEnv()[0].value(), "two");
  EXPECT_EQ(target->restarts(), 1u);
  EXPECT_TRUE(target->hasPidfd());
  EXPECT_EQ(target->netnsInode(), 77u);
}

TEST_F(AdoptTest, AProcessInAnotherNetnsIsRefusedAndNothingChanges) {
  fakes::RootedProcFs first(old_root_), second(new_root_);
  std::unique_ptr<Target> target = open(first, 100, 77, "one");
  ASSERT_NE(target, nullptr);
  std::unique_ptr<Target> next = open(second, 200, 78, "two");
  ASSERT_NE(next, nullptr);

  absl::Status s = target->adopt(std::move(next));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "the target's new process 200 is in network namespace net:[78], not net:[77]: the "
            "pod was recreated");
  EXPECT_EQ(target->pid(), 100);
  EXPECT_EQ(inodeOfFd(target->rootFd()), inodeOfPath(old_root_));
  EXPECT_EQ(target->runtimeEnv()[0].value(), "one");
  EXPECT_EQ(target->restarts(), 0u);
}

}  // namespace
}  // namespace siphon::agent
