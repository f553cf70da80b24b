// End to end, as root: the real siphon-agent resolving containers through
// the Docker Engine API of real engines started by the test
// (harness/docker_engine.h), driven by the real siphon CLI:
//   - Debian's dockerd 20.10 (over a containerd of the test's own), and
//   - Podman's Docker-compatible API service (`podman system service`),
// both with `--runtime docker --runtime-endpoint <the engine's socket>`.
//
// Per engine, a busybox image is imported from a root filesystem tar made
// by the test (no registry: `docker import`), and one target container
// runs with --network none:
//   sh -c 'exec env -i FROM_RUN=from-process PROC_ONLY=1 /bin/busybox
//          httpd -f -p 8080 -h /'
// so the engine's env (image: PATH=/bin, RUNTIME_ONLY_VAR=from-image; run:
// FROM_RUN=1) and /proc/PID/environ differ, busybox httpd serves the
// container's root on 8080, and /only-in-container.txt holds a line naming
// the engine and the test's tag. A client network namespace of the test is
// joined to the container's by a veth pair the test makes (10.251.N.0/24):
// the "other pod" whose connections to the container's port a steal takes.
//
// Then the agent image (scripts/build-image.sh, the one the manifests run)
// is loaded into the Docker engine with `docker load` and run as a
// container with the manifests' capabilities, in the host PID and network
// namespaces, the engine's socket mounted at /var/run/docker.sock, and
// resolves the target by "docker://ID" through that socket.
//
// One engine and one target serve every test of an engine in a process
// (starting them is most of the time). Teardown runs in every path (see
// docker_engine.h); the veth pair goes with the client namespace. Without
// root, or without the engine's tools, every test skips with the reason.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/sanitizers.h"
#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/docker_engine.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr uint16_t kAppPort = 8080;
constexpr char kStolenBody[] = "answered by the test's server, not the application\n";
// Where the manifests and `docker run -v` users put them.
constexpr char kSocketInContainer[] = "/var/run/docker.sock";
constexpr char kTokenDirInContainer[] = "/var/run/siphon";

