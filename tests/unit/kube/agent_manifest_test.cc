// The objects created for an agent hold to images/k8s/ and
// images/capabilities.txt (tests/deploy/check_generated_manifests.py holds
// them to the YAML files field by field, and runs check_manifests.py).
#include "kube/agent_manifest.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "tests/unit/kube/sample_spec.h"

namespace siphon::kube {
namespace {

using nlohmann::json;

AgentSpec jobSpec() { return sampleJobSpec("web-7f9c6d8b5-2xkqp"); }

std::vector<std::string> capabilitiesFile() {
  std::ifstream in(std::string(SIPHON_SOURCE_DIR) + "/images/capabilities.txt");
  std::vector<std::string> caps;
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    while (!line.empty() && isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    if (!line.empty()) caps.push_back(line);
  }
  return caps;
}

TEST(AgentManifest, CapabilitiesAreExactlyTheFile) {
  auto file = capabilitiesFile();
  ASSERT_FALSE(file.empty());
  EXPECT_EQ(agentCapabilities(), file);
}

TEST(AgentManifest, TheFileModeSetsTheAgentsOptionAndCapabilities) {
  // ro, the agent's default: no option, exactly the file's set.
  AgentSpec s = jobSpec();
  std::vector<std::string> args = agentArgs(s);
  EXPECT_EQ(std::find(args.begin(), args.end(), "--fs-mode"), args.end());
  // rw: the option, and what the agent keeps for it (the file's comment).
  for (AgentMode mode : {AgentMode::kJob, AgentMode::kEphemeral}) {
    s.mode = mode;
    s.fs_mode = "rw";
    args = agentArgs(s);
    auto it = std::find(args.begin(), args.end(), "--fs-mode");
    ASSERT_NE(it, args.end());
    EXPECT_EQ(*(it + 1), "rw");
    json c = mode == AgentMode::kJob
                 ? json::parse(jobManifest(s))["spec"]["template"]["spec"]["containers"][0]
                 : json::parse(ephemeralPatch(s))["spec"]["ephemeralContainers"][0];
    std::vector<std::string> want = capabilitiesFile();
    want.insert(want.end(), {"DAC_OVERRIDE", "FOWNER", "CHOWN", "FSETID"});
    EXPECT_EQ(c["securityContext"]["capabilities"]["add"].get<std::vector<std::string>>(), want);
  }
  // off: no file helper, so neither SETUID nor SETGID.
  s.fs_mode = "off";
  std::vector<std::string> caps = agentCapabilities("off");
  EXPECT_EQ(std::find(caps.begin(), caps.end(), "SETUID"), caps.end());
  EXPECT_EQ(std::find(caps.begin(), caps.end(), "SETGID"), caps.end());
  EXPECT_EQ(caps.size(), capabilitiesFile().size() - 2);
  args = agentArgs(s);
  EXPECT_NE(std::find(args.begin(), args.end(), "off"), args.end());
}

TEST(AgentManifest, JobIsPinnedOwnedAndListensOnLoopbackOnly) {
  AgentSpec s = jobSpec();
  json job = json::parse(jobManifest(s));
  EXPECT_EQ(job["kind"], "Job");
  EXPECT_EQ(job["metadata"]["namespace"], "siphon");
  const json& owner = job["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["kind"], "Node");
  EXPECT_EQ(owner["uid"], s.node_uid);
  EXPECT_EQ(owner["blockOwnerDeletion"], false);
  EXPECT_EQ(job["spec"]["backoffLimit"], 0);
  EXPECT_GT(job["spec"]["ttlSecondsAfterFinished"].get<int>(), 0);
  const json& pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["nodeName"], "node-b");
  EXPECT_EQ(pod["hostPID"], true);
  EXPECT_EQ(pod["automountServiceAccountToken"], false);
  const json& c = pod["containers"][0];
  EXPECT_EQ(c["image"], s.image);
  std::vector<std::string> args = c["args"];
  auto at = [&](const std::string& flag) {
    auto it = std::find(args.begin(), args.end(), flag);
    return it == args.end() || it + 1 == args.end() ? std::string() : *(it + 1);
  };
  EXPECT_EQ(args[0], "targeted");
  EXPECT_EQ(at("--container-id"), "containerd://9f1c7e0d2b");
  EXPECT_EQ(at("--listen"), "127.0.0.1:7140");  // never 0.0.0.0
  EXPECT_EQ(at("--token-file"), "/var/run/siphon/token");
  EXPECT_EQ(at("--runtime-endpoint"), "/run/containerd/containerd.sock");
  EXPECT_EQ(at("--idle-timeout"), "5m");
  const json& sc = c["securityContext"];
  EXPECT_EQ(sc["privileged"], false);
  EXPECT_EQ(sc["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(sc["capabilities"]["add"].get<std::vector<std::string>>(), capabilitiesFile());
  // The socket mounted read-only where --runtime-endpoint points.
  bool socket = false;
  for (const auto& m : c["volumeMounts"]) {
    if (m["mountPath"] == "/run/containerd/containerd.sock") socket = m["readOnly"] == true;
  }
  EXPECT_TRUE(socket);
  // Labels name the target, for reuse and `siphon agents`.
  const json& labels = job["spec"]["template"]["metadata"]["labels"];
  EXPECT_EQ(labels[kLabelTargetUid], s.target_pod_uid);
  EXPECT_EQ(labels[kLabelTargetContainer], "app");
  EXPECT_EQ(labels[kLabelProtocol], "1.2");
  EXPECT_EQ(labels[kLabelSession], "k3x9q");
}

// The XTABLES_LOCKFILE a container sets ("" when none).
std::string xtablesLockFile(const json& container) {
  for (const auto& e : container.value("env", json::array())) {
    if (e["name"] == "XTABLES_LOCKFILE") return e.value("value", "");
  }
  return "";
}

// Issue 42: nothing in the agent's pod holds a node; every disruption tool
// may evict it (agent_manifest.cc says why for each).
TEST(AgentManifest, NothingHoldsTheNode) {
  AgentSpec s = jobSpec();
  for (AgentMode mode : {AgentMode::kJob, AgentMode::kTargetless}) {
    s.mode = mode;
    json pod = mode == AgentMode::kJob ? json::parse(jobManifest(s))["spec"]["template"]
                                       : json::parse(targetlessPodManifest(s));
    const json& meta = pod["metadata"];
    EXPECT_EQ(meta["annotations"][kAnnotationSafeToEvict], "true");
    EXPECT_FALSE(meta["annotations"].contains("karpenter.sh/do-not-disrupt"));
    // The Job controller makes itself the pod's controller owner; the
    // template names no other.
    EXPECT_FALSE(meta.contains("ownerReferences"));
    for (const auto& [key, value] : meta["labels"].items()) {
      EXPECT_TRUE(key == kLabelName || key == kLabelManagedBy || key.rfind("siphon.dev/", 0) == 0)
          << key;
    }
    EXPECT_EQ(meta["labels"][kLabelName], kLabelNameValue);
    EXPECT_EQ(meta["labels"][kLabelManagedBy], "siphon");
    // No emptyDir: `kubectl drain` refuses a pod with one unless told
    // --delete-emptydir-data. The read-only root stays; iptables-legacy's
    // lock goes to the container's own /dev.
    for (const auto& v : pod["spec"]["volumes"]) EXPECT_FALSE(v.contains("emptyDir")) << v.dump();
    const json& c = pod["spec"]["containers"][0];
    EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
    for (const auto& m : c["volumeMounts"]) {
      EXPECT_NE(m["mountPath"], "/run");
      EXPECT_NE(m["mountPath"], "/tmp");
    }
    EXPECT_EQ(xtablesLockFile(c), "/dev/xtables.lock");
    // NoExecute only (no NoSchedule: Karpenter would skip a pod tolerating
    // karpenter.sh/disrupted), the lost-node taints bounded and first.
    const json& tol = pod["spec"]["tolerations"];
    for (const auto& t : tol) EXPECT_EQ(t["effect"], "NoExecute") << t.dump();
    ASSERT_GE(tol.size(), 2u);
    EXPECT_EQ(tol[0]["key"], "node.kubernetes.io/not-ready");
    EXPECT_EQ(tol[0]["tolerationSeconds"], kLostNodeTolerationSeconds);
    EXPECT_EQ(tol[1]["key"], "node.kubernetes.io/unreachable");
    EXPECT_EQ(tol[1]["tolerationSeconds"], kLostNodeTolerationSeconds);
    if (mode == AgentMode::kJob) {
      // Then out-of-service at once, then every other NoExecute taint (the
      // target's dedicated nodes) for ever.
      ASSERT_EQ(tol.size(), 4u);
      EXPECT_EQ(tol[2]["key"], "node.kubernetes.io/out-of-service");
      EXPECT_EQ(tol[2]["tolerationSeconds"], 0);
      EXPECT_FALSE(tol[3].contains("key"));
      EXPECT_EQ(tol[3]["operator"], "Exists");
      EXPECT_FALSE(tol[3].contains("tolerationSeconds"));
    } else {
      // Scheduled: no cordoned or dedicated node.
      EXPECT_EQ(tol.size(), 2u);
    }
  }
  // An evicted agent is not replaced (it would come back pinned to the
  // drained node).
  s.mode = AgentMode::kJob;
  EXPECT_EQ(json::parse(jobManifest(s))["spec"]["backoffLimit"], 0);
}

TEST(AgentManifest, SecretStartsOwnedByTheNodeThenTheJob) {
  AgentSpec s = jobSpec();
  json secret = json::parse(secretManifest(s));
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["stringData"]["token"], s.token);
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["kind"], "Node");
  json patch = json::parse(secretOwnerPatch("batch/v1", "Job", s.name, "job-uid"));
  EXPECT_EQ(patch["metadata"]["ownerReferences"][0]["kind"], "Job");
  EXPECT_EQ(patch["metadata"]["ownerReferences"][0]["uid"], "job-uid");
}

TEST(AgentManifest, EphemeralPatchTargetsTheContainerAndTakesTheTokenFromTheEnv) {
  AgentSpec s = jobSpec();
  s.mode = AgentMode::kEphemeral;
  s.ns = "shop";
  s.port = 7141;
  json patch = json::parse(ephemeralPatch(s));
  const json& c = patch["spec"]["ephemeralContainers"][0];
  EXPECT_EQ(c["name"], s.name);
  EXPECT_EQ(c["targetContainerName"], "app");
  EXPECT_EQ(c["env"][0]["name"], "SIPHON_TOKEN");
  EXPECT_EQ(c["env"][0]["valueFrom"]["secretKeyRef"]["name"], s.secret);
  EXPECT_EQ(xtablesLockFile(c), "/dev/xtables.lock");
  EXPECT_FALSE(c.contains("resources"));  // refused for ephemeral containers
  EXPECT_FALSE(c.contains("ports"));
  std::vector<std::string> args = c["args"];
  EXPECT_EQ(args[0], "ephemeral");
  EXPECT_NE(std::find(args.begin(), args.end(), "127.0.0.1:7141"), args.end());
  EXPECT_EQ(std::find(args.begin(), args.end(), "--token-file"), args.end());
  json secret = json::parse(secretManifest(s));
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["kind"], "Pod");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["uid"], s.target_pod_uid);
}

