// Files end to end, as root: a "pod" whose root is a prepared directory (a
// process in its own network and mount namespaces, chrooted there, with its
// own /proc mounted), the real siphon-agent targeting it by PID, and the real
// siphon CLI (and the client library for request storms).
//
// What must hold: a file that exists only in the pod's root is read; no
// escape ("..", absolute symlinks, symlinks to /proc/self/root, links and
// directories swapped while requests run) ever returns the host's marker
// file; --fs-mode ro refuses every write-like operation with EROFS, rw
// round-trips 64 MiB byte for byte, off answers PERMISSION_DENIED.
//
// Every kernel object has a unique name and an RAII owner; without root
// every test skips with the reason.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/asio.h"
#include "tests/privileged/harness/pod_harness.h"

extern char** environ;

namespace siphon {
namespace {

using namespace siphon::harness;  // NOLINT: test file
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr const char* kSkipReason =
    "needs root: creates network and mount namespaces, chroots a pod and runs siphon-agent, "
    "which opens another process's /proc/PID/root";

std::string readLink(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink(path, ec);
  return ec ? "" : p.string();
}

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    unshare_ = firstExisting({"/usr/bin/unshare", "/bin/unshare"});
    chroot_ = firstExisting({"/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"});
    if (unshare_.empty() || chroot_.empty() || access("/bin/busybox", X_OK) != 0) {
      GTEST_SKIP() << "needs unshare, chroot and a static /bin/busybox";
    }
    dir_.emplace();
    token_ = "tok-" + randomHex(32);
    token_file_ = dir_->file("token", token_ + "\n");

    // The host-only marker: what no request may ever return.
    host_secret_ = "HOST-ONLY-" + randomHex(32) + "\n";
    outside_ = dir_->path() + "/outside";
    std::filesystem::create_directories(outside_);
    writeHost(outside_ + "/secret", host_secret_);

    root_ = dir_->path() + "/root";
    for (const char* d : {"bin", "proc", "etc", "tmp", "a/b/c"}) {
      std::filesystem::create_directories(root_ + "/" + d);
    }
    std::filesystem::copy_file("/bin/busybox", root_ + "/bin/busybox");
    chmod((root_ + "/bin/busybox").c_str(), 0755);
    pod_content_ = "pod-only-" + randomHex(16) + "\n";
    writeHost(root_ + "/etc/hostname-pod", pod_content_);
    writeHost(root_ + "/a/secret", "pod-a-secret\n");
    // Planted by the "target": links that would reach the host's marker if
    // they were followed outside the root.
    symlink((outside_ + "/secret").c_str(), (root_ + "/etc/passwd").c_str());
    symlink("/proc/self/root", (root_ + "/escape-proc").c_str());
    symlink("../../../../../../../../../..", (root_ + "/up").c_str());
    symlink(("up/up" + outside_ + "/secret").c_str(), (root_ + "/chain").c_str());
    // The same absolute path inside the root: links resolve to this copy.
    std::filesystem::create_directories(root_ + dir_->path() + "/mirror");
    writeHost(root_ + dir_->path() + "/mirror/secret", "pod-mirror\n");
    std::filesystem::create_directories(dir_->path() + "/mirror");
    writeHost(dir_->path() + "/mirror/secret", host_secret_);
    symlink((dir_->path() + "/mirror/secret").c_str(), (root_ + "/etc/group").c_str());

    netns_.emplace();
    ASSERT_TRUE(netns_->created());
    pod_ = spawn({"ip", "netns", "exec", netns_->name(), unshare_, "--mount", "--propagation",
                  "private", chroot_, root_, "/bin/busybox", "sh", "-c",
                  "/bin/busybox mount -t proc proc /proc && exec /bin/busybox sleep 600"},
                 std::nullopt, -1, -1);
    ASSERT_GT(pod_.pid(), 0);
    ASSERT_NO_FATAL_FAILURE(waitForPod());
  }

  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  static void writeHost(const std::string& path, const std::string& content) {
    std::ofstream(path, std::ios::binary) << content;
  }

