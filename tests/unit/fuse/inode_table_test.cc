// The FUSE mount's node table: paths rebuilt from (parent, name), lookup
// counts, forgetting, removal and renames (plain, over an existing name,
// across directories, exchanged), the node of a removed name that is still
// held, and a file's names as one node (hard links: the target's inode
// identity keys a file that is not a directory). No I/O.
#include "fuse/inode_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace siphon::fuse {
namespace {

constexpr uint64_t kRoot = InodeTable::kRootId;

// What the agent's lstat said was at a name: a directory, or a file whose
// inode number is `ino` (a new one each call unless given).
FileIdentity dir() { return FileIdentity{1, 0, S_IFDIR | 0755}; }
FileIdentity file(uint64_t ino = 0) {
  static uint64_t next = 1000000;
  return FileIdentity{1, ino != 0 ? ino : next++, S_IFREG | 0644};
}

TEST(InodeTableTest, PathsUnderTheRemoteDirectory) {
  InodeTable t("/var/log/");
  EXPECT_EQ(t.path(kRoot), "/var/log");
  const uint64_t app = t.lookup(kRoot, "app", dir());
  const uint64_t log = t.lookup(app, "x.log", file());
  EXPECT_NE(app, 0u);
  EXPECT_NE(log, app);
  EXPECT_EQ(t.path(app), "/var/log/app");
  EXPECT_EQ(t.path(log), "/var/log/app/x.log");
  EXPECT_EQ(t.childPath(app, "y"), "/var/log/app/y");
  EXPECT_EQ(t.path(999), std::nullopt);
  EXPECT_EQ(t.lookup(999, "z", dir()), 0u);  // an unknown parent

  InodeTable slash("/");
  const uint64_t etc = slash.lookup(kRoot, "etc", dir());
  EXPECT_EQ(slash.path(etc), "/etc");
  EXPECT_EQ(slash.childPath(kRoot, "tmp"), "/tmp");
}

TEST(InodeTableTest, TheSameNameIsTheSameNodeUntilForgotten) {
  InodeTable t("/");
  const uint64_t a = t.lookup(kRoot, "a", file(7));
  EXPECT_EQ(t.lookup(kRoot, "a", file(7)), a);
  EXPECT_EQ(t.lookups(a), 2u);
  t.forget(a, 1);
  EXPECT_EQ(t.path(a), "/a");
  t.forget(a, 1);
  EXPECT_EQ(t.path(a), std::nullopt);
  EXPECT_EQ(t.size(), 1u);  // the root only
  const uint64_t again = t.lookup(kRoot, "a", file(7));
  EXPECT_NE(again, a);  // ids are not reused
  t.forget(kRoot, 100);
  EXPECT_EQ(t.path(kRoot), "/");  // the root stays
  // A directory is the same node by its name.
  const uint64_t d = t.lookup(kRoot, "d", dir());
  EXPECT_EQ(t.lookup(kRoot, "d", dir()), d);
  EXPECT_EQ(t.lookups(d), 2u);
}

TEST(InodeTableTest, AParentStaysWhileAChildIsHeld) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d", dir());
  const uint64_t f = t.lookup(d, "f", file());
  t.forget(d, 1);
  EXPECT_EQ(t.path(f), "/d/f");  // d is still named by f
  t.forget(f, 1);
  EXPECT_EQ(t.size(), 1u);  // both gone
}

TEST(InodeTableTest, ARemovedNameKeepsItsNodeWithoutAPath) {
  InodeTable t("/");
  const uint64_t f = t.lookup(kRoot, "f", file(5));
  t.removed(kRoot, "f");
  EXPECT_EQ(t.path(f), std::nullopt);
  EXPECT_EQ(t.lookups(f), 1u);
  // A new file of that name is a new node.
  const uint64_t g = t.lookup(kRoot, "f", file(6));
  EXPECT_NE(g, f);
  EXPECT_EQ(t.path(g), "/f");
  t.forget(f, 1);
  EXPECT_EQ(t.path(g), "/f");
  EXPECT_EQ(t.size(), 2u);
}

