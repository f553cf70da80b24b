#include "agent/steal/iptables/iptables_steering.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <functional>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/exec.h"
#include "agent/common/log.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// SO_ORIGINAL_DST (<linux/netfilter_ipv4.h>) and IP6T_SO_ORIGINAL_DST
// (<linux/netfilter_ipv6/ip6_tables.h>): the kernel headers redefine what
// glibc's <netinet/in.h> defines, so the values are spelled here. Both ask
// conntrack for the destination before NAT.
constexpr int kSoOriginalDst = 80;
constexpr int kIp6tSoOriginalDst = 80;

// iptables-legacy serialises changes with flock() on its lock file and by
// default retries a busy lock once a second: one collision cost a drain a
// whole second. It retries every 10 ms here. iptables-nft takes no lock (it
// warns about -W). The file is a path in the caller's mount namespace, not
// the netns it changes: on a host, /run/xtables.lock is shared with
// kube-proxy and the CNI; in the agent's pod it is XTABLES_LOCKFILE, the
// container's own /dev/xtables.lock (the manifests set it, execCapture()
// passes it on), which serialises every iptables run of the agent (steering,
// guard, start-up sweep) in every netns, as the /run emptyDir did before, and
// never another container's.
const std::vector<std::string>& restoreArgs(IptablesFlavor flavor) {
  static const std::vector<std::string> nft = {"--noflush", "-w", "5"};
  static const std::vector<std::string> legacy = {"--noflush", "-w", "5", "-W", "10000"};
  return flavor == IptablesFlavor::kLegacy ? legacy : nft;
}

class NetnsRunner final : public IptablesRunner {
 public:
  explicit NetnsRunner(int netns_fd) : netns_fd_(netns_fd) {}

  bool installed(std::string_view tool) override { return !findTool(tool).empty(); }

  absl::StatusOr<std::string> run(std::string_view tool, const std::vector<std::string>& args,
                                  std::string_view input) override {
    std::string path = findTool(tool);
    if (path.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(asv(tool), ": not installed"));
    }
    std::vector<std::string> argv = {path};
    argv.insert(argv.end(), args.begin(), args.end());
    return execChecked(argv, input, ExecOptions{.netns_fd = netns_fd_});
  }

 private:
  int netns_fd_;
};

bool hasTools(IptablesRunner& runner, IpFamily family, IptablesFlavor flavor) {
  return runner.installed(toolName(family, flavor, "save")) &&
         runner.installed(toolName(family, flavor, "restore"));
}

FlavorProbe probe(IptablesRunner& runner, IptablesFlavor flavor, bool v6) {
  FlavorProbe p;
  p.installed =
      hasTools(runner, IpFamily::kV4, flavor) && (!v6 || hasTools(runner, IpFamily::kV6, flavor));
  if (!p.installed) return p;
  // Every table, not "-t nat": legacy save of a table the netns does not
  // have yet creates it (and the nft tools then warn about legacy tables).
  auto save = runner.run(toolName(IpFamily::kV4, flavor, "save"), {}, "");
  if (save.ok()) p.rules = countRules(*save);
  return p;
}

class IptablesSteering final : public Steering {
 public:
  IptablesSteering(IptablesOptions options, std::unique_ptr<IptablesRunner> runner, UniqueFd lock,
                   std::unique_ptr<ChainGuard> guard, IptablesFlavor flavor, ChainNames chains)
      : options_(std::move(options)),
        runner_(std::move(runner)),
        lock_(std::move(lock)),
        guard_(std::move(guard)),
        flavor_(flavor),
        chains_(std::move(chains)),
        v6_(options_.listeners.v6 >= 0) {}

  ~IptablesSteering() override { stop(); }

  // The --probe-source prefixes of one family, as iptables takes them.
  std::vector<std::string> exemptTexts(int family) const {
    std::vector<std::string> out;
    for (const SourcePrefix& p : options_.exempt_sources) {
      if (p.family == family) out.push_back(p.text());
    }
    return out;
  }

