#include "agent/steal/iptables/guard.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/capabilities.h"
#include "agent/common/log.h"
#include "agent/common/unique_fd.h"
#include "agent/steal/iptables/iptables_steering.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// The descriptors the guard finds its netns and socket at.
constexpr int kGuardNetnsFd = 3;
constexpr int kGuardSockFd = 4;
constexpr int kGuardLockFd = 5;

// Bytes on the socketpair, guard to agent.
constexpr char kReady = 'R';
constexpr char kExecFailed = 'E';  // followed by an int errno

// A guard that takes longer than this to say it is ready is broken.
constexpr auto kReadyTimeout = std::chrono::seconds(10);

int reap(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;  // ECHILD: SIGCHLD ignored, reaped already
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

struct Spawned {
  pid_t pid = -1;
  UniqueFd sock;
};

absl::StatusOr<Spawned> spawnGuard(const GuardConfig& config) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return lastErrnoStatus("iptables guard: socketpair");
  }
  UniqueFd ours(sv[0]), theirs(sv[1]);

  std::vector<std::string> argv = {config.exe,
                                   std::string(kIptablesGuardCommand),
                                   absl::StrCat("--netns-fd=", kGuardNetnsFd),
                                   absl::StrCat("--sock-fd=", kGuardSockFd),
                                   absl::StrCat("--flavor=", asv(flavorName(config.flavor))),
                                   absl::StrCat("--pre=", config.chains.pre),
                                   absl::StrCat("--out=", config.chains.out),
                                   absl::StrCat("--v6=", config.v6 ? 1 : 0)};
  if (config.lock_fd >= 0) argv.push_back(absl::StrCat("--lock-fd=", kGuardLockFd));
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int netns_fd = config.netns_fd;
  const int sock_fd = theirs.get();
  const int lock_fd = config.lock_fd;

  pid_t pid = fork();
  if (pid < 0) return lastErrnoStatus("iptables guard: fork");
  if (pid == 0) {
    // Async-signal-safe calls only (the agent has threads). The guard gets
    // the netns and its socket at fixed numbers and nothing else of the
    // agent: a listener it inherited would keep the stolen port open after
    // the agent died.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int ns = fcntl(netns_fd, F_DUPFD, 10);
    int sock = fcntl(sock_fd, F_DUPFD, 10);
    int lock = lock_fd >= 0 ? fcntl(lock_fd, F_DUPFD, 10) : -1;
    int devnull = open("/dev/null", O_RDWR);
    if (ns < 0 || sock < 0 || devnull < 0 || (lock_fd >= 0 && lock < 0)) _exit(126);
    // stdout is the agent's ready line; stderr stays for the guard's logs.
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(ns, kGuardNetnsFd);
    dup2(sock, kGuardSockFd);
    // The owner lock: a descriptor of the same socket, so the lock stays
    // held while either process lives.
    if (lock >= 0) dup2(lock, kGuardLockFd);
    close_range(lock >= 0 ? kGuardLockFd + 1 : kGuardSockFd + 1, ~0U, 0);
    // Under SECBIT_NOROOT the re-executed agent gets only its ambient set:
    // setns, and what iptables needs (agent/common/capabilities.h).
    caps::raiseAmbient(caps::kGuardAmbient);
    execv(args[0], args.data());
    char msg[1 + sizeof(int)];
    msg[0] = kExecFailed;
    int err = errno;
    std::memcpy(msg + 1, &err, sizeof err);
    ssize_t ignored = write(kGuardSockFd, msg, sizeof msg);
    (void)ignored;
    _exit(127);
  }
  theirs.reset();

  // Ready, or the reason it is not.
  const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{ours.get(), POLLIN, 0};
    int n = left.count() > 0 ? poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      kill(pid, SIGKILL);
      reap(pid);
      return absl::DeadlineExceededError(
          absl::StrCat("iptables guard ", config.exe, ": not ready after 10 s"));
    }
    char msg[1 + sizeof(int)] = {};
    ssize_t got = recv(ours.get(), msg, sizeof msg, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got >= 1 && msg[0] == kReady) return Spawned{pid, std::move(ours)};
    int status = reap(pid);
    if (got == static_cast<ssize_t>(sizeof msg) && msg[0] == kExecFailed) {
      int err;
      std::memcpy(&err, msg + 1, sizeof err);
      return errnoStatus(err, absl::StrCat("iptables guard: exec ", config.exe));
    }
    return absl::InternalError(absl::StrCat("iptables guard ", config.exe,
                                            ": exited before it was ready (exit ", status,
                                            "); see its log"));
  }
}

class ProcessGuard final : public ChainGuard {
 public:
  explicit ProcessGuard(GuardConfig config) : config_(std::move(config)) {}
  ~ProcessGuard() override { stop(); }

  absl::Status start(std::function<void()> on_lost) override {
    on_lost_ = std::move(on_lost);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return lastErrnoStatus("iptables guard: pipe");
    wake_r_.reset(p[0]);
    wake_w_.reset(p[1]);
    ASSIGN_OR_RETURN(Spawned s, spawnGuard(config_));
    pid_ = s.pid;
    sock_ = std::move(s.sock);
    log::info("steal_iptables_guard_started", {{"pid", int64_t{pid_}}});
    watcher_ = std::thread([this] { watch(); });
    return absl::OkStatus();
  }

