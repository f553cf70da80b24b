#include "kube/admission.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kube/json_read.h"
#include "kube/resolve.h"

namespace siphon::kube {

namespace {

std::string whatWouldWork(const std::string& ns, AgentMode mode,
                          const std::vector<std::string>& privileged) {
  if (mode == AgentMode::kEphemeral) {
    return absl::StrCat(
        "an ephemeral agent lives in the target's namespace: use --agent-mode job with "
        "--agent-namespace NS of a namespace that enforces \"privileged\"",
        privileged.empty() ? "" : absl::StrCat(" (such as ", absl::StrJoin(privileged, ", "), ")"));
  }
  std::string s = "give --agent-namespace NS of a namespace that enforces \"privileged\"";
  if (!privileged.empty()) {
    absl::StrAppend(&s, " (such as ", absl::StrJoin(privileged, ", "), ")");
  } else {
    absl::StrAppend(&s,
                    " (e.g. kubectl create namespace siphon && kubectl label namespace "
                    "siphon pod-security.kubernetes.io/enforce=privileged)");
  }
  (void)ns;
  return s;
}

std::string agentNeeds(AgentMode mode) {
  switch (mode) {
    case AgentMode::kJob:
      return "hostPID, the runtime's socket (hostPath) and added capabilities";
    case AgentMode::kEphemeral:
    case AgentMode::kTargetless:
      return "added capabilities (SYS_ADMIN, NET_ADMIN...)";
  }
  return "";
}

}  // namespace

absl::Status checkPodSecurity(const std::string& ns_json, AgentMode mode,
                              const std::vector<std::string>& privileged_namespaces) {
  std::string ns, level;
  try {
    auto j = json_read::parse(ns_json, "namespace");
    ns = json_read::str(j, {"metadata", "name"});
    auto labels = json_read::strings(j, {"metadata", "labels"});
    auto it = labels.find("pod-security.kubernetes.io/enforce");
    if (it == labels.end()) return absl::OkStatus();
    level = absl::AsciiStrToLower(it->second);
  } catch (const std::exception& e) {
    return json_read::toStatus(e);
  }
  if (level == kRequiredLevel) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("namespace ", ns, " enforces Pod Security \"", level, "\"; the agent (",
                   modeName(mode), ") needs \"", kRequiredLevel, "\" for ", agentNeeds(mode), ": ",
                   whatWouldWork(ns, mode, privileged_namespaces)));
}

absl::Status admissionError(const std::string& kubectl_error, const std::string& ns,
                            AgentMode mode) {
  const auto at = kubectl_error.find("violates PodSecurity \"");
  if (at == std::string::npos) return absl::OkStatus();
  const auto start = at + std::string_view("violates PodSecurity \"").size();
  const auto end = kubectl_error.find_first_of(":\"", start);
  const std::string level = kubectl_error.substr(start, end - start);
  return absl::FailedPreconditionError(
      absl::StrCat("namespace ", ns, " enforces Pod Security \"", level,
                   "\" and refused the agent (", modeName(mode), "), which needs \"",
                   kRequiredLevel, "\" for ", agentNeeds(mode), ": ", whatWouldWork(ns, mode, {})));
}

std::vector<Permission> permissionsFor(AgentMode mode, Kind target_kind,
                                       const std::string& target_ns, const std::string& agent_ns) {
  std::vector<Permission> p;
  if (mode != AgentMode::kTargetless) {
    p.push_back({"get", "pods", target_ns, "to read the target pod"});
    p.push_back({"watch", "pods", target_ns, "to follow the target's pods"});
    if (target_kind != Kind::kPod) {
      p.push_back({"get", kindResource(target_kind), target_ns, "to read the target workload"});
      p.push_back({"list", "pods", target_ns, "to find the workload's pods"});
    }
  }
  // Finding a running agent to reuse, and watching a new one start.
  p.push_back({"list", "pods", agent_ns, "to find and watch the agent"});
  p.push_back({"get", "pods/log", agent_ns, "to read the agent's ready line"});
  p.push_back({"create", "pods/portforward", agent_ns, "to reach the agent"});
  p.push_back({"create", "secrets", agent_ns, "to hold the agent's token"});
  p.push_back({"get", "secrets", agent_ns, "to read a running agent's token"});
  p.push_back({"delete", "secrets", agent_ns, "to remove the token"});
  switch (mode) {
    case AgentMode::kJob:
      p.push_back({"get", "nodes", "", "to make the Node the agent's owner"});
      p.push_back({"create", "jobs.batch", agent_ns, "to create the agent's Job"});
      p.push_back({"delete", "jobs.batch", agent_ns, "to remove the agent's Job"});
      p.push_back({"patch", "secrets", agent_ns, "to make the Job the token's owner"});
      break;
    case AgentMode::kEphemeral:
      p.push_back(
          {"patch", "pods/ephemeralcontainers", agent_ns, "to add the agent to the target pod"});
      break;
    case AgentMode::kTargetless:
      p.push_back({"create", "pods", agent_ns, "to create the agent's pod"});
      p.push_back({"delete", "pods", agent_ns, "to remove the agent's pod"});
      p.push_back({"patch", "secrets", agent_ns, "to make the pod the token's owner"});
      break;
  }
  return p;
}

