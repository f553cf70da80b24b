// RootFs's symlink, link, mknod and extended attribute calls against a
// scratch directory used as the target's root: each does what its syscall
// does, on the right object, with the kernel's errno, and none reaches the
// host file outside the root. No root needed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "agent/files/root_fs.h"
#include "siphon/status.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using testing::ScratchTree;

int err(const absl::Status& s) { return errnoOf(s); }
template <typename T>
int err(const absl::StatusOr<T>& s) {
  return errnoOf(s.status());
}

struct stat hostLstat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return st;
}

bool existsOnHost(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

class RootFsLinksTest : public ::testing::Test {
 protected:
  RootFsLinksTest() : fs_(tree_.rootFd()) {}

  // Whether the scratch file system takes user.* attributes (tmpfs before
  // Linux 6.6 does not); `why` gets the errno's text when not.
  bool userXattrs(std::string* why) {
    const std::string probe = tree_.inRoot("xattr-probe");
    ScratchTree::write(probe, "");
    const bool ok = ::setxattr(probe.c_str(), "user.siphon.probe", "1", 1, 0) == 0;
    if (!ok) *why = std::strerror(errno);
    std::filesystem::remove(probe);
    return ok;
  }

  ScratchTree tree_;
  RootFs fs_;
};

TEST_F(RootFsLinksTest, SymlinkStoresTheTargetVerbatim) {
  const std::string target = "/etc/../outside/secret";
  ASSERT_TRUE(fs_.symlink(target, "/l").ok());
  char buf[256];
  const ssize_t n = ::readlink(tree_.inRoot("l").c_str(), buf, sizeof buf);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), target);
  EXPECT_EQ(fs_.readlink("/l").value_or("?"), target);
  // Followed, it resolves inside the root: ROOT/outside/secret, absent.
  tree_.dir("etc");
  EXPECT_EQ(err(fs_.open("/l", O_RDONLY, 0)), ENOENT);
  tree_.file("outside/secret", "pod-secret");
  auto fd = fs_.open("/l", O_RDONLY, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(preadFd(fd->get(), 100, 0)->data(), "pod-secret");

  ASSERT_TRUE(fs_.symlink("relative/x", "/r").ok());
  EXPECT_EQ(fs_.readlink("/r").value_or("?"), "relative/x");
}

TEST_F(RootFsLinksTest, SymlinkErrors) {
  tree_.file("f", "");
  EXPECT_EQ(err(fs_.symlink("/x", "/f")), EEXIST);
  EXPECT_EQ(err(fs_.symlink("/x", "/missing/l")), ENOENT);
  EXPECT_EQ(err(fs_.symlink("/x", "/")), EEXIST);
  EXPECT_EQ(err(fs_.symlink("/x", "/new/")), ENOENT) << "a trailing slash, as the kernel answers";
  EXPECT_EQ(err(fs_.symlink("/x", "/f/")), EEXIST);
  EXPECT_EQ(err(fs_.symlink(std::string("a\0b", 3), "/n")), EINVAL);
  EXPECT_EQ(err(fs_.symlink("", "/n")), ENOENT) << "the kernel's answer to an empty target";
  EXPECT_FALSE(existsOnHost(tree_.inRoot("n")));
}

TEST_F(RootFsLinksTest, SymlinkParentsStayInsideTheRoot) {
  ASSERT_TRUE(fs_.symlink("t", "../../../l2").ok());
  EXPECT_TRUE(S_ISLNK(hostLstat(tree_.inRoot("l2")).st_mode));
  EXPECT_FALSE(existsOnHost(tree_.base() + "/l2"));
  // A parent that is an absolute symlink to the host's directory resolves
  // inside the root, where it does not exist.
  tree_.symlink("out", tree_.base() + "/outside");
  EXPECT_EQ(err(fs_.symlink("t", "/out/planted")), ENOENT);
  EXPECT_FALSE(existsOnHost(tree_.base() + "/outside/planted"));
}

