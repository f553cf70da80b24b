// The iptables backend's rules as text: what iptables-restore --noflush is
// fed to install our nat chains, steer or release a port, and remove every
// trace of them, and what is read back from iptables-save. Pure functions,
// no I/O; the programs are run through IptablesRunner.
//
// Our chains, for a target whose netns inode is I (low 32 bits as hex) and
// an agent whose owner id is O (6 hex digits, random per steering):
//
//   -A PREROUTING -j SIPHON_<I>_<O>_PRE        traffic from outside the pod, after
//                                              a mesh's inbound REDIRECT (below)
//   -I OUTPUT 1 -j SIPHON_<I>_<O>_OUT          connections made inside the pod,
//                                              a mesh proxy's to the application too
//   -A SIPHON_<I>_<O>_OUT -m mark --mark kExemptMark/kExemptMask -j RETURN
//   -A SIPHON_<I>_<O>_{PRE,OUT} -p tcp -m addrtype --dst-type LOCAL -m tcp
//      --dport P -j REDIRECT --to-ports L      one per steered port
//   -I SIPHON_<I>_<O>_{PRE,OUT} 1 -p tcp -m tcp --dport P -j RETURN
//                                              one per released port (below)
//
// Two agents on one target (a failover, a second operator) each have their
// own chains and jumps, so neither removes the other's.
//
// In a pod with a mesh sidecar (Istio, Linkerd), a client's connection is
// REDIRECTed in PREROUTING to the proxy, which ends mTLS and connects to the
// application from inside the pod: PREROUTING's jump comes after the mesh's
// (the encrypted hop is left to the proxy) and OUTPUT's before (the proxy's
// plain connection to the application is the one stolen). Ports the mesh
// does not redirect are taken in PREROUTING as in a pod without a mesh. The owner's
// liveness is an abstract unix socket bound in the target's netns
// (owner_lock.h), held by the agent and its guard: a later agent removes
// only chains whose owner's lock is free. The inode part lets it find
// them; chains named SIPHON_<I>_PRE (no owner: an older agent) are always
// stale. "--dst-type LOCAL": only connections to an address of the pod
// itself are steered; the application's own connections to port P
// elsewhere are not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent::steal {

enum class IptablesFlavor { kNft, kLegacy };
enum class IpFamily { kV4, kV6 };

// "nft" / "legacy"; parseFlavor() takes those two only.
std::string_view flavorName(IptablesFlavor flavor);
std::optional<IptablesFlavor> parseFlavor(std::string_view name);

// "iptables-nft-restore", "ip6tables-legacy-save"... `verb` is "save" or
// "restore".
std::string toolName(IpFamily family, IptablesFlavor flavor, std::string_view verb);

// The SO_MARK the agent's passthrough sockets carry. The OUTPUT chain
// matches it under a mask, so other bits of the mark (set by a mesh or CNI
// in the pod) do not hide it. The value is distinctive (an "SI" in the
// high half) and stays clear of the bits kube-proxy (0x4000, 0x8000) and
// Istio (0x539/0xfff) use. Marks do not cross the pod's veth (the kernel
// scrubs them between namespaces), so the host's rules never see it.
inline constexpr uint32_t kExemptMark = 0x53490000;
inline constexpr uint32_t kExemptMask = 0xffff0000;

struct ChainNames {
  std::string pre;  // SIPHON_<8 hex>_<owner>_PRE, jumped to from PREROUTING
  std::string out;  // SIPHON_<8 hex>_<owner>_OUT, jumped to from OUTPUT
};

// An owner id: exactly kOwnerIdLength lowercase hex digits.
inline constexpr size_t kOwnerIdLength = 6;
bool validOwnerId(std::string_view owner);

// Chain names of `owner` for the target whose netns has `netns_inode`; at
// most 28 characters (iptables' limit), 26 in fact. An empty owner gives
// the names agents used before owner ids (SIPHON_<8 hex>_PRE), which only
// the stale sweep still looks for.
ChainNames chainNamesFor(uint64_t netns_inode, std::string_view owner);

// "SIPHON_<8 hex>_": what every chain of the target starts with.
std::string chainPrefixFor(uint64_t netns_inode);

