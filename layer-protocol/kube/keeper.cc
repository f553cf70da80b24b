#include "kube/keeper.h"

#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kube/admission.h"
#include "kube/json_read.h"
#include "siphon/status.h"

namespace siphon::kube {

using json_read::json;
using std::chrono::milliseconds;

namespace {

constexpr char kReadyLine[] = "siphon-agent ready";
constexpr int kBasePort = 7140;

std::string majorOf(const std::string& version) { return version.substr(0, version.find('.')); }

std::string labelSelector(std::initializer_list<std::pair<std::string, std::string>> labels) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : labels) parts.push_back(k + "=" + v);
  return absl::StrJoin(parts, ",");
}

}  // namespace

AgentKeeper::Time AgentKeeper::realTime() {
  return {[] { return std::chrono::steady_clock::now(); },
          [](milliseconds d) { std::this_thread::sleep_for(d); }};
}

AgentKeeper::AgentKeeper(Kubectl& kubectl, KeeperOptions options, Report report,
                         std::function<bool()> cancelled, Time time)
    : kubectl_(kubectl),
      options_(std::move(options)),
      report_(report ? std::move(report) : [](const PhaseEvent&) {}),
      cancelled_(std::move(cancelled)),
      time_(std::move(time)) {}

AgentSpec AgentKeeper::baseSpec(const std::string& ns) {
  AgentSpec s;
  s.mode = options_.mode;
  s.session = newSession();
  s.name = "siphon-agent-" + s.session;
  s.secret = "siphon-token-" + s.session;
  s.ns = ns;
  s.image = options_.image;
  s.token = newToken();
  s.idle_timeout = options_.idle_timeout;
  s.fs_mode = options_.fs_mode;
  s.runtime_socket = options_.runtime_socket;
  s.version = options_.version;
  s.protocol = options_.protocol;
  return s;
}

absl::StatusOr<std::string> AgentKeeper::readToken(const std::string& ns, const std::string& secret,
                                                   int* port, std::string* fs_mode) {
  ASSIGN_OR_RETURN(auto r, kubectl_.run({"get", "secret", secret, "-n", ns, "-o", "json"}));
  if (!r.ok()) return kubeCallError(r, "secret/" + secret, "get secrets", ns);
  try {
    json j = json_read::parse(r.out, "secret");
    std::string token;
    if (!absl::Base64Unescape(json_read::str(j, {"data", "token"}), &token) || token.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("secret/", secret, " in namespace ", ns, " holds no token"));
    }
    auto ann = json_read::strings(j, {"metadata", "annotations"});
    if (fs_mode != nullptr) {
      auto it = ann.find(kAnnotationFsMode);
      *fs_mode = it == ann.end() ? "ro" : it->second;
    }
    if (port != nullptr) {
      int p = 0;
      if (auto it = ann.find(kAnnotationPort);
          it != ann.end() && absl::SimpleAtoi(it->second, &p)) {
        *port = p;
      }
    }
    return token;
  } catch (const std::exception& e) {
    return json_read::toStatus(e);
  }
}

