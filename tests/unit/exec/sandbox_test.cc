// The program's namespaces (layer-protocol/exec/sandbox.h) with a real
// program: every TCP connection it makes, to a pod-like address, an IPv6
// one and loopback, arrives at the sandbox's listeners with where it was
// going; it sees its own hostname and the caller's uid; its exit status
// comes back; a program that cannot run is an error with nothing left.
// Runs as root and (the second ctest entry) as nobody, where unprivileged
// user namespaces are allowed; skipped with the reason where they are not.
// No traffic leaves the machine: the program's routes all go into its own
// loopback.
#include "exec/sandbox.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace siphon::exec {
namespace {

// Accepts one connection on `listener` within 10 s; -1 if none came.
int acceptOne(int listener) {
  pollfd p{listener, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) return -1;
  return ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
}

std::string readAll(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// The next connection on `listener` was going to `want` and carries
// `payload`.
void expectConnection(int listener, const Destination& want, const std::string& payload) {
  const int fd = acceptOne(listener);
  ASSERT_GE(fd, 0) << "no connection from the program to " << want.address;
  auto d = originalDestination(fd);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->address, want.address);
  EXPECT_EQ(d->port, want.port);
  EXPECT_EQ(d->loopback, want.loopback);
  EXPECT_EQ(readAll(fd), payload);
  ::close(fd);
}

int waitExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Starts `spec`, or skips the test when this machine allows no namespaces
// for this user.
#define START_OR_SKIP(box, spec)                                                   \
  auto box = startSandbox(spec);                                                   \
  if (!box.ok() && absl::StrContains(box.status().message(), "user namespace")) { \
    GTEST_SKIP() << box.status();                                                  \
  }                                                                                \
  ASSERT_TRUE(box.ok()) << box.status()

constexpr char kProgram[] = R"(
import os, socket, sys
def send(family, addr, what):
    s = socket.socket(family)
    s.connect(addr)
    s.sendall(what.encode())
    s.close()
send(socket.AF_INET, ("10.96.0.10", 80), socket.gethostname() + " " + str(os.getuid()))
if socket.has_ipv6 and os.path.exists("/proc/net/if_inet6"):
    send(socket.AF_INET6, ("fd12::5", 443), "six")
send(socket.AF_INET, ("127.0.0.1", 5432), "loopback")
sys.exit(3)
)";

TEST(SandboxTest, EveryConnectionArrivesWithWhereItWasGoing) {
  SandboxSpec spec;
  spec.argv = {"/usr/bin/python3", "-c", kProgram};
  spec.env = {"PATH=/usr/bin:/bin"};
  spec.hostname = "pod-7";
  START_OR_SKIP(box, spec);

  // Its hostname and the caller's uid come with the first.
  ASSERT_NO_FATAL_FAILURE(expectConnection(box->tcp4(), {"10.96.0.10", 80, false},
                                           absl::StrCat("pod-7 ", ::geteuid())));
  if (box->tcp6() >= 0) {
    ASSERT_NO_FATAL_FAILURE(expectConnection(box->tcp6(), {"fd12::5", 443, false}, "six"));
  }
  // Loopback is steered too: the caller chooses where it goes.
  ASSERT_NO_FATAL_FAILURE(expectConnection(box->tcp4(), {"127.0.0.1", 5432, true}, "loopback"));

  EXPECT_EQ(waitExit(box->pid()), 3);
  EXPECT_EQ(::getpgid(box->pid()), -1) << "gone with its process group";
}

TEST(SandboxTest, AProgramThatCannotRunIsAnErrorAndNothingIsLeft) {
  SandboxSpec spec;
  spec.argv = {"/nonexistent/program"};
  auto box = startSandbox(spec);
  if (!box.ok() && absl::StrContains(box.status().message(), "user namespace")) {
    GTEST_SKIP() << box.status();
  }
  ASSERT_FALSE(box.ok());
  EXPECT_TRUE(absl::IsNotFound(box.status())) << box.status();
  EXPECT_NE(box.status().message().find("/nonexistent/program"), std::string::npos);
  int status;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1) << "the set-up process was reaped";
  EXPECT_EQ(errno, ECHILD);
  SandboxSpec empty;
  EXPECT_TRUE(absl::IsInvalidArgument(startSandbox(empty).status()));
}

// A command the set-up needs that is not installed is named, and nothing
// is left (the process that would have run the program is reaped).
TEST(SandboxTest, AMissingCommandIsNamed) {
  const std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  ::setenv("PATH", "/nonexistent", 1);
  SandboxSpec spec;
  spec.argv = {"/bin/true"};
  auto box = startSandbox(spec);
  ::setenv("PATH", path.c_str(), 1);
  if (!box.ok() && absl::StrContains(box.status().message(), "user namespace")) {
    GTEST_SKIP() << box.status();
  }
  ASSERT_FALSE(box.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(box.status())) << box.status();
  EXPECT_TRUE(absl::StrContains(box.status().message(), "`ip link set lo up` failed"))
      << box.status();
  EXPECT_TRUE(absl::StrContains(box.status().message(), "ip: not found (is it installed?)"))
      << box.status();
  int status;
  EXPECT_EQ(::waitpid(-1, &status, WNOHANG), -1);
}

}  // namespace
}  // namespace siphon::exec
