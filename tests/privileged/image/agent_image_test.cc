// End to end, as root: the siphon-agent image (scripts/build-image.sh)
// imported into a real containerd and run as a container the way the
// Kubernetes manifests run it, attaching to another container by its ID.
//
// The test starts its own containerd (root, state and sockets in a temporary
// directory, no CRI plugin), imports the busybox image of
// scripts/build-test-image.sh and runs a target container serving HTTP on
// port 8080 (busybox httpd, serving its root, so /only-in-container.txt is
// a page). Then, per test, an agent container from the agent image:
//   - the test's PID namespace (--with-ns pid:/proc/<test>/ns/pid), as
//     hostPID: true gives the Job the node's;
//   - containerd's socket bind-mounted read-only at
//     /run/containerd/containerd.sock, the token directory read-only at
//     /var/run/siphon, a read-only root filesystem;
//   - exactly the capabilities of images/capabilities.txt (every other one
//     dropped), no --privileged, containerd's default seccomp profile;
//   - the host network, so the agent listens on 127.0.0.1 where the CLI
//     reaches it (the Job listens on its pod IP behind a port-forward).
// Through the real siphon CLI it reads a file that exists only in the target
// container and steals the target's port 8080 (sk_lookup, and the iptables
// backend in both flavours, which exercises the image's iptables): a
// connection made inside the target's network namespace is answered by the
// test's server; once the steal ends the application answers again.
//
// Cleanup runs in every path, each step best effort: tasks killed and
// deleted, containers, snapshots and images removed, containerd stopped,
// leftover shims and container processes (found by the test's unique cgroup
// tag) killed, runc state deleted, mounts under the directory unmounted,
// cgroups removed, then the directory. Without root, or without containerd,
// ctr or runc, every test skips with the reason.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/containerd.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using namespace siphon::harness;  // NOLINT: test file

constexpr char kTargetImage[] = "docker.io/siphon-test/busybox:1";
constexpr char kFileContent[] = "siphon test image: only in the container\n";
constexpr uint16_t kAppPort = 8080;
constexpr char kStolenBody[] = "answered by the test's server, not the application\n";
// Where the manifests put them (images/k8s/agent-job.yaml).
constexpr char kSocketInContainer[] = "/run/containerd/containerd.sock";
constexpr char kTokenDirInContainer[] = "/var/run/siphon";
constexpr char kAgentInImage[] = "/usr/local/bin/siphon-agent";

// Every Linux capability, in the order of their numbers
// (include/uapi/linux/capability.h: CHOWN is 0, CHECKPOINT_RESTORE 40), so
// that all but the manifests' set can be dropped whatever ctr's default set
// is, and /proc/PID/status masks can be read.
constexpr const char* kAllCapabilities[] = {"CHOWN",
                                            "DAC_OVERRIDE",
                                            "DAC_READ_SEARCH",
                                            "FOWNER",
                                            "FSETID",
                                            "KILL",
                                            "SETGID",
                                            "SETUID",
                                            "SETPCAP",
                                            "LINUX_IMMUTABLE",
                                            "NET_BIND_SERVICE",
                                            "NET_BROADCAST",
                                            "NET_ADMIN",
                                            "NET_RAW",
                                            "IPC_LOCK",
                                            "IPC_OWNER",
                                            "SYS_MODULE",
                                            "SYS_RAWIO",
                                            "SYS_CHROOT",
                                            "SYS_PTRACE",
                                            "SYS_PACCT",
                                            "SYS_ADMIN",
                                            "SYS_BOOT",
                                            "SYS_NICE",
                                            "SYS_RESOURCE",
                                            "SYS_TIME",
                                            "SYS_TTY_CONFIG",
                                            "MKNOD",
                                            "LEASE",
                                            "AUDIT_WRITE",
                                            "AUDIT_CONTROL",
                                            "SETFCAP",
                                            "MAC_OVERRIDE",
                                            "MAC_ADMIN",
                                            "SYSLOG",
                                            "WAKE_ALARM",
                                            "BLOCK_SUSPEND",
                                            "AUDIT_READ",
                                            "PERFMON",
                                            "BPF",
                                            "CHECKPOINT_RESTORE"};

// The capability's number, or -1 for an unknown name.
int capabilityNumber(const std::string& name) {
  for (size_t i = 0; i < std::size(kAllCapabilities); ++i) {
    if (name == kAllCapabilities[i]) return static_cast<int>(i);
  }
  return -1;
}

