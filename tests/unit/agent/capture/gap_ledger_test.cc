// GapLedger: every drop is reported once, slow-client and kernel drops
// apart, and the kernel's 32-bit counter may wrap.
#include "agent/capture/gap_ledger.h"

#include <gtest/gtest.h>

namespace siphon::agent::capture {
namespace {

TEST(GapLedger, NothingPendingNoGap) {
  GapLedger l;
  EXPECT_FALSE(l.pending());
  EXPECT_TRUE(l.take(7).empty());
  l.kernelDropTotal(0);
  EXPECT_FALSE(l.pending());
}

TEST(GapLedger, SlowClientDropsAddUpAndClearOnTake) {
  GapLedger l;
  l.dropped(100);
  l.dropped(1516);
  ASSERT_TRUE(l.pending());
  auto gaps = l.take(9);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].stream_id(), 9u);
  EXPECT_EQ(gaps[0].packets(), 2u);
  EXPECT_EQ(gaps[0].bytes(), 1616u);
  EXPECT_EQ(gaps[0].direction(), v1::DIRECTION_UNSPECIFIED);
  EXPECT_FALSE(l.pending());
  EXPECT_TRUE(l.take(9).empty());
  l.dropped(50);
  gaps = l.take(9);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets(), 1u);
  EXPECT_EQ(gaps[0].bytes(), 50u);
  EXPECT_EQ(l.totals().slow_client_packets, 3u);
  EXPECT_EQ(l.totals().slow_client_bytes, 1666u);
}

TEST(GapLedger, KernelDropsAreTheDifferenceOfTheCounter) {
  GapLedger l;
  l.kernelDropTotal(5);
  auto gaps = l.take(3);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets(), 5u);
  EXPECT_EQ(gaps[0].bytes(), 0u);  // the kernel does not say how large
  l.kernelDropTotal(5);            // unchanged: nothing new
  EXPECT_FALSE(l.pending());
  l.kernelDropTotal(12);
  gaps = l.take(3);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets(), 7u);
  EXPECT_EQ(l.totals().kernel_packets, 12u);
}

TEST(GapLedger, KernelCounterWraps) {
  GapLedger l;
  l.kernelDropTotal(0xfffffff0u);
  (void)l.take(1);
  l.kernelDropTotal(0x10u);  // wrapped: 0x20 more
  auto gaps = l.take(1);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0].packets(), 0x20u);
  EXPECT_EQ(l.totals().kernel_packets, 0xfffffff0ull + 0x20u);
}

TEST(GapLedger, BothCausesInOneTakeSlowClientFirst) {
  GapLedger l;
  l.kernelDropTotal(4);
  l.dropped(200);
  auto gaps = l.take(5);
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_EQ(gaps[0].packets(), 1u);
  EXPECT_EQ(gaps[0].bytes(), 200u);
  EXPECT_EQ(gaps[1].packets(), 4u);
  EXPECT_EQ(gaps[1].bytes(), 0u);
}

}  // namespace
}  // namespace siphon::agent::capture