// Runs a command with its output in `log_path`, allowing it `limit` (the
// agent image build strips and copies ~100 MB: longer than run()'s
// deadline on a busy machine). Exit code, -1 when it had to be killed.
int runLogged(const std::vector<std::string>& argv, const std::string& log_path,
              std::chrono::seconds limit) {
  Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  Child child = spawn(argv, std::nullopt, log.get(), log.get());
  return child.waitUntil(Clock::now() + limit).value_or(-1);
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

// One engine, its busybox image, the target container and the client
// namespace joined to it. The destructor tears everything down whatever
// state start() reached (the client namespace first, then the engine).
class Node {
 public:
  explicit Node(EngineKind kind)
      : engine_(kind, std::string("siphon-") + engineName(kind) + "-" + std::to_string(getpid()) +
                          "-" + randomHex(6)),
        image_("siphon-test/busybox:" + engine_.tag()),
        target_(engine_.tag() + "-app") {}

  std::string start() {
    if (std::string err = engine_.start(); !err.empty()) return err;
    const auto deadline = Clock::now() + kProcessDeadline;
    file_content_ = std::string("siphon ") + engineName(engine_.kind()) +
                    " test: only in the container " + engine_.tag() + "\n";
    if (std::string err = buildRootfsTar(dir() + "/rootfs.tar"); !err.empty()) return err;
    Result imported = engine_.importRootfs(dir() + "/rootfs.tar", image_,
                                           {"ENV PATH=/bin", "ENV RUNTIME_ONLY_VAR=from-image"});
    if (imported.exit_code != 0) return "docker import: " + imported.err + engine_.daemonLog();

    std::vector<std::string> args = {"run", "--detach", "--network", "none", "--env", "FROM_RUN=1"};
    for (const std::string& a : engine_.placement(target_)) args.push_back(a);
    args.insert(args.end(), {image_, "/bin/sh", "-c",
                             "exec env -i FROM_RUN=from-process PROC_ONLY=1 /bin/busybox httpd "
                             "-f -p " +
                                 std::to_string(kAppPort) + " -h /"});
    Result started = engine_.docker(args);
    engine_.addContainer(target_);
    if (started.exit_code != 0) return "docker run: " + started.err + engine_.daemonLog();
    target_id_ = engine_.inspect(target_, "{{.Id}}");
    if (target_id_.size() != 64) return "no 64-character ID for " + target_ + ": " + target_id_;
    // The engine's own answer, to compare the agent's with.
    target_pid_ = std::atoi(engine_.inspect(target_, "{{.State.Pid}}").c_str());
    if (target_pid_ <= 0) return "no pid for " + target_ + engine_.daemonLog();
    // sh execs env, which execs httpd (same pid): wait for the last
    // environment, the one the test expects.
    const std::string environ_path = "/proc/" + std::to_string(target_pid_) + "/environ";
    while (readFile(environ_path).find("PROC_ONLY=1") == std::string::npos) {
      if (Clock::now() >= deadline) return "the target never ran httpd";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }

    client_.emplace();
    if (!client_->created()) return "ip netns add failed";
    if (std::string err = linkClientToTarget(); !err.empty()) return err;
    while (httpGet("/only-in-container.txt").find(file_content_) == std::string::npos) {
      if (Clock::now() >= deadline) return "httpd in the target never answered through the veth";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }

    std::filesystem::create_directories(dir() + "/token");
    token_file_ = dir() + "/token/token";
    std::ofstream(token_file_) << "tok-" << randomHex(16) << "\n";
    chmod(token_file_.c_str(), 0600);
    return "";
  }

  // One HTTP/1.0 GET of `path` from the client namespace to the target's
  // port, through the veth; the whole response, or "" when the connection
  // failed.
  std::string httpGet(const std::string& path) const {
    Fd fd(socketInNetns(client_->name(), AF_INET, SOCK_STREAM));
    if (fd.get() < 0) return "";
    setTimeouts(fd.get(), 10);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(kAppPort);
    inet_pton(AF_INET, target_ip_.c_str(), &a.sin_addr);
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
    if (!writeAll(fd.get(), "GET " + path + " HTTP/1.0\r\nHost: target\r\n\r\n")) return "";
    std::string response;
    readAll(fd.get(), &response);
    return response;
  }

  PrivateEngine& engine() { return engine_; }
  const std::string& dir() const { return engine_.dir(); }
  const std::string& socket() const { return engine_.socket(); }
  const std::string& image() const { return image_; }
  const std::string& target() const { return target_; }
  const std::string& targetId() const { return target_id_; }
  pid_t targetPid() const { return target_pid_; }
  const std::string& fileContent() const { return file_content_; }
  const std::string& tokenFile() const { return token_file_; }

 private:
  // busybox-static and a file only this container has, as a tar for
  // `docker import`.
  std::string buildRootfsTar(const std::string& out) {
    if (access("/bin/busybox", X_OK) != 0) return "/bin/busybox is missing (busybox-static)";
    const std::string root = dir() + "/rootfs";
    for (const char* d : {"bin", "etc", "tmp", "proc", "sys", "dev"}) {
      std::filesystem::create_directories(root + "/" + d);
    }
    std::filesystem::copy_file("/bin/busybox", root + "/bin/busybox");
    for (const char* applet : {"sh", "env", "cat", "sleep", "httpd"}) {
      std::filesystem::create_symlink("busybox", root + "/bin/" + applet);
    }
    std::ofstream(root + "/only-in-container.txt") << file_content_;
    Result tar = run({"tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "-C", root,
                      "-cf", out, "."});
    if (tar.exit_code != 0) return "tar: " + tar.err;
    return "";
  }

  // A veth pair from the client namespace into the container's (named by
  // its pid: the engine made it, it has no name under /run/netns), each end
  // addressed and up. Deleting the client namespace deletes the pair.
  std::string linkClientToTarget() {
    const std::string tag = randomHex(6);
    const int subnet =
        1 + static_cast<int>(std::strtoul(tag.substr(0, 2).c_str(), nullptr, 16) % 254);
    const std::string client_if = "dk" + tag + "c", target_if = "dk" + tag + "t";
    client_ip_ = "10.251." + std::to_string(subnet) + ".2";
    target_ip_ = "10.251." + std::to_string(subnet) + ".1";
    const std::string netns_of_target = "--net=/proc/" + std::to_string(target_pid_) + "/ns/net";
    const std::vector<std::vector<std::string>> cmds = {
        {"ip", "-n", client_->name(), "link", "add", client_if, "type", "veth", "peer", "name",
         target_if, "netns", std::to_string(target_pid_)},
        {"ip", "-n", client_->name(), "addr", "add", client_ip_ + "/24", "dev", client_if},
        {"ip", "-n", client_->name(), "link", "set", client_if, "up"},
        {"nsenter", netns_of_target, "ip", "addr", "add", target_ip_ + "/24", "dev", target_if},
        {"nsenter", netns_of_target, "ip", "link", "set", target_if, "up"},
        {"nsenter", netns_of_target, "ip", "link", "set", "lo", "up"}};
    for (const auto& cmd : cmds) {
      Result r = run(cmd);
      if (r.exit_code != 0) {
        std::string line;
        for (const auto& w : cmd) line += w + " ";
        return line + ": " + r.err;
      }
    }
    return "";
  }

  PrivateEngine engine_;
  std::string image_;
  std::string target_;
  std::string target_id_;
  pid_t target_pid_ = 0;
  std::string file_content_;
  std::string token_file_;
  std::optional<NetNs> client_;
  std::string client_ip_, target_ip_;
};

// The suite's nodes, one per engine, started by the first test that needs
// one and torn down after the last test of the suite.
class Nodes {
 public:
  // The node of `kind`, or the reason its tests skip or fail: *skip is set
  // when the engine cannot run here, *error when its start-up failed.
  Node* get(EngineKind kind, std::string* skip, std::string* error) {
    auto it = nodes_.find(kind);
    if (it == nodes_.end()) {
      Entry entry;
      if (geteuid() != 0) {
        entry.skip = std::string("needs root: runs ") + engineName(kind) +
                     " and runc, and siphon-agent enters the container's namespaces";
      } else {
        entry.skip = missingEngineTool(kind);
      }
      if (entry.skip.empty()) {
        entry.node = std::make_unique<Node>(kind);
        entry.error = entry.node->start();
      }
      it = nodes_.emplace(kind, std::move(entry)).first;
    }
    *skip = it->second.skip;
    *error = it->second.error;
    return it->second.node.get();
  }
  void clear() { nodes_.clear(); }

 private:
  struct Entry {
    std::string skip, error;
    std::unique_ptr<Node> node;
  };
  std::map<EngineKind, Entry> nodes_;
};

Nodes& nodes() {
  static Nodes n;
  return n;
}

std::string engineParamName(const ::testing::TestParamInfo<EngineKind>& info) {
  return engineName(info.param);
}

class EngineTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  static void TearDownTestSuite() { nodes().clear(); }

  void SetUp() override {
    std::string skip, error;
    node_ = nodes().get(GetParam(), &skip, &error);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_EQ(error, "") << engineName(GetParam()) << " set-up failed";
  }
  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
    agent_.reset();
  }

  // Starts the agent on the host, targeted at `container` through the
  // engine's socket, and reads its ready line.
  ::testing::AssertionResult startAgent(const std::string& container,
                                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "--listen", "127.0.0.1:0", "--token-file", node_->tokenFile(), "--first-client-timeout",
        "30s"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(),
                {"targeted", "--container-id", container, "--runtime-endpoint", node_->socket()});
    if (container.find("://") == std::string::npos) {
      args.insert(args.end(), {"--runtime", "docker"});
    }
    agent_.reset();
    agent_.emplace(args, cleanEnv(), node_->dir() + "/agent-" + randomHex(6) + ".log");
    auto line = agent_->readLine();
    if (!line) return ::testing::AssertionFailure() << "no ready line; log:\n" << agent_->log();
    auto ready = parseReadyLine(*line);
    if (!ready) return ::testing::AssertionFailure() << "malformed ready line: " << *line;
    ready_ = *ready;
    return ::testing::AssertionSuccess();
  }

  std::vector<std::string> cliArgs(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", ready_.fields["listen"],
                                     "--token-file", node_->tokenFile()};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  Result cli(const std::vector<std::string>& args) { return run(cliArgs(args), cleanEnv()); }

  // The agent run once to its exit (a resolution that fails).
  Result agentOnce(const std::vector<std::string>& mode_args) {
    std::vector<std::string> argv = {SIPHON_AGENT_BIN, "--listen", "127.0.0.1:0", "--token-file",
                                     node_->tokenFile()};
    argv.insert(argv.end(), mode_args.begin(), mode_args.end());
    return run(argv, cleanEnv());
  }

  // Steals the app's port through the CLI and checks both ways: a
  // connection from the client namespace is stolen while `siphon steal`
  // runs, the application's again once it ended.
  void stealAndGiveBack() {
    StolenServer server;
    Proc steal(cliArgs({"steal", "--port", std::to_string(kAppPort), "--to",
                        "127.0.0.1:" + std::to_string(server.port())}),
               cleanEnv());
    ASSERT_TRUE(steal.readUntil([](const std::string&, const std::string& err) {
      return err.find("stealing port") != std::string::npos;
    })) << "no `stealing port` line; stderr:\n"
        << steal.err;
    EXPECT_THAT(steal.err,
                HasSubstr("stealing port 8080 -> 127.0.0.1:" + std::to_string(server.port())));

    const std::string stolen = node_->httpGet("/only-in-container.txt");
    EXPECT_THAT(stolen, HasSubstr(kStolenBody)) << "a connection through the veth";
    EXPECT_THAT(stolen, Not(HasSubstr(node_->fileContent())));
    EXPECT_EQ(server.accepted(), 1);

    steal.signal(SIGINT);
    EXPECT_EQ(steal.finish(), 0) << steal.err;
    const std::string after = node_->httpGet("/only-in-container.txt");
    EXPECT_THAT(after, HasSubstr(node_->fileContent())) << "the port is the application's again";
    EXPECT_EQ(server.accepted(), 1);
  }

  Node* node_ = nullptr;
  std::optional<Agent> agent_;
  ReadyLine ready_;
};

