// `siphon --target KIND/NAME ...`: the CLI's side of a Kubernetes session
// (docs/KUBERNETES.md). The options (global, like --agent), and the session
// around a command: before it, the target resolved and an agent found or
// started (one line per phase on stderr, JSON events with --json); during
// it, the client dials the agent through a supervised port-forward; after
// it, the agent this session created removed unless another session uses
// it. Plus `siphon agents [clean]`, which needs no session of its own.
//
// Threads: open() and finish() block (they run before and after the event
// loop); configure() and beforeClose() on the loop.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kube/keeper.h"
#include "kube/kubectl.h"
#include "kube/port_forward.h"
#include "cli/kube_workload.h"
#include "siphon/client/client.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

// The most a session's end waits for the agent to close its connection
// after the Goaway (Client::closeAndWait) before the port-forward goes: a
// port-forward that carries the close back ends the wait at once; one that
// does not (no half-close through kubectl's relay) costs this.
inline constexpr std::chrono::milliseconds kGoawayCrossing{200};

struct KubeFlags {
  std::string target;
  std::string ns;
  std::string container;
  std::string context;
  std::string kubeconfig;
  std::string kubectl = "kubectl";
  std::string mode = "job";
  std::string image;
  std::string agent_ns;
  std::string idle_timeout = "5m";
  std::string fs_mode = "ro";
  std::string replicas = "all";
  std::string no_pod_timeout = "5m";
  std::string start_timeout = "2m";
  std::string runtime_socket;
  bool no_reuse = false;
  std::string config;  // --config F; empty: .siphon.json found upwards
  bool no_config = false;
  CLI::Option* mode_option = nullptr;
  CLI::Option* target_option = nullptr;
};

// Registers the options on `app` (global: they may follow the command).
void addKubeOptions(CLI::App& app, KubeFlags& flags);
// A Kubernetes session is wanted: --target, or --agent-mode targetless.
bool kubeWanted(const KubeFlags& flags);
// The agent image when --agent-image is not given.
std::string defaultAgentImage();
// The keeper's options from the flags. INVALID_ARGUMENT names the flag.
absl::StatusOr<kube::KeeperOptions> keeperOptions(const KubeFlags& flags);
kube::KubectlOptions kubectlOptions(const KubeFlags& flags);

// Set by SIGINT/SIGTERM while a kube session starts or ends (those steps
// run outside the event loop): the keeper stops and removes what it made.
void armKubeSignals();
bool kubeInterrupted();

// Prints one phase line (text) or event (--json) on stderr.
void printPhase(const kube::PhaseEvent& e, bool json);

class KubeSession {
 public:
  // Resolves the target and finds or starts its agent. The status's code
  // says the exit code (kubeExitCode).
  // `follow`: the session follows the target's pods (a command that runs
  // until stopped; kube_workload.h).
  static absl::StatusOr<std::unique_ptr<KubeSession>> open(const KubeFlags& flags, bool json,
                                                           bool follow = true);
  ~KubeSession();

  // The client's endpoint (a name: "kube:NS/POD"), token, and the
  // port-forward it dials through, started on `ex`.
  void configure(client::ClientOptions& options, net::asio::any_io_executor ex);
  // Once the client is connected: the session follows the target's pods
  // (every Ready pod covered, moves when its pod goes: kube_workload.h).
  void start(std::shared_ptr<client::Client> client);
  // Before the client ends its session: whether other sessions use the
  // agent (they keep it).
  net::awaitable<void> beforeClose(std::shared_ptr<client::Client> client);
  // After the client ended its session (Client::closeAndWait with
  // kGoawayCrossing: its Goaway across the port-forward): ends the
  // port-forward (the event loop ends once nothing runs).
  net::awaitable<void> afterClose();
  // Ends the port-forward; removes the agent this session created when no
  // other session used it (its Job or pod, and its Secret).
  void finish();

  const kube::Agent& agent() const { return agent_; }

 private:
  KubeSession() = default;
  bool json_ = false;
  std::unique_ptr<kube::SystemKubectl> kubectl_;
  std::unique_ptr<kube::AgentKeeper> keeper_;
  kube::Agent agent_;
  std::shared_ptr<Forwards> forwards_;
  bool following_ = false;
  WorkloadFollower::Options follow_;
  kube::PodInfo first_pod_;
  std::shared_ptr<WorkloadFollower> follower_;
  bool others_ = false;
  bool finished_ = false;
};

// The exit code for a failed open(): usage (2) for bad flags, unreachable
// (3) for a cluster or agent that cannot be reached, else 1.
int kubeExitCode(const absl::Status& status);

// `siphon agents [--all-namespaces]` and `siphon agents clean`.
struct AgentsCommand {
  CLI::App* agents = nullptr;
  CLI::App* clean = nullptr;
  bool all_namespaces = false;
};
void addAgentsCommand(CLI::App& app, AgentsCommand& command);
// Runs it (it needs no session: it asks kubectl, and each agent for its
// sessions through a port-forward). The exit code.
int runAgentsCommand(const AgentsCommand& command, const KubeFlags& flags, bool json,
                     const client::ClientOptions& base);

}  // namespace siphon::cli
