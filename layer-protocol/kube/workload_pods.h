// Which pods of a workload a session covers, from its pod watch's events
// (pod_watch.h), without I/O: the session feeds every PodEvent to onEvent()
// and carries out the actions it returns, in their order.
//
// A pod is usable when it is Ready (phase Running, condition Ready True),
// not terminating, and the session's container in it (chooseContainer) is
// running. Every usable pod is covered once; a covered pod that stops being
// usable (terminating, deleted, not Ready: a crash loop, its node gone
// NotReady) is retired once, with a line saying why. A pod is known by its
// UID: a StatefulSet's pod recreated under the same name is a new pod.
//
// The primary is the pod for what one pod answers (files, DNS, environment,
// outgoing traffic): the oldest covered pod, then by name, as choosePod
// picks. It changes only when it is retired, never because an older pod
// became Ready. In single mode (--replicas one) only the primary is covered.
//
// Events are taken as states, not as changes: an ADDED for a known pod
// (a restarted watch lists everything again) is a MODIFIED, a DELETED for an
// unknown one is nothing. So a relisting never covers a pod twice.
//
// Threads: one thread at a time (the session's executor).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kube/target.h"

namespace siphon::kube {

class WorkloadPods {
 public:
  struct Action {
    enum Kind {
      kCover,    // start working with `pod`
      kRetire,   // stop working with `pod`: `reason` says why
      kPrimary,  // `pod` is the primary from now on
    };
    Kind kind;
    PodInfo pod;
    std::string reason;
  };

  // `container`: the one the user named ("" to let chooseContainer pick in
  // each pod); `single`: cover one pod at a time.
  WorkloadPods(std::string container, bool single);

  // Retires come first, then covers, then a new primary (when the old one
  // was retired, or there was none). No kPrimary when the last covered pod
  // is retired: primary() is empty until one is covered.
  std::vector<Action> onEvent(const PodEvent& event);

  std::vector<PodInfo> covered() const;  // oldest first
  std::optional<PodInfo> primary() const;
  int readyCount() const;  // the usable pods, covered or not
  // While no pod is usable, what is waited for, in one line ("web-x2: phase
  // Pending, Unschedulable: ..."; "no pods (scaled to zero?)"); else "".
  std::string waitingReason() const;

 private:
  struct Pod {
    PodInfo info;
    bool covered = false;
  };
  // "" when `pod` is usable; else why not, in a few words.
  std::string whyNotUsable(const PodInfo& pod) const;
  void retire(Pod& pod, std::string reason, std::vector<Action>& actions);

  std::string container_;
  bool single_;
  std::map<std::string, Pod> pods_;  // by UID (the name when there is none)
  std::string primary_;              // its key; "" for none
};

}  // namespace siphon::kube
