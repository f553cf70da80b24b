#include "agent/steal/iptables/iptables_steering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace siphon::agent::steal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Everything the fakes were asked, in order: "tool|input".
using Journal = std::vector<std::string>;

class FakeRunner final : public IptablesRunner {
 public:
  FakeRunner(Journal* journal, std::set<std::string> tools,
             std::map<std::string, std::string> saves)
      : journal_(journal), tools_(std::move(tools)), saves_(std::move(saves)) {}

  bool installed(std::string_view tool) override { return tools_.count(std::string(tool)) != 0; }

  absl::StatusOr<std::string> run(std::string_view tool, const std::vector<std::string>& args,
                                  std::string_view input) override {
    std::string t(tool);
    EXPECT_TRUE(installed(t)) << t;
    if (t.find("-restore") != std::string::npos) {
      // Legacy: the machine-wide xtables lock, retried every 10 ms instead
      // of every second.
      if (t.find("legacy") != std::string::npos) {
        EXPECT_THAT(args, ElementsAre("--noflush", "-w", "5", "-W", "10000"));
      } else {
        EXPECT_THAT(args, ElementsAre("--noflush", "-w", "5"));
      }
      journal_->push_back(t + "|" + std::string(input));
      if (fail_ == t) return absl::InternalError(t + ": exit 1: line 2 failed");
      return std::string();
    }
    EXPECT_THAT(args, IsEmpty()) << "save every table, never -t nat";
    journal_->push_back(t);
    return saves_[t];
  }

  std::string fail_;  // a tool that fails

 private:
  Journal* journal_;
  std::set<std::string> tools_;
  std::map<std::string, std::string> saves_;
};

class FakeGuard final : public ChainGuard {
 public:
  FakeGuard(Journal* journal, std::function<void()>* on_lost)
      : journal_(journal), on_lost_(on_lost) {}
  absl::Status start(std::function<void()> on_lost) override {
    journal_->push_back("guard start");
    *on_lost_ = std::move(on_lost);
    return absl::OkStatus();
  }
  void stop() override { journal_->push_back("guard stop"); }

 private:
  Journal* journal_;
  std::function<void()>* on_lost_;
};

const std::set<std::string> kAllTools = {"iptables-nft-save",     "iptables-nft-restore",
                                         "ip6tables-nft-save",    "ip6tables-nft-restore",
                                         "iptables-legacy-save",  "iptables-legacy-restore",
                                         "ip6tables-legacy-save", "ip6tables-legacy-restore"};

constexpr uint64_t kInode = 0xabc;
constexpr char kOwner[] = "a1b2c3";

IptablesOptions options(bool v6, std::string flavor = "auto") {
  IptablesOptions o;
  o.netns_fd = 99;  // never used by the fakes
  o.netns_inode = kInode;
  o.listeners = Listeners{5, v6 ? 6 : -1, 40004, static_cast<uint16_t>(v6 ? 40006 : 0)};
  o.flavor = std::move(flavor);
  o.owner = kOwner;
  return o;
}

struct Made {
  Journal journal;
  std::function<void()> on_lost;
  FakeRunner* runner = nullptr;
  absl::StatusOr<std::unique_ptr<Steering>> steering;
};

// Owner locks: held (ALREADY_EXISTS) for the owners in `alive`, taken
// (journalled "lock OWNER") for any other.
OwnerLock fakeLock(Journal* journal, std::set<std::string> alive) {
  return [journal, alive](std::string_view owner) -> absl::StatusOr<UniqueFd> {
    if (alive.count(std::string(owner)) != 0) return absl::AlreadyExistsError("alive");
    journal->push_back("lock " + std::string(owner));
    return UniqueFd(eventfd(0, EFD_CLOEXEC));
  };
}

std::unique_ptr<Made> make(IptablesOptions o, std::set<std::string> tools = kAllTools,
                           std::map<std::string, std::string> saves = {}, std::string fail = "",
                           std::set<std::string> alive = {}) {
  auto m = std::make_unique<Made>();
  auto runner = std::make_unique<FakeRunner>(&m->journal, std::move(tools), std::move(saves));
  runner->fail_ = std::move(fail);
  m->runner = runner.get();
  m->steering = makeIptablesSteering(std::move(o), std::move(runner),
                                     std::make_unique<FakeGuard>(&m->journal, &m->on_lost),
                                     fakeLock(&m->journal, std::move(alive)));
  return m;
}

