#include "agent/steal/iptables/iptables_rules.h"

#include <cinttypes>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// The match part of a port rule, the same in both chains and for -A/-D.
std::string portSpec(uint16_t port, uint16_t to_port) {
  return absl::StrCat("-p tcp -m addrtype --dst-type LOCAL -m tcp --dport ", port,
                      " -j REDIRECT --to-ports ", to_port);
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

// Calls f(line) for each line of `text`, without the newline.
template <typename F>
void forEachLine(std::string_view text, F f) {
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    f(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

// Calls f(line) for each line of the nat table's section of an
// iptables-save text (between "*nat" and its COMMIT), comments left out.
template <typename F>
void forEachNatLine(std::string_view save, F f) {
  bool in_nat = false;
  forEachLine(save, [&](std::string_view line) {
    if (line.empty() || line[0] == '#') return;
    if (line[0] == '*') {
      in_nat = line == "*nat";
      return;
    }
    if (!in_nat) return;
    if (line == "COMMIT") {
      in_nat = false;
      return;
    }
    f(line);
  });
}

// Whether the rule `spec` jumps (-j) or goes (-g) to `chain`. Tokens split
// on spaces: chain names cannot hold one, and a quoted comment that
// happens to contain " -j NAME" would need NAME to be ours exactly.
bool jumpsTo(std::string_view spec, std::string_view chain) {
  std::string_view prev;
  while (!spec.empty()) {
    size_t sp = spec.find(' ');
    std::string_view tok = spec.substr(0, sp);
    if ((prev == "-j" || prev == "-g" || prev == "--jump" || prev == "--goto") && tok == chain) {
      return true;
    }
    if (!tok.empty()) prev = tok;
    if (sp == std::string_view::npos) break;
    spec.remove_prefix(sp + 1);
  }
  return false;
}

}  // namespace

std::string_view flavorName(IptablesFlavor flavor) {
  return flavor == IptablesFlavor::kNft ? "nft" : "legacy";
}

std::optional<IptablesFlavor> parseFlavor(std::string_view name) {
  if (name == "nft") return IptablesFlavor::kNft;
  if (name == "legacy") return IptablesFlavor::kLegacy;
  return std::nullopt;
}

std::string toolName(IpFamily family, IptablesFlavor flavor, std::string_view verb) {
  return absl::StrCat(family == IpFamily::kV4 ? "iptables-" : "ip6tables-", asv(flavorName(flavor)),
                      "-", asv(verb));
}

bool validOwnerId(std::string_view owner) {
  if (owner.size() != kOwnerIdLength) return false;
  for (char c : owner) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string chainPrefixFor(uint64_t netns_inode) {
  // Netns inodes come from the proc inode allocator, which hands out 32-bit
  // numbers, so the low 32 bits name the target uniquely on a node.
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, static_cast<uint32_t>(netns_inode));
  return absl::StrCat("SIPHON_", buf, "_");
}

ChainNames chainNamesFor(uint64_t netns_inode, std::string_view owner) {
  std::string base = chainPrefixFor(netns_inode);
  if (!owner.empty()) absl::StrAppend(&base, asv(owner), "_");
  return ChainNames{absl::StrCat(base, "PRE"), absl::StrCat(base, "OUT")};
}

std::vector<std::string> ownersInSave(std::string_view save, uint64_t netns_inode) {
  const std::string prefix = chainPrefixFor(netns_inode);
  std::set<std::string> owners;
  forEachNatLine(save, [&](std::string_view line) {
    if (line[0] != ':') return;
    std::string_view name = line.substr(1, line.find(' ') - 1);
    if (name.substr(0, prefix.size()) != prefix) return;
    name.remove_prefix(prefix.size());
    if (name == "PRE" || name == "OUT") {
      owners.insert("");
      return;
    }
    if (name.size() != kOwnerIdLength + 4) return;
    std::string_view suffix = name.substr(kOwnerIdLength);
    std::string_view owner = name.substr(0, kOwnerIdLength);
    if ((suffix == "_PRE" || suffix == "_OUT") && validOwnerId(owner)) {
      owners.insert(std::string(owner));
    }
  });
  return {owners.begin(), owners.end()};
}

std::string ownerLockName(uint64_t netns_inode, std::string_view owner) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08" PRIx32, static_cast<uint32_t>(netns_inode));
  return absl::StrCat("siphon-steal-", buf, "-", asv(owner));
}

namespace {

// Probes (--probe-source) pass in both chains before any port's REDIRECT.
std::string exemptSourceRules(const ChainNames& c, const std::vector<std::string>& sources) {
  std::string out;
  for (const std::string& cidr : sources) {
    absl::StrAppend(&out, "-A ", c.pre, " -s ", cidr, " -j RETURN\n", "-A ", c.out, " -s ", cidr,
                    " -j RETURN\n");
  }
  return out;
}

}  // namespace

std::string installRules(const ChainNames& c, const std::vector<std::string>& exempt_sources) {
  // Where the jumps go, for a pod with a service mesh's sidecar (Istio,
  // Linkerd): the mesh REDIRECTs a client's connection in PREROUTING to its
  // proxy, which ends mTLS and connects to the application itself (its
  // original destination, over lo). That second, locally made connection is
  // the one carrying the application's plain bytes, and it passes OUTPUT.
  // So PREROUTING's jump is appended: a port the mesh redirects reaches the
  // proxy, never us with the still encrypted hop, and a port the mesh skips
  // (a skip-inbound-port, or no mesh at all) comes on to our REDIRECT. OUTPUT's
  // jump is first: the proxy's connection to the application is ours before
  // the mesh's own OUTPUT rules (which RETURN it untouched) see it; the
  // exempt mark keeps our passthrough out of it.
  //
  // The conntrack rule never matches (the nat table sees no INVALID packet)
  // but holds the netns' connection tracking for as long as the chains
  // exist. With iptables-nft, the kernel unhooks conntrack from a netns once
  // its last rule needing it (a REDIRECT) is deleted, and then established
  // redirected connections lose their NAT and are reset: this keeps stolen
  // connections alive after their port's REDIRECT is gone (an unsubscribe,
  // a drain).
  return absl::StrCat("*nat\n",                                                     //
                      ":", c.pre, " - [0:0]\n",                                     //
                      ":", c.out, " - [0:0]\n",                                     //
                      "-A ", c.pre, " -m conntrack --ctstate INVALID -j RETURN\n",  //
                      "-A ", c.out, " -m mark --mark ", hex32(kExemptMark), "/",    //
                      hex32(kExemptMask), " -j RETURN\n",                           //
                      exemptSourceRules(c, exempt_sources),                         //
                      "-A PREROUTING -j ", c.pre, "\n",                             //
                      "-I OUTPUT 1 -j ", c.out, "\n",                               //
                      "COMMIT\n");
}

std::string addPortRules(const ChainNames& c, uint16_t port, uint16_t to_port) {
  std::string spec = portSpec(port, to_port);
  return absl::StrCat("*nat\n-A ", c.pre, " ", spec, "\n-A ", c.out, " ", spec, "\nCOMMIT\n");
}

std::string removePortRules(const ChainNames& c, uint16_t port, uint16_t to_port) {
  std::string spec = portSpec(port, to_port);
  return absl::StrCat("*nat\n-D ", c.pre, " ", spec, "\n-D ", c.out, " ", spec, "\nCOMMIT\n");
}

namespace {

std::string releaseSpec(uint16_t port) {
  return absl::StrCat("-p tcp -m tcp --dport ", port, " -j RETURN");
}

}  // namespace

std::string releasePortRules(const ChainNames& c, uint16_t port) {
  const std::string spec = releaseSpec(port);
  return absl::StrCat("*nat\n-I ", c.pre, " 1 ", spec, "\n-I ", c.out, " 1 ", spec, "\nCOMMIT\n");
}

std::string reclaimPortRules(const ChainNames& c, uint16_t port) {
  const std::string spec = releaseSpec(port);
  return absl::StrCat("*nat\n-D ", c.pre, " ", spec, "\n-D ", c.out, " ", spec, "\nCOMMIT\n");
}

NatState parseNatSave(std::string_view save, const ChainNames& chains) {
  NatState state;
  forEachNatLine(save, [&](std::string_view line) {
    if (line[0] == ':') {
      std::string_view name = line.substr(1, line.find(' ') - 1);
      if (name == chains.pre) state.has_pre = true;
      if (name == chains.out) state.has_out = true;
      return;
    }
    if (line.substr(0, 3) != "-A ") return;
    std::string_view spec = line.substr(3);
    std::string_view chain = spec.substr(0, spec.find(' '));
    // Rules inside our chains go with the chains.
    if (chain == chains.pre || chain == chains.out) return;
    if (jumpsTo(spec, chains.pre) || jumpsTo(spec, chains.out)) state.jumps.emplace_back(spec);
  });
  return state;
}

std::string removeAllRules(const NatState& state, const ChainNames& chains) {
  if (state.empty()) return "";
  std::string text = "*nat\n";
  for (const auto& jump : state.jumps) absl::StrAppend(&text, "-D ", jump, "\n");
  if (state.has_pre) absl::StrAppend(&text, "-F ", chains.pre, "\n");
  if (state.has_out) absl::StrAppend(&text, "-F ", chains.out, "\n");
  if (state.has_pre) absl::StrAppend(&text, "-X ", chains.pre, "\n");
  if (state.has_out) absl::StrAppend(&text, "-X ", chains.out, "\n");
  absl::StrAppend(&text, "COMMIT\n");
  return text;
}

size_t countRules(std::string_view save) {
  size_t n = 0;
  forEachLine(save, [&](std::string_view line) {
    if (line.substr(0, 3) == "-A ") ++n;
  });
  return n;
}

absl::StatusOr<IptablesFlavor> chooseFlavor(std::string_view requested, const FlavorProbe& nft,
                                            const FlavorProbe& legacy) {
  auto missing = [](std::string_view which) {
    return absl::FailedPreconditionError(
        absl::StrCat("steal backend iptables: ", asv(which),
                     " not found (install the iptables package, or use the sk_lookup backend)"));
  };
  if (requested == "nft") {
    if (!nft.installed) return missing("iptables-nft-save/-restore");
    return IptablesFlavor::kNft;
  }
  if (requested == "legacy") {
    if (!legacy.installed) return missing("iptables-legacy-save/-restore");
    return IptablesFlavor::kLegacy;
  }
  if (requested != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("iptables flavour \"", asv(requested), "\": expected auto, nft or legacy"));
  }
  if (legacy.installed && legacy.rules > nft.rules) return IptablesFlavor::kLegacy;
  if (nft.installed) return IptablesFlavor::kNft;
  if (legacy.installed) return IptablesFlavor::kLegacy;
  return missing("iptables-nft-restore and iptables-legacy-restore");
}

}  // namespace siphon::agent::steal
