// The descriptors a child of siphon's keeps (layer-protocol/exec/fds.h):
// each way (close_range, the /proc/self/fd listing, every number) closes
// or marks close-on-exec everything from 3 up but the descriptors named,
// and the one keepOnlyDescriptors() chooses leaves an exec'd program
// nothing else. Each case runs in a forked child, whose descriptors it may
// close, and reports what it holds through a pipe.
#include "exec/fds.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace siphon::exec {
namespace {

using ::testing::ElementsAre;

// The descriptors of this process from 3 up but `skip`: those that an exec
// keeps ("20 21 "), then how many are close-on-exec ("+12").
std::string describeDescriptors(int skip) {
  std::vector<int> fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    fds.push_back(std::atoi(e.path().filename().c_str()));
  }
  std::sort(fds.begin(), fds.end());
  std::string out;
  int cloexec = 0;
  for (int fd : fds) {
    const int flags = ::fcntl(fd, F_GETFD);
    if (fd < 3 || fd == skip || flags < 0) continue;  // < 0: the listing's own
    if (flags & FD_CLOEXEC) {
      ++cloexec;
    } else {
      out += std::to_string(fd) + " ";
    }
  }
  return out + "+" + std::to_string(cloexec);
}

// Runs `body` in a child that holds a pipe's write end at `report` (kept by
// every body) and returns what it wrote there, then its exit code.
struct ChildResult {
  std::string text;
  int code = -1;
};
template <typename Body>
ChildResult inChild(Body body) {
  int p[2];
  if (::pipe(p) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    int report = p[1];  // the body may move it
    const std::string text = body(report);
    (void)!::write(report, text.data(), text.size());
    ::_exit(0);
  }
  ::close(p[1]);
  ChildResult r;
  char buf[512];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof(buf))) > 0) r.text.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Opens what siphon would hold (a socket and a pipe, not close-on-exec;
// a close-on-exec file; 8 copies of the socket at 22..29), keeps a file at
// 20 and the report pipe at 21: kept ones between closed ones. 12 are
// neither (more when the test was started with some).
struct Held {
  int kept = 20;
  int report = 21;
};
Held holdSome(int& report) {
  Held h;
  ::dup2(report, h.report);
  ::close(report);
  report = h.report;
  int sv[2];
  (void)!::socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  int pp[2];
  (void)!::pipe(pp);
  (void)!::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int null = ::open("/dev/null", O_RDONLY);
  ::dup2(null, h.kept);
  ::close(null);
  for (int fd = 22; fd < 30; ++fd) ::dup2(sv[0], fd);
  return h;
}

class FdMethodTest : public ::testing::TestWithParam<FdMethod> {};

TEST_P(FdMethodTest, CloseLeavesOnlyTheKept) {
  const FdMethod method = GetParam();
  ChildResult r = inChild([method](int& report) {
    Held h = holdSome(report);
    const int keep[] = {h.kept, h.report, 1, h.kept};  // below 3 and repeats are ignored
    const int err = keepOnlyDescriptorsForTest(keep, 4, FdAction::kClose, method);
    return std::to_string(err) + ": " + describeDescriptors(-1);
  });
  EXPECT_EQ(r.text, "0: 20 21 +0");
}

TEST_P(FdMethodTest, CloseOnExecMarksTheRestAndMakesTheKeptInheritable) {
  const FdMethod method = GetParam();
  ChildResult r = inChild([method](int& report) {
    Held h = holdSome(report);
    ::fcntl(h.kept, F_SETFD, FD_CLOEXEC);  // the kept one is made inheritable
    const int keep[] = {h.kept};
    const int err = keepOnlyDescriptorsForTest(keep, 1, FdAction::kCloseOnExec, method);
    return std::to_string(err) + ": " + describeDescriptors(h.report);
  });
  // 20 inheritable; every other one (3 to 8 and 22 to 29 at least) marked.
  ASSERT_THAT(r.text, ::testing::StartsWith("0: 20 +")) << r.text;
  EXPECT_GE(std::atoi(r.text.substr(7).c_str()), 13) << r.text;
}

INSTANTIATE_TEST_SUITE_P(EachWay, FdMethodTest,
                         ::testing::Values(FdMethod::kCloseRange, FdMethod::kListing,
                                           FdMethod::kEveryNumber),
                         [](const ::testing::TestParamInfo<FdMethod>& info) {
                           return info.param == FdMethod::kCloseRange ? "CloseRange"
                                  : info.param == FdMethod::kListing  ? "Listing"
                                                                      : "EveryNumber";
                         });

// The whole point: a program exec'd after keepOnlyDescriptors(kCloseOnExec)
// holds 0, 1, 2 and the kept descriptor, nothing else of its parent's.
TEST(FdsTest, AnExecdProgramHoldsOnlyWhatItWasGiven) {
  ChildResult r = inChild([](int& report) -> std::string {
    Held h = holdSome(report);
    ::dup2(h.report, 1);  // the program's stdout is the report
    const int keep[] = {h.kept};
    if (keepOnlyDescriptors(keep, 1, FdAction::kCloseOnExec) != 0) return "failed";
    // The shell lists the descriptors of its own process (not of ls).
    ::execl("/bin/sh", "sh", "-c", "ls /proc/$$/fd; :", nullptr);
    return "exec failed";
  });
  EXPECT_EQ(r.text, "0\n1\n2\n20\n");
}

TEST(FdsTest, TooManyOrAKeptOneNotOpenIsAnError) {
  std::vector<int> many(kMaxKeptDescriptors + 1, 3);
  EXPECT_EQ(keepOnlyDescriptors(many.data(), many.size(), FdAction::kCloseOnExec), EINVAL);
  ChildResult r = inChild([](int& report) {
    const int keep[] = {report, 1000};  // 1000: not open
    return std::to_string(keepOnlyDescriptors(keep, 2, FdAction::kCloseOnExec));
  });
  EXPECT_EQ(r.text, std::to_string(EBADF));
}

}  // namespace
}  // namespace siphon::exec
