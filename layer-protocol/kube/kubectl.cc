#include "kube/kubectl.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "siphon/status.h"

namespace siphon::kube {
namespace {

using Clock = std::chrono::steady_clock;

// Output of one call kept in memory: `get pods -o json` of a large
// namespace is a few MiB; more than this is not something we asked for.
constexpr size_t kMaxOutput = 64u << 20;

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// One kubectl call in flight.
struct Call {
  pid_t pid = -1;
  int pidfd = -1;
  int in = -1, out = -1, err = -1;
  std::string input;
  size_t written = 0;
  KubectlResult result;
  bool exited = false;
  absl::Status failed;
};

absl::Status startCall(const std::vector<std::string>& argv, Call& c) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return errnoStatus(errno, "pipe for kubectl");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return errnoStatus(errno, "pipe for kubectl");
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return errnoStatus(errno, "pipe for kubectl");
  }
  auto child = spawnChild(argv, in[0], out[1], err[1]);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (!child.ok()) {
    for (int fd : {in[1], out[0], err[0]}) ::close(fd);
    return child.status();
  }
  c.pid = child->pid;
  c.pidfd = child->pidfd;
  c.in = in[1];
  c.out = out[0];
  c.err = err[0];
  for (int fd : {c.in, c.out, c.err}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (c.input.empty()) closeFd(c.in);
  return absl::OkStatus();
}

void reap(Call& c) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(c.pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r == c.pid) {
    c.result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  } else {
    // Reaped by someone else (a subreaper's waitpid(-1)): the code is lost.
    c.result.exit_code = -1;
  }
  c.exited = true;
  releaseChild(c.pid);
  closeFd(c.pidfd);
}

void drain(int& fd, std::string& to, absl::Status& failed) {
  char buf[65536];
  while (fd >= 0) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      to.append(buf, static_cast<size_t>(n));
      if (to.size() > kMaxOutput && failed.ok()) {
        failed = absl::ResourceExhaustedError(
            absl::StrCat("kubectl wrote more than ", kMaxOutput >> 20, " MiB"));
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    closeFd(fd);
  }
}

// Runs every call to its end (or the deadline, when it is killed).
void runCalls(std::vector<Call>& calls, Clock::time_point deadline,
              std::chrono::milliseconds timeout) {
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Call*, int*>> owners;
    bool pending = false;
    for (auto& c : calls) {
      if (!c.failed.ok() && c.pid < 0) continue;
      if (c.in >= 0) {
        fds.push_back({c.in, POLLOUT, 0});
        owners.push_back({&c, &c.in});
      }
      for (int* fd : {&c.out, &c.err}) {
        if (*fd < 0) continue;
        fds.push_back({*fd, POLLIN, 0});
        owners.push_back({&c, fd});
      }
      if (c.pid >= 0 && !c.exited) pending = true;
    }
    if (fds.empty()) {
      for (auto& c : calls) {
        if (c.pid >= 0 && !c.exited) reap(c);
      }
      return;
    }
    (void)pending;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      for (auto& c : calls) {
        if (c.pid < 0 || c.exited) continue;
        ::kill(c.pid, SIGKILL);
        closeFd(c.in);
        closeFd(c.out);
        closeFd(c.err);
        reap(c);
        c.failed = absl::DeadlineExceededError(
            absl::StrCat("kubectl did not finish within ", timeout.count() / 1000, " s"));
      }
      return;
    }
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno == EINTR) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [c, fd] = owners[i];
      if (fd == &c->in) {
        if (fds[i].revents & (POLLERR | POLLHUP)) {
          closeFd(c->in);
          continue;
        }
        ssize_t w = ::write(c->in, c->input.data() + c->written, c->input.size() - c->written);
        if (w > 0) c->written += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || c->written == c->input.size()) {
          closeFd(c->in);
        }
      } else {
        drain(*fd, fd == &c->out ? c->result.out : c->result.err, c->failed);
      }
    }
  }
}

}  // namespace

std::vector<absl::StatusOr<KubectlResult>> Kubectl::runAll(
    const std::vector<std::vector<std::string>>& calls) {
  std::vector<absl::StatusOr<KubectlResult>> results;
  for (const auto& args : calls) results.push_back(run(args));
  return results;
}

std::vector<std::string> SystemKubectl::argv(const std::vector<std::string>& args) const {
  std::vector<std::string> v{options_.binary};
  if (!options_.kubeconfig.empty()) v.push_back("--kubeconfig=" + options_.kubeconfig);
  if (!options_.context.empty()) v.push_back("--context=" + options_.context);
  v.insert(v.end(), args.begin(), args.end());
  return v;
}

absl::StatusOr<KubectlResult> SystemKubectl::run(const std::vector<std::string>& args,
                                                 std::string_view input) {
  std::vector<Call> calls(1);
  calls[0].input = std::string(input);
  RETURN_IF_ERROR(startCall(argv(args), calls[0]));
  runCalls(calls, Clock::now() + options_.timeout, options_.timeout);
  if (!calls[0].failed.ok()) return calls[0].failed;
  return std::move(calls[0].result);
}