TEST(InodeTableTest, EveryNameOfAFileIsOneNode) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d", dir());
  const uint64_t x = t.lookup(kRoot, "x", file(9));
  EXPECT_EQ(t.lookup(d, "y", file(9)), x) << "a second name of inode 9";
  EXPECT_EQ(t.lookups(x), 2u);
  EXPECT_EQ(t.find(kRoot, "x"), x);
  EXPECT_EQ(t.find(d, "y"), x);
  EXPECT_EQ(t.namesOf(x), (std::vector<std::pair<uint64_t, std::string>>{{kRoot, "x"}, {d, "y"}}));
  EXPECT_EQ(t.path(x), "/x");
  // The same inode number on another device, or of another type, is
  // another file.
  EXPECT_NE(t.lookup(kRoot, "other-dev", FileIdentity{2, 9, S_IFREG | 0644}), x);
  EXPECT_NE(t.lookup(kRoot, "link", FileIdentity{1, 9, S_IFLNK | 0777}), x);

  // unlink x: the node is the file's, reachable by its other name.
  t.removed(kRoot, "x");
  EXPECT_EQ(t.path(x), "/d/y");
  EXPECT_EQ(t.find(kRoot, "x"), 0u);
  EXPECT_EQ(t.lookups(x), 2u);
  // The kernel forgets both lookups: the node goes with its last name.
  t.forget(x, 2);
  EXPECT_FALSE(t.known(x));
  EXPECT_EQ(t.find(d, "y"), 0u);
}

// link x y; unlink x; then y is the file (lstat, chmod, link y z).
TEST(InodeTableTest, ALinkThenAnUnlinkLeavesTheFileAtItsNewName) {
  InodeTable t("/");
  const uint64_t x = t.lookup(kRoot, "x", file(11));
  // The link's reply: the new name's lstat, the same inode.
  EXPECT_EQ(t.lookup(kRoot, "y", file(11)), x);
  t.removed(kRoot, "x");
  EXPECT_EQ(t.path(x), "/y");
  EXPECT_EQ(t.lookup(kRoot, "z", file(11)), x);
  t.renamed(kRoot, "y", kRoot, "w");
  EXPECT_EQ(t.path(x), "/z");
  EXPECT_EQ(t.find(kRoot, "w"), x);
  t.removed(kRoot, "z");
  EXPECT_EQ(t.path(x), "/w");
  t.removed(kRoot, "w");
  EXPECT_EQ(t.path(x), std::nullopt) << "no name left";
  EXPECT_TRUE(t.known(x)) << "held by the kernel until forgotten";
}

TEST(InodeTableTest, ANameThatNowNamesAnotherFileLeavesItsOldNode) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d", dir());
  const uint64_t a = t.lookup(d, "f", file(1));
  const uint64_t b = t.lookup(d, "f", file(2));  // replaced in the target
  EXPECT_NE(a, b);
  EXPECT_EQ(t.find(d, "f"), b);
  EXPECT_EQ(t.path(a), std::nullopt);
  EXPECT_EQ(t.path(b), "/d/f");
  t.forget(a, 1);
  EXPECT_FALSE(t.known(a));
  EXPECT_EQ(t.path(b), "/d/f") << "the name stays the new file's";
  // A directory where a file was, and a file where a directory was.
  const uint64_t sub = t.lookup(d, "f", dir());
  EXPECT_NE(sub, b);
  EXPECT_EQ(t.path(b), std::nullopt);
  const uint64_t again = t.lookup(d, "f", file(3));
  EXPECT_NE(again, sub);
  EXPECT_EQ(t.path(sub), std::nullopt);
  // The directory d lost no child in all this: it stays while forgotten.
  t.forget(d, 1);
  EXPECT_EQ(t.path(again), "/d/f");
}

TEST(InodeTableTest, RenameMovesADirectoryWithItsSubtree) {
  InodeTable t("/");
  const uint64_t a = t.lookup(kRoot, "a", dir());
  const uint64_t b = t.lookup(kRoot, "b", dir());
  const uint64_t deep = t.lookup(t.lookup(a, "x", dir()), "deep", file());
  t.renamed(kRoot, "a", b, "moved");
  EXPECT_EQ(t.path(a), "/b/moved");
  EXPECT_EQ(t.path(deep), "/b/moved/x/deep");
  EXPECT_EQ(t.lookup(b, "moved", dir()), a);
  EXPECT_NE(t.lookup(kRoot, "a", dir()), a);  // the old name is free
}

