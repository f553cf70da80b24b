#include "agent/steal/source_prefix.h"

#include <gtest/gtest.h>

namespace siphon::agent::steal {
namespace {

TEST(SourcePrefix, AddressesAndPrefixesOfBothFamilies) {
  auto host = parseSourcePrefix("10.1.2.3");
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->family, AF_INET);
  EXPECT_EQ(host->bits, 32);
  EXPECT_EQ(host->text(), "10.1.2.3/32");
  auto net = parseSourcePrefix("10.1.2.3/16");  // host bits cleared
  ASSERT_TRUE(net.ok());
  EXPECT_EQ(net->text(), "10.1.0.0/16");
  auto odd = parseSourcePrefix("10.1.255.3/20");
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->text(), "10.1.240.0/20");
  auto v6 = parseSourcePrefix("fd00:1::5/64");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->family, AF_INET6);
  EXPECT_EQ(v6->text(), "fd00:1::/64");
  EXPECT_EQ(parseSourcePrefix("::1")->text(), "::1/128");
  EXPECT_EQ(parseSourcePrefix("0.0.0.0/0")->text(), "0.0.0.0/0");
}

TEST(SourcePrefix, IPv4IsKeyedAsV4MappedIPv6) {
  auto p = parseSourcePrefix("192.168.7.0/24");
  ASSERT_TRUE(p.ok());
  const std::array<uint8_t, 16> want = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 7, 0};
  EXPECT_EQ(p->mapped(), want);
  EXPECT_EQ(p->mappedBits(), 120u);
  auto v6 = parseSourcePrefix("fd00::/8");
  EXPECT_EQ(v6->mappedBits(), 8u);
}

TEST(SourcePrefix, BadInputSaysWhatIsWrong) {
  EXPECT_EQ(parseSourcePrefix("node-1").status().message(),
            "\"node-1\" is not an IPv4 or IPv6 address (CIDR: ADDR[/BITS])");
  EXPECT_EQ(parseSourcePrefix("10.0.0.1/33").status().message(),
            "\"33\" is not a prefix length (0-32)");
  EXPECT_EQ(parseSourcePrefix("fd00::/129").status().message(),
            "\"129\" is not a prefix length (0-128)");
  EXPECT_FALSE(parseSourcePrefix("10.0.0.1/").ok());
  EXPECT_FALSE(parseSourcePrefix("10.0.0.1/-1").ok());
  EXPECT_FALSE(parseSourcePrefix("10.0.0.1/8x").ok());
}

}  // namespace
}  // namespace siphon::agent::steal
