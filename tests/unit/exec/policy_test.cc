// What `siphon exec` decides about routes, the environment and exit codes
// (layer-protocol/exec/policy.h).
#include "exec/policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace siphon::exec {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

AddressRule rule(std::string_view text, Via via) {
  auto r = parseAddressRule(text, via);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status();
  return r.ok() ? *r : AddressRule{};
}

TEST(AddressRuleTest, ParsesEveryForm) {
  auto r = rule("10.0.0.0/8", Via::kLocal);
  EXPECT_FALSE(r.v6);
  EXPECT_EQ(r.bits, 8);
  EXPECT_EQ(r.port, 0);
  r = rule("10.1.2.3", Via::kLocal);
  EXPECT_EQ(r.bits, 32);
  r = rule("10.0.0.0/16:5432", Via::kLocal);
  EXPECT_EQ(r.bits, 16);
  EXPECT_EQ(r.port, 5432);
  r = rule("fd00::/8", Via::kLocal);
  EXPECT_TRUE(r.v6);
  EXPECT_EQ(r.bits, 8);
  r = rule("[fd00::/8]:80", Via::kLocal);
  EXPECT_TRUE(r.v6);
  EXPECT_EQ(r.port, 80);
  r = rule("[::1]:6379", Via::kLocal);
  EXPECT_EQ(r.bits, 128);
  EXPECT_EQ(r.port, 6379);
}

TEST(AddressRuleTest, BadRulesSayWhy) {
  for (const char* bad : {"", "svc", "10.0.0.0/33", "10.0.0.0/x", "10.0.0.1:0", "10.0.0.1:99999",
                          "10.0.0.1:", "[fd00::/8", "[fd00::]x", "fd00::/129", "[::1]:"}) {
    auto r = parseAddressRule(bad, Via::kLocal);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("want CIDR[:PORT]")) << bad;
  }
}

TEST(RoutesTest, LoopbackIsLocalAndTheRestGoesToTheTarget) {
  Routes routes;
  EXPECT_EQ(routes.route("127.0.0.1", 80), Via::kLocal);
  EXPECT_EQ(routes.route("127.9.9.9", 80), Via::kLocal);
  EXPECT_EQ(routes.route("::1", 80), Via::kLocal);
  EXPECT_EQ(routes.route("::ffff:127.0.0.1", 80), Via::kLocal);
  EXPECT_EQ(routes.route("10.96.0.10", 53), Via::kTarget);
  EXPECT_EQ(routes.route("fd00::1", 80), Via::kTarget);
  EXPECT_EQ(routes.route("not an address", 80), Via::kTarget);
  Routes remote({}, /*remote_loopback=*/true);
  EXPECT_EQ(remote.route("127.0.0.1", 5432), Via::kTarget);
  EXPECT_EQ(remote.route("::1", 5432), Via::kTarget);
}

TEST(RoutesTest, TheMostSpecificRuleWins) {
  Routes routes({rule("10.0.0.0/8", Via::kLocal), rule("10.1.0.0/16", Via::kTarget),
                 rule("10.1.0.0/16:443", Via::kLocal), rule("127.0.0.1:6379", Via::kTarget),
                 rule("fd00::/8", Via::kLocal)},
                false);
  EXPECT_EQ(routes.route("10.2.3.4", 80), Via::kLocal);      // /8
  EXPECT_EQ(routes.route("10.1.3.4", 80), Via::kTarget);     // /16 beats /8
  EXPECT_EQ(routes.route("10.1.3.4", 443), Via::kLocal);     // the port beats no port
  EXPECT_EQ(routes.route("11.0.0.1", 80), Via::kTarget);     // no rule
  EXPECT_EQ(routes.route("127.0.0.1", 6379), Via::kTarget);  // a rule beats the loopback default
  EXPECT_EQ(routes.route("127.0.0.1", 6380), Via::kLocal);
  EXPECT_EQ(routes.route("fd12::1", 80), Via::kLocal);
  EXPECT_EQ(routes.route("10.2.3.4", 80), Via::kLocal);
  // An IPv4 rule never matches an IPv6 address of the same bytes.
  EXPECT_EQ(routes.route("a00::1", 80), Via::kTarget);
}

