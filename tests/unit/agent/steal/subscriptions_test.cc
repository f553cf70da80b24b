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

// ---- filtered steals ----

std::shared_ptr<const http::RequestFilter> userIs(const std::string& user) {
  v1::HttpFilter f;
  v1::HeaderFilter* h = f.add_headers();
  h->set_name("X-User");
  h->set_value_regex("^" + user + "$");
  auto compiled = http::RequestFilter::compile(f);
  EXPECT_TRUE(compiled.ok()) << compiled.status();
  return compiled.ok() ? *compiled : nullptr;
}

http::RequestHead requestFrom(const std::string& user) {
  http::RequestHead h;
  h.method = "GET";
  h.target = "/";
  h.headers = {{"host", "app"}, {"x-user", user}};
  return h;
}

TEST(SubscriptionTable, FilteredStealsShareAPortOnePerSession) {
  SubscriptionTable t;
  auto a = t.reserve(80, "aaaa", "alice", userIs("alice"));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = t.reserve(80, "bbbb", "bob", userIs("bob"));
  ASSERT_TRUE(b.ok()) << b.status();
  // One per session and port, filter or not: an unsubscribe is never ambiguous.
  auto again = t.reserve(80, "aaaa", "alice", userIs("carol"));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(errorCodeOf(again.status()), v1::PORT_BUSY);
  EXPECT_NE(again.status().message().find("this session"), absl::string_view::npos);
}

TEST(SubscriptionTable, FilteredAndUnfilteredConflictEitherWay) {
  SubscriptionTable t;
  ASSERT_TRUE(t.reserve(80, "aaaa", "alice", userIs("alice")).ok());
  auto whole = t.reserve(80, "bbbb", "bob");
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(errorCodeOf(whole.status()), v1::PORT_BUSY);
  // It says why, and whose filter is in the way.
  EXPECT_NE(whole.status().message().find("filtered steals"), absl::string_view::npos)
      << whole.status();
  EXPECT_NE(whole.status().message().find("alice"), absl::string_view::npos) << whole.status();

  ASSERT_TRUE(t.reserve(81, "bbbb", "bob").ok());
  auto filtered = t.reserve(81, "aaaa", "alice", userIs("alice"));
  ASSERT_FALSE(filtered.ok());
  EXPECT_EQ(errorCodeOf(filtered.status()), v1::PORT_BUSY);
  EXPECT_NE(filtered.status().message().find("bob"), absl::string_view::npos) << filtered.status();
}

// A handover restores the old agent's subscriptions under their ids, by
// the rules reserve() keeps: filtered steals of one port side by side
// (matched earliest first, whatever order they came in), nothing beside an
// unfiltered one, one per session and port.
TEST(SubscriptionTable, RestoreKeepsTheSharingRulesAndTheOrder) {
  SubscriptionTable t;
  auto restored = [](uint64_t id, uint16_t port, const std::string& session,
                     std::shared_ptr<const http::RequestFilter> filter) {
    Subscription s;
    s.id = id;
    s.port = port;
    s.session_id = session;
    s.filter = std::move(filter);
    return s;
  };
  ASSERT_TRUE(t.restore(restored(9, 80, "bbbb", userIs("bob"))).ok());
  ASSERT_TRUE(t.restore(restored(4, 80, "aaaa", userIs("bob"))).ok());
  auto m = t.matching(80, requestFrom("bob"));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]->id, 4u);  // the earlier subscription first
  EXPECT_EQ(m[1]->id, 9u);
  EXPECT_FALSE(t.restore(restored(10, 80, "aaaa", userIs("alice"))).ok());  // same session
  EXPECT_FALSE(t.restore(restored(11, 80, "cccc", nullptr)).ok());          // whole port
  EXPECT_FALSE(t.restore(restored(9, 81, "cccc", nullptr)).ok());           // id taken
  ASSERT_TRUE(t.restore(restored(12, 81, "cccc", nullptr)).ok());
  EXPECT_FALSE(t.restore(restored(13, 81, "dddd", userIs("dave"))).ok());
  // New ids come after the restored ones.
  auto next = t.reserve(82, "eeee", "eve");
  ASSERT_TRUE(next.ok());
  EXPECT_GT(next->id, 12u);
}

TEST(SubscriptionTable, MatchingListsActiveFiltersEarliestFirst) {
  SubscriptionTable t;
  auto later_any = [] {
    v1::HttpFilter f;
    f.set_path_regex("^/");
    return *http::RequestFilter::compile(f);
  };
  auto a = t.reserve(80, "aaaa", "alice", userIs("alice"));
  auto any = t.reserve(80, "cccc", "carol", later_any());
  auto b = t.reserve(80, "bbbb", "bob", userIs("bob"));
  ASSERT_TRUE(a.ok() && any.ok() && b.ok());
  // Reserved, not active: nothing is routed to them yet.
  EXPECT_FALSE(t.hasActiveFiltered(80));
  EXPECT_TRUE(t.matching(80, requestFrom("alice")).empty());
  ASSERT_TRUE(t.activate(any->id));
  ASSERT_TRUE(t.activate(b->id));
  EXPECT_TRUE(t.hasActiveFiltered(80));
  // No whole-port subscription while filters hold it.
  EXPECT_EQ(t.activeForPort(80), nullptr);
  ASSERT_TRUE(t.activate(a->id));

  auto m = t.matching(80, requestFrom("alice"));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]->id, a->id);
  EXPECT_EQ(m[1]->id, any->id);
  m = t.matching(80, requestFrom("bob"));
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0]->id, any->id);  // carol subscribed before bob
  EXPECT_EQ(m[1]->id, b->id);
  EXPECT_TRUE(t.matching(81, requestFrom("alice")).empty());

  // Removing the earliest hands its requests to the next match.
  ASSERT_TRUE(t.remove(any->id, "cccc").ok());
  m = t.matching(80, requestFrom("bob"));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0]->id, b->id);
  t.removeSession("aaaa");
  t.removeSession("bbbb");
  EXPECT_FALSE(t.hasActiveFiltered(80));
  // The port is free for a whole steal again.
  EXPECT_TRUE(t.reserve(80, "dddd", "dave").ok());
}

}  // namespace
}  // namespace siphon::agent::steal