std::vector<std::string> canIArgs(const Permission& p) {
  std::vector<std::string> a = {"auth", "can-i", p.verb};
  const auto slash = p.resource.find('/');
  if (slash == std::string::npos) {
    a.push_back(p.resource);
  } else {
    a.push_back(p.resource.substr(0, slash));
    a.push_back("--subresource=" + p.resource.substr(slash + 1));
  }
  if (!p.ns.empty()) a.insert(a.end(), {"-n", p.ns});
  return a;
}

std::string accessReviews(const std::vector<Permission>& permissions) {
  using nlohmann::json;
  json items = json::array();
  for (const auto& p : permissions) {
    // "jobs.batch" is resource jobs of group batch; "pods/portforward" the
    // subresource portforward of pods (core group).
    std::string resource = p.resource, subresource;
    if (const auto slash = resource.find('/'); slash != std::string::npos) {
      subresource = resource.substr(slash + 1);
      resource.resize(slash);
    }
    std::string group;
    if (const auto dot = resource.find('.'); dot != std::string::npos) {
      group = resource.substr(dot + 1);
      resource.resize(dot);
    }
    json attrs = {{"verb", p.verb}, {"resource", resource}};
    if (!group.empty()) attrs["group"] = group;
    if (!subresource.empty()) attrs["subresource"] = subresource;
    if (!p.ns.empty()) attrs["namespace"] = p.ns;
    items.push_back({{"apiVersion", "authorization.k8s.io/v1"},
                     {"kind", "SelfSubjectAccessReview"},
                     {"spec", {{"resourceAttributes", attrs}}}});
  }
  return json{{"apiVersion", "v1"}, {"kind", "List"}, {"items", items}}.dump();
}

std::vector<std::string> accessReviewArgs() {
  // No schema validation: it would fetch the cluster's OpenAPI document
  // first, which costs more than the reviews.
  return {"create", "--validate=false", "-f", "-", "-o", "jsonpath={.status.allowed}{\"\\n\"}"};
}

namespace {

// The reviews' answers in order, or nothing when the call failed or its
// output is not one "true"/"false" line per permission (the caller then
// asks `auth can-i`).
std::optional<std::vector<bool>> reviewAll(Kubectl& kubectl,
                                           const std::vector<Permission>& permissions) {
  auto r = kubectl.run(accessReviewArgs(), accessReviews(permissions));
  if (!r.ok() || !r->ok()) return std::nullopt;
  std::vector<bool> allowed;
  for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    if (line != "true" && line != "false") return std::nullopt;
    allowed.push_back(line == "true");
  }
  if (allowed.size() != permissions.size()) return std::nullopt;
  return allowed;
}

absl::Status forbidden(const Permission& p) {
  return absl::PermissionDeniedError(
      absl::StrCat("forbidden: you may not ", p.verb, " ", p.resource,
                   p.ns.empty() ? " (cluster-wide)" : " in namespace " + p.ns, " (", p.why,
                   "); ", asv(kRbacHint)));
}

}  // namespace

absl::Status checkPermissions(Kubectl& kubectl, const std::vector<Permission>& permissions) {
  if (permissions.empty()) return absl::OkStatus();
  if (auto allowed = reviewAll(kubectl, permissions)) {
    for (size_t i = 0; i < permissions.size(); ++i) {
      if (!(*allowed)[i]) return forbidden(permissions[i]);
    }
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> calls;
  for (const auto& p : permissions) calls.push_back(canIArgs(p));
  auto results = kubectl.runAll(calls);
  for (size_t i = 0; i < permissions.size(); ++i) {
    const auto& r = results[i];
    if (!r.ok()) return r.status();
    const std::string answer(absl::StripAsciiWhitespace(r->out));
    if (r->exit_code == 0 && absl::StartsWith(answer, "yes")) continue;
    const Permission& p = permissions[i];
    if (r->exit_code == 1 && absl::StartsWith(answer, "no")) return forbidden(p);
    return absl::UnavailableError(
        absl::StrCat("kubectl auth can-i ", p.verb, " ", p.resource, ": ", kubeError(*r)));
  }
  return absl::OkStatus();
}

}  // namespace siphon::kube
