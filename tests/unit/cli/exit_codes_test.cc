#include "cli/exit_codes.h"

#include <gtest/gtest.h>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

TEST(ConnectFailure, UnreachableKeepsTheClientsMessage) {
  Failure f = connectFailure(
      protoError(v1::UNAVAILABLE, "cannot reach the agent: 127.0.0.1:7140: Connection refused"));
  EXPECT_EQ(f.exit_code, kExitUnreachable);
  EXPECT_EQ(f.message, "cannot reach the agent: 127.0.0.1:7140: Connection refused");
}

TEST(ConnectFailure, TimeoutIsUnreachable) {
  Failure f = connectFailure(protoError(v1::TIMEOUT, "no Welcome within 5000 ms"));
  EXPECT_EQ(f.exit_code, kExitUnreachable);
  EXPECT_EQ(f.message, "cannot reach the agent: no Welcome within 5000 ms");
}

TEST(ConnectFailure, RejectsExitWithFour) {
  for (auto code : {v1::UNAUTHENTICATED, v1::UNSUPPORTED_VERSION, v1::RESOURCE_EXHAUSTED,
                    v1::AGENT_DRAINING, v1::SESSION_EXPIRED}) {
    Failure f = connectFailure(protoError(code, "nope"));
    EXPECT_EQ(f.exit_code, kExitRejected) << errorCodeName(code);
    EXPECT_EQ(f.message, "agent rejected the session: " + errorCodeName(code) + ": nope");
  }
}

TEST(ConnectFailure, GarbageFromThePeerIsAnError) {
  Failure f = connectFailure(protoError(v1::FRAME_TOO_LARGE, "frame of 1347703880 bytes"));
  EXPECT_EQ(f.exit_code, kExitError);
  EXPECT_NE(f.message.find("is it a siphon-agent?"), std::string::npos);
}

TEST(RequestFailure, CodesAndMessage) {
  Failure lost = requestFailure("env", protoError(v1::AGENT_LOST, "session lost"));
  EXPECT_EQ(lost.exit_code, kExitUnreachable);
  EXPECT_EQ(lost.message, "env failed: AGENT_LOST: session lost");

  Failure timeout = requestFailure("info", protoError(v1::TIMEOUT, "no response"));
  EXPECT_EQ(timeout.exit_code, kExitUnreachable);

  Failure denied = requestFailure("env", protoError(v1::PERMISSION_DENIED, "/proc/1/environ"));
  EXPECT_EQ(denied.exit_code, kExitError);
  EXPECT_EQ(denied.message, "env failed: PERMISSION_DENIED: /proc/1/environ");
}

TEST(ExitCodes, DocumentedValues) {
  EXPECT_EQ(kExitOk, 0);
  EXPECT_EQ(kExitError, 1);
  EXPECT_EQ(kExitUsage, 2);
  EXPECT_EQ(kExitUnreachable, 3);
  EXPECT_EQ(kExitRejected, 4);
}

}  // namespace
}  // namespace siphon::cli