  // The guard first: chains installed before it would outlive a crash in
  // between.
  absl::Status init() {
    RETURN_IF_ERROR(guard_->start([this] { onGuardLost(); }));
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status s = restore(IpFamily::kV4, installRules(chains_, exemptTexts(AF_INET)));
    if (s.ok() && v6_) s = restore(IpFamily::kV6, installRules(chains_, exemptTexts(AF_INET6)));
    if (!s.ok()) return s;  // the destructor removes what was installed
    log::info("steal_iptables_installed", {{"flavor", flavorName(flavor_)},
                                           {"owner", options_.owner},
                                           {"chain_pre", chains_.pre},
                                           {"chain_out", chains_.out},
                                           {"ipv6", v6_}});
    return absl::OkStatus();
  }

  std::string_view name() const override { return "iptables"; }

  absl::Status addPort(uint16_t port) override {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usable());
    if (ports_.count(port) != 0) return absl::OkStatus();
    RETURN_IF_ERROR(restore(IpFamily::kV4, steerText(IpFamily::kV4, port)));
    if (v6_) {
      absl::Status s = restore(IpFamily::kV6, steerText(IpFamily::kV6, port));
      if (!s.ok()) {
        // All or nothing: a port steered for IPv4 only would split the
        // clients of one service between the agent and the application.
        absl::Status undo = restore(IpFamily::kV4, unsteerText(IpFamily::kV4, port));
        if (!undo.ok()) {
          log::error("steal_iptables_rollback_failed",
                     {{"port", unsigned{port}}, {"error", sv(undo.message())}});
        }
        return s;
      }
    }
    ports_.insert(port);
    released(IpFamily::kV4).erase(port);
    released(IpFamily::kV6).erase(port);
    return absl::OkStatus();
  }

  // Add-only (releasePortRules): milliseconds, where deleting the REDIRECT
  // made a drain wait seconds for the kernel under load. Each family is
  // given back even when the other fails.
  absl::Status removePort(uint16_t port) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ports_.count(port) == 0 || stopped_ || lost_) return absl::OkStatus();
    ports_.erase(port);
    absl::Status first;
    for (IpFamily family : {IpFamily::kV4, IpFamily::kV6}) {
      if (family == IpFamily::kV6 && !v6_) continue;
      absl::Status s = restore(family, releasePortRules(chains_, port));
      if (s.ok()) {
        released(family).insert(port);
      } else if (first.ok()) {
        first = s;
      }
    }
    return first;
  }

  absl::Status exempt(int fd) override {
    uint32_t mark = kExemptMark;
    if (setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark) != 0) {
      return lastErrnoStatus("steal passthrough: setsockopt SO_MARK");
    }
    return absl::OkStatus();
  }

  void unexempt(int fd) override {
    // The mark only matters for the connect's first packet (nat decides
    // once per connection); cleared so the socket carries nothing of ours.
    uint32_t mark = 0;
    setsockopt(fd, SOL_SOCKET, SO_MARK, &mark, sizeof mark);
  }

  absl::StatusOr<SockAddr> originalDestination(int fd) override {
    ASSIGN_OR_RETURN(SockAddr local, outgoing::localAddress(fd));
    SockAddr orig;
    socklen_t len = sizeof orig.storage;
    int rc = -1;
    if (local.family() == AF_INET) {
      rc = getsockopt(fd, SOL_IP, kSoOriginalDst, orig.get(), &len);
    } else if (local.family() == AF_INET6) {
      rc = getsockopt(fd, SOL_IPV6, kIp6tSoOriginalDst, orig.get(), &len);
    } else {
      return absl::InvalidArgumentError("original destination: not a TCP/IP socket");
    }
    if (rc != 0) return lastErrnoStatus("original destination: getsockopt SO_ORIGINAL_DST");
    orig.len = len;
    return orig;
  }

  void stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
      if (!lost_) {
        // The ports still steered go back first, add-only (milliseconds):
        // removing the chains deletes rules, and that restore waits for
        // the kernel to free them (seconds under load) before it returns.
        releaseAll();
        removeAll("stop");
      }
      ports_.clear();
      released_v4_.clear();
      released_v6_.clear();
    }
    // Outside the lock: the guard's thread may be waiting for it in
    // onGuardLost().
    guard_->stop();
  }

 private:
  absl::Status usable() const {
    if (stopped_) return absl::FailedPreconditionError("iptables steering stopped");
    if (lost_) {
      return absl::UnavailableError(
          "iptables steering disabled: its guard process died and could not be restarted");
    }
    return absl::OkStatus();
  }

  std::set<uint16_t>& released(IpFamily family) {
    return family == IpFamily::kV4 ? released_v4_ : released_v6_;
  }
  uint16_t listenerPort(IpFamily family) const {
    return family == IpFamily::kV4 ? options_.listeners.v4_port : options_.listeners.v6_port;
  }
  // Steering `port` in one family: its RETURN out if it was released (the
  // REDIRECT is still there), else a new REDIRECT; and the way back.
  std::string steerText(IpFamily family, uint16_t port) {
    return released(family).count(port) != 0 ? reclaimPortRules(chains_, port)
                                             : addPortRules(chains_, port, listenerPort(family));
  }
  std::string unsteerText(IpFamily family, uint16_t port) {
    return released(family).count(port) != 0 ? releasePortRules(chains_, port)
                                             : removePortRules(chains_, port, listenerPort(family));
  }

  absl::Status restore(IpFamily family, const std::string& text) {
    return runner_->run(toolName(family, flavor_, "restore"), restoreArgs(flavor_), text).status();
  }

  void releaseAll() {
    if (ports_.empty()) return;
    for (IpFamily family : {IpFamily::kV4, IpFamily::kV6}) {
      if (family == IpFamily::kV6 && !v6_) continue;
      std::string text;
      for (uint16_t port : ports_) absl::StrAppend(&text, releasePortRules(chains_, port));
      if (absl::Status s = restore(family, text); !s.ok()) {
        log::warn("steal_iptables_release_failed", {{"error", sv(s.message())}});
      }
    }
  }

  void removeAll(std::string_view why) {
    auto removed = removeIptablesChains(*runner_, chains_, /*v6=*/true);
    if (!removed.ok()) {
      log::error(
          "steal_iptables_remove_failed",
          {{"why", why}, {"chain_pre", chains_.pre}, {"error", sv(removed.status().message())}});
    } else {
      log::info("steal_iptables_removed", {{"why", why}, {"chain_pre", chains_.pre}});
    }
  }

  // The guard is gone for good: nothing would remove the chains if the
  // agent died now, so steering stops here.
  void onGuardLost() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || lost_) return;
    lost_ = true;
    ports_.clear();
    released_v4_.clear();
    released_v6_.clear();
    removeAll("guard_lost");
  }

  const IptablesOptions options_;
  const std::unique_ptr<IptablesRunner> runner_;
  // Our owner's lock, shared with the guard (which inherits it): held until
  // the steering is gone, after the guard (declared after it) has exited.
  const UniqueFd lock_;
  const std::unique_ptr<ChainGuard> guard_;
  const IptablesFlavor flavor_;
  const ChainNames chains_;
  const bool v6_;

  std::mutex mu_;
  std::set<uint16_t> ports_;
  // Ports given back by removePort(), per family: their REDIRECT is behind a
  // RETURN until they are steered again or the chains go.
  std::set<uint16_t> released_v4_;
  std::set<uint16_t> released_v6_;
  bool stopped_ = false;
  bool lost_ = false;
};