  void stop() override {
    if (!watcher_.joinable()) return;
    char c = 's';
    ssize_t ignored = write(wake_w_.get(), &c, 1);
    (void)ignored;
    watcher_.join();
  }

 private:
  // Owns sock_ and pid_ once started.
  void watch() {
    for (;;) {
      pollfd fds[2] = {{sock_.get(), POLLIN, 0}, {wake_r_.get(), POLLIN, 0}};
      int n = poll(fds, 2, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        log::error("steal_iptables_guard_poll_failed", {{"errno", errno}});
        break;
      }
      if (fds[1].revents != 0) break;
      if (fds[0].revents == 0) continue;
      char buf[16];
      ssize_t got = recv(sock_.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) continue;

      // End of file: the guard is gone while steering is live.
      sock_.reset();
      int status = reap(pid_);
      log::warn("steal_iptables_guard_died", {{"pid", int64_t{pid_}}, {"status", status}});
      pid_ = -1;
      auto spawned = spawnGuard(config_);
      if (spawned.ok()) {
        pid_ = spawned->pid;
        sock_ = std::move(spawned->sock);
        log::info("steal_iptables_guard_restarted", {{"pid", int64_t{pid_}}});
        continue;
      }
      log::error("steal_iptables_guard_restart_failed",
                 {{"error", sv(spawned.status().message())}});
      if (on_lost_) on_lost_();
      return;
    }
    // Stopping: end of file tells the guard; it finds nothing left to
    // remove and exits. Reaped so no zombie is left behind.
    sock_.reset();
    if (pid_ > 0) reap(pid_);
    pid_ = -1;
  }

  const GuardConfig config_;
  std::function<void()> on_lost_;
  UniqueFd wake_r_, wake_w_;
  UniqueFd sock_;
  pid_t pid_ = -1;
  std::thread watcher_;
};

}  // namespace

std::unique_ptr<ChainGuard> makeProcessGuard(GuardConfig config) {
  return std::make_unique<ProcessGuard>(std::move(config));
}

int iptablesGuardMain(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 2; i < argc; ++i) {
    std::string_view a = argv[i];
    size_t eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) {
      log::error("steal_iptables_guard_bad_argument", {{"argument", a}});
      return 2;
    }
    args[std::string(a.substr(2, eq - 2))] = std::string(a.substr(eq + 1));
  }
  const int netns_fd = std::atoi(args["netns-fd"].c_str());
  const int sock_fd = std::atoi(args["sock-fd"].c_str());
  const int lock_fd = args.count("lock-fd") != 0 ? std::atoi(args["lock-fd"].c_str()) : -1;
  ChainNames chains{args["pre"], args["out"]};
  const bool v6 = args["v6"] == "1";
  if (netns_fd < 3 || sock_fd < 3 || (args.count("lock-fd") != 0 && lock_fd < 3) ||
      chains.pre.rfind("SIPHON_", 0) != 0 || chains.out.rfind("SIPHON_", 0) != 0 ||
      !parseFlavor(args["flavor"])) {
    log::error("steal_iptables_guard_bad_arguments", {});
    return 2;
  }
  if (setns(netns_fd, CLONE_NEWNET) != 0) {
    log::error("steal_iptables_guard_setns_failed", {{"error", std::strerror(errno)}});
    return 2;
  }
  close(netns_fd);
  // In the netns for good: iptables, all that is left to run, needs only
  // CAP_NET_ADMIN and CAP_NET_RAW.
  if (auto s = caps::dropFromAll(caps::bit(CAP_SYS_ADMIN)); !s.ok()) {
    log::warn("steal_iptables_guard_caps", {{"error", sv(s.message())}});
  }
  // Out of the agent's session and process group: `kill -- -PGID` or a
  // terminal's SIGINT/SIGHUP aimed at the agent must leave the guard to
  // clean up after it.
  setsid();
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) signal(sig, SIG_IGN);
  if (chdir("/") != 0) {
    // Not fatal: only keeps a mount of the agent's cwd busy.
  }
  // A failed write (EPIPE) means the agent died before this guard was
  // ready: a replacement guard started while the chains are live. Nobody
  // else would remove them, so on to the cleanup as after an EOF.
  char ready = kReady;
  ssize_t wrote;
  do {
    wrote = write(sock_fd, &ready, 1);
  } while (wrote < 0 && errno == EINTR);
  if (wrote != 1) {
    log::warn("steal_iptables_guard_agent_gone", {{"chain_pre", chains.pre}});
  } else {
    char buf[64];
    for (;;) {
      ssize_t got = read(sock_fd, buf, sizeof buf);
      if (got > 0 || (got < 0 && errno == EINTR)) continue;
      break;  // EOF (or an error, which also means the agent is gone)
    }
  }
  close(sock_fd);

  auto runner = makeIptablesRunner(-1);  // already in the target's netns
  auto removed = removeIptablesChains(*runner, chains, v6);
  // The chains are gone (or cannot be removed by us): another agent's
  // start-up sweep may now take the owner's lock and try.
  if (lock_fd >= 0) close(lock_fd);
  if (!removed.ok()) {
    log::error("steal_iptables_guard_cleanup_failed",
               {{"chain_pre", chains.pre}, {"error", sv(removed.status().message())}});
    return 1;
  }
  if (*removed > 0) {
    log::info("steal_iptables_guard_cleaned_up", {{"chain_pre", chains.pre}, {"tables", *removed}});
  }
  return 0;
}

}  // namespace siphon::agent::steal
