// Whose identity a new file helper takes (issue 40, items 9 and 5), against the
// real kernel and the real helper (siphon-agent fs-helper): a target whose
// pid, once it exited, is reused by another process of another user
// (clone3 with set_tid gives the newcomer exactly that pid) must not lend
// that user's identity to a helper started afterwards; no helper starts
// while the target is down, and an adopted restart is served with the new
// process's identity; and the inotify instances of file watches count
// against the target's user, not the agent's uid 0.
//
// The file system is what the file service builds for the agent
// (makeFileSystem) over a real Target opened through the real /proc. The
// target's root is the host's "/": the files are in the test's scratch
// directory, one readable only by the target's uid, one only by the
// newcomer's.
//
// Without root every test skips with the reason.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "agent/files/file_service.h"
#include "agent/files/fs_helper.h"
#include "agent/netns/netns_worker.h"
#include "agent/services/service.h"
#include "agent/target/proc_fs.h"
#include "agent/target/target.h"
#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/eventually.h"
#include "tests/privileged/harness/privileged_test.h"

namespace siphon::agent::files {
namespace {

// Uids no one else on the machine uses (inotify counts are per user).
const uid_t kTargetUid = 40000 + static_cast<uid_t>(::getpid() % 20000) * 2;
const uid_t kOtherUid = kTargetUid + 1;
// Only turns a hang into a failure.
constexpr auto kDeadline = std::chrono::seconds(20);

// In the child of a fork or clone3 of a threaded process: raw system calls
// only. Takes `uid` (and the same gid, no groups) and waits to be killed.
[[noreturn]] void becomeAndWait(uid_t uid) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
      ::setresuid(uid, uid, uid) != 0) {
    ::_exit(3);
  }
  for (;;) ::pause();
}

// A process running as `uid`, killed and reaped by the destructor.
class Process {
 public:
  explicit Process(pid_t pid) : pid_(pid) {}
  ~Process() { kill(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  pid_t pid() const { return pid_; }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

std::unique_ptr<Process> spawnAs(uid_t uid) {
  const pid_t pid = ::fork();
  if (pid == 0) becomeAndWait(uid);
  return pid > 0 ? std::make_unique<Process>(pid) : nullptr;
}

// A process as `uid` at exactly `pid` (which must be free), or null with
// errno (EEXIST: someone took the pid first).
std::unique_ptr<Process> spawnAtPid(uid_t uid, pid_t pid) {
  struct clone_args args {};
  args.exit_signal = SIGCHLD;
  args.set_tid = reinterpret_cast<uint64_t>(&pid);
  args.set_tid_size = 1;
  const long got = ::syscall(SYS_clone3, &args, sizeof args);
  if (got == 0) becomeAndWait(uid);
  return got > 0 ? std::make_unique<Process>(static_cast<pid_t>(got)) : nullptr;
}

// Whether /proc/PID/status shows `uid` as its effective uid.
bool runsAs(pid_t pid, uid_t uid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0) {
      return line.find("\t" + std::to_string(uid) + "\t" + std::to_string(uid)) !=
             std::string::npos;
    }
  }
  return false;
}

class HelperIdentityTest : public harness::PrivilegedTest {
 protected:
  HelperIdentityTest()
      : harness::PrivilegedTest(
            "needs root: takes other uids, and gives a new process a chosen pid") {}

  void SetUp() override {
    harness::PrivilegedTest::SetUp();
    if (IsSkipped()) return;
    // The processes first: fork before this process starts threads.
    target_process_ = spawnAs(kTargetUid);
    ASSERT_NE(target_process_, nullptr) << std::strerror(errno);
    ASSERT_TRUE(
        fakes::eventually([&] { return runsAs(target_process_->pid(), kTargetUid); }, kDeadline));
    // The files, in a directory every uid may search.
    base_ = dir().path();
    ASSERT_EQ(::chmod(base_.c_str(), 0755), 0);
    for (auto [name, uid] : {std::pair{"mine", kTargetUid}, std::pair{"theirs", kOtherUid}}) {
      const std::string p = dir().file(name, std::string(name) + "\n");  // mode 0600
      ASSERT_EQ(::chown(p.c_str(), uid, uid), 0) << p;
    }
    auto target = Target::open(
        procfs_, TargetSpec{TargetMode::kTargeted, target_process_->pid(), "", "", {}});
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
    auto netns = NetnsWorker::start(-1);
    ASSERT_TRUE(netns.ok()) << netns.status();
    netns_ = *std::move(netns);
    config_.fs_helper_exe = SIPHON_AGENT_BIN;
    config_.fs_identity = FsIdentity::kTarget;
    ctx_ = std::make_unique<ServiceContext>(
        ServiceContext{io_, pool_, *target_, procfs_, *netns_, config_, {}, {}, nullptr, {}});
  }

  void TearDown() override {
    pool_.join();
    harness::PrivilegedTest::TearDown();
  }

  absl::Status open(FileSystem& fs, const std::string& name) {
    v1::FileRequest req;
    req.mutable_open()->set_path(base_ + "/" + name);
    req.mutable_open()->set_flags(O_RDONLY);
    return fs.open(req).status();
  }

