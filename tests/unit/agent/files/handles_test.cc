// Per-session handles (numbering, EBADF, EMFILE, session end) and batched
// directory reads.
#include "agent/files/handles.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
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
    auto d = OpenDir::create(*std::move(fd), tree_.rootFd());
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
    auto b = dir->read(3, 1 << 20, false);
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
  auto after = dir->read(3, 1 << 20, false);
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
    auto b = dir->read(100, 10, false);  // smaller than any entry
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
  auto b = dir->read(100, 1 << 20, false);
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

// The wire stat of `st` (lstat of the host path) field by field that
// matters: the same object, its type and size, its link count.
void expectSameObject(const v1::FileStat& got, const struct stat& want, const std::string& what) {
  EXPECT_EQ(got.ino(), want.st_ino) << what;
  EXPECT_EQ(got.dev(), want.st_dev) << what;
  EXPECT_EQ(got.mode(), want.st_mode) << what;
  EXPECT_EQ(got.nlink(), want.st_nlink) << what;
  EXPECT_EQ(got.size(), want.st_size) << what;
  EXPECT_EQ(got.uid(), want.st_uid) << what;
}

TEST_F(OpenDirTest, WithStatEachEntryCarriesItsLstat) {
  tree_.file("d/file", "abc");
  tree_.symlink("d/link", "/d/file");
  tree_.dir("d/sub");
  ASSERT_EQ(::mkfifo(tree_.inRoot("d/fifo").c_str(), 0600), 0) << std::strerror(errno);
  auto dir = open("/d");
  ASSERT_NE(dir, nullptr);
  auto b = dir->read(100, 1 << 20, true);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->entries_size(), 6);
  std::map<std::string, mode_t> types;
  for (const auto& e : b->entries()) {
    ASSERT_TRUE(e.has_stat()) << e.name();
    // "." is d, ".." the root (d's parent, inside the root).
    const std::string host = e.name() == "."    ? tree_.inRoot("d")
                             : e.name() == ".." ? tree_.root()
                                                : tree_.inRoot("d/" + e.name());
    struct stat want {};
    ASSERT_EQ(::lstat(host.c_str(), &want), 0) << host;
    expectSameObject(e.stat(), want, e.name());
    EXPECT_EQ(e.ino(), e.stat().ino()) << e.name();
    types[e.name()] = e.stat().mode() & S_IFMT;
  }
  EXPECT_EQ(types["link"], S_IFLNK) << "the symlink itself, not its target";
  EXPECT_EQ(types["fifo"], S_IFIFO);
  EXPECT_EQ(types["file"], S_IFREG);
  EXPECT_EQ(types["sub"], S_IFDIR);
}

TEST_F(OpenDirTest, WithoutStatNoEntryHasOne) {
  tree_.file("d/file", "abc");
  auto dir = open("/d");
  ASSERT_NE(dir, nullptr);
  // The first entry is held over (max 1) with a stat; asked without, it
  // comes without.
  auto first = dir->read(1, 1 << 20, true);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->entries(0).has_stat());
  auto rest = dir->read(100, 1 << 20, false);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->entries_size(), 2);
  for (const auto& e : rest->entries()) EXPECT_FALSE(e.has_stat()) << e.name();
}

// fstatat(root, "..") would describe the directory above the root (the
// scratch base here, the host's in the agent).
TEST_F(OpenDirTest, DotDotOfTheRootIsTheRootItself) {
  auto dir = open("/");
  ASSERT_NE(dir, nullptr);
  auto b = dir->read(100, 1 << 20, true);
  ASSERT_TRUE(b.ok());
  struct stat root {};
  struct stat base {};
  ASSERT_EQ(::stat(tree_.root().c_str(), &root), 0);
  ASSERT_EQ(::stat(tree_.base().c_str(), &base), 0);
  bool seen = false;
  for (const auto& e : b->entries()) {
    if (e.name() != "..") continue;
    seen = true;
    ASSERT_TRUE(e.has_stat());
    EXPECT_EQ(e.stat().ino(), root.st_ino);
    EXPECT_NE(e.stat().ino(), base.st_ino);
  }
  EXPECT_TRUE(seen);
}

// The kernel hands readdir a batch of names at once: those removed after
// that are still listed, without a stat; "." and ".." keep theirs.
TEST_F(OpenDirTest, AnEntryThatVanishedHasNoStat) {
  for (const char* n : {"a", "b", "c", "d", "e"}) tree_.file(std::string("d/") + n, "");
  auto dir = open("/d");
  ASSERT_NE(dir, nullptr);
  auto first = dir->read(1, 1 << 20, false);  // fills glibc's buffer with every name
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->entries_size(), 1);
  const std::string kept = first->entries(0).name();
  int removed = 0;
  for (const char* n : {"a", "b", "c", "d", "e"}) {
    if (kept != n) removed += std::filesystem::remove(tree_.inRoot(std::string("d/") + n)) ? 1 : 0;
  }
  int vanished = 0;
  for (int i = 0; i < 10; ++i) {
    auto more = dir->read(100, 1 << 20, true);
    ASSERT_TRUE(more.ok());
    for (const auto& e : more->entries()) {
      if (e.name() == "." || e.name() == "..") {
        EXPECT_TRUE(e.has_stat()) << e.name();
      } else {
        EXPECT_FALSE(e.has_stat()) << e.name();
        ++vanished;
      }
    }
    if (more->eof()) break;
  }
  EXPECT_EQ(vanished, removed) << "listed from the batch read before the removal";
}
}  // namespace
}  // namespace siphon::agent::files
