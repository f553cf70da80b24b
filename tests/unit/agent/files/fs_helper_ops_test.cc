// The real file helper (siphon-agent fs-helper, targetless: this process's
// ids, no capabilities) serving symlink, link, mknod, the xattr calls, fsync
// and readdir with stats: what the agent runs, as opposed to the in-process
// LocalFileSystem of the other tests. Skips itself where the helper cannot
// take an identity (setgroups needs CAP_SETGID).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <variant>

#include "agent/files/fs_helper.h"
#include "siphon/status.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using R = v1::FileRequest;

class FsHelperOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HelperOptions o;
    o.exe = SIPHON_AGENT_BIN;
    o.root_fd = tree_.rootFd();
    o.target_pid = 0;
    fs_ = makeHelperFileSystem(o);
    R probe;
    probe.mutable_stat()->set_path("/");
    auto r = fs_->path(probe, false);
    if (!r.ok()) GTEST_SKIP() << "the file helper does not start here: " << r.status();
  }
  absl::StatusOr<v1::FileResponse> path(const R& r) { return fs_->path(r, false); }

  testing::ScratchTree tree_;
  std::shared_ptr<FileSystem> fs_;
};

TEST_F(FsHelperOpsTest, LinksNodesXattrsFsyncAndReaddirWithStat) {
  tree_.file("d/f", "abc");
  R sl;
  sl.mutable_symlink()->set_target("/d/f");
  sl.mutable_symlink()->set_linkpath("/d/sl");
  EXPECT_TRUE(path(sl).ok());
  R ln;
  ln.mutable_link()->set_existing("/d/f");
  ln.mutable_link()->set_newpath("/d/hard");
  EXPECT_TRUE(path(ln).ok());
  EXPECT_EQ(errnoOf(path(ln).status()), EEXIST) << "the kernel's errno through the helper";
  R mk;
  mk.mutable_mknod()->set_path("/d/fifo");
  mk.mutable_mknod()->set_mode(S_IFIFO | 0600);
  EXPECT_TRUE(path(mk).ok());
  mk.mutable_mknod()->set_mode(S_IFCHR | 0600);
  EXPECT_EQ(errnoOf(path(mk).status()), EPERM);

  // fsync on a handle of the helper.
  R open;
  open.mutable_open()->set_path("/d/f");
  open.mutable_open()->set_flags(O_WRONLY);
  auto file = fs_->open(open);
  EXPECT_TRUE(file.ok()) << file.status();
  if (file.ok()) {
    R sync;
    sync.mutable_fsync()->set_datasync(true);
    auto r = std::get<std::shared_ptr<FileObject>>(*file)->call(sync, 0);
    EXPECT_TRUE(r.ok() && r->has_done()) << r.status();
  }

  R od;
  od.mutable_opendir()->set_path("/d");
  auto dir = fs_->open(od);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto batch = std::get<std::shared_ptr<DirObject>>(*dir)->read(100, 1 << 20, true);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->entries_size(), 6);
  for (const auto& e : batch->entries()) {
    EXPECT_TRUE(e.has_stat()) << e.name() << ": with_stat lost on the way to the helper";
    if (e.name() == "sl") {
      EXPECT_TRUE(S_ISLNK(e.stat().mode()));
    }
    if (e.name() == "hard") {
      EXPECT_EQ(e.stat().nlink(), 2u);
    }
  }

  if (::setxattr(tree_.inRoot("d/f").c_str(), "user.probe", "1", 1, 0) != 0) {
    GTEST_SKIP() << "the scratch file system takes no user.* xattrs: " << std::strerror(errno);
  }
  R set;
  set.mutable_setxattr()->set_path("/d/sl");
  set.mutable_setxattr()->set_name("user.a");
  set.mutable_setxattr()->set_value("v");
  set.mutable_setxattr()->set_follow_symlinks(true);
  EXPECT_TRUE(path(set).ok());
  R get;
  get.mutable_getxattr()->set_path("/d/f");
  get.mutable_getxattr()->set_name("user.a");
  auto value = path(get);
  EXPECT_EQ(value.ok() ? value->xattr_value().value() : "?", "v") << value.status();
  get.mutable_getxattr()->set_path("/d/sl");  // the link itself
  EXPECT_EQ(errnoOf(path(get).status()), ENODATA);
  R list;
  list.mutable_listxattr()->set_path("/d/f");
  auto names = path(list);
  EXPECT_TRUE(names.ok() && names->xattr_names().names_size() >= 2) << names.status();
  R rm;
  rm.mutable_removexattr()->set_path("/d/f");
  rm.mutable_removexattr()->set_name("user.a");
  EXPECT_TRUE(path(rm).ok());
  EXPECT_EQ(errnoOf(path(rm).status()), ENODATA);
}

}  // namespace
}  // namespace siphon::agent::files
