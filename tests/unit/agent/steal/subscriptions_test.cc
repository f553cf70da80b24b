#include "agent/steal/subscriptions.h"

#include <gtest/gtest.h>

#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

TEST(SubscriptionTable, SecondSessionGetsPortBusyNamingTheHolder) {
  SubscriptionTable t;
  auto a = t.reserve(80, "aaaa", "alice-laptop");
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = t.reserve(80, "bbbb", "bob");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(errorCodeOf(b.status()), v1::PORT_BUSY);
  EXPECT_NE(b.status().message().find("session aaaa"), absl::string_view::npos) << b.status();
  EXPECT_NE(b.status().message().find("alice-laptop"), absl::string_view::npos) << b.status();
  // Another port is free.
  EXPECT_TRUE(t.reserve(81, "bbbb", "bob").ok());
}

TEST(SubscriptionTable, SameSessionTwiceIsBusyToo) {
  SubscriptionTable t;
  ASSERT_TRUE(t.reserve(80, "aaaa", "").ok());
  auto again = t.reserve(80, "aaaa", "");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(errorCodeOf(again.status()), v1::PORT_BUSY);
  EXPECT_NE(again.status().message().find("this session"), absl::string_view::npos);
}

TEST(SubscriptionTable, PortZeroIsInvalid) {
  SubscriptionTable t;
  auto r = t.reserve(0, "aaaa", "");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(errorCodeOf(r.status()), v1::INVALID_ARGUMENT);
}

TEST(SubscriptionTable, OnlyActiveSubscriptionsReceiveConnections) {
  SubscriptionTable t;
  auto a = t.reserve(80, "aaaa", "");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(t.activeForPort(80), nullptr);  // the steering has not taken it yet
  ASSERT_TRUE(t.activate(a->id));
  ASSERT_NE(t.activeForPort(80), nullptr);
  EXPECT_EQ(t.activeForPort(80)->session_id, "aaaa");
  EXPECT_EQ(t.activeForPort(81), nullptr);
}

TEST(SubscriptionTable, ActivateAfterSessionEndFails) {
  SubscriptionTable t;
  auto a = t.reserve(80, "aaaa", "");
  ASSERT_TRUE(a.ok());
  auto removed = t.removeSession("aaaa");
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_FALSE(removed[0].active);
  EXPECT_FALSE(t.activate(a->id));
  // The port is free again.
  EXPECT_TRUE(t.reserve(80, "bbbb", "").ok());
}

TEST(SubscriptionTable, RemoveChecksTheOwner) {
  SubscriptionTable t;
  auto a = t.reserve(80, "aaaa", "");
  ASSERT_TRUE(a.ok());
  auto wrong = t.remove(a->id, "bbbb");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(errorCodeOf(wrong.status()), v1::NOT_FOUND);
  EXPECT_EQ(t.size(), 1u);
  auto right = t.remove(a->id, "aaaa");
  ASSERT_TRUE(right.ok());
  EXPECT_EQ(right->port, 80);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_FALSE(t.remove(a->id, "aaaa").ok());
}

TEST(SubscriptionTable, RemoveSessionTakesOnlyItsOwn) {
  SubscriptionTable t;
  ASSERT_TRUE(t.reserve(80, "aaaa", "").ok());
  ASSERT_TRUE(t.reserve(81, "aaaa", "").ok());
  ASSERT_TRUE(t.reserve(82, "bbbb", "").ok());
  auto removed = t.removeSession("aaaa");
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_EQ(t.portsOf("aaaa").size(), 0u);
  EXPECT_EQ(t.portsOf("bbbb"), std::vector<uint16_t>{82});
}

TEST(SubscriptionTable, IdsAreNeverReused) {
  SubscriptionTable t;
  auto a = t.reserve(80, "aaaa", "");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(t.remove(a->id, "aaaa").ok());
  auto b = t.reserve(80, "aaaa", "");
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->id, b->id);
}

}  // namespace
}  // namespace siphon::agent::steal
