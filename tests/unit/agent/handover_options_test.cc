// siphon-agent's handover flags (agent/options.h): the secret both agents
// prove they hold (the token, or --handover-key-file), refused at start-up
// when there is none; --handover-max-state and its bounds; and the agent
// binary refusing a --handover-socket other containers share, exit 2.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "agent/options.h"

namespace siphon::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Outcome {
  ParsedOptions parsed;
  std::string err;
};

Outcome parse(std::vector<std::string> args, const char* env_token = nullptr) {
  args.insert(args.begin(), "siphon-agent");
  args.push_back("targetless");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Outcome o;
  o.parsed = parseOptions(static_cast<int>(argv.size()), argv.data(), env_token, out, err);
  o.err = err.str();
  return o;
}

class HandoverOptionsTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "handover-options-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& content) {
    std::ofstream(dir_ + "/" + name) << content;
    return dir_ + "/" + name;
  }
  std::string dir_;
};

TEST_F(HandoverOptionsTest, TheTokenIsTheSecretByDefault) {
  Outcome o = parse({"--handover-socket", "/dev/siphon-handover.sock"}, "client-token");
  ASSERT_TRUE(o.parsed.options) << o.err;
  EXPECT_EQ(o.parsed.options->config.token, "client-token");
  EXPECT_EQ(o.parsed.options->config.handover_secret, "");
  EXPECT_EQ(o.parsed.options->config.handover_max_state_bytes, 1ull << 30);
}

// Without a token (--insecure-no-auth) there is nothing to prove: a handover
// socket or a take-over is refused at start-up naming the flag, unless a
// key file is given.
TEST_F(HandoverOptionsTest, WithoutATokenAHandoverNeedsAKeyFile) {
  for (const char* flag : {"--handover-socket", "--take-over"}) {
    Outcome o = parse({"--insecure-no-auth", flag, "/dev/siphon-handover.sock"});
    EXPECT_FALSE(o.parsed.options) << flag;
    EXPECT_EQ(o.parsed.exit_code, kExitUsage) << flag;
    EXPECT_THAT(o.err, HasSubstr(std::string("siphon-agent: ") + flag +
                                 " needs a secret both agents hold"));
    EXPECT_THAT(o.err, HasSubstr("--handover-key-file"));
  }
  const std::string key = file("key", "a-secret-of-the-operators\n");
  Outcome o = parse({"--insecure-no-auth", "--handover-socket", "/dev/siphon-handover.sock",
                     "--handover-key-file", key});
  ASSERT_TRUE(o.parsed.options) << o.err;
  EXPECT_EQ(o.parsed.options->config.handover_secret, "a-secret-of-the-operators");
  // Without a handover, no secret is asked for.
  EXPECT_TRUE(parse({"--insecure-no-auth"}).parsed.options);
}

TEST_F(HandoverOptionsTest, AKeyFileThatDoesNotReadIsAUsageError) {
  Outcome empty = parse({"--handover-key-file", file("empty", "\n")}, "t");
  EXPECT_EQ(empty.parsed.exit_code, kExitUsage);
  EXPECT_THAT(empty.err, HasSubstr("--handover-key-file " + dir_ + "/empty is empty"));
  Outcome missing = parse({"--handover-key-file", dir_ + "/missing"}, "t");
  EXPECT_EQ(missing.parsed.exit_code, kExitUsage);
  EXPECT_THAT(missing.err, HasSubstr("read --handover-key-file " + dir_ + "/missing"));
}

TEST_F(HandoverOptionsTest, TheStateCapIsInMiBWithinItsBounds) {
  Outcome o = parse({"--handover-max-state", "64"}, "t");
  ASSERT_TRUE(o.parsed.options) << o.err;
  EXPECT_EQ(o.parsed.options->config.handover_max_state_bytes, 64ull << 20);
  for (const char* bad : {"0", "2048", "lots"}) {
    Outcome b = parse({"--handover-max-state", bad}, "t");
    EXPECT_EQ(b.parsed.exit_code, kExitUsage) << bad;
    EXPECT_THAT(b.err, HasSubstr("--handover-max-state")) << bad;
  }
}

// The binary: a --handover-socket on the pod's /dev/shm, or in a directory
// others may write, stops it before anything starts, exit 2 naming the flag.
TEST_F(HandoverOptionsTest, TheAgentRefusesASharedPlaceAtStartUp) {
  const std::string token = file("token", "t0ken\n");
  const std::string open_dir = dir_ + "/shared";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  for (const std::string& socket :
       {std::string("/dev/shm/siphon-handover.sock"), open_dir + "/siphon-handover.sock"}) {
    const std::string cmd = std::string(SIPHON_AGENT_BIN) + " --listen 127.0.0.1:0 --token-file " +
                            token + " --handover-socket " + socket + " targetless 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int status = ::pclose(p);
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), kExitUsage) << out;
    EXPECT_THAT(out, HasSubstr("siphon-agent: --handover-socket " + socket + ": ")) << out;
    EXPECT_THAT(out, Not(HasSubstr("ready"))) << out;
  }
}

}  // namespace
}  // namespace siphon::agent
