// What `--target KIND/NAME` names, and the pods and containers it comes to:
// the parsing and the choices, without I/O (resolve.h asks kubectl).
//
// Pods are read from `kubectl get -o json` (the API's Pod object): only the
// fields Siphon uses, each checked for its type; a malformed answer is an
// INTERNAL error naming the field, never a silent default.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::kube {

// kLabels: the pods a label selector selects (`--target labels/app=web`);
// its TargetRef's name is the selector.
enum class Kind { kPod, kDeployment, kStatefulSet, kReplicaSet, kDaemonSet, kJob, kLabels };

struct TargetRef {
  Kind kind = Kind::kPod;
  std::string name;
};

// "pod/web-0", "deploy/web", "deployment.apps/web", "sts/db", "rs/x",
// "ds/agent", "job/migrate" (and every plural and short name kubectl
// knows), "labels/app=web,tier!=db" (a label selector); a bare "web-0" is
// a pod. INVALID_ARGUMENT naming the kinds for
// anything else.
absl::StatusOr<TargetRef> parseTarget(std::string_view text);
std::string kindName(Kind kind);            // "deployment"
std::string kindResource(Kind kind);        // "deployments.apps": what kubectl get takes
std::string refText(const TargetRef& ref);  // "deployment/web"

// A container's state, from status.containerStatuses (or
// ephemeralContainerStatuses).
struct ContainerState {
  std::string name;
  std::string image;
  std::string container_id;  // "containerd://0123..."; empty before it starts
  bool ready = false;
  bool running = false;
  std::string waiting_reason;  // "ErrImagePull", "ContainerCreating"...
  std::string waiting_message;
  bool terminated = false;
  std::string terminated_reason;  // "Error", "Completed", "OOMKilled"
  int exit_code = 0;
  int restarts = 0;
};

struct Condition {
  std::string type;    // "PodScheduled", "Ready"...
  std::string status;  // "True", "False", "Unknown"
  std::string reason;
  std::string message;
};

struct PodInfo {
  std::string name;
  std::string ns;
  std::string uid;
  std::string node;  // spec.nodeName; empty while unscheduled
  std::string phase;
  std::string creation;      // RFC 3339, as the API wrote it (sorts as time)
  bool terminating = false;  // metadata.deletionTimestamp set
  std::string deleted_at;    // metadata.deletionTimestamp ("" unless terminating)
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> containers;  // spec.containers' names, in order
  std::vector<std::string> container_images;
  std::vector<int> container_ports;    // every containerPort of spec.containers
  std::vector<std::string> ephemeral;  // spec.ephemeralContainers' names
  std::vector<ContainerState> statuses;
  std::vector<ContainerState> ephemeral_statuses;
  std::vector<Condition> conditions;
  std::string host_ip;

  bool ready() const;  // phase Running, condition Ready True, not terminating
  const Condition* condition(std::string_view type) const;
  const ContainerState* status(std::string_view container) const;
  const ContainerState* ephemeralStatus(std::string_view container) const;
};

// One event of a pod watch (`kubectl get pods --watch`): the pod as it is
// after it.
struct PodEvent {
  enum class Type { kAdded, kModified, kDeleted };
  Type type = Type::kAdded;
  PodInfo pod;
};

// A pod's identity: its UID (a pod recreated under its name is another
// one), else its name.
std::string podKey(const PodInfo& pod);

// One Pod object, or the items of a List ("kind": "PodList"/"List").
absl::StatusOr<PodInfo> parsePod(std::string_view json);
absl::StatusOr<std::vector<PodInfo>> parsePodList(std::string_view json);

// A workload's spec.selector as a label selector for `kubectl get -l`
// ("app=web,tier in (a,b)"). FAILED_PRECONDITION when it has none.
absl::StatusOr<std::string> workloadSelector(std::string_view workload_json);

// The pod a workload's session works with: the Ready pods (not terminating),
// oldest first (then by name), the first of them. FAILED_PRECONDITION when
// none is Ready, naming each pod and why it is not (podNotReadyReason).
absl::StatusOr<PodInfo> choosePod(const TargetRef& ref, const std::vector<PodInfo>& pods);

// Why a pod is not Ready, in a few words: "Pending: Unschedulable: 0/2
// nodes are available...", "container app waiting: ImagePullBackOff".
std::string podNotReadyReason(const PodInfo& pod);

// The container of `pod` to work with. `requested` non-empty: that one, or
// NOT_FOUND listing the pod's containers. Else as kubectl defaults it: the
// `kubectl.kubernetes.io/default-container` annotation, else the only
// container, else the first; never a known mesh sidecar (isMeshSidecar)
// unless named, even by the annotation.
absl::StatusOr<std::string> chooseContainer(const PodInfo& pod, std::string_view requested);
bool isMeshSidecar(std::string_view container);

// The runtime a containerID names ("containerd://ID" -> "containerd");
// FAILED_PRECONDITION for one the agent cannot ask, naming it.
absl::StatusOr<std::string> runtimeOf(std::string_view container_id);
// "containerd://0123" -> "0123".
std::string bareContainerId(std::string_view container_id);

}  // namespace siphon::kube
