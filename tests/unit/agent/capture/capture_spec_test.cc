// CaptureStart -> CaptureSpec: defaults, limits, and the names refused
// before anything reaches libpcap.
#include "agent/capture/capture_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::capture {
namespace {

using ::testing::HasSubstr;

constexpr size_t kBigFrame = (1u << 20) - 32;

v1::CaptureStart start(std::string interface, std::string filter, uint32_t snaplen = 0) {
  v1::CaptureStart s;
  s.set_interface(std::move(interface));
  s.set_filter(std::move(filter));
  s.set_snaplen(snaplen);
  return s;
}

TEST(CaptureSpec, Defaults) {
  auto spec = captureSpec(start("", ""), kBigFrame);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->interface, "any");
  EXPECT_EQ(spec->filter, "");
  EXPECT_EQ(spec->snaplen, kDefaultSnaplen);
  EXPECT_GT(spec->buffer_bytes, 0u);
}

TEST(CaptureSpec, KeepsWhatWasAsked) {
  auto spec = captureSpec(start("eth0", "tcp port 80", 96), kBigFrame);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->interface, "eth0");
  EXPECT_EQ(spec->filter, "tcp port 80");
  EXPECT_EQ(spec->snaplen, 96u);
}

TEST(CaptureSpec, SnaplenAboveTheMaximumIsTheMaximum) {
  auto spec = captureSpec(start("lo", "", 1u << 30), kBigFrame);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->snaplen, kDefaultSnaplen);
}

TEST(CaptureSpec, SnaplenFitsOneFrame) {
  // A session with 4 KiB frames: each record must still be one Data frame.
  auto spec = captureSpec(start("any", ""), 4000);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->snaplen, 4000u - 16u);
  auto small = captureSpec(start("any", "", 100), 4000);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->snaplen, 100u);
  auto none = captureSpec(start("any", ""), 16);
  EXPECT_EQ(errorCodeOf(none.status()), v1::INVALID_ARGUMENT);
}

TEST(CaptureSpec, InterfaceNamesLinuxRefuses) {
  // 16 bytes is one past IFNAMSIZ - 1.
  for (const std::string& bad : {std::string(16, 'e'), std::string("."), std::string(".."),
                                 std::string("eth0/1"), std::string("eth0:1"), std::string("eth 0"),
                                 std::string("eth\t0"), std::string("et\0h", 4)}) {
    auto spec = captureSpec(start(bad, ""), kBigFrame);
    EXPECT_EQ(errorCodeOf(spec.status()), v1::INVALID_ARGUMENT) << "'" << bad << "'";
  }
  // 15 bytes is the longest name Linux takes.
  EXPECT_TRUE(captureSpec(start(std::string(15, 'e'), ""), kBigFrame).ok());
  auto spec = captureSpec(start("eth0/1", ""), kBigFrame);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("'eth0/1'"));
}

TEST(CaptureSpec, FilterWithNulOrTooLong) {
  auto nul = captureSpec(start("any", std::string("tcp\0port 80", 11)), kBigFrame);
  EXPECT_EQ(errorCodeOf(nul.status()), v1::INVALID_ARGUMENT);
  auto huge = captureSpec(start("any", std::string(kMaxFilterBytes + 1, 'x')), kBigFrame);
  EXPECT_EQ(errorCodeOf(huge.status()), v1::INVALID_ARGUMENT);
  EXPECT_TRUE(captureSpec(start("any", std::string(kMaxFilterBytes, 'x')), kBigFrame).ok());
}

// The agent used to take 64 KiB of filter, which libpcap's optimizer needs
// minutes for; the limit is now far below and the refusal names it.
TEST(CaptureSpec, AFilterOverTheLimitIsRefusedNamingIt) {
  std::string chain = "host 10.0.0.1";
  while (chain.size() <= 16 * 1024) chain += " or host 10.0.0.1";
  auto spec = captureSpec(start("any", chain), kBigFrame);
  EXPECT_EQ(errorCodeOf(spec.status()), v1::INVALID_ARGUMENT) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr(absl::StrCat("capture filter of ", chain.size(), " bytes: at most ",
                                     kMaxFilterBytes, " bytes are taken")));
  EXPECT_LT(kMaxFilterBytes, 16u * 1024);
}

}  // namespace
}  // namespace siphon::agent::capture
