#include "agent/target/environ.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "siphon/status.h"
#include "tests/fakes/fake_proc_fs.h"

namespace siphon::agent {
namespace {

using namespace std::string_literals;
using Pairs = std::vector<std::pair<std::string, std::string>>;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

Pairs pairsOf(const std::vector<v1::EnvVar>& vars) {
  Pairs out;
  for (const auto& v : vars) out.emplace_back(v.name(), v.value());
  return out;
}

Pairs pairsOf(const v1::EnvResponse& response) {
  return pairsOf(std::vector<v1::EnvVar>(response.vars().begin(), response.vars().end()));
}

Pairs parse(const std::string& raw) {
  auto vars = parseEnviron(raw);
  EXPECT_TRUE(vars.ok()) << vars.status();
  return vars.ok() ? pairsOf(*vars) : Pairs{};
}

// ---- parseEnviron ----

TEST(ParseEnvironTest, EmptyInputGivesNoVars) {
  EXPECT_THAT(parse(""), IsEmpty());
  EXPECT_THAT(parse("\0"s), IsEmpty());
  EXPECT_THAT(parse("\0\0\0"s), IsEmpty());
}

TEST(ParseEnvironTest, ParsesNulSeparatedEntries) {
  EXPECT_THAT(parse("HOME=/root\0PATH=/usr/bin:/bin\0"s),
              ElementsAre(Pair("HOME", "/root"), Pair("PATH", "/usr/bin:/bin")));
}

TEST(ParseEnvironTest, ValueMayContainEquals) {
  EXPECT_THAT(parse("A=b=c\0OPTS=--x=1 --y==2\0"s),
              ElementsAre(Pair("A", "b=c"), Pair("OPTS", "--x=1 --y==2")));
}

TEST(ParseEnvironTest, EmptyValueIsKept) {
  EXPECT_THAT(parse("EMPTY=\0"s), ElementsAre(Pair("EMPTY", "")));
}

TEST(ParseEnvironTest, SkipsEntriesWithoutEqualsOrName) {
  EXPECT_THAT(parse("JUNK\0A=1\0=nameless\0\0B=2\0"s), ElementsAre(Pair("A", "1"), Pair("B", "2")));
}

TEST(ParseEnvironTest, LastEntryWithoutTerminatorIsKept) {
  EXPECT_THAT(parse("A=1\0B=2"s), ElementsAre(Pair("A", "1"), Pair("B", "2")));
}

TEST(ParseEnvironTest, FirstDuplicateWinsLikeGetenv) {
  EXPECT_THAT(parse("X=first\0Y=y\0X=second\0"s), ElementsAre(Pair("X", "first"), Pair("Y", "y")));
}

TEST(ParseEnvironTest, SortedBytewiseByName) {
  EXPECT_THAT(parse("b=1\0B=2\0a=3\0A_B=4\0A=5\0_=6\0"s),
              ElementsAre(Pair("A", "5"), Pair("A_B", "4"), Pair("B", "2"), Pair("_", "6"),
                          Pair("a", "3"), Pair("b", "1")));
}

TEST(ParseEnvironTest, NamesAreCaseSensitive) {
  EXPECT_THAT(parse("path=lower\0PATH=upper\0"s),
              ElementsAre(Pair("PATH", "upper"), Pair("path", "lower")));
}

TEST(ParseEnvironTest, ValidUtf8AndControlBytesPassUnchanged) {
  const std::string value = "gr\xC3\xBC\xC3\x9F \xE2\x82\xAC \xF0\x9F\x98\x80 tab\there\x01\x7F";
  EXPECT_THAT(parse("U=" + value + "\0"s), ElementsAre(Pair("U", value)));
}

TEST(ParseEnvironTest, InvalidUtf8InValueBecomesReplacementCharacter) {
  // Proto3 string fields must be UTF-8 or the peer cannot parse the frame.
  EXPECT_THAT(parse("BIN=a\xFF\xFE"
                    "b\0"s),
              ElementsAre(Pair("BIN",
                               "a\xEF\xBF\xBD"
                               "b")));
  // A truncated sequence at the end, an overlong '/', a UTF-16 surrogate.
  EXPECT_THAT(parse("T=x\xE2\x82\0O=\xC0\xAF\0S=\xED\xA0\x80\0"s),
              ElementsAre(Pair("O", "\xEF\xBF\xBD"), Pair("S", "\xEF\xBF\xBD"),
                          Pair("T", "x\xEF\xBF\xBD")));
}

TEST(ParseEnvironTest, SkipsNamesThatAreNotUtf8) {
  EXPECT_THAT(parse("BAD\xFFNAME=1\0OK=2\0"s), ElementsAre(Pair("OK", "2")));
}

TEST(ParseEnvironTest, ParsedVarsSerializeAsValidProto) {
  auto vars = parseEnviron("BIN=\x80\x81\0"s);
  ASSERT_TRUE(vars.ok());
  v1::EnvResponse response;
  for (auto& v : *vars) *response.add_vars() = v;
  v1::EnvResponse back;
  ASSERT_TRUE(back.ParseFromString(response.SerializeAsString()));
  ASSERT_EQ(back.vars_size(), 1);
  EXPECT_EQ(back.vars(0).value(), "\xEF\xBF\xBD");
}

// ---- EnvFilter ----

TEST(EnvFilterTest, EmptyFilterMatchesEverything) {
  EnvFilter f;
  EXPECT_TRUE(f.matches("PATH"));
  EXPECT_TRUE(f.matches(""));
}

TEST(EnvFilterTest, IncludeListsWhatMatches) {
  EnvFilter f({"SIPHON_*", "HOME"}, {});
  EXPECT_TRUE(f.matches("SIPHON_TOKEN"));
  EXPECT_TRUE(f.matches("SIPHON_"));
  EXPECT_TRUE(f.matches("HOME"));
  EXPECT_FALSE(f.matches("HOMEDIR"));
  EXPECT_FALSE(f.matches("PATH"));
  EXPECT_FALSE(f.matches("XSIPHON_A"));
  EXPECT_FALSE(f.matches("siphon_a"));  // case-sensitive
}

TEST(EnvFilterTest, ExcludeAloneRemovesFromEverything) {
  EnvFilter f({}, {"*_SECRET", "AWS_*"});
  EXPECT_TRUE(f.matches("PATH"));
  EXPECT_FALSE(f.matches("DB_SECRET"));
  EXPECT_FALSE(f.matches("AWS_ACCESS_KEY_ID"));
}

TEST(EnvFilterTest, ExcludeWinsOverInclude) {
  EnvFilter f({"SIPHON_*"}, {"SIPHON_TOKEN"});
  EXPECT_TRUE(f.matches("SIPHON_MODE"));
  EXPECT_FALSE(f.matches("SIPHON_TOKEN"));
  EXPECT_FALSE(f.matches("OTHER"));
}

TEST(EnvFilterTest, QuestionMarkMatchesExactlyOneCharacter) {
  EnvFilter f({"VAR?"}, {});
  EXPECT_TRUE(f.matches("VAR1"));
  EXPECT_FALSE(f.matches("VAR"));
  EXPECT_FALSE(f.matches("VAR12"));
}

TEST(EnvFilterTest, CharacterClasses) {
  EnvFilter f({"LC_[A-M]*", "X[!0-9]"}, {});
  EXPECT_TRUE(f.matches("LC_ALL"));
  EXPECT_TRUE(f.matches("LC_MESSAGES"));
  EXPECT_FALSE(f.matches("LC_TIME"));
  EXPECT_TRUE(f.matches("Xa"));
  EXPECT_FALSE(f.matches("X5"));
}

TEST(EnvFilterTest, NoFlagsMeansSlashAndDotAreOrdinary) {
  EnvFilter f({"*"}, {});
  EXPECT_TRUE(f.matches("A/B"));
  EXPECT_TRUE(f.matches(".hidden"));
}

TEST(EnvFilterTest, MalformedPatternIsNotAnError) {
  // fnmatch takes an unclosed '[' literally.
  EnvFilter f({"A[B"}, {});
  EXPECT_TRUE(f.matches("A[B"));
  EXPECT_FALSE(f.matches("AB"));
}

TEST(EnvFilterTest, FromRequestCopiesBothLists) {
  v1::EnvRequest req;
  req.add_include("A*");
  req.add_exclude("AB");
  EnvFilter f = EnvFilter::fromRequest(req);
  EXPECT_TRUE(f.matches("AC"));
  EXPECT_FALSE(f.matches("AB"));
  EXPECT_FALSE(f.matches("C"));
}

// ---- parseEnvList ----

Pairs parseList(const std::vector<std::string>& entries) {
  auto vars = parseEnvList(entries);
  EXPECT_TRUE(vars.ok()) << vars.status();
  return vars.ok() ? pairsOf(*vars) : Pairs{};
}

TEST(ParseEnvListTest, SameRulesAsEnviron) {
  EXPECT_THAT(
      parseList({"PATH=/bin", "A=b=c", "EMPTY=", "noequals", "=novalue", "B=2"}),
      ElementsAre(Pair("A", "b=c"), Pair("B", "2"), Pair("EMPTY", ""), Pair("PATH", "/bin")));
}

TEST(ParseEnvListTest, FirstDuplicateWinsLikeTheExecveEnvp) {
  EXPECT_THAT(parseList({"A=first", "A=second"}), ElementsAre(Pair("A", "first")));
}

TEST(ParseEnvListTest, EntriesMayHoldNulAndNewlines) {
  // A list entry is a whole string: unlike environ, a NUL does not split it.
  EXPECT_THAT(parseList({"A=x\0y"s, "B=line1\nline2"}),
              ElementsAre(Pair("A", "x\0y"s), Pair("B", "line1\nline2")));
}

TEST(ParseEnvListTest, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_THAT(parseList({"A=caf\xE9"}), ElementsAre(Pair("A", "caf\xEF\xBF\xBD")));
  EXPECT_THAT(parseList({"\xFF=1", "OK=1"}), ElementsAre(Pair("OK", "1")));
}

TEST(ParseEnvListTest, EmptyListGivesNoVars) { EXPECT_THAT(parseList({}), IsEmpty()); }

// ---- mergeEnv ----

std::vector<v1::EnvVar> vars(const Pairs& pairs) {
  std::vector<v1::EnvVar> out;
  for (const auto& [name, value] : pairs) {
    v1::EnvVar& v = out.emplace_back();
    v.set_name(name);
    v.set_value(value);
  }
  return out;
}

TEST(MergeEnvTest, UnionSortedWithTheProcessWinning) {
  auto merged = mergeEnv(vars({{"A", "runtime"}, {"PATH", "/bin"}, {"Z", "rt"}}),
                         vars({{"A", "process"}, {"B", "p"}, {"Z", "proc"}}));
  EXPECT_THAT(pairsOf(merged), ElementsAre(Pair("A", "process"), Pair("B", "p"),
                                           Pair("PATH", "/bin"), Pair("Z", "proc")));
}

TEST(MergeEnvTest, EitherSideMayBeEmpty) {
  EXPECT_THAT(pairsOf(mergeEnv({}, vars({{"A", "1"}}))), ElementsAre(Pair("A", "1")));
  EXPECT_THAT(pairsOf(mergeEnv(vars({{"A", "1"}}), {})), ElementsAre(Pair("A", "1")));
  EXPECT_THAT(pairsOf(mergeEnv({}, {})), IsEmpty());
}

TEST(MergeEnvTest, EmptyProcessValueStillWins) {
  EXPECT_THAT(pairsOf(mergeEnv(vars({{"A", "runtime"}}), vars({{"A", ""}}))),
              ElementsAre(Pair("A", "")));
}

TEST(MergeEnvTest, OrderIsBytewise) {
  auto merged = mergeEnv(vars({{"B", "1"}, {"a", "1"}}), vars({{"A", "1"}, {"_", "1"}}));
  EXPECT_THAT(pairsOf(merged),
              ElementsAre(Pair("A", "1"), Pair("B", "1"), Pair("_", "1"), Pair("a", "1")));
}

// ---- envFor ----

TEST(EnvForTest, ReadsFiltersAndSorts) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(4242).environ = "Z=26\0SIPHON_B=2\0HOME=/\0SIPHON_A=1\0SIPHON_KEY=k\0"s;
  v1::EnvRequest req;
  req.add_include("SIPHON_*");
  req.add_include("Z");
  req.add_exclude("*_KEY");

