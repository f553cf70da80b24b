#include "cli/steal_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

using ::testing::HasSubstr;

std::string specError(const absl::Status& s) { return std::string(s.message()); }

TEST(ParseStealTarget, HostAndPort) {
  auto r = parseStealTarget("127.0.0.1:9000");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host, "127.0.0.1");
  EXPECT_EQ(r->to_port, 9000);
  EXPECT_EQ(r->to(), "127.0.0.1:9000");

  auto name = parseStealTarget("localhost:65535");
  ASSERT_TRUE(name.ok()) << name.status();
  EXPECT_EQ(name->host, "localhost");
  EXPECT_EQ(name->to_port, 65535);
}

TEST(ParseStealTarget, Ipv6InBrackets) {
  auto r = parseStealTarget("[::1]:8080");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host, "::1");
  EXPECT_EQ(r->to_port, 8080);
  EXPECT_EQ(r->to(), "[::1]:8080");
}

TEST(ParseStealTarget, MalformedValuesAreNamedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"9000", "no port"},
      {"host:", "port must be"},
      {":9000", "no host"},
      {"host:http", "port must be"},
      {"host:0", "port must be"},
      {"host:65536", "port must be"},
      {"host:+80", "port must be"},
      {"host:123456", "port must be"},
      {"::1:80", "[brackets]"},
      {"[::1:80", "unbalanced"},
      {"[::1]80", "no port after"},
      {"[::1]:", "port must be"},
      {"[]:80", "no host"},
      {"a]:80", "unbalanced"},
      {"", "no port"},
  };
  for (const auto& [in, why] : cases) {
    auto r = parseStealTarget(in);
    ASSERT_FALSE(r.ok()) << in;
    EXPECT_EQ(errorCodeOf(r.status()), v1::INVALID_ARGUMENT) << in;
    EXPECT_THAT(specError(r.status()), HasSubstr("'" + in + "'")) << in;
    EXPECT_THAT(specError(r.status()), HasSubstr(why)) << in;
  }
}

TEST(PairStealRoutes, IthToGoesWithIthPort) {
  auto routes = pairStealRoutes({"80", "443"}, {"127.0.0.1:8080", "[::1]:8443"});
  ASSERT_TRUE(routes.ok()) << routes.status();
  ASSERT_EQ(routes->size(), 2u);
  EXPECT_EQ((*routes)[0].port, 80);
  EXPECT_EQ((*routes)[0].to(), "127.0.0.1:8080");
  EXPECT_EQ((*routes)[1].port, 443);
  EXPECT_EQ((*routes)[1].to(), "[::1]:8443");
}

