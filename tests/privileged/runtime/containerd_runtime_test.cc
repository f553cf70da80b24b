// End to end, as root: a real containerd (its own root, state and sockets in
// a temporary directory, no CRI plugin) running a real runc container of a
// busybox image built by scripts/build-test-image.sh, and the real
// siphon-agent resolving the container through containerd's gRPC API, driven
// by the real siphon CLI.
//
// The container's process is started as `sh -c 'exec env -i FROM_CTR_RUN=
// from-process PROC_ONLY=1 /bin/sleep 600'`, so its /proc/PID/environ and
// the env containerd keeps in its OCI spec (PATH=/bin, RUNTIME_ONLY_VAR=
// from-image, FROM_CTR_RUN=1) differ: `siphon env` must show the merge, with
// the process's value winning.
//
// One containerd and one container serve every test of the suite (starting
// them is most of the time). Cleanup runs in every path, each step best
// effort: the task killed and deleted, the container and image removed,
// containerd stopped, leftover shims and the container process killed, runc
// state deleted, every mount under the directory unmounted, the cgroups
// removed, then the directory. Without root, or without containerd/runc/ctr
// installed, every test skips with the reason.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace siphon::harness;  // NOLINT: test file

constexpr char kNamespace[] = "k8s.io";
constexpr char kImage[] = "docker.io/siphon-test/busybox:1";
constexpr char kFileContent[] = "siphon test image: only in the container\n";

bool onPath(const std::string& tool) {
  Result r = run({"sh", "-c", "command -v " + tool});
  return r.exit_code == 0;
}

bool canConnect(const std::string& socket_path) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

// Mount points at or under `dir`, deepest first (the order to unmount).
std::vector<std::string> mountsUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, devno, root, mount_point;
    fields >> id >> parent >> devno >> root >> mount_point;
    if (mount_point == dir || mount_point.rfind(dir + "/", 0) == 0) out.push_back(mount_point);
  }
  std::sort(out.begin(), out.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return out;
}

// A private containerd and one running container, torn down by the
// destructor whatever state start() reached.
class Containerd {
 public:
  Containerd() : tag_("siphon-test-" + randomHex(10)), id_(tag_ + "-ctr") {}
  ~Containerd() { stop(); }

