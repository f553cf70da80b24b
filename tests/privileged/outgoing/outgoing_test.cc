// Outgoing connections end to end, as root: a "pod" network namespace whose
// echo services (TCP, UDP, unix) exist only inside it, a pod process there
// as the target, the real siphon-agent targeting it by PID, and the real
// siphon CLI (`connect`, `forward`).
//
// The echo services are sockets the test creates inside the namespace (a
// thread setns()es, makes the socket, and leaves); the port of the TCP
// service is held on the host too, bound but not listening, so the same
// address from the host namespace is refused for sure.
//
// Every kernel object has a unique name and an RAII owner, so a failed
// assertion still kills the processes and deletes the namespace. Without
// root every test skips with the reason.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <latch>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/echo_server.h"
#include "tests/privileged/harness/pod_harness.h"

extern char** environ;

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using namespace siphon::harness;  // NOLINT: test file
using fakes::EchoServer;

constexpr const char* kSkipReason =
    "needs root: creates a network namespace with services inside and runs siphon-agent, "
    "which enters another process's network namespace";

std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

uint16_t portOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

bool bindTo(int fd, uint16_t port) {
  sockaddr_in a = loopback(port);
  return ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

int unixSocketAt(const std::string& path_or_at, int type, const std::string& netns = "") {
  int fd = netns.empty() ? ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0)
                         : socketInNetns(netns, AF_UNIX, type);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  socklen_t len = sizeof(a);
  if (path_or_at[0] == '@') {
    std::memcpy(a.sun_path + 1, path_or_at.data() + 1, path_or_at.size() - 1);
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_or_at.size());
  } else {
    std::strncpy(a.sun_path, path_or_at.c_str(), sizeof(a.sun_path) - 1);
  }
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0)
      << path_or_at << ": " << std::strerror(errno);
  EXPECT_EQ(::listen(fd, 64), 0);
  return fd;
}

class OutgoingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    netns_.emplace();
    ASSERT_TRUE(netns_->created());

    // TCP echo on 127.0.0.1:P inside the pod; P held on the host, bound but
    // not listening.
    host_guard_ = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(bindTo(host_guard_.get(), 0));
    tcp_port_ = portOf(host_guard_.get());
    int tcp = socketInNetns(netns_->name(), AF_INET, SOCK_STREAM);
    ASSERT_GE(tcp, 0);
    ASSERT_TRUE(bindTo(tcp, tcp_port_)) << std::strerror(errno);
    ASSERT_EQ(::listen(tcp, 128), 0);
    tcp_echo_.emplace(tcp, EchoServer::Kind::kStream);

    int udp = socketInNetns(netns_->name(), AF_INET, SOCK_DGRAM);
    ASSERT_GE(udp, 0);
    ASSERT_TRUE(bindTo(udp, 0));
    udp_echo_.emplace(udp, EchoServer::Kind::kDatagram);

    // A port with nothing listening inside the pod (bound, not listening).
    closed_ = Fd(socketInNetns(netns_->name(), AF_INET, SOCK_STREAM));
    ASSERT_TRUE(bindTo(closed_.get(), 0));
    closed_port_ = portOf(closed_.get());

    ASSERT_NO_FATAL_FAILURE(
        startPod({"ip", "netns", "exec", netns_->name(), "sleep", "600"}, "sleep\n"));
    ASSERT_NO_FATAL_FAILURE(startAgent());
  }

  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  void startPod(const std::vector<std::string>& argv, const std::string& comm) {
    pod_ = spawn(argv, std::nullopt, -1, -1);
    ASSERT_GT(pod_.pid(), 0);
    // `ip netns exec` enters the namespace, then execs the command (same
    // PID): wait until the PID runs it inside the namespace.
    const std::string comm_path = "/proc/" + std::to_string(pod_.pid()) + "/comm";
    bool exited = false;
    const bool ran = fakes::eventually(
        [&] {
          if (readFile(comm_path) == comm && netnsInodeOf(pod_.pid()) == netns_->inode())
            return true;
          exited = pod_.waitUntil(Clock::now()).has_value();
          return exited;
        },
        kProcessDeadline);
    if (exited) FAIL() << "the pod process exited";
    if (!ran) {
      FAIL() << "pod process " << pod_.pid() << " never ran " << comm << " in " << netns_->name();
    }
  }

  void startAgent() {
    agent_.emplace(std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                            "--first-client-timeout", "60s", "--log-level", "debug",
                                            "targeted", "--pid", std::to_string(pod_.pid())},
                   cleanEnv(), dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  std::vector<std::string> cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Runs the CLI with `input` on stdin (then EOF) to completion.
  Result cliWithInput(const std::vector<std::string>& args, const std::string& input) {
    Proc p(cli(args), cleanEnv());
    std::thread writer([&] {
      p.write(input);
      p.closeStdin();
    });
    int rc = p.finish();
    writer.join();
    return Result{rc, p.out, p.err};
  }

  // Destroyed in reverse: agent, pod, services, namespace, directory.
  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> netns_;
  Fd host_guard_;
  uint16_t tcp_port_ = 0;
  std::optional<EchoServer> tcp_echo_;
  std::optional<EchoServer> udp_echo_;
  Fd closed_;
  uint16_t closed_port_ = 0;
  Child pod_;
  std::optional<Agent> agent_;
  std::string endpoint_;
};