TEST_F(RootFsLinksTest, LinkMakesAHardLinkAndNeverFollowsASymlink) {
  tree_.file("f", "data");
  ASSERT_TRUE(fs_.link("/f", "/g").ok());
  auto f = fs_.stat("/f", false);
  auto g = fs_.stat("/g", false);
  ASSERT_TRUE(f.ok() && g.ok());
  EXPECT_EQ(g->ino(), f->ino());
  EXPECT_EQ(g->nlink(), 2u);

  tree_.symlink("sl", "/f");
  ASSERT_TRUE(fs_.link("/sl", "/sl2").ok());
  EXPECT_TRUE(S_ISLNK(hostLstat(tree_.inRoot("sl2")).st_mode)) << "the link itself";
  EXPECT_EQ(fs_.readlink("/sl2").value_or("?"), "/f");
  EXPECT_EQ(hostLstat(tree_.inRoot("f")).st_nlink, 2u);

  EXPECT_EQ(err(fs_.link("/f", "/g")), EEXIST);
  EXPECT_EQ(err(fs_.link("/missing", "/h")), ENOENT);
  EXPECT_EQ(err(fs_.link("/f", "/missing/h")), ENOENT);
  tree_.dir("d");
  EXPECT_EQ(err(fs_.link("/d", "/d2")), EPERM);
  EXPECT_EQ(err(fs_.link("/", "/d2")), EPERM);
  EXPECT_EQ(err(fs_.link("/f/", "/h")), ENOTDIR);
  EXPECT_EQ(err(fs_.link("/f", "/h/")), ENOENT);
}

TEST_F(RootFsLinksTest, LinkCannotReachAFileOutsideTheRoot) {
  const std::string secret = tree_.base() + "/outside/secret";
  EXPECT_EQ(err(fs_.link("../outside/secret", "/x")), ENOENT);
  EXPECT_EQ(err(fs_.link("/../../../../outside/secret", "/x")), ENOENT);
  EXPECT_EQ(err(fs_.link(secret, "/x")), ENOENT);
  tree_.symlink("up", "../../outside");
  EXPECT_EQ(err(fs_.link("/up/secret", "/x")), ENOENT);
  // A symlink to it is linked as a symlink, whose target still resolves
  // inside the root.
  tree_.symlink("abs", secret);
  ASSERT_TRUE(fs_.link("/abs", "/x").ok());
  EXPECT_TRUE(S_ISLNK(hostLstat(tree_.inRoot("x")).st_mode));
  EXPECT_EQ(err(fs_.open("/x", O_RDONLY, 0)), ENOENT);
  EXPECT_EQ(hostLstat(secret).st_nlink, 1u) << "the host file was never linked";
  // Nor is the new name made outside.
  tree_.file("f", "");
  EXPECT_EQ(err(fs_.link("/f", "../../outside/planted")), ENOENT);
  EXPECT_FALSE(existsOnHost(tree_.base() + "/outside/planted"));
}

TEST_F(RootFsLinksTest, MknodMakesFifosFilesAndSocketsButNoDevices) {
  ASSERT_TRUE(fs_.mknod("/p", S_IFIFO | 0640, 0).ok());
  EXPECT_TRUE(S_ISFIFO(hostLstat(tree_.inRoot("p")).st_mode));
  ASSERT_TRUE(fs_.mknod("/r", S_IFREG | 0600, 0).ok());
  EXPECT_TRUE(S_ISREG(hostLstat(tree_.inRoot("r")).st_mode));
  ASSERT_TRUE(fs_.mknod("/r0", 0600, 0).ok());
  EXPECT_TRUE(S_ISREG(hostLstat(tree_.inRoot("r0")).st_mode)) << "type 0 is a regular file";
  ASSERT_TRUE(fs_.mknod("/s", S_IFSOCK | 0600, 0).ok());
  EXPECT_TRUE(S_ISSOCK(hostLstat(tree_.inRoot("s")).st_mode));

  EXPECT_EQ(err(fs_.mknod("/p", S_IFIFO | 0600, 0)), EEXIST);
  EXPECT_EQ(err(fs_.mknod("/missing/p", S_IFIFO | 0600, 0)), ENOENT);
  EXPECT_EQ(err(fs_.mknod("/dir", S_IFDIR | 0755, 0)), EINVAL);
  for (uint32_t type : {S_IFCHR, S_IFBLK}) {
    absl::Status s = fs_.mknod("/dev-node", type | 0666, makedev(1, 3));
    EXPECT_EQ(err(s), EPERM) << type;
    EXPECT_FALSE(errnoReason(s).empty()) << "the agent's own refusal";
  }
  EXPECT_FALSE(existsOnHost(tree_.inRoot("dev-node")));
  EXPECT_EQ(err(fs_.mknod("../../outside/p", S_IFIFO | 0600, 0)), ENOENT);
}