TEST(RoutesTest, ATieGoesToThisMachine) {
  Routes routes({rule("10.0.0.0/8", Via::kTarget), rule("10.0.0.0/8", Via::kLocal)}, false);
  EXPECT_EQ(routes.route("10.0.0.1", 80), Via::kLocal);
  Routes other_order({rule("10.0.0.0/8", Via::kLocal), rule("10.0.0.0/8", Via::kTarget)}, false);
  EXPECT_EQ(other_order.route("10.0.0.1", 80), Via::kLocal);
}

TEST(RoutesTest, ZeroPrefixMatchesEverything) {
  Routes routes({rule("0.0.0.0/0", Via::kLocal), rule("::/0", Via::kLocal)}, false);
  EXPECT_EQ(routes.route("10.0.0.1", 80), Via::kLocal);
  EXPECT_EQ(routes.route("fd00::1", 80), Via::kLocal);
}

TEST(EnvironmentTest, TheTargetWinsExceptForTheDevelopersOwn) {
  const std::vector<std::string> local = {
      "PATH=/usr/bin", "HOME=/home/dev", "TERM=xterm", "EDITOR=vim", "LANG=C", "KEEP=mine", "junk"};
  const std::vector<std::pair<std::string, std::string>> target = {
      {"PATH", "/pod/bin"},  {"HOME", "/root"},       {"LANG", "en_US.UTF-8"},
      {"DB_URL", "pg://db"}, {"SSH_AUTH_SOCK", "/x"}, {"DISPLAY", ":9"}};
  auto env = overlayEnvironment(local, target, {}).env;
  EXPECT_THAT(env, ElementsAre("DB_URL=pg://db", "EDITOR=vim", "HOME=/home/dev", "KEEP=mine",
                               "LANG=en_US.UTF-8", "PATH=/usr/bin", "TERM=xterm"));
}

TEST(EnvironmentTest, IncludeExcludeAndSet) {
  const std::vector<std::string> local = {"A_LOCAL=1", "LANG=C"};
  const std::vector<std::pair<std::string, std::string>> target = {
      {"DB_URL", "pg://db"}, {"DB_PASSWORD", "s3cret"}, {"LANG", "de"}, {"KUBE_X", "k"}};
  EnvOverlay o;
  o.include = {"DB_*", "KUBE_*"};
  o.exclude = {"*PASSWORD*"};
  o.set = {"KUBE_X=override", "NEW=v=with=equals"};
  auto env = overlayEnvironment(local, target, o).env;
  EXPECT_THAT(env, ElementsAre("A_LOCAL=1", "DB_URL=pg://db", "KUBE_X=override", "LANG=C",
                               "NEW=v=with=equals"));
}

// Issue 40: a pod's LD_PRELOAD, BASH_ENV, NODE_OPTIONS, GIT_* ... would
// choose the code that runs on the developer's machine. The local value
// (or none) stays, and the names left out are reported.
TEST(EnvironmentTest, VariablesThatChooseCodeKeepTheLocalValue) {
  const std::vector<std::string> local = {"LD_LIBRARY_PATH=/opt/mine/lib", "EDITOR=vim",
                                          "PYTHONPATH=/same"};
  const std::vector<std::pair<std::string, std::string>> target = {
      {"LD_PRELOAD", "/tmp/evil.so"},
      {"LD_AUDIT", "/tmp/audit.so"},
      {"LD_LIBRARY_PATH", "/pod/lib"},
      {"BASH_ENV", "/tmp/run-me.sh"},
      {"ENV", "/tmp/run-me.sh"},
      {"BASH_FUNC_ls%%", "() { evil; }"},
      {"PROMPT_COMMAND", "evil"},
      {"NODE_OPTIONS", "--require /tmp/evil.js"},
      {"PYTHONPATH", "/same"},  // the same value here: nothing is lost
      {"PYTHONSTARTUP", "/tmp/evil.py"},
      {"PERL5OPT", "-Mevil"},
      {"PERL5LIB", "/tmp"},
      {"RUBYOPT", "-revil"},
      {"JAVA_TOOL_OPTIONS", "-javaagent:/tmp/evil.jar"},
      {"_JAVA_OPTIONS", "-javaagent:/tmp/evil.jar"},
      {"GIT_SSH_COMMAND", "evil"},
      {"GIT_CONFIG_PARAMETERS", "'core.pager=evil'"},
      {"EDITOR", "evil"},
      {"DB_URL", "pg://db"},
      {"LDAP_URI", "ldap://x"}};  // not LD_: taken
  const OverlaidEnvironment got = overlayEnvironment(local, target, {});
  EXPECT_THAT(got.env, ElementsAre("DB_URL=pg://db", "EDITOR=vim", "LDAP_URI=ldap://x",
                                   "LD_LIBRARY_PATH=/opt/mine/lib", "PYTHONPATH=/same"));
  EXPECT_THAT(got.left_out,
              ElementsAre("BASH_ENV", "BASH_FUNC_ls%%", "EDITOR", "ENV", "GIT_CONFIG_PARAMETERS",
                          "GIT_SSH_COMMAND", "JAVA_TOOL_OPTIONS", "LD_AUDIT", "LD_LIBRARY_PATH",
                          "LD_PRELOAD", "NODE_OPTIONS", "PERL5LIB", "PERL5OPT", "PROMPT_COMMAND",
                          "PYTHONSTARTUP", "RUBYOPT", "_JAVA_OPTIONS"));
}

