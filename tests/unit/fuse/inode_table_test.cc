// The FUSE mount's node table: paths rebuilt from (parent, name), lookup
// counts, forgetting, removal and renames (plain, over an existing name,
// across directories, exchanged), the node of a removed name that is still
// held. No I/O.
#include "fuse/inode_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace siphon::fuse {
namespace {

constexpr uint64_t kRoot = InodeTable::kRootId;

TEST(InodeTableTest, PathsUnderTheRemoteDirectory) {
  InodeTable t("/var/log/");
  EXPECT_EQ(t.path(kRoot), "/var/log");
  const uint64_t app = t.lookup(kRoot, "app");
  const uint64_t file = t.lookup(app, "x.log");
  EXPECT_NE(app, 0u);
  EXPECT_NE(file, app);
  EXPECT_EQ(t.path(app), "/var/log/app");
  EXPECT_EQ(t.path(file), "/var/log/app/x.log");
  EXPECT_EQ(t.childPath(app, "y"), "/var/log/app/y");
  EXPECT_EQ(t.path(999), std::nullopt);
  EXPECT_EQ(t.lookup(999, "z"), 0u);  // an unknown parent

  InodeTable slash("/");
  const uint64_t etc = slash.lookup(kRoot, "etc");
  EXPECT_EQ(slash.path(etc), "/etc");
  EXPECT_EQ(slash.childPath(kRoot, "tmp"), "/tmp");
}

TEST(InodeTableTest, TheSameNameIsTheSameNodeUntilForgotten) {
  InodeTable t("/");
  const uint64_t a = t.lookup(kRoot, "a");
  EXPECT_EQ(t.lookup(kRoot, "a"), a);
  EXPECT_EQ(t.lookups(a), 2u);
  t.forget(a, 1);
  EXPECT_EQ(t.path(a), "/a");
  t.forget(a, 1);
  EXPECT_EQ(t.path(a), std::nullopt);
  EXPECT_EQ(t.size(), 1u);  // the root only
  const uint64_t again = t.lookup(kRoot, "a");
  EXPECT_NE(again, a);  // ids are not reused
  t.forget(kRoot, 100);
  EXPECT_EQ(t.path(kRoot), "/");  // the root stays
}

TEST(InodeTableTest, RefCountsOneMoreLookupOfAKnownNode) {
  InodeTable t("/");
  const uint64_t f = t.lookup(kRoot, "f");
  EXPECT_TRUE(t.ref(f));
  EXPECT_EQ(t.lookups(f), 2u);
  t.forget(f, 1);
  EXPECT_EQ(t.path(f), "/f");
  t.removed(kRoot, "f");
  EXPECT_FALSE(t.ref(f));  // removed: nothing to hand out
  EXPECT_FALSE(t.ref(12345));
}

TEST(InodeTableTest, AParentStaysWhileAChildIsHeld) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d");
  const uint64_t f = t.lookup(d, "f");
  t.forget(d, 1);
  EXPECT_EQ(t.path(f), "/d/f");  // d is still named by f
  t.forget(f, 1);
  EXPECT_EQ(t.size(), 1u);  // both gone
}

TEST(InodeTableTest, ARemovedNameKeepsItsNodeWithoutAPath) {
  InodeTable t("/");
  const uint64_t f = t.lookup(kRoot, "f");
  t.removed(kRoot, "f");
  EXPECT_EQ(t.path(f), std::nullopt);
  EXPECT_EQ(t.lookups(f), 1u);
  // A new file of that name is a new node.
  const uint64_t g = t.lookup(kRoot, "f");
  EXPECT_NE(g, f);
  EXPECT_EQ(t.path(g), "/f");
  t.forget(f, 1);
  EXPECT_EQ(t.path(g), "/f");
  EXPECT_EQ(t.size(), 2u);
}

TEST(InodeTableTest, RenameMovesADirectoryWithItsSubtree) {
  InodeTable t("/");
  const uint64_t a = t.lookup(kRoot, "a");
  const uint64_t b = t.lookup(kRoot, "b");
  const uint64_t deep = t.lookup(t.lookup(a, "x"), "deep");
  t.renamed(kRoot, "a", b, "moved");
  EXPECT_EQ(t.path(a), "/b/moved");
  EXPECT_EQ(t.path(deep), "/b/moved/x/deep");
  EXPECT_EQ(t.lookup(b, "moved"), a);
  EXPECT_NE(t.lookup(kRoot, "a"), a);  // the old name is free
}

TEST(InodeTableTest, RenameOntoAnExistingNameReplacesIt) {
  InodeTable t("/");
  const uint64_t src = t.lookup(kRoot, "new");
  const uint64_t dst = t.lookup(kRoot, "old");
  t.renamed(kRoot, "new", kRoot, "old");
  EXPECT_EQ(t.path(src), "/old");
  EXPECT_EQ(t.path(dst), std::nullopt);  // replaced; held until forgotten
  t.forget(dst, 1);
  EXPECT_EQ(t.path(src), "/old");
  // Renaming a name onto itself changes nothing.
  t.renamed(kRoot, "old", kRoot, "old");
  EXPECT_EQ(t.path(src), "/old");
}

TEST(InodeTableTest, ExchangeSwapsTheNames) {
  InodeTable t("/");
  const uint64_t d1 = t.lookup(kRoot, "d1");
  const uint64_t d2 = t.lookup(kRoot, "d2");
  const uint64_t a = t.lookup(d1, "a");
  const uint64_t b = t.lookup(d2, "b");
  t.renamed(d1, "a", d2, "b", /*exchange=*/true);
  EXPECT_EQ(t.path(a), "/d2/b");
  EXPECT_EQ(t.path(b), "/d1/a");
  EXPECT_EQ(t.lookup(d2, "b"), a);
  EXPECT_EQ(t.lookup(d1, "a"), b);
  // Each parent still counts one child: forgetting both directories leaves
  // them while the children are held.
  t.forget(d1, 1);
  t.forget(d2, 1);
  EXPECT_EQ(t.path(a), "/d2/b");
}

TEST(InodeTableTest, RenameOfANameNeverLookedUpOnlyFreesTheTarget) {
  InodeTable t("/");
  const uint64_t old = t.lookup(kRoot, "dst");
  t.renamed(kRoot, "unknown", kRoot, "dst");
  EXPECT_EQ(t.path(old), std::nullopt);
}

TEST(InodeTableTest, FindNamesANodeWithoutCountingALookup) {
  InodeTable t("/");
  const uint64_t d = t.lookup(kRoot, "d");
  const uint64_t f = t.lookup(d, "f");
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
