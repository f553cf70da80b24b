// `siphon --target ...`, the real binary, against a cluster in a directory:
// tests/fakes/kubectl/fake_kubectl.py answers kubectl's calls and runs each
// agent "pod" as a real `siphon-agent targetless` on 127.0.0.1. The
// scenarios of issue 41 that need no real cluster: a session by target and
// what it leaves behind (nothing), each failure's one line, two sessions on
// one agent, Ctrl-C, a port-forward lost mid-download, the config file, and
// kubectl-siphon. (The same against the local cluster: tests/cluster.)
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#define SIPHON_AGENT_BIN SIPHON_AGENT_PATH
#include "tests/fakes/cli_process.h"
#include "tests/fakes/eventually.h"

namespace siphon::cli {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json pod(const std::string& name, const std::string& ns, const json& labels,
         const std::vector<std::string>& containers) {
  json statuses = json::array();
  json specs = json::array();
  int n = 0;
  for (const auto& c : containers) {
    specs.push_back({{"name", c}, {"image", "app:1"}});
    statuses.push_back({{"name", c},
                        {"image", "app:1"},
                        {"ready", true},
                        {"containerID", "containerd://" + name + std::to_string(n++)},
                        {"state", {{"running", json::object()}}}});
  }
  return {{"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", ns},
            {"uid", "uid-" + name},
            {"labels", labels},
            {"creationTimestamp", "2026-12-07T10:00:00Z"}}},
          {"spec", {{"nodeName", "node-1"}, {"containers", specs}}},
          {"status",
           {{"phase", "Running"},
            {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})},
            {"containerStatuses", statuses}}}};
}

class KubeCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("siphon-kube-cli-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "state");
    ::setenv("FAKE_KUBE_STATE", (dir_ / "state").c_str(), 1);
    ::setenv("FAKE_KUBE_AGENT", SIPHON_AGENT_PATH, 1);
    ::unsetenv("FAKE_PF_CUT_AFTER_BYTES");
    ::unsetenv("FAKE_AGENT_SESSION_GRACE");
    json c = {
        {"pods", json::object()},
        {"deployments", json::object()},
        {"secrets", json::object()},
        {"jobs", json::object()},
        {"namespaces",
         {{"default", {{"kind", "Namespace"}, {"metadata", {{"name", "default"}}}}},
          {"shop",
           {{"kind", "Namespace"},
            {"metadata",
             {{"name", "shop"},
              {"labels", {{"pod-security.kubernetes.io/enforce", "baseline"}}}}}}},
          {"siphon",
           {{"kind", "Namespace"},
            {"metadata",
             {{"name", "siphon"},
              {"labels", {{"pod-security.kubernetes.io/enforce", "privileged"}}}}}}}}},
        {"nodes",
         {{"node-1", {{"kind", "Node"}, {"metadata", {{"name", "node-1"}, {"uid", "node-uid"}}}}}}},
        {"forbidden", json::array()},
        {"bad_images", json::array({"registry.example/nope:1"})},
        {"exiting_images", json::array({"registry.example/exits:1"})}};
    for (const char* n : {"web-a", "web-b"}) {
      c["pods"][std::string("default/") + n] =
          pod(n, "default", {{"app", "web"}}, {"istio-proxy", "app"});
    }
    c["pods"]["shop/shop-0"] = pod("shop-0", "shop", {{"app", "shop"}}, {"app"});
    c["deployments"]["default/web"] = {
        {"kind", "Deployment"},
        {"metadata", {{"name", "web"}, {"namespace", "default"}}},
        {"spec", {{"selector", {{"matchLabels", {{"app", "web"}}}}}}}};
    cluster_ = c;
    save();
  }
  void TearDown() override {
    // Agents the fake started and a failed test left.
    for (const auto& e : fs::directory_iterator(dir_ / "state")) {
      if (e.path().filename().string().rfind("pid-", 0) != 0) continue;
      std::ifstream in(e.path());
      pid_t pid = 0;
      if (in >> pid && pid > 0) ::kill(pid, SIGKILL);
    }
    fs::remove_all(dir_);
  }

  void save() { std::ofstream(dir_ / "state" / "cluster.json") << cluster_.dump(1); }
  json load() {
    std::ifstream in(dir_ / "state" / "cluster.json");
    return json::parse(in);
  }
  // What Siphon created that is still there.
  size_t leftovers() {
    json c = load();
    size_t agent_pods = 0;
    for (auto& [k, p] : c["pods"].items()) {
      if (k.find("siphon-agent") != std::string::npos) ++agent_pods;
    }
    return c["jobs"].size() + c["secrets"].size() + agent_pods;
  }
  bool agentsRunning() {
    for (const auto& e : fs::directory_iterator(dir_ / "state")) {
      if (e.path().filename().string().rfind("pid-", 0) != 0) continue;
      std::ifstream in(e.path());
      pid_t pid = 0;
      if (!(in >> pid) || pid <= 0) continue;
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string s;
      std::getline(stat, s);
      // Gone, or a zombie of the fake's (its parent exited).
      if (!s.empty() && s.find(") Z") == std::string::npos) return true;
    }
    return false;
  }

  std::vector<std::string> siphon(std::vector<std::string> args, const char* bin = SIPHON_CLI_BIN) {
    std::vector<std::string> argv = {bin, "--kubectl", FAKE_KUBECTL, "--no-config"};
    if (std::find(args.begin(), args.end(), "--agent-image") == args.end()) {
      argv.insert(argv.end(), {"--agent-image", "img:1"});
    }
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  fs::path dir_;
  json cluster_;
};

