// What `siphon sessions` prints (cli/sessions_output.h), from the typed
// API's SessionInfo.
#include "cli/sessions_output.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace siphon::cli {
namespace {

std::vector<client::SessionInfo> sampleSessions() {
  client::SessionInfo mine;
  mine.session_id = "s-1";
  mine.client_name = "siphon";
  mine.state = "attached";
  mine.age_ms = 850;
  mine.current = true;
  mine.streams = 2;
  mine.bytes_in = 10;
  mine.bytes_out = 2048;
  mine.subscriptions.push_back({7, "steal", 80, "header x-user: ^me$", "sk_lookup", false});
  mine.subscriptions.push_back({8, "mirror", 8080, "", "tc", true});
  client::SessionInfo other;
  other.session_id = "s-22";
  other.state = "detached";
  other.age_ms = 65'000;
  return {mine, other};
}

TEST(SubscriptionText, KindPortFilterAndDirections) {
  EXPECT_EQ(subscriptionText({1, "steal", 80, "", "iptables", false}), "steal 80");
  EXPECT_EQ(subscriptionText({1, "steal", 80, "path ^/api", "sk_lookup", false}),
            "steal 80 [path ^/api]");
  EXPECT_EQ(subscriptionText({2, "mirror", 8080, "", "tc", true}), "mirror 8080 both");
}

TEST(SessionsText, AlignedRowsThisOneStarred) {
  EXPECT_EQ(sessionsText(sampleSessions()),
            "   SESSION  CLIENT  AGE    STATE     STREAMS  BYTES_IN  BYTES_OUT  SUBSCRIPTIONS\n"
            "*  s-1      siphon  850ms  attached  2        10        2048       "
            "steal 80 [header x-user: ^me$], mirror 8080 both\n"
            "   s-22     -       1m05s  detached  0        0         0          -\n");
}

// A session that moved to a new agent process says how often, in STATE.
TEST(SessionsText, HandoversShowInTheState) {
  std::vector<client::SessionInfo> sessions = sampleSessions();
  sessions[0].handovers = 1;
  sessions[1].handovers = 3;
  const std::string text = sessionsText(sessions);
  EXPECT_NE(text.find("  attached (1 handover)  "), std::string::npos) << text;
  EXPECT_NE(text.find("  detached (3 handovers)  "), std::string::npos) << text;
}

TEST(SessionsText, NoSessionsIsTheHeaderAlone) {
  EXPECT_EQ(sessionsText({}),
            "  SESSION  CLIENT  AGE  STATE  STREAMS  BYTES_IN  BYTES_OUT  SUBSCRIPTIONS\n");
}

TEST(SessionsJson, Fields) {
  std::vector<client::SessionInfo> sessions = sampleSessions();
  sessions[0].subscriptions.pop_back();
  sessions[0].bytes_out = 5'000'000'000;  // beyond 32 bits
  sessions[0].handovers = 2;
  EXPECT_EQ(sessionsJson(sessions),
            "{\n"
            "  \"sessions\": [\n"
            "    {\n"
            "      \"session_id\": \"s-1\",\n"
            "      \"client_name\": \"siphon\",\n"
            "      \"age_ms\": 850,\n"
            "      \"state\": \"attached\",\n"
            "      \"current\": true,\n"
            "      \"streams\": 2,\n"
            "      \"bytes_in\": 10,\n"
            "      \"bytes_out\": 5000000000,\n"
            "      \"handovers\": 2,\n"
            "      \"subscriptions\": [\n"
            "        {\n"
            "          \"id\": 7,\n"
            "          \"kind\": \"steal\",\n"
            "          \"port\": 80,\n"
            "          \"filter\": \"header x-user: ^me$\",\n"
            "          \"backend\": \"sk_lookup\",\n"
            "          \"both_directions\": false\n"
            "        }\n"
            "      ]\n"
            "    },\n"
            "    {\n"
            "      \"session_id\": \"s-22\",\n"
            "      \"client_name\": \"\",\n"
            "      \"age_ms\": 65000,\n"
            "      \"state\": \"detached\",\n"
            "      \"current\": false,\n"
            "      \"streams\": 0,\n"
            "      \"bytes_in\": 0,\n"
            "      \"bytes_out\": 0,\n"
            "      \"handovers\": 0,\n"
            "      \"subscriptions\": []\n"
            "    }\n"
            "  ]\n"
            "}\n");
}

}  // namespace
}  // namespace siphon::cli
