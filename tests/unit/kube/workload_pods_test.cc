// Which pods a workload session covers (layer-protocol/kube/workload_pods.h),
// fed the events a pod watch gives through scale-ups, drains, rollouts, a
// watch's relisting, a node gone NotReady and a StatefulSet pod recreated.
#include "kube/workload_pods.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace siphon::kube {
namespace {

using Type = PodEvent::Type;

// A pod of one container, "app"; Ready, or Pending while its container is
// created.
PodInfo pod(const std::string& name, const std::string& uid, const std::string& created,
            bool ready = true) {
  PodInfo p;
  p.name = name;
  p.ns = "shop";
  p.uid = uid;
  p.creation = created;
  p.node = "node-a";
  p.containers = {"app"};
  p.phase = ready ? "Running" : "Pending";
  p.conditions = {{"PodScheduled", "True", "", ""}, {"Ready", ready ? "True" : "False", "", ""}};
  ContainerState s;
  s.name = "app";
  s.running = ready;
  s.ready = ready;
  if (!ready) s.waiting_reason = "ContainerCreating";
  p.statuses = {s};
  return p;
}

PodInfo terminating(PodInfo p, const std::string& at = "2024-05-01T10:00:00Z") {
  p.terminating = true;
  p.deleted_at = at;
  return p;
}

// The actions as lines: "cover web-a", "retire web-a: why", "primary web-a".
std::vector<std::string> feed(WorkloadPods& w, Type type, const PodInfo& p) {
  std::vector<std::string> out;
  for (const auto& a : w.onEvent({type, p})) {
    switch (a.kind) {
      case WorkloadPods::Action::kCover:
        out.push_back("cover " + a.pod.name);
        break;
      case WorkloadPods::Action::kRetire:
        out.push_back("retire " + a.pod.name + ": " + a.reason);
        break;
      case WorkloadPods::Action::kPrimary:
        out.push_back("primary " + a.pod.name);
        break;
    }
  }
  return out;
}

std::vector<std::string> names(const std::vector<PodInfo>& pods) {
  std::vector<std::string> out;
  for (const auto& p : pods) out.push_back(p.name);
  return out;
}

using Lines = std::vector<std::string>;

TEST(WorkloadPods, AScaleUpCoversEachPodOnceAndKeepsThePrimary) {
  WorkloadPods w("", false);
  EXPECT_EQ(feed(w, Type::kAdded, pod("web-a", "ua", "2024-05-01T09:00:01Z")),
            (Lines{"cover web-a", "primary web-a"}));
  EXPECT_EQ(feed(w, Type::kAdded, pod("web-b", "ub", "2024-05-01T09:00:02Z", false)), Lines{});
  EXPECT_EQ(feed(w, Type::kModified, pod("web-b", "ub", "2024-05-01T09:00:02Z")),
            Lines{"cover web-b"});
  EXPECT_EQ(feed(w, Type::kModified, pod("web-b", "ub", "2024-05-01T09:00:02Z")), Lines{});
  // Older than the primary: covered, but the primary stays where it is.
  EXPECT_EQ(feed(w, Type::kAdded, pod("web-c", "uc", "2024-05-01T08:00:00Z")),
            Lines{"cover web-c"});
  ASSERT_TRUE(w.primary());
  EXPECT_EQ(w.primary()->name, "web-a");
  EXPECT_EQ(names(w.covered()), (Lines{"web-c", "web-a", "web-b"}));
  EXPECT_EQ(w.readyCount(), 3);
  EXPECT_EQ(w.waitingReason(), "");
}

TEST(WorkloadPods, ADrainRetiresOnceAndMovesThePrimaryToTheNextOldest) {
  WorkloadPods w("", false);
  feed(w, Type::kAdded, pod("web-c", "uc", "2024-05-01T09:00:03Z"));
  feed(w, Type::kAdded, pod("web-a", "ua", "2024-05-01T09:00:01Z"));
  feed(w, Type::kAdded, pod("web-b", "ub", "2024-05-01T09:00:02Z"));
  ASSERT_TRUE(w.primary());
  EXPECT_EQ(w.primary()->name, "web-c");  // covered first
  EXPECT_EQ(feed(w, Type::kModified, terminating(pod("web-c", "uc", "2024-05-01T09:00:03Z"))),
            (Lines{"retire web-c: pod web-c is terminating (deleted at 2024-05-01T10:00:00Z)",
                   "primary web-a"}));
  EXPECT_EQ(feed(w, Type::kModified, terminating(pod("web-c", "uc", "2024-05-01T09:00:03Z"))),
            Lines{});
  EXPECT_EQ(feed(w, Type::kDeleted, terminating(pod("web-c", "uc", "2024-05-01T09:00:03Z"))),
            Lines{});
  // Deleted at once (grace period 0): no terminating state seen first.
  EXPECT_EQ(feed(w, Type::kDeleted, pod("web-a", "ua", "2024-05-01T09:00:01Z")),
            (Lines{"retire web-a: pod web-a was deleted", "primary web-b"}));
  EXPECT_EQ(names(w.covered()), Lines{"web-b"});
  EXPECT_EQ(w.readyCount(), 1);
}

TEST(WorkloadPods, ARolloutCoversTheNewPodsWhileTheOldOnesGo) {
  WorkloadPods w("", false);
  const PodInfo old1 = pod("web-7f-aaaaa", "o1", "2024-05-01T09:00:01Z");
  const PodInfo old2 = pod("web-7f-bbbbb", "o2", "2024-05-01T09:00:02Z");
  const PodInfo new1 = pod("web-9c-ccccc", "n1", "2024-05-01T11:00:01Z");
  const PodInfo new2 = pod("web-9c-ddddd", "n2", "2024-05-01T11:00:02Z");
  feed(w, Type::kAdded, old1);
  feed(w, Type::kAdded, old2);
  EXPECT_EQ(feed(w, Type::kAdded, pod(new1.name, new1.uid, new1.creation, false)), Lines{});
  EXPECT_EQ(feed(w, Type::kModified, new1), Lines{"cover web-9c-ccccc"});
  EXPECT_EQ(feed(w, Type::kModified, terminating(old1)),
            (Lines{"retire web-7f-aaaaa: pod web-7f-aaaaa is terminating (deleted at "
                   "2024-05-01T10:00:00Z)",
                   "primary web-7f-bbbbb"}));
  EXPECT_EQ(feed(w, Type::kAdded, new2), Lines{"cover web-9c-ddddd"});
  EXPECT_EQ(feed(w, Type::kModified, terminating(old2)),
            (Lines{"retire web-7f-bbbbb: pod web-7f-bbbbb is terminating (deleted at "
                   "2024-05-01T10:00:00Z)",
                   "primary web-9c-ccccc"}));
  EXPECT_EQ(feed(w, Type::kDeleted, terminating(old1)), Lines{});
  EXPECT_EQ(feed(w, Type::kDeleted, terminating(old2)), Lines{});
  EXPECT_EQ(names(w.covered()), (Lines{"web-9c-ccccc", "web-9c-ddddd"}));
}

TEST(WorkloadPods, ARestartedWatchListingEverythingAgainCoversNothingTwice) {
  WorkloadPods w("", false);
  const PodInfo a = pod("web-a", "ua", "2024-05-01T09:00:01Z");
  const PodInfo b = pod("web-b", "ub", "2024-05-01T09:00:02Z");
  feed(w, Type::kAdded, a);
  feed(w, Type::kAdded, b);
  // The restart's list had web-x gone (never seen here), then the relisting.
  EXPECT_EQ(feed(w, Type::kDeleted, pod("web-x", "ux", "2024-05-01T09:00:00Z")), Lines{});
  EXPECT_EQ(feed(w, Type::kAdded, b), Lines{});
  EXPECT_EQ(feed(w, Type::kAdded, a), Lines{});
  EXPECT_EQ(names(w.covered()), (Lines{"web-a", "web-b"}));
  EXPECT_EQ(w.primary()->name, "web-a");
}

TEST(WorkloadPods, APodOnANodeGoneNotReadyIsRetiredAndCoveredAgainWhenItComesBack) {
  WorkloadPods w("", false);
  PodInfo a = pod("web-a", "ua", "2024-05-01T09:00:01Z");
  a.node = "node-b";
  feed(w, Type::kAdded, a);
  feed(w, Type::kAdded, pod("web-b", "ub", "2024-05-01T09:00:02Z"));
  // The node controller turns Ready False; the containers' last state, from
  // the kubelet that went silent, still says running and ready.
  PodInfo lost = a;
  lost.conditions[1] = {"Ready", "False", "NodeLost", "Node node-b is unresponsive"};
  EXPECT_EQ(feed(w, Type::kModified, lost),
            (Lines{"retire web-a: pod web-a is not Ready (phase Running, Ready False: NodeLost "
                   "(Node node-b is unresponsive) on node node-b)",
                   "primary web-b"}));
  EXPECT_EQ(w.readyCount(), 1);
  EXPECT_EQ(feed(w, Type::kModified, a), Lines{"cover web-a"});  // the primary stays web-b
  EXPECT_EQ(w.primary()->name, "web-b");
}

TEST(WorkloadPods, ACrashLoopSaysWhichContainerWaitsAndWhy) {
  WorkloadPods w("", false);
  feed(w, Type::kAdded, pod("web-a", "ua", "2024-05-01T09:00:01Z"));
  PodInfo crashing = pod("web-a", "ua", "2024-05-01T09:00:01Z");
  crashing.conditions[1].status = "False";
  crashing.statuses[0].running = false;
  crashing.statuses[0].ready = false;
  crashing.statuses[0].waiting_reason = "CrashLoopBackOff";
  EXPECT_EQ(feed(w, Type::kModified, crashing),
            (Lines{"retire web-a: pod web-a is not Ready (phase Running, container app waiting: "
                   "CrashLoopBackOff)"}));
  EXPECT_FALSE(w.primary());
  EXPECT_EQ(w.waitingReason(), "web-a: phase Running, container app waiting: CrashLoopBackOff");
}

TEST(WorkloadPods, AStatefulSetPodRecreatedUnderItsNameIsANewPod) {
  WorkloadPods w("", false);
  const PodInfo first = pod("db-0", "uid-1", "2024-05-01T09:00:00Z");
  const PodInfo second = pod("db-0", "uid-2", "2024-05-01T10:00:05Z");
  feed(w, Type::kAdded, first);
  EXPECT_EQ(feed(w, Type::kModified, terminating(first)),
            (Lines{"retire db-0: pod db-0 is terminating (deleted at 2024-05-01T10:00:00Z)"}));
  // The new one may be told of before the old one's DELETED.
  EXPECT_EQ(feed(w, Type::kAdded, pod("db-0", "uid-2", second.creation, false)), Lines{});
  EXPECT_EQ(feed(w, Type::kDeleted, terminating(first)), Lines{});
  auto actions = w.onEvent({Type::kModified, second});
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, WorkloadPods::Action::kCover);
  EXPECT_EQ(actions[0].pod.uid, "uid-2");
  EXPECT_EQ(actions[1].kind, WorkloadPods::Action::kPrimary);
  EXPECT_EQ(actions[1].pod.uid, "uid-2");
  EXPECT_EQ(w.covered().size(), 1u);
}