TEST(PairStealRoutes, CountMismatchSaysHowToPair) {
  auto r = pairStealRoutes({"80", "443"}, {"127.0.0.1:8080"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(errorCodeOf(r.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(specError(r.status()), HasSubstr("2 --port but 1 --to"));
  EXPECT_THAT(specError(r.status()), HasSubstr("one --to per --port"));

  EXPECT_FALSE(pairStealRoutes({"80"}, {"a:1", "b:2"}).ok());
  EXPECT_FALSE(pairStealRoutes({}, {}).ok());
}

TEST(PairStealRoutes, PortsOutsideOneTo65535AreRefused) {
  for (const char* bad : {"0", "65536", "-1", "http", "", " 80", "80 ", "1e3"}) {
    auto r = pairStealRoutes({bad}, {"127.0.0.1:9000"});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(specError(r.status()), HasSubstr(std::string("bad --port '") + bad + "'")) << bad;
  }
  auto edge = pairStealRoutes({"1", "65535"}, {"h:1", "h:2"});
  ASSERT_TRUE(edge.ok()) << edge.status();
}

TEST(PairStealRoutes, BadToIsNamed) {
  auto r = pairStealRoutes({"80", "81"}, {"h:1", "nope"});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(specError(r.status()), HasSubstr("bad --to 'nope'"));
}

TEST(PairStealRoutes, APortGivenTwiceIsRefused) {
  auto r = pairStealRoutes({"80", "80"}, {"h:1", "h:2"});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(specError(r.status()), HasSubstr("--port 80 is given twice"));
}

StolenEvent sampleEvent() {
  StolenEvent e;
  e.source = "10.1.2.3:40000";
  e.destination = "10.0.0.5:80";
  e.port = 80;
  e.to = "127.0.0.1:9000";
  e.in = 123;
  e.out = 456;
  return e;
}

TEST(StealLines, Text) {
  StealRoute route{80, "127.0.0.1", 9000};
  EXPECT_EQ(stealingLine(route, "sk_lookup", 7, false),
            "stealing port 80 -> 127.0.0.1:9000 (backend sk_lookup)\n");
  StolenEvent e = sampleEvent();
  EXPECT_EQ(openLine(e, false), "open 10.1.2.3:40000 -> :80 => 127.0.0.1:9000\n");
  EXPECT_EQ(closeLine(e, false), "close 10.1.2.3:40000 -> :80 in=123 out=456\n");
  e.error = "local: Connection reset by peer";
  EXPECT_EQ(closeLine(e, false),
            "close 10.1.2.3:40000 -> :80 in=123 out=456 (local: Connection reset by peer)\n");
  e.error = "connect 127.0.0.1:9000: Connection refused";
  EXPECT_EQ(failedLine(e, false),
            "failed 10.1.2.3:40000 -> :80 => 127.0.0.1:9000: connect 127.0.0.1:9000: "
            "Connection refused\n");
  EXPECT_EQ(summaryLine({3, 1, 10, 20}, false),
            "summary: 3 connections, in=10 bytes, out=20 bytes\n");
  EXPECT_EQ(stoppingLine(1, false),
            "stopping: waiting for 1 open connection (signal again to end them)\n");
  EXPECT_EQ(stoppingLine(2, false),
            "stopping: waiting for 2 open connections (signal again to end them)\n");
}

TEST(StealLines, JsonIsOneObjectPerLine) {
  StealRoute route{443, "::1", 8443};
  EXPECT_EQ(stealingLine(route, "iptables", 7, true),
            "{\"event\":\"stealing\",\"port\":443,\"to\":\"[::1]:8443\",\"backend\":\"iptables\","
            "\"subscription_id\":7}\n");
  StolenEvent e = sampleEvent();
  EXPECT_EQ(openLine(e, true),
            "{\"event\":\"open\",\"source\":\"10.1.2.3:40000\",\"destination\":\"10.0.0.5:80\","
            "\"port\":80,\"to\":\"127.0.0.1:9000\"}\n");
  EXPECT_EQ(closeLine(e, true),
            "{\"event\":\"close\",\"source\":\"10.1.2.3:40000\",\"destination\":\"10.0.0.5:80\","
            "\"port\":80,\"to\":\"127.0.0.1:9000\",\"in\":123,\"out\":456}\n");
  e.error = "say \"no\"";
  EXPECT_THAT(closeLine(e, true), HasSubstr(",\"error\":\"say \\\"no\\\"\"}\n"));
  EXPECT_THAT(failedLine(e, true), HasSubstr("{\"event\":\"failed\","));
  EXPECT_EQ(summaryLine({3, 1, 10, 20}, true),
            "{\"event\":\"summary\",\"connections\":3,\"failed\":1,\"in\":10,\"out\":20}\n");
  EXPECT_EQ(stoppingLine(2, true), "{\"event\":\"stopping\",\"open_connections\":2}\n");
}

// Continuity lines: one per move to another agent, per port not taken
// again, per resume.
TEST(StealLines, MovesAndResumes) {
  AgentMove lost{"10.0.0.1:7140", "10.0.0.2:7140", "Connection refused", false, 3, 1, 0};
  EXPECT_EQ(movedLine(lost, false),
            "agent 10.0.0.1:7140 lost (Connection refused); moved to agent 10.0.0.2:7140; 3 "
            "connections reset\n");
  AgentMove drain{"a:1", "b:2", "draining (SIGTERM)", true, 1, 1, 1};
  EXPECT_EQ(movedLine(drain, false),
            "agent a:1 draining; moved to agent b:2; 1 connection finishing on a:1; 1 port could "
            "not be stolen again\n");
  EXPECT_EQ(movedLine(drain, true),
            "{\"event\":\"agent_moved\",\"from\":\"a:1\",\"to\":\"b:2\",\"reason\":"
            "\"draining (SIGTERM)\",\"draining\":true,\"connections\":1,\"ports_back\":1,"
            "\"ports_lost\":1}\n");
  EXPECT_EQ(restealFailedLine(80, "b:2", "PORT_BUSY: held by alice", false),
            "steal port 80 on agent b:2 failed: PORT_BUSY: held by alice (the port is no longer "
            "stolen)\n");
  EXPECT_EQ(restealFailedLine(80, "b:2", "x", true),
            "{\"event\":\"steal_lost\",\"port\":80,\"agent\":\"b:2\",\"error\":\"x\"}\n");
  EXPECT_EQ(resumedLine("a:1", "connection closed by a:1", false),
            "connection to agent a:1 cut (connection closed by a:1); session resumed, nothing "
            "lost\n");
  EXPECT_EQ(resumedLine("a:1", "x", true),
            "{\"event\":\"resumed\",\"agent\":\"a:1\",\"cut\":\"x\"}\n");
}

// ------------------------------------------------------------ filters

TEST(ParseHttpFilter, NoFilterFlagsIsTheWholePort) {
  auto f = parseHttpFilter({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->has_value());
}

TEST(ParseHttpFilter, HeaderSplitsAtTheFirstColonAndTrimsBlanks) {
  FilterFlags flags;
  flags.headers = {"X-User:  ^alice$ ", "x-trace:a:b", "X-Any:", "\tAccept : text/.*"};
  auto f = parseHttpFilter(flags);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  const v1::HttpFilter& filter = **f;
  ASSERT_EQ(filter.headers_size(), 4);
  EXPECT_EQ(filter.headers(0).name(), "X-User");
  EXPECT_EQ(filter.headers(0).value_regex(), "^alice$");
  EXPECT_EQ(filter.headers(1).name(), "x-trace");
  EXPECT_EQ(filter.headers(1).value_regex(), "a:b");
  EXPECT_EQ(filter.headers(2).name(), "X-Any");
  EXPECT_EQ(filter.headers(2).value_regex(), "");  // any value: the header is there
  EXPECT_EQ(filter.headers(3).name(), "Accept");
  EXPECT_EQ(filter.headers(3).value_regex(), "text/.*");
  EXPECT_EQ(filter.path_regex(), "");
  EXPECT_EQ(filter.method(), "");
  EXPECT_FALSE(filter.match_any());
}

TEST(ParseHttpFilter, PathMethodAndAny) {
  FilterFlags flags;
  flags.path = "^/api/";
  flags.method = "POST";
  flags.any = true;
  auto f = parseHttpFilter(flags);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->has_value());
  EXPECT_EQ((*f)->headers_size(), 0);
  EXPECT_EQ((*f)->path_regex(), "^/api/");
  EXPECT_EQ((*f)->method(), "POST");
  EXPECT_TRUE((*f)->match_any());
}

TEST(ParseHttpFilter, MistakesAreNamed) {
  const std::vector<std::pair<FilterFlags, std::string>> cases = {
      {{{"X-User alice"}, {}, {}, false}, "bad --filter-header 'X-User alice': want 'Name: regex'"},
      {{{": alice"}, {}, {}, false}, "'' is not a header name"},
      {{{"X User: alice"}, {}, {}, false}, "'X User' is not a header name"},
      {{{"X-Us\xc3\xa9r: a"}, {}, {}, false}, "is not a header name"},
      {{{"X-User: a", "(x): b"}, {}, {}, false}, "'(x)' is not a header name"},
      {{{}, std::string(""), {}, false}, "--filter-path is empty"},
      {{{}, {}, std::string("GE T"), false}, "bad --filter-method 'GE T'"},
      {{{}, {}, std::string(""), false}, "bad --filter-method ''"},
      {{{}, {}, {}, true}, "--filter-any needs filters"},
  };
  for (const auto& [flags, why] : cases) {
    auto f = parseHttpFilter(flags);
    ASSERT_FALSE(f.ok()) << why;
    EXPECT_EQ(errorCodeOf(f.status()), v1::INVALID_ARGUMENT) << why;
    EXPECT_THAT(specError(f.status()), HasSubstr(why));
  }
}

TEST(IsHttpToken, TcharsOnly) {
  EXPECT_TRUE(isHttpToken("X-User"));
  EXPECT_TRUE(isHttpToken("!#$%&'*+-.^_`|~09azAZ"));
  EXPECT_FALSE(isHttpToken(""));
  EXPECT_FALSE(isHttpToken("a b"));
  EXPECT_FALSE(isHttpToken("a:b"));
  EXPECT_FALSE(isHttpToken("a\"b"));
  EXPECT_FALSE(isHttpToken("a\x7f"));
}

TEST(FilterText, AllOfAndAnyOf) {
  FilterFlags flags;
  flags.headers = {"x-user: alice"};
  auto one = parseHttpFilter(flags);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(filterText(**one), "header x-user: alice");
  flags.path = "^/api";
  flags.method = "GET";
  auto all = parseHttpFilter(flags);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(filterText(**all), "header x-user: alice and path ^/api and method GET");
  flags.any = true;
  auto any = parseHttpFilter(flags);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(filterText(**any), "header x-user: alice or path ^/api or method GET");
}

TEST(StealLines, StealingNamesTheFilter) {
  StealRoute route{80, "127.0.0.1", 9000};
  FilterFlags flags;
  flags.headers = {"x-user: alice"};
  auto f = parseHttpFilter(flags);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(stealingLine(route, "sk_lookup", 7, false, &**f),
            "stealing port 80 -> 127.0.0.1:9000 (backend sk_lookup, filter header x-user: "
            "alice)\n");
  EXPECT_EQ(stealingLine(route, "sk_lookup", 7, true, &**f),
            "{\"event\":\"stealing\",\"port\":80,\"to\":\"127.0.0.1:9000\",\"backend\":"
            "\"sk_lookup\",\"subscription_id\":7,\"filter\":\"header x-user: alice\"}\n");
}

RequestEvent sampleRequest() {
  RequestEvent e;
  e.source = "10.1.2.3:40000";
  e.destination = "10.0.0.5:80";
  e.port = 80;
  e.to = "127.0.0.1:9000";
  e.method = "GET";
  e.path = "/api/x?y=1";
  e.status = 200;
  e.in = 123;
  e.out = 456;
  return e;
}

TEST(StealLines, Requests) {
  RequestEvent e = sampleRequest();
  EXPECT_EQ(requestLine(e, false),
            "request 10.1.2.3:40000 GET /api/x?y=1 -> 127.0.0.1:9000: 200 in=123 out=456\n");
  EXPECT_EQ(requestLine(e, true),
            "{\"event\":\"request\",\"source\":\"10.1.2.3:40000\",\"destination\":"
            "\"10.0.0.5:80\",\"port\":80,\"method\":\"GET\",\"path\":\"/api/x?y=1\","
            "\"to\":\"127.0.0.1:9000\",\"status\":200,\"in\":123,\"out\":456}\n");
  e.status = 502;
  e.error = "connect 127.0.0.1:9000: Connection refused";
  EXPECT_EQ(requestLine(e, false),
            "request 10.1.2.3:40000 GET /api/x?y=1 -> 127.0.0.1:9000: 502 in=123 out=456 "
            "(connect 127.0.0.1:9000: Connection refused)\n");
  EXPECT_THAT(requestLine(e, true),
              HasSubstr("\"status\":502,\"in\":123,\"out\":456,\"error\":\"connect "));
  e.status = 0;
  e.error = "reset by the agent: CANCELLED: gone";
  EXPECT_EQ(requestLine(e, false),
            "request 10.1.2.3:40000 GET /api/x?y=1 -> 127.0.0.1:9000: reset in=123 out=456 "
            "(reset by the agent: CANCELLED: gone)\n");
}

TEST(StealLines, Overlaps) {
  OverlapEvent e{80, 7, "bob", 3, "GET", "/x"};
  EXPECT_EQ(overlapLine(e, false),
            "overlap: 3 requests to port 80 matching this filter went to subscription 7 of "
            "client \"bob\" (first: GET /x)\n");
  EXPECT_EQ(overlapLine(e, true),
            "{\"event\":\"overlap\",\"port\":80,\"requests\":3,\"taken_by\":7,"
            "\"taken_by_client\":\"bob\",\"method\":\"GET\",\"path\":\"/x\"}\n");
  OverlapEvent one{443, 2, "", 1, "", ""};
  EXPECT_EQ(overlapLine(one, false),
            "overlap: 1 request to port 443 matching this filter went to subscription 2\n");
}

TEST(StealLines, SummaryCountsRequestsOfAFilteredSteal) {
  StealTotals t{0, 0, 10, 20};
  t.filtered = true;
  t.requests = 5;
  t.requests_failed = 1;
  EXPECT_EQ(summaryLine(t, false),
            "summary: 0 connections, 5 requests (1 failed), in=10 bytes, out=20 bytes\n");
  EXPECT_EQ(summaryLine(t, true),
            "{\"event\":\"summary\",\"connections\":0,\"failed\":0,\"requests\":5,"
            "\"requests_failed\":1,\"in\":10,\"out\":20}\n");
  t.requests = 1;
  t.requests_failed = 0;
  EXPECT_EQ(summaryLine(t, false),
            "summary: 0 connections, 1 request, in=10 bytes, out=20 bytes\n");
  EXPECT_EQ(stoppingLine(1, false, 2),
            "stopping: waiting for 1 open connection and 2 requests (signal again to end them)\n");
  EXPECT_EQ(stoppingLine(0, true, 1),
            "{\"event\":\"stopping\",\"open_connections\":0,\"open_requests\":1}\n");
}

}  // namespace
}  // namespace siphon::cli