  RealProcFs procfs_;
  std::unique_ptr<Process> target_process_;
  std::string base_;
  std::unique_ptr<Target> target_;
  AgentConfig config_;
  net::asio::io_context io_{1};
  net::asio::thread_pool pool_{1};
  std::unique_ptr<NetnsWorker> netns_;
  std::unique_ptr<ServiceContext> ctx_;
};

TEST_F(HelperIdentityTest, APidReusedWhileTheTargetIsDownLendsNoIdentity) {
  {
    // While the target runs, a helper is the target.
    std::shared_ptr<FileSystem> fs = makeFileSystem(*ctx_);
    ASSERT_TRUE(open(*fs, "mine").ok()) << open(*fs, "mine");
    EXPECT_EQ(errnoOf(open(*fs, "theirs")), EACCES);
  }  // its helper stops with it

  // The target exits (its container restarts, say) and another user's
  // process takes its pid before anything was adopted.
  const pid_t pid = target_process_->pid();
  target_process_->kill();
  std::unique_ptr<Process> intruder = spawnAtPid(kOtherUid, pid);
  if (!intruder) {
    if (errno == EEXIST) GTEST_SKIP() << "another process took pid " << pid << " first";
    FAIL() << "clone3 with set_tid " << pid << ": " << std::strerror(errno);
  }
  ASSERT_TRUE(fakes::eventually([&] { return runsAs(pid, kOtherUid); }, kDeadline));

  // A helper that starts now must not be the intruder.
  std::shared_ptr<FileSystem> fs = makeFileSystem(*ctx_);
  absl::Status theirs = open(*fs, "theirs");
  EXPECT_FALSE(theirs.ok()) << "a new file helper took the identity of uid " << kOtherUid
                            << ", whose process reused the target's pid " << pid;
  EXPECT_EQ(errnoOf(theirs), EAGAIN) << theirs;
  EXPECT_EQ(errnoOf(open(*fs, "mine")), EAGAIN) << "no helper while the target is down";
}

TEST_F(HelperIdentityTest, AnAdoptedRestartIsServedWithTheNewProcesssIdentity) {
  std::shared_ptr<FileSystem> fs = makeFileSystem(*ctx_);
  ASSERT_TRUE(open(*fs, "mine").ok());
  const pid_t first = target_process_->pid();
  target_process_->kill();
  // Down: the running helper is stopped as the server does at an adoption
  // (targetRestarted); none starts again until one is adopted.
  fs->targetRestarted(first);
  EXPECT_EQ(errnoOf(open(*fs, "mine")), EAGAIN);

  std::unique_ptr<Process> next_process = spawnAs(kOtherUid);
  ASSERT_NE(next_process, nullptr);
  ASSERT_TRUE(fakes::eventually([&] { return runsAs(next_process->pid(), kOtherUid); }, kDeadline));
  auto next =
      Target::open(procfs_, TargetSpec{TargetMode::kTargeted, next_process->pid(), "", "", {}});
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(target_->adopt(*std::move(next)).ok());
  fs->targetRestarted(target_->pid());
  EXPECT_TRUE(open(*fs, "theirs").ok()) << open(*fs, "theirs");
  EXPECT_EQ(errnoOf(open(*fs, "mine")), EACCES);
}

// How many more inotify instances `uid` may make on this node (it makes
// them until EMFILE, in a child of its own, and lets them go).
int instancesLeftFor(uid_t uid) {
  int out[2];
  if (::pipe(out) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      ::_exit(3);
    }
    int n = 0;
    while (n < 1 << 20 && ::inotify_init1(IN_CLOEXEC) >= 0) ++n;
    const bool limit = errno == EMFILE;
    if (!limit) n = -1;
    ssize_t ignored = ::write(out[1], &n, sizeof n);
    (void)ignored;
    ::_exit(0);
  }
  ::close(out[1]);
  int n = -1;
  if (pid < 0 || ::read(out[0], &n, sizeof n) != sizeof n) n = -1;
  ::close(out[0]);
  int status;
  if (pid > 0) ::waitpid(pid, &status, 0);
  return n;
}

TEST_F(HelperIdentityTest, WatchInstancesCountAgainstTheTargetsUser) {
  const int before_target = instancesLeftFor(kTargetUid);
  ASSERT_GT(before_target, 3) << "uid " << kTargetUid << " has no inotify instance to spare";

  // Three sessions watch the scratch directory through the file service:
  // three instances.
  std::shared_ptr<RequestService> service = makeFileService(*ctx_);
  std::vector<std::shared_ptr<fakes::FakeSessionHost>> hosts;
  for (int i = 0; i < 3; ++i) {
    hosts.push_back(std::make_shared<fakes::FakeSessionHost>("watcher-" + std::to_string(i)));
    v1::Request r;
    r.set_request_id(1);
    r.mutable_file()->mutable_watch()->set_path(base_);
    service->handle(hosts.back(), std::move(r));
    ASSERT_TRUE(fakes::eventually(
        [&] {
          io_.restart();
          io_.poll();
          return hosts.back()->response(1).has_value();
        },
        kDeadline));
    ASSERT_TRUE(hosts.back()->response(1)->file().has_watched())
        << hosts.back()->response(1)->DebugString();
  }
  EXPECT_EQ(instancesLeftFor(kTargetUid), before_target - 3)
      << "the target's user was not charged for the instances made for it";

  for (auto& h : hosts) {
    h->end();
    service->sessionEnded(h->id());
  }
  EXPECT_EQ(instancesLeftFor(kTargetUid), before_target) << "a session's end gives them back";
  service->agentStopping();
}

}  // namespace
}  // namespace siphon::agent::files
