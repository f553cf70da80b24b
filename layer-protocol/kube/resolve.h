// From `--target KIND/NAME` to one Ready pod and its container, through
// kubectl (`get -o json`): the workload's selector, its pods, the choice
// (target.h), and the checks that make a session possible there (the
// container runs, its runtime is one the agent can ask).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "kube/kubectl.h"
#include "kube/target.h"

namespace siphon::kube {

struct ResolveRequest {
  TargetRef ref;
  std::string ns;         // empty: the context's namespace
  std::string container;  // empty: the default (chooseContainer)
  // The agent asks the container's runtime (job mode): its runtime must be
  // one the agent knows.
  bool need_runtime = true;
};

struct ResolvedTarget {
  PodInfo pod;
  std::string container;
  std::string container_id;  // "containerd://..." as the API shows it
  std::string runtime;       // "containerd", "cri-o", "docker"; empty when not needed
  size_t ready_pods = 1;     // of a workload
  size_t pods = 1;
  // What selects the target's pods, for the session's pod watch: a
  // workload's label selector ("app=web"), or for a pod its name
  // ("metadata.name=web-0", a field selector: a pod recreated under the
  // same name is the target again).
  std::string label_selector;
  std::string field_selector;
  // "deployment/web: pod web-7f9c (1 of 3 Ready), container app on node-1"
  std::string summary;
};

// FAILED_PRECONDITION for a target that exists but cannot be used now (no
// Ready pod, container not running, runtime unknown), NOT_FOUND for a
// missing target or container, PERMISSION_DENIED for a forbidden read
// (kubeCallError), each with one line that says what to do.
absl::StatusOr<ResolvedTarget> resolveTarget(Kubectl& kubectl, const ResolveRequest& request);

// `pod` (Ready) as a target: its container (chooseContainer), which must
// run, and its runtime when `need_runtime`. No selector, no summary.
absl::StatusOr<ResolvedTarget> targetInPod(PodInfo pod, const std::string& container,
                                           bool need_runtime);

// The status for a failed kubectl call: `what` is the object ("deployment/web"),
// `verb_resource` what was done ("get deployments.apps"), `ns` where.
// Forbidden: PERMISSION_DENIED naming the verb and resource and pointing at
// images/k8s/rbac.yaml; NotFound: NOT_FOUND "<what> not found in namespace
// NS"; anything else: UNAVAILABLE with kubectl's line.
absl::Status kubeCallError(const KubectlResult& r, std::string_view what,
                           std::string_view verb_resource, std::string_view ns);

// Where the minimal Role is documented (said by every RBAC line).
inline constexpr std::string_view kRbacHint =
    "the minimal Role is in images/k8s/rbac.yaml (docs/KUBERNETES.md)";

}  // namespace siphon::kube
