// Least privilege as root: the start-up drop applied in a forked child (and
// what a root-owned program it then runs gets), and the real siphon-agent's
// sets read from /proc/PID/status in each mode, backend and --fs-mode,
// also when it starts with less than it asks for. Without root every test
// skips with the reason. The features working with these sets are checked
// by the other privileged tests, which run the same agent binary.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/common/capabilities.h"
#include "tests/privileged/harness/pod_harness.h"

namespace siphon::agent::caps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: drops capabilities a non-root process does not have, and runs siphon-agent "
    "against a process in a network namespace of its own";

// CapInh, CapPrm, CapEff, CapBnd and CapAmb of a /proc/PID/status text.
std::map<std::string, CapSet> capLines(const std::string& status) {
  std::map<std::string, CapSet> out;
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Cap", 0) != 0) continue;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    out[line.substr(0, colon)] = std::stoull(line.substr(colon + 1), nullptr, 16);
  }
  return out;
}

std::string show(CapSet set) { return "{" + formatCapSet(set) + "}"; }

// The sets of a root-owned program (cat) run from a forked child after
// `before_exec`, which returns false to abandon the child. `note` gets what
// the child wrote to the fd it is given before the exec.
std::map<std::string, CapSet> setsAfterExec(const std::function<bool(int)>& before_exec,
                                            std::string* note = nullptr) {
  auto [out_r, out_w] = makePipe();
  auto [note_r, note_w] = makePipe();
  pid_t pid = fork();
  if (pid == 0) {
    // The test process has one thread here: what the drop requires.
    dup2(out_w.get(), 1);
    if (!before_exec(note_w.get())) _exit(3);
    execl("/bin/cat", "cat", "/proc/self/status", nullptr);
    _exit(127);
  }
  Child child(pid);
  out_w.reset();
  note_w.reset();
  std::string text, noted;
  char buf[4096];
  for (ssize_t n; (n = read(out_r.get(), buf, sizeof buf)) > 0;) text.append(buf, n);
  for (ssize_t n; (n = read(note_r.get(), buf, sizeof buf)) > 0;) noted.append(buf, n);
  EXPECT_EQ(child.waitUntil(Clock::now() + kProcessDeadline), 0) << noted;
  if (note) *note = noted;
  return capLines(text);
}

Plan planFor(TargetMode mode, FsMode fs, std::string backend, std::string iptables) {
  auto plan = planCapabilities(Needs{mode, fs, std::move(backend), std::move(iptables), 0});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : Plan{};
}

bool dropAndNote(const Plan& plan, int fd) {
  auto r = dropCapabilities(plan);
  if (!r.ok()) {
    dprintf(fd, "drop failed: %s", std::string(r.status().message()).c_str());
    return false;
  }
  dprintf(fd, "kept=%s missing=%s bounding=%d securebits=%d warnings=%zu",
          formatCapSet(r->kept).c_str(), formatCapSet(r->missing).c_str(), r->bounding_dropped,
          r->securebits_set, r->warnings.size());
  return true;
}

class CapsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    auto sets = currentSets();
    ASSERT_TRUE(sets.ok()) << sets.status();
    if ((sets->permitted & bit(CAP_SETPCAP)) == 0) {
      GTEST_SKIP() << "root without CAP_SETPCAP: cannot test the bounding set drop";
    }
  }
};

TEST_F(CapsTest, ARootProgramRunAfterTheDropGetsOnlyTheAmbientSet) {
  const Plan plan = planFor(TargetMode::kTargeted, FsMode::kReadOnly, "auto", "auto");
  std::string note;
  auto sets = setsAfterExec(
      [&](int fd) {
        if (!dropAndNote(plan, fd)) return false;
        raiseAmbient(kIptablesAmbient);
        return true;
      },
      &note);
  EXPECT_THAT(note, HasSubstr("bounding=1 securebits=1 warnings=0")) << note;
  EXPECT_THAT(note, HasSubstr("missing= ")) << note;
  // NOROOT: uid 0 exec'ing a root-owned binary gets no full set, only the
  // ambient capabilities (permitted = effective = ambient).
  EXPECT_EQ(sets["CapEff"], kIptablesAmbient) << show(sets["CapEff"]);
  EXPECT_EQ(sets["CapPrm"], kIptablesAmbient) << show(sets["CapPrm"]);
  EXPECT_EQ(sets["CapAmb"], kIptablesAmbient) << show(sets["CapAmb"]);
  EXPECT_EQ(sets["CapInh"], plan.inheritable) << show(sets["CapInh"]);
  EXPECT_EQ(sets["CapBnd"], plan.keep) << show(sets["CapBnd"]);
}

