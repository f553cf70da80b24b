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

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/traffic.h"
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

  // Runs another container `id` of the image, placed as the suite's (so
  // teardown removes it), with `options` before the image and `command`.
  Result runContainer(const std::string& id, const std::vector<std::string>& options,
                      const std::vector<std::string>& command) {
    std::vector<std::string> args = {"run", "-d", "--null-io"};
    const std::vector<std::string> placement = ctd_.placement(id);
    args.insert(args.end(), placement.begin(), placement.end());
    args.insert(args.end(), options.begin(), options.end());
    args.push_back(kImage);
    args.push_back(id);
    args.insert(args.end(), command.begin(), command.end());
    ctd_.addContainer(id);
    return ctr(args);
  }
  // The task's pid and status, as `ctr task ls` shows them.
  std::pair<pid_t, std::string> task(const std::string& id) const { return ctd_.task(id); }
  // Kills the container's task and starts a new one under the same ID, as
  // the kubelet restarts a container (same spec, same snapshot, same
  // namespaces it joins). Empty on success, else what failed.
  std::string restartTask(const std::string& id) {
    Result kill = ctr({"task", "kill", "-s", "SIGKILL", id});
    if (kill.exit_code != 0) return "ctr task kill: " + kill.err;
    const auto deadline = Clock::now() + kProcessDeadline;
    while (task(id).second != "STOPPED") {
      if (Clock::now() >= deadline) return "the task never stopped: " + ctr({"task", "ls"}).out;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Result del = ctr({"task", "delete", id});
    if (del.exit_code != 0) return "ctr task delete: " + del.err;
    Result start = ctr({"task", "start", "-d", "--null-io", id});
    if (start.exit_code != 0) return "ctr task start: " + start.err + ctd_.daemonLog(4000);
    return "";
  }

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

// A container `id` of `ctd` in the network namespace `pod` (joined as a pod's
// containers join its sandbox's) whose tasks say in /run/who whether they
// are its first or a later one: /run is a tmpfs of each task's own
// (containerd's default spec), so what is read there is that task's root;
// /started, in the snapshot, tells a later task from the first. Its first
// task's pid, 0 (with a failure) when it did not start.
pid_t startWhoContainer(Containerd& ctd, const std::string& id, const NetNs& pod) {
  Result started = ctd.runContainer(
      id, {"--with-ns", "network:/var/run/netns/" + pod.name()},
      {"sh", "-c",
       "if [ -e /started ]; then echo second > /run/who; else touch /started; "
       "echo first > /run/who; fi; exec sleep 600"});
  EXPECT_EQ(started.exit_code, 0) << started;
  return started.exit_code == 0 ? ctd.task(id).first : 0;
}

// A container restarted in its pod (issue 22): the kubelet kills the task
// and starts a new one under the same ID, in the pod's network namespace
// (here one the test made, joined with --with-ns as a pod's pause
// container's is), with a new PID and a new root. The agent adopts it: the
// steal goes on for new connections, files come from the new root, the
// CLI says so.
TEST_F(ContainerdRuntimeTest, ARestartedContainerKeepsItsStealAndServesItsNewRoot) {
  NetNs pod, client;
  PodLink link;
  ASSERT_TRUE(linkPodToClient(pod, client, "rs", &link));
  const std::string id = ctd().id() + "-restarts";
  const pid_t first = startWhoContainer(ctd(), id, pod);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(startAgent({"targeted", "--container-id", id, "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket(), "--target-restart-timeout",
                          "60s"}));
  ASSERT_EQ(ready_.fields["target_pid"], std::to_string(first));
  uint16_t local_port = 0;
  Acceptor local(listenOnLoopback(&local_port, 64), 10, [](int fd) {
    const std::string answer = "stolen\n";
    (void)writeAll(fd, answer.data(), answer.size());
  });
  Proc steal({SIPHON_CLI_BIN, "--agent", ready_.fields["listen"], "--token-file", token_file_,
              "steal", "--port", "80", "--to", "127.0.0.1:" + std::to_string(local_port)},
             cleanEnv());
  ASSERT_TRUE(steal.readUntil([](const std::string&, const std::string& err) {
    return err.find("stealing port 80") != std::string::npos;
  })) << steal.err;
  // A connection to the pod's port 80 from the client's namespace: what it
  // reads until the end.
  auto fetch = [&] {
    Fd fd(socketInNetns(client.name(), AF_INET, SOCK_STREAM));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(80);
    inet_pton(AF_INET, link.pod_ip.c_str(), &to.sin_addr);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      return std::string("connect: ") + std::strerror(errno);
    }
    std::string got;
    (void)readAll(fd.get(), &got);
    return got;
  };
  EXPECT_EQ(fetch(), "stolen\n");
  Result who = cli({"fs", "cat", "/run/who"});
  ASSERT_EQ(who.exit_code, 0) << who;
  EXPECT_EQ(who.out, "first\n");

  ASSERT_EQ(ctd().restartTask(id), "");
  const pid_t second = ctd().task(id).first;
  ASSERT_GT(second, 0);
  ASSERT_NE(second, first);
  ASSERT_TRUE(steal.readUntil([](const std::string&, const std::string& err) {
    return err.find("target restarted") != std::string::npos;
  })) << steal.err << "\n--- agent log\n"
      << agent_->log();
  EXPECT_THAT(steal.err, HasSubstr("target restarted: pid " + std::to_string(first) + " -> " +
                                   std::to_string(second) + " (container " + id + ")"));
  EXPECT_THAT(steal.err, HasSubstr("the steal goes on"));
  // New connections are still stolen; files and info are the new task's.
  EXPECT_EQ(fetch(), "stolen\n");
  who = cli({"fs", "cat", "/run/who"});
  ASSERT_EQ(who.exit_code, 0) << who;
  EXPECT_EQ(who.out, "second\n") << "the file came from the old task's root";
  Result info = cli({"--json", "info"});
  EXPECT_THAT(info.out, HasSubstr("\"pid\": " + std::to_string(second) + ","));
  EXPECT_THAT(agent_->log(), HasSubstr("target_restarted"));
  steal.signal(SIGINT);
  EXPECT_EQ(steal.finish(), 0) << steal.err;
  ctd().ctr({"task", "kill", "-s", "SIGKILL", id});
}