absl::StatusOr<std::optional<Agent>> AgentKeeper::findRunning(const ResolvedTarget& target,
                                                              const std::string& ns) {
  const std::string major = majorOf(options_.protocol);
  if (options_.mode == AgentMode::kEphemeral) {
    // Ephemeral agents are containers of the target pod itself.
    for (const auto& st : target.pod.ephemeral_statuses) {
      if (!absl::StartsWith(st.name, "siphon-agent-") || !st.running) continue;
      const std::string session = st.name.substr(std::string_view("siphon-agent-").size());
      Agent a;
      a.mode = AgentMode::kEphemeral;
      a.ns = target.pod.ns;
      a.pod = target.pod.name;
      a.name = a.container = st.name;
      a.secret = "siphon-token-" + session;
      std::string fs_mode;
      auto token = readToken(a.ns, a.secret, &a.port, &fs_mode);
      if (!token.ok()) continue;  // an agent of someone else's, or its Secret is gone
      if (fs_mode != options_.fs_mode) continue;  // files served otherwise than asked
      a.token = *std::move(token);
      return std::optional<Agent>(std::move(a));
    }
    return std::optional<Agent>();
  }
  ASSIGN_OR_RETURN(auto r, kubectl_.run({"get", "pods", "-n", ns, "-l",
                                         labelSelector({{kLabelName, kLabelNameValue},
                                                        {kLabelTargetUid, target.pod.uid},
                                                        {kLabelTargetContainer, target.container}}),
                                         "-o", "json"}));
  if (!r.ok()) return kubeCallError(r, "the agents of pod/" + target.pod.name, "list pods", ns);
  ASSIGN_OR_RETURN(auto pods, parsePodList(r.out));
  for (const auto& p : pods) {
    if (p.terminating || p.phase != "Running") continue;
    const ContainerState* st = p.status("siphon-agent");
    if (st == nullptr || !st->running) continue;
    auto proto = p.labels.find(kLabelProtocol);
    if (proto == p.labels.end() || majorOf(proto->second) != major) continue;
    if (!options_.image.empty() && !p.container_images.empty() &&
        p.container_images.front() != options_.image) {
      continue;  // the user asked for another image
    }
    auto secret = p.annotations.find(kAnnotationSecret);
    if (secret == p.annotations.end()) continue;
    Agent a;
    a.mode = p.labels.count(kLabelMode) && p.labels.at(kLabelMode) == "targetless"
                 ? AgentMode::kTargetless
                 : AgentMode::kJob;
    a.ns = p.ns.empty() ? ns : p.ns;
    a.pod = p.name;
    a.container = "siphon-agent";
    a.name = p.labels.count("job-name") ? p.labels.at("job-name") : p.name;
    a.secret = secret->second;
    std::string fs_mode;
    auto token = readToken(a.ns, a.secret, &a.port, &fs_mode);
    if (!token.ok()) continue;
    if (fs_mode != options_.fs_mode) continue;  // files served otherwise than asked
    a.token = *std::move(token);
    return std::optional<Agent>(std::move(a));
  }
  return std::optional<Agent>();
}

absl::Status AgentKeeper::admit(const std::string& ns, Kind kind, const std::string& target_ns) {
  // Pod Security first: it needs no permission of the user's but reading
  // the namespace (when even that is forbidden, admission says it later).
  ASSIGN_OR_RETURN(auto r, kubectl_.run({"get", "namespace", ns, "-o", "json"}));
  if (r.ok()) {
    absl::Status psa = checkPodSecurity(r.out, options_.mode, {});
    if (!psa.ok() && absl::IsFailedPrecondition(psa)) {
      // Name namespaces that would take it, when the user may list them.
      std::vector<std::string> privileged;
      auto l =
          kubectl_.run({"get", "namespaces", "-l", "pod-security.kubernetes.io/enforce=privileged",
                        "-o", "jsonpath={.items[*].metadata.name}"});
      if (l.ok() && l->ok()) {
        for (absl::string_view n : absl::StrSplit(l->out, ' ', absl::SkipWhitespace())) {
          privileged.emplace_back(n);
        }
      }
      return checkPodSecurity(r.out, options_.mode, privileged);
    }
    RETURN_IF_ERROR(psa);
  } else if (classify(r) == KubeFailure::kNotFound) {
    return absl::NotFoundError(absl::StrCat("namespace ", ns, " not found (--agent-namespace)"));
  }
  return checkPermissions(kubectl_, permissionsFor(options_.mode, kind, target_ns, ns));
}

