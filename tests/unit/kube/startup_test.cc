// Phase lines and failures from sequences of agent pods as kubectl shows them.
#include "kube/startup.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace siphon::kube {
namespace {

using std::chrono::milliseconds;

PodInfo agentPod(const std::string& waiting = "", bool running = false, bool terminated = false) {
  PodInfo p;
  p.name = "siphon-agent-k3x9q-abcde";
  p.ns = "siphon";
  p.node = "node-b";
  p.phase = running ? "Running" : terminated ? "Failed" : "Pending";
  ContainerState c;
  c.name = "siphon-agent";
  c.waiting_reason = waiting;
  c.running = running;
  if (waiting == "ErrImagePull") c.waiting_message = "rpc error: code = NotFound desc = not found";
  if (terminated) {
    c.terminated = true;
    c.terminated_reason = "Error";
    c.exit_code = 7;
  }
  p.statuses.push_back(c);
  return p;
}

std::vector<std::string> phases(const std::vector<PhaseEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.phase);
  return out;
}

TEST(Startup, ScheduledPullingStartedReady) {
  StartupTracker t("siphon-agent", "registry.example/siphon-agent:0.1.0", false);
  EXPECT_TRUE(t.observe(std::nullopt, milliseconds(100)).empty());
  auto e = t.observe(agentPod("ContainerCreating"), milliseconds(400));
  EXPECT_EQ(phases(e), (std::vector<std::string>{"scheduled", "pulling"}));
  EXPECT_EQ(e[0].text, "scheduled on node-b");
  EXPECT_EQ(e[1].text, "pulling registry.example/siphon-agent:0.1.0 (unless the node has it)");
  EXPECT_TRUE(t.observe(agentPod("ContainerCreating"), milliseconds(900)).empty());  // once each
  e = t.observe(agentPod("", true), milliseconds(2400));
  EXPECT_EQ(phases(e), (std::vector<std::string>{"started"}));
  EXPECT_EQ(t.state(), StartupTracker::State::kRunning);
  e = t.logsSaidReady(milliseconds(2500));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "agent ready after 2.5 s");
  EXPECT_TRUE(t.done());
}

TEST(Startup, ImageProblemsFailAtOnce) {
  for (const char* reason : {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}) {
    StartupTracker t("siphon-agent", "registry.example/nope:1", false);
    (void)t.observe(agentPod("ContainerCreating"), milliseconds(100));
    auto e = t.observe(agentPod(reason), milliseconds(1200));
    ASSERT_FALSE(e.empty());
    EXPECT_EQ(e.back().phase, "failed");
    EXPECT_EQ(t.state(), StartupTracker::State::kFailed);
    EXPECT_NE(t.failure().find(absl::StrCat("the agent image registry.example/nope:1 cannot be "
                                            "pulled on node-b (",
                                            reason)),
              std::string::npos)
        << t.failure();
    EXPECT_NE(t.failure().find("--agent-image"), std::string::npos);
    EXPECT_FALSE(t.wantsLogs());
  }
}

TEST(Startup, UnschedulableAndRefusedByTheKubelet) {
  StartupTracker t("siphon-agent", "img", false);
  PodInfo p;
  p.name = "siphon-agent-x";
  p.phase = "Pending";
  p.conditions.push_back({"PodScheduled", "False", "Unschedulable",
                          "0/2 nodes are available: 2 node(s) had untolerated taint"});
  auto e = t.observe(p, milliseconds(500));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text,
            "the agent pod siphon-agent-x cannot be scheduled: 0/2 nodes are available: 2 "
            "node(s) had untolerated taint");

  StartupTracker k("siphon-agent", "img", false);
  PodInfo refused;
  refused.name = "siphon-agent-y";
  refused.node = "node-a";
  refused.phase = "Failed";
  refused.conditions.push_back({"Ready", "False", "", "Pod was rejected: OutOfcpu"});
  e = k.observe(refused, milliseconds(500));
  EXPECT_EQ(e.back().phase, "failed");
  EXPECT_NE(k.failure().find("failed on node-a"), std::string::npos) << k.failure();
  EXPECT_NE(k.failure().find("OutOfcpu"), std::string::npos) << k.failure();
}

TEST(Startup, AnExitedAgentWantsItsLogs) {
  StartupTracker t("siphon-agent", "img", false);
  (void)t.observe(agentPod("", true), milliseconds(100));
  auto e = t.observe(agentPod("", false, true), milliseconds(900));
  EXPECT_EQ(e.back().phase, "failed");
  EXPECT_EQ(t.failure(), "the agent exited (Error, exit code 7)");
  EXPECT_TRUE(t.wantsLogs());
}

TEST(Startup, EphemeralContainersAreReadFromTheirOwnStatuses) {
  StartupTracker t("siphon-agent-k3x9q", "img", true);
  PodInfo p;
  p.name = "web-0";
  p.node = "node-a";
  p.phase = "Running";
  ContainerState app;
  app.name = "app";
  app.running = true;
  p.statuses.push_back(app);
  auto e = t.observe(p, milliseconds(100));
  EXPECT_EQ(phases(e), (std::vector<std::string>{"scheduled"}));
  ContainerState agent;
  agent.name = "siphon-agent-k3x9q";
  agent.waiting_reason = "CreateContainerConfigError";
  agent.waiting_message = "secret \"siphon-token-k3x9q\" not found";
  p.ephemeral_statuses.push_back(agent);
  e = t.observe(p, milliseconds(300));
  EXPECT_EQ(t.failure(),
            "the agent container cannot start (CreateContainerConfigError: secret "
            "\"siphon-token-k3x9q\" not found)");
}

TEST(Startup, TimeoutSaysWhatItWaitedFor) {
  StartupTracker t("siphon-agent", "img", false);
  (void)t.observe(agentPod("", true), milliseconds(100));
  PhaseEvent e = t.timedOut(milliseconds(120000));
  EXPECT_EQ(e.text,
            "the agent did not get ready within 120.0 s (waiting for the agent's ready line)");
}

}  // namespace
}  // namespace siphon::kube