TEST_F(KubeCommandTest, ASessionByTargetLeavesNothingBehind) {
  fakes::CliProcess p(siphon({"--target", "deploy/web", "--agent-namespace", "siphon", "info"}));
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_NE(p.out.find("sessions          1"), std::string::npos) << p.out;
  for (const char* line :
       {"siphon: resolving deployment/web\n",
        "siphon: target deployment/web: pod web-a (2 of 2 Ready), container app on node-1\n",
        "(job) in namespace siphon\n", "siphon: scheduled on node-1\n",
        "siphon: agent ready after ", "siphon: removed agent siphon-agent-"}) {
    EXPECT_NE(p.err.find(line), std::string::npos) << line << "\n" << p.err;
  }
  EXPECT_EQ(leftovers(), 0u) << load().dump(1);
  EXPECT_TRUE(fakes::eventually([&] { return !agentsRunning(); }, std::chrono::seconds(30)));
}

TEST_F(KubeCommandTest, JsonPhasesAreEvents) {
  fakes::CliProcess p(
      siphon({"--json", "--target", "pod/web-b", "--agent-namespace", "siphon", "info"}));
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_NE(p.err.find(R"({"event":"kube","phase":"resolved")"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find(R"({"event":"kube","phase":"ready")"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find(R"("phase":"removed")"), std::string::npos) << p.err;
}

TEST_F(KubeCommandTest, EachFailureIsOneLineAndCreatesNothing) {
  struct Case {
    std::vector<std::string> args;
    std::string line;
    int code;
  } cases[] = {
      {{"--target", "pod/shop-0", "-n", "shop"},
       "siphon: namespace shop enforces Pod Security \"baseline\"; the agent (job) needs "
       "\"privileged\"",
       1},
      {{"--target", "deploy/web", "--container", "api", "--agent-namespace", "siphon"},
       "siphon: pod/web-a has no container 'api'; its containers: istio-proxy, app\n",
       1},
      {{"--target", "deploy/gone"},
       "siphon: deployment/gone not found in the current namespace\n",
       1},
      {{"--target", "svc/web"}, "siphon: --target svc/web: unknown kind 'svc'", 2},
      {{"--target", "deploy/web", "--agent-namespace", "siphon", "--agent-image",
        "registry.example/nope:1"},
       "siphon: the agent image registry.example/nope:1 cannot be pulled on node-1 (ErrImagePull",
       1},
      {{"--target", "deploy/web", "--agent-namespace", "siphon", "--agent-image",
        "registry.example/exits:1"},
       "siphon: the agent exited (Error, exit code 2); its last log lines: ",
       1},
  };
  for (const auto& c : cases) {
    auto args = c.args;
    args.push_back("info");
    auto argv = siphon(args);
    fakes::CliProcess p(argv);
    EXPECT_EQ(p.finish(), c.code) << p.err;
    EXPECT_NE(p.err.find(c.line), std::string::npos) << c.line << "\n" << p.err;
    // The failure is said once.
    EXPECT_EQ(p.err.find(c.line), p.err.rfind(c.line)) << p.err;
    EXPECT_EQ(leftovers(), 0u) << c.line << "\n" << load().dump(1);
  }
  EXPECT_TRUE(fakes::eventually([&] { return !agentsRunning(); }, std::chrono::seconds(30)));

  cluster_["forbidden"] = json::array({"create jobs.batch"});
  save();
  fakes::CliProcess p(siphon({"--target", "deploy/web", "--agent-namespace", "siphon", "info"}));
  EXPECT_EQ(p.finish(), 1);
  EXPECT_NE(p.err.find("siphon: forbidden: you may not create jobs.batch in namespace siphon (to "
                       "create the agent's Job); the minimal Role is in images/k8s/rbac.yaml"),
            std::string::npos)
      << p.err;

  fakes::CliProcess missing({SIPHON_CLI_BIN, "--kubectl", "/nonexistent/kubectl", "--no-config",
                             "--target", "deploy/web", "info"});
  EXPECT_EQ(missing.finish(), 1);
  EXPECT_NE(missing.err.find("siphon: cannot run kubectl: /nonexistent/kubectl does not exist"),
            std::string::npos)
      << missing.err;
}

TEST_F(KubeCommandTest, TwoSessionsShareOneAgentAndCtrlCLeavesNothing) {
  fakes::CliProcess first(siphon(
      {"--target", "deploy/web", "--agent-namespace", "siphon", "forward", "-L", "0:127.0.0.1:9"}));
  ASSERT_TRUE(first.readUntil([&] { return first.err.find("forwarding") != std::string::npos; }))
      << first.err;
  fakes::CliProcess second(
      siphon({"--target", "deploy/web", "--agent-namespace", "siphon", "info"}));
  EXPECT_EQ(second.finish(), 0) << second.err;
  EXPECT_NE(second.err.find("siphon: reusing the running agent siphon-agent-"), std::string::npos)
      << second.err;
  EXPECT_NE(second.out.find("sessions          2"), std::string::npos) << second.out;
  // The reusing session leaves the agent alone.
  EXPECT_EQ(second.err.find("removed"), std::string::npos) << second.err;
  EXPECT_EQ(load()["jobs"].size(), 1u);
  first.signal(SIGINT);
  EXPECT_EQ(first.finish(), 0) << first.err;
  EXPECT_NE(first.err.find("siphon: removed agent siphon-agent-"), std::string::npos) << first.err;
  EXPECT_EQ(leftovers(), 0u) << load().dump(1);
  EXPECT_TRUE(fakes::eventually([&] { return !agentsRunning(); }, std::chrono::seconds(30)));
}

TEST_F(KubeCommandTest, APortForwardLostMidDownloadResumesByteExact) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "the agent's file helper takes the file's owner's identity (setgroups): root "
                    "only; kube_port_forward_test covers the resume without root";
  }
  // The targetless agent's root is this machine's: a file of the test's.
  std::string big = fakes::pattern(41, 3 * 1024 * 1024 + 5);
  std::ofstream(dir_ / "big") << big;
  ::setenv("FAKE_PF_CUT_AFTER_BYTES", "1000000", 1);
  fakes::CliProcess p(siphon({"--target", "deploy/web", "--agent-namespace", "siphon", "fs", "cat",
                              (dir_ / "big").string()}));
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_TRUE(p.out == big) << "got " << p.out.size() << " bytes of " << big.size();
  std::ifstream calls(dir_ / "state" / "calls.log");
  std::stringstream ss;
  ss << calls.rdbuf();
  size_t forwards = 0;
  for (size_t at = 0; (at = ss.str().find("port-forward", at)) != std::string::npos; ++at) {
    ++forwards;
  }
  EXPECT_GE(forwards, 2u) << ss.str();
  EXPECT_EQ(p.err.find("failed"), std::string::npos) << p.err;
  EXPECT_EQ(leftovers(), 0u);
}

