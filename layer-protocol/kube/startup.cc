#include "kube/startup.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace siphon::kube {

namespace {

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// Waiting reasons that will not pass by themselves.
bool fatalWaiting(const std::string& reason) {
  return reason == "ErrImagePull" || reason == "ImagePullBackOff" || reason == "InvalidImageName" ||
         reason == "ErrImageNeverPull" || reason == "CreateContainerConfigError" ||
         reason == "CreateContainerError" || reason == "RunContainerError" ||
         reason == "CrashLoopBackOff" || reason == "PreCreateHookError" ||
         reason == "PreStartHookError";
}

bool imageProblem(const std::string& reason) {
  return reason == "ErrImagePull" || reason == "ImagePullBackOff" || reason == "InvalidImageName" ||
         reason == "ErrImageNeverPull";
}

}  // namespace

PhaseEvent StartupTracker::fail(std::string text) {
  state_ = State::kFailed;
  failure_ = text;
  return {"failed", std::move(text), {}};
}

std::vector<PhaseEvent> StartupTracker::observe(const std::optional<PodInfo>& pod,
                                                std::chrono::milliseconds since_start) {
  std::vector<PhaseEvent> out;
  if (done() || !pod) return out;
  // Unschedulable (targetless: the scheduler's verdict; a nodeName-pinned
  // pod is refused by the kubelet instead, below).
  if (const Condition* c = pod->condition("PodScheduled");
      c != nullptr && c->status == "False" && c->reason == "Unschedulable") {
    out.push_back(fail(absl::StrCat("the agent pod ", pod->name, " cannot be scheduled: ",
                                    c->message.empty() ? c->reason : c->message)));
    return out;
  }
  if (!scheduled_ && !pod->node.empty()) {
    scheduled_ = true;
    out.push_back({"scheduled", absl::StrCat("scheduled on ", pod->node), {{"node", pod->node}}});
  }
  const ContainerState* st =
      ephemeral_ ? pod->ephemeralStatus(container_) : pod->status(container_);
  if (pod->phase == "Failed" && (st == nullptr || !st->terminated)) {
    // The kubelet refused the pod (OutOfcpu, NodeAffinity...): there is no
    // container to look at.
    const Condition* ready = pod->condition("Ready");
    out.push_back(fail(absl::StrCat("the agent pod ", pod->name, " failed on ", pod->node, ": ",
                                    podNotReadyReason(*pod),
                                    ready && !ready->message.empty() ? " " + ready->message : "")));
    return out;
  }
  if (st == nullptr) return out;
  if (!st->waiting_reason.empty()) {
    const std::string& r = st->waiting_reason;
    if (fatalWaiting(r)) {
      std::string text;
      if (imageProblem(r)) {
        text = absl::StrCat("the agent image ", image_, " cannot be pulled on ", pod->node, " (", r,
                            st->waiting_message.empty() ? "" : ": " + st->waiting_message,
                            "): check --agent-image and that the node can reach its registry");
      } else {
        text = absl::StrCat("the agent container cannot start (", r,
                            st->waiting_message.empty() ? "" : ": " + st->waiting_message, ")");
        wants_logs_ = r == "CrashLoopBackOff" || r == "RunContainerError";
      }
      out.push_back(fail(std::move(text)));
      return out;
    }
    if (!pulling_ && (r == "ContainerCreating" || r == "PodInitializing")) {
      pulling_ = true;
      out.push_back({"pulling",
                     absl::StrCat("pulling ", image_, " (unless the node has it)"),
                     {{"image", image_}}});
    }
    return out;
  }
  if (st->terminated) {
    wants_logs_ = true;
    out.push_back(fail(absl::StrCat("the agent exited (",
                                    st->terminated_reason.empty() ? "exit" : st->terminated_reason,
                                    ", exit code ", st->exit_code, ")")));
    return out;
  }
  if (st->running && !started_) {
    started_ = true;
    state_ = State::kRunning;
    out.push_back({"started",
                   absl::StrCat("agent started after ", seconds(since_start), " s"),
                   {{"seconds", seconds(since_start)}}});
  }
  return out;
}

std::vector<PhaseEvent> StartupTracker::logsSaidReady(std::chrono::milliseconds since_start) {
  if (done()) return {};
  state_ = State::kReady;
  return {{"ready",
           absl::StrCat("agent ready after ", seconds(since_start), " s"),
           {{"seconds", seconds(since_start)}}}};
}

PhaseEvent StartupTracker::timedOut(std::chrono::milliseconds since_start) {
  std::string what = !scheduled_ ? "waiting for the agent pod to be scheduled"
                     : !started_ ? "waiting for the agent container to start"
                                 : "waiting for the agent's ready line";
  return fail(
      absl::StrCat("the agent did not get ready within ", seconds(since_start), " s (", what, ")"));
}

}  // namespace siphon::kube
