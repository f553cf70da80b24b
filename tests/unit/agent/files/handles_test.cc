// Per-session handles (numbering, EBADF, EMFILE, session end) and batched
// directory reads.
#include "agent/files/handles.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "agent/files/root_fs.h"
#include "siphon/status.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using testing::ScratchTree;

std::shared_ptr<OpenFile> devNull() {
  return std::make_shared<OpenFile>(UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)));
}

bool fdIsOpen(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

TEST(HandleTableTest, HandlesCountFromOnePerSessionAndAreNeverReused) {
  HandleTable t(8);
  EXPECT_EQ(t.add("s1", devNull()).value_or(0), 1u);
  EXPECT_EQ(t.add("s1", devNull()).value_or(0), 2u);
  EXPECT_EQ(t.add("s2", devNull()).value_or(0), 1u) << "each session counts on its own";
  ASSERT_TRUE(t.remove("s1", 1, false, "close").ok());
  EXPECT_EQ(t.add("s1", devNull()).value_or(0), 3u) << "1 is closed, not handed out again";
  EXPECT_EQ(t.count("s1"), 2u);
}

TEST(HandleTableTest, ForeignClosedAndWrongKindHandlesAreEbadf) {
  HandleTable t(8);
  ASSERT_EQ(t.add("s1", devNull()).value_or(0), 1u);
  EXPECT_TRUE(t.file("s1", 1, "read").ok());
  EXPECT_EQ(errnoOf(t.file("s2", 1, "read").status()), EBADF) << "another session's handle";
  EXPECT_EQ(errnoOf(t.file("s1", 2, "read").status()), EBADF) << "never opened";
  EXPECT_EQ(errnoOf(t.dir("s1", 1, "readdir").status()), EBADF) << "a file, not a dir";
  EXPECT_EQ(errnoOf(t.remove("s1", 1, true, "closedir").status()), EBADF);
  EXPECT_EQ(errnoOf(t.remove("s2", 1, false, "close").status()), EBADF);
  ASSERT_TRUE(t.remove("s1", 1, false, "close").ok());
  auto again = t.file("s1", 1, "pread");
  EXPECT_EQ(errnoOf(again.status()), EBADF) << "closed";
  EXPECT_EQ(std::string(again.status().message()), "pread fd 1: Bad file descriptor");
  EXPECT_EQ(errnoOf(t.remove("s1", 1, false, "close").status()), EBADF) << "closed twice";
}

TEST(HandleTableTest, SessionLimitIsEmfile) {
  HandleTable t(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t.add("s", devNull()).ok());
  EXPECT_TRUE(t.full("s"));
  EXPECT_EQ(errnoOf(t.add("s", devNull()).status()), EMFILE);
  EXPECT_FALSE(t.full("other")) << "the limit is per session";
  ASSERT_TRUE(t.remove("s", 2, false, "close").ok());
  EXPECT_TRUE(t.add("s", devNull()).ok()) << "room again after a close";
}

TEST(HandleTableTest, SessionEndTakesEveryHandleAndClosesThem) {
  HandleTable t(8);
  auto a = devNull();
  const int fd = a->fd.get();
  ASSERT_TRUE(t.add("s", a).ok());
  ASSERT_TRUE(t.add("s", devNull()).ok());
  ASSERT_TRUE(t.add("keep", devNull()).ok());
  a.reset();
  EXPECT_TRUE(fdIsOpen(fd));
  {
    auto gone = t.removeSession("s");
    EXPECT_EQ(gone.size(), 2u);
    EXPECT_EQ(t.count("s"), 0u);
    EXPECT_EQ(errnoOf(t.file("s", 1, "read").status()), EBADF);
  }
  EXPECT_FALSE(fdIsOpen(fd)) << "the last reference closed the fd";
  EXPECT_EQ(t.count("keep"), 1u);
  EXPECT_TRUE(t.removeSession("never-seen").empty());
}

TEST(HandleTableTest, AJobHoldingAFileKeepsItsFdOpenPastClose) {
  HandleTable t(8);
  ASSERT_TRUE(t.add("s", devNull()).ok());
  auto held = t.file("s", 1, "pread");  // what a running job holds
  ASSERT_TRUE(held.ok());
  const int fd = static_cast<OpenFile&>(**held).fd.get();
  { auto removed = t.remove("s", 1, false, "close"); }
  EXPECT_TRUE(fdIsOpen(fd)) << "no reuse of the number while the job runs";
  held = absl::StatusOr<std::shared_ptr<FileObject>>();
  EXPECT_FALSE(fdIsOpen(fd));
}

class OpenDirTest : public ::testing::Test {
 protected:
  std::shared_ptr<OpenDir> open(const std::string& path) {
    RootFs fs(tree_.rootFd());
    auto fd = fs.openDir(path);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return nullptr;
    auto d = OpenDir::create(*std::move(fd));
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : nullptr;
  }
  ScratchTree tree_;
};

TEST_F(OpenDirTest, BatchesCoverEveryEntryOnceWithAnExactEof) {
  tree_.dir("d");
  for (int i = 0; i < 10; ++i) tree_.file("d/f" + std::to_string(i), "");
  auto dir = open("/d");
  ASSERT_NE(dir, nullptr);
  std::multiset<std::string> names;
  int batches = 0;
  bool eof = false;
  while (!eof) {
    auto b = dir->read(3, 1 << 20);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_LE(b->entries_size(), 3);
    for (const auto& e : b->entries()) names.insert(e.name());
    eof = b->eof();
    ++batches;
    ASSERT_LT(batches, 20);
  }
  EXPECT_EQ(names.size(), 12u) << "ten files, '.' and '..'";
  EXPECT_EQ(names.count("."), 1u);
  EXPECT_EQ(names.count("f7"), 1u);
  EXPECT_EQ(batches, 4) << "12 entries in batches of 3: eof comes with the last";
  auto after = dir->read(3, 1 << 20);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->entries_size(), 0);
  EXPECT_TRUE(after->eof());
}

TEST_F(OpenDirTest, ByteBudgetSplitsBatchesButAlwaysMovesForward) {
  tree_.dir("d");
  tree_.file("d/" + std::string(200, 'a'), "");
  tree_.file("d/" + std::string(200, 'b'), "");
  auto dir = open("/d");
  ASSERT_NE(dir, nullptr);
  size_t total = 0;
  for (int i = 0; i < 10; ++i) {
    auto b = dir->read(100, 10);  // smaller than any entry
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->entries_size(), 1) << "one entry even when it alone is over budget";
    total += b->entries_size();
    if (b->eof()) break;
  }
  EXPECT_EQ(total, 4u);
}

TEST_F(OpenDirTest, EntryTypes) {
  tree_.dir("d/sub");
  tree_.file("d/file", "");
  tree_.symlink("d/link", "file");
  auto dir = open("/d");
  ASSERT_NE(dir, nullptr);
  auto b = dir->read(100, 1 << 20);
  ASSERT_TRUE(b.ok());
  std::map<std::string, uint32_t> types;
  for (const auto& e : b->entries()) types[e.name()] = e.type();
  // tmpfs and ext4 fill d_type; DT_UNKNOWN would also be legal.
  if (types["file"] != DT_UNKNOWN) {
    EXPECT_EQ(types["file"], DT_REG);
    EXPECT_EQ(types["sub"], DT_DIR);
    EXPECT_EQ(types["link"], DT_LNK);
  }
}

}  // namespace
}  // namespace siphon::agent::files