TEST_F(KubeCommandTest, TheConfigFileDrivesASessionAndFlagsWin) {
  fs::create_directories(dir_ / "project" / "src");
  std::ofstream(dir_ / "project" / ".siphon.json")
      << "{\n  \"target\": \"deploy/web\",\n  \"agent-namespace\": \"siphon\",\n"
         "  \"kubectl\": \""
      << FAKE_KUBECTL << "\",\n  \"agent-image\": \"img:1\"\n}\n";
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_ / "project" / "src");
  {
    fakes::CliProcess p({SIPHON_CLI_BIN, "info"});
    EXPECT_EQ(p.finish(), 0) << p.err;
    EXPECT_NE(p.err.find("siphon: target deployment/web: pod web-a"), std::string::npos) << p.err;
  }
  {
    fakes::CliProcess p({SIPHON_CLI_BIN, "--target", "pod/web-b", "info"});
    EXPECT_EQ(p.finish(), 0) << p.err;
    EXPECT_NE(p.err.find("siphon: target pod/web-b"), std::string::npos) << p.err;
  }
  {
    // --agent on the command line wins over the file's target.
    fakes::CliProcess p({SIPHON_CLI_BIN, "--agent", fakes::closedAddress(), "info"});
    EXPECT_EQ(p.finish(), 3) << p.err;
    EXPECT_NE(p.err.find("cannot reach the agent"), std::string::npos) << p.err;
  }
  std::ofstream(dir_ / "project" / ".siphon.json")
      << "{\n  \"target\": \"deploy/web\",\n  \"steal\": {\n    \"prot\": [8080]\n  }\n}\n";
  {
    fakes::CliProcess p({SIPHON_CLI_BIN, "info"});
    EXPECT_EQ(p.finish(), 2) << p.err;
    EXPECT_NE(p.err.find("siphon: " + (dir_ / "project" / ".siphon.json").string() +
                         ":4: key 'prot': no such option of siphon steal"),
              std::string::npos)
        << p.err;
  }
  fs::current_path(cwd);
}

