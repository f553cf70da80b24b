// The JSON helpers and the inspect parsers on the edge cases runtimes (or a
// broken proxy in front of them) can produce.
#include "agent/runtime/json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "agent/runtime/inspect.h"
#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::msg;

google::protobuf::Struct parsed(const std::string& json) {
  auto s = parseJsonObject(json);
  EXPECT_TRUE(s.ok()) << json << ": " << s.status();
  return s.ok() ? *s : google::protobuf::Struct();
}

TEST(JsonTest, TopLevelMustBeAnObject) {
  for (const char* json : {"", "   ", "[1,2]", "\"x\"", "42", "null", "true"}) {
    auto s = parseJsonObject(json);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_EQ(s.status().message(), "JSON answer is not an object") << json;
  }
  EXPECT_TRUE(parseJsonObject(" \n\t{}").ok());
}

TEST(JsonTest, MalformedJsonIsAnError) {
  for (const char* json :
       {"{", "{\"a\":}", "{\"a\":1} trailing", "{\"a\":\"unterminated}", "{\"a\":01x}"}) {
    auto s = parseJsonObject(json);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(msg(s.status()), HasSubstr("malformed JSON")) << json;
  }
}

// protobuf's parser takes two things strict JSON does not; runtimes never
// send them, and reading them does no harm. This test notices if that
// changes.
TEST(JsonTest, TrailingCommaAndSingleQuotesAreTolerated) {
  EXPECT_TRUE(parseJsonObject("{\"a\":1,}").ok());
  EXPECT_TRUE(parseJsonObject("{'a':1}").ok());
}

TEST(JsonTest, StringEscapesAreDecoded) {
  auto root = parsed(R"({"s":"tab\there \"q\" back\\slash \u00e9 \ud83d\ude00 \/ nl\n"})");
  auto s = jsonString(jsonAt(root, {"s"}), "s");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "tab\there \"q\" back\\slash \xC3\xA9 \xF0\x9F\x98\x80 / nl\n");
}

TEST(JsonTest, PathWalksObjectsOnly) {
  auto root = parsed(R"({"a":{"b":{"c":1}},"l":[{"b":2}],"n":null,"s":"x"})");
  ASSERT_NE(jsonAt(root, {"a", "b", "c"}), nullptr);
  EXPECT_EQ(jsonAt(root, {"a", "b", "c"})->number_value(), 1);
  EXPECT_EQ(jsonAt(root, {"a", "x"}), nullptr);
  EXPECT_EQ(jsonAt(root, {"l", "b"}), nullptr) << "lists are not walked";
  EXPECT_EQ(jsonAt(root, {"n", "b"}), nullptr);
  EXPECT_EQ(jsonAt(root, {"s", "b"}), nullptr);
  EXPECT_EQ(jsonPathName({"State", "Pid"}), "State.Pid");
}

TEST(JsonTest, PidMustBeAPositiveIntegralNumber) {
  auto root = parsed(R"({"ok":4242,"max":2147483647,"zero":0,"neg":-1,"frac":1.5,"big":2147483648,)"
                     R"("exp":4.242e3,"str":"4242","null":null,"list":[1]})");
  auto ok = jsonPid(jsonAt(root, {"ok"}), "ok");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 4242);
  EXPECT_EQ(*jsonPid(jsonAt(root, {"max"}), "max"), 2147483647);
  EXPECT_EQ(*jsonPid(jsonAt(root, {"exp"}), "exp"), 4242);
  for (const char* bad : {"zero", "neg", "frac", "big"}) {
    auto p = jsonPid(jsonAt(root, {bad}), bad);
    ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(msg(p.status()), HasSubstr("not a pid")) << bad;
  }
  EXPECT_THAT(msg(jsonPid(jsonAt(root, {"str"}), "str").status()),
              HasSubstr("str is a string, not a number"));
  EXPECT_THAT(msg(jsonPid(jsonAt(root, {"null"}), "null").status()),
              HasSubstr("null is null, not a number"));
  EXPECT_THAT(msg(jsonPid(jsonAt(root, {"list"}), "list").status()), HasSubstr("is a list"));
  EXPECT_THAT(msg(jsonPid(jsonAt(root, {"missing"}), "missing").status()),
              HasSubstr("missing is missing"));
}

