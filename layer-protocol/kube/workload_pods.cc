#include "kube/workload_pods.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace siphon::kube {
namespace {

bool older(const PodInfo& a, const PodInfo& b) {
  return std::tie(a.creation, a.name) < std::tie(b.creation, b.name);
}

}  // namespace

WorkloadPods::WorkloadPods(std::string container, bool single)
    : container_(std::move(container)), single_(single) {}

std::string WorkloadPods::whyNotUsable(const PodInfo& pod) const {
  if (pod.terminating) return "terminating";
  auto container = chooseContainer(pod, container_);
  if (!container.ok()) return std::string(container.status().message());
  if (!pod.ready()) {
    std::string why = podNotReadyReason(pod);
    // Nothing but the phase: the Ready condition is all there is to say (a
    // node gone NotReady: the node controller turns its pods' Ready False
    // while their containers' last reported state still says ready).
    const Condition* ready = pod.condition("Ready");
    if (why.find(',') == std::string::npos && ready != nullptr) {
      absl::StrAppend(&why, ", Ready ", ready->status, ready->reason.empty() ? "" : ": ",
                      ready->reason, ready->message.empty() ? "" : " (" + ready->message + ")",
                      pod.node.empty() ? "" : " on node " + pod.node);
    }
    return why;
  }
  const ContainerState* state = pod.status(*container);
  if (state == nullptr || !state->running)
    return absl::StrCat("container ", *container, " is not running");
  return "";
}

void WorkloadPods::retire(Pod& pod, std::string reason, std::vector<Action>& actions) {
  pod.covered = false;
  if (podKey(pod.info) == primary_) primary_.clear();
  actions.push_back({Action::kRetire, pod.info, std::move(reason)});
}

std::vector<WorkloadPods::Action> WorkloadPods::onEvent(const PodEvent& event) {
  std::vector<Action> actions;
  const std::string key = podKey(event.pod);
  if (event.type == PodEvent::Type::kDeleted) {
    auto it = pods_.find(key);
    if (it == pods_.end()) return actions;
    if (it->second.covered) {
      retire(it->second, absl::StrCat("pod ", event.pod.name, " was deleted"), actions);
    }
    pods_.erase(it);
  } else {
    Pod& pod = pods_[key];
    pod.info = event.pod;
    if (pod.covered) {
      if (event.pod.terminating) {
        retire(pod,
               absl::StrCat("pod ", event.pod.name, " is terminating (deleted at ",
                            event.pod.deleted_at, ")"),
               actions);
      } else if (std::string why = whyNotUsable(event.pod); !why.empty()) {
        retire(pod, absl::StrCat("pod ", event.pod.name, " is not Ready (", why, ")"), actions);
      }
    }
  }
  std::vector<Pod*> usable;
  bool any_covered = false;
  for (auto& [k, pod] : pods_) {
    any_covered = any_covered || pod.covered;
    if (!pod.covered && whyNotUsable(pod.info).empty()) usable.push_back(&pod);
  }
  std::sort(usable.begin(), usable.end(),
            [](const Pod* a, const Pod* b) { return older(a->info, b->info); });
  for (Pod* pod : usable) {
    if (single_ && any_covered) break;
    pod->covered = any_covered = true;
    actions.push_back({Action::kCover, pod->info, ""});
  }
  if (primary_.empty()) {
    const Pod* first = nullptr;
    for (const auto& [k, pod] : pods_) {
      if (pod.covered && (first == nullptr || older(pod.info, first->info))) first = &pod;
    }
    if (first != nullptr) {
      primary_ = podKey(first->info);
      actions.push_back({Action::kPrimary, first->info, ""});
    }
  }
  return actions;
}

std::vector<PodInfo> WorkloadPods::covered() const {
  std::vector<PodInfo> out;
  for (const auto& [k, pod] : pods_) {
    if (pod.covered) out.push_back(pod.info);
  }
  std::sort(out.begin(), out.end(), older);
  return out;
}

std::optional<PodInfo> WorkloadPods::primary() const {
  if (primary_.empty()) return std::nullopt;
  return pods_.at(primary_).info;
}

int WorkloadPods::readyCount() const {
  return static_cast<int>(std::count_if(pods_.begin(), pods_.end(), [this](const auto& p) {
    return whyNotUsable(p.second.info).empty();
  }));
}

std::string WorkloadPods::waitingReason() const {
  if (readyCount() > 0) return "";
  if (pods_.empty()) return "no pods (scaled to zero?)";
  std::vector<const PodInfo*> pods;
  for (const auto& [k, pod] : pods_) pods.push_back(&pod.info);
  // The newest first: the pods a rollout or a scale-up is waiting for.
  std::sort(pods.begin(), pods.end(),
            [](const PodInfo* a, const PodInfo* b) { return older(*b, *a); });
  std::vector<std::string> each;
  for (const PodInfo* p : pods) each.push_back(absl::StrCat(p->name, ": ", whyNotUsable(*p)));
  return absl::StrJoin(each, "; ");
}

}  // namespace siphon::kube
