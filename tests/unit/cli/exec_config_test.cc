// `siphon exec`'s options (cli/exec_config.h): the command split from
// siphon's own flags, the config file under the flags, and bad values named.
#include "cli/exec_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace siphon::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Parses `args` (after "siphon") as main.cc does, with exec's flags.
struct Parsed {
  absl::Status status = absl::OkStatus();
  ExecFlags flags;
  bool json = false;
};

Parsed parse(std::vector<std::string> args) {
  Parsed p;
  CLI::App app{"t", "siphon"};
  app.fallthrough();
  app.add_flag("--json", p.json);
  CLI::App* exec = app.add_subcommand("exec", "");
  registerExecFlags(*exec, p.flags);
  ExecTail tail;
  args = splitExecTail(args, &tail);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
    p.status = finishExecFlags(p.flags, *exec, tail);
  } catch (const CLI::ParseError& e) {
    p.status = absl::InvalidArgumentError(e.what());
  }
  return p;
}

TEST(ExecConfigTest, TheCommandAfterTheDoubleDashIsUntouched) {
  auto p = parse({"--json", "exec", "--remote-loopback", "--", "app", "--json", "-a", "x", "--"});
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_TRUE(p.json);
  EXPECT_TRUE(p.flags.remote_loopback);
  EXPECT_THAT(p.flags.command, ElementsAre("app", "--json", "-a", "x", "--"));
}

TEST(ExecConfigTest, WithoutTheDoubleDashTheCommandStartsAtTheFirstWord) {
  auto p = parse({"exec", "--env", "A=1", "curl", "-sS", "--env", "http://x"});
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_THAT(p.flags.env_set, ElementsAre("A=1"));
  EXPECT_THAT(p.flags.command, ElementsAre("curl", "-sS", "--env", "http://x"));
}

TEST(ExecConfigTest, SiphonsOwnOptionsAfterExecAreNamed) {
  auto p = parse({"exec", "--json", "--", "true"});
  ASSERT_FALSE(p.status.ok());
  EXPECT_THAT(p.status.message(), HasSubstr("unknown option --json of exec"));
}

TEST(ExecConfigTest, BadValuesAreNamed) {
  EXPECT_THAT(parse({"exec", "--"}).status.message(), HasSubstr("no program to run"));
  EXPECT_THAT(parse({"exec", "--local", "10.0.0.0/40", "--", "true"}).status.message(),
              HasSubstr("--local: bad address rule '10.0.0.0/40'"));
  EXPECT_THAT(parse({"exec", "--remote", "svc", "--", "true"}).status.message(),
              HasSubstr("--remote: bad address rule"));
  EXPECT_THAT(parse({"exec", "--env", "NOVALUE", "--", "true"}).status.message(),
              HasSubstr("bad --env 'NOVALUE'"));
  EXPECT_THAT(parse({"exec", "--agent-lost-timeout", "soon", "--", "true"}).status.message(),
              HasSubstr("--agent-lost-timeout"));
  EXPECT_THAT(parse({"exec", "-f", "/nonexistent.json", "--", "true"}).status.message(),
              HasSubstr("-f /nonexistent.json: cannot read it"));
}

TEST(ExecConfigTest, TheFileFillsWhatTheFlagsLeave) {
  ExecFlags flags;
  flags.hostname = "from-flag";
  auto given = [](const std::string& key) { return key == "hostname"; };
  absl::Status s = mergeExecConfig(R"({
      "hostname": "from-file", "remote-loopback": true, "local": ["10.0.0.0/8"],
      "env": {"B": "2", "A": "1"}, "env-exclude": ["*SECRET*"], "agent-lost-timeout": "5s",
      "command": ["python3", "app.py"], "no-udp": true})",
                                   "siphon.json", given, flags);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(flags.hostname, "from-flag");
  EXPECT_TRUE(flags.remote_loopback);
  EXPECT_TRUE(flags.no_udp);
  EXPECT_THAT(flags.local, ElementsAre("10.0.0.0/8"));
  EXPECT_THAT(flags.env_set, ElementsAre("A=1", "B=2"));
  EXPECT_THAT(flags.env_exclude, ElementsAre("*SECRET*"));
  EXPECT_EQ(flags.agent_lost_timeout, "5s");
  EXPECT_THAT(flags.command, ElementsAre("python3", "app.py"));
}