TEST_F(CapsTest, WithoutAmbientCapabilitiesARootProgramGetsNothing) {
  const Plan plan = planFor(TargetMode::kTargetless, FsMode::kReadWrite, "iptables", "nft");
  auto sets = setsAfterExec([&](int fd) { return dropAndNote(plan, fd); });
  EXPECT_EQ(sets["CapEff"], 0u) << show(sets["CapEff"]);
  EXPECT_EQ(sets["CapPrm"], 0u) << show(sets["CapPrm"]);
  EXPECT_EQ(sets["CapAmb"], 0u) << show(sets["CapAmb"]);
  EXPECT_EQ(sets["CapBnd"], plan.keep) << show(sets["CapBnd"]);
}

TEST_F(CapsTest, APartialStartingSetIsReportedNotAnError) {
  const Plan plan = planFor(TargetMode::kTargeted, FsMode::kReadOnly, "sk_lookup", "auto");
  auto before = currentSets();
  ASSERT_TRUE(before.ok());
  std::string note;
  auto sets = setsAfterExec(
      [&](int fd) {
        // As in a container given neither CAP_SETPCAP nor CAP_SYS_PTRACE.
        const CapSet without = ~(bit(CAP_SETPCAP) | bit(CAP_SYS_PTRACE));
        __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct d[2] = {};
        for (int i = 0; i < 2; ++i) {
          d[i].effective = static_cast<uint32_t>((before->effective & without) >> (32 * i));
          d[i].permitted = static_cast<uint32_t>((before->permitted & without) >> (32 * i));
          d[i].inheritable = static_cast<uint32_t>((before->inheritable & without) >> (32 * i));
        }
        if (syscall(SYS_capset, &h, d) != 0) {
          dprintf(fd, "capset: %s", strerror(errno));
          return false;
        }
        if (!dropAndNote(plan, fd)) return false;
        raiseAmbient(kIptablesAmbient);
        return true;
      },
      &note);
  EXPECT_THAT(note, HasSubstr("missing=CAP_SYS_PTRACE bounding=0 securebits=0 warnings=1")) << note;
  // Only dropped: the bounding set stayed (no CAP_SETPCAP), and so did root's
  // exec rule, which gives cat the whole bounding set.
  EXPECT_TRUE(sets["CapBnd"] & bit(CAP_SYS_MODULE)) << show(sets["CapBnd"]);
  EXPECT_TRUE(sets["CapEff"] & bit(CAP_SYS_MODULE)) << show(sets["CapEff"]);
}

// ------------------------------------------------------------ the agent

struct AgentCase {
  const char* name;
  TargetMode mode;
  FsMode fs;
  const char* fs_flag;
  const char* backend;
  const char* iptables;
};

class AgentCapsTest : public CapsTest, public ::testing::WithParamInterface<AgentCase> {
 protected:
  void SetUp() override {
    CapsTest::SetUp();
    if (IsSkipped()) return;
    dir_.emplace();
    pod_.emplace();
    ASSERT_TRUE(pod_->created());
    target_ = spawn({"ip", "netns", "exec", pod_->name(), "sleep", "600"}, std::nullopt, -1, -1);
    const std::string comm = "/proc/" + std::to_string(target_.pid()) + "/comm";
    fakes::eventually([&] { return readFile(comm) == "sleep\n"; }, kProcessDeadline);
    ASSERT_EQ(readFile(comm), "sleep\n");
  }

  std::vector<std::string> args(const AgentCase& c) const {
    std::vector<std::string> a = {"--listen",
                                  "127.0.0.1:0",
                                  "--insecure-no-auth",
                                  "--first-client-timeout",
                                  "0",
                                  "--log-level",
                                  "debug",
                                  "--fs-mode",
                                  c.fs_flag,
                                  "--steal-backend",
                                  c.backend,
                                  "--iptables",
                                  c.iptables};
    if (c.mode == TargetMode::kTargetless) {
      a.push_back("targetless");
    } else {
      a.insert(a.end(), {"targeted", "--pid", std::to_string(target_.pid())});
    }
    return a;
  }

  std::optional<TempDir> dir_;
  std::optional<NetNs> pod_;
  Child target_;
};

// Every thread's sets, from /proc/PID/task/TID/status.
std::vector<std::map<std::string, CapSet>> threadSets(pid_t pid) {
  std::vector<std::map<std::string, CapSet>> out;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
    out.push_back(capLines(readFile(e.path().string() + "/status")));
  }
  return out;
}

