#include "agent/common/log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace siphon::agent::log {
namespace {

TEST(LogTest, TextLineHasEventAndFields) {
  std::string line = formatLine(Format::kText, Level::kInfo, "session_opened",
                                {{"session", "ab12"}, {"client", "my cli"}, {"n", 3}}, "T");
  EXPECT_EQ(line, "T info session_opened session=ab12 client=\"my cli\" n=3");
}

TEST(LogTest, JsonLineIsOneEscapedObject) {
  std::string line = formatLine(Format::kJson, Level::kWarn, "client_rejected",
                                {{"reason", "bad \"token\"\n"}, {"code", 6}, {"ok", false}}, "T");
  EXPECT_EQ(line,
            "{\"time\":\"T\",\"level\":\"warn\",\"event\":\"client_rejected\","
            "\"reason\":\"bad \\\"token\\\"\\n\",\"code\":6,\"ok\":false}");
}

TEST(LogTest, ControlCharactersInFieldsAreEscaped) {
  std::string line =
      formatLine(Format::kJson, Level::kInfo, "e", {{"v", std::string("a\x01z", 3)}}, "T");
  EXPECT_NE(line.find("\"v\":\"a\\u0001z\""), std::string::npos) << line;
}

TEST(LogTest, RejectsUnknownFormatAndLevel) {
  Format f;
  EXPECT_FALSE(parseFormat("xml", &f).ok());
  EXPECT_TRUE(parseFormat("json", &f).ok());
  EXPECT_EQ(f, Format::kJson);
  EXPECT_FALSE(init(Format::kText, "loud").ok());
  EXPECT_TRUE(init(Format::kText, "info").ok());
}

TEST(LogTest, EnabledFollowsTheConfiguredLevel) {
  ASSERT_TRUE(init(Format::kText, "info").ok());
  EXPECT_FALSE(enabled(Level::kDebug));
  EXPECT_TRUE(enabled(Level::kInfo));
  EXPECT_TRUE(enabled(Level::kError));
  ASSERT_TRUE(init(Format::kText, "debug").ok());
  EXPECT_TRUE(enabled(Level::kDebug));
  ASSERT_TRUE(init(Format::kText, "error").ok());
  EXPECT_FALSE(enabled(Level::kWarn));
  EXPECT_TRUE(enabled(Level::kError));
  ASSERT_TRUE(init(Format::kText, "info").ok());
}

TEST(ThrottleTest, LogsPowersOfTwoPerKeyWithTheCount) {
  Throttle t;
  std::vector<uint64_t> logged;
  for (int i = 0; i < 100; ++i) {
    if (uint64_t n = t.hit("handshake_timeout")) logged.push_back(n);
  }
  EXPECT_EQ(logged, (std::vector<uint64_t>{1, 2, 4, 8, 16, 32, 64}));
  // Another key has its own count.
  EXPECT_EQ(t.hit("tls_failed"), 1u);
  EXPECT_EQ(t.hit("handshake_timeout"), 0u);  // the 101st
}

TEST(ThrottleTest, ACoroutineFailingPerConnectionLogsLogarithmically) {
  ASSERT_TRUE(init(Format::kText, "info").ok());
  testing::internal::CaptureStderr();
  for (int i = 0; i < 1000; ++i) coroutineFailed("passthrough_test_only", "boom");
  const std::string out = testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (size_t p = out.find("coroutine_failed"); p != std::string::npos;
       p = out.find("coroutine_failed", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 10u) << out;  // 1, 2, 4, ... 512
  EXPECT_NE(out.find("what=passthrough_test_only error=boom count=512"), std::string::npos) << out;
}

}  // namespace
}  // namespace siphon::agent::log
