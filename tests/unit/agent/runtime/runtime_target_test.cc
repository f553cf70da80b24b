// From a container to an open Target, with a fake /proc and fake runtimes:
// what the Target carries, the re-check after the pid is pinned, and the
// ephemeral mode's choices.
#include "agent/runtime/runtime_target.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/fakes/fake_proc_fs.h"
#include "tests/unit/agent/runtime/fake_runtime_clients.h"
#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using ::testing::HasSubstr;
using testing::msg;

constexpr char kSock[] = "/run/containerd/containerd.sock";

RuntimeOptions containerdOnly() {
  RuntimeOptions o;
  o.runtime = RuntimeKind::kContainerd;
  o.endpoint = kSock;
  return o;
}

TEST(OpenContainerTargetTest, TargetCarriesContainerRuntimeAndEnv) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(4242).netns_inode = 4026532000;
  FakeRuntimes world;
  world.runs(RuntimeKind::kContainerd, kSock, "abc", 4242, {{"A", "1"}, {"B", "2"}});
  RuntimeResolver resolver(containerdOnly(), world.factory());
  auto target = openContainerTarget(procfs, resolver, "abc");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->mode(), TargetMode::kTargeted);
  EXPECT_EQ((*target)->pid(), 4242);
  EXPECT_EQ((*target)->netnsInode(), 4026532000u);
  EXPECT_EQ((*target)->spec().container_id, "abc");
  EXPECT_EQ((*target)->spec().runtime, "containerd");
  ASSERT_EQ((*target)->spec().runtime_env.size(), 2u);
  EXPECT_EQ((*target)->spec().runtime_env[1].name(), "B");
  v1::TargetDescription d = (*target)->describe();
  EXPECT_EQ(d.container_id(), "abc");
  EXPECT_EQ(d.runtime(), "containerd");
  EXPECT_EQ(d.mode(), "targeted");
  // Resolved, then asked again once the pid was pinned.
  EXPECT_EQ(world.calls().size(), 2u);
}

TEST(OpenContainerTargetTest, RuntimeErrorsPassThrough) {
  fakes::FakeProcFs procfs;
  FakeRuntimes world;
  world.empty(RuntimeKind::kContainerd, kSock);
  RuntimeResolver resolver(containerdOnly(), world.factory());
  auto target = openContainerTarget(procfs, resolver, "abc");
  ASSERT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(),
            std::string("container abc not found in containerd (") + kSock + ")");
}

TEST(OpenContainerTargetTest, PidThatChangedBeforeItWasPinnedIsResolvedAgain) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(100);
  procfs.addProcess(200);
  FakeRuntimes world;
  int calls = 0;
  // First answer 100; from then on 200 (the container restarted meanwhile).
  world.script(RuntimeKind::kContainerd, kSock,
               [&calls](const std::string& id) -> absl::StatusOr<ResolvedContainer> {
                 ResolvedContainer r;
                 r.pid = ++calls == 1 ? 100 : 200;
                 r.runtime = "containerd";
                 r.container_id = id;
                 r.endpoint = kSock;
                 return r;
               });
  RuntimeResolver resolver(containerdOnly(), world.factory());
  auto target = openContainerTarget(procfs, resolver, "abc");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->pid(), 200);
  EXPECT_EQ(calls, 4);  // resolve 100, again 200; resolve 200, again 200
}

