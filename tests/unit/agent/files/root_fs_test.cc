// RootFs against a scratch directory used as the target's root: escapes by
// "..", absolute symlinks, symlink chains and procfs magic links stay inside
// (or fail), and each operation does what its syscall does, on the right
// object. No root needed.
#include "agent/files/root_fs.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "siphon/status.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using ::testing::HasSubstr;
using testing::ScratchTree;

class RootFsTest : public ::testing::Test {
 protected:
  RootFsTest() : fs_(tree_.rootFd()) {}

  // The whole content of `path` read through the root, or its status.
  absl::StatusOr<std::string> readAll(const std::string& path) {
    auto fd = fs_.open(path, O_RDONLY, 0);
    if (!fd.ok()) return fd.status();
    std::string out;
    while (true) {
      auto d = preadFd(fd->get(), 4096, static_cast<int64_t>(out.size()));
      if (!d.ok()) return d.status();
      out += d->data();
      if (d->eof()) return out;
    }
  }

  // errno of a failed status (0 when it succeeded).
  template <typename T>
  static int err(const T& s) {
    if constexpr (std::is_same_v<T, absl::Status>) {
      return errnoOf(s);
    } else {
      return errnoOf(s.status());
    }
  }

  ScratchTree tree_;
  RootFs fs_;
};

TEST_F(RootFsTest, ReadsAFileInsideTheRoot) {
  tree_.file("etc/hostname", "pod-host\n");
  EXPECT_EQ(readAll("/etc/hostname").value_or("?"), "pod-host\n");
  EXPECT_EQ(readAll("etc/hostname").value_or("?"), "pod-host\n");  // relative = from the root
  EXPECT_EQ(err(readAll("/etc/missing")), ENOENT);
}

TEST_F(RootFsTest, DotDotStopsAtTheRoot) {
  // "../outside/secret" from the root would be the host file; inside, the
  // walk clamps at "/", so it names ROOT/outside/secret.
  EXPECT_EQ(err(readAll("../outside/secret")), ENOENT);
  EXPECT_EQ(err(readAll("/../../../../../outside/secret")), ENOENT);
  EXPECT_EQ(err(readAll("etc/../../outside/secret")), ENOENT);
  // The host path spelled out is taken relative to the root as well.
  EXPECT_EQ(err(readAll(tree_.base() + "/outside/secret")), ENOENT);

  tree_.file("outside/secret", "pod-secret");
  EXPECT_EQ(readAll("../outside/secret").value_or("?"), "pod-secret");
  EXPECT_EQ(readAll("/../../../../../outside/secret").value_or("?"), "pod-secret");
}

TEST_F(RootFsTest, AbsoluteSymlinksResolveInsideTheRoot) {
  tree_.dir("etc");
  // Planted by the "target": an absolute link to a host path.
  tree_.symlink("etc/passwd", tree_.base() + "/outside/secret");
  EXPECT_EQ(err(readAll("/etc/passwd")), ENOENT);
  EXPECT_EQ(err(fs_.stat("/etc/passwd", true)), ENOENT);

  // The same path inside the root is what it names.
  tree_.file(tree_.base().substr(1) + "/outside/secret", "in-root copy");
  EXPECT_EQ(readAll("/etc/passwd").value_or("?"), "in-root copy");
}

TEST_F(RootFsTest, RelativeSymlinkChainsStayInside) {
  tree_.dir("a/b");
  tree_.symlink("up", "../../../../../../..");
  tree_.symlink("a/b/hop", "../../up");
  tree_.symlink("a/chain", "b/hop/outside/secret");
  EXPECT_EQ(err(readAll("/a/chain")), ENOENT);
  EXPECT_EQ(err(readAll("/up/outside/secret")), ENOENT);
  tree_.file("outside/secret", "pod-secret");
  EXPECT_EQ(readAll("/a/chain").value_or("?"), "pod-secret");
  EXPECT_EQ(readAll("/a/b/hop/up/up/outside/secret").value_or("?"), "pod-secret");
}

TEST_F(RootFsTest, SymlinkToProcSelfRootStaysInside) {
  // Without /proc inside the root, the link names ROOT/proc/self/root.
  tree_.symlink("escape", "/proc/self/root");
  EXPECT_EQ(err(readAll("/escape" + tree_.base() + "/outside/secret")), ENOENT);
}