std::vector<absl::StatusOr<KubectlResult>> SystemKubectl::runAll(
    const std::vector<std::vector<std::string>>& list) {
  std::vector<Call> calls(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    absl::Status s = startCall(argv(list[i]), calls[i]);
    if (!s.ok()) calls[i].failed = s;
  }
  runCalls(calls, Clock::now() + options_.timeout, options_.timeout);
  std::vector<absl::StatusOr<KubectlResult>> results;
  for (auto& c : calls) {
    if (!c.failed.ok()) {
      results.push_back(c.failed);
    } else {
      results.push_back(std::move(c.result));
    }
  }
  return results;
}

namespace {

std::mutex g_owned_mu;
std::set<pid_t>& ownedChildren() {
  static std::set<pid_t> owned;
  return owned;
}

}  // namespace

bool ownedChild(pid_t pid) {
  std::lock_guard<std::mutex> l(g_owned_mu);
  return ownedChildren().contains(pid);
}

void releaseChild(pid_t pid) {
  std::lock_guard<std::mutex> l(g_owned_mu);
  ownedChildren().erase(pid);
}

absl::StatusOr<SpawnedChild> spawnChild(const std::vector<std::string>& argv, int stdin_fd,
                                        int stdout_fd, int stderr_fd) {
  // The exec's failure comes back through this pipe (closed on exec).
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return errnoStatus(errno, "pipe for kubectl");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = ::getpid();
  // Registered before it can end: a subreaper's reap between the fork and
  // the registration would take it.
  std::unique_lock<std::mutex> owned_lock(g_owned_mu);
  const pid_t pid = ::fork();
  if (pid > 0) ownedChildren().insert(pid);
  owned_lock.unlock();
  if (pid < 0) {
    int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    return errnoStatus(e, "fork for kubectl");
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // Siphon died before the prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) ::signal(sig, SIG_DFL);
    int in = stdin_fd >= 0 ? stdin_fd : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || ::dup2(in, 0) < 0 || ::dup2(stdout_fd, 1) < 0 || ::dup2(stderr_fd, 2) < 0) {
      int e = errno;
      (void)!::write(report[1], &e, sizeof(e));
      ::_exit(127);
    }
    // Every other descriptor (the agent session's socket, the FUSE device,
    // the exec'd program's pipes) stays with Siphon; only the report pipe
    // passes, and exec closes it.
    const int keep = report[1];
    if (keep > 3) ::syscall(SYS_close_range, 3u, static_cast<unsigned>(keep - 1), 0u);
    ::syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0u, 0u);
    ::execvp(cargv[0], cargv.data());
    int e = errno;
    (void)!::write(report[1], &e, sizeof(e));
    ::_exit(127);
  }
  ::close(report[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == sizeof(child_errno)) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    releaseChild(pid);
    return absl::NotFoundError(kubectlMissing(argv[0], child_errno));
  }
  SpawnedChild c;
  c.pid = pid;
  c.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (c.pidfd >= 0) ::fcntl(c.pidfd, F_SETFD, FD_CLOEXEC);
  return c;
}

std::string kubectlMissing(const std::string& binary, int err) {
  if (err == ENOENT) {
    if (binary.find('/') == std::string::npos) {
      return absl::StrCat("cannot run kubectl: '", binary,
                          "' is not on PATH; install kubectl or give --kubectl PATH");
    }
    return absl::StrCat("cannot run kubectl: ", binary, " does not exist (--kubectl)");
  }
  return absl::StrCat("cannot run kubectl ", binary, ": ", std::strerror(err));
}

std::string kubeError(const KubectlResult& r) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(r.err, '\n')) {
    absl::string_view t = absl::StripAsciiWhitespace(l);
    if (!t.empty()) lines.emplace_back(t);
  }
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (absl::StartsWith(*it, "error: ") || absl::StartsWith(*it, "Error from server") ||
        absl::StartsWith(*it, "Error: ")) {
      return *it;
    }
  }
  if (!lines.empty()) return lines.back();
  return absl::StrCat("kubectl exited with ", r.exit_code, " and said nothing");
}

KubeFailure classify(const KubectlResult& r) {
  if (r.ok()) return KubeFailure::kNone;
  const std::string& e = r.err;
  if (absl::StrContains(e, "(NotFound)") || absl::StrContains(e, " not found")) {
    return KubeFailure::kNotFound;
  }
  if (absl::StrContains(e, "(Forbidden)") || absl::StrContains(e, " is forbidden")) {
    return KubeFailure::kForbidden;
  }
  if (absl::StrContains(e, "(Unauthorized)") || absl::StrContains(e, "You must be logged in")) {
    return KubeFailure::kUnauthorized;
  }
  if (absl::StrContains(e, "(Invalid)") || absl::StrContains(e, " is invalid")) {
    return KubeFailure::kInvalid;
  }
  if (absl::StrContains(e, "(AlreadyExists)") || absl::StrContains(e, "(Conflict)")) {
    return KubeFailure::kConflict;
  }
  return KubeFailure::kOther;
}

}  // namespace siphon::kube
