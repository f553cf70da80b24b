// agent/common/root_path.h: resolution in a root, and the bounded retry.
#include "agent/common/root_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>

#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent {
namespace {

int calls = 0;

long alwaysEagain(int, const char*, const struct open_how*, size_t) {
  ++calls;
  errno = EAGAIN;
  return -1;
}

long eintrThenEnoent(int, const char*, const struct open_how*, size_t) {
  errno = ++calls < 3 ? EINTR : ENOENT;
  return -1;
}

// A walk the kernel keeps answering EAGAIN for (a target renaming in a
// loop): the caller gets EAGAIN after a bounded number of tries, not a
// thread spinning forever.
TEST(RootPathTest, EagainIsRetriedABoundedNumberOfTimes) {
  calls = 0;
  UniqueFd fd;
  EXPECT_EQ(openInRoot(AT_FDCWD, "/etc/hosts", O_RDONLY, 0, &fd, alwaysEagain), EAGAIN);
  EXPECT_EQ(calls, kMaxRootPathAttempts);
  EXPECT_FALSE(fd.valid());
}

TEST(RootPathTest, OtherErrorsAreNotRetried) {
  calls = 0;
  UniqueFd fd;
  EXPECT_EQ(openInRoot(AT_FDCWD, "/x", O_RDONLY, 0, &fd, eintrThenEnoent), ENOENT);
  EXPECT_EQ(calls, 3);
}

TEST(RootPathTest, ResolvesInsideTheRoot) {
  files::testing::ScratchTree tree;
  tree.file("etc/hosts", "pod");
  tree.symlink("up", "../../../../..");
  UniqueFd fd;
  ASSERT_EQ(openInRoot(tree.rootFd(), "/up/etc/hosts", O_RDONLY, 0, &fd), 0);
  char buf[8] = {};
  EXPECT_EQ(::read(fd.get(), buf, sizeof buf), 3);
  EXPECT_STREQ(buf, "pod");
  EXPECT_EQ(openInRoot(tree.rootFd(), std::string_view("a\0b", 3), O_RDONLY, 0, &fd), EINVAL);
  EXPECT_EQ(openInRoot(tree.rootFd(), "", O_RDONLY, 0, &fd), ENOENT);
}

}  // namespace
}  // namespace siphon::agent
