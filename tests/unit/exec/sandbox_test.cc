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

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "exec/packet.h"

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
#define START_OR_SKIP(box, spec)                                                  \
  auto box = startSandbox(spec);                                                  \
  if (!box.ok() && absl::StrContains(box.status().message(), "user namespace")) { \
    GTEST_SKIP() << box.status();                                                 \
  }                                                                               \
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

// Starts `spec` with the program's stdout into a pipe whose read end is
// *out (-1 when it did not start): the parent's fd 1 is the pipe's while
// it forks, and the program inherits it.
absl::StatusOr<Sandbox> startWithStdout(const SandboxSpec& spec, int* out) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2");
  const int saved = ::dup(1);
  ::dup2(fds[1], 1);
  auto box = startSandbox(spec);
  ::dup2(saved, 1);
  ::close(saved);
  ::close(fds[1]);
  *out = fds[0];
  if (!box.ok()) {
    ::close(fds[0]);
    *out = -1;
  }
  return box;
}

// A directory of the test's (0755: the program may run as another user),
// removed with everything in it when the test ends, failed or not.
struct TestDir {
  std::string path;
  TestDir() {
    char name[] = "/tmp/siphon-sandbox-XXXXXX";
    if (::mkdtemp(name) != nullptr) path = name;
    ::chmod(path.c_str(), 0755);
  }
  ~TestDir() {
    std::error_code ignored;
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

// startWithStdout(), or the test skipped where no namespaces are allowed.
#define START_WITH_STDOUT_OR_SKIP(box, spec, out)                                 \
  auto box = startWithStdout(spec, &out);                                         \
  if (!box.ok() && absl::StrContains(box.status().message(), "user namespace")) { \
    GTEST_SKIP() << box.status();                                                 \
  }                                                                               \
  ASSERT_TRUE(box.ok()) << box.status()

// What the program's view shows at /etc/resolv.conf and /etc/hosts is
// what siphon put there; the machine's files are untouched.
TEST(SandboxTest, FilesAreShownInTheProgramsViewOnly) {
  TestDir tmp;
  ASSERT_FALSE(tmp.path.empty());
  const std::string& dir = tmp.path;
  const std::string resolv = dir + "/resolv.conf";
  std::ofstream(resolv) << "search ns.svc.cluster.local\nnameserver 10.96.0.10\n";
  ::chmod(resolv.c_str(), 0644);
  SandboxSpec spec;
  spec.argv = {"/bin/sh", "-c", "cat /etc/resolv.conf"};
  spec.files = {{resolv, "/etc/resolv.conf"}};
  int out = -1;
  START_WITH_STDOUT_OR_SKIP(box, spec, out);
  EXPECT_EQ(readAll(out), "search ns.svc.cluster.local\nnameserver 10.96.0.10\n");
  ::close(out);
  EXPECT_EQ(waitExit(box->pid()), 0);
  std::ifstream machine("/etc/resolv.conf");
  std::string first;
  std::getline(machine, first);
  EXPECT_NE(first, "search ns.svc.cluster.local") << "the machine's own file changed";

  SandboxSpec missing;
  missing.argv = {"/bin/true"};
  missing.files = {{resolv, "/nonexistent/resolv.conf"}};
  auto failed = startSandbox(missing);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(absl::StrContains(failed.status().message(),
                                "cannot show the target's /nonexistent/resolv.conf there"))
      << failed.status();
}

// Issue 40: siphon's own descriptors (Asio's sockets are not close-on-exec:
// its connection to the agent, sockets of this machine's namespace) never
// reach the program. It holds 0, 1, 2 and what it is given (keep_fds, at
// the same number), whatever else siphon holds.
TEST(SandboxTest, TheProgramHoldsOnlyItsStreamsAndWhatItIsGiven) {
  TestDir tmp;
  ASSERT_FALSE(tmp.path.empty());
  const std::string file = tmp.path + "/given";
  std::ofstream(file) << "given\n";
  // What siphon would hold: a socket of this namespace, not close-on-exec,
  // above and below the descriptor given.
  const int low = ::socket(AF_INET, SOCK_STREAM, 0);
  const int given = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(given, 0);
  ASSERT_EQ(::dup2(given, 9), 9);  // one digit: sh's <&N
  ::close(given);
  const int high = ::dup2(low, 40);
  SandboxSpec spec;
  spec.argv = {"/bin/sh", "-c", "ls /proc/$$/fd; cat <&9"};
  spec.keep_fds = {9};
  int out = -1;
  auto box = startWithStdout(spec, &out);
  ::close(low);
  ::close(high);
  ::close(9);
  if (!box.ok() && absl::StrContains(box.status().message(), "user namespace")) {
    GTEST_SKIP() << box.status();
  }
  ASSERT_TRUE(box.ok()) << box.status();
  EXPECT_EQ(readAll(out), "0\n1\n2\n9\ngiven\n");
  ::close(out);
  EXPECT_EQ(waitExit(box->pid()), 0);

  // Only a descriptor that is open, and not a standard stream.
  SandboxSpec bad;
  bad.argv = {"/bin/true"};
  bad.keep_fds = {9};  // closed now
  EXPECT_TRUE(absl::IsInvalidArgument(startSandbox(bad).status())) << startSandbox(bad).status();
  bad.keep_fds = {1};
  EXPECT_TRUE(absl::IsInvalidArgument(startSandbox(bad).status()));
}

// Directories shown in the program's view (what --fs-remote does with the
// FUSE mount): over a directory that exists here, and at paths that do not
// exist here, which are made in its view only, next to the entries that
// were there. The machine's own tree is untouched.
TEST(SandboxTest, DirectoriesAreShownAtExistingAndMissingPathsInTheProgramsViewOnly) {
  TestDir tmp;
  ASSERT_FALSE(tmp.path.empty());
  const std::string& dir = tmp.path;
  for (const char* d : {"/remote", "/here", "/scratch", "/parent", "/parent/sub"}) {
    std::filesystem::create_directories(dir + d);
    ::chmod((dir + d).c_str(), 0755);
  }
  std::ofstream(dir + "/remote/token") << "from the target\n";
  std::ofstream(dir + "/parent/kept.txt") << "kept\n";
  std::ofstream(dir + "/here/hidden.txt") << "hidden\n";
  std::filesystem::create_symlink("kept.txt", dir + "/parent/link");
  for (const char* f : {"/remote/token", "/parent/kept.txt", "/here/hidden.txt"}) {
    ::chmod((dir + f).c_str(), 0644);
  }
  SandboxSpec spec;
  spec.argv = {"/bin/sh", "-c",
               "cat " + dir + "/here/token " + dir + "/parent/new/deep/token " + dir +
                   "/parent/kept.txt " + dir + "/parent/link " + dir + "/parent/file; ls " + dir +
                   "/parent; ls " + dir + "/here"};
  spec.mounts = {{dir + "/remote", dir + "/here", true},
                 {dir + "/remote", dir + "/parent/new/deep", true},
                 {dir + "/remote/token", dir + "/parent/file", false}};
  spec.scratch = dir + "/scratch";
  int out = -1;
  START_WITH_STDOUT_OR_SKIP(box, spec, out);
  EXPECT_EQ(readAll(out),
            "from the target\nfrom the target\nkept\nkept\nfrom the target\n"
            "file\nkept.txt\nlink\nnew\nsub\n"
            "token\n");
  ::close(out);
  EXPECT_EQ(waitExit(box->pid()), 0);
  // This machine's tree is as it was.
  EXPECT_FALSE(std::filesystem::exists(dir + "/parent/new"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/parent/file"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/here/hidden.txt"));
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/scratch/0"));

  // The root cannot be covered: a missing top-level directory is refused.
  SandboxSpec top;
  top.argv = {"/bin/true"};
  top.mounts = {{dir + "/remote", "/siphon-no-such-top-level-dir/x", true}};
  top.scratch = dir + "/scratch";
  auto refused = startSandbox(top);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "use --fs-root DIR"))
      << refused.status();
}

