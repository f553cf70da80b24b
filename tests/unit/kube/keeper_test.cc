// The agent keeper against a scripted kubectl: reuse, start, failures and
// what is left behind (nothing).
#include "kube/keeper.h"
#include "kube/admission.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "tests/fakes/fake_kubectl.h"

namespace siphon::kube {
namespace {

using fakes::FakeKubectl;
using nlohmann::json;
using std::chrono::milliseconds;

ResolvedTarget target() {
  ResolvedTarget t;
  t.pod.name = "web-0";
  t.pod.ns = "shop";
  t.pod.uid = "uid-web-0";
  t.pod.node = "node-b";
  t.pod.containers = {"app"};
  t.container = "app";
  t.container_id = "containerd://abc";
  t.runtime = "containerd";
  return t;
}

json agentPodJson(const std::string& state, const std::string& name = "siphon-agent-x-1") {
  json status = {{"name", "siphon-agent"}, {"image", "img:1"}, {"ready", state == "running"}};
  if (state == "running") status["state"] = {{"running", json::object()}};
  if (state == "creating") status["state"] = {{"waiting", {{"reason", "ContainerCreating"}}}};
  if (state == "pull") {
    status["state"] = {
        {"waiting",
         {{"reason", "ImagePullBackOff"}, {"message", "Back-off pulling image \"img:1\""}}}};
  }
  if (state == "exited") {
    status["state"] = {{"terminated", {{"reason", "Error"}, {"exitCode", 3}}}};
  }
  return {{"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", "siphon"},
            {"uid", "agent-pod-uid"},
            {"labels",
             {{"app.kubernetes.io/name", "siphon-agent"},
              {"siphon.dev/protocol", "1.2"},
              {"job-name", "siphon-agent-old"}}},
            {"annotations", {{"siphon.dev/token-secret", "siphon-token-old"}}}}},
          {"spec",
           {{"nodeName", "node-b"},
            {"containers", json::array({{{"name", "siphon-agent"}, {"image", "img:1"}}})}}},
          {"status",
           {{"phase", state == "running"  ? "Running"
                      : state == "exited" ? "Failed"
                                          : "Pending"},
            {"containerStatuses", json::array({status})}}}};
}

std::string list(std::vector<json> items) {
  return json{{"kind", "List"}, {"items", items}}.dump();
}

struct FakeTime {
  std::chrono::steady_clock::time_point t{};
  AgentKeeper::Time time() {
    return {[this] { return t; }, [this](milliseconds d) { t += d; }};
  }
};

KeeperOptions options() {
  KeeperOptions o;
  o.image = "img:1";
  o.agent_ns = "siphon";
  o.version = "0.1.0";
  o.protocol = "1.2";
  return o;
}

void admitAll(FakeKubectl& k) {
  k.on("get namespace siphon", FakeKubectl::ok(R"({"kind":"Namespace","metadata":{"name":"siphon",
       "labels":{"pod-security.kubernetes.io/enforce":"privileged"}}})"));
  // Every permission allowed, in the one review call (a job agent's set;
  // another mode's count does not match, so it asks `auth can-i`).
  std::string allowed;
  for (size_t i = 0; i < permissionsFor(AgentMode::kJob, Kind::kPod, "shop", "siphon").size(); ++i) {
    allowed += "true\n";
  }
  k.on("create --validate=false", FakeKubectl::ok(allowed));
  k.on("auth can-i", FakeKubectl::ok("yes\n"));
  k.on("get node node-b", FakeKubectl::ok("node-uid-b"));
  k.on("create -f - -o name", FakeKubectl::ok("secret/siphon-token-x\n"));
  k.on("create -f - -o jsonpath={.metadata.uid}", FakeKubectl::ok("job-uid-1"));
  k.on("patch secret", FakeKubectl::ok("secret/x patched\n"));
  k.on("delete", FakeKubectl::ok(""));
}

struct Scenario {
  FakeKubectl k;
  FakeTime clock;
  std::vector<PhaseEvent> events;
  bool cancel = false;
  KeeperOptions opts = options();
  AgentKeeper keeper() {
    return AgentKeeper(
        k, opts, [this](const PhaseEvent& e) { events.push_back(e); },
        [this] { return cancel; }, clock.time());
  }
  std::vector<std::string> phases() const {
    std::vector<std::string> out;
    for (const auto& e : events) out.push_back(e.phase);
    return out;
  }
};