INSTANTIATE_TEST_SUITE_P(Engines, EngineTest,
                         ::testing::Values(EngineKind::kDocker, EngineKind::kPodman),
                         engineParamName);

TEST_P(EngineTest, ResolvesTheContainerByIdAndNamesTheEnginesPidAndNetns) {
  ASSERT_TRUE(startAgent(node_->targetId()));
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(node_->targetPid()));
  const uint64_t netns = netnsInodeOf(node_->targetPid());
  ASSERT_NE(netns, 0u);
  EXPECT_EQ(ready_.fields["netns"], "net:[" + std::to_string(netns) + "]");
  EXPECT_NE(netns, netnsInodeOf(getpid())) << "--network none gives the container its own netns";
  Result r = cli({"--json", "info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\"container_id\": \"" + node_->targetId() + "\""));
  EXPECT_THAT(r.out, HasSubstr("\"runtime\": \"docker\""));
}

TEST_P(EngineTest, KubernetesFormPicksTheDockerApi) {
  // What a pod's status.containerStatuses[].containerID says on a node
  // whose runtime is Docker (cri-dockerd): no --runtime.
  ASSERT_TRUE(startAgent("docker://" + node_->targetId()));
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(node_->targetPid()));
}

TEST_P(EngineTest, ShortIdAndNameResolveToTheFullId) {
  // The engine resolves a unique ID prefix and a name; the agent reports
  // the full ID the engine answered with.
  for (const std::string& ref : {node_->targetId().substr(0, 12), node_->target()}) {
    SCOPED_TRACE(ref);
    ASSERT_TRUE(startAgent(ref));
    EXPECT_EQ(ready_.fields["target_pid"], std::to_string(node_->targetPid()));
    Result r = cli({"--json", "info"});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_THAT(r.out, HasSubstr("\"container_id\": \"" + node_->targetId() + "\""));
  }
}

