#include "kube/resolve.h"

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::kube {

namespace {

std::vector<std::string> nsArgs(const std::string& ns) {
  if (ns.empty()) return {};
  return {"-n", ns};
}

std::string inNamespace(std::string_view ns) {
  return ns.empty() ? std::string(" in the current namespace")
                    : absl::StrCat(" in namespace ", asv(ns));
}

}  // namespace

absl::Status kubeCallError(const KubectlResult& r, std::string_view what,
                           std::string_view verb_resource, std::string_view ns) {
  switch (classify(r)) {
    case KubeFailure::kNotFound:
      return absl::NotFoundError(absl::StrCat(asv(what), " not found", inNamespace(ns)));
    case KubeFailure::kForbidden:
      return absl::PermissionDeniedError(absl::StrCat("forbidden: you may not ", asv(verb_resource),
                                                      inNamespace(ns), " (", kubeError(r), "); ",
                                                      asv(kRbacHint)));
    case KubeFailure::kUnauthorized:
      return absl::UnauthenticatedError(
          absl::StrCat("the cluster refused your credentials (", kubeError(r),
                       "): check `kubectl auth whoami` with the same --context/--kubeconfig"));
    default:
      return absl::UnavailableError(
          absl::StrCat("kubectl ", asv(verb_resource), ": ", kubeError(r)));
  }
}

absl::StatusOr<ResolvedTarget> resolveTarget(Kubectl& kubectl, const ResolveRequest& request) {
  const TargetRef& ref = request.ref;
  ResolvedTarget t;
  PodInfo pod;
  if (ref.kind == Kind::kPod) {
    auto args = nsArgs(request.ns);
    args.insert(args.begin(), {"get", "pods", ref.name, "-o", "json"});
    ASSIGN_OR_RETURN(KubectlResult r, kubectl.run(args));
    if (!r.ok()) return kubeCallError(r, refText(ref), "get pods", request.ns);
    ASSIGN_OR_RETURN(pod, parsePod(r.out));
    if (!pod.ready()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pod/", pod.name, " is not Ready (", podNotReadyReason(pod), ")"));
    }
    t.field_selector = "metadata.name=" + pod.name;
  } else {
    std::string selector = ref.name;  // kLabels
    if (ref.kind != Kind::kLabels) {
      auto args = nsArgs(request.ns);
      args.insert(args.begin(), {"get", kindResource(ref.kind), ref.name, "-o", "json"});
      ASSIGN_OR_RETURN(KubectlResult r, kubectl.run(args));
      if (!r.ok()) {
        return kubeCallError(r, refText(ref), "get " + kindResource(ref.kind), request.ns);
      }
      ASSIGN_OR_RETURN(selector, workloadSelector(r.out));
    }
    t.label_selector = selector;
    // Without -n both calls use the context's namespace: the pods are the
    // workload's.
    std::vector<std::string> pargs = {"get", "pods", "-l", selector, "-o", "json"};
    auto more = nsArgs(request.ns);
    pargs.insert(pargs.end(), more.begin(), more.end());
    ASSIGN_OR_RETURN(KubectlResult pr, kubectl.run(pargs));
    if (!pr.ok()) return kubeCallError(pr, "pods of " + refText(ref), "list pods", request.ns);
    ASSIGN_OR_RETURN(auto pods, parsePodList(pr.out));
    ASSIGN_OR_RETURN(pod, choosePod(ref, pods));
    t.pods = pods.size();
    t.ready_pods = 0;
    for (const auto& p : pods) t.ready_pods += p.ready() ? 1 : 0;
  }
  ASSIGN_OR_RETURN(ResolvedTarget in_pod, targetInPod(pod, request.container, request.need_runtime));
  t.container = std::move(in_pod.container);
  t.container_id = std::move(in_pod.container_id);
  t.runtime = std::move(in_pod.runtime);
  if (ref.kind == Kind::kPod) {
    t.summary = absl::StrCat("pod/", pod.name, ", container ", t.container, " on ", pod.node);
  } else {
    t.summary = absl::StrCat(refText(ref), ": pod ", pod.name, " (", t.ready_pods, " of ", t.pods,
                             " Ready), container ", t.container, " on ", pod.node);
  }
  t.pod = std::move(pod);
  return t;
}

absl::StatusOr<ResolvedTarget> targetInPod(PodInfo pod, const std::string& container,
                                           bool need_runtime) {
  ResolvedTarget t;
  ASSIGN_OR_RETURN(t.container, chooseContainer(pod, container));
  const ContainerState* state = pod.status(t.container);
  if (state == nullptr || !state->running || state->container_id.empty()) {
    std::string why = "no status yet";
    if (state != nullptr && !state->waiting_reason.empty()) {
      why = absl::StrCat("waiting: ", state->waiting_reason);
    } else if (state != nullptr && state->terminated) {
      why =
          absl::StrCat("terminated: ", state->terminated_reason, ", exit code ", state->exit_code);
    }
    return absl::FailedPreconditionError(absl::StrCat("container ", t.container, " of pod/",
                                                      pod.name, " is not running (", why, ")"));
  }
  t.container_id = state->container_id;
  if (need_runtime) {
    ASSIGN_OR_RETURN(t.runtime, runtimeOf(t.container_id));
  }
  t.pod = std::move(pod);
  return t;
}

}  // namespace siphon::kube