  // ip netns exec -> unshare -> chroot -> busybox sh -> busybox sleep all
  // exec in place: wait until the PID runs sleep chrooted in the namespace
  // (by then /proc is mounted).
  void waitForPod() {
    const std::string proc = "/proc/" + std::to_string(pod_.pid());
    // (Spelled in pieces: "\0" followed by digits would be an octal escape.)
    const std::string want_cmdline =
        std::string("/bin/busybox\0sleep\0", 19) + "600" + std::string(1, '\0');
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      if (readFile(proc + "/cmdline") == want_cmdline && readLink(proc + "/root") == root_ &&
          netnsInodeOf(pod_.pid()) == netns_->inode()) {
        return;
      }
      if (pod_.waitUntil(Clock::now())) FAIL() << "the pod process exited";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "pod process " << pod_.pid() << " never ran sleep chrooted in " << root_
           << " (cmdline '" << readFile(proc + "/cmdline") << "', root '"
           << readLink(proc + "/root") << "', netns " << netnsInodeOf(pod_.pid()) << " vs "
           << netns_->inode() << ")";
  }

  void startAgent(const std::string& fs_mode) {
    std::vector<std::string> args = {
        "--listen", "127.0.0.1:0", "--token-file", token_file_, "--first-client-timeout", "30s"};
    if (!fs_mode.empty()) {
      args.push_back("--fs-mode");
      args.push_back(fs_mode);
    }
    args.insert(args.end(), {"targeted", "--pid", std::to_string(pod_.pid())});
    agent_.emplace(args, cleanEnv(), dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  std::vector<std::string> cliArgs(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  Result cli(const std::vector<std::string>& args) { return run(cliArgs(args), cleanEnv()); }
  // The CLI with stdin from `in` and stdout to `out` (files), through sh
  // without interpolating anything: paths travel as positional arguments.
  Result cliRedirected(const std::vector<std::string>& args, const std::string& in,
                       const std::string& out) {
    std::vector<std::string> argv = {
        "sh", "-c", "in=$1; out=$2; shift 2; exec \"$@\" <\"$in\" >\"$out\"", "sh", in, out};
    for (auto& a : cliArgs(args)) argv.push_back(a);
    return run(argv, cleanEnv());
  }

  // Runs `body` with a connected client on a private io_context.
  template <typename F>
  void withClient(F body) {
    net::asio::io_context io;
    client::ClientOptions o;
    o.endpoints = {endpoint_};
    o.token = token_;
    o.client_name = "files-test";
    auto c = client::Client::create(io.get_executor(), o);
    bool finished = false;
    net::asio::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
          absl::Status s = co_await c->connect();
          EXPECT_TRUE(s.ok()) << s;
          if (s.ok()) co_await body(c);
          c->close();
          finished = true;
        },
        net::asio::detached);
    io.run();
    EXPECT_TRUE(finished);
  }

  // Every response is checked: the host's marker must never come back.
  void expectNoHostContent(const Result& r) {
    EXPECT_THAT(r.out, Not(HasSubstr(host_secret_))) << r;
    EXPECT_THAT(r.out, Not(HasSubstr("HOST-ONLY-"))) << r;
  }

  std::string unshare_, chroot_;
  std::optional<TempDir> dir_;
  std::string token_, token_file_;
  std::string host_secret_, pod_content_;
  std::string outside_, root_;
  std::optional<NetNs> netns_;
  Child pod_;
  std::optional<Agent> agent_;
  std::string endpoint_;
};

using Client = std::shared_ptr<client::Client>;

net::awaitable<absl::StatusOr<v1::FileResponse>> fileCall(const Client& c,
                                                          const v1::FileRequest& fr) {
  v1::Request req;
  *req.mutable_file() = fr;
  auto r = co_await c->call(std::move(req), std::chrono::seconds(20));
  if (!r.ok()) co_return r.status();
  co_return r->file();
}

// open + pread + close: the content, or the first error.
net::awaitable<absl::StatusOr<std::string>> readVia(const Client& c, const std::string& path) {
  v1::FileRequest open;
  open.mutable_open()->set_path(path);
  open.mutable_open()->set_flags(O_RDONLY);
  auto opened = co_await fileCall(c, open);
  if (!opened.ok()) co_return opened.status();
  v1::FileRequest pread;
  pread.mutable_pread()->set_fd(opened->opened().fd());
  pread.mutable_pread()->set_size(65536);
  auto data = co_await fileCall(c, pread);
  v1::FileRequest close;
  close.mutable_close()->set_fd(opened->opened().fd());
  (void)co_await fileCall(c, close);
  if (!data.ok()) co_return data.status();
  co_return data->data().data();
}

TEST_F(FilesTest, ReadsAFileThatExistsOnlyInThePodsRoot) {
  ASSERT_FALSE(std::filesystem::exists("/etc/hostname-pod")) << "must exist only in the pod";
  ASSERT_NO_FATAL_FAILURE(startAgent(""));  // default: ro
  Result cat = cli({"fs", "cat", "/etc/hostname-pod"});
  EXPECT_EQ(cat.exit_code, 0) << cat;
  EXPECT_EQ(cat.out, pod_content_);
  EXPECT_EQ(cat.err, "");

  Result stat = cli({"fs", "stat", "/etc/hostname-pod"});
  EXPECT_EQ(stat.exit_code, 0) << stat;
  EXPECT_THAT(stat.out, StartsWith("  File: /etc/hostname-pod\n"));
  EXPECT_THAT(stat.out, HasSubstr("regular file"));
  EXPECT_THAT(stat.out, HasSubstr("Size: " + std::to_string(pod_content_.size()) + " "));

  Result json = cli({"--json", "fs", "stat", "-L", "/etc/passwd", "/etc/group"});
  EXPECT_EQ(json.exit_code, 1) << "/etc/passwd dangles inside the root: " << json;
  EXPECT_THAT(json.err,
              HasSubstr("siphon: fs stat /etc/passwd: No such file or directory (ENOENT)"));
  EXPECT_THAT(json.out, HasSubstr("\"path\": \"/etc/group\""));
  EXPECT_THAT(json.out, HasSubstr("\"size\": 11,")) << "pod-mirror\\n, the in-root copy";

  Result ls = cli({"fs", "ls", "/etc"});
  EXPECT_EQ(ls.exit_code, 0) << ls;
  EXPECT_EQ(ls.out, "group\nhostname-pod\npasswd\n");
  Result lsl = cli({"fs", "ls", "-l", "/etc"});
  EXPECT_EQ(lsl.exit_code, 0) << lsl;
  EXPECT_THAT(lsl.out, HasSubstr(" passwd -> " + outside_ + "/secret\n"));
  EXPECT_THAT(lsl.out, HasSubstr("-rw-"));

  Result rl = cli({"fs", "readlink", "/escape-proc"});
  EXPECT_EQ(rl.exit_code, 0) << rl;
  EXPECT_EQ(rl.out, "/proc/self/root\n");

  Result missing = cli({"fs", "cat", "/etc/shadow"});
  EXPECT_EQ(missing.exit_code, 1) << missing;
  EXPECT_EQ(missing.out, "");
  EXPECT_EQ(missing.err, "siphon: fs cat /etc/shadow: No such file or directory (ENOENT)\n");

  Result info = cli({"--json", "info"});
  EXPECT_THAT(info.out, HasSubstr("\"files\""));
}

TEST_F(FilesTest, PathEscapesNeverReturnHostContent) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  const std::string secret = outside_ + "/secret";
  struct Case {
    std::string path;
    std::string want_err;  // the errno name(s) the CLI may print, "A|B"
  };
  const std::vector<Case> cases = {
      {"../../../../../../../../.." + secret, "ENOENT"},
      {secret, "ENOENT"},
      {"/etc/../../../.." + secret, "ENOENT"},
      {"/etc/passwd", "ENOENT"},  // absolute link to the host path
      {"/chain", "ENOENT"},       // relative chain climbing past "/"
      {"/up/up/up" + secret, "ENOENT"},
      {"/escape-proc" + secret, "ELOOP"},  // link to /proc/self/root: a magic link
      {"/proc/self/root" + secret, "ELOOP"},
      // The host's init, seen through the pod's /proc: ELOOP, or EACCES
      // first when the agent may not ptrace it.
      {"/proc/1/root" + secret, "ELOOP|EACCES"},
      {"/proc/self/cwd" + secret, "ELOOP"},
  };
  for (const auto& c : cases) {
    Result r = cli({"fs", "cat", c.path});
    expectNoHostContent(r);
    EXPECT_EQ(r.exit_code, 1) << c.path << ": " << r;
    bool named = false;
    size_t start = 0;
    while (start <= c.want_err.size()) {
      size_t bar = c.want_err.find('|', start);
      if (bar == std::string::npos) bar = c.want_err.size();
      const std::string e = "(" + c.want_err.substr(start, bar - start) + ")";
      named = named || r.err.find(e) != std::string::npos;
      start = bar + 1;
    }
    EXPECT_TRUE(named) << c.path << ": want " << c.want_err << ", got " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    Result st = cli({"fs", "stat", "-L", c.path});
    EXPECT_EQ(st.exit_code, 1) << c.path << ": " << st;
    expectNoHostContent(st);
  }
  // A link to an absolute path that also exists inside the root: the
  // in-root copy, not the host's file of the same name.
  Result group = cli({"fs", "cat", "/etc/group"});
  EXPECT_EQ(group.exit_code, 0) << group;
  EXPECT_EQ(group.out, "pod-mirror\n");
}