// images/capabilities.txt: one name a line, '#' comments.
std::vector<std::string> manifestCapabilities() {
  std::vector<std::string> caps;
  std::ifstream in(SIPHON_CAPABILITIES_FILE);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    line.erase(std::remove_if(line.begin(), line.end(), ::isspace), line.end());
    if (!line.empty()) caps.push_back(line);
  }
  return caps;
}

// Runs a command with its output in `log_path`, allowing it `limit` (the
// image build strips and copies ~100 MB: longer than run()'s deadline on a
// busy machine). Exit code, -1 when it had to be killed.
int runLogged(const std::vector<std::string>& argv, const std::string& log_path,
              std::chrono::seconds limit) {
  Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  Child child = spawn(argv, std::nullopt, log.get(), log.get());
  return child.waitUntil(Clock::now() + limit).value_or(-1);
}

// One HTTP/1.0 GET of `path` to 127.0.0.1:port inside the network namespace
// of `pid`; the whole response, or "" when the connection failed.
std::string httpGetInNetnsOf(pid_t pid, uint16_t port, const std::string& path) {
  Fd fd;
  std::thread t([&] {
    Fd ns(open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
    if (ns.get() < 0 || setns(ns.get(), CLONE_NEWNET) != 0) return;
    fd = Fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  });
  t.join();
  if (fd.get() < 0) {
    ADD_FAILURE() << "socket in the netns of " << pid << ": " << std::strerror(errno);
    return "";
  }
  setTimeouts(fd.get(), 10);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  if (!writeAll(fd.get(), "GET " + path + " HTTP/1.0\r\nHost: target\r\n\r\n")) return "";
  std::string response;
  readAll(fd.get(), &response);
  return response;
}

// The session's local server: answers every request with kStolenBody.
class StolenServer {
 public:
  StolenServer()
      : acceptor_(listenOnLoopback(&port_, 16), 10, [](int fd) {
          std::string head;
          char buf[4096];
          while (head.find("\r\n\r\n") == std::string::npos) {
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n <= 0) return;
            head.append(buf, static_cast<size_t>(n));
          }
          const std::string body = kStolenBody;
          writeAll(fd, "HTTP/1.0 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                           "\r\nConnection: close\r\n\r\n" + body);
        }) {}
  uint16_t port() const { return port_; }
  int accepted() const { return acceptor_.accepted(); }

 private:
  uint16_t port_ = 0;
  Acceptor acceptor_;
};

// A private containerd (harness/containerd.h) with the two images and the
// target container; agent containers started on demand. The destructor
// tears everything down whatever state start() reached.
class Node {
 public:
  Node() : ctd_("siphon-img-" + randomHex(10)), target_(ctd_.tag() + "-app") {}

  std::string start() {
    if (std::string err = ctd_.start("/tmp/siphon-img-XXXXXX"); !err.empty()) return err;
    const auto deadline = Clock::now() + kProcessDeadline;
    agent_image_ = "docker.io/siphon-test/siphon-agent:" + tag();

    // The images: the agent's, built from the agent under test, and the
    // target's.
    const std::string build_log = dir() + "/build-image.log";
    const int built = runLogged({"bash", SIPHON_BUILD_IMAGE, "--agent", SIPHON_AGENT_BIN,
                                 dir() + "/agent-image.tar", agent_image_},
                                build_log, std::chrono::minutes(5));
    if (built != 0) {
      return "build-image.sh: exit " + std::to_string(built) + "\n" + readFile(build_log);
    }
    Result test_image = run({"bash", SIPHON_BUILD_TEST_IMAGE, dir() + "/target.tar", kTargetImage});
    if (test_image.exit_code != 0) return "build-test-image.sh: " + test_image.err;
    for (const auto& [tar, image] : {std::pair<std::string, std::string>{dir() + "/agent-image.tar",
                                                                         agent_image_},
                                     {dir() + "/target.tar", kTargetImage}}) {
      Result import = ctd_.importImage(tar, image);
      if (import.exit_code != 0) return "ctr image import " + tar + ": " + import.err + daemonLog();
    }

    // The application: busybox httpd serving the container's root on 8080.
    Result started = ctr(runArgs(target_, {"--null-io"}, {kTargetImage, target_, "/bin/busybox",
                                                          "httpd", "-f", "-p",
                                                          std::to_string(kAppPort), "-h", "/"}));
    ctd_.addContainer(target_);
    if (started.exit_code != 0) return "ctr run (target): " + started.err + daemonLog();
    target_pid_ = taskPid(target_);
    if (target_pid_ <= 0) return "no pid for " + target_ + " in `ctr task ls`";
    while (httpGetInNetnsOf(target_pid_, kAppPort, "/only-in-container.txt").empty()) {
      if (Clock::now() >= deadline) return "httpd in the target never answered on 8080";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }

    std::filesystem::create_directories(dir() + "/token");
    token_file_ = dir() + "/token/token";
    std::ofstream(token_file_) << "tok-" << randomHex(16) << "\n";
    chmod(token_file_.c_str(), 0600);
    return "";
  }

  // Runs the agent image as a container, as the Job does; `args` are the
  // agent's (the entrypoint is prepended: ctr, unlike Kubernetes' args,
  // replaces the entrypoint with the command it is given). Empty on
  // success, else what failed.
  std::string startAgent(const std::string& id, const std::vector<std::string>& args,
                         const std::string& log_path) {
    std::vector<std::string> options = {
        "--log-uri", "file://" + log_path,
        // hostPID: true. The test's own PID namespace is the "host" one
        // containerd and the target live in (PID 1 may be outside it).
        "--with-ns", "pid:/proc/" + std::to_string(getpid()) + "/ns/pid", "--net-host",
        "--read-only", "--seccomp", "--mount",
        "type=bind,src=" + socket() + ",dst=" + kSocketInContainer + ",options=rbind:ro", "--mount",
        "type=bind,src=" + dir() + "/token,dst=" + kTokenDirInContainer + ",options=rbind:ro"};
    const std::vector<std::string> caps = manifestCapabilities();
    for (const std::string& c : caps) {
      options.insert(options.end(), {"--cap-add", "CAP_" + c});
    }
    for (const char* c : kAllCapabilities) {
      if (std::find(caps.begin(), caps.end(), c) == caps.end()) {
        options.insert(options.end(), {"--cap-drop", std::string("CAP_") + c});
      }
    }
    std::vector<std::string> command = {agent_image_, id, kAgentInImage};
    command.insert(command.end(), args.begin(), args.end());
    Result r = ctr(runArgs(id, options, command));
    ctd_.addContainer(id);
    if (r.exit_code != 0) return "ctr run (agent): " + r.err + daemonLog();
    return "";
  }

  // `ctr run -d` of container `id`: `options`, the placement of
  // harness/containerd.h (fifos and runc state in the directory, cgroup
  // under the test's tag), then `command` (image, id, argv).
  std::vector<std::string> runArgs(const std::string& id, const std::vector<std::string>& options,
                                   const std::vector<std::string>& command) const {
    std::vector<std::string> argv = {"run", "-d"};
    argv.insert(argv.end(), options.begin(), options.end());
    const std::vector<std::string> placement = ctd_.placement(id);
    argv.insert(argv.end(), placement.begin(), placement.end());
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }

  void removeContainer(const std::string& id) { ctd_.removeContainer(id); }

  pid_t taskPid(const std::string& id) const { return task(id).first; }

  // The task's pid and status (RUNNING, STOPPED...) as `ctr task ls` shows
  // them; {0, ""} when there is no such task.
  std::pair<pid_t, std::string> task(const std::string& id) const { return ctd_.task(id); }

  Result ctr(const std::vector<std::string>& args) const { return ctd_.ctr(args); }
  std::vector<std::string> placement(const std::string& id) const { return ctd_.placement(id); }

  const std::string& dir() const { return ctd_.dir(); }
  const std::string& socket() const { return ctd_.socket(); }
  const std::string& target() const { return target_; }
  const std::string& tag() const { return ctd_.tag(); }
  const std::string& agentImage() const { return agent_image_; }
  const std::string& tokenFile() const { return token_file_; }
  pid_t targetPid() const { return target_pid_; }
  std::string daemonLog() const { return ctd_.daemonLog(4000); }

 private:
  PrivateContainerd ctd_;
  std::string target_;
  std::string agent_image_;
  std::string token_file_;
  pid_t target_pid_ = 0;
};

class AgentImageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) {
      skip_ = "needs root: runs containerd and runc, and the agent enters the target's namespaces";
      return;
    }
    skip_ = missingContainerdTool();
    if (!skip_.empty()) return;
    node_ = new Node();
    setup_error_ = node_->start();
  }
  static void TearDownTestSuite() {
    delete node_;
    node_ = nullptr;
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(setup_error_, "") << "set-up failed";
  }
  void TearDown() override {
    if (!agent_id_.empty()) {
      if (HasFailure()) std::cerr << "--- agent log\n" << readFile(agent_log_) << "---\n";
      node_->removeContainer(agent_id_);
    }
  }

  // The agent container, targeting the app container by ID through the
  // mounted socket; waits for its ready line (in its log: stdout and stderr
  // both go there).
  ::testing::AssertionResult startAgent(const std::vector<std::string>& extra_global = {}) {
    agent_id_ = node_->tag() + "-agent-" + randomHex(4);
    agent_log_ = node_->dir() + "/" + agent_id_ + ".log";
    std::vector<std::string> args = extra_global;
    args.insert(args.end(), {"targeted", "--container-id", "containerd://" + node_->target(),
                             "--runtime-endpoint", kSocketInContainer, "--listen", "127.0.0.1:0",
                             "--token-file", std::string(kTokenDirInContainer) + "/token",
                             "--first-client-timeout", "60s"});
    std::string err = node_->startAgent(agent_id_, args, agent_log_);
    if (!err.empty()) return ::testing::AssertionFailure() << err;
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      std::istringstream lines(readFile(agent_log_));
      std::string line;
      while (std::getline(lines, line)) {
        if (line.rfind("siphon-agent ready ", 0) != 0) continue;
        auto ready = parseReadyLine(line);
        if (!ready) return ::testing::AssertionFailure() << "malformed ready line: " << line;
        ready_ = *ready;
        return ::testing::AssertionSuccess();
      }
      if (node_->task(agent_id_).second != "RUNNING") break;  // exited
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure() << "no ready line from the agent container; its log:\n"
                                         << readFile(agent_log_);
  }

  std::vector<std::string> cliArgs(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", ready_.fields["listen"],
                                     "--token-file", node_->tokenFile()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  Result cli(const std::vector<std::string>& args) { return run(cliArgs(args), cleanEnv()); }

  // Steals the app's port through the CLI and checks both ways: stolen while
  // `siphon steal` runs, the application's again once it ended.
  void stealAndGiveBack(const std::string& backend) {
    StolenServer server;
    Proc steal(cliArgs({"steal", "--port", std::to_string(kAppPort), "--to",
                        "127.0.0.1:" + std::to_string(server.port())}),
               cleanEnv());
    ASSERT_TRUE(steal.readUntil([](const std::string&, const std::string& err) {
      return err.find("stealing port") != std::string::npos;
    })) << "no `stealing port` line; stderr:\n"
        << steal.err;
    EXPECT_THAT(steal.err, HasSubstr("stealing port 8080 -> 127.0.0.1:" +
                                     std::to_string(server.port()) + " (backend " + backend));

    const std::string stolen =
        httpGetInNetnsOf(node_->targetPid(), kAppPort, "/only-in-container.txt");
    EXPECT_THAT(stolen, HasSubstr(kStolenBody)) << "a connection inside the target's netns";
    EXPECT_THAT(stolen, ::testing::Not(HasSubstr(kFileContent)));
    EXPECT_EQ(server.accepted(), 1);

    steal.signal(SIGINT);
    EXPECT_EQ(steal.finish(), 0) << steal.err;
    EXPECT_THAT(steal.err, HasSubstr("summary:"));
    const std::string after =
        httpGetInNetnsOf(node_->targetPid(), kAppPort, "/only-in-container.txt");
    EXPECT_THAT(after, HasSubstr(kFileContent)) << "the port is the application's again";
    EXPECT_EQ(server.accepted(), 1);
  }

  static inline std::string skip_;
  static inline std::string setup_error_;
  static inline Node* node_ = nullptr;
  std::string agent_id_;
  std::string agent_log_;
  ReadyLine ready_;
};

