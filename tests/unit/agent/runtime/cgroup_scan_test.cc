// Finding a container's process by its cgroup: the line formats of cgroup v1
// and v2, and the cgroup path shapes of each runtime and cgroup driver.
#include "agent/runtime/cgroup_scan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "tests/fakes/fake_proc_fs.h"
#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using ::testing::HasSubstr;
using testing::msg;

const std::string kScanId = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const std::string kOther = "aaaa2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const std::string kPod = "kubepods-burstable-pod5f0c1a2b_3c4d_4e5f_8a9b_0c1d2e3f4a5b.slice";

TEST(CgroupNamesContainerTest, CgroupV2SystemdContainerd) {
  const std::string file =
      "0::/kubepods.slice/kubepods-burstable.slice/" + kPod + "/cri-containerd-" + kScanId + ".scope\n";
  EXPECT_TRUE(cgroupNamesContainer(file, kScanId));
  EXPECT_FALSE(cgroupNamesContainer(file, kOther));
}

TEST(CgroupNamesContainerTest, CgroupV2SystemdCrioAndItsNestedContainerCgroup) {
  EXPECT_TRUE(cgroupNamesContainer(
      "0::/kubepods.slice/kubepods-besteffort.slice/" + kPod + "/crio-" + kScanId + ".scope\n", kScanId));
  EXPECT_TRUE(cgroupNamesContainer(
      "0::/kubepods.slice/" + kPod + "/crio-" + kScanId + ".scope/container\n", kScanId));
}

TEST(CgroupNamesContainerTest, CrioConmonIsNotTheContainer) {
  EXPECT_FALSE(
      cgroupNamesContainer("0::/kubepods.slice/" + kPod + "/crio-conmon-" + kScanId + ".scope\n", kScanId));
}

TEST(CgroupNamesContainerTest, CgroupV1CgroupfsKubeletOneLinePerHierarchy) {
  const std::string file =
      "12:pids:/kubepods/burstable/pod5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b/" + kScanId +
      "\n"
      "11:cpu,cpuacct:/kubepods/burstable/pod5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b/" +
      kScanId +
      "\n"
      "1:name=systemd:/kubepods/burstable/pod5f0c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b/" +
      kScanId +
      "\n"
      "0::/\n";
  EXPECT_TRUE(cgroupNamesContainer(file, kScanId));
}

TEST(CgroupNamesContainerTest, DockerCgroupfsAndSystemd) {
  EXPECT_TRUE(cgroupNamesContainer("4:memory:/docker/" + kScanId + "\n", kScanId));
  EXPECT_TRUE(cgroupNamesContainer("0::/system.slice/docker-" + kScanId + ".scope\n", kScanId));
}

TEST(CgroupNamesContainerTest, PodmanLibpod) {
  EXPECT_TRUE(cgroupNamesContainer(
      "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + kScanId + ".scope\n",
      kScanId));
}

TEST(CgroupNamesContainerTest, RelativePathInsideAPrivateCgroupNamespace) {
  // An ephemeral container under cgroup v2 sees its siblings above its root.
  EXPECT_TRUE(cgroupNamesContainer("0::/../cri-containerd-" + kScanId + ".scope\n", kScanId));
}

TEST(CgroupNamesContainerTest, LastLineWithoutNewlineCounts) {
  EXPECT_TRUE(cgroupNamesContainer("0::/docker/" + kScanId, kScanId));
}

TEST(CgroupNamesContainerTest, OnlyWholeComponentsMatch) {
  const std::string file = "0::/docker/" + kScanId + "\n";
  EXPECT_FALSE(cgroupNamesContainer(file, kScanId.substr(0, 12))) << "a prefix of the ID";
  EXPECT_FALSE(cgroupNamesContainer("0::/docker/x" + kScanId + "\n", kScanId));
  EXPECT_FALSE(cgroupNamesContainer("0::/docker/" + kScanId + "-old\n", kScanId));
  EXPECT_FALSE(cgroupNamesContainer("0::/other-" + kScanId + ".scope\n", kScanId));
  EXPECT_FALSE(cgroupNamesContainer("0::/docker\n", "docker-"));
  EXPECT_FALSE(cgroupNamesContainer(file, ""));
}

