// The agent keeper: finds a running agent of the target container to reuse,
// else starts one (job, ephemeral or targetless), watches it start (one
// phase line each, a failure as one line within seconds), and removes what
// it created when the session is over.
//
// Before creating anything it reads what decides whether the cluster will
// take the agent (admission.h: the namespace's Pod Security level, the
// user's RBAC). What it creates, in order, so that nothing is ever without
// an owner: the token's Secret (owned by the Node, or the target pod for an
// ephemeral agent), the agent (Job, ephemeral container or pod), then the
// Secret is handed to the Job (or pod) as its owner. A start that fails or
// is cancelled removes what it made before returning.
//
// Threads: one thread; every call blocks on kubectl (it runs before the
// session's event loop and after it).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kube/agent_manifest.h"
#include "kube/kubectl.h"
#include "kube/resolve.h"
#include "kube/startup.h"

namespace siphon::kube {

struct KeeperOptions {
  AgentMode mode = AgentMode::kJob;
  std::string image;     // the agent image (required)
  std::string agent_ns;  // empty: the target's namespace
  std::string idle_timeout = "5m";
  // The agent's --fs-mode (ro, rw, off): an agent running with another
  // mode is not reused (neither more nor less than asked).
  std::string fs_mode = "ro";
  std::string runtime_socket;  // empty: the runtime's usual path
  bool reuse = true;
  std::chrono::milliseconds start_timeout{120000};
  std::chrono::milliseconds poll_interval{500};
  std::string version;   // the client's, a label
  std::string protocol;  // the client's "MAJOR.MINOR": an agent of another major is not reused
};

// An agent a session can use.
struct Agent {
  AgentMode mode = AgentMode::kJob;
  std::string ns;         // of its pod
  std::string pod;        // the pod to port-forward to
  std::string name;       // the Job, the pod (targetless) or the ephemeral container
  std::string container;  // the agent's container in `pod`
  std::string secret;
  std::string token;
  int port = 7140;
  bool created = false;  // by this session (a reused one is left alone)
};

// A row of `siphon agents`.
struct AgentRow {
  std::string ns;
  std::string name;  // Job, pod or ephemeral container
  std::string pod;
  std::string target;  // "NS/pod/NAME/CONTAINER"
  std::string node;
  std::string mode;
  std::string phase;    // the pod's
  std::string created;  // RFC 3339
  std::string version;
  std::string secret;
  int port = 7140;
};

class AgentKeeper {
 public:
  using Report = std::function<void(const PhaseEvent&)>;
  // The keeper's clock and sleep (tests: a fake time).
  struct Time {
    std::function<std::chrono::steady_clock::time_point()> now;
    std::function<void(std::chrono::milliseconds)> sleep;
  };
  static Time realTime();

  // `cancelled` is polled between steps (Ctrl-C during a start).
  AgentKeeper(Kubectl& kubectl, KeeperOptions options, Report report,
              std::function<bool()> cancelled = nullptr, Time time = realTime());

  // A running agent of `target` to reuse, else a new one, ready to serve.
  absl::StatusOr<Agent> ensure(const ResolvedTarget& target);
  // A targetless agent in `ns` (empty: the context's namespace).
  absl::StatusOr<Agent> ensureTargetless(const std::string& ns);

  // Removes an agent this session created (its Job or pod, and its Secret;
  // an ephemeral container cannot be removed: only its Secret goes, and the
  // agent exits on its idle timeout). Nothing for a reused agent.
  absl::Status remove(const Agent& agent);

  // Agents in `ns` (empty: the context's), or every namespace.
  absl::StatusOr<std::vector<AgentRow>> list(const std::string& ns, bool all_namespaces);
  // The token of a listed agent (from its Secret), and its port.
  absl::StatusOr<std::string> tokenOf(const AgentRow& row, int* port);
  // Removes a listed agent (Job or pod, and Secret).
  absl::Status removeRow(const AgentRow& row);

 private:
  absl::StatusOr<std::optional<Agent>> findRunning(const ResolvedTarget& target,
                                                   const std::string& ns);
  absl::Status admit(const std::string& ns, Kind kind, const std::string& target_ns);
  absl::StatusOr<Agent> start(AgentSpec spec, const std::string& target_pod_for_ephemeral);
  absl::Status waitReady(Agent& agent, const std::string& image);
  // The agent's token from its Secret, with the port and --fs-mode its
  // annotations say (when asked).
  absl::StatusOr<std::string> readToken(const std::string& ns, const std::string& secret,
                                        int* port, std::string* fs_mode = nullptr);
  std::string lastLogLines(const Agent& agent, int lines);
  void rollback(const Agent& agent, bool secret_made, bool agent_made);
  bool cancelled() const { return cancelled_ && cancelled_(); }
  AgentSpec baseSpec(const std::string& ns);

  Kubectl& kubectl_;
  KeeperOptions options_;
  Report report_;
  std::function<bool()> cancelled_;
  Time time_;
};

}  // namespace siphon::kube
