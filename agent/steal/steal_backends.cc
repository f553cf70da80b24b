// The real steering backends and flushing, chosen by --steal-backend.
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/netns/netns_worker.h"
#include "agent/steal/iptables/iptables_steering.h"
#include "agent/steal/sk_lookup/sk_lookup_steering.h"
#include "agent/steal/sk_lookup/socket_destroy.h"
#include "agent/steal/source_prefix.h"
#include "agent/steal/steal_service.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// The target's netns as an fd; targetless agents steal in their own.
absl::StatusOr<int> netnsFd(ServiceContext& ctx) {
  if (ctx.target.netnsFd() >= 0) return ctx.target.netnsFd();
  static int self_fd = ::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (self_fd < 0) return lastErrnoStatus("open /proc/self/ns/net");
  return self_fd;
}

SteeringFactory realFactory(ServiceContext& ctx) {
  return [&ctx](const Listeners& listeners) -> absl::StatusOr<std::unique_ptr<Steering>> {
    ASSIGN_OR_RETURN(int netns, netnsFd(ctx));
    std::vector<SourcePrefix> exempt;
    for (const std::string& text : ctx.config.probe_sources) {
      ASSIGN_OR_RETURN(SourcePrefix p, parseSourcePrefix(text));
      exempt.push_back(p);
    }
    const std::string& backend = ctx.config.steal_backend;
    std::string sk_lookup_error;
    if (backend == "auto" || backend == "sk_lookup") {
      auto s = makeSkLookupSteering(netns, listeners, exempt);
      if (s.ok() || backend == "sk_lookup") return s;
      sk_lookup_error = std::string(s.status().message());
      log::warn("steal_backend_fallback",
                {{"from", "sk_lookup"}, {"to", "iptables"}, {"reason", sk_lookup_error}});
    }
    IptablesOptions opt;
    opt.netns_fd = netns;
    opt.netns_inode = ctx.netns.netnsInode();
    opt.listeners = listeners;
    opt.flavor = ctx.config.iptables_mode;
    opt.exempt_sources = exempt;
    auto s = makeIptablesSteering(opt);
    if (s.ok() || sk_lookup_error.empty()) return s;
    return protoError(v1::UNAVAILABLE,
                      absl::StrCat("no steal backend works here: sk_lookup: ", sk_lookup_error,
                                   "; iptables: ", s.status().message()));
  };
}

FlushFunction realFlush(ServiceContext& ctx) {
  return [&ctx](uint16_t port) -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(UniqueFd diag, ctx.netns.socketSync(AF_NETLINK, SOCK_RAW, NETLINK_SOCK_DIAG));
    // NetnsWorker makes sockets non-blocking; the dump is read blocking.
    int flags = ::fcntl(diag.get(), F_GETFL);
    ::fcntl(diag.get(), F_SETFL, flags & ~O_NONBLOCK);
    ASSIGN_OR_RETURN(FlushResult r, destroyEstablished(diag.get(), port));
    log::info("steal_flushed", {{"port", static_cast<int>(port)},
                                {"destroyed", static_cast<int64_t>(r.destroyed)},
                                {"failed", static_cast<int64_t>(r.failed)}});
    return static_cast<int>(r.destroyed);
  };
}

}  // namespace

std::shared_ptr<StealService> makeStealService(ServiceContext& ctx) {
  // Chains a previous agent of this target could not remove (killed along
  // with its guard): whatever backend this agent uses, they go now. Only
  // those whose owner is gone: another agent still running on the same
  // target keeps its chains (iptables/owner_lock.h). In the
  // background: it runs iptables-save a few times, which the ready line
  // need not wait for (an iptables steering removes them itself before it
  // installs anything).
  if (auto netns = netnsFd(ctx); netns.ok()) {
    const int fd = *netns;
    const uint64_t inode = ctx.netns.netnsInode();
    net::asio::post(ctx.blocking, [fd, inode] {
      absl::Status s = removeStaleIptablesChains(fd, inode);
      if (!s.ok()) log::debug("steal_stale_check_skipped", {{"reason", sv(s.message())}});
    });
  }
  return makeStealService(ctx, realFactory(ctx), realFlush(ctx));
}

void registerSteal(ServiceRegistry& registry, ServiceContext& ctx) {
  auto service = makeStealService(ctx);
  registry.addRequest(v1::Request::kSteal, service);
  registry.addFeature(v1::FEATURE_STEAL);
}

}  // namespace siphon::agent::steal
