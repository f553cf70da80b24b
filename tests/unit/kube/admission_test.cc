// Pod Security and RBAC, read before anything is created.
#include "kube/admission.h"

#include <gtest/gtest.h>

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

TEST(Rbac, TheFirstForbiddenPermissionIsNamed) {
  fakes::FakeKubectl k;
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