TEST(InodeTableTest, RenameOntoAnExistingNameReplacesIt) {
  InodeTable t("/");
  const uint64_t src = t.lookup(kRoot, "new", file(1));
  const uint64_t dst = t.lookup(kRoot, "old", file(2));
  t.renamed(kRoot, "new", kRoot, "old");
  EXPECT_EQ(t.path(src), "/old");
  EXPECT_EQ(t.path(dst), std::nullopt);  // replaced; held until forgotten
  t.forget(dst, 1);
  EXPECT_EQ(t.path(src), "/old");
  // Renaming a name onto itself changes nothing.
  t.renamed(kRoot, "old", kRoot, "old");
  EXPECT_EQ(t.path(src), "/old");
}

TEST(InodeTableTest, RenameBetweenTwoNamesOfOneFileChangesNothing) {
  InodeTable t("/");
  const uint64_t f = t.lookup(kRoot, "a", file(4));
  EXPECT_EQ(t.lookup(kRoot, "b", file(4)), f);
  t.renamed(kRoot, "a", kRoot, "b");
  EXPECT_EQ(t.find(kRoot, "a"), f);
  EXPECT_EQ(t.find(kRoot, "b"), f);
  t.renamed(kRoot, "a", kRoot, "b", /*exchange=*/true);
  EXPECT_EQ(t.namesOf(f).size(), 2u);
}

TEST(InodeTableTest, ExchangeSwapsTheNames) {
  InodeTable t("/");
  const uint64_t d1 = t.lookup(kRoot, "d1", dir());
  const uint64_t d2 = t.lookup(kRoot, "d2", dir());
  const uint64_t a = t.lookup(d1, "a", file(1));
  const uint64_t b = t.lookup(d2, "b", file(2));
  t.renamed(d1, "a", d2, "b", /*exchange=*/true);
  EXPECT_EQ(t.path(a), "/d2/b");
  EXPECT_EQ(t.path(b), "/d1/a");
  EXPECT_EQ(t.lookup(d2, "b", file(1)), a);
  EXPECT_EQ(t.lookup(d1, "a", file(2)), b);
  // Each parent still counts one child: forgetting both directories leaves
  // them while the children are held.
  t.forget(d1, 1);
  t.forget(d2, 1);
  EXPECT_EQ(t.path(a), "/d2/b");
}

TEST(InodeTableTest, RenameOfANameNeverLookedUpOnlyFreesTheTarget) {
  InodeTable t("/");
  const uint64_t old = t.lookup(kRoot, "dst", file());
  t.renamed(kRoot, "unknown", kRoot, "dst");
  EXPECT_EQ(t.path(old), std::nullopt);
}

// A forgotten directory goes when the last name in it goes, though a file
// of that name lives on by another name.
TEST(InodeTableTest, ADirectoryGoesWithTheLastNameInIt) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d", dir());
  const uint64_t f = t.lookup(d, "f", file(8));
  EXPECT_EQ(t.lookup(kRoot, "g", file(8)), f);
  t.forget(d, 1);
  EXPECT_TRUE(t.known(d));
  t.removed(d, "f");
  EXPECT_FALSE(t.known(d));
  EXPECT_EQ(t.path(f), "/g");
  EXPECT_EQ(t.size(), 2u);
}

TEST(InodeTableTest, FindNamesANodeWithoutCountingALookup) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d", dir());
  const uint64_t f = t.lookup(d, "f", file());
  EXPECT_EQ(t.find(d, "f"), f);
  EXPECT_EQ(t.find(d, "g"), 0u);
  EXPECT_EQ(t.find(12345, "f"), 0u);
  EXPECT_EQ(t.lookups(f), 1u) << "find counts nothing";
  EXPECT_TRUE(t.known(f));
  EXPECT_EQ(t.parentOf(f), d);
  EXPECT_EQ(t.parentOf(d), kRoot);
  EXPECT_EQ(t.parentOf(kRoot), 0u);
  auto ids = t.ids();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{kRoot, d, f}));
  // Forgotten: gone from find, known and ids (the root stays).
  t.forget(f, 1);
  EXPECT_EQ(t.find(d, "f"), 0u);
  EXPECT_FALSE(t.known(f));
  t.forget(d, 1);
  EXPECT_EQ(t.ids(), (std::vector<uint64_t>{kRoot}));
}

}  // namespace
}  // namespace siphon::fuse
