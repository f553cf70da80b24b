#include "kube/agent_manifest.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "kube/json_read.h"

namespace siphon::kube {

using json_read::json;

namespace {

void randomBytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    ssize_t r = ::getrandom(p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) std::abort();  // no entropy source: never hand out a guessable token
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// Only Siphon's own labels (app.kubernetes.io/name=siphon-agent,
// managed-by=siphon, siphon.dev/...): the agent's pod never carries the
// target's labels, so no PodDisruptionBudget, Service or ReplicaSet
// selecting the application selects the agent too. A budget that did would
// count the agent as one of the application's pods (and its eviction could
// be refused, holding a drain), and Siphon never creates a budget of its
// own. siphon.dev/mode says the mode (no app.kubernetes.io/component: a
// common key in users' own selectors).
json labels(const AgentSpec& s) {
  json l = {{kLabelName, kLabelNameValue},
            {kLabelManagedBy, "siphon"},
            {kLabelSession, s.session},
            {kLabelMode, modeName(s.mode)}};
  if (!s.version.empty()) l[kLabelVersion] = s.version;
  if (!s.protocol.empty()) l[kLabelProtocol] = s.protocol;
  if (!s.target_pod_uid.empty()) {
    l[kLabelTargetUid] = s.target_pod_uid;
    l[kLabelTargetContainer] = s.target_container;
  }
  return l;
}

json annotations(const AgentSpec& s) {
  json a = {{kAnnotationPort, std::to_string(s.port)}, {kAnnotationSecret, s.secret}};
  if (!s.target_pod.empty()) {
    a[kAnnotationTarget] =
        absl::StrCat(s.target_ns, "/pod/", s.target_pod, "/", s.target_container);
  }
  return a;
}

// The pod's own: the Job's and targetless pod's annotations plus
// safe-to-evict. Cluster Autoscaler refuses to remove a node whose pods
// have local storage (hostPath: the runtime's socket) unless they say they
// may go. The agent may: it holds no data, drains its sessions on
// SIGTERM within the grace period, and the client follows the target to
// its next node. Never karpenter.sh/do-not-disrupt: that would block
// consolidation and drift of every node a session runs on.
json podAnnotations(const AgentSpec& s) {
  json a = annotations(s);
  a[kAnnotationSafeToEvict] = "true";
  return a;
}

// The tolerations (agent-job.yaml has the same list and reasons).
//  - No NoSchedule or PreferNoSchedule toleration: the targeted agent has
//    nodeName, so the scheduler's taints never apply to it and the kubelet
//    admits a pod against NoExecute taints only. Tolerating NoSchedule would
//    only change what disruption tools do: Karpenter neither evicts nor
//    waits for a pod that tolerates its karpenter.sh/disrupted:NoSchedule
//    taint (it treats it like a DaemonSet pod), so the agent would be killed
//    with the instance instead of draining its sessions; and a targetless
//    agent would be scheduled onto cordoned nodes.
//  - not-ready and unreachable (NoExecute) for kLostNodeTolerationSeconds:
//    on a node that stopped answering, the taint manager deletes the agent
//    when it deletes a target with the default tolerations. Without a bound
//    the pod would stay bound to a dead node for as long as its Node object
//    exists (an empty-key Exists toleration also stops the
//    DefaultTolerationSeconds admission from adding the bound).
//  - out-of-service (NoExecute) for 0 s: a node an administrator declared
//    shut down loses the agent at once, as every pod that does not tolerate it.
//  - every other NoExecute taint, for ever (targeted only): the agent must run
//    wherever its target runs, and dedicated nodes carry NoExecute taints the
//    target tolerates; the kubelet would refuse the agent there otherwise.
// The taint manager and the kubelet take, for each taint, the first
// toleration that matches it: the bounded ones come first, so the catch-all
// never lifts their bound.
json tolerations(bool targeted) {
  auto noExecute = [](const char* key, std::optional<int> seconds) {
    json t = {{"operator", "Exists"}, {"effect", "NoExecute"}};
    if (key != nullptr) t["key"] = key;
    if (seconds) t["tolerationSeconds"] = *seconds;
    return t;
  };
  json t = json::array({noExecute("node.kubernetes.io/not-ready", kLostNodeTolerationSeconds),
                        noExecute("node.kubernetes.io/unreachable", kLostNodeTolerationSeconds)});
  if (targeted) {
    t.push_back(noExecute("node.kubernetes.io/out-of-service", 0));
    t.push_back(noExecute(nullptr, std::nullopt));
  }
  return t;
}

json nodeOwner(const AgentSpec& s) {
  // Not a controller reference, and blockOwnerDeletion false: the Node's
  // deletion never waits for the agent (agent-job.yaml says why).
  return json::array({{{"apiVersion", "v1"},
                       {"kind", "Node"},
                       {"name", s.node},
                       {"uid", s.node_uid},
                       {"controller", false},
                       {"blockOwnerDeletion", false}}});
}

json capabilities(const AgentSpec& s) {
  return {{"drop", json::array({"ALL"})}, {"add", agentCapabilities(s.fs_mode)}};
}

// The container securityContext every form shares (agent-job.yaml's). An
// ephemeral container carries the user itself (ephemeral-patch.yaml): the
// pod's securityContext is the application's.
json containerSecurity(const AgentSpec& s, bool with_user) {
  json sc = {{"privileged", false},
             // Kubernetes refuses allowPrivilegeEscalation: false with SYS_ADMIN.
             {"allowPrivilegeEscalation", true},
             {"readOnlyRootFilesystem", true},
             {"capabilities", capabilities(s)},
             {"seccompProfile", {{"type", "RuntimeDefault"}}},
             {"appArmorProfile", {{"type", "Unconfined"}}}};
  if (with_user) {
    sc["runAsUser"] = 0;
    sc["runAsNonRoot"] = false;
  }
  return sc;
}

// iptables-legacy's lock file (/run/xtables.lock by default) in the
// container's own /dev: under a read-only root without an emptyDir it is the
// one writable place (/dev/shm is the pod's, shared: never ours). The agent
// passes it on to every iptables it runs (agent/common/exec.h).
json xtablesLockEnv() { return {{"name", "XTABLES_LOCKFILE"}, {"value", "/dev/xtables.lock"}}; }

json tokenEnv(const AgentSpec& s) {
  return json::array({{{"name", "SIPHON_TOKEN"},
                       {"valueFrom", {{"secretKeyRef", {{"name", s.secret}, {"key", "token"}}}}}},
                      xtablesLockEnv()});
}

json resources() {
  // agent-job.yaml's: no CPU limit (throttling a proxy in the path of the
  // application's traffic adds latency to it).
  return {{"requests", {{"cpu", "50m"}, {"memory", "64Mi"}}}, {"limits", {{"memory", "512Mi"}}}};
}

// The pod spec parts of the Job and the targetless pod.
json podSpec(const AgentSpec& s, bool targeted) {
  json container = {
      {"name", "siphon-agent"},
      {"image", s.image},
      {"imagePullPolicy", "IfNotPresent"},
      {"args", agentArgs(s)},
      {"ports",
       json::array({{{"name", "siphon"}, {"containerPort", s.port}, {"protocol", "TCP"}}})},
      {"resources", resources()},
      {"securityContext", containerSecurity(s, false)},
  };
  json mounts = json::array();
  json volumes = json::array();
  // No emptyDir: `kubectl drain` refuses a node with one unless told
  // --delete-emptydir-data. Under the read-only root the container's own
  // /dev (a tmpfs the runtime makes for it alone) is the one writable
  // place: iptables-legacy takes its lock there, not in /run.
  json env = json::array();
  if (targeted) {
    env.push_back(
        {{"name", "NODE_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.hostIP"}}}}}});
    const std::string socket =
        s.runtime_socket.empty() ? defaultRuntimeSocket(s.runtime) : s.runtime_socket;
    mounts.push_back({{"name", "runtime-sock"}, {"mountPath", socket}, {"readOnly", true}});
    volumes.push_back(
        {{"name", "runtime-sock"}, {"hostPath", {{"path", socket}, {"type", "Socket"}}}});
  }
  mounts.push_back({{"name", "token"}, {"mountPath", "/var/run/siphon"}, {"readOnly", true}});
  volumes.push_back({{"name", "token"},
                     {"secret",
                      {{"secretName", s.secret},
                       {"defaultMode", 0400},
                       {"items", json::array({{{"key", "token"}, {"path", "token"}}})}}}});
  env.push_back(xtablesLockEnv());
  container["env"] = env;
  container["volumeMounts"] = mounts;
  json spec = {
      {"restartPolicy", "Never"},
      {"tolerations", tolerations(targeted)},
      {"terminationGracePeriodSeconds", 30},
      {"hostPID", targeted},
      {"hostNetwork", false},
      {"hostIPC", false},
      {"automountServiceAccountToken", false},
      {"enableServiceLinks", false},
      {"securityContext", {{"runAsUser", 0}, {"runAsGroup", 0}, {"runAsNonRoot", false}}},
      {"containers", json::array({container})},
      {"volumes", volumes},
  };
  if (targeted) spec["nodeName"] = s.node;
  return spec;
}

}  // namespace

