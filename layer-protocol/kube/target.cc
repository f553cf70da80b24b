#include "kube/target.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kube/json_read.h"

namespace siphon::kube {

using json_read::json;

namespace {

struct KindName {
  Kind kind;
  std::initializer_list<std::string_view> names;
};

// Every name kubectl accepts for these kinds (singular, plural, short,
// with the API group).
const KindName kKinds[] = {
    {Kind::kPod, {"pod", "pods", "po"}},
    {Kind::kDeployment,
     {"deployment", "deployments", "deploy", "deployment.apps", "deployments.apps"}},
    {Kind::kStatefulSet,
     {"statefulset", "statefulsets", "sts", "statefulset.apps", "statefulsets.apps"}},
    {Kind::kReplicaSet, {"replicaset", "replicasets", "rs", "replicaset.apps", "replicasets.apps"}},
    {Kind::kDaemonSet, {"daemonset", "daemonsets", "ds", "daemonset.apps", "daemonsets.apps"}},
    {Kind::kJob, {"job", "jobs", "job.batch", "jobs.batch"}},
    {Kind::kLabels, {"labels", "label", "selector", "l"}},
};

// Sidecars of service meshes and their kin: they proxy the application's
// traffic but are not the application.
constexpr std::string_view kSidecars[] = {
    "istio-proxy",
    "linkerd-proxy",
    "kuma-sidecar",
    "consul-dataplane",
    "consul-connect-envoy-sidecar",
    "envoy-sidecar",
    "aws-appmesh-envoy",
    "cilium-envoy",
    "osm-envoy",
    "traffic-agent",
    "dapr-sidecar",
    "vault-agent",
};

bool validName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.')) return false;
  }
  return true;
}

ContainerState parseState(const json& s) {
  ContainerState c;
  c.name = json_read::str(s, {"name"});
  c.image = json_read::str(s, {"image"});
  c.container_id = json_read::str(s, {"containerID"});
  c.ready = json_read::boolean(s, {"ready"});
  c.restarts = static_cast<int>(json_read::integer(s, {"restartCount"}));
  c.running = json_read::at(s, {"state", "running"}) != nullptr;
  c.waiting_reason = json_read::str(s, {"state", "waiting", "reason"});
  c.waiting_message = json_read::str(s, {"state", "waiting", "message"});
  if (json_read::at(s, {"state", "terminated"}) != nullptr) {
    c.terminated = true;
    c.terminated_reason = json_read::str(s, {"state", "terminated", "reason"});
    c.exit_code = static_cast<int>(json_read::integer(s, {"state", "terminated", "exitCode"}));
  }
  return c;
}

PodInfo podFrom(const json& j) {
  if (json_read::str(j, {"kind"}) != "Pod" && !json_read::str(j, {"kind"}).empty()) {
    throw json_read::BadJson(
        absl::StrCat("expected a Pod, kubectl answered a ", json_read::str(j, {"kind"})));
  }
  PodInfo p;
  p.name = json_read::str(j, {"metadata", "name"});
  p.ns = json_read::str(j, {"metadata", "namespace"});
  p.uid = json_read::str(j, {"metadata", "uid"});
  p.creation = json_read::str(j, {"metadata", "creationTimestamp"});
  p.deleted_at = json_read::str(j, {"metadata", "deletionTimestamp"});
  p.terminating = json_read::at(j, {"metadata", "deletionTimestamp"}) != nullptr;
  p.labels = json_read::strings(j, {"metadata", "labels"});
  p.annotations = json_read::strings(j, {"metadata", "annotations"});
  p.node = json_read::str(j, {"spec", "nodeName"});
  for (const auto& c : json_read::array(j, {"spec", "containers"})) {
    p.containers.push_back(json_read::str(c, {"name"}));
    p.container_images.push_back(json_read::str(c, {"image"}));
    for (const auto& port : json_read::array(c, {"ports"})) {
      p.container_ports.push_back(static_cast<int>(json_read::integer(port, {"containerPort"})));
    }
  }
  for (const auto& c : json_read::array(j, {"spec", "ephemeralContainers"})) {
    p.ephemeral.push_back(json_read::str(c, {"name"}));
  }
  p.phase = json_read::str(j, {"status", "phase"});
  p.host_ip = json_read::str(j, {"status", "hostIP"});
  for (const auto& s : json_read::array(j, {"status", "containerStatuses"})) {
    p.statuses.push_back(parseState(s));
  }
  for (const auto& s : json_read::array(j, {"status", "ephemeralContainerStatuses"})) {
    p.ephemeral_statuses.push_back(parseState(s));
  }
  for (const auto& c : json_read::array(j, {"status", "conditions"})) {
    p.conditions.push_back({json_read::str(c, {"type"}), json_read::str(c, {"status"}),
                            json_read::str(c, {"reason"}), json_read::str(c, {"message"})});
  }
  if (p.name.empty()) throw json_read::BadJson("a pod without metadata.name");
  return p;
}

