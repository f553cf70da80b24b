// `siphon fs mount` at the POSIX edges a conformance run found (issue 40,
// items 10-15), each as the kernel's own file systems behave, as root: the
// pod, the agent and the mount of the shared fixture (mount_fixture.h).
//
//  - fstat of an open file after its unlink answers from the open file
//    (nlink 0), not ENOENT;
//  - every name of a hard-linked file is one file: a chmod or chown
//    through one name is seen through the others at once, and after
//    `link x y; unlink x` the file is y (lstat, chmod, link);
//  - a new file's, directory's and fifo's mode is the one the kernel hands
//    the mount (the caller's umask applied), with no umask of the agent's;
//  - a stat through the mount changes nothing in the target (a symlink's
//    atime, on a file system that updates atimes strictly);
//  - paths longer than PATH_MAX in the target, from a working directory
//    inside the mount, work;
//  - every unmount ends the mount process, also while a copy of the mount
//    lives in another mount namespace, thirty times in a row; a lazy one
//    once the files open through the mount are closed;
//  - what the design refuses on purpose: other local users (no
//    allow_other) and device nodes.
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tests/fakes/eventually.h"
#include "tests/fakes/remove_tree.h"
#include "tests/privileged/fuse/mount_fixture.h"

namespace siphon {
namespace {

using namespace siphon::harness;    // NOLINT: test file
using namespace siphon::fuse_test;  // NOLINT: test file
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

// The directory this process works in, restored at the end of a scope.
class WorkingDirectory {
 public:
  WorkingDirectory() : saved_(::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC)) {}
  ~WorkingDirectory() {
    if (saved_ >= 0) {
      (void)::fchdir(saved_);
      ::close(saved_);
    }
  }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;

