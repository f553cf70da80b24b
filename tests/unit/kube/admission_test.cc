// Pod Security and RBAC, read before anything is created.
#include "kube/admission.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"

#include "tests/fakes/fake_kubectl.h"

namespace siphon::kube {
namespace {

std::string ns(const std::string& name, const std::string& level) {
  std::string labels =
      level.empty() ? "{}" : "{\"pod-security.kubernetes.io/enforce\":\"" + level + "\"}";
  return "{\"kind\":\"Namespace\",\"metadata\":{\"name\":\"" + name + "\",\"labels\":" + labels +
         "}}";
}

TEST(PodSecurity, PrivilegedOrUnlabelledAdmit) {
  EXPECT_TRUE(checkPodSecurity(ns("siphon", "privileged"), AgentMode::kJob, {}).ok());
  EXPECT_TRUE(checkPodSecurity(ns("dev", ""), AgentMode::kJob, {}).ok());
}

TEST(PodSecurity, ARefusalNamesTheLevelAndWhatWouldWork) {
  absl::Status s = checkPodSecurity(ns("shop", "baseline"), AgentMode::kJob, {"siphon"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "namespace shop enforces Pod Security \"baseline\"; the agent (job) needs "
            "\"privileged\" for hostPID, the runtime's socket (hostPath) and added capabilities: "
            "give --agent-namespace NS of a namespace that enforces \"privileged\" (such as "
            "siphon)");
  s = checkPodSecurity(ns("shop", "restricted"), AgentMode::kEphemeral, {});
  EXPECT_NE(s.message().find("enforces Pod Security \"restricted\""), std::string::npos);
  EXPECT_NE(s.message().find("use --agent-mode job with --agent-namespace"), std::string::npos)
      << s;
  s = checkPodSecurity(ns("shop", "baseline"), AgentMode::kTargetless, {});
  EXPECT_NE(s.message().find("kubectl label namespace siphon "
                             "pod-security.kubernetes.io/enforce=privileged"),
            std::string::npos)
      << s;
}

TEST(PodSecurity, TheApiServersRefusalReadsTheSame) {
  absl::Status s = admissionError(
      "Error from server (Forbidden): error when creating \"STDIN\": pods \"x\" is forbidden: "
      "violates PodSecurity \"baseline:latest\": host namespaces (hostPID=true)",
      "shop", AgentMode::kTargetless);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("namespace shop enforces Pod Security \"baseline\" and refused the "
                             "agent (targetless)"),
            std::string::npos)
      << s;
  EXPECT_TRUE(admissionError("Error from server (AlreadyExists): x", "shop", AgentMode::kJob).ok());
}

TEST(Rbac, EachModeAsksWhatItUses) {
  auto job = permissionsFor(AgentMode::kJob, Kind::kDeployment, "shop", "siphon");
  auto has = [](const std::vector<Permission>& ps, const std::string& verb, const std::string& res,
                const std::string& where) {
    for (const auto& p : ps) {
      if (p.verb == verb && p.resource == res && p.ns == where) return true;
    }
    return false;
  };
  EXPECT_TRUE(has(job, "get", "deployments.apps", "shop"));
  EXPECT_TRUE(has(job, "create", "jobs.batch", "siphon"));
  EXPECT_TRUE(has(job, "create", "pods/portforward", "siphon"));
  EXPECT_TRUE(has(job, "get", "nodes", ""));
  auto eph = permissionsFor(AgentMode::kEphemeral, Kind::kPod, "shop", "shop");
  EXPECT_TRUE(has(eph, "patch", "pods/ephemeralcontainers", "shop"));
  EXPECT_FALSE(has(eph, "create", "jobs.batch", "shop"));
  EXPECT_EQ(canIArgs({"create", "pods/portforward", "shop", ""}),
            (std::vector<std::string>{"auth", "can-i", "create", "pods",
                                      "--subresource=portforward", "-n", "shop"}));
  EXPECT_EQ(canIArgs({"get", "nodes", "", ""}),
            (std::vector<std::string>{"auth", "can-i", "get", "nodes"}));
}

TEST(Rbac, OneCallReviewsEveryPermission) {
  const auto perms = permissionsFor(AgentMode::kJob, Kind::kDeployment, "shop", "siphon");
  // The reviews: one per permission, group and subresource split out.
  auto reviews = nlohmann::json::parse(accessReviews(perms));
  ASSERT_EQ(reviews["items"].size(), perms.size());
  bool job = false, forward = false;
  for (const auto& r : reviews["items"]) {
    EXPECT_EQ(r["kind"], "SelfSubjectAccessReview");
    const auto& a = r["spec"]["resourceAttributes"];
    if (a["verb"] == "create" && a["resource"] == "jobs") job = a["group"] == "batch";
    if (a["resource"] == "pods" && a.value("subresource", "") == "portforward") {
      forward = !a.contains("group") && a["namespace"] == "siphon";
    }
  }
  EXPECT_TRUE(job);
  EXPECT_TRUE(forward);
  auto answers = [&](size_t refused) {
    std::string out;
    for (size_t i = 0; i < perms.size(); ++i) out += i == refused ? "false\n" : "true\n";
    return out;
  };
  // All allowed: one kubectl, no `auth can-i`.
  fakes::FakeKubectl k;
  k.on("create --validate=false", fakes::FakeKubectl::ok(answers(perms.size())));
  EXPECT_TRUE(checkPermissions(k, perms).ok());
  EXPECT_EQ(k.calls().size(), 1u);
  // One refused: named as `auth can-i` would name it.
  size_t refused = 0;
  while (perms[refused].resource != "jobs.batch") ++refused;
  k.on("create --validate=false", fakes::FakeKubectl::ok(answers(refused)));
  absl::Status s = checkPermissions(k, perms);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StartsWith(s.message(), "forbidden: you may not create jobs.batch in "
                                            "namespace siphon")) << s;
  // Refused, or answered otherwise than one line each: `auth can-i`.
  for (auto broken : {fakes::FakeKubectl::fail("Error from server (Forbidden)", 1),
                      fakes::FakeKubectl::ok("true\n")}) {
    fakes::FakeKubectl k2;
    k2.on("create --validate=false", broken);
    k2.on("auth can-i", fakes::FakeKubectl::ok("yes\n"));
    EXPECT_TRUE(checkPermissions(k2, perms).ok());
    EXPECT_EQ(k2.callsStarting("auth can-i").size(), perms.size());
  }
}

TEST(Rbac, TheFirstForbiddenPermissionIsNamed) {
  fakes::FakeKubectl k;
  // A cluster that refuses the one-call review: `auth can-i` each.
  k.on("create --validate=false", fakes::FakeKubectl::fail("error: unknown", 1));
  k.on("auth can-i", fakes::FakeKubectl::ok("yes\n"));
  k.on("auth can-i create jobs.batch", {1, "no\n", ""});
  absl::Status s =
      checkPermissions(k, permissionsFor(AgentMode::kJob, Kind::kPod, "shop", "siphon"));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "forbidden: you may not create jobs.batch in namespace siphon (to create the agent's "
            "Job); the minimal Role is in images/k8s/rbac.yaml (docs/KUBERNETES.md)");
  k.on("auth can-i", fakes::FakeKubectl::ok("yes\n"));
  EXPECT_TRUE(
      checkPermissions(k, permissionsFor(AgentMode::kJob, Kind::kPod, "shop", "siphon")).ok());
  k.on("auth can-i", fakes::FakeKubectl::fail("error: You must be logged in to the server", 1));
  s = checkPermissions(k, permissionsFor(AgentMode::kJob, Kind::kPod, "shop", "siphon"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace siphon::kube
