#include "cli/kube_workload.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/kube_session.h"
#include "siphon/status.h"
#include "siphon/text.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {

namespace asio = net::asio;

std::string endpointName(const kube::Agent& a) { return absl::StrCat("kube:", a.ns, "/", a.pod); }

namespace {

// "300 s", "1.5 s".
std::string seconds(std::chrono::milliseconds d) {
  return absl::StrCat(absl::StrFormat("%.1f", static_cast<double>(d.count()) / 1000.0), " s");
}

}  // namespace

// ------------------------------------------------------------- Forwards

void Forwards::add(asio::any_io_executor ex, const kube::Agent& agent) {
  const std::string name = endpointName(agent);
  tokens_[name] = agent.token;
  if (forwards_.contains(name)) return;
  kube::PortForward::Options o;
  o.ns = agent.ns;
  o.pod = agent.pod;
  o.remote_port = agent.port;
  auto* kubectl = kubectl_;
  forwards_[name] = kube::PortForward::create(
      std::move(ex),
      [kubectl](const std::vector<std::string>& args) { return kubectl->argv(args); }, o);
}

std::string Forwards::token(const std::string& endpoint) const {
  auto it = tokens_.find(endpoint);
  return it == tokens_.end() ? std::string() : it->second;
}

void Forwards::stop(const std::string& endpoint) {
  auto it = forwards_.find(endpoint);
  if (it == forwards_.end()) return;
  it->second->stop();
  forwards_.erase(it);
}

void Forwards::stopAll() {
  for (auto& [name, f] : forwards_) f->stop();
  forwards_.clear();
}

net::awaitable<absl::StatusOr<std::string>> Forwards::address(const std::string& endpoint,
                                                              bool after_cut) {
  auto it = forwards_.find(endpoint);
  if (it == forwards_.end()) {
    co_return absl::UnavailableError(
        absl::StrCat("no port-forward to ", endpoint, ": its pod is gone from the session"));
  }
  auto forward = it->second;  // held across the wait
  co_return co_await forward->address(after_cut);
}

// ----------------------------------------------------- WorkloadFollower

std::shared_ptr<WorkloadFollower> WorkloadFollower::create(asio::any_io_executor ex,
                                                           Options options,
                                                           std::shared_ptr<Forwards> forwards,
                                                           kube::Agent first,
                                                           kube::PodInfo first_pod) {
  std::shared_ptr<WorkloadFollower> f(
      new WorkloadFollower(std::move(ex), std::move(options), std::move(forwards)));
  Covered c;
  c.pod = first_pod;
  c.agent = std::move(first);
  c.linked = true;
  f->primary_uid_ = first_pod.uid;
  f->covered_[first_pod.uid] = std::move(c);
  return f;
}

WorkloadFollower::WorkloadFollower(asio::any_io_executor ex, Options options,
                                   std::shared_ptr<Forwards> forwards)
    : ex_(std::move(ex)),
      options_(std::move(options)),
      forwards_(std::move(forwards)),
      pods_(options_.container, options_.single) {
  kubectl_ = std::make_unique<kube::SystemKubectl>(options_.kubectl);
  // A pod's agent starting is told in one line once it serves (or fails):
  // not phase by phase as the first one's, while the program runs.
  keeper_ = std::make_unique<kube::AgentKeeper>(
      *kubectl_, options_.keeper, [](const kube::PhaseEvent&) {},
      [this] { return cancel_.load() || kubeInterrupted(); });
  worker_ = std::thread([this] { workerLoop(); });
}