TEST(ExecConfigTest, FlagsEnvComesAfterTheFilesSoItWins) {
  ExecFlags flags;
  flags.env_set = {"A=flag"};
  ASSERT_TRUE(
      mergeExecConfig(R"({"env": ["A=file"]})", "f", [](auto&) { return false; }, flags).ok());
  EXPECT_THAT(flags.env_set, ElementsAre("A=file", "A=flag"));
}

TEST(ExecConfigTest, ABadFileIsNamed) {
  ExecFlags flags;
  auto none = [](const std::string&) { return false; };
  EXPECT_THAT(mergeExecConfig("[1]", "f.json", none, flags).message(),
              HasSubstr("f.json: not a JSON object"));
  EXPECT_THAT(mergeExecConfig("{\"local\": ", "f.json", none, flags).message(),
              HasSubstr("f.json: malformed JSON"));
  EXPECT_THAT(mergeExecConfig(R"({"hostnme": "x"})", "f.json", none, flags).message(),
              HasSubstr("unknown option \"hostnme\""));
  EXPECT_THAT(mergeExecConfig(R"({"local": "10.0.0.0/8"})", "f.json", none, flags).message(),
              HasSubstr("\"local\" is a string, not a list of strings"));
  EXPECT_THAT(mergeExecConfig(R"({"remote-loopback": "yes"})", "f.json", none, flags).message(),
              HasSubstr("\"remote-loopback\" is a string, not a boolean"));
  EXPECT_THAT(mergeExecConfig(R"({"env": {"A": 1}})", "f.json", none, flags).message(),
              HasSubstr("\"env.A\" is a number, not a string"));
}

TEST(ExecConfigTest, IncomingPortsAndTheirFilter) {
  auto p = parse({"exec", "--steal", "80:8080", "--steal", "443", "--mirror", "9090:19090",
                  "--filter-header", "x-user: ^me$", "--incoming", "steal", "--", "app"});
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_THAT(p.flags.incoming_ports,
              ElementsAre(IncomingPort{80, 8080, false}, IncomingPort{443, 443, false},
                          IncomingPort{9090, 19090, true}));
  EXPECT_EQ(p.flags.incoming_mode, IncomingMode::kSteal);
  ASSERT_TRUE(p.flags.http_filter.has_value());
  EXPECT_EQ(p.flags.http_filter->headers.size(), 1u);
  for (auto [args, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"exec", "--steal", "0", "--", "app"}, "\"0\" is not a port"},
           {{"exec", "--steal", "80:x", "--", "app"}, "\"x\" is not a port"},
           {{"exec", "--steal", "80", "--mirror", "80:81", "--", "app"}, "port 80 is given twice"},
           {{"exec", "--incoming", "maybe", "--", "app"}, "not steal, mirror or off"},
           {{"exec", "--mirror", "80", "--filter-method", "GET", "--", "app"},
            "--filter-* applies to stolen ports"},
       }) {
    auto bad = parse(args);
    EXPECT_FALSE(bad.status.ok()) << why;
    EXPECT_THAT(bad.status.message(), HasSubstr(why));
  }
}

TEST(ExecConfigTest, FilesPathsAreAbsoluteAndNormal) {
  auto p = parse(
      {"exec", "--fs-remote", "/etc//config/", "--fs-root", "/tmp/pod/", "--fs-ro", "--", "app"});
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_THAT(p.flags.fs_remote, ElementsAre("/etc/config"));
  EXPECT_EQ(p.flags.fs_root, "/tmp/pod");
  EXPECT_TRUE(p.flags.fs_ro);
  EXPECT_THAT(parse({"exec", "--fs-remote", "etc", "--", "app"}).status.message(),
              HasSubstr("--fs-remote etc: an absolute path"));
  EXPECT_THAT(parse({"exec", "--fs-remote", "/", "--", "app"}).status.message(),
              HasSubstr("use --fs-root DIR"));
  EXPECT_THAT(parse({"exec", "--fs-root", "/", "--", "app"}).status.message(),
              HasSubstr("--fs-root /"));
}