std::string modeName(AgentMode mode) {
  switch (mode) {
    case AgentMode::kJob:
      return "job";
    case AgentMode::kEphemeral:
      return "ephemeral";
    case AgentMode::kTargetless:
      return "targetless";
  }
  return "job";
}

const std::vector<std::string>& agentCapabilities() {
  static const std::vector<std::string> kCaps = {"SYS_ADMIN", "SYS_PTRACE",      "NET_ADMIN",
                                                 "NET_RAW",   "DAC_READ_SEARCH", "SETUID",
                                                 "SETGID",    "SETPCAP"};
  return kCaps;
}

std::vector<std::string> agentCapabilities(const std::string& fs_mode) {
  std::vector<std::string> caps;
  for (const auto& c : agentCapabilities()) {
    // off: no file helper to take the target's ids.
    if (fs_mode == "off" && (c == "SETUID" || c == "SETGID")) continue;
    caps.push_back(c);
  }
  if (fs_mode == "rw") {
    // What the agent keeps for rw (agent/common/capabilities.cc), as
    // images/capabilities.txt says.
    caps.insert(caps.end(), {"DAC_OVERRIDE", "FOWNER", "CHOWN", "FSETID"});
  }
  return caps;
}

std::string defaultRuntimeSocket(const std::string& runtime) {
  if (runtime == "cri-o") return "/var/run/crio/crio.sock";
  if (runtime == "docker") return "/var/run/docker.sock";
  return "/run/containerd/containerd.sock";
}

