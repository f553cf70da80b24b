// The base of a privileged test fixture: skips with its reason when not
// root, owns the kernel objects and files it makes for the test, and
// removes them whichever way the test ends.
//
//   class DnsTest : public harness::PrivilegedTest {
//    protected:
//     DnsTest() : PrivilegedTest("needs root: ...") {}
//     void SetUp() override {
//       PrivilegedTest::SetUp();
//       if (IsSkipped() || HasFatalFailure()) return;
//       pod_ = &addNetns();
//       ...
//       showOnFailure("agent log", [this] { return agent_->log(); });
//     }
//   };
//
// Order at the end: TearDown() shows what showOnFailure() registered when
// the test failed, then runs atTearDown() actions, last registered first;
// the derived fixture's members go next (its processes die), and the
// namespaces and the scratch directory last, in the base's destructor, so
// nothing is removed from under a process still using it. A test killed
// before any of that leaves names that carry its pid, which the reaper
// (reaper.h) removes at the start of the next run.
#pragma once

#include <unistd.h>

#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"

namespace siphon::harness {

template <typename Base = ::testing::Test>
class PrivilegedFixture : public Base {
 protected:
  explicit PrivilegedFixture(std::string skip_reason) : skip_reason_(std::move(skip_reason)) {}
  ~PrivilegedFixture() override {
    while (!namespaces_.empty()) namespaces_.pop_back();  // the last made first
  }

  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << skip_reason_;
  }

  void TearDown() override {
    if (this->HasFailure()) {
      for (const auto& [what, show] : on_failure_) {
        std::cerr << "--- " << what << "\n" << show() << "\n--- end of " << what << "\n";
      }
    }
    while (!at_teardown_.empty()) {
      std::function<void()> fn = std::move(at_teardown_.back());
      at_teardown_.pop_back();
      fn();
    }
  }

  // A new named network namespace ("pod"), deleted after the fixture's own
  // members; a failure to make it fails the test.
  NetNs& addNetns() {
    namespaces_.push_back(std::make_unique<NetNs>());
    EXPECT_TRUE(namespaces_.back()->created());
    return *namespaces_.back();
  }
  // The test's scratch directory, made on first use.
  TempDir& dir() {
    if (!dir_) dir_.emplace();
    return *dir_;
  }
  // Runs `fn` at TearDown(), failed or not (last registered first).
  void atTearDown(std::function<void()> fn) { at_teardown_.push_back(std::move(fn)); }
  // Prints `show()` (a log, a dump) under `what` when the test failed.
  void showOnFailure(std::string what, std::function<std::string()> show) {
    on_failure_.emplace_back(std::move(what), std::move(show));
  }

 private:
  std::string skip_reason_;
  // Destroyed after the derived fixture's members: namespaces before the
  // directory (a namespace's processes may have files there).
  std::optional<TempDir> dir_;
  std::vector<std::unique_ptr<NetNs>> namespaces_;
  std::vector<std::function<void()>> at_teardown_;
  std::vector<std::pair<std::string, std::function<std::string()>>> on_failure_;
};

using PrivilegedTest = PrivilegedFixture<::testing::Test>;
template <typename Param>
using PrivilegedParamTest = PrivilegedFixture<::testing::TestWithParam<Param>>;

}  // namespace siphon::harness
