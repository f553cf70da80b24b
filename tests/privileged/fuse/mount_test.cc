// `siphon fs mount` end to end, as root: a "pod" whose root is a prepared
// directory (a process in its own network and mount namespaces, chrooted
// there), the real siphon-agent targeting it by PID, the real `siphon fs
// mount` serving it at a local directory, and real tools on the mount:
// diff -r, find -printf, tar, git, sqlite3, tail -F, cp, sh.
//
// What must hold: the mount shows the target's tree as the tools see it
// (types, modes, owners, sizes, link counts, inode numbers, link texts);
// an absolute symlink never resolves on this machine; writes in rw reach the
// target at once, and EROFS from a --ro mount or a read-only agent; a change
// made in the target is seen within the attribute timeout; the agent lost
// gives errors, not a hang; SIGTERM unmounts and exits 0; SIGKILL leaves no
// hanging mount; bad mountpoints and paths are one line and a documented
// exit code. Timings are asserted only as bounds.
//
// The pod, the agent and the mount are the shared fixture's
// (mount_fixture.h): unique names, RAII owners, a skip without root.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/fuse/mount_fixture.h"

extern char** environ;

namespace siphon {
namespace {

using namespace siphon::harness;    // NOLINT: test file
using namespace siphon::fuse_test;  // NOLINT: test file
using ::testing::HasSubstr;
using ::testing::Not;

class MountTest : public fuse_test::MountFixture {
 protected:
  // The tree of every kind of entry, in the pod's /data.
  void makeTree() {
    const std::string d = root_ + "/data";
    std::filesystem::create_directories(d + "/dir/sub");
    std::filesystem::create_directories(d + "/empty-dir");
    writeHost(d + "/regular", "regular file\n");
    writeHost(d + "/empty", "");
    std::string large(5 * 1024 * 1024 + 123, '\0');
    for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>((i * 131 + 7) % 251);
    writeHost(d + "/large", large);
    {
      int fd = ::open((d + "/sparse").c_str(), O_WRONLY | O_CREAT, 0644);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::pwrite(fd, "end", 3, 64 * 1024 * 1024), 3);
      ::close(fd);
    }
    writeHost(d + "/dir/sub/deep", "deep\n");
    symlink("regular", (d + "/rel-link").c_str());
    symlink("../regular", (d + "/dir/up-link").c_str());
    symlink("no-such-file", (d + "/dangling").c_str());
    ASSERT_EQ(::link((d + "/regular").c_str(), (d + "/dir/hard").c_str()), 0);
    ASSERT_EQ(mkfifo((d + "/fifo").c_str(), 0640), 0);
    {
      int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      const std::string p = d + "/sock";
      ASSERT_LT(p.size(), sizeof(a.sun_path));
      std::memcpy(a.sun_path, p.c_str(), p.size());
      ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
      ::close(s);
    }
    writeHost(d + "/ünïcødé-名前", "unicode\n");
    writeHost(d + "/new\nline", "newline in the name\n");
    chmod((d + "/regular").c_str(), 0640);
    ASSERT_EQ(lchown((d + "/dir/sub/deep").c_str(), 1234, 5678), 0);
    ASSERT_EQ(chmod((d + "/dir/sub").c_str(), 0750), 0);
  }

};

TEST_F(MountTest, TheTreeIsTheTargetsAsToolsSeeIt) {
  ASSERT_NO_FATAL_FAILURE(makeTree());
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--path", "/data", "--ro"}));
  const std::string data = root_ + "/data";

  // (diff calls any two fifos or sockets different: they are in the
  // listing below instead.)
  Result diff = run({"diff", "-r", "--no-dereference", "-x", "fifo", "-x", "sock", data, mnt_});
  EXPECT_EQ(diff.exit_code, 0) << diff;

  // Types, modes, owners, sizes, link counts, inode numbers, link texts
  // and times, entry by entry.
  const std::string listing =
      "cd \"$1\" && find . -printf '%p|%y|%m|%U|%G|%s|%n|%i|%l|%T@\\n' | LC_ALL=C sort";
  Result local = sh(listing, {data});
  Result mounted = sh(listing, {mnt_});
  ASSERT_EQ(local.exit_code, 0) << local;
  EXPECT_EQ(mounted.exit_code, 0) << mounted;
  EXPECT_EQ(mounted.out, local.out);
  EXPECT_THAT(local.out, HasSubstr("./dir/hard|f|640|0|0|13|2|"));  // the fixture is as meant

  // tar of both: the same archive (hard links found by inode, the sparse
  // file's hole, every name).
  const std::string tar =
      "cd \"$1\" && tar --sort=name --numeric-owner -cf - . 2>/dev/null | sha256sum";
  Result tar_local = sh(tar, {data});
  Result tar_mounted = sh(tar, {mnt_});
  EXPECT_EQ(tar_mounted.out, tar_local.out);

  // Reads of the large file through the kernel's 1 MiB requests.
  Result cmp = run({"cmp", data + "/large", mnt_ + "/large"});
  EXPECT_EQ(cmp.exit_code, 0) << cmp;
  // A fifo and a socket are shown, not opened through the agent.
  struct stat st {};
  ASSERT_EQ(lstat((mnt_ + "/fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(lstat((mnt_ + "/sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
}

TEST_F(MountTest, AnAbsoluteSymlinkResolvesInsideTheTarget) {
  // The host has a file at the very path the pod's link names.
  const std::string host_dir = dir_->path() + "/hostside";
  std::filesystem::create_directories(host_dir);
  writeHost(host_dir + "/secret", "HOST-ONLY\n");
  std::filesystem::create_directories(root_ + host_dir);
  writeHost(root_ + host_dir + "/secret", "pod copy\n");
  symlink((host_dir + "/secret").c_str(), (root_ + "/etc/abs-link").c_str());
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));

  EXPECT_EQ(readFile(mnt_ + "/etc/abs-link"), "pod copy\n");
  std::error_code ec;
  EXPECT_EQ(std::filesystem::read_symlink(mnt_ + "/etc/abs-link", ec).string(),
            mnt_ + host_dir + "/secret");
  // Its size is the link's own in the pod (a stat reads no link text).
  struct stat st {};
  ASSERT_EQ(lstat((mnt_ + "/etc/abs-link").c_str(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), (host_dir + "/secret").size());
}

TEST_F(MountTest, GitAndSqliteWorkThroughTheMount) {
  if (firstExisting({"/usr/bin/git"}).empty() || firstExisting({"/usr/bin/sqlite3"}).empty()) {
    GTEST_SKIP() << "needs git and sqlite3 (scripts/install-deps.sh installs them)";
  }
  const std::string repo = root_ + "/data/repo";
  Result made = sh(
      "set -e; mkdir -p \"$1\"; cd \"$1\"; git init -q; for i in 1 2 3; do echo $i > f$i; done; "
      "git add .; git -c user.name=t -c user.email=t@t commit -qm first; echo 4 > f1; "
      "echo new > untracked; sqlite3 \"$2\" 'create table t(x); insert into t values (1),(2);'",
      {repo, root_ + "/data/db.sqlite"});
  ASSERT_EQ(made.exit_code, 0) << made;
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount({"--path", "/data"}));

  const std::string status =
      "cd \"$1\" && git -c safe.directory='*' status --porcelain && git -c safe.directory='*' "
      "log --format=%H";
  Result local = sh(status, {repo});
  Result mounted = sh(status, {mnt_ + "/repo"});
  ASSERT_EQ(local.exit_code, 0) << local;
  EXPECT_EQ(mounted.exit_code, 0) << mounted;
  EXPECT_EQ(mounted.out, local.out);
  EXPECT_THAT(local.out, HasSubstr(" M f1"));

  Result query = run({"sqlite3", mnt_ + "/db.sqlite", "select sum(x) from t;"});
  EXPECT_EQ(query.exit_code, 0) << query;
  EXPECT_EQ(query.out, "3\n");
  Result insert = run({"sqlite3", mnt_ + "/db.sqlite", "insert into t values (10),(20);"});
  EXPECT_EQ(insert.exit_code, 0) << insert;
  // The target reads the rows written through the mount.
  Result in_target = run({"sqlite3", root_ + "/data/db.sqlite", "select sum(x) from t;"});
  EXPECT_EQ(in_target.out, "33\n") << in_target;
}

TEST_F(MountTest, WritesReachTheTargetAtOnceAndReadOnlyIsEROFS) {
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());
  Result w = sh(
      "set -e; cd \"$1\"; mkdir tmp/d; echo hello > tmp/d/f; echo more >> tmp/d/f; "
      "mv tmp/d tmp/moved; chmod 600 tmp/moved/f; truncate -s 3 tmp/moved/f; "
      "touch -d @1000000000 tmp/moved/f; cp tmp/moved/f tmp/copy; rm tmp/copy",
      {mnt_});
  EXPECT_EQ(w.exit_code, 0) << w;
  EXPECT_EQ(readFile(root_ + "/tmp/moved/f"), "hel");
  struct stat st {};
  ASSERT_EQ(stat((root_ + "/tmp/moved/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_mtime, 1000000000);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/tmp/d"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/tmp/copy"));
  // 8 MiB through the mount, byte for byte in the target.
  std::string big(8 * 1024 * 1024, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + (i >> 12));
  writeHost(dir_->path() + "/big", big);
  Result cp = run({"cp", dir_->path() + "/big", mnt_ + "/tmp/big"});
  EXPECT_EQ(cp.exit_code, 0) << cp;
  EXPECT_EQ(readFile(root_ + "/tmp/big"), big);

  // A --ro mount refuses writes whatever the agent allows...
  mount_.reset();
  (void)run({"fusermount3", "-uz", mnt_});
  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
  Result ro = sh("echo x > \"$1\"/tmp/ro-mount", {mnt_});
  EXPECT_NE(ro.exit_code, 0);
  EXPECT_THAT(ro.err, HasSubstr("Read-only file system"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/tmp/ro-mount"));
}

// Linux names are bytes: names and link texts that are not UTF-8 go both
// ways exactly (never as U+FFFD), and the session lives on.
TEST_F(MountTest, NamesThatAreNotUtf8PassThroughAsBytes) {
  const std::string latin1 = "caf\xe9";
  const std::string dir = "dir-\xff";
  const std::string link = "link-\xfe";
  writeHost(root_ + "/tmp/" + latin1, "latin1\n");
  std::filesystem::create_directories(root_ + "/tmp/" + dir);
  writeHost(root_ + "/tmp/" + dir + "/inner", "inner\n");
  ASSERT_EQ(::symlink("\xfe-target", (root_ + "/tmp/" + link).c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());

  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(mnt_ + "/tmp")) {
    names.push_back(e.path().filename().native());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{latin1, dir, link}));
  EXPECT_EQ(readFile(mnt_ + "/tmp/" + latin1), "latin1\n");
  EXPECT_EQ(readFile(mnt_ + "/tmp/" + dir + "/inner"), "inner\n");
  char text[64] = {};
  ASSERT_EQ(::readlink((mnt_ + "/tmp/" + link).c_str(), text, sizeof(text) - 1), 8);
  EXPECT_EQ(std::string(text), "\xfe-target");

  // And from here to the target.
  const std::string made = "new-\xe8";
  writeHost(mnt_ + "/tmp/" + made, "made\n");
  EXPECT_EQ(readFile(root_ + "/tmp/" + made), "made\n");
  ASSERT_EQ(::rename((mnt_ + "/tmp/" + made).c_str(), (mnt_ + "/tmp/moved-\xe7").c_str()), 0);
  EXPECT_EQ(readFile(root_ + "/tmp/moved-\xe7"), "made\n");
  ASSERT_EQ(::symlink("\xfd", (mnt_ + "/tmp/l2").c_str()), 0);
  std::error_code ec;
  EXPECT_EQ(std::filesystem::read_symlink(root_ + "/tmp/l2", ec).native(), "\xfd");
  // The session is as it was.
  EXPECT_EQ(readFile(mnt_ + "/tmp/" + latin1), "latin1\n");
  EXPECT_THAT(agent_->log(), Not(HasSubstr("session_ended")));
}

// O_DIRECT (fio --direct=1, dd iflag=direct): the kernel's page cache is
// skipped for that open, and the agent reads and writes as for any other
// (its own buffers are not aligned for O_DIRECT, so it never gets the flag).
TEST_F(MountTest, ODirectReadsAndWritesGoThrough) {
  std::string content(64 * 1024, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>('a' + i % 26);
  writeHost(root_ + "/tmp/direct", content);
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());
  Result in = run({"dd", "if=" + mnt_ + "/tmp/direct", "iflag=direct", "bs=4096", "status=none"});
  EXPECT_EQ(in.exit_code, 0) << in;
  EXPECT_EQ(in.out, content);
  Result out = run({"dd", "if=" + root_ + "/tmp/direct", "of=" + mnt_ + "/tmp/written",
                    "oflag=direct", "bs=4096", "status=none"});
  EXPECT_EQ(out.exit_code, 0) << out;
  EXPECT_EQ(readFile(root_ + "/tmp/written"), content);
}

// A sequential read keeps several reads in flight: the mount raises its
// bdi's readahead from the 128 KiB every FUSE mount starts with to four of
// its largest reads (fuse_ops.cc raiseReadahead), and a file read through
// it is still the target's, byte for byte.
TEST_F(MountTest, TheMountsReadaheadIsFourReads) {
  std::string content(3 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 + i / 4096);
  writeHost(root_ + "/tmp/seq", content);
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
  struct stat st {};
  ASSERT_EQ(::stat(mnt_.c_str(), &st), 0);
  const std::string knob = "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                           std::to_string(minor(st.st_dev)) + "/read_ahead_kb";
  // Set from a thread of the mount's once INIT is answered: a bound.
  int kib = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    kib = std::atoi(readFile(knob).c_str());
    if (kib > 128) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Four reads of the agent's default limit (1 MiB less 1 KiB) rounded
  // down to pages: 4 x 1,044,480 bytes; or, where no pipe holds such a
  // read (no CAP_SYS_RESOURCE: fs.pipe-max-size), four of 512 KiB.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const bool big_pipes = ::fcntl(fds[0], F_SETPIPE_SZ, 1044480 + 16 * 4096) >= 0;
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_EQ(kib, big_pipes ? 4 * 1044480 / 1024 : 4 * 512) << knob;
  EXPECT_EQ(readFile(mnt_ + "/tmp/seq"), content);
}

// Links, special files, extended attributes and fsync through the mount
// reach the target as made there: ln -s, ln, mkfifo, a user.* xattr set,
// listed, read and removed, fsync of a written file.
TEST_F(MountTest, LinksFifosXattrsAndFsyncReachTheTarget) {
  writeHost(root_ + "/tmp/f", "content\n");
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  ASSERT_NO_FATAL_FAILURE(mount());
  Result r = sh(
      "set -e; cd \"$1\"/tmp; ln -s f rel; ln -s /tmp/f abs; ln f hard; mkfifo fifo; "
      "stat -c '%h' f; readlink rel; cat abs",
      {mnt_});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "2\nf\ncontent\n");
  std::error_code ec;
  EXPECT_EQ(std::filesystem::read_symlink(root_ + "/tmp/rel", ec), "f");
  EXPECT_EQ(std::filesystem::read_symlink(root_ + "/tmp/abs", ec), "/tmp/f");  // stored verbatim
  struct stat a {}, b {};
  ASSERT_EQ(stat((root_ + "/tmp/f").c_str(), &a), 0);
  ASSERT_EQ(stat((root_ + "/tmp/hard").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  ASSERT_EQ(lstat((root_ + "/tmp/fifo").c_str(), &a), 0);
  EXPECT_TRUE(S_ISFIFO(a.st_mode));

  const std::string f = mnt_ + "/tmp/f";
  if (::setxattr((root_ + "/tmp/f").c_str(), "user.probe", "1", 1, 0) != 0) {
    GTEST_SKIP() << "the test directory's file system takes no user.* xattrs";
  }
  ASSERT_EQ(::removexattr((root_ + "/tmp/f").c_str(), "user.probe"), 0);
  EXPECT_EQ(::setxattr(f.c_str(), "user.color", "blue", 4, XATTR_CREATE), 0) << strerror(errno);
  EXPECT_EQ(::setxattr(f.c_str(), "user.color", "red", 3, XATTR_CREATE), -1);
  EXPECT_EQ(errno, EEXIST);
  char value[16] = {};
  EXPECT_EQ(::getxattr((root_ + "/tmp/f").c_str(), "user.color", value, sizeof(value)), 4);
  EXPECT_EQ(std::string(value, 4), "blue");
  EXPECT_EQ(::getxattr(f.c_str(), "user.color", nullptr, 0), 4);
  EXPECT_EQ(::getxattr(f.c_str(), "user.color", value, 2), -1);
  EXPECT_EQ(errno, ERANGE);
  char names[64] = {};
  const ssize_t n = ::listxattr(f.c_str(), names, sizeof(names));
  EXPECT_EQ(std::string(names, n > 0 ? static_cast<size_t>(n) : 0), std::string("user.color\0", 11));
  EXPECT_EQ(::removexattr(f.c_str(), "user.color"), 0);
  EXPECT_EQ(::getxattr(f.c_str(), "user.color", value, sizeof(value)), -1);
  EXPECT_EQ(errno, ENODATA);

  int fd = ::open(f.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::write(fd, "more\n", 5), 5);
  EXPECT_EQ(::fsync(fd), 0) << strerror(errno);
  EXPECT_EQ(::fdatasync(fd), 0) << strerror(errno);
  ::close(fd);
  EXPECT_EQ(readFile(root_ + "/tmp/f"), "content\nmore\n");
}

TEST_F(MountTest, AReadOnlyAgentAnswersEROFSUnderARwMount) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount());
  for (const std::string& script :
       {std::string("echo x > \"$1\"/tmp/new"), std::string("mkdir \"$1\"/tmp/dir"),
        std::string("rm \"$1\"/bin/busybox"), std::string("chmod 777 \"$1\"/etc"),
        std::string("ln -s x \"$1\"/tmp/link"), std::string("mkfifo \"$1\"/tmp/fifo")}) {
    Result r = sh(script, {mnt_});
    EXPECT_NE(r.exit_code, 0) << script;
    EXPECT_THAT(r.err, HasSubstr("Read-only file system")) << script << "\n" << r;
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/tmp/new"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/bin/busybox"));
}

TEST_F(MountTest, ChangesInTheTargetAreSeenWithinTheAttributeTimeout) {
  writeHost(root_ + "/tmp/app.log", "line 1\n");
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro", "--attr-timeout", "200ms"}));
  EXPECT_EQ(readFile(mnt_ + "/tmp/app.log"), "line 1\n");

  Proc tail({"tail", "-F", "-s", "0.1", mnt_ + "/tmp/app.log"}, cleanEnv());
  ASSERT_TRUE(tail.readUntil([](const std::string& out, const std::string&) {
    return out.find("line 1\n") != std::string::npos;
  })) << tail.err;
  // The target appends, and writes a new file.
  {
    std::ofstream log(root_ + "/tmp/app.log", std::ios::app);
    log << "line 2\n";
  }
  writeHost(root_ + "/tmp/fresh", "fresh\n");
  EXPECT_TRUE(tail.readUntil([](const std::string& out, const std::string&) {
    return out.find("line 2\n") != std::string::npos;
  })) << "tail -F through the mount never saw the appended line: " << tail.out;
  // Within the timeout plus a bound, not at once: polled.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline && readFile(mnt_ + "/tmp/app.log") != "line 1\nline 2\n") {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(readFile(mnt_ + "/tmp/app.log"), "line 1\nline 2\n");
  EXPECT_EQ(readFile(mnt_ + "/tmp/fresh"), "fresh\n");
}

// Push invalidation: with an attribute timeout of a minute, what the target
// changes is seen through the mount within seconds, which only the agent's
// watch (inotify in the target) can tell the mount: a cached size, a cached
// entry and a cached "no such file" all outlive a minute otherwise. tail -f
// (which polls fstat on a FUSE file) sees the appended line; a directory's
// own attributes (its mode, its link count once a subdirectory is made),
// which the mount keeps while watched, are seen changed too.
TEST_F(MountTest, ChangesInTheTargetArePushedPastALongAttributeTimeout) {
  writeHost(root_ + "/tmp/app.log", "line 1\n");
  std::filesystem::create_directories(root_ + "/data/d");
  writeHost(root_ + "/data/d/old", "old\n");
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro", "--attr-timeout", "60s"}));
  EXPECT_EQ(readFile(mnt_ + "/tmp/app.log"), "line 1\n");
  EXPECT_TRUE(std::filesystem::exists(mnt_ + "/data/d/old"));
  EXPECT_FALSE(std::filesystem::exists(mnt_ + "/data/d/later")) << "a cached negative entry";
  struct stat dir_before {};
  ASSERT_EQ(::stat((mnt_ + "/data/d").c_str(), &dir_before), 0);  // its attributes cached
  EXPECT_EQ(dir_before.st_nlink, 2u);
  Proc tail({"tail", "-f", "-s", "0.1", mnt_ + "/tmp/app.log"}, cleanEnv());
  ASSERT_TRUE(tail.readUntil([](const std::string& out, const std::string&) {
    return out.find("line 1\n") != std::string::npos;
  })) << tail.err;
  // The watches are made as the kernel meets the directories: give them
  // a moment to be in place before the target changes things.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  const auto changed = Clock::now();
  {
    std::ofstream log(root_ + "/tmp/app.log", std::ios::app);
    log << "line 2\n";
  }
  writeHost(root_ + "/data/d/later", "later\n");
  std::filesystem::remove(root_ + "/data/d/old");
  ASSERT_EQ(::chmod((root_ + "/data/d").c_str(), 0700), 0);
  std::filesystem::create_directories(root_ + "/data/d/sub");
  auto seen = [&] {
    struct stat dir {};
    return readFile(mnt_ + "/tmp/app.log") == "line 1\nline 2\n" &&
           std::filesystem::exists(mnt_ + "/data/d/later") &&
           !std::filesystem::exists(mnt_ + "/data/d/old") &&
           ::stat((mnt_ + "/data/d").c_str(), &dir) == 0 && (dir.st_mode & 07777) == 0700 &&
           dir.st_nlink == 3;
  };
  while (Clock::now() - changed < std::chrono::seconds(10) && !seen()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(seen()) << "the target's changes were not pushed to the mount";
  EXPECT_LT(Clock::now() - changed, std::chrono::seconds(5)) << "pushed, not polled at 60 s";
  EXPECT_EQ(readFile(mnt_ + "/data/d/later"), "later\n");
  EXPECT_TRUE(tail.readUntil([](const std::string& out, const std::string&) {
    return out.find("line 2\n") != std::string::npos;
  })) << "tail -f through the mount never saw the appended line: " << tail.out;
}

TEST_F(MountTest, TheAgentLostGivesErrorsNotAHangAndSigtermUnmounts) {
  writeHost(root_ + "/tmp/f", "content\n");
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro", "--attr-timeout", "0"}));
  EXPECT_EQ(readFile(mnt_ + "/tmp/f"), "content\n");
  agent_->child().kill();

  const auto start = Clock::now();
  Result cat = run({"cat", mnt_ + "/tmp/f"});
  const auto took = Clock::now() - start;
  EXPECT_NE(cat.exit_code, 0) << cat;
  EXPECT_NE(cat.exit_code, -1) << "cat hung on the mount";
  EXPECT_LT(took, std::chrono::seconds(25));
  Result ls = run({"ls", mnt_ + "/etc"});
  EXPECT_NE(ls.exit_code, 0) << ls;
  EXPECT_NE(ls.exit_code, -1);

  mount_->signal(SIGTERM);
  EXPECT_EQ(mount_->finish(), 0) << mount_->err;
  EXPECT_FALSE(isMounted(mnt_));
}

// The transport cut under the mount (both ends of the CLI<->agent TCP
// connection reset, as by a NAT): the session resumes, a file a program has
// open stays open and reads on where it was, and new operations work, all
// within a bound.
TEST_F(MountTest, ACutTransportResumesWithFilesStillOpen) {
  std::string content;
  for (int i = 0; i < 2000; ++i) content += "line " + std::to_string(i) + "\n";
  writeHost(root_ + "/tmp/long.txt", content);
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro", "--attr-timeout", "0"}));
  // Reads 7 bytes, waits for a line on stdin, then reads the rest.
  Proc reader({"sh", "-c", "exec 3<\"$1\"; head -c 7 <&3; echo; read go; cat <&3", "sh",
               mnt_ + "/tmp/long.txt"},
              cleanEnv());
  ASSERT_TRUE(reader.readUntil([](const std::string& out, const std::string&) {
    return out.find('\n') != std::string::npos && out.size() >= 8;
  })) << reader.err;
  const std::string port = endpoint_.substr(endpoint_.rfind(':') + 1);
  Result killed = run({"ss", "-K", "-t", "-n", "state", "established",
                       "( sport = :" + port + " or dport = :" + port + " )"});
  ASSERT_EQ(killed.exit_code, 0) << killed;
  ASSERT_THAT(killed.out, HasSubstr(":" + port + " ")) << "nothing was cut";

  const auto start = Clock::now();
  reader.write("go\n");
  const int code = reader.finish();
  EXPECT_EQ(code, 0) << reader.err;
  EXPECT_EQ(reader.out, content.substr(0, 7) + "\n" + content.substr(7));
  EXPECT_EQ(readFile(mnt_ + "/etc/../tmp/long.txt"), content);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
  EXPECT_THAT(agent_->log(), HasSubstr("session_resumed"));
}

TEST_F(MountTest, SigkillLeavesNoHangingMount) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
  mount_->signal(SIGKILL);
  (void)mount_->finish();
  // auto_unmount: the mount goes (its fusermount3 sees us die); meanwhile
  // it answers ENOTCONN, never a hang.
  Result ls = run({"ls", mnt_});
  EXPECT_NE(ls.exit_code, -1) << "ls hung on a dead mount";
  // A bound, not a timing: fusermount3 is a process of its own that only
  // wakes when our end of its socket closes, and the sanitizer runs keep
  // both cores busy (10 s was once too short there).
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && isMounted(mnt_)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(isMounted(mnt_));
  // And a new mount works at once.
  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
  EXPECT_TRUE(std::filesystem::exists(mnt_ + "/bin/busybox"));
}

// The mount a siphon killed with SIGKILL leaves when its fusermount3
// cannot unmount it (here it is killed first; before the device's
// descriptor was held above fusermount3's socket, a race under load did
// the same): it answers ENOTCONN, and the next mount there unmounts it
// and mounts, saying so.
TEST_F(MountTest, ANewMountReplacesTheDeadMountOfAKilledSiphon) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
  std::vector<pid_t> helpers;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string stat = readFile(e.path().string() + "/stat");
    // PID (COMM) STATE PPID ...
    const size_t close = stat.rfind(") ");
    if (stat.find("(fusermount3)") == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == mount_->pid()) helpers.push_back(std::stoi(e.path().filename().string()));
  }
  ASSERT_EQ(helpers.size(), 1u) << "the mount's fusermount3 is not a child of siphon";
  ASSERT_EQ(::kill(helpers[0], SIGKILL), 0);
  mount_->signal(SIGKILL);
  (void)mount_->finish();
  Result ls = run({"ls", mnt_});
  EXPECT_NE(ls.exit_code, -1) << "ls hung on a dead mount";
  EXPECT_THAT(ls.err, HasSubstr("Transport endpoint is not connected")) << ls;
  EXPECT_TRUE(isMounted(mnt_)) << "nothing was left to replace";

  ASSERT_NO_FATAL_FAILURE(mount({"--ro"}));
  EXPECT_THAT(mount_->err, HasSubstr("unmounted the siphon mount left at " + mnt_));
  EXPECT_TRUE(std::filesystem::exists(mnt_ + "/bin/busybox"));
  // Only one mount there: the dead one went.
  Result mounts = run({"sh", "-c", "grep -c ' " + mnt_ + " ' /proc/self/mountinfo"});
  EXPECT_EQ(mounts.out, "1\n") << mounts;
}

TEST_F(MountTest, BadMountpointsAndPathsAreOneLineAndAnExitCode) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  writeHost(dir_->path() + "/a-file", "x");
  std::filesystem::create_directories(dir_->path() + "/full");
  writeHost(dir_->path() + "/full/x", "x");
  writeHost(root_ + "/tmp/plain", "x");
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"fs", "mount", dir_->path() + "/missing"}, 2, "No such file or directory"},
      {{"fs", "mount", dir_->path() + "/a-file"}, 2, "is not a directory"},
      {{"fs", "mount", dir_->path() + "/full"}, 2, "is not empty"},
      {{"fs", "mount", "/proc"}, 2, "is a mount point already"},
      {{"fs", "mount", mnt_, "--path", "/no/such/dir"}, 1, "No such file or directory"},
      {{"fs", "mount", mnt_, "--path", "/tmp/plain"}, 1, "is not a directory in the target"},
      {{"fs", "mount", mnt_, "--attr-timeout", "soon"}, 2, "--attr-timeout"},
  };
  for (const auto& c : cases) {
    Result r = run(cliArgs(c.args), cleanEnv());
    EXPECT_EQ(r.exit_code, c.code) << r;
    EXPECT_THAT(r.err, HasSubstr(c.says)) << r;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r;
    EXPECT_FALSE(isMounted(mnt_));
  }
}

}  // namespace
}  // namespace siphon