// The restore calls only.
Journal restores(const Journal& j) {
  Journal out;
  for (const auto& e : j) {
    if (e.find("-restore|") != std::string::npos || e.rfind("guard", 0) == 0 ||
        e.rfind("lock", 0) == 0) {
      out.push_back(e);
    }
  }
  return out;
}

TEST(IptablesSteering, StartsTheGuardBeforeInstallingInTheNftDefault) {
  auto m = make(options(/*v6=*/false));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  EXPECT_EQ((*m->steering)->name(), "iptables");
  ChainNames c = chainNamesFor(kInode, kOwner);
  EXPECT_THAT(restores(m->journal), ElementsAre(std::string("lock ") + kOwner, "guard start",
                                                "iptables-nft-restore|" + installRules(c)));
  m->journal.clear();
  m->steering->reset();
  // The destructor removes whatever is there (the fake's save shows
  // nothing, so no restore) and then stops the guard.
  EXPECT_THAT(restores(m->journal), ElementsAre("guard stop"));
}

TEST(IptablesSteering, PortsAreAddedOnceAndRemovedOnceInBothFamilies) {
  auto m = make(options(/*v6=*/true));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  Steering& s = **m->steering;
  ChainNames c = chainNamesFor(kInode, kOwner);
  m->journal.clear();
  ASSERT_TRUE(s.addPort(80).ok());
  ASSERT_TRUE(s.addPort(80).ok());     // no-op
  ASSERT_TRUE(s.removePort(81).ok());  // not steered: no-op
  ASSERT_TRUE(s.removePort(80).ok());
  ASSERT_TRUE(s.removePort(80).ok());  // no-op
  EXPECT_THAT(m->journal, ElementsAre("iptables-nft-restore|" + addPortRules(c, 80, 40004),
                                      "ip6tables-nft-restore|" + addPortRules(c, 80, 40006),
                                      "iptables-nft-restore|" + releasePortRules(c, 80),
                                      "ip6tables-nft-restore|" + releasePortRules(c, 80)));
}

// Giving a port back (unsubscribe, drain) must not delete a rule: with
// iptables-nft a deleting restore waits, when it closes its netlink
// socket, for the kernel to free the rule after an RCU grace period (2 s
// seen on two loaded cores, the agent's drain with them), holding the
// netns's commit mutex, so the other family's restore waited too.
TEST(IptablesSteering, GivingAPortBackDeletesNothing) {
  auto m = make(options(/*v6=*/true));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  Steering& s = **m->steering;
  ASSERT_TRUE(s.addPort(8080).ok());
  m->journal.clear();
  ASSERT_TRUE(s.removePort(8080).ok());
  ASSERT_EQ(m->journal.size(), 2u);
  for (const std::string& e : m->journal) {
    const std::string input = e.substr(e.find('|') + 1);
    for (const char* deleting : {"\n-D ", "\n-F ", "\n-X ", "\n-R "}) {
      EXPECT_EQ(input.find(deleting), std::string::npos) << e;
    }
    EXPECT_THAT(input,
                HasSubstr("-I SIPHON_00000abc_a1b2c3_PRE 1 -p tcp -m tcp --dport 8080 -j RETURN"));
    EXPECT_THAT(input,
                HasSubstr("-I SIPHON_00000abc_a1b2c3_OUT 1 -p tcp -m tcp --dport 8080 -j RETURN"));
  }
}