TEST_F(OutgoingTest, ConnectEchoesAMebibyteFromInsideThePod) {
  const std::string data = randomBytes(1 << 20, 1);
  Result r = cliWithInput({"connect", "127.0.0.1:" + std::to_string(tcp_port_)}, data);
  EXPECT_EQ(r.exit_code, 0) << "stderr: " << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out.size(), data.size());
  EXPECT_TRUE(r.out == data) << "the echo differs from what was sent";
  EXPECT_EQ(tcp_echo_->connections(), 1);
}

TEST_F(OutgoingTest, TheSameAddressFromTheHostIsRefused) {
  // Proves the CLI's connection came from inside the pod: on the host the
  // port is bound but nobody listens.
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a = loopback(tcp_port_);
  EXPECT_NE(::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(errno, ECONNREFUSED);
  Result r = cliWithInput({"connect", "127.0.0.1:" + std::to_string(tcp_port_)}, "hello\n");
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "hello\n");
}

TEST_F(OutgoingTest, AClosedPortIsAOneLineErrorAndExitOne) {
  Result r = cliWithInput({"connect", "127.0.0.1:" + std::to_string(closed_port_)}, "x");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "siphon: connect 127.0.0.1:" + std::to_string(closed_port_) +
                       " from the target: Connection refused\n");
}

TEST_F(OutgoingTest, ConnectUdpEchoesEachDatagram) {
  Proc p(cli({"connect", "--udp", "--wait", "200ms",
              "127.0.0.1:" + std::to_string(udp_echo_->port())}),
         cleanEnv());
  // One datagram at a time: each echo is read before the next is sent, so
  // stdin reads and datagrams line up.
  std::string expected;
  const std::vector<std::string> datagrams = {"first datagram\n", "second\n",
                                              std::string(1200, 'z') + "\n"};
  for (const std::string& d : datagrams) {
    ASSERT_TRUE(p.write(d));
    expected += d;
    ASSERT_TRUE(p.readUntil([&](const std::string& out, const std::string&) {
      return out.size() >= expected.size();
    })) << "no echo for datagram; stderr: "
        << p.err;
  }
  EXPECT_EQ(p.out, expected);
  // stdin's end: the CLI waits --wait for late replies, then exits 0.
  p.closeStdin();
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_EQ(p.err, "");
}