TEST_P(AgentCapsTest, KeepsExactlyThePlanOnEveryThread) {
  const AgentCase& c = GetParam();
  const Plan plan = planFor(c.mode, c.fs, c.backend, c.iptables);
  Agent agent(args(c), cleanEnv(), dir_->path() + "/agent.log");
  std::string endpoint;
  ASSERT_TRUE(agent.ready(&endpoint));
  const auto threads = threadSets(agent.child().pid());
  ASSERT_GT(threads.size(), 1u) << "the agent runs its pools by now";
  for (auto sets : threads) {
    EXPECT_EQ(sets["CapEff"], plan.keep) << show(sets["CapEff"]) << " vs " << show(plan.keep);
    EXPECT_EQ(sets["CapPrm"], plan.keep) << show(sets["CapPrm"]);
    EXPECT_EQ(sets["CapBnd"], plan.keep) << show(sets["CapBnd"]);
    EXPECT_EQ(sets["CapInh"], plan.inheritable) << show(sets["CapInh"]);
    EXPECT_EQ(sets["CapAmb"], 0u) << show(sets["CapAmb"]);
  }
  // Never what only the drop needed, never the whole set.
  EXPECT_FALSE(plan.keep & bit(CAP_SETPCAP));
  EXPECT_FALSE(plan.keep & bit(CAP_SYS_MODULE));
  EXPECT_THAT(agent.log(), HasSubstr("capabilities_dropped kept=" + formatCapSet(plan.keep) + " "));
  EXPECT_THAT(agent.log(), Not(HasSubstr("capabilities_warning")));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, AgentCapsTest,
    ::testing::Values(AgentCase{"TargetedRoAuto", TargetMode::kTargeted, FsMode::kReadOnly, "ro",
                                "auto", "auto"},
                      AgentCase{"TargetedRwIptablesLegacy", TargetMode::kTargeted,
                                FsMode::kReadWrite, "rw", "iptables", "legacy"},
                      AgentCase{"TargetedOffSkLookup", TargetMode::kTargeted, FsMode::kOff, "off",
                                "sk_lookup", "auto"},
                      AgentCase{"TargetlessRoIptablesNft", TargetMode::kTargetless,
                                FsMode::kReadOnly, "ro", "iptables", "nft"},
                      AgentCase{"TargetlessOffSkLookup", TargetMode::kTargetless, FsMode::kOff,
                                "off", "sk_lookup", "auto"}),
    [](const ::testing::TestParamInfo<AgentCase>& info) { return std::string(info.param.name); });

class AgentStartTest : public AgentCapsTest {};

TEST_F(AgentStartTest, WithoutSetpcapItKeepsTheBoundingSetAndSaysSo) {
  const AgentCase c{"", TargetMode::kTargeted, FsMode::kReadOnly, "ro", "auto", "auto"};
  const Plan plan = planFor(c.mode, c.fs, c.backend, c.iptables);
  auto [out_r, out_w] = makePipe();
  const std::string log_path = dir_->path() + "/agent.log";
  Fd log(open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  std::vector<std::string> argv = {"setpriv", "--bounding-set", "-setpcap", "--", SIPHON_AGENT_BIN};
  for (const auto& a : args(c)) argv.push_back(a);
  Child agent = spawn(argv, cleanEnv(), out_w.get(), log.get());
  out_w.reset();
  std::string line;
  char ch;
  while (read(out_r.get(), &ch, 1) == 1 && ch != '\n') line.push_back(ch);
  ASSERT_THAT(line, HasSubstr("siphon-agent ready")) << readFile(log_path);
  auto sets = capLines(readFile("/proc/" + std::to_string(agent.pid()) + "/status"));
  EXPECT_EQ(sets["CapEff"], plan.keep) << show(sets["CapEff"]);
  EXPECT_TRUE(sets["CapBnd"] & bit(CAP_SYS_MODULE)) << show(sets["CapBnd"]);
  EXPECT_THAT(readFile(log_path), HasSubstr("capabilities_warning"));
  EXPECT_THAT(readFile(log_path), HasSubstr("bounding=unchanged"));
}

TEST_F(AgentStartTest, WithoutPtraceTheTargetIsRefusedNamingTheCapability) {
  // The target (sleep, started by root) has every capability: the agent
  // may read its /proc entries only with CAP_SYS_PTRACE.
  const AgentCase c{"", TargetMode::kTargeted, FsMode::kReadOnly, "ro", "auto", "auto"};
  std::vector<std::string> argv = {"setpriv", "--bounding-set", "-sys_ptrace", "--",
                                   SIPHON_AGENT_BIN};
  for (const auto& a : args(c)) argv.push_back(a);
  Result r = run(argv, cleanEnv());
  EXPECT_EQ(r.exit_code, 4) << r;  // kExitPermission
  EXPECT_THAT(r.err, HasSubstr("CAP_SYS_PTRACE")) << r;
  EXPECT_THAT(r.err, HasSubstr("capabilities_missing missing=CAP_SYS_PTRACE\n")) << r;
}

}  // namespace
}  // namespace siphon::agent::caps
