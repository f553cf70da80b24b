#include "siphon/transport/spawn.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace siphon::net {
namespace {

struct Report {
  std::string what;
  std::string error;
};
std::vector<Report> g_reports;

void capture(std::string_view what, std::string_view error) {
  g_reports.push_back({std::string(what), std::string(error)});
}

class SpawnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_reports.clear();
    setSpawnFailureReporter(&capture);
  }
  void TearDown() override { setSpawnFailureReporter(nullptr); }
  asio::io_context io;
};

awaitable<void> throwsAfterASuspend(asio::io_context& io) {
  asio::steady_timer t(io, std::chrono::milliseconds(1));
  co_await t.async_wait(use_awaitable);
  throw std::runtime_error("accept: boom");
}

awaitable<int> returnsNormally() { co_return 7; }

// Parameters, not lambda captures: a coroutine lambda's captures die with
// the temporary closure before the coroutine runs.
awaitable<void> ticks(asio::io_context& io, int n, int* count) {
  for (int i = 0; i < n; ++i) {
    asio::steady_timer t(io, std::chrono::milliseconds(2));
    co_await t.async_wait(use_awaitable);
    ++*count;
  }
}

awaitable<void> throwsAnInt() {
  throw 42;
  co_return;
}

TEST_F(SpawnTest, AnEscapingExceptionIsReportedAndEndsOnlyItsOwner) {
  int owner_ended = 0;
  int other_runs = 0;
  spawn(io, throwsAfterASuspend(io), "accept_loop", [&] { ++owner_ended; });
  // A second coroutine on the same loop keeps running after the first fails.
  spawn(io, ticks(io, 3, &other_runs), "other");
  io.run();
  ASSERT_EQ(g_reports.size(), 1u);
  EXPECT_EQ(g_reports[0].what, "accept_loop");
  EXPECT_EQ(g_reports[0].error, "accept: boom");
  EXPECT_EQ(owner_ended, 1);
  EXPECT_EQ(other_runs, 3);
}

TEST_F(SpawnTest, ANormalEndReportsNothing) {
  bool called = false;
  spawn(io, returnsNormally(), "value", [&] { called = true; });
  io.run();
  EXPECT_TRUE(g_reports.empty());
  EXPECT_FALSE(called);
}

TEST_F(SpawnTest, ANonStandardExceptionIsNamedAsSuch) {
  spawn(io, throwsAnInt(), "odd");
  io.run();
  ASSERT_EQ(g_reports.size(), 1u);
  EXPECT_EQ(g_reports[0].error, "unknown exception");
}

}  // namespace
}  // namespace siphon::net