TEST_F(RootFsLinksTest, XattrRoundTrip) {
  std::string why;
  if (!userXattrs(&why)) GTEST_SKIP() << "the scratch file system takes no user.* xattrs: " << why;
  tree_.file("f", "x");
  EXPECT_EQ(err(fs_.getxattr("/f", "user.a", true)), ENODATA);
  const std::string value("v\0w", 3);
  ASSERT_TRUE(fs_.setxattr("/f", "user.a", value, 0, false).ok());
  EXPECT_EQ(fs_.getxattr("/f", "user.a", false).value_or("?"), value);
  char host[16];
  EXPECT_EQ(::getxattr(tree_.inRoot("f").c_str(), "user.a", host, sizeof host), 3);
  EXPECT_EQ(std::string(host, 3), value);

  EXPECT_EQ(err(fs_.setxattr("/f", "user.a", "x", XATTR_CREATE, false)), EEXIST);
  EXPECT_EQ(err(fs_.setxattr("/f", "user.b", "x", XATTR_REPLACE, false)), ENODATA);
  ASSERT_TRUE(fs_.setxattr("/f", "user.b", "", 0, false).ok());
  EXPECT_EQ(fs_.getxattr("/f", "user.b", false).value_or("?"), "");
  auto names = fs_.listxattr("/f", false);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(std::count(names->begin(), names->end(), "user.a"), 1);
  EXPECT_EQ(std::count(names->begin(), names->end(), "user.b"), 1);

  ASSERT_TRUE(fs_.removexattr("/f", "user.a", false).ok());
  EXPECT_EQ(err(fs_.removexattr("/f", "user.a", false)), ENODATA);
  EXPECT_EQ(err(fs_.getxattr("/f", "user.a", false)), ENODATA);
  // Limits, with the kernel's errnos.
  EXPECT_EQ(err(fs_.getxattr("/f", "user." + std::string(251, 'n'), false)), ERANGE);
  EXPECT_EQ(err(fs_.setxattr("/f", "", "x", 0, false)), ERANGE);
  EXPECT_EQ(err(fs_.setxattr("/f", "user.big", std::string(kMaxXattrValue + 1, 'x'), 0, false)),
            E2BIG);
  ASSERT_TRUE(fs_.setxattr("/f", "user.max", std::string(4000, 'm'), 0, false).ok());
  EXPECT_EQ(fs_.getxattr("/f", "user.max", false).value_or("?").size(), 4000u);
  EXPECT_EQ(err(fs_.getxattr("/missing", "user.a", false)), ENOENT);
  EXPECT_EQ(err(fs_.setxattr("/f", "bogus.ns", "x", 0, false)), EOPNOTSUPP);
}

TEST_F(RootFsLinksTest, XattrFollowsAFinalSymlinkOnlyWhenAsked) {
  std::string why;
  if (!userXattrs(&why)) GTEST_SKIP() << "the scratch file system takes no user.* xattrs: " << why;
  tree_.file("f", "x");
  ASSERT_EQ(::setxattr(tree_.inRoot("f").c_str(), "user.a", "val", 3, 0), 0);
  tree_.symlink("l", "/f");
  EXPECT_EQ(fs_.getxattr("/l", "user.a", true).value_or("?"), "val");
  // The link itself: user.* attributes are never on symlinks.
  EXPECT_EQ(err(fs_.getxattr("/l", "user.a", false)), ENODATA);
  auto own = fs_.listxattr("/l", false);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(std::count(own->begin(), own->end(), "user.a"), 0);
  auto followed = fs_.listxattr("/l", true);
  ASSERT_TRUE(followed.ok());
  EXPECT_EQ(std::count(followed->begin(), followed->end(), "user.a"), 1);
  EXPECT_EQ(err(fs_.setxattr("/l", "user.b", "1", 0, false)), EPERM);
  EXPECT_TRUE(fs_.setxattr("/l", "user.b", "1", 0, true).ok());
  char buf[4];
  EXPECT_EQ(::getxattr(tree_.inRoot("f").c_str(), "user.b", buf, sizeof buf), 1);
  EXPECT_TRUE(fs_.removexattr("/l", "user.b", true).ok());

  // The host file, through a symlink or "..", is never reached.
  const std::string secret = tree_.base() + "/outside/secret";
  ASSERT_EQ(::setxattr(secret.c_str(), "user.host", "h", 1, 0), 0);
  tree_.symlink("out", secret);
  EXPECT_EQ(err(fs_.getxattr("/out", "user.host", true)), ENOENT);
  EXPECT_EQ(err(fs_.getxattr("../outside/secret", "user.host", true)), ENOENT);
  EXPECT_EQ(err(fs_.setxattr("/out", "user.planted", "1", 0, true)), ENOENT);
  EXPECT_EQ(::getxattr(secret.c_str(), "user.planted", buf, sizeof buf), -1);
}

}  // namespace
}  // namespace siphon::agent::files