TEST(EnvironmentTest, AllowTakesOneAnywayAndTheUsersOwnChoicesAreNotReported) {
  const std::vector<std::pair<std::string, std::string>> target = {
      {"LD_PRELOAD", "/pod/lib.so"}, {"BASH_ENV", "/pod/env.sh"},   {"GIT_DIR", "/pod/.git"},
      {"GIT_PAGER", "less"},         {"NODE_OPTIONS", "--inspect"}, {"PERL5LIB", "/pod/perl"}};
  EnvOverlay o;
  o.allow = {"BASH_ENV", "GIT_*"};
  o.exclude = {"PERL5LIB"};         // the user's own choice: kept local, not reported
  o.set = {"NODE_OPTIONS=--mine"};  // the same
  // --env-include does not lift the rule: only --env-allow does.
  o.include = {"LD_PRELOAD", "BASH_ENV", "GIT_*", "NODE_OPTIONS", "PERL5LIB"};
  const OverlaidEnvironment got = overlayEnvironment({}, target, o);
  EXPECT_THAT(got.env, ElementsAre("BASH_ENV=/pod/env.sh", "GIT_DIR=/pod/.git", "GIT_PAGER=less",
                                   "NODE_OPTIONS=--mine"));
  EXPECT_THAT(got.left_out, ElementsAre("LD_PRELOAD"));
  // Not included at all: not the target's to give, nothing to report.
  o.include = {"GIT_*"};
  EXPECT_THAT(overlayEnvironment({}, target, o).left_out, ::testing::IsEmpty());
}

TEST(EnvironmentTest, TheDocumentedListMatchesWhatItNames) {
  for (const char* name : {"LD_PRELOAD",
                           "LD_AUDIT",
                           "LD_LIBRARY_PATH",
                           "BASH_ENV",
                           "ENV",
                           "PROMPT_COMMAND",
                           "NODE_OPTIONS",
                           "PYTHONPATH",
                           "PYTHONSTARTUP",
                           "PERL5OPT",
                           "PERL5LIB",
                           "RUBYOPT",
                           "JAVA_TOOL_OPTIONS",
                           "_JAVA_OPTIONS",
                           "GIT_SSH_COMMAND",
                           "GIT_EXEC_PATH",
                           "BASH_FUNC_cd%%",
                           "LUA_INIT_5_4",
                           "OPENSSL_CONF",
                           "GCONV_PATH",
                           "PAGER",
                           "LESSOPEN",
                           "PS1"}) {
    EXPECT_TRUE(choosesCode(name)) << name;
  }
  for (const char* name : {"LANG", "DB_URL", "LDAP_URI", "HOSTNAME", "KUBERNETES_SERVICE_HOST",
                           "PSQL_HISTORY", "ENVIRONMENT", "GITHUB_TOKEN", "JAVA_HOME"}) {
    EXPECT_FALSE(choosesCode(name)) << name;
  }
}

