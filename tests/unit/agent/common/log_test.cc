#include "agent/common/log.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace siphon::agent::log