absl::StatusOr<Agent> AgentKeeper::ensure(const ResolvedTarget& target) {
  std::string ns = options_.agent_ns.empty() ? target.pod.ns : options_.agent_ns;
  if (options_.mode == AgentMode::kEphemeral) ns = target.pod.ns;
  if (options_.reuse) {
    ASSIGN_OR_RETURN(auto found, findRunning(target, ns));
    if (found) {
      report_({"reused",
               absl::StrCat("reusing the running agent ", found->name, " in namespace ", found->ns),
               {{"agent", found->name}, {"namespace", found->ns}}});
      return *std::move(found);
    }
  }
  if (cancelled()) return absl::CancelledError("cancelled");
  RETURN_IF_ERROR(admit(ns, Kind::kPod, target.pod.ns));
  AgentSpec spec = baseSpec(ns);
  spec.target_ns = target.pod.ns;
  spec.target_pod = target.pod.name;
  spec.target_pod_uid = target.pod.uid;
  spec.target_container = target.container;
  spec.container_id = target.container_id;
  spec.runtime = target.runtime;
  spec.node = target.pod.node;
  if (options_.mode == AgentMode::kJob) {
    ASSIGN_OR_RETURN(auto r,
                     kubectl_.run({"get", "node", spec.node, "-o", "jsonpath={.metadata.uid}"}));
    if (!r.ok()) return kubeCallError(r, "node/" + spec.node, "get nodes", "");
    spec.node_uid = std::string(absl::StripAsciiWhitespace(r.out));
    if (spec.node_uid.empty()) {
      return absl::UnavailableError(absl::StrCat("node/", spec.node, " has no uid"));
    }
  } else if (options_.mode == AgentMode::kEphemeral) {
    // The pod's loopback is the application's too: a port it declares, or
    // an earlier agent's, is not ours to take.
    int port = kBasePort;
    auto taken = [&](int p) {
      for (int q : target.pod.container_ports) {
        if (q == p) return true;
      }
      return false;
    };
    for (const auto& e : target.pod.ephemeral) {
      if (absl::StartsWith(e, "siphon-agent-")) ++port;
    }
    while (taken(port)) ++port;
    spec.port = port;
  }
  return start(std::move(spec), target.pod.name);
}

absl::StatusOr<Agent> AgentKeeper::ensureTargetless(const std::string& ns_in) {
  std::string ns = options_.agent_ns.empty() ? ns_in : options_.agent_ns;
  if (ns.empty()) {
    ASSIGN_OR_RETURN(auto r,
                     kubectl_.run({"config", "view", "--minify", "-o", "jsonpath={..namespace}"}));
    ns = std::string(absl::StripAsciiWhitespace(r.out));
    if (ns.empty()) ns = "default";
  }
  RETURN_IF_ERROR(admit(ns, Kind::kPod, ns));
  AgentSpec spec = baseSpec(ns);
  spec.mode = AgentMode::kTargetless;
  return start(std::move(spec), "");
}