TEST(OpenContainerTargetTest, APidThatNeverHoldsStillIsAborted) {
  fakes::FakeProcFs procfs;
  for (pid_t p = 1; p <= 10; ++p) procfs.addProcess(p);
  FakeRuntimes world;
  int calls = 0;
  world.script(RuntimeKind::kContainerd, kSock,
               [&calls](const std::string& id) -> absl::StatusOr<ResolvedContainer> {
                 ResolvedContainer r;
                 r.pid = ++calls;
                 r.runtime = "containerd";
                 r.container_id = id;
                 r.endpoint = kSock;
                 return r;
               });
  RuntimeResolver resolver(containerdOnly(), world.factory());
  auto target = openContainerTarget(procfs, resolver, "abc");
  ASSERT_EQ(target.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(msg(target.status()), HasSubstr("changed its process"));
}

TEST(OpenContainerTargetTest, ProcessGoneIsNotFoundAfterRetries) {
  fakes::FakeProcFs procfs;  // pid 4242 does not exist
  FakeRuntimes world;
  world.runs(RuntimeKind::kContainerd, kSock, "abc", 4242);
  RuntimeResolver resolver(containerdOnly(), world.factory());
  auto target = openContainerTarget(procfs, resolver, "abc");
  ASSERT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(target.status().message(), "target process 4242 does not exist");
  EXPECT_EQ(world.calls().size(), static_cast<size_t>(kEnterAttempts));
}

TEST(OpenContainerTargetTest, PermissionErrorIsFinal) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(4242).netns_errno = EACCES;
  FakeRuntimes world;
  world.runs(RuntimeKind::kContainerd, kSock, "abc", 4242);
  RuntimeResolver resolver(containerdOnly(), world.factory());
  auto target = openContainerTarget(procfs, resolver, "abc");
  ASSERT_EQ(target.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(world.calls().size(), 1u);
}

const std::string kTargetId = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

TEST(OpenEphemeralTargetTest, WithoutAnIdItIsPidOne) {
  fakes::FakeProcFs procfs;
  procfs.setSelfPid(57);
  procfs.addProcess(1).netns_inode = 11;
  auto target = openEphemeralTarget(procfs, "");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->mode(), TargetMode::kEphemeral);
  EXPECT_EQ((*target)->pid(), 1);
  EXPECT_TRUE((*target)->spec().container_id.empty());
  EXPECT_EQ((*target)->describe().mode(), "ephemeral");
}

TEST(OpenEphemeralTargetTest, AgentThatIsPidOneSharesNoPidNamespace) {
  fakes::FakeProcFs procfs;
  procfs.setSelfPid(1);
  procfs.addProcess(1);
  auto target = openEphemeralTarget(procfs, "");
  ASSERT_EQ(target.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(msg(target.status()), HasSubstr("kubectl debug --target"));
}

TEST(OpenEphemeralTargetTest, ContainerIdFindsItsProcessByCgroup) {
  fakes::FakeProcFs procfs;
  procfs.setSelfPid(40);
  procfs.addProcess(1).cgroup = "0::/../cri-containerd-pause.scope\n";
  procfs.addProcess(12).cgroup = "0::/../cri-containerd-" + kTargetId + ".scope\n";
  procfs.addProcess(40).cgroup = "0::/\n";
  auto target = openEphemeralTarget(procfs, "containerd://" + kTargetId);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->pid(), 12);
  EXPECT_EQ((*target)->mode(), TargetMode::kEphemeral);
  EXPECT_EQ((*target)->spec().container_id, kTargetId);
  EXPECT_EQ((*target)->spec().runtime, "containerd");
  EXPECT_TRUE((*target)->spec().runtime_env.empty());
}

TEST(OpenEphemeralTargetTest, BareIdLeavesTheRuntimeUnnamed) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(5).cgroup = "4:memory:/docker/" + kTargetId + "\n";
  auto target = openEphemeralTarget(procfs, kTargetId);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->pid(), 5);
  EXPECT_EQ((*target)->spec().runtime, "");
}

TEST(OpenEphemeralTargetTest, UnknownContainerIsNotFound) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(1).cgroup = "0::/\n";
  auto target = openEphemeralTarget(procfs, kTargetId);
  ASSERT_EQ(target.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(msg(target.status()), HasSubstr("no process of container"));
}

TEST(OpenEphemeralTargetTest, MalformedIdIsInvalidArgument) {
  fakes::FakeProcFs procfs;
  EXPECT_EQ(openEphemeralTarget(procfs, "a/b").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace siphon::agent::runtime