std::vector<std::string> agentArgs(const AgentSpec& s) {
  std::vector<std::string> a;
  switch (s.mode) {
    case AgentMode::kJob: {
      const std::string socket =
          s.runtime_socket.empty() ? defaultRuntimeSocket(s.runtime) : s.runtime_socket;
      a = {"targeted", "--container-id", s.container_id, "--runtime-endpoint", socket};
      break;
    }
    case AgentMode::kEphemeral:
      a = {"ephemeral", "--container-id", s.container_id};
      break;
    case AgentMode::kTargetless:
      a = {"targetless"};
      break;
  }
  // Loopback only: the port-forward reaches it there, nothing else can.
  a.insert(a.end(), {"--listen", absl::StrCat("127.0.0.1:", s.port)});
  if (s.mode != AgentMode::kEphemeral) a.insert(a.end(), {"--token-file", "/var/run/siphon/token"});
  // Exits by itself once no session used it for this long (after a
  // killed client's session grace), so nothing is left running.
  a.insert(a.end(), {"--log-format", "json", "--idle-timeout", s.idle_timeout});
  // Files: read-only unless asked (the agent's own default).
  if (s.fs_mode != "ro") a.insert(a.end(), {"--fs-mode", s.fs_mode});
  if (s.mode == AgentMode::kEphemeral) {
    // Where a newer agent takes this one over in place (ephemeral-upgrade-
    // patch.yaml, docs/CONTINUITY.md "Handover"): the container's own /dev,
    // a tmpfs the runtime makes for it alone and writable under a read-only
    // root (/dev/shm is shared by every container of the pod: the agent
    // refuses it, docs/SECURITY.md).
    a.insert(a.end(), {"--handover-socket", "/dev/siphon-handover.sock"});
  }
  if (s.mode == AgentMode::kJob) {
    // The kubelet's probes come from the node: never stolen (docs/STEAL.md).
    a.insert(a.end(), {"--probe-source", "$(NODE_IP)"});
  }
  return a;
}