absl::StatusOr<Agent> AgentKeeper::start(AgentSpec spec, const std::string& target_pod) {
  Agent a;
  a.mode = spec.mode;
  a.ns = spec.ns;
  a.name = spec.name;
  a.secret = spec.secret;
  a.token = spec.token;
  a.port = spec.port;
  a.created = true;
  a.container = spec.mode == AgentMode::kEphemeral ? spec.name : "siphon-agent";
  a.pod = spec.mode == AgentMode::kEphemeral ? target_pod : std::string();
  report_({"creating",
           absl::StrCat("creating agent ", spec.name, " (", modeName(spec.mode), ") in namespace ",
                        spec.ns),
           {{"agent", spec.name}, {"mode", modeName(spec.mode)}, {"namespace", spec.ns}}});
  // The Secret first: the agent reads it as it starts. Its port rides along
  // as an annotation, for a later session that reuses the agent.
  json secret = json::parse(secretManifest(spec));
  secret["metadata"]["annotations"] = {{kAnnotationPort, std::to_string(spec.port)},
                                       {kAnnotationSecret, spec.secret},
                                       {kLabelMode, modeName(spec.mode)},
                                       {kAnnotationFsMode, spec.fs_mode}};
  if (!spec.target_pod.empty()) {
    secret["metadata"]["annotations"][kAnnotationTarget] =
        absl::StrCat(spec.target_ns, "/pod/", spec.target_pod, "/", spec.target_container);
  }
  ASSIGN_OR_RETURN(auto r, kubectl_.run({"create", "-f", "-", "-o", "name"}, secret.dump()));
  if (!r.ok()) return kubeCallError(r, "secret/" + spec.secret, "create secrets", spec.ns);

  std::string owner_kind, owner_api, owner_uid;
  switch (spec.mode) {
    case AgentMode::kJob: {
      ASSIGN_OR_RETURN(auto c, kubectl_.run({"create", "-f", "-", "-o", "jsonpath={.metadata.uid}"},
                                            jobManifest(spec)));
      if (!c.ok()) {
        rollback(a, true, false);
        RETURN_IF_ERROR(admissionError(c.err, spec.ns, spec.mode));
        return kubeCallError(c, "job/" + spec.name, "create jobs.batch", spec.ns);
      }
      owner_kind = "Job";
      owner_api = "batch/v1";
      owner_uid = std::string(absl::StripAsciiWhitespace(c.out));
      break;
    }
    case AgentMode::kTargetless: {
      ASSIGN_OR_RETURN(auto c, kubectl_.run({"create", "-f", "-", "-o", "jsonpath={.metadata.uid}"},
                                            targetlessPodManifest(spec)));
      if (!c.ok()) {
        rollback(a, true, false);
        RETURN_IF_ERROR(admissionError(c.err, spec.ns, spec.mode));
        return kubeCallError(c, "pod/" + spec.name, "create pods", spec.ns);
      }
      a.pod = spec.name;
      owner_kind = "Pod";
      owner_api = "v1";
      owner_uid = std::string(absl::StripAsciiWhitespace(c.out));
      break;
    }
    case AgentMode::kEphemeral: {
      ASSIGN_OR_RETURN(auto c, kubectl_.run({"patch", "pod", target_pod, "-n", spec.ns,
                                             "--subresource=ephemeralcontainers",
                                             "--type=strategic", "-p", ephemeralPatch(spec)}));
      if (!c.ok()) {
        rollback(a, true, false);
        RETURN_IF_ERROR(admissionError(c.err, spec.ns, spec.mode));
        return kubeCallError(c, "pod/" + target_pod, "patch pods/ephemeralcontainers", spec.ns);
      }
      break;
    }
  }
  if (!owner_kind.empty()) {
    auto p = kubectl_.run({"patch", "secret", spec.secret, "-n", spec.ns, "--type=merge", "-p",
                           secretOwnerPatch(owner_api, owner_kind, spec.name, owner_uid)});
    if (!p.ok() || !p->ok()) {
      rollback(a, true, true);
      return p.ok() ? kubeCallError(*p, "secret/" + spec.secret, "patch secrets", spec.ns)
                    : p.status();
    }
  }
  absl::Status ready = waitReady(a, spec.image);
  if (!ready.ok()) {
    rollback(a, true, true);
    return ready;
  }
  return a;
}

