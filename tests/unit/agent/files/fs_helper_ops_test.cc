// The real file helper (siphon-agent fs-helper, targetless: this process's
// ids, no capabilities) serving symlink, link, mknod, the xattr calls, fsync
// and readdir with stats: what the agent runs, as opposed to the in-process
// LocalFileSystem of the other tests. Skips itself where the helper cannot
// take an identity (setgroups needs CAP_SETGID).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

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

using testing::fdsOpenOn;

// `path` in the helper's root, opened with `flags`.
absl::StatusOr<Handle> openIn(FileSystem& fs, const std::string& path, int flags) {
  R open;
  open.mutable_open()->set_path(path);
  open.mutable_open()->set_flags(flags);
  return fs.open(open);
}

// The file helpers this process runs (its children running fs-helper).
std::vector<pid_t> helpers() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::istringstream children(testing::ScratchTree::read(t.path().string() + "/children"));
    pid_t pid = 0;
    while (children >> pid) {
      const std::string cmd =
          testing::ScratchTree::read("/proc/" + std::to_string(pid) + "/cmdline");
      if (cmd.find("fs-helper") != std::string::npos) out.push_back(pid);
    }
  }
  return out;
}

// /proc/PID/io's rchar: bytes the process read (files and sockets); nullopt
// where this process may not see it.
std::optional<uint64_t> rcharOf(pid_t pid) {
  std::istringstream in(testing::ScratchTree::read("/proc/" + std::to_string(pid) + "/io"));
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "rchar:") return value;
  }
  return std::nullopt;
}

// A regular file's reads are the agent's own, on the descriptor the helper
// passed with the open (the same open file: one offset, seen by the
// helper's seeks and writes and by the agent's reads alike); writes, seeks
// and the rest still go to the helper, and close gives the descriptor back.
TEST_F(FsHelperOpsTest, ARegularFileIsReadOnTheHelpersDescriptorInTheAgent) {
  const std::string big(8 << 20, 'b');
  tree_.file("f", "0123456789");
  tree_.file("big", big);
  auto h = openIn(*fs_, "/f", O_RDWR);
  ASSERT_TRUE(h.ok()) << h.status();
  auto file = std::get<std::shared_ptr<FileObject>>(*h);
  EXPECT_EQ(fdsOpenOn(tree_.inRoot("f")), 1) << "the helper's descriptor, passed to the agent";

  R read;
  read.mutable_read()->set_size(4);
  auto a = file->call(read, 1 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->data().data(), "0123");
  // The helper's write moves the shared offset; the agent's read follows.
  R write;
  write.mutable_write()->set_data("ab");
  ASSERT_TRUE(file->call(write, 1 << 20).ok());
  auto b = file->call(read, 1 << 20);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data().data(), "6789");
  R seek;
  seek.mutable_seek()->set_offset(2);
  seek.mutable_seek()->set_whence(SEEK_SET);
  ASSERT_TRUE(file->call(seek, 1 << 20).ok());
  auto c = file->call(read, 1 << 20);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data().data(), "23ab");
  R pread;
  pread.mutable_pread()->set_size(100);
  pread.mutable_pread()->set_offset(8);
  auto d = file->call(pread, 1 << 20);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->data().data(), "89");
  EXPECT_TRUE(d->data().eof());
  EXPECT_TRUE(file->close().ok());
  EXPECT_EQ(fdsOpenOn(tree_.inRoot("f")), 0) << "close gives the descriptor back";
  file.reset();

  // 8 MiB read: the helper reads (nearly) none of it where its counters
  // can be seen (a helper that is not dumpable hides them from a user).
  auto hb = openIn(*fs_, "/big", O_RDONLY);
  ASSERT_TRUE(hb.ok()) << hb.status();
  auto fb = std::get<std::shared_ptr<FileObject>>(*hb);
  const std::vector<pid_t> running = helpers();
  ASSERT_EQ(running.size(), 1u);
  const std::optional<uint64_t> before = rcharOf(running[0]);
  std::string got;
  R chunk;
  chunk.mutable_read()->set_size(1 << 20);
  for (;;) {
    auto r = fb->call(chunk, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    got += r->data().data();
    if (r->data().data().empty() || r->data().eof()) break;
  }
  EXPECT_TRUE(got == big) << got.size();
  if (const std::optional<uint64_t> after = rcharOf(running[0]); before && after) {
    EXPECT_LT(*after - *before, 1u << 20) << "the helper read the bytes itself";
  }
}

