#include "agent/common/exec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace siphon::agent {
namespace {

using ::testing::HasSubstr;

TEST(NetnsExec, FeedsStdinAndCapturesBothOutputs) {
  std::string input(200000, 'x');  // more than a pipe buffer
  auto r = execCapture({"/bin/sh", "-c", "wc -c; echo oops >&2; exit 3"}, input);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->out, "200000\n");
  EXPECT_EQ(r->err, "oops\n");
}

TEST(NetnsExec, CheckedNamesTheProgramItsExitAndStderr) {
  auto r = execChecked({"/bin/sh", "-c", "echo 'line 2 failed' >&2; exit 1"}, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(std::string(r.status().message()), "sh: exit 1: line 2 failed");
  auto ok = execChecked({"/bin/sh", "-c", "cat"}, "hello");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "hello");
}

TEST(NetnsExec, AProgramThatIgnoresItsInputDoesNotKillUs) {
  auto r = execCapture({"/bin/true"}, std::string(1 << 20, 'x'));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 0);
}

TEST(NetnsExec, ExecFailureIsItsErrno) {
  auto r = execCapture({"/nonexistent/iptables-nft-restore"}, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("exec /nonexistent/iptables"));
  EXPECT_EQ(execCapture({"relative"}, "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NetnsExec, DeadlineKillsTheProgram) {
  auto r =
      execCapture({"/bin/sleep", "30"}, "", ExecOptions{.timeout = std::chrono::milliseconds(100)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

// The environment is ours, not the agent's, but for iptables-legacy's lock
// file: the pod names one in its /dev (a read-only root has no /run).
TEST(NetnsExec, PassesOnlyTheXtablesLockFile) {
  ASSERT_EQ(setenv("SIPHON_EXEC_TEST_SECRET", "x", 1), 0);
  ASSERT_EQ(unsetenv("XTABLES_LOCKFILE"), 0);
  auto r = execChecked({"/usr/bin/env"}, "");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "PATH=/usr/sbin:/usr/bin:/sbin:/bin\nLC_ALL=C\n");
  ASSERT_EQ(setenv("XTABLES_LOCKFILE", "/dev/xtables.lock", 1), 0);
  r = execChecked({"/usr/bin/env"}, "");
  unsetenv("XTABLES_LOCKFILE");
  unsetenv("SIPHON_EXEC_TEST_SECRET");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r,
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin\nLC_ALL=C\nXTABLES_LOCKFILE=/dev/xtables.lock\n");
}

TEST(NetnsExec, FindsToolsInSbin) {
  EXPECT_EQ(findTool("sh").empty(), false);
  EXPECT_EQ(findTool("no-such-tool-siphon"), "");
}

}  // namespace
}  // namespace siphon::agent
