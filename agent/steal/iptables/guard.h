// The guard: a process that removes the iptables backend's chains when the
// agent goes away, however it goes (SIGKILL and OOM kills included, which no
// handler in the agent could catch).
//
// The agent re-executes its own binary with kIptablesGuardCommand first;
// main() hands that to iptablesGuardMain(). The guard enters the target's
// netns, leaves the agent's session (a kill of the agent's process group
// must not take it along), ignores the terminal signals, says it is ready
// on a socketpair, and blocks reading it. End of file there means the agent
// is gone or has stopped steering: it removes our chains in both flavours
// (only what the save output shows) and exits. So does a guard that cannot
// say it is ready because the agent is already gone (a replacement guard
// started just before the agent was killed).
//
// The agent side (makeProcessGuard) watches its end of the socketpair on a
// thread: a guard that dies while steering is live is logged and replaced
// at once; if no replacement starts, the chains are removed (on_lost) since
// nothing would remove them otherwise.
//
// The guard inherits the agent's owner lock (owner_lock.h) and holds it
// until the chains are gone, so another agent's start-up sweep never
// takes the chains of an agent whose guard is still at work.
//
// What it cannot cover: the agent and the guard killed together (a pid
// namespace or cgroup torn down). With both gone the lock is free, and the
// next agent's start-up removes those leftovers (removeStaleIptablesChains).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "agent/steal/iptables/iptables_rules.h"

namespace siphon::agent::steal {

inline constexpr std::string_view kIptablesGuardCommand = "__iptables-guard";

// main() of the guard: argv[1] is kIptablesGuardCommand, then
// --netns-fd=N --sock-fd=N --flavor=nft|legacy --pre=CHAIN --out=CHAIN
// --v6=0|1 [--lock-fd=N] (the owner lock, held until the chains are gone,
// then closed). Exit 0 once the chains are gone, 1 if a removal failed, 2 for
// bad arguments or a netns it cannot enter.
int iptablesGuardMain(int argc, char** argv);

// Keeps our chains from outliving the agent. The steering starts it before
// it installs anything and stops it after removing everything.
//
// Threads: start() and stop() from the steering's caller, once each;
// on_lost runs on the guard's own thread.
class ChainGuard {
 public:
  virtual ~ChainGuard() = default;
  // Starts guarding. `on_lost` is called when guarding ends by itself (the
  // guard died and no new one could be started): the steering must then
  // remove its chains itself. An error when no guard could be started.
  virtual absl::Status start(std::function<void()> on_lost) = 0;
  // Ends guarding; blocks until the guard process has exited and the
  // watcher thread has ended. No-op before start() or twice.
  virtual void stop() = 0;
};

struct GuardConfig {
  std::string exe = "/proc/self/exe";  // a binary whose main() runs the guard
  int netns_fd = -1;                   // the target's netns (borrowed)
  IptablesFlavor flavor = IptablesFlavor::kNft;
  ChainNames chains;
  bool v6 = false;
  int lock_fd = -1;  // the owner lock (borrowed; outlives the guard), -1: none
};

// The real guard: a process re-executed from config.exe.
std::unique_ptr<ChainGuard> makeProcessGuard(GuardConfig config);

}  // namespace siphon::agent::steal