TEST_F(KubeCommandTest, KubectlSiphonIsTheSameProgram) {
  const fs::path plugin = fs::path(SIPHON_CLI_BIN).parent_path() / "kubectl-siphon";
  ASSERT_TRUE(fs::exists(plugin));
  fakes::CliProcess help({plugin.string(), "--help"});
  EXPECT_EQ(help.finish(), 0);
  EXPECT_NE(help.out.find("Usage: kubectl siphon"), std::string::npos) << help.out;
  fakes::CliProcess p(
      siphon({"--target", "deploy/web", "--agent-namespace", "siphon", "info"}, plugin.c_str()));
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_NE(p.out.find("agent_version"), std::string::npos);
}

TEST_F(KubeCommandTest, AKilledClisAgentExitsOnItsOwnAndAgentsCleanRemovesTheRest) {
  ::setenv("FAKE_AGENT_SESSION_GRACE", "1s", 1);
  fakes::CliProcess first(siphon({"--target", "deploy/web", "--agent-namespace", "siphon",
                                  "--agent-idle-timeout", "2s", "forward", "-L", "0:127.0.0.1:9"}));
  ASSERT_TRUE(first.readUntil([&] { return first.err.find("forwarding") != std::string::npos; }))
      << first.err;
  {
    fakes::CliProcess list(siphon({"--json", "agents", "-n", "siphon"}));
    EXPECT_EQ(list.finish(), 0) << list.err;
    json rows = json::parse(list.out, nullptr, false);
    ASSERT_TRUE(rows.is_array()) << list.out;
    ASSERT_EQ(rows.size(), 1u) << list.out;
    EXPECT_EQ(rows[0]["mode"], "job");
    EXPECT_EQ(rows[0]["sessions"], 1);
    EXPECT_EQ(rows[0]["target"], "default/pod/web-a/app");
    EXPECT_EQ(rows[0]["version"], "0.1.0");
  }
  {
    fakes::CliProcess list(siphon({"agents", "-n", "siphon"}));
    EXPECT_EQ(list.finish(), 0) << list.err;
    // One agent, its target, node, mode and phase.
    EXPECT_NE(list.out.find("NAMESPACE\tAGENT\tTARGET"), std::string::npos) << list.out;
    EXPECT_NE(list.out.find("default/pod/web-a/app\tnode-1\tjob\tRunning\t"), std::string::npos)
        << list.out;
    // (Its sessions: the JSON listing's, above, may still be detached on the
    // agent, counted until its grace; the count is checked there.)
    EXPECT_NE(list.out.find("\t0.1.0\n"), std::string::npos) << list.out;
  }
  {
    // In use: clean leaves it.
    fakes::CliProcess clean(siphon({"agents", "-n", "siphon", "clean"}));
    EXPECT_EQ(clean.finish(), 0) << clean.err;
    EXPECT_EQ(clean.out, "") << clean.out;
    EXPECT_EQ(load()["jobs"].size(), 1u);
  }
  first.signal(SIGKILL);
  first.finish();
  // Its session's grace (1 s), then the agent's idle timeout (2 s): it ends
  // by itself.
  EXPECT_TRUE(fakes::eventually([&] { return !agentsRunning(); }, std::chrono::seconds(30)));
  EXPECT_EQ(load()["jobs"].size(), 1u);  // the Job's TTL, or `agents clean`
  fakes::CliProcess clean(siphon({"agents", "-n", "siphon", "clean"}));
  EXPECT_EQ(clean.finish(), 0) << clean.err;
  EXPECT_NE(clean.out.find("removed siphon/siphon-agent-"), std::string::npos) << clean.out;
  EXPECT_EQ(leftovers(), 0u) << load().dump(1);
}

