// Writes what `siphon --target` would create, for fixed inputs, into a
// directory, for tests/deploy/check_generated_manifests.py to hold against
// images/k8s/ (field by field) and check_manifests.py (with the agent's own
// --help): job.yaml (Secret and Job), ephemeral.yaml (the ephemeralcontainers
// patch), targetless.yaml (the pod), values.json (the inputs, to fill the
// YAML files' placeholders) and permissions.json (every `auth can-i` asked).
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kube/admission.h"
#include "kube/agent_manifest.h"
#include "tests/unit/kube/sample_spec.h"

using namespace siphon::kube;
using nlohmann::json;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: manifest_dump DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  AgentSpec s = sampleJobSpec("web-0");
  std::ofstream(dir + "/job.yaml") << secretManifest(s) << "\n---\n" << jobManifest(s) << "\n";
  AgentSpec e = s;
  e.mode = AgentMode::kEphemeral;
  e.ns = "shop";
  std::ofstream(dir + "/ephemeral.yaml") << secretManifest(e) << "\n---\n"
                                         << ephemeralPatch(e) << "\n";
  AgentSpec t = s;
  t.mode = AgentMode::kTargetless;
  std::ofstream(dir + "/targetless.yaml") << targetlessPodManifest(t) << "\n";
  json values = {{"AGENT_NAMESPACE", s.ns}, {"POD_NAMESPACE", e.ns},
                 {"SESSION", s.session},    {"NODE_NAME", s.node},
                 {"NODE_UID", s.node_uid},  {"CONTAINER_ID", "9f1c7e0d2b"},
                 {"CONTAINER_NAME", "app"}, {"POD_NAME", s.target_pod},
                 {"IMAGE", s.image},        {"TOKEN", s.token}};
  std::ofstream(dir + "/values.json") << values.dump(1) << "\n";
  json perms = json::array();
  for (AgentMode mode : {AgentMode::kJob, AgentMode::kEphemeral, AgentMode::kTargetless}) {
    for (Kind kind : {Kind::kPod, Kind::kDeployment, Kind::kStatefulSet, Kind::kReplicaSet,
                      Kind::kDaemonSet, Kind::kJob}) {
      for (const auto& p : permissionsFor(mode, kind, "shop", "shop")) {
        perms.push_back({{"verb", p.verb}, {"resource", p.resource}, {"ns", p.ns}});
      }
    }
  }
  std::ofstream(dir + "/permissions.json") << perms.dump(1) << "\n";
  return 0;
}
