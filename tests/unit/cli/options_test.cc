#include "cli/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseAgentList, FlagsInOrder) {
  auto agents = parseAgentList({"10.0.0.1:7140", "node-b:7141"}, std::nullopt);
  ASSERT_TRUE(agents.ok()) << agents.status();
  EXPECT_THAT(*agents, ElementsAre("10.0.0.1:7140", "node-b:7141"));
}

TEST(ParseAgentList, CommaSeparatedWithBlanksAndEmptyEntries) {
  auto agents = parseAgentList({" a:1 , b:2,,", "[::1]:3"}, std::nullopt);
  ASSERT_TRUE(agents.ok()) << agents.status();
  EXPECT_THAT(*agents, ElementsAre("a:1", "b:2", "[::1]:3"));
}

TEST(ParseAgentList, EnvironmentOnlyWithoutFlags) {
  auto from_env = parseAgentList({}, "x:1,y:2");
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_THAT(*from_env, ElementsAre("x:1", "y:2"));

  // Flags win over the environment.
  auto from_flags = parseAgentList({"z:3"}, "x:1");
  ASSERT_TRUE(from_flags.ok()) << from_flags.status();
  EXPECT_THAT(*from_flags, ElementsAre("z:3"));
}

TEST(ParseAgentList, NothingGiven) {
  for (auto env : {std::optional<std::string_view>(), std::optional<std::string_view>(" , ")}) {
    auto agents = parseAgentList({}, env);
    ASSERT_FALSE(agents.ok());
    EXPECT_EQ(errorCodeOf(agents.status()), v1::INVALID_ARGUMENT);
    EXPECT_THAT(std::string(agents.status().message()), HasSubstr("SIPHON_AGENT"));
  }
}

TEST(ParseAgentList, MalformedEntriesAreNamed) {
  for (const char* bad :
       {"nohost", "host:", ":7140", "host:port", "host:70000", "::1:7140", "[::1:7140", "host:0"}) {
    auto agents = parseAgentList({std::string("ok:1,") + bad}, std::nullopt);
    ASSERT_FALSE(agents.ok()) << bad;
    EXPECT_EQ(errorCodeOf(agents.status()), v1::INVALID_ARGUMENT) << bad;
    EXPECT_THAT(std::string(agents.status().message()), HasSubstr(bad));
  }
}

TEST(TrimTrailingWhitespace, StripsOnlyTheEnd) {
  EXPECT_EQ(trimTrailingWhitespace("tok\n"), "tok");
  EXPECT_EQ(trimTrailingWhitespace("tok \t\r\n\n"), "tok");
  EXPECT_EQ(trimTrailingWhitespace(" t o k"), " t o k");
  EXPECT_EQ(trimTrailingWhitespace("\n\n"), "");
  EXPECT_EQ(trimTrailingWhitespace(""), "");
}

// A temporary file removed on every path.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    char tmpl[] = "/tmp/siphon-cli-test-XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = tmpl;
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(ReadTokenFile, TrailingNewlineIsStripped) {
  TempFile f("s3cret-token\n");
  auto token = readTokenFile(f.path());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-token");
}

TEST(ReadTokenFile, WithoutNewlineAsIs) {
  TempFile f("abc");
  auto token = readTokenFile(f.path());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc");
}

TEST(ReadTokenFile, MissingFileNamesPathAndReason) {
  auto token = readTokenFile("/nonexistent/siphon/token");
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(errorCodeOf(token.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(std::string(token.status().message()),
              HasSubstr("cannot read token file /nonexistent/siphon/token: No such file"));
}

TEST(ReadTokenFile, DirectoryIsAnError) {
  auto token = readTokenFile("/tmp");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("cannot read token file /tmp"));
}

TEST(ReadTokenFile, EndlessFileIsRefused) {
  auto token = readTokenFile("/dev/zero");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("not a token"));
}

TEST(ReadTokenFile, WhitespaceOnlyIsEmpty) {
  TempFile f(" \n\n");
  auto token = readTokenFile(f.path());
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(std::string(token.status().message()), HasSubstr("is empty"));
}

TEST(ParseDuration, Units) {
  using std::chrono::milliseconds;
  EXPECT_EQ(*parseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(*parseDuration("5s"), milliseconds(5000));
  EXPECT_EQ(*parseDuration("1.5s"), milliseconds(1500));
  EXPECT_EQ(*parseDuration("2m"), milliseconds(120000));
  EXPECT_EQ(*parseDuration("1h"), milliseconds(3600000));
  EXPECT_EQ(*parseDuration("10"), milliseconds(10000));
}

TEST(ParseDuration, Rejects) {
  for (const char* bad : {"", "s", "5x", "-1s", "0s", "0", "1..2s", "5 s", "0.1ms", "nan"}) {
    auto d = parseDuration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_EQ(errorCodeOf(d.status()), v1::INVALID_ARGUMENT) << bad;
    }
  }
}

}  // namespace
}  // namespace siphon::cli