  // Empty on success, else what failed (the test fails with it).
  std::string start() {
    run_containerd_existed_ = std::filesystem::exists("/run/containerd");
    std::string tmpl = "/tmp/siphon-ctd-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return std::string("mkdtemp: ") + std::strerror(errno);
    dir_ = tmpl;
    socket_ = dir_ + "/c.sock";
    // The opt plugin would create /opt/containerd; the CRI plugin would want
    // CNI and the kubelet's world. Everything else lives in the directory.
    std::ofstream(dir_ + "/config.toml")
        << "version = 2\n"
        << "root = \"" << dir_ << "/root\"\n"
        << "state = \"" << dir_ << "/state\"\n"
        << "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"
        << "[grpc]\n  address = \"" << socket_ << "\"\n"
        << "[ttrpc]\n  address = \"" << socket_ << ".ttrpc\"\n"
        << "[plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"" << dir_ << "/opt\"\n";
    Fd log(
        open((dir_ + "/containerd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    daemon_ = spawn({"containerd", "--config", dir_ + "/config.toml"}, std::nullopt, log.get(),
                    log.get());
    const auto deadline = Clock::now() + kProcessDeadline;
    while (!canConnect(socket_)) {
      if (daemon_.waitUntil(Clock::now())) return "containerd exited at start-up:\n" + daemonLog();
      if (Clock::now() >= deadline) return "containerd never listened on " + socket_;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }

    Result image = run({"bash", SIPHON_BUILD_TEST_IMAGE, dir_ + "/image.tar", kImage});
    if (image.exit_code != 0) return "build-test-image.sh: " + image.err;
    Result import = ctr({"image", "import", dir_ + "/image.tar"});
    if (import.exit_code != 0) return "ctr image import: " + import.err + daemonLog();
    image_imported_ = true;

    // The cgroup path carries the unique tag, so cleanup can find and remove
    // exactly what this test made.
    Result started =
        ctr({"run", "-d", "--null-io", "--fifo-dir", dir_ + "/fifo", "--runc-root", dir_ + "/runc",
             "--cgroup", "/" + tag_ + "/" + id_, "--env", "FROM_CTR_RUN=1", kImage, id_, "sh", "-c",
             "exec env -i FROM_CTR_RUN=from-process PROC_ONLY=1 /bin/sleep 600"});
    container_created_ = true;
    if (started.exit_code != 0) return "ctr run: " + started.err + daemonLog();

    // The task's pid as ctr sees it: an independent answer to compare the
    // agent's with.
    Result tasks = ctr({"task", "ls"});
    std::istringstream lines(tasks.out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream words(line);
      std::string name, pid;
      words >> name >> pid;
      if (name == id_) task_pid_ = std::atoi(pid.c_str());
    }
    if (task_pid_ <= 0) return "no pid for " + id_ + " in `ctr task ls`:\n" + tasks.out;
    // sh execs env, which execs sleep (same pid): wait for the last one, so
    // /proc/PID/environ is the one the test expects.
    const std::string comm = "/proc/" + std::to_string(task_pid_) + "/comm";
    while (readFile(comm) != "sleep\n") {
      if (Clock::now() >= deadline) return "task " + std::to_string(task_pid_) + " never ran sleep";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "";
  }

  Result ctr(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {"ctr", "-a", socket_, "-n", kNamespace};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
  }

  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& id() const { return id_; }
  pid_t taskPid() const { return task_pid_; }

 private:
  std::string daemonLog() const {
    return "\n--- containerd log\n" + readFile(dir_ + "/containerd.log");
  }

  void stop() {
    if (dir_.empty()) return;
    if (container_created_) {
      ctr({"task", "kill", "-s", "SIGKILL", id_});
      ctr({"task", "delete", "--force", id_});
      ctr({"container", "delete", id_});
    }
    if (image_imported_) ctr({"image", "remove", kImage});
    if (daemon_.pid() > 0) {
      kill(daemon_.pid(), SIGTERM);
      if (!daemon_.waitUntil(Clock::now() + std::chrono::seconds(10))) daemon_.kill();
    }
    // Whatever survived containerd: shims started for our socket, and the
    // container's process (only if it is still ours: its cgroup has our tag).
    killProcessesMatching([this](pid_t pid) {
      const std::string cmdline = readFile("/proc/" + std::to_string(pid) + "/cmdline");
      return cmdline.find("containerd-shim") != std::string::npos &&
             cmdline.find(socket_) != std::string::npos;
    });
    killProcessesMatching([this](pid_t pid) {
      return readFile("/proc/" + std::to_string(pid) + "/cgroup").find("/" + tag_ + "/") !=
             std::string::npos;
    });
    if (std::filesystem::exists(dir_ + "/runc")) {
      run({"runc", "--root", dir_ + "/runc", "delete", "--force", id_});
    }
    for (const std::string& m : mountsUnder(dir_)) {
      if (umount2(m.c_str(), MNT_DETACH) != 0) {
        ADD_FAILURE() << "umount " << m << ": " << std::strerror(errno);
      }
    }
    removeCgroups();
    if (!run_containerd_existed_) {
      // containerd 1.6 puts shim sockets in /run/containerd/s whatever its
      // state directory; remove what it created for us, if nothing else is
      // there.
      for (const char* d : {"/run/containerd/s", "/run/containerd/fifo", "/run/containerd"}) {
        rmdir(d);
      }
    }
    if (!mountsUnder(dir_).empty()) {
      ADD_FAILURE() << "mounts left under " << dir_ << "; the directory is kept";
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    if (ec) ADD_FAILURE() << "remove " << dir_ << ": " << ec.message();
  }

  template <typename Pred>
  void killProcessesMatching(Pred matches) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = std::atoi(name.c_str());
      if (pid != getpid() && matches(pid)) kill(pid, SIGKILL);
    }
  }

  // runc made /<tag>/<id> in every hierarchy (cgroup v1) or once (v2).
  void removeCgroups() {
    std::vector<std::string> roots = {"/sys/fs/cgroup"};
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/sys/fs/cgroup", ec)) {
      if (e.is_directory()) roots.push_back(e.path());
    }
    for (const std::string& root : roots) {
      const std::string parent = root + "/" + tag_;
      if (!std::filesystem::exists(parent)) continue;
      // Empty cgroups are removed with rmdir, never with their files.
      for (int i = 0; i < 100 && rmdir((parent + "/" + id_).c_str()) != 0 && errno == EBUSY; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      rmdir(parent.c_str());
    }
  }

  std::string tag_;
  std::string id_;
  std::string dir_;
  std::string socket_;
  Child daemon_;
  bool run_containerd_existed_ = true;
  bool image_imported_ = false;
  bool container_created_ = false;
  pid_t task_pid_ = 0;
};

class ContainerdRuntimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) {
      skip_ =
          "needs root: runs containerd and runc, and siphon-agent enters the container's "
          "namespaces";
      return;
    }
    for (const char* tool : {"containerd", "ctr", "runc", "containerd-shim-runc-v2"}) {
      if (!onPath(tool)) {
        skip_ = std::string(tool) + " is not installed (scripts/install-deps.sh installs it)";
        return;
      }
    }
    containerd_ = new Containerd();
    setup_error_ = containerd_->start();
  }
  static void TearDownTestSuite() {
    delete containerd_;
    containerd_ = nullptr;
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_EQ(setup_error_, "") << "containerd set-up failed";
    token_file_ = containerd_->dir() + "/token";
    std::ofstream(token_file_) << "tok-" << randomHex(16) << "\n";
    chmod(token_file_.c_str(), 0600);
  }
  void TearDown() override {
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
    agent_.reset();
  }

  // Starts the agent with `mode_args` and reads its ready line.
  ::testing::AssertionResult startAgent(const std::vector<std::string>& mode_args) {
    std::vector<std::string> args = {
        "--listen", "127.0.0.1:0", "--token-file", token_file_, "--first-client-timeout", "30s"};
    args.insert(args.end(), mode_args.begin(), mode_args.end());
    agent_.emplace(args, cleanEnv(), containerd_->dir() + "/agent-" + randomHex(6) + ".log");
    auto line = agent_->readLine();
    if (!line) return ::testing::AssertionFailure() << "no ready line; log:\n" << agent_->log();
    auto ready = parseReadyLine(*line);
    if (!ready) return ::testing::AssertionFailure() << "malformed ready line: " << *line;
    ready_ = *ready;
    return ::testing::AssertionSuccess();
  }

  Result cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", ready_.fields["listen"],
                                     "--token-file", token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, cleanEnv());
  }

  Result agentOnce(const std::vector<std::string>& mode_args) {
    std::vector<std::string> argv = {SIPHON_AGENT_BIN, "--listen", "127.0.0.1:0", "--token-file",
                                     token_file_};
    argv.insert(argv.end(), mode_args.begin(), mode_args.end());
    return run(argv, cleanEnv());
  }

  static Containerd& ctd() { return *containerd_; }

  static inline std::string skip_;
  static inline std::string setup_error_;
  static inline Containerd* containerd_ = nullptr;
  std::string token_file_;
  std::optional<Agent> agent_;
  ReadyLine ready_;
};

