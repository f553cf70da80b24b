// Handshake admission (agent/server/admission.h): the caps, their eviction
// order (the connection that has waited longest without a complete Hello
// makes room; one whose Hello is complete never does), the descriptor
// budget. No I/O: an eviction is seen through its callback.
#include "agent/server/admission.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "agent/metrics/process.h"

namespace siphon::agent {
namespace {

using Refusal = HandshakeSlots::Refusal;
using Clock = HandshakeSlots::Clock;
using std::chrono::milliseconds;

// Slots named by the order they were admitted in, each recording its own
// eviction in `evicted` (by that name).
struct Admitted {
  explicit Admitted(uint32_t max_total, uint32_t max_per_source)
      : slots(max_total, max_per_source) {}
  // Admits connection `name` from `source` at t0 + `at_ms`; returns the
  // admission (its slot kept in `held[name]` when granted).
  HandshakeSlots::Admission admit(const std::string& name, const std::string& source,
                                  int at_ms = 0) {
    HandshakeSlots::Admission a =
        slots.admit(source, t0 + milliseconds(at_ms), [this, name] { evicted.push_back(name); });
    HandshakeSlots::Admission out{HandshakeSlots::Slot(), a.refused, a.evicted};
    if (a.slot.held()) held[name] = std::move(a.slot);
    return out;
  }
  HandshakeSlots slots;
  const Clock::time_point t0 = Clock::now();
  std::map<std::string, HandshakeSlots::Slot> held;
  std::vector<std::string> evicted;
};

TEST(HandshakeSlots, PastThePerSourceCapTheOldestWithoutAHelloMakesRoom) {
  Admitted s(100, 3);
  for (const char* n : {"a1", "a2", "a3"}) EXPECT_EQ(s.admit(n, "a").refused, Refusal::kNone);
  s.admit("b1", "b");
  EXPECT_TRUE(s.evicted.empty());
  EXPECT_EQ(s.slots.pendingFrom("a"), 3u);
  // a4 evicts a1 (the oldest of its source), a5 a2: accept order.
  auto a4 = s.admit("a4", "a", 40);
  EXPECT_EQ(a4.refused, Refusal::kNone);
  EXPECT_EQ(a4.evicted.rule, Refusal::kPerSource);
  EXPECT_EQ(a4.evicted.source, "a");
  EXPECT_EQ(a4.evicted.waited, milliseconds(40));
  EXPECT_TRUE(s.held.at("a4").held());
  s.admit("a5", "a");
  EXPECT_EQ(s.evicted, (std::vector<std::string>{"a1", "a2"}));
  // The evicted slots count no more and say so; their release is a no-op.
  EXPECT_FALSE(s.held.at("a1").held());
  EXPECT_TRUE(s.held.at("a1").evicted());
  EXPECT_FALSE(s.held.at("a3").evicted());
  s.held.at("a1").release();
  EXPECT_EQ(s.slots.pendingFrom("a"), 3u);
  EXPECT_EQ(s.slots.pending(), 4u);  // a3, a4, a5, b1
  // Another source's connections were never touched.
  EXPECT_TRUE(s.held.at("b1").held());
}

TEST(HandshakeSlots, AConnectionWhoseHelloIsCompleteIsNeverEvicted) {
  Admitted s(100, 3);
  s.admit("a1", "a");
  s.admit("a2", "a");
  s.admit("a3", "a");
  s.held.at("a1").helloReceived();  // the oldest, past its Hello
  s.held.at("a3").helloReceived();
  EXPECT_EQ(s.slots.waiting(), 1u);
  s.admit("a4", "a");  // evicts a2, not a1
  EXPECT_EQ(s.evicted, (std::vector<std::string>{"a2"}));
  s.held.at("a4").helloReceived();
  // Every slot of the source past its Hello: the newcomer is refused, and
  // nothing changes.
  auto a5 = s.admit("a5", "a");
  EXPECT_EQ(a5.refused, Refusal::kPerSource);
  EXPECT_EQ(a5.evicted.rule, Refusal::kNone);
  EXPECT_EQ(s.held.count("a5"), 0u);
  EXPECT_EQ(s.evicted.size(), 1u);
  EXPECT_EQ(s.slots.pendingFrom("a"), 3u);
  // A settled slot still counts until released, then frees its place.
  s.held.at("a1").release();
  EXPECT_EQ(s.admit("a6", "a").refused, Refusal::kNone);
  EXPECT_EQ(s.evicted.size(), 1u);
}

TEST(HandshakeSlots, PastTheGlobalCapTheOldestOfAnySourceMakesRoom) {
  Admitted s(4, 4);
  s.admit("a1", "a", 0);
  s.admit("b1", "b", 1);
  s.admit("a2", "a", 2);
  s.admit("c1", "c", 3);
  s.held.at("a1").helloReceived();
  // d1: the oldest waiting over all sources is b1 (a1 is past its Hello).
  auto d1 = s.admit("d1", "d", 10);
  EXPECT_EQ(d1.evicted.rule, Refusal::kGlobal);
  EXPECT_EQ(d1.evicted.source, "b");
  EXPECT_EQ(d1.evicted.waited, milliseconds(9));
  EXPECT_EQ(s.slots.sources(), 3u);  // b's count is gone, not kept at zero
  s.admit("d2", "d", 11);
  s.admit("d3", "d", 12);
  EXPECT_EQ(s.evicted, (std::vector<std::string>{"b1", "a2", "c1"}));
  EXPECT_EQ(s.slots.pending(), 4u);
  // Everything past its Hello: refused.
  for (const char* n : {"d1", "d2", "d3"}) s.held.at(n).helloReceived();
  auto e1 = s.admit("e1", "e", 13);
  EXPECT_EQ(e1.refused, Refusal::kGlobal);
  EXPECT_EQ(s.slots.pending(), 4u);
  EXPECT_EQ(s.slots.sources(), 2u);  // no entry made for e
}

// The per-source cap is checked first: a source at its cap evicts its own
// oldest, even when another source's connection is older.
TEST(HandshakeSlots, ASourceAtItsCapEvictsItsOwnBeforeTheGlobalOrder) {
  Admitted s(3, 2);
  s.admit("b1", "b", 0);
  s.admit("a1", "a", 1);
  s.admit("a2", "a", 2);
  auto a3 = s.admit("a3", "a", 3);
  EXPECT_EQ(a3.evicted.rule, Refusal::kPerSource);
  EXPECT_EQ(s.evicted, (std::vector<std::string>{"a1"}));
  EXPECT_TRUE(s.held.at("b1").held());
}

TEST(HandshakeSlots, TheFdReserveEvictsTheOldestButNeverTheNewcomer) {
  Admitted s(100, 100);
  s.admit("a1", "a", 0);
  s.admit("b1", "b", 5);
  s.held.at("a1").helloReceived();
  s.admit("c1", "c", 7);
  HandshakeSlots::Eviction e;
  ASSERT_TRUE(
      s.slots.evictOldest(s.held.at("c1"), Refusal::kFdReserve, s.t0 + milliseconds(8), &e));
  EXPECT_EQ(e.rule, Refusal::kFdReserve);
  EXPECT_EQ(e.source, "b");
  EXPECT_EQ(e.waited, milliseconds(3));
  EXPECT_EQ(s.evicted, (std::vector<std::string>{"b1"}));
  // c1 alone waits: nothing to evict for it.
  EXPECT_FALSE(s.slots.evictOldest(s.held.at("c1"), Refusal::kFdReserve, s.t0, &e));
  EXPECT_TRUE(s.held.at("c1").held());
  EXPECT_EQ(s.slots.pending(), 2u);
}

TEST(HandshakeSlots, ReleasedOnEveryExitOnce) {
  Admitted s(3, 2);
  s.admit("a1", "a");
  s.admit("a2", "a");
  s.admit("b1", "b");
  {
    // A slot moved into a handshake's frame is released once, at its end.
    HandshakeSlots::Slot moved = std::move(s.held.at("a1"));
    EXPECT_FALSE(s.held.at("a1").held());  // NOLINT(bugprone-use-after-move): the point
    EXPECT_EQ(s.slots.pending(), 3u);
  }
  EXPECT_EQ(s.slots.pending(), 2u);
  EXPECT_EQ(s.slots.pendingFrom("a"), 1u);
  s.held.at("a2").helloReceived();
  s.held.at("a2").helloReceived();  // twice: no harm
  s.held.at("a2").release();
  s.held.at("a2").release();  // twice: still once
  EXPECT_EQ(s.slots.pendingFrom("a"), 0u);
  EXPECT_EQ(s.slots.sources(), 1u);          // no zero count kept for "a"
  s.held.at("b1") = HandshakeSlots::Slot();  // assignment releases what it held
  EXPECT_EQ(s.slots.pending(), 0u);
  EXPECT_EQ(s.slots.sources(), 0u);
  EXPECT_EQ(s.slots.waiting(), 0u);
  EXPECT_TRUE(s.evicted.empty());
}

// A flood from one source through a small cap: every newcomer gets in, the
// queue stays the cap's size, and the connections left are the newest.
TEST(HandshakeSlots, AFloodLeavesTheNewestAndEvictsEachInTurn) {
  constexpr int kCap = 16, kFlood = 3000;
  Admitted s(128, kCap);
  for (int i = 0; i < kFlood; ++i) {
    auto a = s.admit(std::to_string(i), "127.0.0.1", i);
    ASSERT_EQ(a.refused, Refusal::kNone) << i;
    if (i >= kCap) {
      ASSERT_EQ(s.evicted.back(), std::to_string(i - kCap));
      ASSERT_EQ(a.evicted.waited, milliseconds(kCap));
    }
  }
  EXPECT_EQ(s.evicted.size(), static_cast<size_t>(kFlood - kCap));
  EXPECT_EQ(s.slots.pending(), static_cast<uint32_t>(kCap));
  EXPECT_EQ(s.slots.waiting(), static_cast<size_t>(kCap));
  for (int i = kFlood - kCap; i < kFlood; ++i) EXPECT_TRUE(s.held.at(std::to_string(i)).held());
}

TEST(HandshakeSlots, FdBudgetKeepsAQuarterForSessions) {
  const FdBudget b = fdBudgetFor(1024);
  EXPECT_EQ(b.reserve, 256u);
  EXPECT_TRUE(b.admits(767));
  EXPECT_FALSE(b.admits(768));
  EXPECT_EQ(fdBudgetFor(64).reserve, kMinFdReserve);
  EXPECT_GT(metrics::countOpenFds(), 2u);  // at least stdin, stdout, stderr
}

}  // namespace
}  // namespace siphon::agent
