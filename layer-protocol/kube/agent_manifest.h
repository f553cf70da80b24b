// The objects Siphon creates for an agent, as the JSON it gives `kubectl
// create -f -`: built from the same content as images/k8s/agent-job.yaml
// (job), ephemeral-patch.yaml (ephemeral) and a plain pod (targetless),
// with the differences that make them Siphon's own:
//  - the agent listens on its pod's loopback only (--listen 127.0.0.1:PORT):
//    the port-forward reaches it there, nothing else in the cluster can;
//  - labels name the target (its pod's UID and container), the mode, the
//    client's version and protocol, so a later session can find and reuse
//    it, and `siphon agents` list it;
//  - the token Secret is owned by the Job (patched in once the Job exists;
//    the Node owns it until then, so it is never without an owner);
//  - nothing in it holds a node: every disruption tool (kubectl drain,
//    Cluster Autoscaler, Karpenter, managed node-pool upgrades, taint-based
//    eviction) may evict the agent's pod (agent_manifest.cc, podSpec).
// tests/unit/kube/agent_manifest_test.cc holds these to images/k8s/ and
// images/capabilities.txt; tests/deploy runs check_manifests.py on them.
#pragma once

#include <string>
#include <vector>

namespace siphon::kube {

enum class AgentMode { kJob, kEphemeral, kTargetless };
std::string modeName(AgentMode mode);  // "job", "ephemeral", "targetless"

// The labels and annotations (siphon.dev/...).
inline constexpr char kLabelName[] = "app.kubernetes.io/name";
inline constexpr char kLabelNameValue[] = "siphon-agent";
inline constexpr char kLabelManagedBy[] = "app.kubernetes.io/managed-by";
inline constexpr char kLabelSession[] = "siphon.dev/session";
inline constexpr char kLabelMode[] = "siphon.dev/mode";
inline constexpr char kLabelTargetUid[] = "siphon.dev/target-pod-uid";
inline constexpr char kLabelTargetContainer[] = "siphon.dev/target-container";
inline constexpr char kLabelVersion[] = "siphon.dev/version";
inline constexpr char kLabelProtocol[] = "siphon.dev/protocol";
inline constexpr char kAnnotationTarget[] = "siphon.dev/target";  // "NS/pod/NAME"
inline constexpr char kAnnotationPort[] = "siphon.dev/port";
inline constexpr char kAnnotationSecret[] = "siphon.dev/token-secret";
// On the token's Secret: the agent's --fs-mode (absent: ro, the default).
inline constexpr char kAnnotationFsMode[] = "siphon.dev/fs-mode";
// On the agent's pod: Cluster Autoscaler may evict it (its hostPath socket
// and tmpfs volumes would otherwise count as local storage that blocks the
// node's scale-down; agent_manifest.cc says why it is safe).
inline constexpr char kAnnotationSafeToEvict[] = "cluster-autoscaler.kubernetes.io/safe-to-evict";
// How long an agent stays bound to a node that stopped answering
// (node.kubernetes.io/unreachable or not-ready, NoExecute) before it is
// deleted: the DefaultTolerationSeconds its target gets, so both go together.
inline constexpr int kLostNodeTolerationSeconds = 300;

struct AgentSpec {
  AgentMode mode = AgentMode::kJob;
  std::string session;  // short unique suffix: [a-z0-9]{5}
  std::string name;     // "siphon-agent-" + session: Job, pod or ephemeral container
  std::string secret;   // "siphon-token-" + session
  std::string ns;       // where the agent lives (ephemeral: the target pod's)
  std::string image;
  std::string token;
  int port = 7140;
  std::string idle_timeout = "5m";
  std::string fs_mode = "ro";  // the agent's --fs-mode: ro, rw or off
  // The target (empty in targetless mode).
  std::string target_ns, target_pod, target_pod_uid, target_container, container_id;
  std::string runtime;         // "containerd", "cri-o", "docker" (job)
  std::string runtime_socket;  // on the node; empty: the runtime's usual path
  std::string node, node_uid;  // job: where it runs, and its owner
  std::string version;         // the client's (a label)
  std::string protocol;        // the client's protocol "MAJOR.MINOR" (a label)
};

// Exactly images/capabilities.txt, in its order (the set of --fs-mode ro).
const std::vector<std::string>& agentCapabilities();
// The set of an agent with this --fs-mode: rw adds DAC_OVERRIDE, FOWNER,
// CHOWN and FSETID; off leaves out SETUID and SETGID (no file helper).
std::vector<std::string> agentCapabilities(const std::string& fs_mode);
// The runtime's socket on a node, by the runtime's name.
std::string defaultRuntimeSocket(const std::string& runtime);

// The agent's arguments (after the image's entrypoint).
std::vector<std::string> agentArgs(const AgentSpec& spec);

// The token's Secret; owned by the Node (job), the target pod (ephemeral),
// or nobody until the agent pod exists (targetless).
std::string secretManifest(const AgentSpec& spec);
// The merge patch that makes `owner_kind`/`owner_name` (uid) the Secret's
// owner (apiVersion of the owner included).
std::string secretOwnerPatch(const std::string& api_version, const std::string& kind,
                             const std::string& name, const std::string& uid);
std::string jobManifest(const AgentSpec& spec);
// The strategic merge patch of the target pod's ephemeralcontainers.
std::string ephemeralPatch(const AgentSpec& spec);
std::string targetlessPodManifest(const AgentSpec& spec);

// 32 random bytes as 64 hex digits (getrandom(2)).
std::string newToken();
// [a-z0-9]{5}.
std::string newSession();

}  // namespace siphon::kube