TEST_F(ContainerdRuntimeTest, ReadyLineNamesTheTaskPidAndItsNetns) {
  ASSERT_TRUE(startAgent({"targeted", "--container-id", ctd().id(), "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket()}));
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(ctd().taskPid()));
  const uint64_t netns = netnsInodeOf(ctd().taskPid());
  ASSERT_NE(netns, 0u);
  EXPECT_EQ(ready_.fields["netns"], "net:[" + std::to_string(netns) + "]");
  EXPECT_NE(netns, netnsInodeOf(getpid())) << "ctr run gives the container its own netns";
}

TEST_F(ContainerdRuntimeTest, EnvIsTheRuntimeEnvMergedUnderTheProcessEnv) {
  ASSERT_TRUE(startAgent({"targeted", "--container-id", ctd().id(), "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket()}));
  Result r = cli({"--json", "env"});
  ASSERT_EQ(r.exit_code, 0) << r;
  // FROM_CTR_RUN: both have it, the process wins. PROC_ONLY: only the
  // process. PATH, RUNTIME_ONLY_VAR: only containerd's spec (the image's
  // config), since `env -i` cleared them from the process.
  EXPECT_EQ(r.out,
            "{\n"
            "  \"FROM_CTR_RUN\": \"from-process\",\n"
            "  \"PATH\": \"/bin\",\n"
            "  \"PROC_ONLY\": \"1\",\n"
            "  \"RUNTIME_ONLY_VAR\": \"from-image\"\n"
            "}\n");
  Result filtered = cli({"env", "--include", "RUNTIME_*"});
  ASSERT_EQ(filtered.exit_code, 0) << filtered;
  EXPECT_EQ(filtered.out, "RUNTIME_ONLY_VAR=from-image\n");
}

TEST_F(ContainerdRuntimeTest, InfoShowsContainerIdAndRuntime) {
  ASSERT_TRUE(startAgent({"targeted", "--container-id", ctd().id(), "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket()}));
  Result r = cli({"--json", "info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\"mode\": \"targeted\""));
  EXPECT_THAT(r.out, HasSubstr("\"pid\": " + std::to_string(ctd().taskPid()) + ","));
  EXPECT_THAT(r.out, HasSubstr("\"container_id\": \"" + ctd().id() + "\""));
  EXPECT_THAT(r.out, HasSubstr("\"runtime\": \"containerd\""));
  Result text = cli({"info"});
  ASSERT_EQ(text.exit_code, 0) << text;
  EXPECT_THAT(text.out, HasSubstr("container_id"));
  EXPECT_THAT(text.out, HasSubstr(ctd().id()));
}

TEST_F(ContainerdRuntimeTest, KubernetesFormPicksContainerd) {
  ASSERT_TRUE(startAgent({"targeted", "--container-id", "containerd://" + ctd().id(),
                          "--runtime-endpoint", ctd().socket()}));
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(ctd().taskPid()));
}

TEST_F(ContainerdRuntimeTest, FileOnlyInTheContainerIsReadThroughTheAgent) {
  Result help = run({SIPHON_CLI_BIN, "--help"}, cleanEnv());
  if (help.out.find("\n  fs") == std::string::npos && help.out.find(" fs ") == std::string::npos) {
    GTEST_SKIP() << "`siphon fs` is not a command of this build";
  }
  ASSERT_TRUE(startAgent({"targeted", "--container-id", ctd().id(), "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket()}));
  ASSERT_FALSE(std::filesystem::exists("/only-in-container.txt"))
      << "the test needs the file to be absent from the host";
  Result r = cli({"fs", "cat", "/only-in-container.txt"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, kFileContent);
}

TEST_F(ContainerdRuntimeTest, EphemeralModeFindsTheContainerByCgroup) {
  // On the node the agent sees every process, as an ephemeral container
  // sees its pod's: the scan of /proc/*/cgroup finds the task.
  ASSERT_TRUE(startAgent({"ephemeral", "--container-id", ctd().id()}));
  EXPECT_EQ(ready_.fields["target_pid"], std::to_string(ctd().taskPid()));
  Result r = cli({"--json", "info"});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("\"mode\": \"ephemeral\""));
  EXPECT_THAT(r.out, HasSubstr("\"container_id\": \"" + ctd().id() + "\""));
  Result env = cli({"env", "--include", "PROC_ONLY"});
  ASSERT_EQ(env.exit_code, 0) << env;
  EXPECT_EQ(env.out, "PROC_ONLY=1\n") << "ephemeral mode has the process env only";
}

TEST_F(ContainerdRuntimeTest, UnknownIdExitsThreeNamingRuntimeNamespaceAndSocket) {
  Result r = agentOnce({"targeted", "--container-id", "no-such-" + randomHex(6), "--runtime",
                        "containerd", "--runtime-endpoint", ctd().socket()});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_EQ(r.out, "") << "no ready line";
  EXPECT_THAT(r.err,
              HasSubstr("not found in containerd namespace k8s.io (" + ctd().socket() + ")"));
}

TEST_F(ContainerdRuntimeTest, OtherNamespaceDoesNotHaveIt) {
  Result r = agentOnce({"targeted", "--container-id", ctd().id(), "--runtime", "containerd",
                        "--runtime-endpoint", ctd().socket(), "--containerd-namespace", "default"});
  EXPECT_EQ(r.exit_code, 3) << r;
  EXPECT_THAT(r.err, HasSubstr("container " + ctd().id() +
                               " not found in containerd namespace "
                               "default (" +
                               ctd().socket() + ")"));
}

TEST_F(ContainerdRuntimeTest, MissingSocketExitsSevenRuntimeUnavailable) {
  const std::string none = ctd().dir() + "/none.sock";
  Result r = agentOnce({"targeted", "--container-id", ctd().id(), "--runtime", "containerd",
                        "--runtime-endpoint", none});
  EXPECT_EQ(r.exit_code, 7) << r;
  EXPECT_THAT(r.err, HasSubstr("containerd at " + none + ": no such socket"));
}

TEST_F(ContainerdRuntimeTest, EndpointWithoutRuntimeIsAUsageError) {
  Result r =
      agentOnce({"targeted", "--container-id", ctd().id(), "--runtime-endpoint", ctd().socket()});
  EXPECT_EQ(r.exit_code, 2) << r;
  EXPECT_THAT(r.err, HasSubstr("needs --runtime"));
}

}  // namespace
}  // namespace siphon
