// The iptables steering backend: nat chains named after the target that
// REDIRECT subscribed ports to the agent's listeners (iptables_rules.h has
// the rules), applied atomically with iptables-restore --noflush in the
// flavour (nft or legacy) the target uses, IPv4 and IPv6, removed by a
// guard process if the agent dies (guard.h).
//
// Threads: as Steering (steering.h). The guard's watcher thread may remove
// the chains on its own when the guard cannot be kept alive; a mutex
// serialises that with the caller's calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/outgoing/address.h"
#include "agent/steal/iptables/guard.h"
#include "agent/steal/iptables/iptables_rules.h"
#include "agent/steal/iptables/owner_lock.h"
#include "agent/steal/source_prefix.h"

// steering.h names SockAddr without its namespace; bring it in before the
// header is read (repeating a using-declaration is harmless if the header
// gains its own).
namespace siphon::agent::steal {
using outgoing::SockAddr;
}  // namespace siphon::agent::steal

#include "agent/steal/steering.h"

namespace siphon::agent::steal {

struct IptablesOptions {
  int netns_fd = -1;            // the target's netns (borrowed; outlives the steering)
  uint64_t netns_inode = 0;     // its inode: names the chains
  Listeners listeners;          // v4_port for iptables, v6_port for ip6tables (when v6 >= 0)
  std::string flavor = "auto";  // auto | nft | legacy
  // --probe-source: connections from these are never redirected.
  std::vector<SourcePrefix> exempt_sources;
  std::string guard_exe = "/proc/self/exe";  // a binary whose main() runs the guard
  // Our owner id in the chain names (validOwnerId). Empty: a fresh random
  // one, which is what the agent uses; tests pin one to find the chains.
  std::string owner;
};

// The runner of the real programs, inside the netns `netns_fd` (-1: ours).
std::unique_ptr<IptablesRunner> makeIptablesRunner(int netns_fd);

// Removes our chains (and the jumps to them) from every installed flavour,
// IPv4 and (if `v6`) IPv6, reading each save output first so only what
// exists is deleted. The number of tables something was removed from; the
// first error after trying them all.
absl::StatusOr<int> removeIptablesChains(IptablesRunner& runner, const ChainNames& chains, bool v6);

// Removes the target's stale chains: those of every owner whose lock
// (owner_lock.h) is free, i.e. whose agent and guard are both gone, and
// the owner-less ones of older agents, in every installed flavour, IPv4 and
// IPv6. Chains of a live owner (another agent on the same target) are left
// alone. Logs steal_stale_chains_removed per owner removed; the number of
// owners removed; the first error after trying them all.
absl::StatusOr<int> removeStaleIptablesChains(IptablesRunner& runner, uint64_t netns_inode,
                                              const OwnerLock& lock);

// Start-up clean-up, whichever backend the agent uses: the above with the
// real runner and locks of the netns. OK when there is nothing to do or no
// iptables installed.
absl::Status removeStaleIptablesChains(int netns_fd, uint64_t netns_inode);

// Removes stale chains, takes our owner's lock, picks the flavour, starts
// the guard (which shares the lock) and installs the chains (empty: ports
// come with addPort). FAILED_PRECONDITION when the iptables tools are
// missing, INVALID_ARGUMENT for bad options, the iptables-restore error
// otherwise.
absl::StatusOr<std::unique_ptr<Steering>> makeIptablesSteering(IptablesOptions options);

// The same with the runner, guard and locks given (tests pass fakes).
absl::StatusOr<std::unique_ptr<Steering>> makeIptablesSteering(
    IptablesOptions options, std::unique_ptr<IptablesRunner> runner,
    std::unique_ptr<ChainGuard> guard, OwnerLock lock);

}  // namespace siphon::agent::steal