TEST_F(KubeCommandTest, ExecKeepsItsPortForwardWhenTheProgramEnds) {
  if (::geteuid() != 0) GTEST_SKIP() << "the fake cluster's agent serves exec's files as root only";
  // exec kills what the program leaves behind when it ends; siphon's own
  // kubectl port-forward is not the program's (it lives outside the
  // program's namespaces): the session ends over it, not over a new one.
  fakes::CliProcess p(
      siphon({"--target", "deploy/web", "--agent-namespace", "siphon", "exec", "--local-dns",
              "--no-target-env", "--", "/bin/sh", "-c", "echo from-the-program"}));
  EXPECT_EQ(p.finish(), 0) << p.err;
  EXPECT_NE(p.out.find("from-the-program"), std::string::npos) << p.out << p.err;
  std::ifstream calls(dir_ / "state" / "calls.log");
  std::stringstream ss;
  ss << calls.rdbuf();
  size_t forwards = 0;
  for (size_t at = 0; (at = ss.str().find("port-forward", at)) != std::string::npos; ++at) {
    ++forwards;
  }
  EXPECT_EQ(forwards, 1u) << ss.str() << p.err;
  EXPECT_EQ(leftovers(), 0u);
}

TEST_F(KubeCommandTest, EphemeralAndTargetlessAgents) {
  {
    // shop enforces baseline: an ephemeral agent (it lives in the target's
    // namespace) is refused before anything is made, saying what works.
    fakes::CliProcess p(
        siphon({"--target", "pod/shop-0", "-n", "shop", "--agent-mode", "ephemeral", "info"}));
    EXPECT_EQ(p.finish(), 1);
    EXPECT_NE(p.err.find("use --agent-mode job with --agent-namespace NS"), std::string::npos)
        << p.err;
  }
  {
    fakes::CliProcess p(siphon({"--target", "pod/web-b", "--agent-mode", "ephemeral", "info"}));
    EXPECT_EQ(p.finish(), 0) << p.err;
    EXPECT_NE(p.err.find("(ephemeral) in namespace default"), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("siphon: removed the token of agent siphon-agent-"), std::string::npos)
        << p.err;
    json c = load();
    ASSERT_EQ(c["pods"]["default/web-b"]["spec"]["ephemeralContainers"].size(), 1u);
    EXPECT_EQ(c["pods"]["default/web-b"]["spec"]["ephemeralContainers"][0]["targetContainerName"],
              "app");
    EXPECT_EQ(c["secrets"].size(), 0u);
  }
  {
    fakes::CliProcess p(
        siphon({"--agent-mode", "targetless", "--agent-namespace", "siphon", "info"}));
    EXPECT_EQ(p.finish(), 0) << p.err;
    EXPECT_NE(p.out.find("target            targetless"), std::string::npos) << p.out;
    EXPECT_NE(p.err.find("(targetless) in namespace siphon"), std::string::npos) << p.err;
    EXPECT_EQ(leftovers(), 0u) << load().dump(1);
  }
  {
    fakes::CliProcess p(siphon({"--agent-mode", "targetless", "--target", "deploy/web", "info"}));
    EXPECT_EQ(p.finish(), 2);
    EXPECT_NE(p.err.find("--agent-mode targetless takes no --target"), std::string::npos) << p.err;
  }
}

}  // namespace
}  // namespace siphon::cli
