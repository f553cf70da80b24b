#include "agent/steal/iptables/iptables_steering.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
      EXPECT_THAT(args, ElementsAre("--noflush", "-w", "5"));
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

IptablesOptions options(bool v6, std::string flavor = "auto") {
  IptablesOptions o;
  o.netns_fd = 99;  // never used by the fakes
  o.netns_inode = kInode;
  o.listeners = Listeners{5, v6 ? 6 : -1, 40004, static_cast<uint16_t>(v6 ? 40006 : 0)};
  o.flavor = std::move(flavor);
  return o;
}

struct Made {
  Journal journal;
  std::function<void()> on_lost;
  FakeRunner* runner = nullptr;
  absl::StatusOr<std::unique_ptr<Steering>> steering;
};

std::unique_ptr<Made> make(IptablesOptions o, std::set<std::string> tools = kAllTools,
                           std::map<std::string, std::string> saves = {}, std::string fail = "") {
  auto m = std::make_unique<Made>();
  auto runner = std::make_unique<FakeRunner>(&m->journal, std::move(tools), std::move(saves));
  runner->fail_ = std::move(fail);
  m->runner = runner.get();
  m->steering = makeIptablesSteering(std::move(o), std::move(runner),
                                     std::make_unique<FakeGuard>(&m->journal, &m->on_lost));
  return m;
}

// The restore calls only.
Journal restores(const Journal& j) {
  Journal out;
  for (const auto& e : j) {
    if (e.find("-restore|") != std::string::npos || e.rfind("guard", 0) == 0) out.push_back(e);
  }
  return out;
}

TEST(IptablesSteering, StartsTheGuardBeforeInstallingInTheNftDefault) {
  auto m = make(options(/*v6=*/false));
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  EXPECT_EQ((*m->steering)->name(), "iptables");
  ChainNames c = chainNamesFor(kInode);
  EXPECT_THAT(restores(m->journal),
              ElementsAre("guard start", "iptables-nft-restore|" + installRules(c)));
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
  ChainNames c = chainNamesFor(kInode);
  m->journal.clear();
  ASSERT_TRUE(s.addPort(80).ok());
  ASSERT_TRUE(s.addPort(80).ok());     // no-op
  ASSERT_TRUE(s.removePort(81).ok());  // not steered: no-op
  ASSERT_TRUE(s.removePort(80).ok());
  ASSERT_TRUE(s.removePort(80).ok());  // no-op
  EXPECT_THAT(m->journal, ElementsAre("iptables-nft-restore|" + addPortRules(c, 80, 40004),
                                      "ip6tables-nft-restore|" + addPortRules(c, 80, 40006),
                                      "iptables-nft-restore|" + removePortRules(c, 80, 40004),
                                      "ip6tables-nft-restore|" + removePortRules(c, 80, 40006)));
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
  ChainNames c = chainNamesFor(kInode);
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
  ChainNames c = chainNamesFor(kInode);
  EXPECT_THAT(restores(m->journal),
              ElementsAre("guard start", "iptables-legacy-restore|" + installRules(c)));
  // An explicit choice wins.
  auto n = make(options(false, "nft"), kAllTools,
                {{"iptables-legacy-save", "*nat\n-A PREROUTING -j ISTIO_INBOUND\nCOMMIT\n"}});
  ASSERT_TRUE(n->steering.ok()) << n->steering.status();
  EXPECT_THAT(restores(n->journal),
              ElementsAre("guard start", "iptables-nft-restore|" + installRules(c)));
}

TEST(IptablesSteering, StaleChainsOfTheTargetAreRemovedFirstInEveryFlavour) {
  ChainNames c = chainNamesFor(kInode);
  std::string stale = "*nat\n:PREROUTING ACCEPT [0:0]\n:" + c.pre + " - [0:0]\n-A PREROUTING -j " +
                      c.pre + "\nCOMMIT\n";
  auto m = make(options(true), kAllTools,
                {{"iptables-legacy-save", stale}, {"ip6tables-nft-save", stale}});
  ASSERT_TRUE(m->steering.ok()) << m->steering.status();
  std::string removal = removeAllRules(parseNatSave(stale, c), c);
  EXPECT_THAT(restores(m->journal), ElementsAre("ip6tables-nft-restore|" + removal,
                                                "iptables-legacy-restore|" + removal, "guard start",
                                                // The stale rules are gone from the counts in a
                                                // real netns; the fake still shows one legacy rule.
                                                "iptables-legacy-restore|" + installRules(c),
                                                "ip6tables-legacy-restore|" + installRules(c)));
}

TEST(IptablesSteering, StopRemovesWhatTheSaveShowsThenStopsTheGuard) {
  ChainNames c = chainNamesFor(kInode);
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

TEST(IptablesSteering, ALostGuardRemovesTheChainsAndRefusesNewPorts) {
  ChainNames c = chainNamesFor(kInode);
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

TEST(IptablesSteering, BadOptions) {
  IptablesOptions o = options(false);
  o.listeners.v4 = -1;
  EXPECT_EQ(make(o)->steering.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(make(options(false, "both"))->steering.status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace siphon::agent::steal