TEST(EnvironmentTest, AssignmentsAreChecked) {
  EXPECT_TRUE(checkEnvAssignment("A=").ok());
  EXPECT_TRUE(checkEnvAssignment("A=b=c").ok());
  EXPECT_FALSE(checkEnvAssignment("A").ok());
  EXPECT_FALSE(checkEnvAssignment("=b").ok());
  EXPECT_THAT(checkEnvAssignment("").message(), HasSubstr("want NAME=VALUE"));
}

int statusOf(void (*body)()) {
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(ExitCodeTest, ItsOwnCodeOr128PlusTheSignal) {
  EXPECT_EQ(exitCodeOf(statusOf([] { _exit(0); })), 0);
  EXPECT_EQ(exitCodeOf(statusOf([] { _exit(7); })), 7);
  EXPECT_EQ(exitCodeOf(statusOf([] {
              signal(SIGTERM, SIG_DFL);
              raise(SIGTERM);
            })),
            128 + SIGTERM);
  EXPECT_EQ(exitCodeOf(statusOf([] { raise(SIGKILL); })), 128 + SIGKILL);
}

TEST(PolicyTest, NameserversOnTheTargetsLoopbackGetStandIns) {
  const ShownResolvConf shown = standInNameservers(
      "# a DNS sidecar and a node-local cache\n"
      "nameserver 127.0.0.53\n"
      "  nameserver\t::1 # comment\n"
      "nameserver 10.96.0.10\n"
      "nameservers 127.0.0.9\n"
      "search default.svc.cluster.local\n"
      "nameserver 127.0.0.1");
  EXPECT_EQ(shown.text,
            "# a DNS sidecar and a node-local cache\n"
            "nameserver 198.18.0.53  # the target's 127.0.0.53\n"
            "nameserver fd5e:5e00::53  # the target's ::1\n"
            "nameserver 10.96.0.10\n"
            "nameservers 127.0.0.9\n"
            "search default.svc.cluster.local\n"
            "nameserver 198.18.0.54  # the target's 127.0.0.1\n");
  EXPECT_THAT(shown.stand_ins,
              ElementsAre(std::pair<const std::string, std::string>("198.18.0.53", "127.0.0.53"),
                          std::pair<const std::string, std::string>("198.18.0.54", "127.0.0.1"),
                          std::pair<const std::string, std::string>("fd5e:5e00::53", "::1")));
  // Nothing to stand in for: the text as it was.
  const std::string plain = "nameserver 10.96.0.10\nsearch svc.cluster.local\n";
  EXPECT_EQ(standInNameservers(plain).text, plain);
  EXPECT_TRUE(standInNameservers(plain).stand_ins.empty());
}

// Issue 40: the target has no resolv.conf (or one without a nameserver
// line): the resolver asks 127.0.0.1, the target's loopback.
TEST(PolicyTest, NoNameserverIsTheResolversDefaultOnTheTargetsLoopback) {
  for (const std::string text : {"", "search svc.cluster.local\noptions ndots:5"}) {
    const ShownResolvConf shown = standInNameservers(text);
    EXPECT_EQ(shown.text, (text.empty() ? "" : text + "\n") +
                              "nameserver 198.18.0.53  # the target's 127.0.0.1 (no nameserver "
                              "line: the resolver's default)\n")
        << text;
    EXPECT_THAT(shown.stand_ins,
                ElementsAre(std::pair<const std::string, std::string>("198.18.0.53", "127.0.0.1")));
  }
}

// What libc makes of a file it cannot open: glibc's res_init and nss_files.
TEST(PolicyTest, AFileLibcCannotOpenForGoodIsAbsentOthersAreErrors) {
  for (int err : {ENOENT, ENOTDIR, EACCES, EPERM, EISDIR, ELOOP}) {
    EXPECT_TRUE(absentToTheResolver(err)) << std::strerror(err);
  }
  for (int err : {0, EIO, ENOMEM, EMFILE, EAGAIN, EBADF}) {
    EXPECT_FALSE(absentToTheResolver(err)) << std::strerror(err);
  }
}

}  // namespace
}  // namespace siphon::exec