std::string secretManifest(const AgentSpec& s) {
  json meta = {
      {"name", s.secret},
      {"namespace", s.ns},
      {"labels",
       {{kLabelName, kLabelNameValue}, {kLabelManagedBy, "siphon"}, {kLabelSession, s.session}}}};
  if (s.mode == AgentMode::kJob) meta["ownerReferences"] = nodeOwner(s);
  if (s.mode == AgentMode::kEphemeral) {
    // The target pod holds the agent (an ephemeral container cannot be
    // removed): its Secret goes with the pod.
    meta["ownerReferences"] = json::array({{{"apiVersion", "v1"},
                                            {"kind", "Pod"},
                                            {"name", s.target_pod},
                                            {"uid", s.target_pod_uid},
                                            {"controller", false},
                                            {"blockOwnerDeletion", false}}});
  }
  json secret = {{"apiVersion", "v1"},
                 {"kind", "Secret"},
                 {"metadata", meta},
                 {"type", "Opaque"},
                 {"stringData", {{"token", s.token}}}};
  return secret.dump();
}

std::string secretOwnerPatch(const std::string& api_version, const std::string& kind,
                             const std::string& name, const std::string& uid) {
  json patch = {{"metadata",
                 {{"ownerReferences", json::array({{{"apiVersion", api_version},
                                                    {"kind", kind},
                                                    {"name", name},
                                                    {"uid", uid},
                                                    {"controller", false},
                                                    {"blockOwnerDeletion", false}}})}}}};
  return patch.dump();
}

std::string jobManifest(const AgentSpec& s) {
  json l = labels(s);
  json job = {
      {"apiVersion", "batch/v1"},
      {"kind", "Job"},
      {"metadata",
       {{"name", s.name},
        {"namespace", s.ns},
        {"labels", l},
        {"annotations", annotations(s)},
        {"ownerReferences", nodeOwner(s)}}},
      {"spec",
       {// One attempt: an agent that failed must not be restarted behind the
        // user's back; the client reports the failure. An evicted agent
        // counts as failed too, so a drain's eviction is never followed by a
        // new agent pinned (nodeName ignores the cordon) to the same node.
        // The Job is the pod's controller owner: kubectl drain evicts such
        // pods without --force.
        {"backoffLimit", 0},
        // What is left after the agent ends goes five minutes later (the
        // client reads a failed agent's logs at once; a person has time too).
        {"ttlSecondsAfterFinished", 300},
        {"activeDeadlineSeconds", 43200},
        {"template",
         {{"metadata", {{"labels", l}, {"annotations", podAnnotations(s)}}},
          {"spec", podSpec(s, true)}}}}},
  };
  return job.dump();
}

std::string ephemeralPatch(const AgentSpec& s) {
  json container = {
      {"name", s.name},
      {"image", s.image},
      {"imagePullPolicy", "IfNotPresent"},
      // Shares the application container's PID namespace: the agent sees its
      // process (ephemeral mode finds it by its cgroup).
      {"targetContainerName", s.target_container},
      {"args", agentArgs(s)},
      // The pod's Secrets only, and no new volumes: the token in the env.
      {"env", tokenEnv(s)},
      {"securityContext", containerSecurity(s, true)},
  };
  json patch = {{"spec", {{"ephemeralContainers", json::array({container})}}}};
  return patch.dump();
}

std::string targetlessPodManifest(const AgentSpec& s) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", s.name},
                {"namespace", s.ns},
                {"labels", labels(s)},
                {"annotations", podAnnotations(s)}}},
              {"spec", podSpec(s, false)}};
  return pod.dump();
}

std::string newToken() {
  unsigned char bytes[32];
  randomBytes(bytes, sizeof(bytes));
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string newSession() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[5];
  randomBytes(bytes, sizeof(bytes));
  std::string s;
  for (unsigned char b : bytes) s.push_back(kAlphabet[b % 36]);
  return s;
}

}  // namespace siphon::kube