// A port steered again after it was given back takes out its RETURN: its
// REDIRECT is still there (never doubled).
TEST(IptablesSteering, APortStolenAgainLosesItsReturnOnly) {
  auto m = make(options(/*v6=*/true));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  Steering& s = **m->steering;
  ChainNames c = chainNamesFor(kInode, kOwner);
  ASSERT_TRUE(s.addPort(80).ok());
  ASSERT_TRUE(s.removePort(80).ok());
  m->journal.clear();
  ASSERT_TRUE(s.addPort(80).ok());
  ASSERT_TRUE(s.removePort(80).ok());
  EXPECT_THAT(m->journal, ElementsAre("iptables-nft-restore|" + reclaimPortRules(c, 80),
                                      "ip6tables-nft-restore|" + reclaimPortRules(c, 80),
                                      "iptables-nft-restore|" + releasePortRules(c, 80),
                                      "ip6tables-nft-restore|" + releasePortRules(c, 80)));
  // IPv6 failing while stealing it again: IPv4 gets its RETURN back.
  m->journal.clear();
  m->runner->fail_ = "ip6tables-nft-restore";
  EXPECT_FALSE(s.addPort(80).ok());
  EXPECT_THAT(m->journal, ElementsAre("iptables-nft-restore|" + reclaimPortRules(c, 80),
                                      "ip6tables-nft-restore|" + reclaimPortRules(c, 80),
                                      "iptables-nft-restore|" + releasePortRules(c, 80)));
}

// Each family is given back even when the other's restore fails.
TEST(IptablesSteering, EachFamilyIsGivenBackWhenTheOtherFails) {
  auto m = make(options(/*v6=*/true));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  Steering& s = **m->steering;
  ChainNames c = chainNamesFor(kInode, kOwner);
  ASSERT_TRUE(s.addPort(80).ok());
  m->journal.clear();
  m->runner->fail_ = "iptables-nft-restore";
  absl::Status st = s.removePort(80);
  EXPECT_THAT(std::string(st.message()), HasSubstr("iptables-nft-restore: exit 1"));
  EXPECT_THAT(m->journal, ElementsAre("iptables-nft-restore|" + releasePortRules(c, 80),
                                      "ip6tables-nft-restore|" + releasePortRules(c, 80)));
}

TEST(IptablesSteering, LegacyRetriesTheXtablesLockEvery10Ms) {
  auto m = make(options(/*v6=*/true, "legacy"));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  ASSERT_TRUE((*m->steering)->addPort(80).ok());  // the fake checks the arguments
  EXPECT_THAT(restores(m->journal), testing::Contains(HasSubstr("iptables-legacy-restore|")));
}

TEST(IptablesSteering, NoIp6tablesWithoutAnIpv6Listener) {
  auto m = make(options(/*v6=*/false),
                {"iptables-nft-save", "iptables-nft-restore"});  // no ip6tables at all
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  ASSERT_TRUE((*m->steering)->addPort(8080).ok());
  for (const auto& e : m->journal) EXPECT_EQ(e.find("ip6tables"), std::string::npos) << e;
}

TEST(IptablesSteering, AnIpv6FailureRollsTheIpv4RuleBack) {
  auto m = make(options(/*v6=*/true));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  ChainNames c = chainNamesFor(kInode, kOwner);
  m->journal.clear();
  m->runner->fail_ = "ip6tables-nft-restore";
  absl::Status st = (*m->steering)->addPort(80);
  EXPECT_THAT(std::string(st.message()), HasSubstr("ip6tables-nft-restore: exit 1"));
  EXPECT_THAT(m->journal, ElementsAre("iptables-nft-restore|" + addPortRules(c, 80, 40004),
                                      "ip6tables-nft-restore|" + addPortRules(c, 80, 40006),
                                      "iptables-nft-restore|" + removePortRules(c, 80, 40004)));
  // Not recorded as steered: a retry adds it again.
  m->runner->fail_.clear();
  m->journal.clear();
  ASSERT_TRUE((*m->steering)->addPort(80).ok());
  EXPECT_EQ(m->journal.size(), 2u);
}