TEST(WorkloadPods, SingleModeCoversOnlyThePrimaryAndThenTheNextOldest) {
  WorkloadPods w("", true);
  const PodInfo a = pod("web-a", "ua", "2024-05-01T09:00:01Z");
  EXPECT_EQ(feed(w, Type::kAdded, a), (Lines{"cover web-a", "primary web-a"}));
  EXPECT_EQ(feed(w, Type::kAdded, pod("web-b", "ub", "2024-05-01T09:00:02Z")), Lines{});
  EXPECT_EQ(feed(w, Type::kAdded, pod("web-c", "uc", "2024-05-01T08:00:00Z")), Lines{});
  EXPECT_EQ(names(w.covered()), Lines{"web-a"});
  EXPECT_EQ(w.readyCount(), 3);
  EXPECT_EQ(feed(w, Type::kModified, terminating(a)),
            (Lines{"retire web-a: pod web-a is terminating (deleted at 2024-05-01T10:00:00Z)",
                   "cover web-c", "primary web-c"}));
  EXPECT_EQ(names(w.covered()), Lines{"web-c"});
}

TEST(WorkloadPods, APodWhoseContainerIsNotRunningIsNotReadyForTheSession) {
  WorkloadPods named("worker", false);
  PodInfo two = pod("web-a", "ua", "2024-05-01T09:00:01Z");
  EXPECT_EQ(feed(named, Type::kAdded, two), Lines{});
  EXPECT_EQ(named.waitingReason(),
            "web-a: pod/web-a has no container 'worker'; its containers: app");
  two.containers = {"app", "worker"};
  ContainerState worker;
  worker.name = "worker";
  worker.terminated = true;
  worker.terminated_reason = "Completed";
  two.statuses.push_back(worker);
  // The pod's Ready condition is still True (not updated yet): the
  // container's own state decides.
  EXPECT_EQ(feed(named, Type::kModified, two), Lines{});
  EXPECT_EQ(named.waitingReason(), "web-a: container worker is not running");
  two.statuses[1].terminated = false;
  two.statuses[1].running = two.statuses[1].ready = true;
  EXPECT_EQ(feed(named, Type::kModified, two), (Lines{"cover web-a", "primary web-a"}));
  // No name: the mesh sidecar is never the one chosen.
  WorkloadPods unnamed("", false);
  PodInfo meshed = pod("web-b", "ub", "2024-05-01T09:00:01Z");
  meshed.containers = {"istio-proxy", "app"};
  meshed.statuses[0].running = false;
  meshed.statuses[0].waiting_reason = "CrashLoopBackOff";
  meshed.statuses.insert(meshed.statuses.begin(), ContainerState{});
  meshed.statuses[0].name = "istio-proxy";
  meshed.statuses[0].running = true;
  EXPECT_EQ(feed(unnamed, Type::kAdded, meshed), Lines{});
  EXPECT_EQ(unnamed.waitingReason(), "web-b: container app is not running");
}