std::string quoteList(const std::vector<std::string>& names) { return absl::StrJoin(names, ", "); }

}  // namespace

absl::StatusOr<TargetRef> parseTarget(std::string_view text) {
  const auto slash = text.find('/');
  TargetRef ref;
  std::string_view name = text;
  if (slash != std::string_view::npos) {
    const std::string kind = absl::AsciiStrToLower(std::string(text.substr(0, slash)));
    name = text.substr(slash + 1);
    bool found = false;
    for (const auto& k : kKinds) {
      for (auto n : k.names) {
        if (n == kind) {
          ref.kind = k.kind;
          found = true;
        }
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--target ", asv(text), ": unknown kind '", kind,
          "' (pod, deployment, statefulset, replicaset, daemonset or job; or their short "
          "names po, deploy, sts, rs, ds; or labels/SELECTOR)"));
    }
  }
  if (ref.kind == Kind::kLabels) {
    // kubectl judges the selector's syntax (its answer is the error line).
    if (name.empty() || name.find_first_of(" \t\n") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--target ", asv(text),
                       ": a label selector without spaces, e.g. labels/app=web,tier!=db"));
    }
    ref.name = std::string(name);
    return ref;
  }
  if (!validName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target ", asv(text), ": '", asv(name),
                     "' is not a Kubernetes name (lower-case letters, digits, '-' and '.'); "
                     "the form is KIND/NAME, e.g. deploy/web"));
  }
  ref.name = std::string(name);
  return ref;
}

std::string kindName(Kind kind) {
  switch (kind) {
    case Kind::kPod:
      return "pod";
    case Kind::kDeployment:
      return "deployment";
    case Kind::kStatefulSet:
      return "statefulset";
    case Kind::kReplicaSet:
      return "replicaset";
    case Kind::kDaemonSet:
      return "daemonset";
    case Kind::kJob:
      return "job";
    case Kind::kLabels:
      return "labels";
  }
  return "pod";
}

std::string kindResource(Kind kind) {
  switch (kind) {
    case Kind::kPod:
    case Kind::kLabels:
      return "pods";
    case Kind::kJob:
      return "jobs.batch";
    default:
      return kindName(kind) + "s.apps";
  }
}

std::string refText(const TargetRef& ref) { return kindName(ref.kind) + "/" + ref.name; }

std::string podKey(const PodInfo& pod) { return pod.uid.empty() ? pod.name : pod.uid; }

bool PodInfo::ready() const {
  if (phase != "Running" || terminating) return false;
  const Condition* c = condition("Ready");
  return c != nullptr && c->status == "True";
}

const Condition* PodInfo::condition(std::string_view type) const {
  for (const auto& c : conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

const ContainerState* PodInfo::status(std::string_view container) const {
  for (const auto& s : statuses) {
    if (s.name == container) return &s;
  }
  return nullptr;
}

const ContainerState* PodInfo::ephemeralStatus(std::string_view container) const {
  for (const auto& s : ephemeral_statuses) {
    if (s.name == container) return &s;
  }
  return nullptr;
}

absl::StatusOr<PodInfo> parsePod(std::string_view text) {
  try {
    return podFrom(json_read::parse(text, "pod"));
  } catch (const std::exception& e) {
    return json_read::toStatus(e);
  }
}

absl::StatusOr<std::vector<PodInfo>> parsePodList(std::string_view text) {
  try {
    json j = json_read::parse(text, "pod list");
    std::vector<PodInfo> pods;
    if (json_read::at(j, {"items"}) == nullptr && json_read::str(j, {"kind"}) == "Pod") {
      pods.push_back(podFrom(j));
      return pods;
    }
    for (const auto& item : json_read::array(j, {"items"})) pods.push_back(podFrom(item));
    return pods;
  } catch (const std::exception& e) {
    return json_read::toStatus(e);
  }
}

absl::StatusOr<std::string> workloadSelector(std::string_view text) {
  try {
    json j = json_read::parse(text, "workload");
    const std::string what = absl::StrCat(absl::AsciiStrToLower(json_read::str(j, {"kind"})), "/",
                                          json_read::str(j, {"metadata", "name"}));
    const json* sel = json_read::at(j, {"spec", "selector"});
    if (sel == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(what, " has no spec.selector"));
    }
    std::vector<std::string> parts;
    for (const auto& [k, v] : json_read::strings(*sel, {"matchLabels"})) {
      parts.push_back(absl::StrCat(k, "=", v));
    }
    for (const auto& e : json_read::array(*sel, {"matchExpressions"})) {
      const std::string key = json_read::str(e, {"key"});
      const std::string op = json_read::str(e, {"operator"});
      std::vector<std::string> values;
      for (const auto& v : json_read::array(e, {"values"})) {
        if (!v.is_string()) throw json_read::BadJson("matchExpressions values must be strings");
        values.push_back(v.get<std::string>());
      }
      if (op == "In") {
        parts.push_back(absl::StrCat(key, " in (", absl::StrJoin(values, ","), ")"));
      } else if (op == "NotIn") {
        parts.push_back(absl::StrCat(key, " notin (", absl::StrJoin(values, ","), ")"));
      } else if (op == "Exists") {
        parts.push_back(key);
      } else if (op == "DoesNotExist") {
        parts.push_back("!" + key);
      } else {
        throw json_read::BadJson(absl::StrCat("unknown selector operator ", op));
      }
    }
    if (parts.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " has an empty selector: it would select every pod"));
    }
    return absl::StrJoin(parts, ",");
  } catch (const std::exception& e) {
    return json_read::toStatus(e);
  }
}