WorkloadFollower::~WorkloadFollower() {
  {
    std::lock_guard<std::mutex> l(mu_);
    worker_stop_ = true;
  }
  cancel_ = true;
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void WorkloadFollower::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void WorkloadFollower::workerLoop() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return worker_stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void WorkloadFollower::say(const std::string& phase, const std::string& text,
                           std::vector<std::pair<std::string, std::string>> fields) {
  kube::PhaseEvent e;
  e.phase = phase;
  e.text = text;
  e.fields = std::move(fields);
  printPhase(e, options_.json);
}

void WorkloadFollower::start(std::shared_ptr<client::Client> client) {
  client_ = std::move(client);
  std::weak_ptr<WorkloadFollower> weak = shared_from_this();
  client_->setReplicaHandler([weak](const client::ReplicaEvent& e) {
    if (auto self = weak.lock()) self->onReplica(e);
  });
  kube::PodWatch::Options o;
  o.ns = options_.ns;
  o.selector = options_.label_selector;
  o.pod = options_.pod;
  auto* kubectl = kubectl_.get();
  watch_ = kube::PodWatch::create(
      ex_, [kubectl](const std::vector<std::string>& args) { return kubectl->argv(args); }, o,
      [weak](const kube::PodEvent& e) {
        if (auto self = weak.lock()) self->onPodEvent(e);
      },
      [weak](const std::string& line) {
        if (auto self = weak.lock()) self->say("watch", line);
      });
}

void WorkloadFollower::onPodEvent(const kube::PodEvent& event) {
  if (stopping_) return;
  const std::string uid = event.pod.uid;
  const bool deleted = event.type == kube::PodEvent::Type::kDeleted;
  for (const auto& a : pods_.onEvent(event)) {
    switch (a.kind) {
      case kube::WorkloadPods::Action::kCover:
        cover(a.pod);
        break;
      case kube::WorkloadPods::Action::kRetire:
        retire(a.pod, a.reason);
        break;
      case kube::WorkloadPods::Action::kPrimary:
        makePrimary(a.pod);
        break;
    }
  }
  // A terminating pod's agent serves its steal until the pod is gone.
  if (deleted) {
    auto it = covered_.find(uid);
    if (it != covered_.end() && !it->second.removed) {
      release(uid, absl::StrCat("pod ", event.pod.name, " was deleted"));
    }
  }
  if (waiting_since_) {
    const std::string why = pods_.waitingReason();
    if (!why.empty() && why != last_wait_reason_) {
      last_wait_reason_ = why;
      say("waiting", absl::StrCat("still waiting for a Ready pod of ", options_.target_text, ": ",
                                  why));
    }
  }
}

void WorkloadFollower::cover(const kube::PodInfo& pod) {
  auto it = covered_.find(pod.uid);
  if (it != covered_.end() && !it->second.retired) return;  // the first one
  if (it != covered_.end() && it->second.agent && !it->second.removed) {
    // Back (its node came back, its container runs again): its agent too.
    it->second.retired = false;
    if (it->second.linked) return;
  }
  Covered& c = covered_[pod.uid];
  c.pod = pod;
  c.retired = false;
  std::weak_ptr<WorkloadFollower> weak = shared_from_this();
  const bool need_runtime = options_.keeper.mode == kube::AgentMode::kJob;
  const std::string container = options_.container;
  auto ex = ex_;
  auto* keeper = keeper_.get();
  post([weak, ex, keeper, pod, container, need_runtime] {
    absl::StatusOr<kube::Agent> agent = [&]() -> absl::StatusOr<kube::Agent> {
      ASSIGN_OR_RETURN(auto target, kube::targetInPod(pod, container, need_runtime));
      return keeper->ensure(target);
    }();
    // Kept here too: when the loop has ended, the result posted below is
    // never taken, and finish() must still remove what was made.
    if (auto self = weak.lock(); self && agent.ok()) {
      std::lock_guard<std::mutex> l(self->mu_);
      self->made_.push_back(*agent);
    }
    asio::post(ex, [weak, uid = pod.uid, agent = std::move(agent)]() mutable {
      if (auto self = weak.lock()) self->onAgent(uid, std::move(agent));
    });
  });
}

void WorkloadFollower::onAgent(std::string uid, absl::StatusOr<kube::Agent> agent) {
  auto it = covered_.find(uid);
  if (it == covered_.end()) return;
  Covered& c = it->second;
  if (!agent.ok()) {
    say("cover_failed", absl::StrCat("pod ", c.pod.name, " is not covered: ", agent.status().message()),
        {{"pod", c.pod.name}});
    return;
  }
  c.agent = *std::move(agent);
  c.removed = false;
  if (stopping_ || c.retired) {
    release(uid, stopping_ ? "the session ends" : "its pod went while its agent started");
    return;
  }
  forwards_->add(ex_, *c.agent);
  net::spawn(ex_, link(shared_from_this(), uid), "workload_link");
}

net::awaitable<void> WorkloadFollower::link(std::shared_ptr<WorkloadFollower> self_in,
                                            std::string uid) {
  const auto self = std::move(self_in);
  auto it = covered_.find(uid);
  if (it == covered_.end() || !it->second.agent) co_return;
  const std::string endpoint = endpointName(*it->second.agent);
  absl::Status s = co_await client_->addReplica(endpoint);
  it = covered_.find(uid);
  if (it == covered_.end()) co_return;
  Covered& c = it->second;
  if (!s.ok()) {
    if (!stopping_) {
      say("cover_failed", absl::StrCat("pod ", c.pod.name, " is not covered: ", s.message()),
          {{"pod", c.pod.name}});
    }
    release(uid, "its session could not be opened");
    co_return;
  }
  c.linked = true;
  size_t linked = 0;
  for (const auto& [id, other] : covered_) linked += other.linked && !other.retired ? 1 : 0;
  say("covered",
      absl::StrCat("pod ", c.pod.name, " on ", c.pod.node, " is Ready: covered by agent ",
                   c.agent->name, c.agent->created ? "" : " (reused)", " (", linked,
                   linked == 1 ? " pod" : " pods", " covered)"),
      {{"pod", c.pod.name}, {"agent", c.agent->name}});
  if (wanted_primary_ == uid) {
    wanted_primary_.clear();
    makePrimary(c.pod);
  }
}

void WorkloadFollower::retire(const kube::PodInfo& pod, const std::string& reason) {
  auto it = covered_.find(pod.uid);
  if (it == covered_.end()) return;
  Covered& c = it->second;
  c.retired = true;
  c.pod = pod;
  if (wanted_primary_ == pod.uid) wanted_primary_.clear();
  if (pod.terminating && c.linked) {
    // Its last seconds: it may still get requests (endpoints go after the
    // kubelet's SIGTERM); its agent steals on until it ends.
    say("retiring", absl::StrCat(reason, ": its agent serves on until it ends"),
        {{"pod", pod.name}});
    return;
  }
  say("retiring", reason, {{"pod", pod.name}});
  release(pod.uid, reason);
}

void WorkloadFollower::makePrimary(const kube::PodInfo& pod) {
  auto it = covered_.find(pod.uid);
  if (it == covered_.end() || !it->second.linked || !it->second.agent) {
    wanted_primary_ = pod.uid;
    return;
  }
  const std::string endpoint = endpointName(*it->second.agent);
  if (client_->endpoint() == endpoint) {
    primary_uid_ = pod.uid;
    return;
  }
  auto old = covered_.find(primary_uid_);
  const std::string why = old == covered_.end()
                              ? std::string("the pod before it went")
                              : absl::StrCat("pod ", old->second.pod.name, " is no longer usable");
  if (client_->promote(endpoint, why).ok()) primary_uid_ = pod.uid;
}

std::string WorkloadFollower::uidOf(const std::string& endpoint) const {
  for (const auto& [uid, c] : covered_) {
    if (c.agent && endpointName(*c.agent) == endpoint) return uid;
  }
  return "";
}

void WorkloadFollower::release(const std::string& uid, const std::string& why) {
  auto it = covered_.find(uid);
  if (it == covered_.end() || it->second.removed) return;
  Covered& c = it->second;
  if (!c.agent) {
    c.removed = true;
    return;
  }
  const std::string endpoint = endpointName(*c.agent);
  if (c.linked && client_) client_->dropSession(endpoint, why);
  c.linked = false;
  forwards_->stop(endpoint);
  if (stopping_) return;  // finish() removes it
  c.removed = true;
  if (!c.agent->created) return;  // someone else's: left as it is
  auto* keeper = keeper_.get();
  const kube::Agent agent = *c.agent;
  auto ex = ex_;
  const bool json = options_.json;
  post([keeper, agent, ex, json] {
    absl::Status s = keeper->remove(agent);
    asio::post(ex, [agent, s, json] {
      kube::PhaseEvent e;
      e.phase = s.ok() ? "removed" : "remove_failed";
      e.text = s.ok() ? absl::StrCat("removed agent ", agent.name, " of a pod that went")
                      : absl::StrCat("could not remove agent ", agent.name, ": ", s.message(),
                                     " (it exits on its idle timeout)");
      e.fields = {{"agent", agent.name}};
      printPhase(e, json);
    });
  });
}

void WorkloadFollower::onReplica(const client::ReplicaEvent& e) {
  using Kind = client::ReplicaEvent::Kind;
  const std::string uid = uidOf(e.kind == Kind::kWaiting ? e.from : e.endpoint);
  auto it = covered_.find(uid);
  const std::string pod = it == covered_.end() ? e.endpoint : "pod " + it->second.pod.name;
  switch (e.kind) {
    case Kind::kAdded:
      break;
    case Kind::kFailed:
      say("cover_failed",
          absl::StrCat(pod, ": a subscription could not be made there: ", e.status.message()));
      break;
    case Kind::kDraining:
      say("draining", absl::StrCat("the agent of ", pod, " drains (", e.reason, "): ", e.streams,
                                   " open connection", e.streams == 1 ? "" : "s",
                                   " finish there"));
      break;
    case Kind::kLost:
      say("agent_lost", absl::StrCat("the agent of ", pod, " is gone (", e.status.message(),
                                     "); ", e.streams, " connection",
                                     e.streams == 1 ? "" : "s", " reset"));
      if (it != covered_.end()) {
        it->second.linked = false;
        if (!it->second.retired && !stopping_) {
          // Its pod is still there: its agent crashed or was removed by
          // someone else. What is left of it goes (its Job, when this
          // session made it), and the pod is covered again.
          const kube::PodInfo again = it->second.pod;
          it->second.retired = true;
          release(uid, "its agent is gone");
          cover(again);
        }
      }
      break;
    case Kind::kPromoted:
      if (it != covered_.end()) primary_uid_ = uid;
      if (waiting_since_) stopWaiting(pod);
      say("moved", absl::StrCat("files, names, env and new outgoing connections now go to ", pod,
                                " (agent ", e.endpoint, "; ", e.reason, ")"),
          {{"endpoint", e.endpoint}, {"from", e.from}});
      break;
    case Kind::kWaiting:
      startWaiting(e.reason);
      break;
  }
}

void WorkloadFollower::startWaiting(const std::string& reason) {
  if (waiting_since_ || stopping_) return;
  waiting_since_ = std::chrono::steady_clock::now();
  last_wait_reason_ = pods_.waitingReason();
  say("waiting", absl::StrCat("no agent to work with (", reason, "): waiting up to ",
                              seconds(options_.no_pod_timeout), " for a Ready pod of ",
                              options_.target_text,
                              last_wait_reason_.empty() ? "" : ": " + last_wait_reason_));
  wait_timer_ = std::make_shared<asio::steady_timer>(ex_);
  wait_timer_->expires_after(options_.no_pod_timeout);
  std::weak_ptr<WorkloadFollower> weak = shared_from_this();
  wait_timer_->async_wait([weak](net::error_code ec) {
    auto self = weak.lock();
    if (ec || !self || !self->waiting_since_ || self->stopping_) return;
    const std::string why = self->pods_.waitingReason();
    const std::string line = absl::StrCat(
        "no pod of ", self->options_.target_text, " became Ready within ",
        seconds(self->options_.no_pod_timeout),
        why.empty() ? "" : " (" + why + ")");
    self->client_->abandon(absl::UnavailableError(line));
  });
}

void WorkloadFollower::stopWaiting(const std::string& to) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - *waiting_since_);
  waiting_since_.reset();
  if (wait_timer_) wait_timer_->cancel();
  say("resumed", absl::StrCat("resumed on ", to, " after ", seconds(waited),
                              " without a pod"));
}