// The owners ("" for the owner-less names) of the target's chains declared
// in the nat section of a save output, sorted, each once.
std::vector<std::string> ownersInSave(std::string_view save, uint64_t netns_inode);

// The abstract unix socket name (without its leading NUL) that is the lock
// of `owner`'s chains in the target's netns: "siphon-steal-<8 hex>-<owner>".
std::string ownerLockName(uint64_t netns_inode, std::string_view owner);

// Restore input (nat table, for --noflush) creating both chains, the exempt
// rule and the two jumps. Precondition: neither chain exists (a chain
// declaration flushes an existing one, and the jumps would be doubled);
// removeAllRules() first.
// `exempt_sources` (CIDRs of the table's family: --probe-source) get a
// RETURN in both chains ahead of every port's REDIRECT.
std::string installRules(const ChainNames& chains,
                         const std::vector<std::string>& exempt_sources = {});

// Restore input steering new TCP connections to local addresses on `port`
// to `to_port`, in both chains; removePortRules() takes them back out.
std::string addPortRules(const ChainNames& chains, uint16_t port, uint16_t to_port);
std::string removePortRules(const ChainNames& chains, uint16_t port, uint16_t to_port);

// Giving a port back without deleting anything: a RETURN for `port` at the
// top of both chains, ahead of its REDIRECT. With iptables-nft a commit
// that deletes a rule queues it for the kernel's destroy work, and the
// restore then waits for that work (an RCU grace period: seconds on a busy
// node) when it closes its netlink socket, holding the namespace's commit
// mutex meanwhile; an add-only commit leaves nothing to wait for. So a
// released port's REDIRECT stays, inert, until the port is steered again
// (reclaimPortRules() deletes the RETURN: steering is not the urgent
// direction) or the chains go.
std::string releasePortRules(const ChainNames& chains, uint16_t port);
std::string reclaimPortRules(const ChainNames& chains, uint16_t port);

// What a save output holds of ours, in its nat table.
struct NatState {
  bool has_pre = false;
  bool has_out = false;
  // The rule specs (after "-A ") of rules in other chains that jump to
  // ours, as saved: "PREROUTING -j SIPHON_0000f00d_PRE".
  std::vector<std::string> jumps;

  bool empty() const { return !has_pre && !has_out && jumps.empty(); }
};

// Reads the "*nat" section of an iptables-save output (of every table, or
// of "-t nat"). Lines it does not know are ignored. No nat section: empty.
NatState parseNatSave(std::string_view save, const ChainNames& chains);

// Restore input deleting everything of `state`: the jumps first (a chain
// still referenced cannot be deleted), then flush and delete each chain
// present. "" when there is nothing to remove.
std::string removeAllRules(const NatState& state, const ChainNames& chains);

// The number of rules ("-A" lines) in a save output, every table: what the
// flavour choice weighs.
size_t countRules(std::string_view save);

// What is known of one flavour in the target.
struct FlavorProbe {
  bool installed = false;  // its save and restore tools are there
  size_t rules = 0;        // countRules() of its save output
};

// The flavour to use for `requested` ("auto", "nft" or "legacy"). auto, as
// kube-proxy's iptables-wrapper does: the flavour the target already has
// more rules in (a pod with a mesh's legacy rules must keep legacy:
// mixing both in one netns makes rule order undefined), else nft, else
// whichever is installed. FAILED_PRECONDITION when the tools are missing,
// INVALID_ARGUMENT for an unknown name.
absl::StatusOr<IptablesFlavor> chooseFlavor(std::string_view requested, const FlavorProbe& nft,
                                            const FlavorProbe& legacy);

// Runs the iptables programs in the target's netns. The seam between the
// rule logic and the kernel: tests pass a fake.
//
// Threads: called from any thread, one call at a time per runner.
class IptablesRunner {
 public:
  virtual ~IptablesRunner() = default;
  // Whether `tool` ("iptables-nft-restore") is installed.
  virtual bool installed(std::string_view tool) = 0;
  // Runs `tool args...` with `input` on stdin; its stdout. An error when it
  // cannot be run or exits non-zero ("iptables-nft-restore: exit 1: ...").
  virtual absl::StatusOr<std::string> run(std::string_view tool,
                                          const std::vector<std::string>& args,
                                          std::string_view input) = 0;
};

}  // namespace siphon::agent::steal