TEST(Keeper, ReusesARunningAgentOfTheSameContainer) {
  Scenario r;
  r.k.on("get pods -n siphon -l", FakeKubectl::ok(list({agentPodJson("running")})));
  r.k.on("get secret siphon-token-old",
         FakeKubectl::ok(
             json{{"kind", "Secret"},
                  {"metadata",
                   {{"name", "siphon-token-old"}, {"annotations", {{"siphon.dev/port", "7140"}}}}},
                  {"data", {{"token", absl::Base64Escape("the-token")}}}}
                 .dump()));
  auto keeper = r.keeper();
  auto a = keeper.ensure(target());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->created);
  EXPECT_EQ(a->token, "the-token");
  EXPECT_EQ(a->pod, "siphon-agent-x-1");
  EXPECT_EQ(a->name, "siphon-agent-old");
  EXPECT_EQ(r.phases(), (std::vector<std::string>{"reused"}));
  // Found by the labels naming the target pod's UID and container.
  auto get = r.k.callsStarting("get pods -n siphon -l");
  ASSERT_EQ(get.size(), 1u);
  EXPECT_NE(get[0].text().find("siphon.dev/target-pod-uid=uid-web-0"), std::string::npos);
  EXPECT_NE(get[0].text().find("siphon.dev/target-container=app"), std::string::npos);
  EXPECT_TRUE(r.k.callsStarting("create -f -").empty());
  // A reused agent is never removed.
  EXPECT_TRUE(keeper.remove(*a).ok());
  EXPECT_TRUE(r.k.callsStarting("delete").empty());
}

std::string secretJson(const std::string& fs_mode) {
  json ann = {{"siphon.dev/port", "7140"}};
  if (!fs_mode.empty()) ann["siphon.dev/fs-mode"] = fs_mode;
  return json{{"kind", "Secret"},
              {"metadata", {{"name", "siphon-token-old"}, {"annotations", ann}}},
              {"data", {{"token", absl::Base64Escape("the-token")}}}}
      .dump();
}

TEST(Keeper, AnAgentServingFilesOtherwiseThanAskedIsNotReused) {
  // The running agent serves files read-only (its Secret says so, or says
  // nothing: the agent's default); the session asks rw: a new agent, with
  // the write capabilities and --fs-mode rw, and its Secret says rw.
  for (const std::string running : {"", "ro"}) {
    Scenario r;
    r.opts.fs_mode = "rw";
    admitAll(r.k);
    r.k.on("get pods -n siphon -l app.kubernetes.io/name*",
           FakeKubectl::ok(list({agentPodJson("running")})));
    r.k.on("get secret siphon-token-old", FakeKubectl::ok(secretJson(running)));
    r.k.on("get pods -n siphon -l siphon.dev/session*",
           FakeKubectl::ok(list({agentPodJson("running")})));
    r.k.on("logs", FakeKubectl::ok("siphon-agent ready version=0.1.0 listen=127.0.0.1:7140\n"));
    auto a = r.keeper().ensure(target());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->created) << running;
    auto creates = r.k.callsStarting("create -f -");
    ASSERT_EQ(creates.size(), 2u);
    EXPECT_EQ(json::parse(creates[0].input)["metadata"]["annotations"]["siphon.dev/fs-mode"], "rw");
    const json c = json::parse(creates[1].input)["spec"]["template"]["spec"]["containers"][0];
    std::vector<std::string> args = c["args"];
    auto it = std::find(args.begin(), args.end(), "--fs-mode");
    ASSERT_NE(it, args.end());
    EXPECT_EQ(*(it + 1), "rw");
    std::vector<std::string> caps = c["securityContext"]["capabilities"]["add"];
    for (const char* cap : {"DAC_OVERRIDE", "FOWNER", "CHOWN", "FSETID"}) {
      EXPECT_NE(std::find(caps.begin(), caps.end(), cap), caps.end()) << cap;
    }
  }
  // The same agent is reused by a session that asks what it serves.
  for (const std::string asked : {"ro", "rw"}) {
    Scenario r;
    r.opts.fs_mode = asked;
    r.k.on("get pods -n siphon -l", FakeKubectl::ok(list({agentPodJson("running")})));
    r.k.on("get secret siphon-token-old", FakeKubectl::ok(secretJson(asked)));
    auto a = r.keeper().ensure(target());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_FALSE(a->created) << asked;
    EXPECT_TRUE(r.k.callsStarting("create -f -").empty());
  }
}