absl::Status checkOptions(const IptablesOptions& o) {
  if (o.netns_fd < 0) return absl::InvalidArgumentError("iptables steering: no netns fd");
  if (o.listeners.v4 < 0 || o.listeners.v4_port == 0) {
    return absl::InvalidArgumentError("iptables steering: no IPv4 listener");
  }
  if (o.listeners.v6 >= 0 && o.listeners.v6_port == 0) {
    return absl::InvalidArgumentError("iptables steering: IPv6 listener without a port");
  }
  if (!o.owner.empty() && !validOwnerId(o.owner)) {
    return absl::InvalidArgumentError(absl::StrCat("iptables steering: owner id \"", o.owner,
                                                   "\": expected ", kOwnerIdLength,
                                                   " lowercase hex digits"));
  }
  return absl::OkStatus();
}

// Our owner's lock: the pinned owner's, or that of a fresh id no live agent
// uses (a clash of random ids is caught by the lock itself).
absl::StatusOr<UniqueFd> takeOwnerLock(std::string& owner, const OwnerLock& lock) {
  if (!owner.empty()) {
    auto held = lock(owner);
    if (held.ok() || held.status().code() != absl::StatusCode::kAlreadyExists) return held;
    return absl::AlreadyExistsError(
        absl::StrCat("iptables steering: owner id ", owner, " is held by another live agent"));
  }
  absl::Status last;
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string id = newOwnerId();
    auto held = lock(id);
    if (held.ok()) owner = id;
    if (held.ok() || held.status().code() != absl::StatusCode::kAlreadyExists) return held;
    last = held.status();
  }
  return last;
}

