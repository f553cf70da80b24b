// The reaper (reaper.h) against the kernel: leftovers of a dead pid are
// removed, those of a live pid (this test's own) are not.
#include "tests/privileged/harness/reaper.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/privileged/harness/privileged_test.h"

namespace siphon::harness {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

bool netnsExists(const std::string& name) {
  return access(("/var/run/netns/" + name).c_str(), F_OK) == 0;
}

TEST(ReaperNames, CarryTheCreatorsPid) {
  EXPECT_EQ(pidAfter("siphon-test-1234-abcdef", kNetnsPrefix, '-'), 1234);
  EXPECT_EQ(pidAfter("sx99-0a1b2c3d4e", kLinkPrefix, '-'), 99);
  EXPECT_EQ(pidAfter("STEST_4194304_abcdef", kChainPrefix, '_'), 4194304);
  for (const char* other :
       {"siphon-test-", "siphon-test-12", "siphon-test-x12-ab", "siphon-test--ab", "sb-c-abc",
        "eth0", "sx-1", "SIPHON_PRE_1", "STEST_0_ab", "siphon-test-12a-ff"}) {
    EXPECT_FALSE(pidAfter(other, kNetnsPrefix, '-') || pidAfter(other, kLinkPrefix, '-') ||
                 pidAfter(other, kChainPrefix, '_'))
        << other;
  }
  const std::string link = ownedLinkName();
  EXPECT_EQ(link.size(), 15u) << link;
  EXPECT_EQ(pidAfter(link, kLinkPrefix, '-'), getpid());
  EXPECT_EQ(pidAfter(ownedChainName(), kChainPrefix, '_'), getpid());
  EXPECT_TRUE(pidAlive(getpid()));
  EXPECT_FALSE(pidAlive(deadPid()));
}

class ReaperTest : public PrivilegedTest {
 protected:
  ReaperTest() : PrivilegedTest("needs root: creates network namespaces, links and chains") {}
};

TEST_F(ReaperTest, RemovesTheNamespacesOfDeadPidsOnly) {
  const pid_t dead = deadPid();
  ASSERT_GT(dead, 0);
  const std::string leftover =
      std::string(kNetnsPrefix) + std::to_string(dead) + "-" + randomHex(6);
  ASSERT_EQ(run({"ip", "netns", "add", leftover}).exit_code, 0);
  atTearDown([leftover] {
    if (netnsExists(leftover)) run({"ip", "netns", "del", leftover});
  });
  NetNs& mine = addNetns();  // siphon-test-<our pid>-...

  Reaped r;
  reapNamespaces(&r);
  EXPECT_THAT(r.errors, ::testing::IsEmpty());
  EXPECT_THAT(r.removed, Contains("netns " + leftover));
  EXPECT_FALSE(netnsExists(leftover));
  EXPECT_TRUE(netnsExists(mine.name())) << "a live pid's namespace was removed";
}

TEST_F(ReaperTest, RemovesTheLinksAndChainsOfDeadPidsOnly) {
  NetNs& scratch = addNetns();
  const pid_t dead = deadPid();
  const std::string dead_link = ownedLinkName(dead), dead_peer = ownedLinkName(dead);
  const std::string live_link = ownedLinkName(), live_peer = ownedLinkName();
  const std::string dead_chain = ownedChainName(dead), dead_chain2 = ownedChainName(dead);
  const std::string live_chain = ownedChainName();
  // Inside the scratch namespace: the reaper works on the calling thread's
  // namespace, and the machine's own links and chains stay out of it.
  inNetns(scratch.name(), [&] {
    for (const auto& argv : std::vector<std::vector<std::string>>{
             {"ip", "link", "add", dead_link, "type", "veth", "peer", "name", dead_peer},
             {"ip", "link", "add", live_link, "type", "veth", "peer", "name", live_peer},
             {"iptables", "-w", "-N", dead_chain},
             {"iptables", "-w", "-N", dead_chain2},
             {"iptables", "-w", "-N", live_chain},
             // Jumps into the dead chains: from a built-in chain, from a live
             // chain, and between the two dead ones.
             {"iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", dead_chain},
             {"iptables", "-w", "-A", live_chain, "-j", dead_chain},
             {"iptables", "-w", "-A", dead_chain, "-j", dead_chain2},
             {"iptables", "-w", "-t", "nat", "-N", dead_chain},
             {"iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-j", dead_chain},
         }) {
      Result res = run(argv);
      ASSERT_EQ(res.exit_code, 0) << argv[0] << " " << argv[1] << " " << argv[2] << ": " << res;
    }
    Reaped r;
    reapLinks(&r);
    reapChains(&r);
    EXPECT_THAT(r.errors, ::testing::IsEmpty());
    Result links = run({"ip", "-o", "link", "show"});
    EXPECT_THAT(links.out, Not(HasSubstr(dead_link)));
    EXPECT_THAT(links.out, Not(HasSubstr(dead_peer)));
    EXPECT_THAT(links.out, HasSubstr(live_link));
    EXPECT_THAT(links.out, HasSubstr(live_peer));
    Result filter = run({"iptables", "-w", "-S"});
    EXPECT_THAT(filter.out, Not(HasSubstr(dead_chain)));
    EXPECT_THAT(filter.out, Not(HasSubstr(dead_chain2)));
    EXPECT_THAT(filter.out, HasSubstr("-N " + live_chain));
    Result nat = run({"iptables", "-w", "-t", "nat", "-S"});
    EXPECT_THAT(nat.out, Not(HasSubstr(dead_chain)));
  });
}

}  // namespace
}  // namespace siphon::harness