TEST_F(AgentImageTest, TheApplicationServesItsPortBeforeAnySteal) {
  // The baseline the steal tests compare with: httpd in the target answers
  // with the file's content.
  const std::string page = httpGetInNetnsOf(node_->targetPid(), kAppPort, "/only-in-container.txt");
  EXPECT_THAT(page, HasSubstr("200 OK"));
  EXPECT_THAT(page, HasSubstr(kFileContent));
}

TEST_F(AgentImageTest, ImageEntrypointIsTheAgentAndThereIsNoShell) {
  // No command: the image's Entrypoint + Cmd (--help). `ctr run` can lose
  // the whole output of a container that exits at once (its IO copy starts
  // after the task: containerd/containerd#770, seen here once in a CI run
  // with exit 0 and no output), so an empty success is tried again, twice.
  Result help;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string id = node_->tag() + "-help" + std::to_string(attempt);
    std::vector<std::string> help_args = {"run", "--rm"};
    for (const std::string& a : node_->placement(id)) help_args.push_back(a);
    help_args.insert(help_args.end(), {node_->agentImage(), id});
    help = node_->ctr(help_args);
    if (help.exit_code != 0 || !help.out.empty()) break;
  }
  EXPECT_EQ(help.exit_code, 0) << help;
  EXPECT_THAT(help.out, HasSubstr("Usage: siphon-agent"));
  const std::string sh_id = node_->tag() + "-sh";
  std::vector<std::string> sh_args = {"run", "--rm"};
  for (const std::string& a : node_->placement(sh_id)) sh_args.push_back(a);
  sh_args.insert(sh_args.end(), {node_->agentImage(), sh_id, "/bin/sh", "-c", "true"});
  Result sh = node_->ctr(sh_args);
  EXPECT_NE(sh.exit_code, 0) << "the image has a shell:\n" << sh;
  node_->ctr({"container", "delete", sh_id});
}

