// One agent's inputs, fixed, for the tests that hold what is generated for
// an agent against images/k8s/ (agent_manifest_test, and manifest_dump for
// tests/deploy/check_generated_manifests.py).
#pragma once

#include <string>

#include "kube/agent_manifest.h"

namespace siphon::kube {

inline AgentSpec sampleJobSpec(std::string target_pod) {
  AgentSpec s;
  s.mode = AgentMode::kJob;
  s.session = "k3x9q";
  s.name = "siphon-agent-k3x9q";
  s.secret = "siphon-token-k3x9q";
  s.ns = "siphon";
  s.image = "registry.example/siphon-agent:0.1.0";
  s.token = newToken();
  s.target_ns = "shop";
  s.target_pod = std::move(target_pod);
  s.target_pod_uid = "5d3e6c1a-9b7f-4d2e-8a61-2f0c9e4b7a11";
  s.target_container = "app";
  s.container_id = "containerd://9f1c7e0d2b";
  s.runtime = "containerd";
  s.node = "node-b";
  s.node_uid = "0b0b0b0b-0000-0000-0000-000000000001";
  s.version = "0.1.0";
  s.protocol = "1.2";
  return s;
}

}  // namespace siphon::kube