// Every UDP datagram to an address that is not local, IPv4 and IPv6,
// arrives whole on the TUN device; an answer written there reaches the
// program's socket.
TEST(SandboxTest, UdpDatagramsArriveOnTheTunDevice) {
  if (::access("/dev/net/tun", R_OK | W_OK) != 0) {
    GTEST_SKIP() << "/dev/net/tun is not open to this user: " << std::strerror(errno);
  }
  constexpr char kUdpProgram[] = R"(
import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
s.sendto(b"ping4", ("10.96.0.10", 53))
data, peer = s.recvfrom(100)
assert data == b"pong4" and peer == ("10.96.0.10", 53), (data, peer)
if os.path.exists("/proc/net/if_inet6"):
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.settimeout(10)
    s6.sendto(b"ping6", ("fd12::5", 5353))
    data, peer = s6.recvfrom(100)
    assert data == b"pong6" and peer[:2] == ("fd12::5", 5353), (data, peer)
sys.exit(5)
)";
  SandboxSpec spec;
  spec.argv = {"/usr/bin/python3", "-c", kUdpProgram};
  spec.udp = true;
  START_OR_SKIP(box, spec);
  ASSERT_GE(box->tun(), 0);
  auto answer = [&](const std::string& want_payload, const std::string& want_dst,
                    uint16_t want_port, const std::string& reply) {
    // Skip what else the kernel sends there (IPv6 router solicitations).
    for (int i = 0; i < 50; ++i) {
      pollfd p{box->tun(), POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 10000), 1) << "no datagram for " << want_dst;
      std::string packet(65536, '\0');
      const ssize_t n = ::read(box->tun(), packet.data(), packet.size());
      if (n <= 0) continue;
      packet.resize(static_cast<size_t>(n));
      auto udp = parseUdp(packet);
      if (!udp) continue;
      EXPECT_EQ(udp->flow.dstAddress(), want_dst);
      EXPECT_EQ(udp->flow.dst_port, want_port);
      EXPECT_EQ(udp->payload, want_payload);
      const std::string back = buildUdpReply(udp->flow, reply);
      ASSERT_EQ(::write(box->tun(), back.data(), back.size()), static_cast<ssize_t>(back.size()));
      return;
    }
    FAIL() << "no UDP datagram among 50 packets";
  };
  ASSERT_NO_FATAL_FAILURE(answer("ping4", "10.96.0.10", 53, "pong4"));
  if (::access("/proc/net/if_inet6", F_OK) == 0) {
    ASSERT_NO_FATAL_FAILURE(answer("ping6", "fd12::5", 5353, "pong6"));
  }
  EXPECT_EQ(waitExit(box->pid()), 5) << "the program's asserts held";
}

