#include "cli/output.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace siphon::cli {
namespace {

client::TargetInfo sampleInfo() {
  client::TargetInfo info;
  info.agent_version = "0.1.0";
  info.protocol_version = "1.0";
  info.session_id = "s-42";
  info.mode = "targeted";
  info.pid = 1234;
  info.netns_inode = 4026532281;
  info.features = {"FEATURE_INFO", "FEATURE_ENV", "FEATURE_OUTGOING_TCP"};
  info.sessions = 2;
  info.hostname = "node-1";
  info.uptime_ms = 65'000;
  return info;
}

std::vector<client::EnvVar> envOf(std::initializer_list<std::pair<const char*, std::string>> vars) {
  std::vector<client::EnvVar> env;
  for (const auto& [name, value] : vars) env.push_back({name, value});
  return env;
}

TEST(FeatureName, LowerCaseWithoutPrefix) {
  EXPECT_EQ(featureName("FEATURE_ENV"), "env");
  EXPECT_EQ(featureName("FEATURE_STEAL_HTTP_FILTER"), "steal_http_filter");
  // The typed API's names for values this build does not know.
  EXPECT_EQ(featureName("UNKNOWN_999"), "unknown_999");
  EXPECT_EQ(featureName("UNKNOWN_0"), "unknown_0");
}

TEST(FormatUptime, Ranges) {
  EXPECT_EQ(formatUptime(850), "850ms");
  EXPECT_EQ(formatUptime(12'340), "12.3s");
  EXPECT_EQ(formatUptime(245'000), "4m05s");
  EXPECT_EQ(formatUptime(7'384'000), "2h03m04s");
  EXPECT_EQ(formatUptime(273'900'000), "3d04h05m");
  EXPECT_EQ(formatUptime(-5), "0ms");
}

TEST(InfoText, AlignedKeyValueLines) {
  EXPECT_EQ(infoText(sampleInfo()),
            "agent_version     0.1.0\n"
            "protocol_version  1.0\n"
            "session_id        s-42\n"
            "target            targeted\n"
            "pid               1234\n"
            "netns             net:[4026532281]\n"
            "features          info, env, outgoing_tcp\n"
            "sessions          2\n"
            "hostname          node-1\n"
            "uptime            1m05s\n");
}

TEST(InfoText, ContainerAndRuntimeWhenKnown) {
  auto info = sampleInfo();
  info.container_id = "abc123";
  info.runtime = "containerd";
  const std::string text = infoText(info);
  EXPECT_NE(text.find("container_id      abc123\n"), std::string::npos) << text;
  EXPECT_NE(text.find("runtime           containerd\n"), std::string::npos) << text;
}

TEST(InfoJson, Fields) {
  EXPECT_EQ(infoJson(sampleInfo()),
            "{\n"
            "  \"agent_version\": \"0.1.0\",\n"
            "  \"protocol_version\": \"1.0\",\n"
            "  \"session_id\": \"s-42\",\n"
            "  \"target\": {\n"
            "    \"mode\": \"targeted\",\n"
            "    \"pid\": 1234,\n"
            "    \"netns_inode\": 4026532281,\n"
            "    \"netns\": \"net:[4026532281]\",\n"
            "    \"container_id\": \"\",\n"
            "    \"runtime\": \"\"\n"
            "  },\n"
            "  \"features\": [\n"
            "    \"info\",\n"
            "    \"env\",\n"
            "    \"outgoing_tcp\"\n"
            "  ],\n"
            "  \"sessions\": 2,\n"
            "  \"hostname\": \"node-1\",\n"
            "  \"uptime_ms\": 65000\n"
            "}\n");
}

TEST(EnvText, SortedNameValueLines) {
  auto env = envOf({{"PATH", "/bin"}, {"A", "x=y"}, {"EMPTY", ""}});
  EXPECT_EQ(envText(env), "A=x=y\nEMPTY=\nPATH=/bin\n");
}

TEST(EnvText, Empty) { EXPECT_EQ(envText({}), ""); }

TEST(EnvJson, ObjectOfEscapedValues) {
  auto env = envOf({{"Z", "caf\xC3\xA9"}, {"B", "line1\nline2\t\"q\"\x01"}, {"A", ""}});
  EXPECT_EQ(envJson(env),
            "{\n"
            "  \"A\": \"\",\n"
            "  \"B\": \"line1\\nline2\\t\\\"q\\\"\\u0001\",\n"
            "  \"Z\": \"caf\xC3\xA9\"\n"
            "}\n");
}

TEST(EnvJson, Empty) { EXPECT_EQ(envJson({}), "{}\n"); }

}  // namespace
}  // namespace siphon::cli