using GuardFactory =
    std::function<std::unique_ptr<ChainGuard>(IptablesFlavor, const ChainNames&, int lock_fd)>;

absl::StatusOr<std::unique_ptr<Steering>> build(IptablesOptions options,
                                                std::unique_ptr<IptablesRunner> runner,
                                                const GuardFactory& make_guard,
                                                const OwnerLock& lock) {
  RETURN_IF_ERROR(checkOptions(options));
  const bool v6 = options.listeners.v6 >= 0;

  // Stale chains first (of dead owners only: another live agent's stay):
  // they weigh in the flavour choice. Before our lock is taken, so a
  // pinned owner's own leftovers go too.
  auto removed = removeStaleIptablesChains(*runner, options.netns_inode, lock);
  if (!removed.ok()) {
    return absl::Status(removed.status().code(), absl::StrCat("removing stale iptables chains: ",
                                                              removed.status().message()));
  }
  ASSIGN_OR_RETURN(UniqueFd held, takeOwnerLock(options.owner, lock));
  const ChainNames chains = chainNamesFor(options.netns_inode, options.owner);

  ASSIGN_OR_RETURN(IptablesFlavor flavor,
                   chooseFlavor(options.flavor, probe(*runner, IptablesFlavor::kNft, v6),
                                probe(*runner, IptablesFlavor::kLegacy, v6)));
  auto guard = make_guard(flavor, chains, held.get());
  auto steering = std::make_unique<IptablesSteering>(
      std::move(options), std::move(runner), std::move(held), std::move(guard), flavor, chains);
  RETURN_IF_ERROR(steering->init());
  return std::unique_ptr<Steering>(std::move(steering));
}

}  // namespace

std::unique_ptr<IptablesRunner> makeIptablesRunner(int netns_fd) {
  return std::make_unique<NetnsRunner>(netns_fd);
}