TEST_P(EngineTest, EnvIsTheEnginesEnvMergedUnderTheProcessEnv) {
  ASSERT_TRUE(startAgent(node_->targetId()));
  // FROM_RUN: both have it, the process wins. PROC_ONLY: only the process
  // (`env -i` started it). PATH, RUNTIME_ONLY_VAR: only the engine's
  // Config.Env (the image's ENV), since `env -i` cleared them.
  Result r = cli({"env", "--include", "FROM_RUN", "--include", "PROC_ONLY", "--include", "PATH",
                  "--include", "RUNTIME_ONLY_VAR"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out,
            "FROM_RUN=from-process\n"
            "PATH=/bin\n"
            "PROC_ONLY=1\n"
            "RUNTIME_ONLY_VAR=from-image\n");
  if (GetParam() == EngineKind::kDocker) {
    // Docker's Config.Env is exactly the image's and the run's.
    Result all = cli({"--json", "env"});
    ASSERT_EQ(all.exit_code, 0) << all;
    EXPECT_EQ(all.out,
              "{\n"
              "  \"FROM_RUN\": \"from-process\",\n"
              "  \"PATH\": \"/bin\",\n"
              "  \"PROC_ONLY\": \"1\",\n"
              "  \"RUNTIME_ONLY_VAR\": \"from-image\"\n"
              "}\n");
  } else {
    // Podman adds its own to Config.Env (container=podman, TERM, HOSTNAME).
    Result podman = cli({"env", "--include", "container"});
    ASSERT_EQ(podman.exit_code, 0) << podman;
    EXPECT_EQ(podman.out, "container=podman\n");
  }
}

TEST_P(EngineTest, ReadsAFileThatOnlyExistsInTheContainer) {
  ASSERT_FALSE(std::filesystem::exists("/only-in-container.txt"))
      << "the test needs the file to be absent from the host";
  ASSERT_TRUE(startAgent(node_->targetId()));
  Result r = cli({"fs", "cat", "/only-in-container.txt"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, node_->fileContent());
}

TEST_P(EngineTest, StealsThePortFromAConnectionThroughAVeth) {
  const std::string before = node_->httpGet("/only-in-container.txt");
  ASSERT_THAT(before, HasSubstr(node_->fileContent())) << "the application answers before";
  ASSERT_TRUE(startAgent(node_->targetId()));
  stealAndGiveBack();
}

TEST_P(EngineTest, UnknownIdExitsThreeNamingTheSocket) {
  Result r = agentOnce({"targeted", "--container-id", "no-such-" + randomHex(6), "--runtime",
                        "docker", "--runtime-endpoint", node_->socket()});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_EQ(r.out, "") << "no ready line";
  EXPECT_THAT(r.err, HasSubstr("not found in docker (" + node_->socket() + ")"));
}

TEST_P(EngineTest, CreatedButNotStartedContainerIsNotRunning) {
  const std::string name = node_->engine().tag() + "-created";
  std::vector<std::string> args = {"create", "--network", "none"};
  for (const std::string& a : node_->engine().placement(name)) args.push_back(a);
  args.insert(args.end(), {node_->image(), "/bin/sleep", "600"});
  Result created = node_->engine().docker(args);
  node_->engine().addContainer(name);
  ASSERT_EQ(created.exit_code, 0) << created;
  Result r = agentOnce({"targeted", "--container-id", name, "--runtime", "docker",
                        "--runtime-endpoint", node_->socket()});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_THAT(r.err, HasSubstr("container " + name + " is not running in docker (" +
                               node_->socket() + ")"));
  node_->engine().removeContainer(name);
}

// ------------------------------------------------------------ the agent image

class DockerAgentImageTest : public EngineTest {
 protected:
  static void TearDownTestSuite() {
    image_built_.reset();
    nodes().clear();
  }

  void SetUp() override {
    // What these check is the packaging in another engine (the image loads
    // and runs in dockerd); the agent's code in them is what EngineTest
    // runs under the sanitizers. As tests/privileged/image/ (label
    // privileged-no-sanitize), they cost minutes of that run for nothing.
    if (fakes::kSanitizedBuild) GTEST_SKIP() << "the image's packaging: the normal build's run";
    EngineTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!image_built_) image_built_ = loadAgentImage();
    ASSERT_EQ(*image_built_, "") << "the agent image";
  }
  void TearDown() override {
    if (!agent_name_.empty()) {
      if (HasFailure()) std::cerr << "--- agent container log\n" << agentLog() << "---\n";
      node_->engine().removeContainer(agent_name_);
    }
    EngineTest::TearDown();
  }

  // build-image.sh's tar, loaded with `docker load`. Empty, or what failed.
  std::string loadAgentImage() {
    const std::string repo = "siphon-test/siphon-agent:" + node_->engine().tag();
    agent_image_ = "docker.io/" + repo;
    const std::string tar = node_->dir() + "/agent-image.tar";
    const std::string log = node_->dir() + "/build-image.log";
    const int built =
        runLogged({"bash", SIPHON_BUILD_IMAGE, "--agent", SIPHON_AGENT_BIN, tar, agent_image_}, log,
                  std::chrono::minutes(5));
    if (built != 0) return "build-image.sh: exit " + std::to_string(built) + "\n" + readFile(log);
    Result loaded = node_->engine().loadImage(tar, agent_image_);
    if (loaded.exit_code != 0) return "docker load: " + loaded.out + loaded.err;
    // Docker names it the short way ("Loaded image: siphon-test/...").
    if (loaded.out.find(repo) == std::string::npos) {
      return "docker load did not name " + repo + ": " + loaded.out;
    }
    return "";
  }

  // `docker logs` of the agent container: its stdout, then its stderr.
  std::string agentLog() {
    Result r = node_->engine().docker({"logs", agent_name_});
    return r.out + r.err;
  }

  // The agent image as a container, as `docker run` on the node would run
  // it: exactly the capabilities of images/capabilities.txt (what the
  // manifests grant; --privileged would ask for every capability, and runc
  // fails where the test's own bounding set lacks one, as in a CI sandbox
  // without CAP_SYS_RESOURCE), Docker's default seccomp profile, the
  // host's PID namespace (the engine's State.Pid is a pid there) and
  // network (it listens on 127.0.0.1 where the CLI reaches it), a
  // read-only root, the engine's socket at /var/run/docker.sock. No
  // --runtime-endpoint: "docker://ID" and the known socket path find the
  // engine.
  ::testing::AssertionResult startAgentContainer(const std::vector<std::string>& extra = {}) {
    agent_name_ = node_->engine().tag() + "-agent-" + randomHex(4);
    std::vector<std::string> args = {"run",
                                     "--detach",
                                     "--cap-drop",
                                     "ALL",
                                     "--pid",
                                     "host",
                                     "--network",
                                     "host",
                                     "--read-only",
                                     "--volume",
                                     node_->socket() + ":" + kSocketInContainer + ":ro",
                                     "--volume",
                                     node_->dir() + "/token:" + kTokenDirInContainer + ":ro"};
    const std::vector<std::string> caps = manifestCapabilities();
    if (caps.empty())
      return ::testing::AssertionFailure() << "no capability in " << SIPHON_CAPABILITIES_FILE;
    for (const std::string& c : caps) args.insert(args.end(), {"--cap-add", c});
    for (const std::string& a : node_->engine().placement(agent_name_)) args.push_back(a);
    args.push_back(agent_image_);
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(),
                {"targeted", "--container-id", "docker://" + node_->targetId(), "--listen",
                 "127.0.0.1:0", "--token-file", std::string(kTokenDirInContainer) + "/token",
                 "--first-client-timeout", "60s"});
    Result started = node_->engine().docker(args);
    node_->engine().addContainer(agent_name_);
    if (started.exit_code != 0) {
      return ::testing::AssertionFailure() << "docker run (agent): " << started;
    }
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      std::istringstream lines(agentLog());
      std::string line;
      while (std::getline(lines, line)) {
        if (line.rfind("siphon-agent ready ", 0) != 0) continue;
        auto ready = parseReadyLine(line);
        if (!ready) return ::testing::AssertionFailure() << "malformed ready line: " << line;
        ready_ = *ready;
        return ::testing::AssertionSuccess();
      }
      if (node_->engine().inspect(agent_name_, "{{.State.Running}}") != "true") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure() << "no ready line from the agent container; its log:\n"
                                         << agentLog();
  }

  static inline std::optional<std::string> image_built_;
  static inline std::string agent_image_;
  std::string agent_name_;
};