TEST(Keeper, StartsAJobAndSaysEachPhase) {
  Scenario r;
  admitAll(r.k);
  r.k.on("get pods -n siphon -l app.kubernetes.io/name*", FakeKubectl::ok(list({})));
  r.k.onSequence("get pods -n siphon -l siphon.dev/session*",
                 {FakeKubectl::ok(list({})), FakeKubectl::ok(list({agentPodJson("creating")})),
                  FakeKubectl::ok(list({agentPodJson("running")}))});
  r.k.onSequence("logs",
                 {FakeKubectl::ok("starting\n"),
                  FakeKubectl::ok("siphon-agent ready version=0.1.0 listen=127.0.0.1:7140\n")});
  auto keeper = r.keeper();
  auto a = keeper.ensure(target());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->created);
  EXPECT_EQ(a->pod, "siphon-agent-x-1");
  EXPECT_EQ(a->token.size(), 64u);
  EXPECT_EQ(r.phases(),
            (std::vector<std::string>{"creating", "scheduled", "pulling", "started", "ready"}));
  // The Secret first (owned by the Node), then the Job, then the Secret is the Job's.
  auto creates = r.k.callsStarting("create -f -");
  ASSERT_EQ(creates.size(), 2u);
  json secret = json::parse(creates[0].input);
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["stringData"]["token"], a->token);
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], "node-uid-b");
  json job = json::parse(creates[1].input);
  EXPECT_EQ(job["kind"], "Job");
  EXPECT_EQ(job["spec"]["template"]["spec"]["nodeName"], "node-b");
  auto patch = r.k.callsStarting("patch secret");
  ASSERT_EQ(patch.size(), 1u);
  EXPECT_NE(patch[0].text().find("\"uid\":\"job-uid-1\""), std::string::npos) << patch[0].text();
  // Its removal: the Job (its pod with it) and the Secret.
  EXPECT_TRUE(keeper.remove(*a).ok());
  auto deletes = r.k.callsStarting("delete");
  ASSERT_EQ(deletes.size(), 2u);
  EXPECT_EQ(deletes[0].args[1], "job");
  EXPECT_EQ(deletes[1].args[1], "secret");
}

TEST(Keeper, AnImageThatCannotBePulledFailsInSecondsAndLeavesNothing) {
  Scenario r;
  admitAll(r.k);
  r.k.on("get pods -n siphon -l app.kubernetes.io/name*", FakeKubectl::ok(list({})));
  r.k.onSequence("get pods -n siphon -l siphon.dev/session*",
                 {FakeKubectl::ok(list({agentPodJson("creating")})),
                  FakeKubectl::ok(list({agentPodJson("pull")}))});
  auto keeper = r.keeper();
  auto a = keeper.ensure(target());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("the agent image img:1 cannot be pulled on node-b "
                                      "(ImagePullBackOff"),
            std::string::npos)
      << a.status();
  EXPECT_LT(r.clock.t.time_since_epoch(), std::chrono::seconds(5));
  auto deletes = r.k.callsStarting("delete");
  ASSERT_EQ(deletes.size(), 2u);
  EXPECT_EQ(deletes[0].args[1], "job");
  EXPECT_EQ(deletes[1].args[1], "secret");
}

TEST(Keeper, AnAgentThatExitsIsToldWithItsLastLogLines) {
  Scenario r;
  admitAll(r.k);
  r.k.on("get pods -n siphon -l app.kubernetes.io/name*", FakeKubectl::ok(list({})));
  r.k.on("get pods -n siphon -l siphon.dev/session*",
         FakeKubectl::ok(list({agentPodJson("exited")})));
  r.k.on("logs",
         FakeKubectl::ok("{\"level\":\"error\",\"msg\":\"no container runtime answered\"}\n"));
  auto keeper = r.keeper();
  auto a = keeper.ensure(target());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(),
            "the agent exited (Error, exit code 3); its last log lines: "
            "{\"level\":\"error\",\"msg\":\"no container runtime answered\"}");
  EXPECT_EQ(r.k.callsStarting("delete").size(), 2u);
}

