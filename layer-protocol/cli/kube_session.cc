#include "cli/kube_session.h"

#include <signal.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/json_writer.h"
#include "cli/options.h"
#include "siphon/client/target.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/text.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {

namespace asio = net::asio;

namespace {

volatile sig_atomic_t g_interrupted = 0;

// The first SIGINT/SIGTERM asks for an orderly stop (what was created is
// removed); a second one is the user insisting: the default action (the
// agent then ends on its own timeouts, its Job's TTL removes the rest).
void onSignal(int sig) {
  if (g_interrupted != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_interrupted = 1;
}

std::string protocolVersion() {
  const v1::Version v = protocol::currentVersion();
  return absl::StrCat(v.major(), ".", v.minor());
}

void printLine(const std::string& line) {
  std::string out = line;
  if (out.empty() || out.back() != '\n') out.push_back('\n');
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace

void armKubeSignals() {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool kubeInterrupted() { return g_interrupted != 0; }

std::string defaultAgentImage() {
  return absl::StrCat("docker.io/siphon/siphon-agent:", SIPHON_VERSION);
}

void addKubeOptions(CLI::App& app, KubeFlags& f) {
  const char* group = "Kubernetes (docs/KUBERNETES.md)";
  f.target_option =
      app.add_option(
             "--target", f.target,
             "KIND/NAME of a workload (pod, deployment, statefulset, replicaset, daemonset, "
             "job, or deploy, sts, rs, ds, po; labels/SELECTOR): an agent on each of its "
             "Ready pods is found or started through kubectl and reached through a "
             "port-forward (instead of --agent); the session follows the pods as they come "
             "and go")
          ->group(group);
  app.add_option("--replicas", f.replicas,
                 "all: steal and mirror on every Ready pod of the target, files, names, env "
                 "and outgoing traffic through one of them; one: one pod at a time. Either "
                 "way the session moves to another pod when its pod goes")
      ->check(CLI::IsMember({"all", "one"}))
      ->capture_default_str()
      ->group(group);
  app.add_option("--no-pod-timeout", f.no_pod_timeout,
                 "With no Ready pod of the target (its pod gone, a replacement not Ready "
                 "yet), how long the session waits for one before it ends")
      ->capture_default_str()
      ->group(group);
  app.add_option("-n,--namespace", f.ns, "Namespace of --target (default: the context's)")
      ->group(group);
  app.add_option("--container", f.container,
                 "Container of the target pod (default: as kubectl picks it, never a mesh "
                 "sidecar)")
      ->group(group);
  app.add_option("--context", f.context, "kubeconfig context for kubectl")->group(group);
  app.add_option("--kubeconfig", f.kubeconfig, "kubeconfig file for kubectl")->group(group);
  app.add_option("--kubectl", f.kubectl, "kubectl binary (name on PATH, or a path)")
      ->capture_default_str()
      ->group(group);
  f.mode_option = app.add_option("--agent-mode", f.mode,
                                 "How the agent runs: job (a Job on the target's node), ephemeral "
                                 "(a container in the target pod) or targetless (a pod of its "
                                 "own, no target)")
                      ->check(CLI::IsMember({"job", "ephemeral", "targetless"}))
                      ->capture_default_str()
                      ->group(group);
  app.add_option("--agent-image", f.image,
                 absl::StrCat("Image of an agent started for the session (default ",
                              defaultAgentImage(), ")"))
      ->group(group);
  app.add_option("--agent-namespace", f.agent_ns,
                 "Namespace of a job or targetless agent (default: the target's); it must "
                 "enforce the \"privileged\" Pod Security level")
      ->group(group);
  app.add_option("--agent-idle-timeout", f.idle_timeout,
                 "An agent started for the session exits once no session used it for this long")
      ->capture_default_str()
      ->group(group);
  app.add_option("--agent-fs-mode", f.fs_mode,
                 "Files of the target an agent started for the session serves: ro (writes "
                 "answer EROFS), rw (its container gets DAC_OVERRIDE, FOWNER, CHOWN, FSETID) "
                 "or off; a running agent of another mode is not reused")
      ->check(CLI::IsMember({"ro", "rw", "off"}))
      ->capture_default_str()
      ->group(group);
  app.add_option("--agent-start-timeout", f.start_timeout,
                 "How long an agent may take to get ready (failures are told at once)")
      ->capture_default_str()
      ->group(group);
  app.add_option("--agent-runtime-socket", f.runtime_socket,
                 "The container runtime's socket on the node, for a job agent (default: the "
                 "runtime's usual path; k3s: /run/k3s/containerd/containerd.sock)")
      ->group(group);
  app.add_flag("--no-reuse", f.no_reuse,
               "Start a new agent even when one of the same target container runs")
      ->group(group);
  app.add_option("--config", f.config,
                 "Project config file (default: .siphon.json here or in a directory above)")
      ->group(group);
  app.add_flag("--no-config", f.no_config, "Read no project config file")->group(group);
}

bool kubeWanted(const KubeFlags& f) {
  return !f.target.empty() || (f.mode_option != nullptr && f.mode == "targetless");
}

kube::KubectlOptions kubectlOptions(const KubeFlags& f) {
  kube::KubectlOptions o;
  o.binary = f.kubectl;
  o.context = f.context;
  o.kubeconfig = f.kubeconfig;
  return o;
}

absl::StatusOr<kube::KeeperOptions> keeperOptions(const KubeFlags& f) {
  kube::KeeperOptions o;
  if (f.mode == "job") {
    o.mode = kube::AgentMode::kJob;
  } else if (f.mode == "ephemeral") {
    o.mode = kube::AgentMode::kEphemeral;
  } else if (f.mode == "targetless") {
    o.mode = kube::AgentMode::kTargetless;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--agent-mode ", f.mode, ": job, ephemeral or targetless"));
  }
  o.image = f.image.empty() ? defaultAgentImage() : f.image;
  o.agent_ns = f.agent_ns;
  auto idle = parseDuration(f.idle_timeout);
  if (!idle.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--agent-idle-timeout: ", idle.status().message()));
  }
  // The agent's own syntax: whole seconds.
  o.idle_timeout = absl::StrCat(std::max<int64_t>(1, idle->count() / 1000), "s");
  auto start = parseDuration(f.start_timeout);
  if (!start.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--agent-start-timeout: ", start.status().message()));
  }
  o.start_timeout = *start;
  o.fs_mode = f.fs_mode;
  o.runtime_socket = f.runtime_socket;
  o.reuse = !f.no_reuse;
  o.version = SIPHON_VERSION;
  o.protocol = protocolVersion();
  return o;
}

void printPhase(const kube::PhaseEvent& e, bool json) {
  if (!json) {
    printLine("siphon: " + e.text);
    return;
  }
  JsonLine line("kube");
  line.add("phase", e.phase).add("message", e.text);
  for (const auto& [k, v] : e.fields) line.add(k, v);
  printLine(line.take());
}

int kubeExitCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    default:
      return kExitError;
  }
}

absl::StatusOr<std::unique_ptr<KubeSession>> KubeSession::open(const KubeFlags& flags, bool json,
                                                               bool follow) {
  std::unique_ptr<KubeSession> s(new KubeSession());
  s->json_ = json;
  ASSIGN_OR_RETURN(auto options, keeperOptions(flags));
  s->kubectl_ = std::make_unique<kube::SystemKubectl>(kubectlOptions(flags));
  auto report = [json](const kube::PhaseEvent& e) { printPhase(e, json); };
  s->keeper_ = std::make_unique<kube::AgentKeeper>(*s->kubectl_, options, report,
                                                   [] { return kubeInterrupted(); });
  if (options.mode == kube::AgentMode::kTargetless && flags.target.empty()) {
    ASSIGN_OR_RETURN(s->agent_, s->keeper_->ensureTargetless(flags.ns));
    return s;
  }
  ASSIGN_OR_RETURN(auto ref, kube::parseTarget(flags.target));
  if (options.mode == kube::AgentMode::kTargetless) {
    return absl::InvalidArgumentError(
        "--agent-mode targetless takes no --target (its agent has no target)");
  }
  report({"resolving",
          absl::StrCat("resolving ", kube::refText(ref),
                       flags.ns.empty() ? "" : " in namespace " + flags.ns),
          {{"target", kube::refText(ref)}}});
  kube::ResolveRequest request{ref, flags.ns, flags.container,
                               options.mode == kube::AgentMode::kJob};
  ASSIGN_OR_RETURN(auto target, kube::resolveTarget(*s->kubectl_, request));
  report({"resolved",
          "target " + target.summary,
          {{"pod", target.pod.name},
           {"namespace", target.pod.ns},
           {"container", target.container},
           {"node", target.pod.node}}});
  ASSIGN_OR_RETURN(s->agent_, s->keeper_->ensure(target));
  // The session follows the target's pods (kube_workload.h).
  auto no_pod = parseDuration(flags.no_pod_timeout);
  if (!no_pod.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--no-pod-timeout: ", no_pod.status().message()));
  }
  WorkloadFollower::Options& w = s->follow_;
  w.kubectl = kubectlOptions(flags);
  w.keeper = options;
  w.ns = target.pod.ns;
  w.label_selector = target.label_selector;
  w.pod = target.label_selector.empty() ? target.pod.name : std::string();
  w.container = flags.container;
  w.target_text = kube::refText(ref);
  w.single = flags.replicas == "one";
  w.no_pod_timeout = *no_pod;
  w.json = json;
  s->first_pod_ = target.pod;
  s->following_ = follow;
  return s;
}

KubeSession::~KubeSession() { finish(); }

void KubeSession::configure(client::ClientOptions& options, asio::any_io_executor ex) {
  forwards_ = std::make_shared<Forwards>(kubectl_.get());
  forwards_->add(ex, agent_);
  options.endpoints = {endpointName(agent_)};
  options.token = agent_.token;
  std::weak_ptr<Forwards> weak = forwards_;
  options.resolve_endpoint = [weak](std::string endpoint,
                                    bool after_cut) -> net::awaitable<absl::StatusOr<std::string>> {
    auto f = weak.lock();
    if (!f) co_return absl::CancelledError("the session is over");
    co_return co_await f->address(endpoint, after_cut);
  };
  // Every agent has a token of its own (its Secret's).
  options.token_for = [weak](const std::string& endpoint) {
    auto f = weak.lock();
    return f ? f->token(endpoint) : std::string();
  };
  if (following_) {
    options.replicas = true;
    options.reopen_files = true;
    follower_ = WorkloadFollower::create(ex, follow_, forwards_, agent_, first_pod_);
  }
}

void KubeSession::start(std::shared_ptr<client::Client> client) {
  if (follower_) follower_->start(std::move(client));
}

net::awaitable<void> KubeSession::beforeClose(std::shared_ptr<client::Client> client) {
  if (follower_) {
    co_await follower_->beforeClose();
    co_return;
  }
  if (!agent_.created || !client->lostStatus().ok()) co_return;
  client::Target target = client::Target::over(client);
  target.setCallTimeout(std::chrono::seconds(5));
  auto info = co_await target.info();
  // Unknown (no answer): keep the agent; it exits on its idle timeout.
  others_ = !info.ok() || info->sessions > 1;
}

net::awaitable<void> KubeSession::afterClose() {
  if (forwards_) forwards_->stopAll();
  co_return;
}

void KubeSession::finish() {
  if (finished_) return;
  finished_ = true;
  if (forwards_) forwards_->stopAll();
  if (follower_) {
    follower_->finish();
    return;
  }
  if (!keeper_ || !agent_.created) return;
  if (others_) {
    printPhase({"kept",
                absl::StrCat("agent ", agent_.name,
                             " left running: another session uses it (it "
                             "exits on its idle timeout)"),
                {{"agent", agent_.name}}},
               json_);
    return;
  }
  absl::Status removed = keeper_->remove(agent_);
  if (!removed.ok()) {
    printPhase({"remove_failed",
                absl::StrCat("could not remove agent ", agent_.name, ": ", removed.message(),
                             " (it exits on its idle timeout; its Job's TTL removes the rest)"),
                {{"agent", agent_.name}}},
               json_);
    return;
  }
  printPhase({"removed",
              agent_.mode == kube::AgentMode::kEphemeral
                  ? absl::StrCat("removed the token of agent ", agent_.name,
                                 " (an ephemeral container stays in its pod; it exits on its "
                                 "idle timeout)")
                  : absl::StrCat("removed agent ", agent_.name, " and its token"),
              {{"agent", agent_.name}}},
             json_);
}

// siphon agents

void addAgentsCommand(CLI::App& app, AgentsCommand& command) {
  command.agents = app.add_subcommand(
      "agents",
      "The agents Siphon started in the cluster (needs --target's kubectl options, "
      "not --agent): target, node, mode, age, sessions, version");
  command.agents->add_flag("-A,--all-namespaces", command.all_namespaces,
                           "Every namespace (default: -n, else the context's)");
  command.clean = command.agents->add_subcommand(
      "clean", "Remove the agents no session uses (their Job or pod, and their token)");
}

namespace {

struct AgentStatus {
  kube::AgentRow row;
  int sessions = -1;  // -1: not asked (not running, or no answer)
  std::string version;
  std::string error;
};

// Each running agent's sessions, asked through a port-forward of its own.
net::awaitable<void> askSessions(std::vector<AgentStatus>* rows, kube::Kubectl* kubectl,
                                 kube::AgentKeeper* keeper, client::ClientOptions base) {
  auto ex = co_await asio::this_coro::executor;
  for (auto& a : *rows) {
    if (a.row.phase != "Running" || a.row.pod.empty()) continue;
    auto token = keeper->tokenOf(a.row, &a.row.port);
    if (!token.ok()) {
      a.error = std::string(token.status().message());
      continue;
    }
    kube::PortForward::Options o;
    o.ns = a.row.ns;
    o.pod = a.row.pod;
    o.remote_port = a.row.port;
    auto forward = kube::PortForward::create(
        ex, [kubectl](const std::vector<std::string>& args) { return kubectl->argv(args); }, o);
    client::ClientOptions options = base;
    options.endpoints = {absl::StrCat("kube:", a.row.ns, "/", a.row.pod)};
    options.token = *token;
    options.reconnect = false;
    options.client_name = "siphon agents";
    options.resolve_endpoint = [forward](std::string,
                                         bool cut) -> net::awaitable<absl::StatusOr<std::string>> {
      co_return co_await forward->address(cut);
    };
    auto c = client::Client::create(ex, options);
    absl::Status s = co_await c->connect();
    if (s.ok()) {
      client::Target t = client::Target::over(c);
      auto info = co_await t.info();
      if (info.ok()) {
        a.sessions = static_cast<int>(info->sessions) - 1;  // not this one
        a.version = info->agent_version;
      } else {
        a.error = std::string(info.status().message());
      }
      // The Goaway through before the port-forward goes: else the agent
      // counts this session, detached, for its grace.
      co_await c->closeAndWait(kGoawayCrossing);
    } else {
      a.error = std::string(s.message());
    }
    forward->stop();
  }
}

}  // namespace

int runAgentsCommand(const AgentsCommand& command, const KubeFlags& flags, bool json,
                     const client::ClientOptions& base) {
  auto options = keeperOptions(flags);
  if (!options.ok()) {
    printError(sv(options.status().message()));
    return kExitUsage;
  }
  kube::SystemKubectl kubectl(kubectlOptions(flags));
  kube::AgentKeeper keeper(kubectl, *options, nullptr);
  auto rows = keeper.list(flags.ns, command.all_namespaces);
  if (!rows.ok()) {
    printError(sv(rows.status().message()));
    return kubeExitCode(rows.status());
  }
  std::vector<AgentStatus> agents;
  for (auto& r : *rows) agents.push_back({r, -1, r.version, ""});
  {
    asio::io_context io;
    net::spawn(io, askSessions(&agents, &kubectl, &keeper, base), "agents_sessions");
    io.run();
  }
  const bool clean = command.clean != nullptr && command.clean->parsed();
  int rc = kExitOk;
  std::string out;
  JsonWriter list;
  if (json && !clean) list.beginArray();
  bool first = true;
  for (const auto& a : agents) {
    if (clean) {
      // Unused: no session on it, or it no longer runs. An agent that did
      // not answer is left alone (it may be serving).
      const bool unused = a.sessions == 0 || (a.row.phase != "Running" && a.error.empty());
      if (!unused) continue;
      absl::Status s = keeper.removeRow(a.row);
      if (!s.ok()) {
        printError(absl::StrCat("agent ", a.row.name, ": ", s.message()));
        rc = kExitError;
        continue;
      }
      if (json) {
        absl::StrAppend(
            &out, JsonLine("removed").add("namespace", a.row.ns).add("agent", a.row.name).take());
      } else {
        absl::StrAppend(&out, "removed ", a.row.ns, "/", a.row.name, "\n");
      }
      continue;
    }
    if (json) {
      JsonWriter& w = list;
      w.beginObject();
      w.key("namespace").value(a.row.ns);
      w.key("agent").value(a.row.name);
      w.key("pod").value(a.row.pod);
      w.key("target").value(a.row.target);
      w.key("node").value(a.row.node);
      w.key("mode").value(a.row.mode);
      w.key("phase").value(a.row.phase);
      w.key("created").value(a.row.created);
      if (a.sessions >= 0) w.key("sessions").value(static_cast<uint64_t>(a.sessions));
      w.key("version").value(a.version);
      if (!a.error.empty()) w.key("error").value(a.error);
      w.endObject();
    } else {
      if (first) {
        absl::StrAppend(&out,
                        "NAMESPACE\tAGENT\tTARGET\tNODE\tMODE\tPHASE\tCREATED\tSESSIONS\t"
                        "VERSION\n");
      }
      absl::StrAppend(&out, a.row.ns, "\t", a.row.name, "\t",
                      a.row.target.empty() ? "-" : a.row.target, "\t",
                      a.row.node.empty() ? "-" : a.row.node, "\t", a.row.mode, "\t",
                      a.row.phase.empty() ? "-" : a.row.phase, "\t", a.row.created, "\t",
                      a.sessions >= 0 ? std::to_string(a.sessions) : "?", "\t",
                      a.version.empty() ? "-" : a.version, "\n");
    }
    first = false;
  }
  if (json && !clean) out = list.endArray().take();
  if (!json && !clean && agents.empty()) out = "no agents\n";
  if (int w = printOutput(out); w != 0) return w;
  return rc;
}

}  // namespace siphon::cli