// The agent holds at most a quarter of its descriptor limit for files it
// reads itself; past that, files are read through the helper, and read the
// same.
TEST(FsHelperBudgetTest, PastItsShareOfDescriptorsTheAgentReadsThroughTheHelper) {
  struct rlimit was {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  struct rlimit low = was;
  low.rlim_cur = 64;  // a budget of 16
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  testing::ScratchTree tree;
  HelperOptions o;
  o.exe = SIPHON_AGENT_BIN;
  o.root_fd = tree.rootFd();
  auto fs = makeHelperFileSystem(o);
  ::setrlimit(RLIMIT_NOFILE, &was);  // the budget was taken at creation
  std::vector<std::shared_ptr<FileObject>> files;
  int passed = 0;
  for (int i = 0; i < 20; ++i) {
    const std::string name = "f" + std::to_string(i);
    tree.file(name, "content " + std::to_string(i));
    auto h = openIn(*fs, "/" + name, O_RDONLY);
    if (!h.ok() && i == 0) GTEST_SKIP() << "the file helper does not start here: " << h.status();
    ASSERT_TRUE(h.ok()) << h.status();
    files.push_back(std::get<std::shared_ptr<FileObject>>(*h));
    passed += fdsOpenOn(tree.inRoot(name));
  }
  EXPECT_EQ(passed, 16);
  for (int i = 0; i < 20; ++i) {
    R read;
    read.mutable_read()->set_size(100);
    auto r = files[i]->call(read, 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->data().data(), "content " + std::to_string(i));
  }
  // Closed ones give their share back.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(files[i]->close().ok());
  files.erase(files.begin(), files.begin() + 4);
  tree.file("late", "late");
  auto h = openIn(*fs, "/late", O_RDONLY);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(fdsOpenOn(tree.inRoot("late")), 1);
}

// A file of procfs is read by the helper, never on a descriptor in the
// agent: some of its files check the reader at each read, and the agent is
// not the target.
TEST_F(FsHelperOpsTest, AProcFileIsReadByTheHelperItself) {
  tree_.dir("proc");
  if (::mount("proc", tree_.inRoot("proc").c_str(), "proc", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount proc here: " << std::strerror(errno);
  }
  auto h = openIn(*fs_, "/proc/version", O_RDONLY);
  EXPECT_TRUE(h.ok()) << h.status();
  if (h.ok()) {
    EXPECT_EQ(fdsOpenOn(tree_.inRoot("proc/version")), 0)
        << "a procfs descriptor was passed to the agent";
    auto file = std::get<std::shared_ptr<FileObject>>(*h);
    R read;
    read.mutable_read()->set_size(4096);
    auto r = file->call(read, 1 << 20);
    EXPECT_TRUE(r.ok() && r->data().data().rfind("Linux", 0) == 0) << r.status();
    EXPECT_TRUE(file->close().ok());
  }
  h = absl::InternalError("released");
  ::umount2(tree_.inRoot("proc").c_str(), MNT_DETACH);
}

// Opened for writing only, or not a regular file: nothing is passed, and
// everything goes through the helper as before.
TEST_F(FsHelperOpsTest, AWriteOnlyFileOrADirectoryKeepsItsDescriptorInTheHelper) {
  tree_.file("w", "");
  auto h = openIn(*fs_, "/w", O_WRONLY);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(fdsOpenOn(tree_.inRoot("w")), 0);
  auto file = std::get<std::shared_ptr<FileObject>>(*h);
  R write;
  write.mutable_write()->set_data("xyz");
  auto w = file->call(write, 1 << 20);
  ASSERT_TRUE(w.ok()) << w.status();
  R read;
  read.mutable_read()->set_size(3);
  EXPECT_EQ(errnoOf(file->call(read, 1 << 20).status()), EBADF) << "the kernel's answer";
  EXPECT_TRUE(file->close().ok());
  EXPECT_EQ(testing::ScratchTree::read(tree_.inRoot("w")), "xyz");
}

}  // namespace
}  // namespace siphon::agent::files
