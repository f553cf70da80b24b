// The credentials the file helper takes, from /proc/PID/status text.
#include "agent/target/credentials.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace siphon::agent {
namespace {

constexpr char kStatus[] =
    "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1001\t1002\t1003\n"
    "Gid:\t2000\t2001\t2002\t2003\nFDSize:\t64\nGroups:\t10 20 30 \nCapInh:\t0000000000000000\n"
    "CapPrm:\t00000000a80425fb\nCapEff:\t0000000000000003\nCapBnd:\t000001ffffffffff\n";

TEST(CredentialsTest, ParsesIdsGroupsAndCapabilities) {
  auto c = parseProcStatus(kStatus);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->uid, (std::array<uint32_t, 4>{1000, 1001, 1002, 1003}));
  EXPECT_EQ(c->gid, (std::array<uint32_t, 4>{2000, 2001, 2002, 2003}));
  EXPECT_EQ(c->groups, (std::vector<uint32_t>{10, 20, 30}));
  EXPECT_EQ(c->cap_permitted, 0xa80425fbu);
  EXPECT_EQ(c->cap_effective, 3u);
  EXPECT_EQ(c->cap_inheritable, 0u);
}

TEST(CredentialsTest, MissingOrMalformedLinesAreErrors) {
  EXPECT_FALSE(parseProcStatus("Uid:\t1\t1\t1\t1\n").ok());
  std::string bad = kStatus;
  bad.replace(bad.find("1001"), 4, "x");
  EXPECT_FALSE(parseProcStatus(bad).ok());
  EXPECT_TRUE(parseProcStatus(std::string(kStatus) + "Groups:\t\n").ok()) << "no groups is fine";
}

TEST(CredentialsTest, OwnIdsHaveNoCapabilities) {
  const Credentials c = ownIdsWithoutCapabilities();
  EXPECT_EQ(c.uid[1], ::geteuid());
  EXPECT_EQ(c.gid[1], ::getegid());
  EXPECT_EQ(c.cap_effective | c.cap_permitted | c.cap_inheritable, 0u);
}

}  // namespace
}  // namespace siphon::agent