TEST_F(AgentImageTest, AgentContainerHoldsExactlyTheManifestCapabilities) {
  ASSERT_TRUE(startAgent());
  const std::vector<std::string> caps = manifestCapabilities();
  ASSERT_FALSE(caps.empty()) << SIPHON_CAPABILITIES_FILE;
  // The OCI spec containerd gave runc: the bounding set is exactly the list.
  Result info = node_->ctr({"container", "info", agent_id_});
  ASSERT_EQ(info.exit_code, 0) << info;
  const size_t b = info.out.find("\"bounding\": [");
  ASSERT_NE(b, std::string::npos) << info.out;
  const std::string bounding = info.out.substr(b, info.out.find(']', b) - b);
  std::set<std::string> got;
  for (size_t p = bounding.find("\"CAP_"); p != std::string::npos;
       p = bounding.find("\"CAP_", p + 1)) {
    got.insert(bounding.substr(p + 5, bounding.find('"', p + 1) - p - 5));
  }
  EXPECT_EQ(got, std::set<std::string>(caps.begin(), caps.end()));
  EXPECT_THAT(info.out, ::testing::Not(HasSubstr("\"privileged\": true")));
  // And the running agent: its bounding set is within the list (the agent
  // may drop more at start-up, never gain).
  const pid_t pid = node_->taskPid(agent_id_);
  ASSERT_GT(pid, 0);
  uint64_t allowed = 0;
  for (const std::string& c : caps) {
    ASSERT_GE(capabilityNumber(c), 0) << "unknown capability " << c << " in the list";
    allowed |= uint64_t{1} << capabilityNumber(c);
  }
  std::istringstream status(readFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  bool seen = false;
  while (std::getline(status, line)) {
    if (line.rfind("CapBnd:", 0) != 0) continue;
    const uint64_t bnd = std::stoull(line.substr(7), nullptr, 16);
    EXPECT_EQ(bnd & ~allowed, 0u) << "capabilities beyond the manifest's: " << std::hex
                                  << (bnd & ~allowed);
    seen = true;
  }
  EXPECT_TRUE(seen);
}

TEST_F(AgentImageTest, AgentInAContainerResolvesTheTargetById) {
  ASSERT_TRUE(startAgent());
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(node_->targetPid()));
  const uint64_t netns = netnsInodeOf(node_->targetPid());
  ASSERT_NE(netns, 0u);
  EXPECT_EQ(ready_.fields["netns"], "net:[" + std::to_string(netns) + "]");
  Result r = cli({"--json", "info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\"container_id\": \"" + node_->target() + "\""));
  EXPECT_THAT(r.out, HasSubstr("\"runtime\": \"containerd\""));
}

