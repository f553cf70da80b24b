#include "agent/common/duration.h"

#include <gtest/gtest.h>

namespace siphon::agent {
namespace {

using std::chrono::milliseconds;

TEST(DurationTest, ParsesUnits) {
  EXPECT_EQ(*parseDuration("250ms"), milliseconds(250));
  EXPECT_EQ(*parseDuration("30s"), milliseconds(30000));
  EXPECT_EQ(*parseDuration("2m"), milliseconds(120000));
  EXPECT_EQ(*parseDuration("1h"), milliseconds(3600000));
  EXPECT_EQ(*parseDuration("0"), milliseconds(0));
  EXPECT_EQ(*parseDuration("0s"), milliseconds(0));
}

TEST(DurationTest, RejectsWhatIsNotADuration) {
  for (const char* bad : {"", "s", "10", "-1s", "1.5s", "10 s", "10sec", "99999999999999999h"}) {
    auto d = parseDuration(bad);
    EXPECT_FALSE(d.ok()) << bad;
    if (!d.ok()) {
      EXPECT_NE(d.status().message().find("bad duration"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace siphon::agent