// Ephemeral mode follows a restart too: the next process in the
// container's cgroup (the agent shares the pod's PID namespace).
TEST_F(ContainerdRuntimeTest, EphemeralModeFollowsARestartedContainer) {
  NetNs pod;
  const std::string id = ctd().id() + "-eph";
  const pid_t first = startWhoContainer(ctd(), id, pod);
  ASSERT_GT(first, 0);
  ASSERT_TRUE(startAgent({"ephemeral", "--container-id", id}));
  ASSERT_EQ(ready_.fields["target_pid"], std::to_string(first));
  // A session open across the restart hears of it through `info` after.
  Result who = cli({"fs", "cat", "/run/who"});
  EXPECT_EQ(who.out, "first\n") << who;
  ASSERT_EQ(ctd().restartTask(id), "");
  const pid_t second = ctd().task(id).first;
  const auto deadline = Clock::now() + kProcessDeadline;
  while (agent_->log().find("target_restarted") == std::string::npos && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_THAT(agent_->log(), HasSubstr("target_restarted pid=" + std::to_string(second)));
  who = cli({"fs", "cat", "/run/who"});
  EXPECT_EQ(who.out, "second\n") << who;
  Result info = cli({"--json", "info"});
  EXPECT_THAT(info.out, HasSubstr("\"pid\": " + std::to_string(second) + ","));
  ctd().ctr({"task", "kill", "-s", "SIGKILL", id});
}

// The container came back in another network namespace (its pod was
// recreated; here runc gives every task a namespace of its own): nothing
// the agent steered there reaches anyone. It drains and exits 8.
TEST_F(ContainerdRuntimeTest, AContainerBackInAnotherNetnsEndsTheAgentWithEight) {
  const std::string id = ctd().id() + "-newns";
  Result started = ctd().runContainer(id, {}, {"sleep", "600"});
  ASSERT_EQ(started.exit_code, 0) << started;
  ASSERT_TRUE(startAgent({"targeted", "--container-id", id, "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket(), "--drain-timeout", "2s"}));
  ASSERT_EQ(ctd().restartTask(id), "");
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 8) << agent_->log();
  EXPECT_THAT(agent_->log(), HasSubstr("target_netns_gone"));
  ctd().ctr({"task", "kill", "-s", "SIGKILL", id});
}

// No new process within --target-restart-timeout: the agent exits 0, as it
// does at once with --target-restart-timeout 0 or a bare --pid.
TEST_F(ContainerdRuntimeTest, AContainerThatDoesNotComeBackEndsTheAgent) {
  const std::string id = ctd().id() + "-gone";
  Result started = ctd().runContainer(id, {}, {"sleep", "600"});
  ASSERT_EQ(started.exit_code, 0) << started;
  ASSERT_TRUE(startAgent({"targeted", "--container-id", id, "--runtime", "containerd",
                          "--runtime-endpoint", ctd().socket(), "--target-restart-timeout",
                          "1s"}));
  Result kill = ctd().ctr({"task", "kill", "-s", "SIGKILL", id});
  ASSERT_EQ(kill.exit_code, 0) << kill;
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  EXPECT_THAT(agent_->log(), HasSubstr("target_not_back"));
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