absl::StatusOr<int> removeIptablesChains(IptablesRunner& runner, const ChainNames& chains,
                                         bool v6) {
  int removed = 0;
  absl::Status first_error;
  for (IptablesFlavor flavor : {IptablesFlavor::kNft, IptablesFlavor::kLegacy}) {
    for (IpFamily family : {IpFamily::kV4, IpFamily::kV6}) {
      if (family == IpFamily::kV6 && !v6) continue;
      if (!hasTools(runner, family, flavor)) continue;
      auto save = runner.run(toolName(family, flavor, "save"), {}, "");
      absl::Status s = save.status();
      if (s.ok()) {
        std::string text = removeAllRules(parseNatSave(*save, chains), chains);
        if (text.empty()) continue;
        s = runner.run(toolName(family, flavor, "restore"), restoreArgs(flavor), text).status();
        if (s.ok()) ++removed;
      }
      if (!s.ok() && first_error.ok()) first_error = s;
    }
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

absl::StatusOr<int> removeStaleIptablesChains(IptablesRunner& runner, uint64_t netns_inode,
                                              const OwnerLock& lock) {
  absl::Status first_error;
  auto failed = [&first_error](const absl::Status& s) {
    if (first_error.ok()) first_error = s;
  };
  std::set<std::string> owners;
  for (IptablesFlavor flavor : {IptablesFlavor::kNft, IptablesFlavor::kLegacy}) {
    for (IpFamily family : {IpFamily::kV4, IpFamily::kV6}) {
      if (!hasTools(runner, family, flavor)) continue;
      auto save = runner.run(toolName(family, flavor, "save"), {}, "");
      if (!save.ok()) {
        failed(save.status());
        continue;
      }
      for (auto& owner : ownersInSave(*save, netns_inode)) owners.insert(std::move(owner));
    }
  }
  int removed = 0;
  for (const std::string& owner : owners) {
    // Held until the chains are gone: the owner's id cannot be taken
    // meanwhile, nor the same chains removed by another sweeping agent (or
    // our own start-up sweep and steering at once). The owner-less chains
    // of older agents have a lock too, that no owner holds: it only keeps
    // two sweeps apart.
    auto taken = lock(owner);
    if (taken.status().code() == absl::StatusCode::kAlreadyExists) {
      log::debug("steal_chains_owner_alive", {{"owner", owner}});
      continue;
    }
    if (!taken.ok()) {
      failed(taken.status());
      continue;
    }
    UniqueFd held = std::move(*taken);
    const ChainNames chains = chainNamesFor(netns_inode, owner);
    auto tables = removeIptablesChains(runner, chains, /*v6=*/true);
    if (!tables.ok()) {
      failed(tables.status());
      continue;
    }
    if (*tables == 0) continue;
    ++removed;
    log::warn("steal_stale_chains_removed", {{"owner", owner},
                                             {"chain_pre", chains.pre},
                                             {"chain_out", chains.out},
                                             {"tables", *tables}});
  }
  if (!first_error.ok()) return first_error;
  return removed;
}

absl::Status removeStaleIptablesChains(int netns_fd, uint64_t netns_inode) {
  auto runner = makeIptablesRunner(netns_fd);
  return removeStaleIptablesChains(*runner, netns_inode, netnsOwnerLock(netns_fd, netns_inode))
      .status();
}

absl::StatusOr<std::unique_ptr<Steering>> makeIptablesSteering(IptablesOptions options) {
  if (options.netns_fd < 0) return absl::InvalidArgumentError("iptables steering: no netns fd");
  auto runner = makeIptablesRunner(options.netns_fd);
  GuardConfig base;
  base.exe = options.guard_exe;
  base.netns_fd = options.netns_fd;
  base.v6 = options.listeners.v6 >= 0;
  OwnerLock lock = netnsOwnerLock(options.netns_fd, options.netns_inode);
  return build(
      std::move(options), std::move(runner),
      [base](IptablesFlavor flavor, const ChainNames& chains, int lock_fd) {
        GuardConfig config = base;
        config.flavor = flavor;
        config.chains = chains;
        config.lock_fd = lock_fd;
        return makeProcessGuard(std::move(config));
      },
      lock);
}

absl::StatusOr<std::unique_ptr<Steering>> makeIptablesSteering(
    IptablesOptions options, std::unique_ptr<IptablesRunner> runner,
    std::unique_ptr<ChainGuard> guard, OwnerLock lock) {
  auto shared = std::make_shared<std::unique_ptr<ChainGuard>>(std::move(guard));
  return build(
      std::move(options), std::move(runner),
      [shared](IptablesFlavor, const ChainNames&, int) { return std::move(*shared); }, lock);
}

}  // namespace siphon::agent::steal