// The connector makes connections inside the program's namespace, to its
// own listeners (what incoming traffic needs), and ends with the sandbox.
TEST(SandboxTest, TheConnectorReachesTheProgramsListeners) {
  constexpr char kServer[] = R"(
import socket
l = socket.socket()
l.bind(("127.0.0.1", 18555))  # a namespace of its own: the port is free
l.listen(1)
c, _ = l.accept()
c.sendall(c.recv(100).upper())
c.close()
)";
  SandboxSpec spec;
  spec.argv = {"/usr/bin/python3", "-c", kServer};
  START_OR_SKIP(box, spec);
  ASSERT_GE(box->connector(), 0);
  // Until the program listens, its connects are refused (the error comes when done).
  int fd = -1;
  for (int i = 0; i < 200; ++i) {
    auto s = connectInside(box->connector(), "127.0.0.1", 18555);
    ASSERT_TRUE(s.ok()) << s.status();
    pollfd p{*s, POLLOUT, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(*s, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) {
      fd = *s;
      break;
    }
    EXPECT_EQ(err, ECONNREFUSED);  // not listening yet
    ::close(*s);
    ::usleep(20000);
  }
  ASSERT_GE(fd, 0) << "never connected to the program's listener";
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  ASSERT_EQ(::write(fd, "inside", 6), 6);
  EXPECT_EQ(readAll(fd), "INSIDE");
  ::close(fd);
  EXPECT_EQ(waitExit(box->pid()), 0);
  // From this namespace the same port is nobody's.
  const int outside = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(18555);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_NE(::connect(outside, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::close(outside);
  EXPECT_TRUE(absl::IsInvalidArgument(connectInside(box->connector(), "localhost", 1).status()));
  // The connector ends once siphon's end closes: its socket says so.
  const int connector = box->releaseConnector();
  ::shutdown(connector, SHUT_WR);
  char byte;
  pollfd p{connector, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1) << "the connector is still there";
  EXPECT_EQ(::recv(connector, &byte, 1, 0), 0);
  ::close(connector);
}

}  // namespace
}  // namespace siphon::exec
