#include "agent/dns/dns_names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <string>

namespace siphon::agent::dns {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DnsNamesTest, ValidNames) {
  EXPECT_TRUE(validateName("example.com").ok());
  EXPECT_TRUE(validateName("example.com.").ok());
  EXPECT_TRUE(validateName("short").ok());
  EXPECT_TRUE(validateName("_sip._tcp.example.com").ok());
  EXPECT_TRUE(validateName("xn--bcher-kva.example").ok());
  std::string label63(63, 'a');
  EXPECT_TRUE(validateName(label63 + ".example").ok());
  // 253 bytes: four labels of 63 and one dot each, minus the last byte.
  std::string longest = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  ASSERT_EQ(longest.size(), 253u);
  EXPECT_TRUE(validateName(longest).ok());
  EXPECT_TRUE(validateName(longest + ".").ok()) << "the trailing dot does not count";
}

TEST(DnsNamesTest, InvalidNames) {
  auto message = [](std::string_view n) { return std::string(validateName(n).message()); };
  EXPECT_EQ(validateName("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message(""), HasSubstr("empty name"));
  EXPECT_THAT(message("."), HasSubstr("empty name"));
  EXPECT_THAT(message("a..b"), HasSubstr("empty label"));
  EXPECT_THAT(message(".a"), HasSubstr("empty label"));
  EXPECT_THAT(message("a.."), HasSubstr("empty label"));
  EXPECT_THAT(message(std::string(64, 'a') + ".example"), HasSubstr("label of 64 bytes"));
  std::string label63(63, 'a');
  std::string too_long = label63 + "." + label63 + "." + label63 + "." + std::string(62, 'b');
  ASSERT_EQ(too_long.size(), 254u);
  EXPECT_THAT(message(too_long), HasSubstr("too long"));
  EXPECT_THAT(message("has space.example"), HasSubstr("blank"));
  EXPECT_THAT(message("tab\t.example"), HasSubstr("control"));
  EXPECT_THAT(message(std::string("nul\0.example", 12)), HasSubstr("control"));
}

TEST(DnsNamesTest, SearchFewerDotsThanNdotsTriesTheSearchListFirst) {
  std::vector<std::string> search = {"default.svc.cluster.local", "svc.cluster.local",
                                     "cluster.local"};
  EXPECT_THAT(searchCandidates("kubernetes", search, 5),
              ElementsAre("kubernetes.default.svc.cluster.local", "kubernetes.svc.cluster.local",
                          "kubernetes.cluster.local", "kubernetes"));
  EXPECT_THAT(
      searchCandidates("api.example.com", search, 5),
      ElementsAre("api.example.com.default.svc.cluster.local", "api.example.com.svc.cluster.local",
                  "api.example.com.cluster.local", "api.example.com"));
}

TEST(DnsNamesTest, SearchEnoughDotsTriesTheNameFirst) {
  std::vector<std::string> search = {"a.example", "b.example"};
  EXPECT_THAT(
      searchCandidates("www.example.com", search, 1),
      ElementsAre("www.example.com", "www.example.com.a.example", "www.example.com.b.example"));
  EXPECT_THAT(searchCandidates("x.y", search, 2),
              ElementsAre("x.y.a.example", "x.y.b.example", "x.y"));
  EXPECT_THAT(searchCandidates("x.y", search, 1),
              ElementsAre("x.y", "x.y.a.example", "x.y.b.example"));
  // ndots:0: even a single label is tried as it is first.
  EXPECT_THAT(searchCandidates("short", search, 0),
              ElementsAre("short", "short.a.example", "short.b.example"));
}

TEST(DnsNamesTest, TrailingDotIsTheNameOnly) {
  EXPECT_THAT(searchCandidates("short.", {"a.example"}, 5), ElementsAre("short."));
  EXPECT_THAT(searchCandidates("www.example.com.", {"a.example"}, 1),
              ElementsAre("www.example.com."));
}

TEST(DnsNamesTest, NoSearchListIsTheNameOnly) {
  EXPECT_THAT(searchCandidates("short", {}, 1), ElementsAre("short"));
}

TEST(DnsNamesTest, SearchSkipsDuplicatesEmptyDomainsAndTooLongNames) {
  std::string label63(63, 'd');
  // 252 bytes: valid alone, too long once "host." is put in front.
  std::string long_domain = label63 + "." + label63 + "." + label63 + "." + std::string(60, 'e');
  ASSERT_TRUE(validateName(long_domain).ok());
  EXPECT_THAT(
      searchCandidates("host", {"a.example", ".", "A.EXAMPLE", long_domain, ".b.example"}, 1),
      ElementsAre("host.a.example", "host.b.example", "host"));
}

TEST(DnsNamesTest, ParseIp) {
  auto v4 = parseIp("10.11.12.13");
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->family, AF_INET);
  EXPECT_EQ(v4->text, "10.11.12.13");
  EXPECT_EQ(v4->bytes, std::string("\x0a\x0b\x0c\x0d", 4));

  auto v6 = parseIp("2001:DB8:0000::1");
  ASSERT_TRUE(v6.has_value());
  EXPECT_EQ(v6->family, AF_INET6);
  EXPECT_EQ(v6->text, "2001:db8::1");
  EXPECT_EQ(v6->bytes.size(), 16u);

  auto mapped = parseIp("::ffff:10.1.2.3");
  ASSERT_TRUE(mapped.has_value());
  EXPECT_EQ(mapped->family, AF_INET6);

  for (const char* bad : {"", "10.1", "10.0.0.256", "1.2.3.4.5", "example.com", "fe80::1%eth0",
                          "[::1]", " 10.0.0.1", "10.0.0.1 ", "::g"}) {
    EXPECT_FALSE(parseIp(bad).has_value()) << bad;
  }
}

TEST(DnsNamesTest, ReverseNames) {
  EXPECT_EQ(reverseName(*parseIp("10.11.12.13")), "13.12.11.10.in-addr.arpa");
  EXPECT_EQ(reverseName(*parseIp("2001:db8::567:89ab")),
            "b.a.9.8.7.6.5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa");
}

TEST(DnsNamesTest, FamilyAccepts) {
  EXPECT_TRUE(familyAccepts(Family::kAny, AF_INET));
  EXPECT_TRUE(familyAccepts(Family::kAny, AF_INET6));
  EXPECT_TRUE(familyAccepts(Family::kInet, AF_INET));
  EXPECT_FALSE(familyAccepts(Family::kInet, AF_INET6));
  EXPECT_FALSE(familyAccepts(Family::kInet6, AF_INET));
  EXPECT_TRUE(familyAccepts(Family::kInet6, AF_INET6));
  EXPECT_FALSE(familyAccepts(Family::kAny, AF_UNIX));
}

}  // namespace
}  // namespace siphon::agent::dns