TEST(AgentManifest, TargetlessPodHasNoHostAccess) {
  AgentSpec s = jobSpec();
  s.mode = AgentMode::kTargetless;
  s.target_pod.clear();
  s.target_pod_uid.clear();
  json pod = json::parse(targetlessPodManifest(s));
  EXPECT_EQ(pod["kind"], "Pod");
  EXPECT_EQ(pod["spec"]["hostPID"], false);
  EXPECT_FALSE(pod["spec"].contains("nodeName"));
  for (const auto& v : pod["spec"]["volumes"]) EXPECT_FALSE(v.contains("hostPath"));
  EXPECT_EQ(pod["spec"]["containers"][0]["args"][0], "targetless");
  EXPECT_FALSE(pod["metadata"]["labels"].contains(kLabelTargetUid));
}

TEST(AgentManifest, RuntimeSockets) {
  AgentSpec s = jobSpec();
  s.runtime = "cri-o";
  s.container_id = "cri-o://abc";
  json job = json::parse(jobManifest(s));
  std::vector<std::string> args = job["spec"]["template"]["spec"]["containers"][0]["args"];
  EXPECT_NE(std::find(args.begin(), args.end(), "/var/run/crio/crio.sock"), args.end());
  s.runtime_socket = "/run/k3s/containerd/containerd.sock";
  job = json::parse(jobManifest(s));
  EXPECT_EQ(job["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"],
            "/run/k3s/containerd/containerd.sock");
}

TEST(AgentManifest, TokensAndSessionsAreRandom) {
  std::set<std::string> tokens, sessions;
  for (int i = 0; i < 64; ++i) {
    std::string t = newToken();
    EXPECT_EQ(t.size(), 64u);  // 32 bytes
    tokens.insert(t);
    std::string s = newSession();
    EXPECT_EQ(s.size(), 5u);
    for (char c : s) EXPECT_TRUE(islower(c) || isdigit(c)) << s;
    sessions.insert(s);
  }
  EXPECT_EQ(tokens.size(), 64u);
  EXPECT_GT(sessions.size(), 60u);
}

}  // namespace
}  // namespace siphon::kube
