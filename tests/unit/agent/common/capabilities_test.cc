// The capability plan per mode and flags (pure), the names, and the calls
// that need no privilege. The drop itself is exercised as root by
// tests/privileged/caps/.
#include "agent/common/capabilities.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/capability.h>

namespace siphon::agent::caps {
namespace {

using ::testing::HasSubstr;

Plan planOf(Needs needs) {
  auto plan = planCapabilities(needs);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : Plan{};
}

Needs needs(TargetMode mode, FsMode fs, std::string backend = "auto", std::string iptables = "auto",
            int port = 0) {
  Needs n;
  n.mode = mode;
  n.fs_mode = fs;
  n.steal_backend = std::move(backend);
  n.iptables_mode = std::move(iptables);
  n.listen_port = port;
  return n;
}

constexpr CapSet kNetwork = bit(CAP_SYS_ADMIN) | bit(CAP_NET_ADMIN) | bit(CAP_NET_RAW);

constexpr CapSet kHelperIds = bit(CAP_SETUID) | bit(CAP_SETGID);

TEST(CapabilityNamesTest, NamesKnownAndUnknownCapabilities) {
  EXPECT_EQ(capName(CAP_SYS_ADMIN), "CAP_SYS_ADMIN");
  EXPECT_EQ(capName(CAP_CHOWN), "CAP_CHOWN");
  EXPECT_EQ(capName(CAP_BPF), "CAP_BPF");
  EXPECT_EQ(capName(CAP_CHECKPOINT_RESTORE), "CAP_CHECKPOINT_RESTORE");
  EXPECT_EQ(capName(55), "CAP_55");
  EXPECT_EQ(formatCapSet(0), "");
  EXPECT_EQ(formatCapSet(bit(CAP_NET_RAW) | bit(CAP_CHOWN) | bit(CAP_SYS_PTRACE)),
            "CAP_CHOWN,CAP_NET_RAW,CAP_SYS_PTRACE");
}

TEST(CapabilityPlanTest, TargetedReadOnlyKeepsNetworkPtraceAndReadSearch) {
  Plan p = planOf(needs(TargetMode::kTargeted, FsMode::kReadOnly));
  EXPECT_EQ(p.keep, kNetwork | bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH) | kHelperIds)
      << formatCapSet(p.keep);
  // auto may fall back to iptables, of either flavour: the guard's set;
  // the file helper its ids and the file capabilities kept.
  EXPECT_EQ(p.inheritable, kGuardAmbient | kHelperIds | bit(CAP_DAC_READ_SEARCH));
  EXPECT_EQ(p.reasons.size(), 7u);
}

TEST(CapabilityPlanTest, EphemeralNeedsWhatTargetedNeeds) {
  for (FsMode fs : {FsMode::kReadOnly, FsMode::kReadWrite, FsMode::kOff}) {
    EXPECT_EQ(planOf(needs(TargetMode::kEphemeral, fs)).keep,
              planOf(needs(TargetMode::kTargeted, fs)).keep);
  }
}

TEST(CapabilityPlanTest, ReadWriteAddsTheOwnerOverrides) {
  Plan p = planOf(needs(TargetMode::kTargeted, FsMode::kReadWrite));
  EXPECT_EQ(p.keep, kNetwork | bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH) |
                        bit(CAP_DAC_OVERRIDE) | bit(CAP_FOWNER) | bit(CAP_CHOWN) | bit(CAP_FSETID) |
                        kHelperIds)
      << formatCapSet(p.keep);
  // The file capabilities are inheritable for the file helper only (the
  // iptables children raise kIptablesAmbient / kGuardAmbient alone).
  EXPECT_EQ(p.inheritable & ~(kGuardAmbient | kFsHelperAmbient), 0u);
  EXPECT_EQ(kIptablesAmbient & kFsHelperAmbient, 0u);
  EXPECT_EQ(kFsHelperAmbient & (bit(CAP_SYS_PTRACE) | bit(CAP_SYS_ADMIN)), 0u);
}

TEST(CapabilityPlanTest, FsOffStillReadsTheTargetEnvironment) {
  // /proc/PID/environ is 0400 and owned by the target's uid.
  Plan p = planOf(needs(TargetMode::kTargeted, FsMode::kOff));
  EXPECT_EQ(p.keep, kNetwork | bit(CAP_SYS_PTRACE) | bit(CAP_DAC_READ_SEARCH))
      << formatCapSet(p.keep);
}