absl::Status AgentKeeper::waitReady(Agent& a, const std::string& image) {
  StartupTracker tracker(a.container, image, a.mode == AgentMode::kEphemeral);
  const auto started = time_.now();
  auto since = [&] { return std::chrono::duration_cast<milliseconds>(time_.now() - started); };
  bool checked_job = false;
  while (true) {
    if (cancelled()) return absl::CancelledError("cancelled while the agent was starting");
    std::optional<PodInfo> pod;
    std::vector<std::string> get;
    if (a.mode == AgentMode::kJob) {
      get = {
          "get",
          "pods",
          "-n",
          a.ns,
          "-l",
          std::string(kLabelSession) + "=" + a.name.substr(std::string_view("siphon-agent-").size()),
          "-o",
          "json"};
    } else {
      get = {"get", "pod", a.pod, "-n", a.ns, "-o", "json"};
    }
    ASSIGN_OR_RETURN(auto r, kubectl_.run(get));
    if (!r.ok()) {
      if (classify(r) != KubeFailure::kNotFound) {
        return kubeCallError(r, "the agent's pod", "get pods", a.ns);
      }
    } else {
      ASSIGN_OR_RETURN(auto pods, parsePodList(r.out));
      for (auto& p : pods) {
        if (!p.terminating) pod = std::move(p);
      }
    }
    if (pod && a.pod.empty()) a.pod = pod->name;
    // A failure is the status's line (said once, by the caller).
    for (const auto& e : tracker.observe(pod, since())) {
      if (e.phase != "failed") report_(e);
    }
    if (tracker.state() == StartupTracker::State::kFailed) {
      std::string line = tracker.failure();
      if (tracker.wantsLogs()) {
        std::string logs = lastLogLines(a, 5);
        if (!logs.empty()) absl::StrAppend(&line, "; its last log lines: ", logs);
      }
      return absl::FailedPreconditionError(line);
    }
    if (!pod && a.mode == AgentMode::kJob && !checked_job && since() > milliseconds(3000)) {
      // No pod after a few seconds: the Job controller may be refused the
      // pod (Pod Security, a quota); its events say so.
      checked_job = true;
      auto ev =
          kubectl_.run({"get", "events", "-n", a.ns, "--field-selector",
                        "involvedObject.kind=Job,involvedObject.name=" + a.name, "-o",
                        "jsonpath={range .items[*]}{.reason}{\"\\t\"}{.message}{\"\\n\"}{end}"});
      if (ev.ok() && ev->ok()) {
        for (absl::string_view line : absl::StrSplit(ev->out, '\n', absl::SkipEmpty())) {
          std::pair<std::string, std::string> rm = absl::StrSplit(line, absl::MaxSplits('\t', 1));
          if (rm.first != "FailedCreate") continue;
          RETURN_IF_ERROR(admissionError(rm.second, a.ns, a.mode));
          return absl::FailedPreconditionError(
              absl::StrCat("the agent's Job cannot create its pod: ", rm.second));
        }
      }
      checked_job = false;  // ask again later
    }
    if (tracker.state() == StartupTracker::State::kRunning) {
      auto logs = kubectl_.run({"logs", "-n", a.ns, a.pod, "-c", a.container, "--tail=200"});
      if (logs.ok() && logs->ok()) {
        if (absl::StrContains(logs->out, kReadyLine)) {
          for (const auto& e : tracker.logsSaidReady(since())) report_(e);
          return absl::OkStatus();
        }
      }
    }
    if (since() >= options_.start_timeout) {
      return absl::DeadlineExceededError(tracker.timedOut(since()).text);
    }
    time_.sleep(options_.poll_interval);
  }
}

std::string AgentKeeper::lastLogLines(const Agent& a, int lines) {
  if (a.pod.empty()) return "";
  auto r =
      kubectl_.run({"logs", "-n", a.ns, a.pod, "-c", a.container, absl::StrCat("--tail=", lines)});
  if (!r.ok() || !r->ok()) return "";
  std::vector<std::string> kept;
  for (absl::string_view l : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
    kept.emplace_back(absl::StripAsciiWhitespace(l));
  }
  return absl::StrJoin(kept, " | ");
}

void AgentKeeper::rollback(const Agent& a, bool secret_made, bool agent_made) {
  if (agent_made)
    (void)remove(a);
  else if (secret_made) {
    (void)kubectl_.run(
        {"delete", "secret", a.secret, "-n", a.ns, "--ignore-not-found", "--wait=false"});
  }
}