std::string podNotReadyReason(const PodInfo& pod) {
  if (pod.terminating) return "terminating";
  std::vector<std::string> why;
  if (const Condition* s = pod.condition("PodScheduled"); s && s->status != "True") {
    why.push_back(absl::StrCat(s->reason.empty() ? "not scheduled" : s->reason,
                               s->message.empty() ? "" : ": ", s->message));
  }
  for (const auto& c : pod.statuses) {
    if (c.running && c.ready) continue;
    if (!c.waiting_reason.empty()) {
      why.push_back(absl::StrCat("container ", c.name, " waiting: ", c.waiting_reason,
                                 c.waiting_message.empty() ? "" : " (" + c.waiting_message + ")"));
    } else if (c.terminated) {
      why.push_back(absl::StrCat("container ", c.name, " terminated: ", c.terminated_reason,
                                 " (exit code ", c.exit_code, ")"));
    } else if (c.running && !c.ready) {
      why.push_back(absl::StrCat("container ", c.name, " running but not ready"));
    }
  }
  std::string phase = pod.phase.empty() ? "Unknown" : pod.phase;
  if (why.empty()) return absl::StrCat("phase ", phase);
  return absl::StrCat("phase ", phase, ", ", absl::StrJoin(why, "; "));
}

absl::StatusOr<PodInfo> choosePod(const TargetRef& ref, const std::vector<PodInfo>& pods) {
  std::vector<const PodInfo*> ready;
  for (const auto& p : pods) {
    if (p.ready()) ready.push_back(&p);
  }
  if (ready.empty()) {
    if (pods.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(refText(ref), " has no pods (scaled to zero?)"));
    }
    std::vector<std::string> each;
    for (const auto& p : pods) each.push_back(absl::StrCat(p.name, ": ", podNotReadyReason(p)));
    return absl::FailedPreconditionError(
        absl::StrCat(refText(ref), " has no Ready pod (", absl::StrJoin(each, "; "), ")"));
  }
  std::sort(ready.begin(), ready.end(), [](const PodInfo* a, const PodInfo* b) {
    return std::tie(a->creation, a->name) < std::tie(b->creation, b->name);
  });
  return *ready.front();
}

bool isMeshSidecar(std::string_view container) {
  return std::find(std::begin(kSidecars), std::end(kSidecars), container) != std::end(kSidecars);
}

absl::StatusOr<std::string> chooseContainer(const PodInfo& pod, std::string_view requested) {
  if (pod.containers.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("pod/", pod.name, " has no containers"));
  }
  if (!requested.empty()) {
    if (std::find(pod.containers.begin(), pod.containers.end(), requested) !=
        pod.containers.end()) {
      return std::string(requested);
    }
    return absl::NotFoundError(absl::StrCat("pod/", pod.name, " has no container '", asv(requested),
                                            "'; its containers: ", quoteList(pod.containers)));
  }
  auto it = pod.annotations.find("kubectl.kubernetes.io/default-container");
  if (it != pod.annotations.end() && !isMeshSidecar(it->second) &&
      std::find(pod.containers.begin(), pod.containers.end(), it->second) != pod.containers.end()) {
    return it->second;
  }
  for (const auto& c : pod.containers) {
    if (!isMeshSidecar(c)) return c;
  }
  return absl::FailedPreconditionError(absl::StrCat("pod/", pod.name, " has only mesh sidecars (",
                                                    quoteList(pod.containers),
                                                    "): name one with --container"));
}

absl::StatusOr<std::string> runtimeOf(std::string_view container_id) {
  const auto sep = container_id.find("://");
  if (sep == std::string_view::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("container ID '", asv(container_id), "' names no runtime"));
  }
  const std::string_view scheme = container_id.substr(0, sep);
  if (scheme == "containerd" || scheme == "cri-o" || scheme == "docker") {
    return std::string(scheme);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the target runs under the runtime '", asv(scheme), "' (container ID ", asv(container_id),
      "), which the agent cannot ask (it asks containerd, CRI-O and Docker); "
      "--agent-mode ephemeral needs no runtime"));
}

std::string bareContainerId(std::string_view container_id) {
  const auto sep = container_id.find("://");
  return std::string(sep == std::string_view::npos ? container_id : container_id.substr(sep + 3));
}

}  // namespace siphon::kube