 private:
  int saved_;
};

class MountPosixTest : public fuse_test::MountFixture {
 protected:
  std::string inMount(const std::string& p) { return mnt_ + p; }
  std::string inPod(const std::string& p) { return root_ + p; }
};

// Item 10: the kernel sends fstat(2) of a file open through the mount as a
// getattr with no handle; once its name is gone the mount answers it from
// the open file.
TEST_F(MountPosixTest, FstatOfAnOpenFileAnswersAfterItsUnlink) {
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());
  const std::string f = inMount("/tmp/open-then-unlinked");
  const int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::write(fd, "twelve bytes", 12), 12);
  struct stat before {};
  ASSERT_EQ(::fstat(fd, &before), 0);
  EXPECT_EQ(before.st_nlink, 1u);
  ASSERT_EQ(::unlink(f.c_str()), 0) << std::strerror(errno);
  EXPECT_FALSE(std::filesystem::exists(inPod("/tmp/open-then-unlinked")));

  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(st.st_size, 12);
  EXPECT_EQ(st.st_ino, before.st_ino);
  // Still the open file: written, grown, read back, stat'ed again.
  EXPECT_EQ(::pwrite(fd, "+4", 2, 12), 2);
  EXPECT_EQ(::fstat(fd, &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, 14);
  char buf[16] = {};
  EXPECT_EQ(::pread(fd, buf, sizeof buf, 0), 14);
  EXPECT_EQ(std::string(buf), "twelve bytes+4");
  ::close(fd);

  // A file with another name left: fstat says one link.
  writeHost(inPod("/tmp/a"), "linked\n");
  ASSERT_EQ(::link(inPod("/tmp/a").c_str(), inPod("/tmp/b").c_str()), 0);
  const int held = ::open(inMount("/tmp/a").c_str(), O_RDONLY);
  ASSERT_GE(held, 0) << std::strerror(errno);
  ASSERT_EQ(::unlink(inMount("/tmp/a").c_str()), 0) << std::strerror(errno);
  EXPECT_EQ(::fstat(held, &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_nlink, 1u);
  ::close(held);
}

// Item 11: attributes are the file's, not a name's. The attribute timeout
// is a minute, so nothing here is seen by waiting for it.
TEST_F(MountPosixTest, EveryNameOfAHardLinkedFileIsOneFile) {
  std::filesystem::create_directories(inPod("/data/one"));
  std::filesystem::create_directories(inPod("/data/two"));
  writeHost(inPod("/data/one/x"), "x\n");
  ASSERT_EQ(::chmod(inPod("/data/one/x").c_str(), 0644), 0);
  ASSERT_EQ(::link(inPod("/data/one/x").c_str(), inPod("/data/two/y").c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount({"--attr-timeout", "60s"}));
  const std::string x = inMount("/data/one/x"), y = inMount("/data/two/y");
  struct stat sx {
  }, sy{};
  ASSERT_EQ(::lstat(x.c_str(), &sx), 0);
  ASSERT_EQ(::lstat(y.c_str(), &sy), 0);  // both names' attributes cached
  EXPECT_EQ(sx.st_ino, sy.st_ino);
  EXPECT_EQ(sy.st_mode & 07777, 0644u);

  // chmod and chown through x: y shows them at once.
  ASSERT_EQ(::chmod(x.c_str(), 0600), 0) << std::strerror(errno);
  ASSERT_EQ(::lstat(y.c_str(), &sy), 0);
  EXPECT_EQ(sy.st_mode & 07777, 0600u) << "y kept the mode x had before the chmod";
  ASSERT_EQ(::chown(y.c_str(), 1234, 5678), 0) << std::strerror(errno);
  ASSERT_EQ(::lstat(x.c_str(), &sx), 0);
  EXPECT_EQ(sx.st_uid, 1234u);
  EXPECT_EQ(sx.st_gid, 5678u);
  // A link made through the mount: every name's link count is 3.
  const std::string z = inMount("/data/z");
  ASSERT_EQ(::link(y.c_str(), z.c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::lstat(x.c_str(), &sx), 0);
  EXPECT_EQ(sx.st_nlink, 3u);

  // link x w; unlink x: w is the file, at once (5 of 5 tries failed for
  // up to a second before).
  for (int i = 0; i < 5; ++i) {
    const std::string w = inMount("/data/w" + std::to_string(i));
    const std::string v = inMount("/data/v" + std::to_string(i));
    ASSERT_EQ(::link(x.c_str(), w.c_str()), 0) << std::strerror(errno);
    ASSERT_EQ(::unlink(x.c_str()), 0) << std::strerror(errno);
    struct stat sw {};
    EXPECT_EQ(::lstat(w.c_str(), &sw), 0) << i << ": " << std::strerror(errno);
    EXPECT_EQ(sw.st_ino, sy.st_ino);
    EXPECT_EQ(::chmod(w.c_str(), 0640), 0) << i << ": " << std::strerror(errno);
    EXPECT_EQ(::link(w.c_str(), v.c_str()), 0) << i << ": " << std::strerror(errno);
    ASSERT_EQ(::lstat(y.c_str(), &sy), 0);
    EXPECT_EQ(sy.st_mode & 07777, 0640u);
    // Back to x for the next round.
    ASSERT_EQ(::rename(v.c_str(), x.c_str()), 0) << std::strerror(errno);
    ASSERT_EQ(::unlink(w.c_str()), 0) << std::strerror(errno);
    ASSERT_EQ(::chmod(x.c_str(), 0600), 0) << std::strerror(errno);
  }
  struct stat in_pod {};
  ASSERT_EQ(::lstat(inPod("/data/one/x").c_str(), &in_pod), 0);
  EXPECT_EQ(in_pod.st_ino, sy.st_ino);
  EXPECT_EQ(in_pod.st_nlink, 3u);  // one/x, two/y, z
  ASSERT_EQ(::lstat(y.c_str(), &sy), 0);
  EXPECT_EQ(sy.st_nlink, 3u);
  EXPECT_EQ(sy.st_mode & 07777, 0600u);
}

// Item 12: the kernel applied the caller's umask to the mode it hands the
// mount; that mode is the mode made.
TEST_F(MountPosixTest, ANewFilesModeIsTheModeTheKernelAsked) {
  struct Umask {
    explicit Umask(mode_t m) : old(::umask(m)) {}
    ~Umask() { ::umask(old); }
    mode_t old;
  };
  {
    Umask service(022);  // the agent's, as a service's usually is
    ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  }
  ASSERT_NO_FATAL_FAILURE(mount());
  auto modeInPod = [&](const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(inPod(p).c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  {
    Umask none(0);
    int fd = ::open(inMount("/tmp/f0620").c_str(), O_CREAT | O_WRONLY, 0620);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ::close(fd);
    fd = ::open(inMount("/tmp/f4777").c_str(), O_CREAT | O_WRONLY, 04777);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ::close(fd);
    ASSERT_EQ(::mkdir(inMount("/tmp/d0777").c_str(), 0777), 0) << std::strerror(errno);
    ASSERT_EQ(::mkfifo(inMount("/tmp/p0666").c_str(), 0666), 0) << std::strerror(errno);
    ASSERT_EQ(::mknod(inMount("/tmp/r0606").c_str(), S_IFREG | 0606, 0), 0) << std::strerror(errno);
  }
  EXPECT_EQ(modeInPod("/tmp/f0620"), 0620u);
  EXPECT_EQ(modeInPod("/tmp/f4777"), 04777u);
  EXPECT_EQ(modeInPod("/tmp/d0777"), 0777u);
  EXPECT_EQ(modeInPod("/tmp/p0666"), 0666u);
  EXPECT_EQ(modeInPod("/tmp/r0606"), 0606u);
  {
    Umask usual(027);
    const int fd = ::open(inMount("/tmp/g0666").c_str(), O_CREAT | O_WRONLY, 0666);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ::close(fd);
    ASSERT_EQ(::mkdir(inMount("/tmp/e0777").c_str(), 0777), 0) << std::strerror(errno);
  }
  EXPECT_EQ(modeInPod("/tmp/g0666"), 0640u);
  EXPECT_EQ(modeInPod("/tmp/e0777"), 0750u);
  // The CLI's own modes are made as given too.
  Result w =
      run({"sh", "-c", "umask 077; printf x | \"$@\"", "sh", SIPHON_CLI_BIN, "--agent", endpoint_,
           "--token-file", token_file_, "fs", "write", "--mode", "0664", "/tmp/cli-0664"});
  EXPECT_EQ(w.exit_code, 0) << w;
  EXPECT_EQ(modeInPod("/tmp/cli-0664"), 0664u);
  Result d = run(cliArgs({"fs", "mkdir", "/tmp/cli-dir"}));
  EXPECT_EQ(d.exit_code, 0) << d;
  EXPECT_EQ(modeInPod("/tmp/cli-dir"), 0755u);  // its documented default
}

// Item 13: looking is not modifying. The pod's /data is a tmpfs that
// updates atimes on every access (strictatime), mounted in the pod's own
// mount namespace; the test reads it through /proc/PID/root.
TEST_F(MountPosixTest, AStatThroughTheMountChangesNothingInTheTarget) {
  const std::string nsenter = firstExisting({"/usr/bin/nsenter", "/bin/nsenter"});
  if (nsenter.empty()) GTEST_SKIP() << "needs nsenter";
  Result tmpfs = run({nsenter, "-t", std::to_string(pod_.pid()), "-m", "mount", "-t", "tmpfs", "-o",
                      "strictatime,mode=0755", "siphon-test-atime", inPod("/data")});
  ASSERT_EQ(tmpfs.exit_code, 0) << tmpfs;
  const std::string data = "/proc/" + std::to_string(pod_.pid()) + "/root/data";
  ASSERT_EQ(::symlink("/etc/somewhere/far", (data + "/abs").c_str()), 0) << std::strerror(errno);
  ASSERT_EQ(::symlink("relative-target", (data + "/rel").c_str()), 0) << std::strerror(errno);
  // Old atimes: any access would make them now.
  const struct timespec old[2] = {{1000000000, 0}, {UTIME_OMIT, UTIME_OMIT}};
  for (const char* l : {"/abs", "/rel"}) {
    ASSERT_EQ(::utimensat(AT_FDCWD, (data + l).c_str(), old, AT_SYMLINK_NOFOLLOW), 0);
  }
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro", "--attr-timeout", "0"}));

  struct stat st {};
  ASSERT_EQ(::lstat(inMount("/data/abs").c_str(), &st), 0) << std::strerror(errno);
  // The link's own size: its text in the target.
  EXPECT_EQ(st.st_size, static_cast<off_t>(std::strlen("/etc/somewhere/far")));
  ASSERT_EQ(::lstat(inMount("/data/rel").c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, static_cast<off_t>(std::strlen("relative-target")));
  // A listing with attributes (ls -l's readdirplus, without its readlink).
  Result listed = run({"find", inMount("/data"), "-printf", "%p %s %y\\n"});
  EXPECT_EQ(listed.exit_code, 0) << listed;
  EXPECT_THAT(listed.out, HasSubstr("/data/abs 18 l"));
  for (const char* l : {"/abs", "/rel"}) {
    ASSERT_EQ(::lstat((data + l).c_str(), &st), 0);
    EXPECT_EQ(st.st_atim.tv_sec, 1000000000) << l << ": its atime changed in the target";
  }
  // Reading the link is a read of it, as locally: its atime moves then.
  std::error_code ec;
  EXPECT_EQ(std::filesystem::read_symlink(inMount("/data/abs"), ec).string(),
            mnt_ + "/etc/somewhere/far");
  ASSERT_EQ(::lstat((data + "/abs").c_str(), &st), 0);
  EXPECT_GT(st.st_atim.tv_sec, 1000000000) << "the file system does not update atimes";
}

// Item 14: a tree deeper than PATH_MAX in the target. The working
// directory is inside the mount, a few levels down; the paths relative to
// it are under PATH_MAX (what a program may pass), the paths the mount
// sends from the target's root are longer.
TEST_F(MountPosixTest, PathsLongerThanPathMaxWorkFromAWorkingDirectoryInside) {
  const std::string name(100, 'd');
  constexpr int kDepth = 46;  // 4,646 bytes below /data/deep
  {
    ASSERT_EQ(::mkdir(inPod("/data/deep").c_str(), 0755), 0);
    int fd = ::open(inPod("/data/deep").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (int i = 0; i < kDepth; ++i) {
      ASSERT_EQ(::mkdirat(fd, name.c_str(), 0755), 0) << std::strerror(errno);
      const int next = ::openat(fd, name.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      ::close(fd);
      fd = next;
      ASSERT_GE(fd, 0);
    }
    ::close(fd);
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      const int fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0) {
        fakes::removeTree(fd, "deep");
        ::close(fd);
      }
    }
  } cleanup{inPod("/data")};
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());

  WorkingDirectory restore;
  ASSERT_EQ(::chdir(inMount("/data/deep").c_str()), 0) << std::strerror(errno);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(::chdir(name.c_str()), 0) << std::strerror(errno);
  std::string rel;  // 40 levels: 4,039 bytes
  for (int i = 0; i < 40; ++i) rel += (i == 0 ? "" : "/") + name;
  const std::string file = rel + "/file.txt";
  ASSERT_LT(file.size(), size_t{PATH_MAX});
  // /data/deep + 45 levels + /file.txt, in the target.
  ASSERT_GT(std::string("/data/deep").size() + 45 * 101 + 9, size_t{PATH_MAX});

  int fd = ::open(file.c_str(), O_CREAT | O_WRONLY | O_EXCL, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::write(fd, "deep content", 12), 12);
  ::close(fd);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, 12);
  fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  char buf[32] = {};
  EXPECT_EQ(::read(fd, buf, sizeof buf), 12);
  EXPECT_EQ(std::string(buf), "deep content");
  ::close(fd);
  EXPECT_EQ(::mkdir((rel + "/sub").c_str(), 0700), 0) << std::strerror(errno);
  EXPECT_EQ(::rename(file.c_str(), (rel + "/renamed.txt").c_str()), 0) << std::strerror(errno);
  EXPECT_EQ(::symlink("renamed.txt", (rel + "/link").c_str()), 0) << std::strerror(errno);
  char text[64] = {};
  EXPECT_EQ(::readlink((rel + "/link").c_str(), text, sizeof text - 1), 11);
  EXPECT_STREQ(text, "renamed.txt");
  EXPECT_EQ(::link((rel + "/renamed.txt").c_str(), (rel + "/hard").c_str()), 0)
      << std::strerror(errno);
  EXPECT_EQ(::chmod((rel + "/link").c_str(), 0600), 0) << std::strerror(errno);  // follows it
  EXPECT_EQ(::truncate((rel + "/hard").c_str(), 4), 0) << std::strerror(errno);
  ASSERT_EQ(::stat((rel + "/link").c_str(), &st), 0) << std::strerror(errno);
  EXPECT_EQ(st.st_size, 4);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_nlink, 2u);
  DIR* d = ::opendir(rel.c_str());
  ASSERT_NE(d, nullptr) << std::strerror(errno);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{name, "hard", "link", "renamed.txt", "sub"}));
  EXPECT_EQ(::unlink((rel + "/hard").c_str()), 0) << std::strerror(errno);
  EXPECT_EQ(::rmdir((rel + "/sub").c_str()), 0) << std::strerror(errno);

  // In the target: the file, as made.
  int at = ::open(inPod("/data/deep").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(at, 0);
  for (int i = 0; i < 45; ++i) {
    const int next = ::openat(at, name.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    ::close(at);
    at = next;
    ASSERT_GE(at, 0);
  }
  fd = ::openat(at, "renamed.txt", O_RDONLY | O_CLOEXEC);
  ::close(at);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(::read(fd, buf, sizeof buf), 4);
  EXPECT_EQ(std::string(buf), "deep");
  ::close(fd);
}

// Item 15: `fusermount3 -u` ends the mount process, every time, also while
// another mount namespace holds a copy of the mount (a process started
// with `unshare --mount` while it was mounted, as every pod of a test
// running beside this one does): such an unmount never reaches /dev/fuse.
// The copy answers ENOTCONN once the process is gone.
TEST_F(MountPosixTest, AnUnmountEndsTheMountProcessEveryTime) {
  const std::string nsenter = firstExisting({"/usr/bin/nsenter", "/bin/nsenter"});
  if (nsenter.empty()) GTEST_SKIP() << "needs nsenter";
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  for (int i = 0; i < 30; ++i) {
    SCOPED_TRACE("mount " + std::to_string(i));
    ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
    ASSERT_TRUE(std::filesystem::exists(mnt_ + "/bin/busybox"));
    // Every other round, a process holds a copy of the mount.
    std::optional<Child> holder;
    if (i % 2 == 0) {
      holder.emplace(spawn({unshare_, "--mount", "--propagation", "private", "sleep", "600"},
                           std::nullopt, -1, -1));
      const std::string ns = "/proc/" + std::to_string(holder->pid()) + "/mountinfo";
      ASSERT_TRUE(fakes::eventually(
          [&] {
            return readFile("/proc/" + std::to_string(holder->pid()) + "/cmdline")
                           .rfind("sleep", 0) == 0 &&
                   readFile(ns).find(" " + mnt_ + " ") != std::string::npos;
          },
          seconds(20)))
          << "the holder never had the mount";
    }
    Result u = run({"fusermount3", "-u", mnt_});
    ASSERT_EQ(u.exit_code, 0) << u;
    const int code = mount_->finish();
    EXPECT_EQ(code, 0) << "the mount process " << (code == -1 ? "never ended" : "failed")
                       << "; stderr: " << mount_->err;
    EXPECT_THAT(mount_->err, Not(HasSubstr("failed to unmount")));
    EXPECT_FALSE(isMounted(mnt_));
    if (holder) {
      // The holder's copy is dead, not hanging.
      Result ls = run({nsenter, "-t", std::to_string(holder->pid()), "-m", "ls", mnt_});
      EXPECT_NE(ls.exit_code, -1) << "ls hung on the holder's copy";
      EXPECT_THAT(ls.err, HasSubstr("Transport endpoint is not connected")) << ls;
    }
    mount_.reset();
    if (::testing::Test::HasFailure()) break;
  }
}

// A lazy unmount while a file is open through the mount: the file reads
// on (the mount still serves it), and the process ends once it is closed.
TEST_F(MountPosixTest, ALazyUnmountServesOpenFilesUntilTheyAreClosed) {
  writeHost(inPod("/tmp/held"), "first part|second part");
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro", "--attr-timeout", "0"}));
  const int fd = ::open(inMount("/tmp/held").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  char buf[32] = {};
  ASSERT_EQ(::read(fd, buf, 11), 11);
  Result u = run({"fusermount3", "-u", "-z", mnt_});
  ASSERT_EQ(u.exit_code, 0) << u;
  EXPECT_FALSE(isMounted(mnt_));
  // Still serving the open file, though gone from the mount table.
  EXPECT_EQ(::kill(mount_->pid(), 0), 0) << "the mount process ended under an open file";
  EXPECT_EQ(::read(fd, buf + 11, sizeof buf - 12), 11) << std::strerror(errno);
  EXPECT_EQ(std::string(buf), "first part|second part");
  ::close(fd);
  EXPECT_EQ(mount_->finish(), 0) << mount_->err;
  EXPECT_THAT(mount_->err, Not(HasSubstr("failed to unmount")));
}

// What the design refuses on purpose (docs/FILES.md): the mount is the
// mounting user's (no allow_other: another local user gets EACCES, root's
// mount included), and no device node is made through the agent (EPERM).
TEST_F(MountPosixTest, OtherUsersAndDeviceNodesAreRefusedOnPurpose) {
  const std::string setpriv = firstExisting({"/usr/bin/setpriv", "/bin/setpriv"});
  if (setpriv.empty()) GTEST_SKIP() << "needs setpriv";
  writeHost(inPod("/tmp/open-to-all"), "x\n");
  ASSERT_EQ(::chmod(inPod("/tmp/open-to-all").c_str(), 0666), 0);
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());
  Result other = run({setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "cat",
                      inMount("/tmp/open-to-all")});
  EXPECT_NE(other.exit_code, 0) << other;
  EXPECT_THAT(other.err, HasSubstr("Permission denied")) << other;
  EXPECT_EQ(::mknod(inMount("/tmp/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_FALSE(std::filesystem::exists(inPod("/tmp/null")));
}

}  // namespace
}  // namespace siphon
