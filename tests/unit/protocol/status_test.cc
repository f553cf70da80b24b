// Status helpers (siphon/status.h): an errno from a system call against one
// the agent chose (errnoRefusal), and both over the wire.
#include "siphon/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace siphon {
namespace {

TEST(StatusTest, ASystemCallErrnoHasNoReason) {
  const absl::Status s = errnoStatus(ENOENT, "open /etc/missing");
  EXPECT_EQ(s.message(), "open /etc/missing: No such file or directory");
  EXPECT_EQ(errnoOf(s), ENOENT);
  EXPECT_EQ(errorCodeOf(s), v1::ERRNO);
  EXPECT_EQ(errnoReason(s), "");
  EXPECT_EQ(errnoReason(errnoStatus(EACCES, "")), "") << "no context";
  EXPECT_EQ(errnoReason(fromProtoError(toProtoError(s))), "") << "after the wire";
}

TEST(StatusTest, ARefusalKeepsItsReasonAcrossTheWire) {
  const absl::Status s = errnoRefusal(EMFILE, "open file limit of 2 reached");
  EXPECT_EQ(errnoOf(s), EMFILE);
  EXPECT_EQ(errorCodeOf(s), v1::ERRNO);
  EXPECT_EQ(s.code(), errnoStatus(EMFILE, "x").code()) << "the same canonical code";
  EXPECT_EQ(errnoReason(s), "open file limit of 2 reached");
  const v1::Error wire = toProtoError(s);
  EXPECT_EQ(wire.errno_value(), EMFILE);
  EXPECT_EQ(errnoReason(fromProtoError(wire)), "open file limit of 2 reached");
}

TEST(StatusTest, OnlyErrnoStatusesHaveReasons) {
  EXPECT_EQ(errnoReason(protoError(v1::NOT_FOUND, "no such stream")), "");
  EXPECT_EQ(errnoReason(absl::InternalError("boom")), "");
  EXPECT_EQ(errnoReason(absl::OkStatus()), "");
}

}  // namespace
}  // namespace siphon
