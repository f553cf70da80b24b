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
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/containerd.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace siphon::harness;  // NOLINT: test file

constexpr char kImage[] = "docker.io/siphon-test/busybox:1";
constexpr char kFileContent[] = "siphon test image: only in the container\n";

// A private containerd (harness/containerd.h) and one running container,
// torn down by the destructor whatever state start() reached.
class Containerd {
 public:
  Containerd() : ctd_("siphon-test-" + randomHex(10)), id_(ctd_.tag() + "-ctr") {}

  // Empty on success, else what failed (the test fails with it).
  std::string start() {
    if (std::string err = ctd_.start("/tmp/siphon-ctd-XXXXXX"); !err.empty()) return err;
    const auto deadline = Clock::now() + kProcessDeadline;

    Result image = run({"bash", SIPHON_BUILD_TEST_IMAGE, dir() + "/image.tar", kImage});
    if (image.exit_code != 0) return "build-test-image.sh: " + image.err;
    Result import = ctd_.importImage(dir() + "/image.tar", kImage);
    if (import.exit_code != 0) return "ctr image import: " + import.err + ctd_.daemonLog();

    // The cgroup path carries the unique tag, so cleanup can find and remove
    // exactly what this test made.
    std::vector<std::string> run_args = {"run", "-d", "--null-io"};
    const std::vector<std::string> placement = ctd_.placement(id_);
    run_args.insert(run_args.end(), placement.begin(), placement.end());
    run_args.insert(run_args.end(),
                    {"--env", "FROM_CTR_RUN=1", kImage, id_, "sh", "-c",
                     "exec env -i FROM_CTR_RUN=from-process PROC_ONLY=1 /bin/sleep 600"});
    Result started = ctr(run_args);
    ctd_.addContainer(id_);
    if (started.exit_code != 0) return "ctr run: " + started.err + ctd_.daemonLog();

    // The task's pid as ctr sees it: an independent answer to compare the
    // agent's with.
    task_pid_ = ctd_.task(id_).first;
    if (task_pid_ <= 0) {
      return "no pid for " + id_ + " in `ctr task ls`:\n" + ctr({"task", "ls"}).out;
    }
    // sh execs env, which execs sleep (same pid): wait for the last one, so
    // /proc/PID/environ is the one the test expects.
    const std::string comm = "/proc/" + std::to_string(task_pid_) + "/comm";
    while (readFile(comm) != "sleep\n") {
      if (Clock::now() >= deadline) return "task " + std::to_string(task_pid_) + " never ran sleep";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return "";
  }

  Result ctr(const std::vector<std::string>& args) const { return ctd_.ctr(args); }

  const std::string& dir() const { return ctd_.dir(); }
  const std::string& socket() const { return ctd_.socket(); }
  const std::string& id() const { return id_; }
  pid_t taskPid() const { return task_pid_; }

 private:
  PrivateContainerd ctd_;
  std::string id_;
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
    skip_ = missingContainerdTool();
    if (!skip_.empty()) return;
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
