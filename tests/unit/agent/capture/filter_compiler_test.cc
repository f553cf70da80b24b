// Capture filters compile off the NetnsWorker, within a size, a time and a
// thread bound (filter_compiler.h). The real libpcap compiler on a dead
// handle needs no root.
#include "agent/capture/filter_compiler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/capture/capture_spec.h"
#include "siphon/status.h"
#include "tests/fakes/eventually.h"

namespace siphon::agent::capture {
namespace {

namespace asio = net::asio;
using ::testing::HasSubstr;

constexpr int kDltEthernet = 1;  // DLT_EN10MB
constexpr int kDltLinuxSll = 113;

// Runs `f` as a coroutine on a fresh io_context to completion.
template <typename F>
void runOn(F f) {
  asio::io_context io;
  bool done = false;
  asio::co_spawn(io, f(io.get_executor()), [&](std::exception_ptr e) {
    done = true;
    if (e) std::rethrow_exception(e);
  });
  io.run();
  EXPECT_TRUE(done);
}

// A compile that waits until the test releases it.
struct HeldCompile {
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  bool released = false;

  FilterCompileFunction function() {
    return [this](const std::string& e, int, uint32_t) -> CompiledFilterOr {
      std::unique_lock<std::mutex> l(mu);
      ++started;
      cv.notify_all();
      cv.wait(l, [this] { return released; });
      return std::make_shared<const CompiledFilter>(e);
    };
  }
  bool hasStarted() {
    std::lock_guard<std::mutex> l(mu);
    return started > 0;
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    released = true;
    cv.notify_all();
  }
};

TEST(FilterCompiler, LibpcapCompilesOnADeadHandle) {
  auto ok = compilePcapFilter("tcp port 80", kDltEthernet, 262144);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->expression(), "tcp port 80");
  ASSERT_NE((*ok)->program(), nullptr);
  auto sll = compilePcapFilter("udp and port 53", kDltLinuxSll, 65535);
  EXPECT_TRUE(sll.ok()) << sll.status();

  auto bad = compilePcapFilter("tcp prot 80", kDltEthernet, 262144);
  EXPECT_EQ(errorCodeOf(bad.status()), v1::INVALID_ARGUMENT) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("capture filter 'tcp prot 80': "));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("syntax error"));
}

// The longest filter the agent takes, built to be slow for libpcap's
// optimizer (an `or` chain of distinct hosts): it compiles or is refused
// with TIMEOUT, on a thread of its own; nothing else.
TEST(FilterCompiler, ThePathologicalLongestFilterCompilesOrTimesOutTyped) {
  std::string chain;
  for (int i = 0; chain.size() + 40 < kMaxFilterBytes; ++i) {
    absl::StrAppend(&chain, i == 0 ? "" : " or ", "(host 10.", (i >> 8) & 255, ".", i & 255,
                    ".1 and port ", 1000 + i, ")");
  }
  ASSERT_LE(chain.size(), kMaxFilterBytes);
  FilterCompiler compiler(compilePcapFilter, kFilterCompileDeadline, kMaxFilterCompiles);
  runOn([&](asio::any_io_executor) -> net::awaitable<void> {
    auto r = co_await compiler.compile(chain, kDltEthernet, 262144);
    EXPECT_TRUE(r.ok() || errorCodeOf(r.status()) == v1::TIMEOUT) << r.status();
  });
}

// The deadline answers while the compile still runs (it is held here until
// the end of the test), and the count of compiles bounds the threads a
// client can leave running that way.
TEST(FilterCompiler, DeadlineAnswersTimeoutAndRunningCompilesAreBounded) {
  HeldCompile held;
  FilterCompiler compiler(held.function(), std::chrono::milliseconds(50), /*max_running=*/1);
  runOn([&](asio::any_io_executor) -> net::awaitable<void> {
    auto r = co_await compiler.compile("host 1.2.3.4", kDltEthernet, 262144);
    EXPECT_EQ(errorCodeOf(r.status()), v1::TIMEOUT) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("'host 1.2.3.4'"));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("did not compile within 50 ms"));
    EXPECT_TRUE(held.hasStarted());
    EXPECT_EQ(compiler.runningForTest(), 1u);
    // The first is still compiling: no thread for a second one.
    auto second = co_await compiler.compile("host 5.6.7.8", kDltEthernet, 262144);
    EXPECT_EQ(errorCodeOf(second.status()), v1::RESOURCE_EXHAUSTED) << second.status();
  });
  held.release();
  fakes::eventually([&] { return compiler.runningForTest() == 0; }, std::chrono::seconds(5),
                    std::chrono::milliseconds(5));
  EXPECT_EQ(compiler.runningForTest(), 0u);
}

TEST(FilterCompiler, AResultBeforeTheDeadlineIsTheCompiledFilter) {
  FilterCompiler compiler(compilePcapFilter, kFilterCompileDeadline, kMaxFilterCompiles);
  runOn([&](asio::any_io_executor) -> net::awaitable<void> {
    auto r = co_await compiler.compile("icmp", kDltEthernet, 262144);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) {
      EXPECT_EQ((*r)->expression(), "icmp");
    }
    auto bad = co_await compiler.compile("tcp prot 80", kDltEthernet, 262144);
    EXPECT_EQ(errorCodeOf(bad.status()), v1::INVALID_ARGUMENT) << bad.status();
  });
}

}  // namespace
}  // namespace siphon::agent::capture