  auto response = envFor(procfs, 4242, req);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(pairsOf(*response),
              ElementsAre(Pair("SIPHON_A", "1"), Pair("SIPHON_B", "2"), Pair("Z", "26")));
}

TEST(EnvForTest, EmptyRequestReturnsAll) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(7).environ = "B=2\0A=1\0"s;
  auto response = envFor(procfs, 7, v1::EnvRequest());
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(pairsOf(*response), ElementsAre(Pair("A", "1"), Pair("B", "2")));
}

TEST(EnvForTest, RuntimeEnvIsMergedUnderTheProcessEnvThenFiltered) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(7).environ = "FROM_CTR_RUN=from-process\0PROC_ONLY=1\0"s;
  auto runtime_env = parseEnvList({"PATH=/bin", "RUNTIME_ONLY_VAR=from-image", "FROM_CTR_RUN=1"});
  ASSERT_TRUE(runtime_env.ok());
  auto all = envFor(procfs, 7, v1::EnvRequest(), *runtime_env);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(pairsOf(*all),
              ElementsAre(Pair("FROM_CTR_RUN", "from-process"), Pair("PATH", "/bin"),
                          Pair("PROC_ONLY", "1"), Pair("RUNTIME_ONLY_VAR", "from-image")));
  v1::EnvRequest req;
  req.add_include("RUNTIME_*");
  auto filtered = envFor(procfs, 7, req, *runtime_env);
  ASSERT_TRUE(filtered.ok());
  EXPECT_THAT(pairsOf(*filtered), ElementsAre(Pair("RUNTIME_ONLY_VAR", "from-image")));
}

TEST(EnvForTest, RuntimeEnvIsNoFallbackForAnUnreadableProcess) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(7).environ_errno = EACCES;
  auto response = envFor(procfs, 7, v1::EnvRequest(), *parseEnvList({"A=1"}));
  EXPECT_EQ(response.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(EnvForTest, MissingProcessIsNotFound) {
  fakes::FakeProcFs procfs;
  auto response = envFor(procfs, 4242, v1::EnvRequest());
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(response.status().message(), "open /proc/4242/environ: No such file or directory");
}

TEST(EnvForTest, PermissionDeniedKeepsErrno) {
  fakes::FakeProcFs procfs;
  procfs.addProcess(4242).environ_errno = EACCES;
  auto response = envFor(procfs, 4242, v1::EnvRequest());
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(errnoOf(response.status()), EACCES);
}

}  // namespace
}  // namespace siphon::agent
