#include "agent/dns/dns_answer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/fakes/fake_dns_server.h"

namespace siphon::agent::dns {
namespace {

using ::siphon::fakes::buildResponse;
using ::siphon::fakes::encodeName;
using ::siphon::fakes::FakeRr;
using ::siphon::fakes::rdataA;
using ::siphon::fakes::rdataAaaa;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Optional;

absl::StatusOr<DnsAnswer> parse(const std::string& msg, int qtype) {
  return parseDnsAnswer(reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), qtype);
}

TEST(DnsAnswerTest, AddressesOfTheQuestionName) {
  std::string msg = buildResponse(7, "svc.example", kTypeA, 0,
                                  {{"", kTypeA, 60, rdataA("10.0.0.1")},
                                   {"svc.example", kTypeA, 30, rdataA("10.0.0.2")},
                                   {"SVC.Example", kTypeA, 90, rdataA("10.0.0.1")}});
  auto a = parse(msg, kTypeA);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->canonical, "svc.example");
  EXPECT_THAT(a->addresses, ElementsAre("10.0.0.1", "10.0.0.2")) << "duplicates once";
  EXPECT_THAT(a->ttl, Optional(30u)) << "the smallest TTL";
  EXPECT_THAT(a->names, IsEmpty());
}

TEST(DnsAnswerTest, FollowsTheCnameChain) {
  std::string msg = buildResponse(1, "www.example", kTypeAaaa, 0,
                                  {{"", kTypeCname, 100, encodeName("edge.example")},
                                   {"edge.example", kTypeCname, 50, encodeName("host.cdn.example")},
                                   {"host.cdn.example", kTypeAaaa, 200, rdataAaaa("2001:db8::7")},
                                   {"edge.example", kTypeAaaa, 10, rdataAaaa("2001:db8::bad")}});
  auto a = parse(msg, kTypeAaaa);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->canonical, "host.cdn.example");
  EXPECT_THAT(a->addresses, ElementsAre("2001:db8::7")) << "only the end of the chain counts";
  EXPECT_THAT(a->ttl, Optional(50u)) << "the chain's TTLs count too";
}

TEST(DnsAnswerTest, CnameLoopEnds) {
  std::string msg = buildResponse(1, "a.example", kTypeA, 0,
                                  {{"a.example", kTypeCname, 100, encodeName("b.example")},
                                   {"b.example", kTypeCname, 100, encodeName("a.example")}});
  auto a = parse(msg, kTypeA);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->addresses, IsEmpty());
}

TEST(DnsAnswerTest, PtrNames) {
  std::string msg = buildResponse(1, "13.12.11.10.in-addr.arpa", kTypePtr, 0,
                                  {{"", kTypePtr, 60, encodeName("one.example")},
                                   {"", kTypePtr, 60, encodeName("two.example")}});
  auto a = parse(msg, kTypePtr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->names, ElementsAre("one.example", "two.example"));
  EXPECT_THAT(a->addresses, IsEmpty());
}

TEST(DnsAnswerTest, OtherTypesClassesAndOwnersAreIgnored) {
  FakeRr chaos{"", kTypeA, 60, rdataA("10.9.9.9")};
  chaos.klass = 3;
  std::string msg = buildResponse(1, "x.example", kTypeA, 0,
                                  {chaos,
                                   {"", kTypeAaaa, 60, rdataAaaa("::1")},
                                   {"other.example", kTypeA, 60, rdataA("10.8.8.8")},
                                   {"", kTypeA, 60, std::string("\x01\x02", 2)},
                                   {"", 16, 60, std::string("\x03txt", 4)}});
  auto a = parse(msg, kTypeA);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->addresses, IsEmpty()) << "no A record of x.example: NODATA";
  EXPECT_FALSE(a->ttl.has_value());
}

TEST(DnsAnswerTest, MalformedMessages) {
  std::string good =
      buildResponse(1, "x.example", kTypeA, 0, {{"", kTypeA, 60, rdataA("1.2.3.4")}});
  ASSERT_TRUE(parse(good, kTypeA).ok());
  EXPECT_FALSE(parse("", kTypeA).ok());
  EXPECT_FALSE(parse(good.substr(0, 11), kTypeA).ok());
  for (size_t cut = 12; cut < good.size(); ++cut) {
    EXPECT_FALSE(parse(good.substr(0, cut), kTypeA).ok()) << "cut at " << cut;
  }
  std::string two_questions = good;
  two_questions[5] = 2;
  EXPECT_FALSE(parse(two_questions, kTypeA).ok());
  std::string bad_pointer = good;
  bad_pointer[bad_pointer.size() - 16] = '\xc0';  // the answer's owner pointer
  bad_pointer[bad_pointer.size() - 15] = '\x7f';  // points past the end
  EXPECT_FALSE(parse(bad_pointer, kTypeA).ok());
}

}  // namespace
}  // namespace siphon::agent::dns
