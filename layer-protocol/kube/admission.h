// Reading before acting: whether the cluster will let Siphon start an agent,
// asked before anything is created, so a refusal is one line that says what
// would work instead of a half-made agent or a pod that never comes.
//  - Pod Security Admission: the namespace's `pod-security.kubernetes.io/
//    enforce` label. Every agent form holds capabilities beyond the baseline
//    set (SYS_ADMIN, NET_ADMIN...) and the Job hostPID and a hostPath
//    socket: only `privileged` admits them.
//  - RBAC: `kubectl auth can-i` for each verb and resource a mode uses;
//    the first forbidden one is named, with images/k8s/rbac.yaml.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kube/agent_manifest.h"
#include "kube/kubectl.h"
#include "kube/target.h"

namespace siphon::kube {

// The Pod Security level the agent needs ("privileged" for every form).
inline constexpr char kRequiredLevel[] = "privileged";

// Whether `ns_json` (a Namespace from `kubectl get namespace NS -o json`)
// admits the agent of `mode`. FAILED_PRECONDITION naming the level, the
// namespace and what would work: another --agent-namespace (job,
// targetless; `privileged_namespaces`, when known, are named) or
// --agent-mode job (ephemeral, whose agent must live in the target's
// namespace). No label: OK (the cluster's default applies; a refusal then
// comes from admission and is read by admissionError()).
absl::Status checkPodSecurity(const std::string& ns_json, AgentMode mode,
                              const std::vector<std::string>& privileged_namespaces);

// The same line from the API's refusal of a pod ("violates PodSecurity
// \"baseline:latest\": ..."); OK when `kubectl_error` is not one.
absl::Status admissionError(const std::string& kubectl_error, const std::string& ns,
                            AgentMode mode);

struct Permission {
  std::string verb;
  std::string resource;  // "pods", "jobs.batch", "pods/portforward"
  std::string ns;        // empty: cluster-scoped
  std::string why;       // "to create the agent's Job"
};

// What a session with `mode` needs: reading the target (kind in target_ns),
// creating and removing the agent in agent_ns, its logs and its port-forward.
std::vector<Permission> permissionsFor(AgentMode mode, Kind target_kind,
                                       const std::string& target_ns, const std::string& agent_ns);

// `auth can-i` arguments for one permission.
std::vector<std::string> canIArgs(const Permission& p);

// The SelfSubjectAccessReviews of `permissions`, one JSON List for one
// `kubectl create` (what `auth can-i` sends, one process for all).
std::string accessReviews(const std::vector<Permission>& permissions);
// That call's arguments: each review's answer on a line, "true" or "false".
std::vector<std::string> accessReviewArgs();

// Asks every permission at once: all in one `kubectl create` of
// SelfSubjectAccessReviews, or, when that call fails or its answer does
// not read as one line per permission, one `auth can-i` each (in parallel).
// PERMISSION_DENIED names the first one
// refused: "forbidden: you may not create jobs.batch in namespace shop (to
// create the agent's Job); the minimal Role is in images/k8s/rbac.yaml".
// kubectl failing to answer is UNAVAILABLE with its line.
absl::Status checkPermissions(Kubectl& kubectl, const std::vector<Permission>& permissions);

}  // namespace siphon::kube