TEST(ExecConfigTest, TheConfigFileTakesTheIncomingAndFilesNames) {
  ExecFlags flags;
  absl::Status s = mergeExecConfig(
      R"({"steal": ["80:8080"], "mirror": ["81"], "incoming": "mirror",
          "filter-header": ["x-user: me"], "filter-path": "^/api", "filter-method": "GET",
          "filter-any": true, "fs-remote": ["/etc/config"], "fs-root": "/tmp/pod",
          "fs-ro": true})",
      "siphon.json", [](const std::string&) { return false; }, flags);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(flags.steal, ElementsAre("80:8080"));
  EXPECT_THAT(flags.mirror, ElementsAre("81"));
  EXPECT_EQ(flags.incoming, "mirror");
  EXPECT_THAT(flags.filter.headers, ElementsAre("x-user: me"));
  EXPECT_EQ(flags.filter.path, "^/api");
  EXPECT_EQ(flags.filter.method, "GET");
  EXPECT_TRUE(flags.filter.any);
  EXPECT_THAT(flags.fs_remote, ElementsAre("/etc/config"));
  EXPECT_EQ(flags.fs_root, "/tmp/pod");
  EXPECT_TRUE(flags.fs_ro);
  s = mergeExecConfig(R"({"fs-ro": "yes"})", "siphon.json",
                      [](const std::string&) { return false; }, flags);
  EXPECT_THAT(s.message(), HasSubstr("\"fs-ro\" is a string, not a boolean"));
}

// Issue 40: --env-allow takes a variable that chooses code anyway; a typo
// (a name siphon takes without it) and an assignment are named.
TEST(ExecConfigTest, EnvAllowTakesNamesAndGlobs) {
  auto p = parse({"exec", "--env-allow", "BASH_ENV", "--env-allow", "GIT_*", "--", "app"});
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_THAT(p.flags.env_allow, ElementsAre("BASH_ENV", "GIT_*"));
  EXPECT_THAT(parse({"exec", "--env-allow", "DB_URL", "--", "app"}).status.message(),
              HasSubstr("--env-allow DB_URL: the target's value of it is taken without this"));
  EXPECT_THAT(parse({"exec", "--env-allow", "LD_PRELOAD=/x.so", "--", "app"}).status.message(),
              HasSubstr("--env-allow 'LD_PRELOAD=/x.so': a variable's name or a glob"));
  ExecFlags flags;
  ASSERT_TRUE(mergeExecConfig(R"({"env-allow": ["NODE_OPTIONS"]})", "f",
                              [](const std::string&) { return false; }, flags)
                  .ok());
  EXPECT_THAT(flags.env_allow, ElementsAre("NODE_OPTIONS"));
}

// Issue 40: --keep-fd N gives the program a descriptor siphon was given;
// one it was not given, or a standard stream, is named.
TEST(ExecConfigTest, KeepFdNamesAnOpenDescriptor) {
  const int fd = ::dup(2);
  ASSERT_GE(fd, 3);
  auto p = parse({"exec", "--keep-fd", std::to_string(fd), "--", "app"});
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_THAT(p.flags.keep_fds, ElementsAre(fd));
  ::close(fd);
  EXPECT_THAT(parse({"exec", "--keep-fd", std::to_string(fd), "--", "app"}).status.message(),
              HasSubstr("--keep-fd " + std::to_string(fd) + ": siphon was not given descriptor"));
  EXPECT_THAT(parse({"exec", "--keep-fd", "1", "--", "app"}).status.message(),
              HasSubstr("--keep-fd 1: 0, 1 and 2 are always the program's"));
  EXPECT_FALSE(parse({"exec", "--keep-fd", "three", "--", "app"}).status.ok());
  // Not a config file's: descriptors belong to one command line.
  ExecFlags flags;
  EXPECT_THAT(
      mergeExecConfig(R"({"keep-fd": [3]})", "f", [](const std::string&) { return false; }, flags)
          .message(),
      HasSubstr("unknown option \"keep-fd\""));
}

}  // namespace
}  // namespace siphon::cli