TEST_F(OutgoingTest, ForwardServesManyConnectionsAtOnce) {
  Proc fwd(cli({"forward", "-L", "0:127.0.0.1:" + std::to_string(tcp_port_)}), cleanEnv());
  ASSERT_TRUE(fwd.readUntil([](const std::string&, const std::string& err) {
    return err.find('\n') != std::string::npos;
  })) << "no forwarding line; stderr: "
      << fwd.err;
  const std::string line = fwd.err.substr(0, fwd.err.find('\n'));
  EXPECT_THAT(line, MatchesRegex("forwarding 127\\.0\\.0\\.1:[0-9]+ -> 127\\.0\\.0\\.1:" +
                                 std::to_string(tcp_port_) + " \\(from the target\\)"));
  const uint16_t lport =
      static_cast<uint16_t>(std::stoul(line.substr(std::strlen("forwarding 127.0.0.1:"))));
  ASSERT_NE(lport, 0);

  constexpr int kConnections = 24;
  std::latch all_connected(kConnections);
  std::atomic<int> ok{0};
  std::vector<std::string> failures(kConnections);
  std::vector<std::thread> clients;
  for (int i = 0; i < kConnections; ++i) {
    clients.emplace_back([&, i] {
      Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      timeval guard{30, 0};  // only turns a hang into a failure
      ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof(guard));
      ::setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &guard, sizeof(guard));
      sockaddr_in a = loopback(lport);
      bool connected = ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      all_connected.count_down();
      if (!connected) {
        failures[i] = std::string("connect: ") + std::strerror(errno);
        return;
      }
      // Every connection is open before any sends: they all run at once.
      all_connected.wait();
      const std::string data =
          randomBytes(200000 + static_cast<size_t>(i) * 1000, static_cast<unsigned>(100 + i));
      std::string got;
      std::thread reader([&] {
        char buf[65536];
        while (true) {
          ssize_t n = ::recv(s.get(), buf, sizeof(buf), 0);
          if (n <= 0) break;
          got.append(buf, static_cast<size_t>(n));
        }
      });
      size_t off = 0;
      while (off < data.size()) {
        ssize_t n = ::send(s.get(), data.data() + off, data.size() - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ::shutdown(s.get(), SHUT_WR);
      reader.join();
      if (got == data) {
        ++ok;
      } else {
        failures[i] = "echo differs: sent " + std::to_string(data.size()) + ", got " +
                      std::to_string(got.size());
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), kConnections);
  for (int i = 0; i < kConnections; ++i) {
    EXPECT_EQ(failures[i], "") << "connection " << i;
  }
  // Every one of them reached the service inside the pod.
  EXPECT_EQ(tcp_echo_->connections(), kConnections);

  fwd.signal(SIGTERM);
  EXPECT_EQ(fwd.finish(), 0) << fwd.err;
}

TEST_F(OutgoingTest, ForwardToAClosedPortResetsThatConnectionOnly) {
  Proc fwd(cli({"forward", "-L", "0:127.0.0.1:" + std::to_string(closed_port_), "-L",
                "127.0.0.1:0:127.0.0.1:" + std::to_string(tcp_port_)}),
           cleanEnv());
  ASSERT_TRUE(fwd.readUntil([](const std::string&, const std::string& err) {
    return std::count(err.begin(), err.end(), '\n') >= 2;
  })) << fwd.err;
  auto portOfLine = [&](int n) {
    size_t at = 0;
    for (int i = 0; i < n; ++i) at = fwd.err.find('\n', at) + 1;
    return static_cast<uint16_t>(
        std::stoul(fwd.err.substr(at + std::strlen("forwarding 127.0.0.1:"))));
  };
  const uint16_t refused = portOfLine(0), good = portOfLine(1);

  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval guard{30, 0};
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof(guard));
  sockaddr_in a = loopback(refused);
  ASSERT_EQ(::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  char c;
  EXPECT_LT(::recv(s.get(), &c, 1, 0), 0) << "the local connection is aborted";
  EXPECT_EQ(errno, ECONNRESET);
  ASSERT_TRUE(fwd.readUntil([](const std::string&, const std::string& err) {
    return err.find("Connection refused") != std::string::npos;
  }));
  EXPECT_THAT(fwd.err, HasSubstr("siphon: connect 127.0.0.1:" + std::to_string(closed_port_) +
                                 " from the target: Connection refused\n"));

  // The other forward still works.
  Fd t(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ::setsockopt(t.get(), SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof(guard));
  sockaddr_in b = loopback(good);
  ASSERT_EQ(::connect(t.get(), reinterpret_cast<sockaddr*>(&b), sizeof(b)), 0);
  ASSERT_EQ(::send(t.get(), "still fine", 10, 0), 10);
  ::shutdown(t.get(), SHUT_WR);
  std::string got;
  char buf[64];
  ssize_t n;
  while ((n = ::recv(t.get(), buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(got, "still fine");

  fwd.signal(SIGINT);
  EXPECT_EQ(fwd.finish(), 0) << fwd.err;
}

TEST_F(OutgoingTest, BadForwardSpecIsAUsageError) {
  Result r = run(cli({"forward", "-L", "127.0.0.1:80"}), cleanEnv());
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("[BIND:]LPORT:HOST:PORT"));
  Result both = run(cli({"connect", "--udp", "--unix", "/x"}), cleanEnv());
  EXPECT_EQ(both.exit_code, 2) << both;
}

// A pod whose root is a chroot: unix socket paths resolve inside it.
class OutgoingUnixTest : public OutgoingTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    if (!std::filesystem::exists("/usr/bin/busybox") && !std::filesystem::exists("/bin/busybox")) {
      GTEST_SKIP() << "needs a static busybox (package busybox-static) to run a chrooted pod";
    }
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    netns_.emplace();
    ASSERT_TRUE(netns_->created());

    root_ = dir_->path() + "/root";
    std::filesystem::create_directories(root_ + "/bin");
    std::filesystem::create_directories(root_ + "/run");
    std::filesystem::create_directories(root_ + "/var");
    const std::string busybox =
        std::filesystem::exists("/usr/bin/busybox") ? "/usr/bin/busybox" : "/bin/busybox";
    std::filesystem::copy_file(busybox, root_ + "/bin/busybox");
    // An absolute symlink, as containers have them: it means the pod's /run.
    std::filesystem::create_symlink("/run", root_ + "/var/run");

    stream_echo_.emplace(unixSocketAt(root_ + "/run/echo.sock", SOCK_STREAM),
                         EchoServer::Kind::kStream);
    seq_echo_.emplace(unixSocketAt(root_ + "/run/seq.sock", SOCK_SEQPACKET),
                      EchoServer::Kind::kStream);
    abstract_ = "@siphon-test-" + randomHex(8);
    abstract_echo_.emplace(unixSocketAt(abstract_, SOCK_STREAM, netns_->name()),
                           EchoServer::Kind::kStream);
    host_abstract_ = "@siphon-test-host-" + randomHex(8);
    host_abstract_echo_.emplace(unixSocketAt(host_abstract_, SOCK_STREAM),
                                EchoServer::Kind::kStream);

    ASSERT_NO_FATAL_FAILURE(startPod(
        {"ip", "netns", "exec", netns_->name(), "chroot", root_, "/bin/busybox", "sleep", "600"},
        "busybox\n"));
    ASSERT_NO_FATAL_FAILURE(startAgent());
  }

  std::string root_;
  std::string abstract_, host_abstract_;
  std::optional<EchoServer> stream_echo_, seq_echo_, abstract_echo_, host_abstract_echo_;
};

TEST_F(OutgoingUnixTest, PathsResolveInsideThePodRoot) {
  Result r = cliWithInput({"connect", "--unix", "/run/echo.sock"}, "by path\n");
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "by path\n");
  // Through the pod's own absolute symlink /var/run -> /run.
  Result link = cliWithInput({"connect", "--unix", "/var/run/echo.sock"}, "by symlink\n");
  EXPECT_EQ(link.exit_code, 0) << link;
  EXPECT_EQ(link.out, "by symlink\n");
  EXPECT_EQ(stream_echo_->connections(), 2);
}

TEST_F(OutgoingUnixTest, TheHostPathIsNotReached) {
  // The socket's path on the host means nothing inside the pod's root.
  const std::string host_path = root_ + "/run/echo.sock";
  Result r = cliWithInput({"connect", "--unix", host_path}, "x");
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(r.err,
            "siphon: connect unix " + host_path + " from the target: No such file or directory\n");
  EXPECT_EQ(stream_echo_->connections(), 0);
}

TEST_F(OutgoingUnixTest, SeqpacketKeepsRecords) {
  Proc p(cli({"connect", "--unix", "/run/seq.sock", "--seqpacket"}), cleanEnv());
  std::string expected;
  const std::vector<std::string> records = {"record one", "record two, longer"};
  for (const std::string& rec : records) {
    ASSERT_TRUE(p.write(rec));
    expected += rec;
    ASSERT_TRUE(p.readUntil([&](const std::string& out, const std::string&) {
      return out.size() >= expected.size();
    })) << p.err;
  }
  p.closeStdin();
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_EQ(p.out, expected);
}

TEST_F(OutgoingUnixTest, AbstractNamesAreThoseOfThePodNetns) {
  Result r = cliWithInput({"connect", "--unix", abstract_}, "abstract\n");
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "abstract\n");
  // A name bound in the host's namespace does not exist in the pod's.
  Result host = cliWithInput({"connect", "--unix", host_abstract_}, "x");
  EXPECT_EQ(host.exit_code, 1) << host;
  EXPECT_THAT(host.err, HasSubstr("Connection refused"));
  EXPECT_EQ(host_abstract_echo_->connections(), 0);
}

}  // namespace
}  // namespace siphon