net::awaitable<void> WorkloadFollower::beforeClose() {
  stopping_ = true;
  cancel_ = true;
  if (watch_) watch_->stop();
  if (wait_timer_) wait_timer_->cancel();
  for (auto& [uid, c] : covered_) {
    if (!c.agent || !c.agent->created || !c.linked || !client_->lostStatus().ok()) continue;
    v1::Request info;
    info.mutable_info();
    auto r = co_await client_->callAt(endpointName(*c.agent), info, std::chrono::seconds(5));
    // Unknown (no answer): keep the agent; it exits on its idle timeout.
    c.others = !r.ok() || !r->has_info() || r->info().sessions() > 1;
  }
}

void WorkloadFollower::finish() {
  stopping_ = true;
  cancel_ = true;
  {
    std::lock_guard<std::mutex> l(mu_);
    worker_stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::set<std::string> handled;
  for (auto& [uid, c] : covered_) {
    if (!c.agent || !c.agent->created) continue;
    const bool done = c.removed;
    handled.insert(c.agent->name);
    if (done) continue;
    c.removed = true;
    if (c.others) {
      say("kept", absl::StrCat("agent ", c.agent->name,
                               " left running: another session uses it (it exits on its idle "
                               "timeout)"),
          {{"agent", c.agent->name}});
      continue;
    }
    absl::Status s = keeper_->remove(*c.agent);
    say(s.ok() ? "removed" : "remove_failed",
        s.ok() ? (c.agent->mode == kube::AgentMode::kEphemeral
                      ? absl::StrCat("removed the token of agent ", c.agent->name,
                                     " (an ephemeral container stays in its pod; it exits on "
                                     "its idle timeout)")
                      : absl::StrCat("removed agent ", c.agent->name, " and its token"))
               : absl::StrCat("could not remove agent ", c.agent->name, ": ", s.message(),
                              " (it exits on its idle timeout; its Job's TTL removes the rest)"),
        {{"agent", c.agent->name}});
  }
  // Agents started as the session ended, whose pod the loop never heard of
  // again.
  std::vector<kube::Agent> made;
  {
    std::lock_guard<std::mutex> l(mu_);
    made = made_;
  }
  for (const auto& a : made) {
    if (!a.created || !handled.insert(a.name).second) continue;
    absl::Status s = keeper_->remove(a);
    say(s.ok() ? "removed" : "remove_failed",
        s.ok() ? absl::StrCat("removed agent ", a.name, " and its token")
               : absl::StrCat("could not remove agent ", a.name, ": ", s.message()),
        {{"agent", a.name}});
  }
}

}  // namespace siphon::cli