TEST(CapabilityPlanTest, TargetlessNeedsNoPtrace) {
  Plan off = planOf(needs(TargetMode::kTargetless, FsMode::kOff));
  EXPECT_EQ(off.keep, kNetwork) << formatCapSet(off.keep);
  Plan ro = planOf(needs(TargetMode::kTargetless, FsMode::kReadOnly));
  EXPECT_EQ(ro.keep, kNetwork | bit(CAP_DAC_READ_SEARCH) | kHelperIds) << formatCapSet(ro.keep);
}

TEST(CapabilityPlanTest, SkLookupOnlyGivesNoGuardSetns) {
  // No guard; the start-up removal of stale chains still runs iptables.
  Plan p = planOf(needs(TargetMode::kTargeted, FsMode::kReadOnly, "sk_lookup"));
  EXPECT_EQ(p.inheritable & ~kFsHelperAmbient, kIptablesAmbient);
  EXPECT_FALSE(p.inheritable & bit(CAP_SYS_ADMIN));
  // Capture still needs raw sockets, the mirror SYS_ADMIN and NET_ADMIN.
  EXPECT_EQ(p.keep & kNetwork, kNetwork);
}

TEST(CapabilityPlanTest, IptablesBackendLetsTheGuardEnterTheNetns) {
  for (const char* flavor : {"nft", "legacy", "auto"}) {
    Plan p = planOf(needs(TargetMode::kTargeted, FsMode::kReadOnly, "iptables", flavor));
    EXPECT_EQ(p.inheritable & ~kFsHelperAmbient, kGuardAmbient) << flavor;
    EXPECT_EQ(p.inheritable & ~p.keep, 0u);
  }
  EXPECT_EQ(kGuardAmbient, bit(CAP_SYS_ADMIN) | bit(CAP_NET_ADMIN) | bit(CAP_NET_RAW));
  EXPECT_EQ(kIptablesAmbient, bit(CAP_NET_ADMIN) | bit(CAP_NET_RAW));
}

TEST(CapabilityPlanTest, LowListenPortKeepsBindService) {
  EXPECT_TRUE(planOf(needs(TargetMode::kTargeted, FsMode::kOff, "auto", "auto", 443)).keep &
              bit(CAP_NET_BIND_SERVICE));
  EXPECT_FALSE(planOf(needs(TargetMode::kTargeted, FsMode::kOff, "auto", "auto", 1024)).keep &
               bit(CAP_NET_BIND_SERVICE));
  EXPECT_FALSE(planOf(needs(TargetMode::kTargeted, FsMode::kOff, "auto", "auto", 0)).keep &
               bit(CAP_NET_BIND_SERVICE));
}

TEST(CapabilityPlanTest, NeverKeepsWhatOnlyTheDropNeeds) {
  for (TargetMode mode : {TargetMode::kTargeted, TargetMode::kEphemeral, TargetMode::kTargetless}) {
    for (FsMode fs : {FsMode::kReadOnly, FsMode::kReadWrite, FsMode::kOff}) {
      for (const char* backend : {"auto", "sk_lookup", "iptables"}) {
        Plan p = planOf(needs(mode, fs, backend, "auto", 80));
        // CAP_SETUID/SETGID only for the file helper's identity.
        EXPECT_EQ((p.keep & kHelperIds) != 0, fs != FsMode::kOff) << formatCapSet(p.keep);
        for (int cap : {CAP_SETPCAP, CAP_SYS_MODULE, CAP_SETFCAP, CAP_SYS_CHROOT, CAP_MKNOD,
                        CAP_KILL, CAP_BPF, CAP_PERFMON}) {
          EXPECT_FALSE(p.keep & bit(cap)) << capName(cap) << " in " << formatCapSet(p.keep);
        }
        EXPECT_EQ(p.reasons.size(), static_cast<size_t>(__builtin_popcountll(p.keep)));
      }
    }
  }
}

TEST(CapabilityPlanTest, RejectsUnknownBackends) {
  auto bad = planCapabilities(needs(TargetMode::kTargeted, FsMode::kOff, "ebpf"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("ebpf"));
  EXPECT_FALSE(planCapabilities(needs(TargetMode::kTargeted, FsMode::kOff, "auto", "xt")).ok());
}

TEST(CapabilitySetsTest, CurrentSetsAreReadable) {
  auto sets = currentSets();
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_EQ(sets->effective & ~sets->permitted, 0u);
}

}  // namespace
}  // namespace siphon::agent::caps