INSTANTIATE_TEST_SUITE_P(Engines, DockerAgentImageTest, ::testing::Values(EngineKind::kDocker),
                         engineParamName);

TEST_P(DockerAgentImageTest, AgentContainerResolvesTheTargetThroughTheMountedSocket) {
  ASSERT_TRUE(startAgentContainer());
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(node_->targetPid()));
  EXPECT_EQ(ready_.fields["netns"],
            "net:[" + std::to_string(netnsInodeOf(node_->targetPid())) + "]");
  Result info = cli({"--json", "info"});
  ASSERT_EQ(info.exit_code, 0) << info;
  EXPECT_THAT(info.out, HasSubstr("\"container_id\": \"" + node_->targetId() + "\""));
  EXPECT_THAT(info.out, HasSubstr("\"runtime\": \"docker\""));
  Result env = cli({"env", "--include", "RUNTIME_ONLY_VAR", "--include", "FROM_RUN"});
  ASSERT_EQ(env.exit_code, 0) << env;
  EXPECT_EQ(env.out, "FROM_RUN=from-process\nRUNTIME_ONLY_VAR=from-image\n");
}

TEST_P(DockerAgentImageTest, AgentContainerReadsTheTargetsFile) {
  ASSERT_TRUE(startAgentContainer());
  Result r = cli({"fs", "cat", "/only-in-container.txt"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, node_->fileContent());
}

TEST_P(DockerAgentImageTest, AgentContainerStealsTheTargetsPort) {
  ASSERT_TRUE(startAgentContainer());
  stealAndGiveBack();
}

}  // namespace
}  // namespace siphon
