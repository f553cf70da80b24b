// A session bound to its workload, not to a pod (issue 42,
// docs/CONTINUITY.md "Workloads"): while the command runs, the target's
// pods are watched (kube/pod_watch.h) and judged (kube/workload_pods.h);
// every Ready pod gets an agent (found or started, as the first one was)
// reached through a port-forward of its own, and the client a replica
// session on it (ClientOptions::replicas), which carries every steal and
// mirror subscription. The primary pod answers files, names, env and
// outgoing traffic; when it goes, the client moves to another pod's agent
// (Client::promote). With no pod at all, the session waits
// --no-pod-timeout, says what it waits for, then ends with one line.
//
// Agents are started on a worker thread (the keeper blocks on kubectl);
// everything else runs on the session's executor. Agents this session
// started are removed when their pod goes and at the end (unless another
// session uses them).
//
// Threads: create/start/stop on the executor; finish() after the loop.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "kube/keeper.h"
#include "kube/kubectl.h"
#include "kube/pod_watch.h"
#include "kube/port_forward.h"
#include "kube/workload_pods.h"
#include "siphon/client/client.h"

namespace siphon::cli {

// Port-forwards by the endpoint name the client dials ("kube:NS/POD").
class Forwards {
 public:
  explicit Forwards(kube::Kubectl* kubectl) : kubectl_(kubectl) {}
  // A port-forward to the agent's pod, made on `ex` (idempotent).
  void add(net::asio::any_io_executor ex, const kube::Agent& agent);
  void stop(const std::string& endpoint);
  void stopAll();
  net::awaitable<absl::StatusOr<std::string>> address(const std::string& endpoint, bool after_cut);
  // The token of the agent at `endpoint` ("" when unknown).
  std::string token(const std::string& endpoint) const;

 private:
  kube::Kubectl* kubectl_;
  std::map<std::string, std::shared_ptr<kube::PortForward>> forwards_;
  std::map<std::string, std::string> tokens_;  // kept after stop(): a late dial fails cleanly
};

std::string endpointName(const kube::Agent& agent);

class WorkloadFollower : public std::enable_shared_from_this<WorkloadFollower> {
 public:
  struct Options {
    kube::KubectlOptions kubectl;
    kube::KeeperOptions keeper;
    std::string ns;
    std::string label_selector;  // or
    std::string pod;             // a pod target's name
    std::string container;       // as given ("" : the default in each pod)
    std::string target_text;     // "deployment/web"
    bool single = false;         // --replicas one
    std::chrono::milliseconds no_pod_timeout{300000};
    bool json = false;
  };

  // `first`: the agent the session opened on (of `first_pod`); `forwards`
  // holds its port-forward already.
  static std::shared_ptr<WorkloadFollower> create(net::asio::any_io_executor ex, Options options,
                                                  std::shared_ptr<Forwards> forwards,
                                                  kube::Agent first, kube::PodInfo first_pod);
  ~WorkloadFollower();

  // Starts watching the pods, for `client` (which must have replicas on).
  void start(std::shared_ptr<client::Client> client);
  // Before the client ends: no more pods followed; which agents other
  // sessions use (they stay).
  net::awaitable<void> beforeClose();
  // After the loop: the worker joined, the agents this session started
  // removed (but those another session uses). Blocks on kubectl.
  void finish();

 private:
  struct Covered {
    kube::PodInfo pod;
    std::optional<kube::Agent> agent;
    bool linked = false;    // a session of the client's on it
    bool retired = false;   // its pod stopped being usable
    bool others = false;    // another session uses its agent (it stays)
    bool removed = false;
  };

  WorkloadFollower(net::asio::any_io_executor ex, Options options,
                   std::shared_ptr<Forwards> forwards);
  void onPodEvent(const kube::PodEvent& event);
  void cover(const kube::PodInfo& pod);
  void retire(const kube::PodInfo& pod, const std::string& reason);
  void makePrimary(const kube::PodInfo& pod);
  void onAgent(std::string uid, absl::StatusOr<kube::Agent> agent);
  net::awaitable<void> link(std::shared_ptr<WorkloadFollower> self, std::string uid);
  void onReplica(const client::ReplicaEvent& event);
  // The pod a session endpoint belongs to ("" for none).
  std::string uidOf(const std::string& endpoint) const;
  // Drops the pod's replica session and removes its agent when this
  // session started it (on the worker).
  void release(const std::string& uid, const std::string& why);
  void startWaiting(const std::string& reason);
  void stopWaiting(const std::string& to);
  void say(const std::string& phase, const std::string& text,
           std::vector<std::pair<std::string, std::string>> fields = {});
  // The worker thread: runs `job` there (the keeper's blocking calls).
  void post(std::function<void()> job);
  void workerLoop();

  net::asio::any_io_executor ex_;
  Options options_;
  std::shared_ptr<Forwards> forwards_;
  std::shared_ptr<client::Client> client_;
  std::shared_ptr<kube::PodWatch> watch_;
  kube::WorkloadPods pods_;
  std::map<std::string, Covered> covered_;  // by pod UID
  std::string primary_uid_;
  std::string wanted_primary_;  // a primary whose agent is not linked yet
  bool stopping_ = false;
  // No pod: since when, and the limit's timer.
  std::optional<std::chrono::steady_clock::time_point> waiting_since_;
  std::string last_wait_reason_;
  std::shared_ptr<net::asio::steady_timer> wait_timer_;

  // The worker: its own kubectl and keeper (the main thread's are not
  // used while the loop runs).
  std::unique_ptr<kube::SystemKubectl> kubectl_;
  std::unique_ptr<kube::AgentKeeper> keeper_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<kube::Agent> made_;  // every agent the worker found or started (mu_)
  bool worker_stop_ = false;
  std::atomic<bool> cancel_{false};
};

}  // namespace siphon::cli