TEST_F(AgentImageTest, ReadsAFileThatOnlyExistsInTheTargetContainer) {
  ASSERT_FALSE(std::filesystem::exists("/only-in-container.txt"))
      << "the test needs the file to be absent from the host";
  ASSERT_TRUE(startAgent());
  Result r = cli({"fs", "cat", "/only-in-container.txt"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, kFileContent);
  // Read-only by default, as deployed.
  Proc write(cliArgs({"fs", "write", "/written-by-the-test"}), cleanEnv());
  write.write("x");
  write.closeStdin();
  EXPECT_EQ(write.finish(), 1) << write.err;
  EXPECT_THAT(write.err, HasSubstr("EROFS"));
}

TEST_F(AgentImageTest, StealsTheTargetsPortWithSkLookup) {
  ASSERT_TRUE(startAgent({"--steal-backend", "sk_lookup"}));
  stealAndGiveBack("sk_lookup");
}

TEST_F(AgentImageTest, StealsTheTargetsPortWithTheImagesIptablesNft) {
  ASSERT_TRUE(startAgent({"--steal-backend", "iptables", "--iptables", "nft"}));
  stealAndGiveBack("iptables");
}

TEST_F(AgentImageTest, StealsTheTargetsPortWithTheImagesIptablesLegacy) {
  ASSERT_TRUE(startAgent({"--steal-backend", "iptables", "--iptables", "legacy"}));
  stealAndGiveBack("iptables");
}

}  // namespace
}  // namespace siphon
