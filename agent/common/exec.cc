#include "agent/common/exec.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/capabilities.h"
#include "agent/common/unique_fd.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

using Clock = std::chrono::steady_clock;

// What the child reports through the error pipe when it cannot exec.
struct ChildFailure {
  int stage;  // 1: setns, 2: exec
  int err;
};

// Only async-signal-safe calls: the parent may have other threads, one of
// which could have held the malloc lock at fork().
[[noreturn]] void childFail(int fd, int stage) {
  ChildFailure f{stage, errno};
  ssize_t ignored = write(fd, &f, sizeof f);
  (void)ignored;
  _exit(127);
}

int waitChild(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

absl::StatusOr<ExecResult> execCapture(const std::vector<std::string>& argv, std::string_view input,
                                       const ExecOptions& options) {
  if (argv.empty() || argv[0].empty() || argv[0][0] != '/') {
    return absl::InvalidArgumentError("execCapture: argv[0] must be an absolute path");
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // iptables-legacy's lock file (XTABLES_LOCKFILE, default
  // /run/xtables.lock) is passed on: every iptables run of the agent (its
  // steering, the guard, the start-up sweep) must take the same one. In the
  // pod the manifest puts it in the container's /dev, the one place a
  // read-only root leaves writable (IptablesSteering's restoreArgs()).
  std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"};
  if (const char* lock = std::getenv("XTABLES_LOCKFILE"); lock != nullptr && *lock != '\0') {
    env.push_back(absl::StrCat("XTABLES_LOCKFILE=", lock));
  }
  std::vector<char*> envv;
  for (auto& e : env) envv.push_back(e.data());
  envv.push_back(nullptr);
  char* const* envp = envv.data();

  // stdin is a socket, not a pipe: send(MSG_NOSIGNAL) to a program that
  // exits without reading gets EPIPE instead of a SIGPIPE that would kill
  // the agent.
  int in_sv[2], out_p[2], err_p[2], fail_p[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_sv) != 0) {
    return lastErrnoStatus("execCapture: socketpair");
  }
  UniqueFd in_w(in_sv[0]), in_r(in_sv[1]);
  if (pipe2(out_p, O_CLOEXEC) != 0) return lastErrnoStatus("execCapture: pipe");
  UniqueFd out_r(out_p[0]), out_w(out_p[1]);
  if (pipe2(err_p, O_CLOEXEC) != 0) return lastErrnoStatus("execCapture: pipe");
  UniqueFd err_r(err_p[0]), err_w(err_p[1]);
  if (pipe2(fail_p, O_CLOEXEC) != 0) return lastErrnoStatus("execCapture: pipe");
  UniqueFd fail_r(fail_p[0]), fail_w(fail_p[1]);
  const int netns_fd = options.netns_fd;
  const bool raise_caps = options.iptables_capabilities;

  pid_t pid = fork();
  if (pid < 0) return lastErrnoStatus("execCapture: fork");
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) childFail(fail_w.get(), 1);
    // The agent runs with SECBIT_NOROOT: exec'ing root-owned iptables gives
    // it only the ambient set (agent/common/capabilities.h).
    if (raise_caps) {
      caps::raiseAmbient(caps::kIptablesAmbient);
    } else {
      prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    }
    // dup2 clears FD_CLOEXEC on 0-2; every other descriptor of the agent
    // (listeners included) must not reach the program.
    dup2(in_r.get(), 0);
    dup2(out_w.get(), 1);
    dup2(err_w.get(), 2);
    int keep = fail_w.get();
    if (keep > 3) {
      close_range(3, static_cast<unsigned>(keep) - 1, 0);
    }
    close_range(static_cast<unsigned>(keep) + 1, ~0U, 0);
    execve(args[0], args.data(), envp);
    childFail(keep, 2);
  }
  in_r.reset();
  out_w.reset();
  err_w.reset();
  fail_w.reset();

  ExecResult result;
  fcntl(in_w.get(), F_SETFL, O_NONBLOCK);
  size_t sent = 0;
  if (input.empty()) in_w.reset();
  const auto deadline = Clock::now() + options.timeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    pollfd fds[3] = {{out_open ? out_r.get() : -1, POLLIN, 0},
                     {err_open ? err_r.get() : -1, POLLIN, 0},
                     {in_w.valid() ? in_w.get() : -1, POLLOUT, 0}};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      kill(pid, SIGKILL);
      waitChild(pid);
      return absl::DeadlineExceededError(
          absl::StrCat(argv[0], ": still running after ", options.timeout.count(), " ms"));
    }
    int n = poll(fds, 3, static_cast<int>(left.count()));
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = lastErrnoStatus("execCapture: poll");
      kill(pid, SIGKILL);
      waitChild(pid);
      return s;
    }
    if (fds[2].revents != 0) {
      ssize_t w = send(in_w.get(), input.data() + sent, input.size() - sent, MSG_NOSIGNAL);
      if (w > 0) sent += static_cast<size_t>(w);
      // A program that stopped reading (EPIPE) gets the rest dropped; its
      // exit code tells what happened.
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == input.size()) in_w.reset();
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        (i == 0 ? out_open : err_open) = false;
      }
    }
  }
  in_w.reset();
  result.exit_code = waitChild(pid);
  ChildFailure failure{};
  if (read(fail_r.get(), &failure, sizeof failure) == static_cast<ssize_t>(sizeof failure)) {
    return errnoStatus(failure.err, failure.stage == 1 ? std::string("setns into the target netns")
                                                       : absl::StrCat("exec ", argv[0]));
  }
  return result;
}

absl::StatusOr<std::string> execChecked(const std::vector<std::string>& argv,
                                        std::string_view input, const ExecOptions& options) {
  ASSIGN_OR_RETURN(ExecResult r, execCapture(argv, input, options));
  if (r.exit_code != 0) {
    std::string err = r.err;
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    std::string_view name = argv[0];
    name = name.substr(name.rfind('/') + 1);
    return absl::InternalError(absl::StrCat(asv(name), ": exit ", r.exit_code, ": ", err));
  }
  return std::move(r.out);
}

std::string findTool(std::string_view name) {
  // iptables lives in sbin, which an agent's PATH (a container image's)
  // does not always hold; look there first, then PATH.
  std::vector<std::string> dirs = {"/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/bin"};
  if (const char* path = std::getenv("PATH")) {
    std::string_view rest = path;
    while (!rest.empty()) {
      size_t colon = rest.find(':');
      std::string_view dir = rest.substr(0, colon);
      if (!dir.empty() && dir[0] == '/') dirs.emplace_back(dir);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  for (const auto& dir : dirs) {
    std::string candidate = absl::StrCat(dir, "/", asv(name));
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace siphon::agent
