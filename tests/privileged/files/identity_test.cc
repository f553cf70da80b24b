// The file service works with the target's identity, never the agent's
// powers (docs/SECURITY.md, "File identity"): the real siphon-agent and the
// real siphon CLI against
//   - a non-root "pod" in the agent's own PID namespace (chrooted, its own
//     mount namespace and /proc),
//   - a non-root pod in its own PID namespace,
//   - targetless,
// asking for the agent's memory, environment, maps and fds through every
// /proc name (self, thread-self, the agent's pid, 1), /dev/mem-like nodes
// and root-only files. The agent runs with a canary in its environment and a
// token file: neither may ever come back in an answer.
//
// Without root every test skips with the reason.
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/asio.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon {
namespace {

using namespace siphon::harness;  // NOLINT: test file
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kSkipReason =
    "needs root: creates mount and PID namespaces, chroots a pod and runs siphon-agent";
constexpr int kPodUid = 1000;

enum class Pod { kSharedPid, kOwnPid, kNone };

class FileIdentityTest : public ::testing::Test {
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
    canary_ = "CANARY" + randomHex(24);
    root_ = dir_->path() + "/root";
    for (const char* d : {"bin", "proc", "etc", "dev", "tmp"}) {
      std::filesystem::create_directories(root_ + "/" + d);
    }
    std::filesystem::copy_file("/bin/busybox", root_ + "/bin/busybox");
    chmod((root_ + "/bin/busybox").c_str(), 0755);
    chmod(dir_->path().c_str(), 0755);
    // Root-only, and a /dev/mem-like node the target "made".
    root_secret_ = "root-only-" + randomHex(16);
    write(root_ + "/etc/secret", root_secret_);
    chmod((root_ + "/etc/secret").c_str(), 0600);
    ASSERT_EQ(mknod((root_ + "/dev/mem").c_str(), S_IFCHR | 0666, makedev(1, 1)), 0);
    ASSERT_EQ(mknod((root_ + "/dev/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    // The pod's own file, readable by it.
    write(root_ + "/etc/hostname-pod", "pod\n");
    chmod((root_ + "/etc/hostname-pod").c_str(), 0644);
  }

  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
    if (pod_) pod_->kill();
  }

  static void write(const std::string& path, const std::string& content) {
    std::ofstream(path, std::ios::binary) << content;
  }

  // A pod running /bin/busybox sleep as uid kPodUid, chrooted in root_ with
  // its own /proc; `own_pid`: in a new PID namespace (it is pid 1 there).
  void startPod(bool own_pid) {
    const std::string script = "mount -t proc proc \"$1/proc\" && exec " + chroot_ +
                               " --userspec=" + std::to_string(kPodUid) + ":" +
                               std::to_string(kPodUid) + " \"$1\" /bin/busybox sleep 600";
    std::vector<std::string> argv = {unshare_, "--mount", "--propagation", "private"};
    if (own_pid) argv.insert(argv.end(), {"--pid", "--fork"});
    argv.insert(argv.end(), {"/bin/sh", "-c", script, "sh", root_});
    pod_.emplace(spawn(argv, std::nullopt, -1, -1));
    ASSERT_GT(pod_->pid(), 0);
    // The sleep: the spawned pid itself, or (--fork) its child.
    const auto deadline = Clock::now() + kProcessDeadline;
    const std::string want =
        std::string("/bin/busybox\0sleep\0", 19) + "600" + std::string(1, '\0');
    while (Clock::now() < deadline) {
      for (pid_t candidate : candidates()) {
        const std::string proc = "/proc/" + std::to_string(candidate);
        std::error_code ec;
        if (readFile(proc + "/cmdline") == want &&
            std::filesystem::read_symlink(proc + "/root", ec) == root_) {
          target_ = candidate;
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "the pod never ran sleep chrooted in " << root_;
  }

  std::vector<pid_t> candidates() {
    std::vector<pid_t> out = {pod_->pid()};
    std::istringstream children(readFile("/proc/" + std::to_string(pod_->pid()) + "/task/" +
                                         std::to_string(pod_->pid()) + "/children"));
    pid_t p;
    while (children >> p) out.push_back(p);
    return out;
  }

  void startAgent(Pod pod, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "--listen",  "127.0.0.1:0", "--token-file", token_file_, "--first-client-timeout", "30s",
        "--fs-mode", "rw"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (pod == Pod::kNone) {
      args.push_back("targetless");
    } else {
      args.insert(args.end(), {"targeted", "--pid", std::to_string(target_)});
    }
    agent_.emplace(args, cleanEnv({"SIPHON_SECRET_CANARY=" + canary_}),
                   dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
    agent_pid_ = std::to_string(agent_->child().pid());
  }

  Result cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r = run(argv, cleanEnv());
    noSecret(r);
    return r;
  }

  // `fs write PATH` with `data` on stdin.
  Result cliWrite(const std::string& path, const std::string& data) {
    const std::string in = dir_->file("in-" + randomHex(6), data);
    std::vector<std::string> argv = {"sh",        "-c",      "in=$1; shift; exec \"$@\" <\"$in\"",
                                     "sh",        in,        SIPHON_CLI_BIN,
                                     "--agent",   endpoint_, "--token-file",
                                     token_file_, "fs",      "write",
                                     path};
    Result r = run(argv, cleanEnv());
    noSecret(r);
    return r;
  }

  void noSecret(const Result& r) {
    EXPECT_THAT(r.out + r.err, Not(HasSubstr(canary_))) << "the agent's environment leaked";
    EXPECT_THAT(r.out + r.err, Not(HasSubstr(token_))) << "the agent's token leaked";
  }

  // Every name of the agent's (or the serving process's) secrets: refused,
  // or, where the target could read it itself, free of the agent's.
  void expectAgentSecretsUnreachable() {
    for (const std::string& p :
         {std::string("/proc/self/environ"), std::string("/proc/self/maps"),
          std::string("/proc/self/mem"), std::string("/proc/self/auxv"),
          std::string("/proc/thread-self/environ"), std::string("/proc/thread-self/maps"),
          "/proc/" + agent_pid_ + "/environ", "/proc/" + agent_pid_ + "/maps",
          "/proc/" + agent_pid_ + "/mem", "/proc/" + agent_pid_ + "/cmdline"}) {
      Result r = cli({"fs", "cat", p});
      if (p.find("cmdline") == std::string::npos) {
        EXPECT_NE(r.exit_code, 0) << p << " was served: " << r;
      }
    }
    Result fds = cli({"fs", "ls", "/proc/" + agent_pid_ + "/fd"});
    EXPECT_NE(fds.exit_code, 0) << fds;
    Result selffd = cli({"fs", "ls", "/proc/self/fd"});
    EXPECT_NE(selffd.exit_code, 0) << selffd;
    // Nothing written reaches a process's memory.
    for (const std::string& p : {std::string("/proc/self/mem"), "/proc/" + agent_pid_ + "/mem",
                                 std::string("/proc/thread-self/mem")}) {
      Result w = cliWrite(p, "XXXXXXXX");
      EXPECT_NE(w.exit_code, 0) << p << ": " << w;
    }
    Result init = cli({"fs", "cat", "/proc/1/environ"});
    (void)init;  // checked by noSecret: the pod's own pid 1 is the target's
  }

  void expectDevicesRefused() {
    Result mem = cli({"fs", "cat", "/dev/mem"});
    EXPECT_NE(mem.exit_code, 0) << mem;
    EXPECT_THAT(mem.err, HasSubstr("Permission denied")) << mem;
    Result w = cliWrite("/dev/mem", "X");
    EXPECT_NE(w.exit_code, 0) << w;
    Result null = cli({"fs", "cat", "/dev/null"});
    EXPECT_EQ(null.exit_code, 0) << null;
  }

  std::optional<TempDir> dir_;
  std::string unshare_, chroot_, root_, token_, token_file_, canary_, root_secret_;
  std::optional<Child> pod_;
  pid_t target_ = 0;
  std::optional<Agent> agent_;
  std::string endpoint_, agent_pid_;
};

TEST_F(FileIdentityTest, NonRootTargetInTheAgentsPidNamespace) {
  ASSERT_NO_FATAL_FAILURE(startPod(false));
  ASSERT_NO_FATAL_FAILURE(startAgent(Pod::kSharedPid));
  Result own = cli({"fs", "cat", "/etc/hostname-pod"});
  EXPECT_EQ(own.exit_code, 0) << own;
  EXPECT_EQ(own.out, "pod\n");
  expectAgentSecretsUnreachable();
  // The host's init is not the target's to read.
  Result init = cli({"fs", "cat", "/proc/1/environ"});
  EXPECT_NE(init.exit_code, 0) << init;
  // A root-only file is the errno the target would get itself.
  Result secret = cli({"fs", "cat", "/etc/secret"});
  EXPECT_NE(secret.exit_code, 0) << secret;
  EXPECT_THAT(secret.err, HasSubstr("Permission denied (EACCES)")) << secret;
  Result w = cliWrite("/etc/secret", "overwritten");
  EXPECT_NE(w.exit_code, 0) << w;
  Result create = cliWrite("/etc/new-file", "x");
  EXPECT_NE(create.exit_code, 0) << "uid 1000 cannot create in root's /etc: " << create;
  Result tmp = cliWrite("/tmp/mine", "x");
  EXPECT_NE(tmp.exit_code, 0) << "root's 0755 /tmp: " << tmp;
  // Where the target may write, what it creates is its own.
  std::filesystem::create_directories(root_ + "/home/pod");
  ASSERT_EQ(chown((root_ + "/home/pod").c_str(), kPodUid, kPodUid), 0);
  Result mine = cliWrite("/home/pod/made", "mine");
  EXPECT_EQ(mine.exit_code, 0) << mine;
  struct stat made {};
  ASSERT_EQ(::stat((root_ + "/home/pod/made").c_str(), &made), 0);
  EXPECT_EQ(made.st_uid, static_cast<uid_t>(kPodUid)) << "created with the target's uid";
  EXPECT_EQ(made.st_gid, static_cast<gid_t>(kPodUid));
  expectDevicesRefused();
  // The files the helper created would be the pod's: none were.
  EXPECT_FALSE(std::filesystem::exists(root_ + "/etc/new-file"));
  EXPECT_EQ(readFile(root_ + "/etc/secret"), root_secret_);
}

TEST_F(FileIdentityTest, NonRootTargetInItsOwnPidNamespace) {
  ASSERT_NO_FATAL_FAILURE(startPod(true));
  ASSERT_NO_FATAL_FAILURE(startAgent(Pod::kOwnPid));
  Result own = cli({"fs", "cat", "/etc/hostname-pod"});
  EXPECT_EQ(own.exit_code, 0) << own;
  expectAgentSecretsUnreachable();
  // pid 1 there is the target itself: its own environment is its to read.
  Result init = cli({"fs", "cat", "/proc/1/cmdline"});
  EXPECT_EQ(init.exit_code, 0) << init;
  Result secret = cli({"fs", "cat", "/etc/secret"});
  EXPECT_THAT(secret.err, HasSubstr("Permission denied (EACCES)")) << secret;
  expectDevicesRefused();
}

TEST_F(FileIdentityTest, RootIdentityReadsRootFilesButNoProcessSecrets) {
  ASSERT_NO_FATAL_FAILURE(startPod(false));
  ASSERT_NO_FATAL_FAILURE(startAgent(Pod::kSharedPid, {"--fs-identity", "root"}));
  Result secret = cli({"fs", "cat", "/etc/secret"});
  EXPECT_EQ(secret.exit_code, 0) << secret;
  EXPECT_EQ(secret.out, root_secret_);
  expectAgentSecretsUnreachable();
  // Root's powers are not the target's: no pid's environment, not even the
  // target's own or init's.
  for (const std::string& p : {"/proc/" + std::to_string(target_) + "/environ",
                               std::string("/proc/1/environ"), std::string("/proc/1/maps")}) {
    Result r = cli({"fs", "cat", p});
    EXPECT_NE(r.exit_code, 0) << p << ": " << r;
  }
  Result status = cli({"fs", "cat", "/proc/1/status"});
  EXPECT_EQ(status.exit_code, 0) << status;
  expectDevicesRefused();
}

TEST_F(FileIdentityTest, TargetlessHasNoCapabilities) {
  // Owned by another uid, 0600: the agent's uid without capabilities cannot.
  const std::string other = dir_->path() + "/other-0600";
  write(other, "other-uid-" + randomHex(8));
  ASSERT_EQ(chown(other.c_str(), kPodUid, kPodUid), 0);
  chmod(other.c_str(), 0600);
  ASSERT_NO_FATAL_FAILURE(startAgent(Pod::kNone));
  Result r = cli({"fs", "cat", other});
  EXPECT_THAT(r.err, HasSubstr("Permission denied (EACCES)")) << r;
  expectAgentSecretsUnreachable();
  Result init = cli({"fs", "cat", "/proc/1/environ"});
  EXPECT_NE(init.exit_code, 0) << init;
  Result mem = cli({"fs", "cat", "/dev/mem"});
  EXPECT_NE(mem.exit_code, 0) << mem;
}

// The agent's file helper: its child whose argv[1] is "fs-helper".
std::vector<pid_t> helpersOf(pid_t agent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string base = "/proc/" + std::string(e->d_name);
    const std::string stat = readFile(base + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != agent || state == 'Z') continue;
    const std::string cmdline = readFile(base + "/cmdline");
    if (cmdline.find(std::string("\0fs-helper\0", 11)) != std::string::npos) out.push_back(pid);
  }
  closedir(d);
  return out;
}

net::awaitable<absl::StatusOr<v1::FileResponse>> fileCall(const std::shared_ptr<client::Client>& c,
                                                          const v1::FileRequest& fr) {
  v1::Request req;
  *req.mutable_file() = fr;
  auto r = co_await c->call(std::move(req), std::chrono::seconds(20));
  if (!r.ok()) co_return r.status();
  co_return r->file();
}

v1::FileRequest preadOf(uint64_t fd) {
  v1::FileRequest r;
  r.mutable_pread()->set_fd(fd);
  r.mutable_pread()->set_size(4096);
  return r;
}

TEST_F(FileIdentityTest, AKilledHelperFailsItsHandlesAndANewOneServes) {
  ASSERT_NO_FATAL_FAILURE(startPod(false));
  ASSERT_NO_FATAL_FAILURE(startAgent(Pod::kSharedPid));
  const pid_t agent = agent_->child().pid();
  net::asio::io_context io;
  client::ClientOptions o;
  o.endpoints = {endpoint_};
  o.token = token_;
  o.client_name = "identity-test";
  auto c = client::Client::create(io.get_executor(), o);
  bool finished = false;
  pid_t first = 0;
  auto body = [&]() -> net::awaitable<void> {
    EXPECT_TRUE((co_await c->connect()).ok());
    v1::FileRequest open;
    open.mutable_open()->set_path("/etc/hostname-pod");
    open.mutable_open()->set_flags(O_RDONLY);
    auto opened = co_await fileCall(c, open);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    const uint64_t fd = opened->opened().fd();
    auto data = co_await fileCall(c, preadOf(fd));
    EXPECT_TRUE(data.ok() && data->data().data() == "pod\n");
    std::vector<pid_t> helpers = helpersOf(agent);
    EXPECT_EQ(helpers.size(), 1u);
    if (helpers.size() != 1) co_return;
    first = helpers[0];
    ::kill(first, SIGKILL);
    // Dead, all its threads (a zombie until the agent notices), so the next
    // call sees it: through the helper's socket, or, for a read the agent
    // makes itself, its pidfd, which is readable only once the last thread
    // exited (a leader in state Z may still have threads exiting).
    const auto deadline = Clock::now() + kProcessDeadline;
    const std::string proc = "/proc/" + std::to_string(first);
    while (Clock::now() < deadline) {
      const std::string stat = readFile(proc + "/stat");
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos) break;
      size_t threads = 0;
      std::error_code ec;
      for (const auto& t : std::filesystem::directory_iterator(proc + "/task", ec)) {
        (void)t;
        ++threads;
      }
      if (stat[paren + 2] == 'Z' && threads <= 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto lost = co_await fileCall(c, preadOf(fd));
    EXPECT_FALSE(lost.ok());
    EXPECT_EQ(errnoOf(lost.status()), EIO) << lost.status();
    EXPECT_THAT(std::string(lost.status().message()), HasSubstr("file helper"));
    auto stale = co_await fileCall(c, preadOf(fd));
    EXPECT_EQ(errnoOf(stale.status()), EBADF) << stale.status();
    EXPECT_THAT(std::string(stale.status().message()), HasSubstr("has exited"));
    // A new helper for the next request.
    auto again = co_await fileCall(c, open);
    EXPECT_TRUE(again.ok()) << again.status();
    if (again.ok()) {
      auto d2 = co_await fileCall(c, preadOf(again->opened().fd()));
      EXPECT_TRUE(d2.ok() && d2->data().data() == "pod\n");
    }
  };
  // Closed whatever the body met, so io.run() returns.
  net::asio::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        co_await body();
        c->close();
        finished = true;
      },
      net::asio::detached);
  io.run();
  EXPECT_TRUE(finished);
  std::vector<pid_t> now = helpersOf(agent);
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], first);
  EXPECT_THAT(agent_->log(), HasSubstr("fs_helper_lost"));
  EXPECT_EQ(agent_->child().waitUntil(Clock::now()), std::nullopt) << "the agent is still up";
}

// Another user namespace: the helper cannot take that identity (its ids
// would need the namespace's uid_map), so file requests are refused rather
// than served with the agent's uid 0.
TEST_F(FileIdentityTest, ATargetInAnotherUserNamespaceIsRefused) {
  pod_.emplace(spawn({unshare_, "--user", "--map-root-user", "/bin/busybox", "sleep", "600"},
                     std::nullopt, -1, -1));
  ASSERT_GT(pod_->pid(), 0);
  const std::string proc = "/proc/" + std::to_string(pod_->pid());
  const std::string want = std::string("/bin/busybox\0sleep\0", 19) + "600" + std::string(1, '\0');
  fakes::eventually([&] { return readFile(proc + "/cmdline") == want; }, kProcessDeadline);
  ASSERT_EQ(readFile(proc + "/cmdline"), want);
  target_ = pod_->pid();
  ASSERT_NO_FATAL_FAILURE(startAgent(Pod::kSharedPid));
  Result r = cli({"fs", "cat", "/etc/hostname"});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_THAT(r.err, HasSubstr("another user namespace")) << r;
}

}  // namespace
}  // namespace siphon
