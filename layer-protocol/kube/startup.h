// Watching an agent start, as decisions without I/O: fed the agent pod as
// kubectl shows it (one snapshot after another, with the time since the
// agent was created), it says which phase lines to print and when the
// start failed, so that every failure is one line within seconds of the
// API showing it, never only at a timeout.
//
// Call order: observe() per snapshot until done(); logsSaidReady() once
// the agent's ready line is in its log (the pod being Running is not
// enough: the agent may still be opening its target).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "kube/target.h"

namespace siphon::kube {

// One phase line (text) and the same as a JSON event ({"event":"agent",
// "phase":...}).
struct PhaseEvent {
  std::string phase;  // "scheduled", "pulling", "started", "ready", "failed"
  std::string text;
  std::vector<std::pair<std::string, std::string>> fields;
};

class StartupTracker {
 public:
  enum class State { kWaiting, kRunning, kReady, kFailed };

  // `container`: the agent's container in the pod (ephemeral: its
  // ephemeral container's name); `image`: what it runs.
  StartupTracker(std::string container, std::string image, bool ephemeral)
      : container_(std::move(container)), image_(std::move(image)), ephemeral_(ephemeral) {}

  // What this snapshot changed. `pod` nullopt: the pod does not exist (yet).
  std::vector<PhaseEvent> observe(const std::optional<PodInfo>& pod,
                                  std::chrono::milliseconds since_start);
  // The agent wrote its ready line.
  std::vector<PhaseEvent> logsSaidReady(std::chrono::milliseconds since_start);
  // Time is up without a verdict: the failure line (what it was waiting for).
  PhaseEvent timedOut(std::chrono::milliseconds since_start);

  State state() const { return state_; }
  bool done() const { return state_ == State::kReady || state_ == State::kFailed; }
  // The failure's line (state kFailed).
  const std::string& failure() const { return failure_; }
  // The agent ran and ended: its last log lines explain it (the caller
  // fetches them and appends them to the failure).
  bool wantsLogs() const { return wants_logs_; }

 private:
  PhaseEvent fail(std::string text);

  std::string container_;
  std::string image_;
  bool ephemeral_;
  State state_ = State::kWaiting;
  bool scheduled_ = false;
  bool pulling_ = false;
  bool started_ = false;
  bool wants_logs_ = false;
  std::string last_wait_;
  std::string failure_;
};

}  // namespace siphon::kube
