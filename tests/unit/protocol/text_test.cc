#include "siphon/text.h"

#include <gtest/gtest.h>

#include "siphon/status.h"

namespace siphon {
namespace {

using std::chrono::milliseconds;

TEST(TextTest, ParsesDurations) {
  EXPECT_EQ(*parseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(*parseDuration("30s"), milliseconds(30000));
  EXPECT_EQ(*parseDuration("1.5s"), milliseconds(1500));
  EXPECT_EQ(*parseDuration("2m"), milliseconds(120000));
  EXPECT_EQ(*parseDuration("1h"), milliseconds(3600000));
  EXPECT_EQ(*parseDuration("10"), milliseconds(10000));
  EXPECT_EQ(*parseDuration("0"), milliseconds(0));
  EXPECT_EQ(*parseDuration("0s"), milliseconds(0));
}

TEST(TextTest, RejectsWhatIsNotADuration) {
  for (const char* bad : {"", "s", "-1s", "10 s", "10sec", "1..5s", "99999999999999999h"}) {
    auto d = parseDuration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_EQ(errorCodeOf(d.status()), v1::INVALID_ARGUMENT);
      EXPECT_NE(d.status().message().find("bad duration"), std::string::npos);
    }
  }
}

TEST(TextTest, Utf8LossyKeepsValidTextAndReplacesBadRuns) {
  EXPECT_EQ(toUtf8Lossy("plain \xC3\xA9"), "plain \xC3\xA9");
  EXPECT_EQ(toUtf8Lossy("a\xFF\xFEz"), "a\xEF\xBF\xBDz");  // one run, one U+FFFD
  EXPECT_EQ(toUtf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(utf8SequenceAt("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(utf8SequenceAt("\xC0\xAF", 0), 0u);  // overlong
}

TEST(TextTest, JsonStringEscapes) {
  EXPECT_EQ(jsonString("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
}

}  // namespace
}  // namespace siphon