TEST_F(FilesTest, LinksAndDirectoriesSwappedDuringRequestsNeverEscape) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  const std::string secret = outside_ + "/secret";
  writeHost(root_ + "/swap", "pod-swap\n");
  symlink(secret.c_str(), (root_ + "/swap-abs").c_str());
  symlink(("/proc/self/root" + secret).c_str(), (root_ + "/swap-proc").c_str());
  symlink(("../../../../../../../.." + secret).c_str(), (root_ + "/swap-rel").c_str());

  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const std::string swap = root_ + "/swap";
    const std::string links[] = {root_ + "/swap-abs", root_ + "/swap-proc", root_ + "/swap-rel"};
    const std::string in = root_ + "/a/b", out = outside_ + "/b";
    while (!stop.load()) {
      for (const auto& l : links) {
        renameat2(AT_FDCWD, swap.c_str(), AT_FDCWD, l.c_str(), RENAME_EXCHANGE);
      }
      // ROOT/a/b in and out of the root: from OUTSIDE/b/c, "../../secret"
      // is the host's marker.
      rename(in.c_str(), out.c_str());
      rename(out.c_str(), in.c_str());
    }
  });

  int swap_ok = 0, swap_err = 0, dir_ok = 0, dir_err = 0;
  const std::vector<std::string> paths = {"/swap", "/swap-abs", "/swap-proc", "/swap-rel"};
  // A third of the rounds under the sanitizers (the same races, each
  // round 3-5 times slower there).
  const int rounds = fakes::kSanitizedBuild ? 500 : 1500;
  withClient([&](const Client& c) -> net::awaitable<void> {
    for (int i = 0; i < rounds; ++i) {
      for (const std::string& path : paths) {
        auto r = co_await readVia(c, path);
        if (r.ok()) {
          EXPECT_EQ(*r, "pod-swap\n") << path;
          ++swap_ok;
        } else {
          const int e = errnoOf(r.status());
          EXPECT_TRUE(e == ENOENT || e == ELOOP) << path << ": " << r.status();
          ++swap_err;
        }
      }
      auto d = co_await readVia(c, "/a/b/c/../../secret");
      if (d.ok()) {
        EXPECT_EQ(*d, "pod-a-secret\n");
        ++dir_ok;
      } else {
        const int e = errnoOf(d.status());
        EXPECT_TRUE(e == ENOENT || e == EAGAIN || e == EXDEV) << d.status();
        ++dir_err;
      }
    }
  });
  // The CLI through the same races.
  const std::vector<std::string> cli_paths = {"/swap", "/swap-abs", "/a/b/c/../../secret"};
  for (int i = 0; i < 20; ++i) {
    for (const std::string& path : cli_paths) {
      Result r = cli({"fs", "cat", path});
      expectNoHostContent(r);
      EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << r;
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(swap_ok + swap_err, rounds * static_cast<int>(paths.size()));
  EXPECT_EQ(dir_ok + dir_err, rounds);
  EXPECT_EQ(readFile(secret), host_secret_) << "the host's marker is untouched";
}

TEST_F(FilesTest, ReadOnlyRefusesEveryWriteLikeOperation) {
  ASSERT_NO_FATAL_FAILURE(startAgent("ro"));
  const std::string erofs = "Read-only file system (EROFS)";
  const std::string input = dir_->file("input", "new content");
  Result w = cliRedirected({"fs", "write", "/etc/hostname-pod"}, input, "/dev/null");
  EXPECT_EQ(w.exit_code, 1) << w;
  // With the agent's reason: the errno is its answer, not the kernel's.
  EXPECT_EQ(w.err, "siphon: fs write /etc/hostname-pod: " + erofs +
                       ": the agent serves files read-only (siphon-agent --fs-mode ro)\n");
  for (const auto& args :
       std::vector<std::vector<std::string>>{{"fs", "mkdir", "/newdir"},
                                             {"fs", "mkdir", "-p", "/x/y"},
                                             {"fs", "rm", "/etc/hostname-pod"},
                                             {"fs", "rm", "-r", "/a"},
                                             {"fs", "mv", "/etc/hostname-pod", "/moved"}}) {
    Result r = cli(args);
    EXPECT_EQ(r.exit_code, 1) << r;
    EXPECT_THAT(r.err, HasSubstr(erofs)) << r;
  }

  withClient([&](const Client& c) -> net::awaitable<void> {
    v1::FileRequest ro;
    ro.mutable_open()->set_path("/etc/hostname-pod");
    ro.mutable_open()->set_flags(O_RDONLY);
    auto opened = co_await fileCall(c, ro);
    EXPECT_TRUE(opened.ok()) << opened.status();
    const uint64_t fd = opened.ok() ? opened->opened().fd() : 1;

    std::vector<v1::FileRequest> writes;
    for (int flags : {O_WRONLY, O_RDWR, O_RDONLY | O_CREAT, O_RDONLY | O_TRUNC, O_WRONLY | O_APPEND,
                      O_TMPFILE | O_RDWR}) {
      v1::FileRequest r;
      r.mutable_open()->set_path(flags & O_TMPFILE ? "/tmp" : "/etc/hostname-pod");
      r.mutable_open()->set_flags(flags);
      r.mutable_open()->set_mode(0644);
      writes.push_back(r);
    }
    v1::FileRequest r;
    r.mutable_write()->set_fd(fd);
    r.mutable_write()->set_data("x");
    writes.push_back(r);
    r.mutable_pwrite()->set_fd(fd);
    r.mutable_pwrite()->set_data("x");
    writes.push_back(r);
    r.mutable_mkdir()->set_path("/newdir");
    writes.push_back(r);
    r.mutable_rmdir()->set_path("/a/b/c");
    writes.push_back(r);
    r.mutable_unlink()->set_path("/etc/hostname-pod");
    writes.push_back(r);
    r.mutable_rename()->set_from("/etc/hostname-pod");
    r.mutable_rename()->set_to("/moved");
    writes.push_back(r);
    r.mutable_truncate()->set_path("/etc/hostname-pod");
    writes.push_back(r);
    r.mutable_ftruncate()->set_fd(fd);
    writes.push_back(r);
    r.mutable_chmod()->set_path("/etc/hostname-pod");
    r.mutable_chmod()->set_mode(0777);
    writes.push_back(r);
    r.mutable_chown()->set_path("/etc/hostname-pod");
    r.mutable_chown()->set_uid(1234);
    r.mutable_chown()->set_gid(1234);
    writes.push_back(r);
    r.mutable_utimens()->set_path("/etc/hostname-pod");
    writes.push_back(r);
    for (const auto& req : writes) {
      auto res = co_await fileCall(c, req);
      EXPECT_EQ(errorCodeOf(res.status()), v1::ERRNO) << req.ShortDebugString();
      EXPECT_EQ(errnoOf(res.status()), EROFS) << req.ShortDebugString();
    }
  });

  struct stat st {};
  ASSERT_EQ(stat((root_ + "/etc/hostname-pod").c_str(), &st), 0);
  EXPECT_EQ(readFile(root_ + "/etc/hostname-pod"), pod_content_);
  EXPECT_NE(st.st_mode & 0777, 0777u);
  EXPECT_NE(st.st_uid, 1234u);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/newdir"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/moved"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/a/b/c"));
}

TEST_F(FilesTest, ReadWriteRoundTripsSixtyFourMiB) {
  ASSERT_NO_FATAL_FAILURE(startAgent("rw"));
  const std::string in = dir_->path() + "/in.bin";
  const std::string out = dir_->path() + "/out.bin";
  {
    std::mt19937_64 rng(std::random_device{}());
    std::ofstream f(in, std::ios::binary);
    std::vector<uint64_t> block(8192);
    for (int i = 0; i < 64 * 1024 * 1024 / 65536; ++i) {
      for (auto& w : block) w = rng();
      f.write(reinterpret_cast<const char*>(block.data()), 65536);
    }
  }
  ASSERT_EQ(std::filesystem::file_size(in), 64u << 20);

  Result mk = cli({"fs", "mkdir", "-p", "/data/sub"});
  ASSERT_EQ(mk.exit_code, 0) << mk;
  Result again = cli({"fs", "mkdir", "-p", "/data/sub"});
  EXPECT_EQ(again.exit_code, 0) << "-p: an existing directory is fine: " << again;

  Result w = cliRedirected({"fs", "write", "/data/sub/big.bin"}, in, "/dev/null");
  ASSERT_EQ(w.exit_code, 0) << w;
  Result c = cliRedirected({"fs", "cat", "/data/sub/big.bin"}, "/dev/null", out);
  ASSERT_EQ(c.exit_code, 0) << c;

  Result sums = run({"sha256sum", in, root_ + "/data/sub/big.bin", out});
  ASSERT_EQ(sums.exit_code, 0) << sums;
  std::istringstream lines(sums.out);
  std::string a, b, d, ignore;
  lines >> a >> ignore >> b >> ignore >> d;
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, b) << "the file in the pod's root";
  EXPECT_EQ(a, d) << "what fs cat streamed back";

  Result mv = cli({"fs", "mv", "/data/sub/big.bin", "/data/moved.bin"});
  EXPECT_EQ(mv.exit_code, 0) << mv;
  EXPECT_TRUE(std::filesystem::exists(root_ + "/data/moved.bin"));
  Result rm = cli({"fs", "rm", "/data"});
  EXPECT_EQ(rm.exit_code, 1) << rm;
  EXPECT_EQ(rm.err, "siphon: fs rm /data: Is a directory (EISDIR)\n");
  Result rmr = cli({"fs", "rm", "-r", "/data"});
  EXPECT_EQ(rmr.exit_code, 0) << rmr;
  EXPECT_FALSE(std::filesystem::exists(root_ + "/data"));
  // Writes through an escaping link land inside the root, if anywhere.
  Result esc =
      cliRedirected({"fs", "write", "/etc/group"}, dir_->file("small", "pod-write"), "/dev/null");
  EXPECT_EQ(esc.exit_code, 0) << esc;
  EXPECT_EQ(readFile(root_ + dir_->path() + "/mirror/secret"), "pod-write");
  EXPECT_EQ(readFile(dir_->path() + "/mirror/secret"), host_secret_);
  Result rmroot = cli({"fs", "rm", "-r", "/"});
  EXPECT_EQ(rmroot.exit_code, 1) << rmroot;
  EXPECT_TRUE(std::filesystem::exists(root_ + "/etc/hostname-pod"));
}

TEST_F(FilesTest, OffAnswersPermissionDenied) {
  ASSERT_NO_FATAL_FAILURE(startAgent("off"));
  Result r = cli({"fs", "cat", "/etc/hostname-pod"});
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "siphon: fs cat /etc/hostname-pod failed: PERMISSION_DENIED: file access is off "
            "(--fs-mode off)\n");
  Result ls = cli({"fs", "ls", "/"});
  EXPECT_EQ(ls.exit_code, 1) << ls;
  EXPECT_THAT(ls.err, HasSubstr("PERMISSION_DENIED"));
  Result info = cli({"--json", "info"});
  EXPECT_EQ(info.exit_code, 0) << info;
  EXPECT_THAT(info.out, Not(HasSubstr("\"files\""))) << "FEATURE_FILES is not advertised";
}

}  // namespace
}  // namespace siphon
