#include "agent/common/exec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(NetnsExec, FindsToolsInSbin) {
  EXPECT_EQ(findTool("sh").empty(), false);
  EXPECT_EQ(findTool("no-such-tool-siphon"), "");
}

}  // namespace
}  // namespace siphon::agent