TEST(WorkloadPods, WhatIsWaitedForWhenNoPodIsReady) {
  WorkloadPods w("", false);
  EXPECT_EQ(w.waitingReason(), "no pods (scaled to zero?)");
  PodInfo unschedulable = pod("web-5d8f-x2", "u1", "2024-05-01T09:00:02Z", false);
  unschedulable.conditions[0] = {"PodScheduled", "False", "Unschedulable",
                                 "0/2 nodes are available: 1 node(s) were unschedulable"};
  unschedulable.statuses.clear();
  feed(w, Type::kAdded, unschedulable);
  feed(w, Type::kAdded, pod("web-5d8f-y7", "u2", "2024-05-01T09:00:01Z", false));
  EXPECT_EQ(w.readyCount(), 0);
  EXPECT_EQ(w.waitingReason(),
            "web-5d8f-x2: phase Pending, Unschedulable: 0/2 nodes are available: 1 node(s) were "
            "unschedulable; web-5d8f-y7: phase Pending, container app waiting: ContainerCreating");
  feed(w, Type::kModified, pod("web-5d8f-y7", "u2", "2024-05-01T09:00:01Z"));
  EXPECT_EQ(w.waitingReason(), "");
  feed(w, Type::kDeleted, pod("web-5d8f-y7", "u2", "2024-05-01T09:00:01Z"));
  feed(w, Type::kDeleted, unschedulable);
  EXPECT_EQ(w.waitingReason(), "no pods (scaled to zero?)");
}

}  // namespace
}  // namespace siphon::kube