absl::Status AgentKeeper::remove(const Agent& a) {
  if (!a.created) return absl::OkStatus();
  std::vector<std::vector<std::string>> calls;
  switch (a.mode) {
    case AgentMode::kJob:
      // Background: the Job's pod goes too (SIGTERM: the agent drains).
      calls.push_back({"delete", "job", a.name, "-n", a.ns, "--cascade=background",
                       "--ignore-not-found", "--wait=false"});
      break;
    case AgentMode::kTargetless:
      calls.push_back({"delete", "pod", a.name, "-n", a.ns, "--ignore-not-found", "--wait=false"});
      break;
    case AgentMode::kEphemeral:
      break;  // cannot be removed from the pod: it exits on its idle timeout
  }
  calls.push_back({"delete", "secret", a.secret, "-n", a.ns, "--ignore-not-found", "--wait=false"});
  absl::Status first;
  for (auto& r : kubectl_.runAll(calls)) {
    if (!r.ok() && first.ok()) first = r.status();
    if (r.ok() && !r->ok() && first.ok()) {
      first = kubeCallError(*r, "agent " + a.name, "delete", a.ns);
    }
  }
  return first;
}

absl::StatusOr<std::vector<AgentRow>> AgentKeeper::list(const std::string& ns,
                                                        bool all_namespaces) {
  // Every pod in scope: agents of their own (labelled) and the target pods
  // that hold ephemeral agents. Secrets are never listed (that would read
  // every Secret): each agent names its own.
  std::vector<std::string> get = {"get", "pods", "-o", "json"};
  if (all_namespaces) {
    get.push_back("-A");
  } else if (!ns.empty()) {
    get.insert(get.end(), {"-n", ns});
  }
  ASSIGN_OR_RETURN(auto r, kubectl_.run(get));
  if (!r.ok()) return kubeCallError(r, "the agents", "list pods", ns);
  ASSIGN_OR_RETURN(auto pods, parsePodList(r.out));
  std::vector<AgentRow> rows;
  for (const auto& p : pods) {
    auto name = p.labels.find(kLabelName);
    auto managed = p.labels.find(kLabelManagedBy);
    if (name != p.labels.end() && name->second == kLabelNameValue && managed != p.labels.end() &&
        managed->second == "siphon") {
      AgentRow row;
      row.ns = p.ns;
      row.pod = p.name;
      row.name = p.labels.count("job-name") ? p.labels.at("job-name") : p.name;
      row.node = p.node;
      row.phase = p.terminating ? "Terminating" : p.phase;
      row.created = p.creation;
      row.mode = p.labels.count(kLabelMode) ? p.labels.at(kLabelMode) : "job";
      if (auto v = p.labels.find(kLabelVersion); v != p.labels.end()) row.version = v->second;
      if (auto t = p.annotations.find(kAnnotationTarget); t != p.annotations.end()) {
        row.target = t->second;
      }
      if (auto s = p.annotations.find(kAnnotationSecret); s != p.annotations.end()) {
        row.secret = s->second;
      }
      if (auto port = p.annotations.find(kAnnotationPort); port != p.annotations.end()) {
        (void)absl::SimpleAtoi(port->second, &row.port);
      }
      rows.push_back(std::move(row));
      continue;
    }
    for (const auto& st : p.ephemeral_statuses) {
      if (!absl::StartsWith(st.name, "siphon-agent-")) continue;
      AgentRow row;
      row.ns = p.ns;
      row.pod = p.name;
      row.name = st.name;
      row.node = p.node;
      row.mode = "ephemeral";
      row.phase = st.running ? "Running" : st.terminated ? "Exited" : "Waiting";
      row.target = absl::StrCat(p.ns, "/pod/", p.name);
      row.secret = "siphon-token-" + st.name.substr(std::string_view("siphon-agent-").size());
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

absl::StatusOr<std::string> AgentKeeper::tokenOf(const AgentRow& row, int* port) {
  return readToken(row.ns, row.secret, port);
}

absl::Status AgentKeeper::removeRow(const AgentRow& row) {
  Agent a;
  a.mode = row.mode == "ephemeral"    ? AgentMode::kEphemeral
           : row.mode == "targetless" ? AgentMode::kTargetless
                                      : AgentMode::kJob;
  a.ns = row.ns;
  a.name = row.name;
  a.secret = row.secret;
  a.created = true;
  return remove(a);
}

}  // namespace siphon::kube
