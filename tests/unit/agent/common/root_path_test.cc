// agent/common/root_path.h: resolution in a root, the bounded retry, and
// paths of PATH_MAX bytes or more (walked in pieces, with the answer and
// the confinement of one walk in the root: ".." and symlinks across the
// pieces, never a file outside the root).
#include "agent/common/root_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/fakes/remove_tree.h"
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

// ------------------------------------------------------------ long paths

// The real openat2, counting the walks that would have left their
// directory (EXDEV under RESOLVE_BENEATH): those are then walked by hand.
int exdevs = 0;
long countingOpenat2(int dirfd, const char* path, const struct open_how* how, size_t size) {
  const long fd = ::syscall(SYS_openat2, dirfd, path, how, size);
  if (fd < 0 && errno == EXDEV) ++exdevs;
  return fd;
}

// 100 bytes: a level of the deep tree.
const std::string kLevel(100, 'd');

std::string levels(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i == 0 ? "" : "/") + kLevel;
  return out;
}

std::string readAll(const UniqueFd& fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// The scratch root with /etc/hosts ("pod"), and `depth` levels of kLevel
// under /deep, each holding a file "here" that names its depth ("1" is
// /deep/kLevel/here).
class RootPathLongTest : public ::testing::Test {
 protected:
  static constexpr int kDepth = 50;  // 5,050 bytes below /deep

  void SetUp() override {
    tree_.file("etc/hosts", "pod");
    tree_.dir("deep");
    int fd = ::open(tree_.inRoot("deep").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (int i = 1; i <= kDepth; ++i) {
      ASSERT_EQ(::mkdirat(fd, kLevel.c_str(), 0755), 0) << std::strerror(errno);
      const int next = ::openat(fd, kLevel.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      ::close(fd);
      fd = next;
      ASSERT_GE(fd, 0);
      const int f = ::openat(fd, "here", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      ASSERT_GE(f, 0);
      const std::string n = std::to_string(i);
      ASSERT_EQ(::write(f, n.data(), n.size()), static_cast<ssize_t>(n.size()));
      ::close(f);
    }
    deepest_ = UniqueFd(fd);
  }
  void TearDown() override {
    deepest_.reset();
    const int root = ::open(tree_.root().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    fakes::removeTree(root, "deep");
    ::close(root);
  }

  // The path of level `n` ("/deep/d.../d...").
  static std::string at(int n) { return "/deep/" + levels(n); }
  // What openInRoot(path) reads, or "errno N".
  std::string read(const std::string& path, int flags = O_RDONLY) {
    UniqueFd fd;
    if (int err = openInRoot(tree_.rootFd(), path, flags, 0, &fd, countingOpenat2)) {
      return "errno " + std::to_string(err);
    }
    return readAll(fd);
  }
  // A symlink `name` in the deepest level.
  void deepLink(const std::string& name, const std::string& text) {
    ASSERT_EQ(::symlinkat(text.c_str(), deepest_.get(), name.c_str()), 0) << std::strerror(errno);
  }

  files::testing::ScratchTree tree_;
  UniqueFd deepest_;
};

TEST_F(RootPathLongTest, APathPastPathMaxIsWalkedInPieces) {
  ASSERT_GT(at(kDepth).size(), size_t{PATH_MAX});
  EXPECT_EQ(read(at(kDepth) + "/here"), "50");
  EXPECT_EQ(read(at(41) + "/here"), "41");
  // Relative, and with the slashes doubled: the same walk.
  EXPECT_EQ(read("deep//" + levels(kDepth) + "//here"), "50");
  // Made there: O_CREAT, and O_EXCL once it exists.
  UniqueFd fd;
  ASSERT_EQ(openInRoot(tree_.rootFd(), at(kDepth) + "/new", O_WRONLY | O_CREAT | O_EXCL, 0600, &fd),
            0);
  struct stat st {};
  ASSERT_EQ(::fstatat(deepest_.get(), "new", &st, 0), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(openInRoot(tree_.rootFd(), at(kDepth) + "/new", O_WRONLY | O_CREAT | O_EXCL, 0600, &fd),
            EEXIST);
  // The kernel's errnos from the walk.
  EXPECT_EQ(read(at(kDepth) + "/missing"), "errno " + std::to_string(ENOENT));
  EXPECT_EQ(read(at(kDepth) + "/here/"), "errno " + std::to_string(ENOTDIR));
  EXPECT_EQ(read(at(kDepth) + "/here/x"), "errno " + std::to_string(ENOTDIR));
  EXPECT_EQ(read(at(30) + "/nope/" + levels(20) + "/here"), "errno " + std::to_string(ENOENT));
  // A directory itself, with a trailing slash.
  ASSERT_EQ(openInRoot(tree_.rootFd(), at(kDepth) + "/", O_PATH | O_DIRECTORY, 0, &fd), 0);
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  struct stat deepest {};
  ASSERT_EQ(::fstat(deepest_.get(), &deepest), 0);
  EXPECT_EQ(st.st_ino, deepest.st_ino);
  // No name is that long.
  EXPECT_EQ(read("/" + std::string(PATH_MAX + 10, 'x')), "errno " + std::to_string(ENAMETOOLONG));
}

// ".." that climbs above where a piece began: as one walk would.
TEST_F(RootPathLongTest, DotDotAcrossPiecesIsTheParent) {
  std::string up = at(kDepth);
  for (int i = 0; i < 9; ++i) up += "/..";
  exdevs = 0;
  EXPECT_EQ(read(up + "/here"), "41");
  EXPECT_EQ(exdevs, 0) << "below the level the first piece reached (40): one walk";
  // Above it: by hand.
  for (int i = 0; i < 3; ++i) up += "/..";
  EXPECT_EQ(read(up + "/here"), "38");
  EXPECT_GT(exdevs, 0);
  // Down and up again, past PATH_MAX both ways.
  EXPECT_EQ(read(at(kDepth) + "/../" + levels(1) + "/here"), "50");
}

// ".." above the root stays at the root, from any depth; nothing outside
// the root is ever reached.
TEST_F(RootPathLongTest, DotDotNeverLeavesTheRoot) {
  std::string up = at(kDepth);
  for (int i = 0; i < 80; ++i) up += "/..";
  exdevs = 0;
  EXPECT_EQ(read(up + "/etc/hosts"), "pod");
  EXPECT_GT(exdevs, 0);
  EXPECT_EQ(read(up + "/outside/secret"), "errno " + std::to_string(ENOENT));
  EXPECT_EQ(read(up + "/../outside/secret"), "errno " + std::to_string(ENOENT));
}

// Symlinks below a piece's directory: an absolute one resolves from the
// root, a relative one that climbs out of the piece climbs as far as the
// root and no further.
TEST_F(RootPathLongTest, SymlinksAcrossPiecesResolveInTheRoot) {
  deepLink("abs", "/etc");
  deepLink("abs-file", "/etc/hosts");
  std::string climb;
  for (int i = 0; i < 70; ++i) climb += "../";
  deepLink("up", climb);
  deepLink("up-out", climb + "../outside/secret");
  deepLink("three", "../../..");
  exdevs = 0;
  EXPECT_EQ(read(at(kDepth) + "/abs/hosts"), "pod");
  EXPECT_GT(exdevs, 0);
  EXPECT_EQ(read(at(kDepth) + "/abs-file"), "pod");  // the last name, followed
  EXPECT_EQ(read(at(kDepth) + "/up/etc/hosts"), "pod");
  EXPECT_EQ(read(at(kDepth) + "/up-out"), "errno " + std::to_string(ENOENT));
  EXPECT_EQ(read(at(kDepth) + "/three/here"), "47");
  EXPECT_EQ(read(at(kDepth) + "/three/../../here"), "45");
  // Not followed where the flags say so: the link itself.
  UniqueFd fd;
  ASSERT_EQ(openInRoot(tree_.rootFd(), at(kDepth) + "/abs", O_PATH | O_NOFOLLOW, 0, &fd), 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(read(at(kDepth) + "/abs-file", O_RDONLY | O_NOFOLLOW),
            "errno " + std::to_string(ELOOP));
  // O_CREAT through a dangling absolute link makes its target in the root.
  deepLink("dangling", "/etc/made-through-a-link");
  ASSERT_EQ(openInRoot(tree_.rootFd(), at(kDepth) + "/dangling", O_WRONLY | O_CREAT, 0644, &fd), 0);
  EXPECT_TRUE(std::filesystem::exists(tree_.inRoot("etc/made-through-a-link")));
}

TEST_F(RootPathLongTest, ALoopOfLinksIsEloop) {
  // Out of the piece (11 levels up) and back to itself.
  std::string text;
  for (int i = 0; i < 11; ++i) text += "../";
  deepLink("a", text + levels(11) + "/a");
  EXPECT_EQ(read(at(kDepth) + "/a"), "errno " + std::to_string(ELOOP));
  EXPECT_EQ(read(at(kDepth) + "/a/x"), "errno " + std::to_string(ELOOP));
}

}  // namespace
}  // namespace siphon::agent
