// eventually(): polls a condition until it holds or a deadline passes.
//
// For what another thread or process does at its own pace (an agent that
// closes a socket on its loop, a child that reaches its exec): the deadline
// only turns a hang into a failure, no result depends on it, so give it a
// generous one (scaled by kSanitizerSlowdown where instrumented code runs).
//
//   ASSERT_TRUE(fakes::eventually([&] { return fdsOpen() == 0; }, 20s))
//       << fdsOpen() << " still open";
//
// The condition runs on the calling thread, first at once, then every
// `every` until it holds (true) or `within` has passed (false; the
// condition ran once more at the deadline). It may keep what it saw in
// variables it captures, for the failure message.
#pragma once

#include <chrono>
#include <thread>

namespace siphon::fakes {

template <typename Condition>
bool eventually(Condition&& condition, std::chrono::steady_clock::duration within,
                std::chrono::steady_clock::duration every = std::chrono::milliseconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (true) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(every);
  }
}

}  // namespace siphon::fakes