TEST(IptablesSteering, MissingToolsAreAFailedPrecondition) {
  auto m = make(options(false), {});
  EXPECT_EQ(m->steering.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(m->steering.status().message()), HasSubstr("not found"));
  // IPv6 wanted but only the IPv4 tools there.
  auto m6 = make(options(true), {"iptables-nft-save", "iptables-nft-restore"});
  EXPECT_EQ(m6->steering.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(IptablesSteering, AutoFollowsTheFlavourWithRules) {
  auto m = make(options(false), kAllTools,
                {{"iptables-legacy-save", "*nat\n-A PREROUTING -j ISTIO_INBOUND\nCOMMIT\n"}});
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  ChainNames c = chainNamesFor(kInode, kOwner);
  EXPECT_THAT(restores(m->journal), ElementsAre(std::string("lock ") + kOwner, "guard start",
                                                "iptables-legacy-restore|" + installRules(c)));
  // An explicit choice wins.
  auto n = make(options(false, "nft"), kAllTools,
                {{"iptables-legacy-save", "*nat\n-A PREROUTING -j ISTIO_INBOUND\nCOMMIT\n"}});
  ASSERT_TRUE(n->steering.ok()) << n->steering.status();
  EXPECT_THAT(restores(n->journal), ElementsAre(std::string("lock ") + kOwner, "guard start",
                                                "iptables-nft-restore|" + installRules(c)));
}

TEST(IptablesSteering, StaleChainsOfTheTargetAreRemovedFirstInEveryFlavour) {
  ChainNames c = chainNamesFor(kInode, kOwner);
  std::string stale = "*nat\n:PREROUTING ACCEPT [0:0]\n:" + c.pre + " - [0:0]\n-A PREROUTING -j " +
                      c.pre + "\nCOMMIT\n";
  auto m = make(options(true), kAllTools,
                {{"iptables-legacy-save", stale}, {"ip6tables-nft-save", stale}});
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  std::string removal = removeAllRules(parseNatSave(stale, c), c);
  EXPECT_THAT(restores(m->journal),
              // Our pinned owner's own leftovers (its lock was free).
              ElementsAre(std::string("lock ") + kOwner, "ip6tables-nft-restore|" + removal,
                          "iptables-legacy-restore|" + removal, std::string("lock ") + kOwner,
                          "guard start",
                          // The stale rules are gone from the counts in a
                          // real netns; the fake still shows one legacy rule.
                          "iptables-legacy-restore|" + installRules(c),
                          "ip6tables-legacy-restore|" + installRules(c)));
}

TEST(IptablesSteering, StopRemovesWhatTheSaveShowsThenStopsTheGuard) {
  ChainNames c = chainNamesFor(kInode, kOwner);
  // The save shows our chains, as the kernel would once installed.
  std::string live = "*nat\n:" + c.pre + " - [0:0]\n:" + c.out + " - [0:0]\n-A PREROUTING -j " +
                     c.pre + "\n-A OUTPUT -j " + c.out + "\nCOMMIT\n";
  auto m2 = make(options(false), kAllTools, {{"iptables-nft-save", live}});
  ASSERT_TRUE(m2->steering.ok()) << m2->steering.status();
  m2->journal.clear();
  (*m2->steering)->stop();
  (*m2->steering)->stop();  // once only
  EXPECT_THAT(restores(m2->journal),
              ElementsAre("iptables-nft-restore|" + removeAllRules(parseNatSave(live, c), c),
                          "guard stop"));
  EXPECT_EQ((*m2->steering)->addPort(80).code(), absl::StatusCode::kFailedPrecondition);
}

// Ports still steered at stop go back add-only before the chains are
// deleted (that restore waits for the kernel to free the rules).
TEST(IptablesSteering, StopGivesThePortsBackBeforeDeletingTheChains) {
  ChainNames c = chainNamesFor(kInode, kOwner);
  std::string live = "*nat\n:" + c.pre + " - [0:0]\n:" + c.out + " - [0:0]\n-A PREROUTING -j " +
                     c.pre + "\n-A OUTPUT -j " + c.out + "\nCOMMIT\n";
  auto m = make(options(false), kAllTools, {{"iptables-nft-save", live}});
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  ASSERT_TRUE((*m->steering)->addPort(80).ok());
  ASSERT_TRUE((*m->steering)->addPort(443).ok());
  m->journal.clear();
  (*m->steering)->stop();
  EXPECT_THAT(
      restores(m->journal),
      ElementsAre("iptables-nft-restore|" + releasePortRules(c, 80) + releasePortRules(c, 443),
                  "iptables-nft-restore|" + removeAllRules(parseNatSave(live, c), c),
                  "guard stop"));
}

TEST(IptablesSteering, ALostGuardRemovesTheChainsAndRefusesNewPorts) {
  ChainNames c = chainNamesFor(kInode, kOwner);
  std::string live = "*nat\n:" + c.pre + " - [0:0]\n-A PREROUTING -j " + c.pre + "\nCOMMIT\n";
  auto m = make(options(false), kAllTools, {{"iptables-nft-save", live}});
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  ASSERT_TRUE(m->on_lost);
  m->journal.clear();
  m->on_lost();
  EXPECT_THAT(restores(m->journal),
              ElementsAre("iptables-nft-restore|" + removeAllRules(parseNatSave(live, c), c)));
  EXPECT_EQ((*m->steering)->addPort(80).code(), absl::StatusCode::kUnavailable);
  m->journal.clear();
  (*m->steering)->stop();  // nothing more to remove
  EXPECT_THAT(restores(m->journal), ElementsAre("guard stop"));
}

// Two agents on one target: another live agent's chains stay, a dead
// agent's go, as do the owner-less chains of an agent before owner ids.
TEST(IptablesSteering, OnlyChainsOfDeadOwnersAreRemovedAtStart) {
  auto chainsOf = [](const std::string& owner) {
    ChainNames c = chainNamesFor(kInode, owner);
    return ":" + c.pre + " - [0:0]\n:" + c.out + " - [0:0]\n-A PREROUTING -j " + c.pre +
           "\n-A OUTPUT -j " + c.out + "\n";
  };
  const std::string save =
      "*nat\n" + chainsOf("0f0f0f") + chainsOf("dead00") + chainsOf("") + "COMMIT\n";
  auto m = make(options(false), kAllTools, {{"iptables-nft-save", save}}, "", {"0f0f0f"});
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  auto removal = [&](const std::string& owner) {
    ChainNames c = chainNamesFor(kInode, owner);
    return "iptables-nft-restore|" + removeAllRules(parseNatSave(save, c), c);
  };
  EXPECT_THAT(restores(m->journal),
              ElementsAre("lock ", removal(""), "lock dead00", removal("dead00"),
                          std::string("lock ") + kOwner, "guard start",
                          "iptables-nft-restore|" + installRules(chainNamesFor(kInode, kOwner))));
  for (const auto& e : m->journal)
    EXPECT_EQ(e.find("-D PREROUTING -j SIPHON_00000abc_0f0f0f"), std::string::npos) << e;

  // The same sweep on its own (the agent's start-up, whatever its backend).
  Journal journal;
  FakeRunner runner(&journal, kAllTools, {{"ip6tables-legacy-save", save}});
  auto removed = removeStaleIptablesChains(runner, kInode, fakeLock(&journal, {"0f0f0f"}));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 2);
  EXPECT_THAT(restores(journal),
              ElementsAre("lock ",
                          "ip6tables-legacy-restore|" +
                              removeAllRules(parseNatSave(save, chainNamesFor(kInode, "")),
                                             chainNamesFor(kInode, "")),
                          "lock dead00",
                          "ip6tables-legacy-restore|" +
                              removeAllRules(parseNatSave(save, chainNamesFor(kInode, "dead00")),
                                             chainNamesFor(kInode, "dead00"))));
}

TEST(IptablesSteering, AFreshOwnerIdUnlessOneIsPinnedAndFree) {
  IptablesOptions o = options(false);
  o.owner.clear();
  auto m = make(o);
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  Journal r = restores(m->journal);
  ASSERT_EQ(r.size(), 3u);
  ASSERT_EQ(r[0].rfind("lock ", 0), 0u);
  const std::string owner = r[0].substr(5);
  EXPECT_TRUE(validOwnerId(owner)) << owner;
  EXPECT_EQ(r[2], "iptables-nft-restore|" + installRules(chainNamesFor(kInode, owner)));

  // A pinned owner that a live agent holds is refused, nothing installed.
  auto held = make(options(false), kAllTools, {}, "", {kOwner});
  EXPECT_EQ(held->steering.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(restores(held->journal), ElementsAre());

  IptablesOptions bad = options(false);
  bad.owner = "XYZ";
  EXPECT_EQ(make(bad)->steering.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(IptablesSteering, BadOptions) {
  IptablesOptions o = options(false);
  o.listeners.v4 = -1;
  EXPECT_EQ(make(o)->steering.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make(options(false, "both"))->steering.status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace siphon::agent::steal