TEST(Keeper, PodSecurityOrRbacRefuseBeforeAnythingIsCreated) {
  {
    Scenario r;
    r.k.on("get pods -n siphon -l", FakeKubectl::ok(list({})));
    r.k.on("get namespace siphon",
           FakeKubectl::ok(R"({"kind":"Namespace","metadata":{"name":"siphon",
         "labels":{"pod-security.kubernetes.io/enforce":"restricted"}}})"));
    r.k.on("get namespaces -l", FakeKubectl::ok("debug tools"));
    auto keeper = r.keeper();
    auto a = keeper.ensure(target());
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("namespace siphon enforces Pod Security \"restricted\""),
              std::string::npos);
    EXPECT_NE(a.status().message().find("(such as debug, tools)"), std::string::npos) << a.status();
    EXPECT_TRUE(r.k.callsStarting("create -f -").empty());
  }
  {
    Scenario r;
    admitAll(r.k);
    r.k.on("get pods -n siphon -l", FakeKubectl::ok(list({})));
    r.k.on("create --validate=false", FakeKubectl::fail("error: the server doesn't have a "
                                                        "resource type \"selfsubjectaccessreviews\""));
    r.k.on("auth can-i create pods --subresource=portforward", {1, "no\n", ""});
    auto keeper = r.keeper();
    auto a = keeper.ensure(target());
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_NE(a.status().message().find("you may not create pods/portforward in namespace siphon"),
              std::string::npos)
        << a.status();
    EXPECT_TRUE(r.k.callsStarting("create -f -").empty());
  }
}

TEST(Keeper, ACancelledStartRemovesWhatItMade) {
  Scenario r;
  admitAll(r.k);
  r.k.on("get pods -n siphon -l app.kubernetes.io/name*", FakeKubectl::ok(list({})));
  r.k.on("get pods -n siphon -l siphon.dev/session*",
         FakeKubectl::ok(list({agentPodJson("creating")})));
  // Ctrl-C while the image is pulled.
  AgentKeeper keeper(
      r.k, options(),
      [&](const PhaseEvent& e) {
        r.events.push_back(e);
        if (e.phase == "pulling") r.cancel = true;
      },
      [&] { return r.cancel; }, r.clock.time());
  auto a = keeper.ensure(target());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(r.k.callsStarting("delete").size(), 2u);
}

TEST(Keeper, TimesOutSayingWhatItWaitedFor) {
  Scenario r;
  admitAll(r.k);
  r.k.on("get pods -n siphon -l app.kubernetes.io/name*", FakeKubectl::ok(list({})));
  r.k.on("get pods -n siphon -l siphon.dev/session*",
         FakeKubectl::ok(list({agentPodJson("running")})));
  r.k.on("logs", FakeKubectl::ok("still opening the target\n"));
  auto keeper = r.keeper();
  auto a = keeper.ensure(target());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(a.status().message().find("waiting for the agent's ready line"), std::string::npos);
  EXPECT_EQ(r.k.callsStarting("delete").size(), 2u);
}

TEST(Keeper, AJobWhosePodIsRefusedSaysWhy) {
  Scenario r;
  admitAll(r.k);
  r.k.on("get pods -n siphon -l app.kubernetes.io/name*", FakeKubectl::ok(list({})));
  r.k.on("get pods -n siphon -l siphon.dev/session*", FakeKubectl::ok(list({})));
  r.k.on("get events", FakeKubectl::ok("FailedCreate\tError creating: pods \"siphon-agent-x\" is "
                                       "forbidden: violates PodSecurity \"baseline:latest\": "
                                       "hostPID\n"));
  auto keeper = r.keeper();
  auto a = keeper.ensure(target());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("enforces Pod Security \"baseline\" and refused the agent"),
            std::string::npos)
      << a.status();
  EXPECT_EQ(r.k.callsStarting("delete").size(), 2u);
}

}  // namespace
}  // namespace siphon::kube