TEST(CgroupNamesContainerTest, IdInTheControllerFieldDoesNotCount) {
  EXPECT_FALSE(cgroupNamesContainer("3:" + kScanId + ":/\n", kScanId));
}

TEST(CgroupNamesContainerTest, MalformedLinesAreIgnored) {
  EXPECT_FALSE(cgroupNamesContainer(kScanId + "\n", kScanId));
  EXPECT_FALSE(cgroupNamesContainer("0:" + kScanId + "\n", kScanId));
  EXPECT_TRUE(cgroupNamesContainer("garbage\n\n0::/docker/" + kScanId + "\n", kScanId));
}

TEST(CgroupNamesContainerTest, PathMayHoldColons) {
  EXPECT_TRUE(cgroupNamesContainer("0::/odd:dir/" + kScanId + "\n", kScanId));
}

std::string containerdCgroup(const std::string& id) {
  return "0::/kubepods.slice/" + kPod + "/cri-containerd-" + id + ".scope\n";
}

TEST(FindContainerPidTest, LowestPidOfTheContainerWins) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(1).cgroup = containerdCgroup(kOther);  // the pause container
  procfs.addProcess(14).cgroup = containerdCgroup(kScanId);    // a child
  procfs.addProcess(7).cgroup = containerdCgroup(kScanId);     // the target's init
  procfs.addProcess(30).cgroup = containerdCgroup(kOther);
  auto pid = findContainerPid(procfs, kScanId);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(*pid, 7);
}

TEST(FindContainerPidTest, TheAgentItselfIsSkipped) {
  fakes::FakeProcFs procfs;
  procfs.setSelfPid(3);
  procfs.addProcess(3).cgroup = containerdCgroup(kScanId);
  procfs.addProcess(9).cgroup = containerdCgroup(kScanId);
  EXPECT_EQ(*findContainerPid(procfs, kScanId), 9);
}

TEST(FindContainerPidTest, UnreadableOrVanishedProcessesAreSkipped) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(2).cgroup_errno = ENOENT;
  procfs.addProcess(4).cgroup_errno = EACCES;
  procfs.addProcess(8).cgroup = containerdCgroup(kScanId);
  EXPECT_EQ(*findContainerPid(procfs, kScanId), 8);
}

TEST(FindContainerPidTest, NoMatchIsNotFoundAndExplainsThePidNamespace) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(1).cgroup = containerdCgroup(kOther);
  procfs.addProcess(2).cgroup = containerdCgroup(kOther);
  procfs.addProcess(3).cgroup_errno = ENOENT;
  auto pid = findContainerPid(procfs, kScanId);
  ASSERT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(msg(pid.status()),
              HasSubstr("no process of container " + kScanId + " among the 2 processes"));
  EXPECT_THAT(msg(pid.status()), HasSubstr("share the target's PID namespace"));
}

// A restart caught half-way: runc's init is in the cgroup before it has
// pivoted into the container's root; it is not the target yet.
TEST(FindContainerPidTest, RuncSetupProcessesAreNotTheContainer) {
  fakes::FakeProcFs procfs;
  fakes::FakeProcess& init = procfs.addProcess(5);
  init.cgroup = containerdCgroup(kScanId);
  init.comm = "runc:[2:INIT]";
  auto pid = findContainerPid(procfs, kScanId);
  ASSERT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(msg(pid.status()), HasSubstr("still being started"));
  // Once it has exec'd the container's program, it is.
  init.comm = "sh";
  EXPECT_EQ(*findContainerPid(procfs, kScanId), 5);
  // A program of the container's next to runc's setup process wins.
  fakes::FakeProcess& child = procfs.addProcess(3);
  child.cgroup = containerdCgroup(kScanId);
  child.comm = "runc:[1:CHILD]";
  EXPECT_EQ(*findContainerPid(procfs, kScanId), 5);
}

TEST(FindContainerPidTest, ListingErrorPassesThrough) {
  fakes::FakeProcFs procfs;
  procfs.setListErrno(EACCES);
  EXPECT_EQ(findContainerPid(procfs, kScanId).status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace siphon::agent::runtime