TEST_F(RootFsTest, ProcMagicLinksAreRefused) {
  // With a real procfs under the root (here: the host's "/" as the root),
  // /proc/self/root is a magic link to the caller's root: ELOOP, never
  // followed.
  UniqueFd slash(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(slash.valid());
  RootFs host(slash.get());
  const std::string secret = tree_.base() + "/outside/secret";
  EXPECT_EQ(errnoOf(host.open("/proc/self/root" + secret, O_RDONLY, 0).status()), ELOOP);
  EXPECT_EQ(errnoOf(host.stat("/proc/self/cwd", true).status()), ELOOP);
  // Another process's root is a magic link too (EACCES first when the
  // caller may not ptrace it).
  const int other = errnoOf(host.stat("/proc/1/root/etc", true).status());
  EXPECT_TRUE(other == ELOOP || other == EACCES) << other;
  // A plain file of procfs is fine.
  EXPECT_TRUE(host.stat("/proc/self/status", true).ok());
}

TEST_F(RootFsTest, StatAndLstat) {
  tree_.file("f", "12345");
  tree_.symlink("l", "f");
  auto st = fs_.stat("/l", true);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(S_ISREG(st->mode()));
  EXPECT_EQ(st->size(), 5);
  auto lst = fs_.stat("/l", false);
  ASSERT_TRUE(lst.ok()) << lst.status();
  EXPECT_TRUE(S_ISLNK(lst->mode()));
  EXPECT_EQ(lst->size(), 1);  // "f"

  // lstat of a link to a host path describes the link, nothing else.
  tree_.symlink("host", tree_.base() + "/outside/secret");
  auto hl = fs_.stat("/host", false);
  ASSERT_TRUE(hl.ok()) << hl.status();
  EXPECT_TRUE(S_ISLNK(hl->mode()));
  EXPECT_EQ(err(fs_.stat("/host", true)), ENOENT);
}

TEST_F(RootFsTest, ReadlinkReturnsTheTargetAsWritten) {
  tree_.symlink("l", "/etc/../outside/secret");
  EXPECT_EQ(fs_.readlink("/l").value_or("?"), "/etc/../outside/secret");
  tree_.file("f", "x");
  EXPECT_EQ(err(fs_.readlink("/f")), EINVAL);
  EXPECT_EQ(err(fs_.readlink("/missing")), ENOENT);
}

TEST_F(RootFsTest, StatfsAndAccess) {
  tree_.file("f", "x");
  auto sf = fs_.statfs("/f");
  ASSERT_TRUE(sf.ok()) << sf.status();
  EXPECT_GT(sf->bsize(), 0u);
  EXPECT_TRUE(fs_.access("/f", R_OK, false).ok());
  EXPECT_EQ(err(fs_.access("/f", W_OK, true)), EROFS);
  EXPECT_EQ(err(fs_.access("/missing", W_OK, true)), ENOENT) << "existence is checked first";
  EXPECT_EQ(err(fs_.access("/f", X_OK, false)), EACCES);
  EXPECT_EQ(err(fs_.access("/f", 0x40, false)), EINVAL);
}

TEST_F(RootFsTest, MkdirRmdirUnlinkRename) {
  EXPECT_TRUE(fs_.mkdir("/d", 0755).ok());
  EXPECT_TRUE(std::filesystem::is_directory(tree_.inRoot("d")));
  EXPECT_EQ(err(fs_.mkdir("/d", 0755)), EEXIST);
  EXPECT_TRUE(fs_.mkdir("/d/e/", 0755).ok()) << "a trailing slash is fine";
  EXPECT_EQ(err(fs_.mkdir("/", 0755)), EEXIST);
  EXPECT_EQ(err(fs_.mkdir("/d/..", 0755)), EEXIST);

  tree_.file("d/f", "x");
  EXPECT_TRUE(fs_.rename("/d/f", "/d/g", 0).ok());
  EXPECT_EQ(tree_.read(tree_.inRoot("d/g")), "x");
  EXPECT_EQ(err(fs_.unlink("/d/g/")), ENOTDIR);
  EXPECT_EQ(err(fs_.unlink("/d/e")), EISDIR);
  EXPECT_TRUE(fs_.unlink("/d/g").ok());
  EXPECT_FALSE(std::filesystem::exists(tree_.inRoot("d/g")));
  EXPECT_EQ(err(fs_.rmdir("/d")), ENOTEMPTY);
  EXPECT_TRUE(fs_.rmdir("/d/e").ok());
  EXPECT_TRUE(fs_.rmdir("/d").ok());
  EXPECT_EQ(err(fs_.rmdir("/")), EBUSY);
  EXPECT_EQ(err(fs_.unlink("/..")), EISDIR);
  EXPECT_EQ(err(fs_.rename("/..", "/x", 0)), EBUSY);
}

TEST_F(RootFsTest, RenameFlagsReachTheKernel) {
  tree_.file("a", "A");
  tree_.file("b", "B");
  EXPECT_EQ(err(fs_.rename("/a", "/b", RENAME_NOREPLACE)), EEXIST);
  EXPECT_TRUE(fs_.rename("/a", "/b", RENAME_EXCHANGE).ok());
  EXPECT_EQ(tree_.read(tree_.inRoot("a")), "B");
  EXPECT_EQ(tree_.read(tree_.inRoot("b")), "A");
}

TEST_F(RootFsTest, NamespaceOpsThroughSymlinkedParentsStayInside) {
  // dir -> the host's outside/ directory, by absolute path.
  tree_.symlink("dir", tree_.base() + "/outside");
  EXPECT_EQ(err(fs_.unlink("/dir/secret")), ENOENT);
  EXPECT_EQ(err(fs_.rename("/dir/secret", "/stolen", 0)), ENOENT);
  EXPECT_EQ(err(fs_.mkdir("/dir/new", 0755)), ENOENT);
  EXPECT_EQ(err(fs_.truncate("/dir/secret", 0)), ENOENT);
  EXPECT_EQ(err(fs_.chmod("/dir/secret", 0777)), ENOENT);
  EXPECT_EQ(err(fs_.chown("/dir/secret", -1, -1, true)), ENOENT);
  EXPECT_EQ(err(fs_.utimens("/dir/secret", kTimeNow, kTimeNow, true)), ENOENT);
  EXPECT_EQ(err(fs_.open("/dir/new", O_WRONLY | O_CREAT, 0644)), ENOENT);
  // The host's files are as they were.
  EXPECT_EQ(tree_.read(tree_.base() + "/outside/secret"), tree_.hostSecret());
  EXPECT_FALSE(std::filesystem::exists(tree_.base() + "/outside/new"));
  EXPECT_EQ(std::filesystem::status(tree_.base() + "/outside/secret").permissions() &
                std::filesystem::perms::others_write,
            std::filesystem::perms::none);
}

TEST_F(RootFsTest, FinalSymlinksAreNotFollowedByNamespaceOps) {
  tree_.symlink("link", tree_.base() + "/outside/secret");
  // unlink and rename act on the link itself.
  EXPECT_TRUE(fs_.rename("/link", "/link2", 0).ok());
  EXPECT_TRUE(fs_.unlink("/link2").ok());
  EXPECT_EQ(tree_.read(tree_.base() + "/outside/secret"), tree_.hostSecret());
  // mkdir over a dangling link: EEXIST, nothing created at its target.
  tree_.symlink("dangling", tree_.base() + "/outside/newdir");
  EXPECT_EQ(err(fs_.mkdir("/dangling", 0755)), EEXIST);
  EXPECT_FALSE(std::filesystem::exists(tree_.base() + "/outside/newdir"));
  // O_CREAT through a dangling link creates inside the root only.
  tree_.symlink("dangling-file", "/created-here");
  auto fd = fs_.open("/dangling-file", O_WRONLY | O_CREAT, 0600);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE(std::filesystem::exists(tree_.inRoot("created-here")));
}

TEST_F(RootFsTest, ChmodChownUtimensTruncate) {
  tree_.file("f", "0123456789");
  tree_.symlink("l", "/f");
  EXPECT_TRUE(fs_.chmod("/l", 0600).ok()) << "chmod follows the link, inside the root";
  struct stat st {};
  ASSERT_EQ(::stat(tree_.inRoot("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);

  EXPECT_TRUE(fs_.chown("/f", -1, -1, true).ok());
  EXPECT_TRUE(fs_.chown("/l", -1, -1, false).ok()) << "lchown of the link itself";
  EXPECT_EQ(err(fs_.chown("/f", -2, -1, true)), EINVAL);

  EXPECT_TRUE(fs_.utimens("/f", 1'000'000'000'123, 2'000'000'000'456, true).ok());
  ASSERT_EQ(::stat(tree_.inRoot("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_atim.tv_sec, 1000);
  EXPECT_EQ(st.st_atim.tv_nsec, 123);
  EXPECT_EQ(st.st_mtim.tv_sec, 2000);
  EXPECT_TRUE(fs_.utimens("/f", kTimeOmit, kTimeNow, true).ok());
  ASSERT_EQ(::stat(tree_.inRoot("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_atim.tv_sec, 1000) << "omitted";
  EXPECT_GT(st.st_mtim.tv_sec, 2000) << "now";
  EXPECT_EQ(err(fs_.utimens("/f", -5, kTimeNow, true)), EINVAL);
  // follow=false on the link sets the link's own times.
  EXPECT_TRUE(fs_.utimens("/l", 3'000'000'000'000, kTimeOmit, false).ok());
  struct stat lst {};
  ASSERT_EQ(::lstat(tree_.inRoot("l").c_str(), &lst), 0);
  EXPECT_EQ(lst.st_atim.tv_sec, 3000);

  EXPECT_TRUE(fs_.truncate("/l", 4).ok());
  EXPECT_EQ(tree_.read(tree_.inRoot("f")), "0123");
  EXPECT_EQ(err(fs_.truncate("/f", -1)), EINVAL);
  tree_.dir("d");
  EXPECT_EQ(err(fs_.truncate("/d", 0)), EISDIR);
}

TEST_F(RootFsTest, BadPaths) {
  EXPECT_EQ(err(fs_.open("", O_RDONLY, 0)), ENOENT);
  EXPECT_EQ(err(fs_.open(std::string("/etc\0/x", 7), O_RDONLY, 0)), EINVAL);
  EXPECT_EQ(err(fs_.mkdir(std::string("/a\0b", 4), 0755)), EINVAL);
  EXPECT_EQ(err(fs_.open("/x", O_RDONLY | 0x40000000, 0)), EINVAL) << "unknown flags";
}

TEST_F(RootFsTest, OpenDoesNotBlockOnAFifo) {
  ASSERT_EQ(::mkfifo(tree_.inRoot("fifo").c_str(), 0600), 0);
  // Without O_NONBLOCK this open would wait for a writer forever.
  auto fd = fs_.open("/fifo", O_RDONLY, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto d = readFd(fd->get(), 100);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->eof()) << "no writer: end of file at once";
  fd->reset();
  EXPECT_EQ(err(fs_.open("/fifo", O_WRONLY, 0)), ENXIO) << "no reader";
}

TEST_F(RootFsTest, ReadsReportEofExactly) {
  tree_.file("f", std::string(10, 'x'));
  auto fd = fs_.open("/f", O_RDONLY, 0);
  ASSERT_TRUE(fd.ok());
  auto a = preadFd(fd->get(), 4, 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->data(), "xxxx");
  EXPECT_FALSE(a->eof());
  auto b = preadFd(fd->get(), 100, 4);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data().size(), 6u);
  EXPECT_TRUE(b->eof()) << "reached the size";
  auto c = preadFd(fd->get(), 6, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->eof()) << "exactly the size";
  EXPECT_EQ(errnoOf(preadFd(fd->get(), 1, -1).status()), EINVAL);

  auto r1 = readFd(fd->get(), 6);
  ASSERT_TRUE(r1.ok());
  EXPECT_FALSE(r1->eof());
  auto r2 = readFd(fd->get(), 6);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->data().size(), 4u);
  EXPECT_TRUE(r2->eof());
  EXPECT_EQ(seekFd(fd->get(), 0, SEEK_SET).value_or(-1), 0);
  EXPECT_EQ(fstatFd(fd->get())->size(), 10);
  EXPECT_EQ(errnoOf(writeFd(fd->get(), "x").status()), EBADF) << "opened read-only";
}

// Spliced reads (the agent's large preads): the same bytes and eof as
// preadFd at aligned and unaligned offsets, the end exactly; a file that
// is not regular (a FIFO, procfs-like size 0 files are regular but splice
// as they can) is left to preadFd.
TEST_F(RootFsTest, SplicedReadsMatchCopyingReads) {
  std::string content(300000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 + i / 4096);
  tree_.file("big", content);
  auto fd = fs_.open("/big", O_RDONLY, 0);
  ASSERT_TRUE(fd.ok());
  for (auto [offset, size] : std::vector<std::pair<int64_t, uint32_t>>{
           {0, 65536}, {4096, 131072}, {1000, 70000}, {299000, 5000}, {300000, 4096}}) {
    SCOPED_TRACE(::testing::Message() << "offset " << offset << " size " << size);
    auto piped = splicePreadFd(fd->get(), size, offset);
    ASSERT_TRUE(piped.ok()) << piped.status();
    ASSERT_TRUE(piped->has_value()) << "a regular file on the test's file system splices";
    auto copied = preadFd(fd->get(), size, offset);
    ASSERT_TRUE(copied.ok());
    auto bytes = (*piped)->bytes->materialize();
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_TRUE(*bytes == copied->data());
    EXPECT_EQ((*piped)->eof, copied->eof());
  }
  EXPECT_EQ(errnoOf(splicePreadFd(fd->get(), 10, -1).status()), EINVAL);
  ASSERT_EQ(::mkfifo((tree_.root() + "/fifo").c_str(), 0600), 0);
  auto fifo = fs_.open("/fifo", O_RDONLY | O_NONBLOCK, 0);
  ASSERT_TRUE(fifo.ok());
  auto none = splicePreadFd(fifo->get(), 65536, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST_F(RootFsTest, WriteCreateTruncate) {
  auto fd = fs_.open("/new", O_RDWR | O_CREAT | O_EXCL, 0640);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(pwriteFd(fd->get(), "hello", 3).value_or(0), 5u);
  EXPECT_EQ(writeFd(fd->get(), "ab").value_or(0), 2u);
  EXPECT_TRUE(ftruncateFd(fd->get(), 7).ok());
  EXPECT_EQ(tree_.read(tree_.inRoot("new")), std::string("ab\0hell", 7));
  EXPECT_EQ(err(fs_.open("/new", O_RDWR | O_CREAT | O_EXCL, 0640)), EEXIST);
}

// A symlink swapped between an in-root file and links that point outside,
// while another thread resolves through it: every answer is the in-root
// content or an error, never the host's.
TEST_F(RootFsTest, SymlinkSwappedDuringResolutionNeverEscapes) {
  tree_.file("in-root", "pod-content");
  tree_.symlink("link-abs", tree_.base() + "/outside/secret");
  tree_.symlink("link-rel", "../../../../../../../../../../" + tree_.base() + "/outside/secret");
  tree_.file("swap", "pod-content");
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const std::string swap = tree_.inRoot("swap");
    const std::string abs = tree_.inRoot("link-abs");
    const std::string rel = tree_.inRoot("link-rel");
    while (!stop.load()) {
      ::renameat2(AT_FDCWD, swap.c_str(), AT_FDCWD, abs.c_str(), RENAME_EXCHANGE);
      ::renameat2(AT_FDCWD, swap.c_str(), AT_FDCWD, rel.c_str(), RENAME_EXCHANGE);
    }
  });
  int content = 0, errors = 0;
  for (int i = 0; i < 20000; ++i) {
    auto r = readAll("/swap");
    if (r.ok()) {
      ASSERT_NE(*r, tree_.hostSecret());
      ASSERT_EQ(*r, "pod-content");
      ++content;
    } else {
      ASSERT_EQ(errnoOf(r.status()), ENOENT) << r.status();
      ++errors;
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(content + errors, 20000);
}

// A directory moved out of the root while paths walk through it: ".." from
// inside it must not climb the host's tree (openat2 answers EAGAIN, retried,
// or the walk fails).
TEST_F(RootFsTest, DirectoryMovedOutDuringResolutionNeverEscapes) {
  tree_.dir("a/b/c");
  tree_.file("a/secret", "pod-a-secret");
  const std::string in = tree_.inRoot("a/b");
  const std::string out = tree_.base() + "/outside/b";
  std::atomic<bool> stop{false};
  std::thread mover([&] {
    while (!stop.load()) {
      ::rename(in.c_str(), out.c_str());
      ::rename(out.c_str(), in.c_str());
    }
  });
  // From ROOT/a/b/c, "../../secret" is ROOT/a/secret; from OUTSIDE/b/c it
  // would be the host's secret.
  for (int i = 0; i < 20000; ++i) {
    auto r = readAll("/a/b/c/../../secret");
    if (r.ok()) {
      ASSERT_EQ(*r, "pod-a-secret");
    } else {
      const int e = errnoOf(r.status());
      ASSERT_TRUE(e == ENOENT || e == EAGAIN || e == EXDEV) << r.status();
    }
  }
  stop = true;
  mover.join();
}

TEST_F(RootFsTest, MessagesNameTheOperationAndPath) {
  auto r = fs_.stat("/nope", true);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("stat /nope: No such file"));
  EXPECT_EQ(errorCodeOf(r.status()), v1::ERRNO);
}

}  // namespace
}  // namespace siphon::agent::files