TEST(JsonTest, StringListAcceptsNullAndMissingAsEmpty) {
  auto root = parsed(R"({"l":["a","b=c",""],"n":null,"e":[],"bad":["a",1],"obj":{}})");
  EXPECT_THAT(*jsonStringList(jsonAt(root, {"l"}), "l"), ElementsAre("a", "b=c", ""));
  EXPECT_THAT(*jsonStringList(jsonAt(root, {"n"}), "n"), IsEmpty());
  EXPECT_THAT(*jsonStringList(jsonAt(root, {"e"}), "e"), IsEmpty());
  EXPECT_THAT(*jsonStringList(jsonAt(root, {"missing"}), "missing"), IsEmpty());
  auto bad = jsonStringList(jsonAt(root, {"bad"}), "Config.Env");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(bad.status()), HasSubstr("Config.Env[1] is a number, not a string"));
  EXPECT_THAT(msg(jsonStringList(jsonAt(root, {"obj"}), "obj").status()),
              HasSubstr("obj is an object, not a list"));
}

TEST(JsonTest, BoolMustBeABool) {
  auto root = parsed(R"({"t":true,"f":false,"s":"true","z":0})");
  EXPECT_TRUE(*jsonBool(jsonAt(root, {"t"}), "t"));
  EXPECT_FALSE(*jsonBool(jsonAt(root, {"f"}), "f"));
  EXPECT_FALSE(jsonBool(jsonAt(root, {"s"}), "s").ok());
  EXPECT_FALSE(jsonBool(jsonAt(root, {"z"}), "z").ok());
  EXPECT_FALSE(jsonBool(jsonAt(root, {"missing"}), "missing").ok());
}

TEST(JsonTest, HugeIntegersElsewhereDoNotBreakParsing) {
  auto root = parsed(R"({"KernelMemory":9223372036854775807,"Neg":-9223372036854775808,"Pid":7})");
  EXPECT_EQ(*jsonPid(jsonAt(root, {"Pid"}), "Pid"), 7);
}

TEST(JsonTest, DeeplyNestedInputIsAnErrorNotACrash) {
  std::string deep(10000, '[');
  auto s = parseJsonObject("{\"a\":" + deep + "}");
  EXPECT_FALSE(s.ok());
}

TEST(DockerInspectTest, StoppedContainerNeedsNoPid) {
  auto d = parseDockerInspect(R"({"Id":"abc","State":{"Running":false,"Pid":0},"Config":{}})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->running);
  EXPECT_EQ(d->pid, 0);
  EXPECT_TRUE(d->env.empty());
}

TEST(DockerInspectTest, RunningContainerWithPidZeroIsMalformed) {
  auto d = parseDockerInspect(R"({"Id":"abc","State":{"Running":true,"Pid":0}})");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(msg(d.status()), HasSubstr("State.Pid is 0, not a pid"));
}

TEST(DockerInspectTest, MissingStateIsMalformed) {
  auto d = parseDockerInspect(R"({"Id":"abc"})");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(msg(d.status()), HasSubstr("State.Running is missing"));
}

TEST(DockerInspectTest, IdOfTheWrongTypeIsMalformed) {
  auto d = parseDockerInspect(R"({"Id":12,"State":{"Running":false}})");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(msg(d.status()), HasSubstr("Id is a number, not a string"));
}

TEST(CrioInspectTest, PidZeroMeansNotRunning) {
  auto c = parseCrioInspect(R"({"pid":0})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pid, 0);
  EXPECT_EQ(parseCrioInspect(R"({"pid":12})")->pid, 12);
  EXPECT_FALSE(parseCrioInspect(R"({"pid":-3})").ok());
  EXPECT_FALSE(parseCrioInspect(R"({"pid":null})").ok());
}

TEST(OciSpecTest, EnvComesFromProcessEnv) {
  auto env = parseOciSpecEnv(
      R"({"ociVersion":"1.0.2-dev","process":{"user":{"uid":0,"gid":0},"args":["sleep","600"],)"
      R"("env":["PATH=/bin","RUNTIME_ONLY_VAR=from-image","FROM_CTR_RUN=1"],"cwd":"/"},)"
      R"("root":{"path":"rootfs"},"linux":{"namespaces":[{"type":"pid"},{"type":"network"}]}})");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_THAT(*env, ElementsAre("PATH=/bin", "RUNTIME_ONLY_VAR=from-image", "FROM_CTR_RUN=1"));
}

TEST(OciSpecTest, SpecWithoutProcessOrEnvHasNoEnv) {
  EXPECT_THAT(*parseOciSpecEnv(R"({"ociVersion":"1.0.2"})"), IsEmpty());
  EXPECT_THAT(*parseOciSpecEnv(R"({"process":{"args":["x"]}})"), IsEmpty());
  EXPECT_FALSE(parseOciSpecEnv(R"({"process":{"env":"PATH=/bin"}})").ok());
  EXPECT_FALSE(parseOciSpecEnv("not json").ok());
}

}  // namespace
}  // namespace siphon::agent::runtime
