#include "agent/dns/hosts_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace siphon::agent::dns {
namespace {

using ::testing::ElementsAre;
using ::testing::Optional;

// What a Kubernetes pod's /etc/hosts looks like, plus the odd lines.
constexpr char kHosts[] =
    "# Kubernetes-managed hosts file.\n"
    "127.0.0.1\tlocalhost\n"
    "::1\tlocalhost ip6-localhost ip6-loopback\n"
    "fe00::0\tip6-localnet\n"
    "10.244.1.7\tmy-pod.my-svc.default.svc.cluster.local\tmy-pod\n"
    "\n"
    "# Entries added by HostAliases.\n"
    "10.1.2.3\tfoo.local\tbar.local   # trailing comment\n"
    "10.1.2.4 foo.local\n"
    "2001:db8::10 dual.example Dual-Alias\n"
    "10.0.0.10    dual.example\n"
    "10.1.2.3 again.example\n"
    "not-an-address some.name\n"
    "10.9.9.9\n"
    "   10.8.8.8   indented.example\n"
    "#10.7.7.7 commented.example\n";

TEST(HostsFileTest, ParsesEntriesAndSkipsBadLines) {
  HostsFile h = HostsFile::parse(kHosts);
  ASSERT_EQ(h.entries().size(), 10u);
  EXPECT_EQ(h.entries()[0].address.text, "127.0.0.1");
  EXPECT_THAT(h.entries()[1].names, ElementsAre("localhost", "ip6-localhost", "ip6-loopback"));
  EXPECT_EQ(h.entries()[2].address.text, "fe00::");
  EXPECT_THAT(h.entries()[4].names, ElementsAre("foo.local", "bar.local"));
  EXPECT_EQ(h.entries()[9].address.text, "10.8.8.8");
}

TEST(HostsFileTest, LookupByCanonicalNameOrAliasCaseInsensitive) {
  HostsFile h = HostsFile::parse(kHosts);
  auto m = h.lookup("my-pod", Family::kAny);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->canonical, "my-pod.my-svc.default.svc.cluster.local");
  EXPECT_THAT(m->addresses, ElementsAre("10.244.1.7"));

  m = h.lookup("BAR.local", Family::kAny);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->canonical, "foo.local");
  EXPECT_THAT(m->addresses, ElementsAre("10.1.2.3"));

  EXPECT_TRUE(h.lookup("indented.example", Family::kAny).has_value());
  EXPECT_FALSE(h.lookup("commented.example", Family::kAny).has_value());
  EXPECT_FALSE(h.lookup("some.name", Family::kAny).has_value());
  EXPECT_FALSE(h.lookup("my-pod.", Family::kAny).has_value()) << "names match as written";
  EXPECT_FALSE(h.lookup("trailing", Family::kAny).has_value());
}

TEST(HostsFileTest, EveryMatchingLineInFileOrder) {
  HostsFile h = HostsFile::parse(kHosts);
  auto m = h.lookup("foo.local", Family::kAny);
  ASSERT_TRUE(m.has_value());
  EXPECT_THAT(m->addresses, ElementsAre("10.1.2.3", "10.1.2.4"));
}

TEST(HostsFileTest, FamilyFiltering) {
  HostsFile h = HostsFile::parse(kHosts);
  auto any = h.lookup("dual.example", Family::kAny);
  ASSERT_TRUE(any.has_value());
  EXPECT_THAT(any->addresses, ElementsAre("2001:db8::10", "10.0.0.10"));
  EXPECT_EQ(any->canonical, "dual.example");

  auto v4 = h.lookup("dual.example", Family::kInet);
  ASSERT_TRUE(v4.has_value());
  EXPECT_THAT(v4->addresses, ElementsAre("10.0.0.10"));

  auto v6 = h.lookup("dual-alias", Family::kInet6);
  ASSERT_TRUE(v6.has_value());
  EXPECT_THAT(v6->addresses, ElementsAre("2001:db8::10"));

  // Only an IPv4 line: an IPv6 lookup finds nothing here and goes to DNS.
  EXPECT_FALSE(h.lookup("foo.local", Family::kInet6).has_value());
  EXPECT_FALSE(h.lookup("dual-alias", Family::kInet).has_value());

  auto localhost6 = h.lookup("localhost", Family::kInet6);
  ASSERT_TRUE(localhost6.has_value());
  EXPECT_THAT(localhost6->addresses, ElementsAre("::1"));
}

TEST(HostsFileTest, ReverseGivesTheNamesOfTheFirstLine) {
  HostsFile h = HostsFile::parse(kHosts);
  auto ip = parseIp("10.1.2.3");
  ASSERT_TRUE(ip.has_value());
  EXPECT_THAT(h.reverse(*ip), Optional(ElementsAre("foo.local", "bar.local")));

  auto v6 = parseIp("2001:0db8:0000::0010");
  ASSERT_TRUE(v6.has_value());
  EXPECT_THAT(h.reverse(*v6), Optional(ElementsAre("dual.example", "Dual-Alias")));

  auto none = parseIp("10.99.99.99");
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(h.reverse(*none).has_value());
}

TEST(HostsFileTest, EmptyFile) {
  HostsFile h = HostsFile::parse("");
  EXPECT_TRUE(h.entries().empty());
  EXPECT_FALSE(h.lookup("localhost", Family::kAny).has_value());
}

}  // namespace
}  // namespace siphon::agent::dns
