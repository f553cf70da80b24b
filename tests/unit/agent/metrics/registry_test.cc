// The metrics registry's text exposition format (0.0.4) and the parsers of
// /proc/self used for the process metrics.
#include "agent/metrics/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <sstream>

#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/process.h"

namespace siphon::agent::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(RegistryTest, RendersHelpTypeAndSamplesInOrder) {
  Registry r;
  r.declare("siphon_things_total", Type::kCounter, "Things that happened.", {"kind"});
  r.declare("siphon_level", Type::kGauge, "A level.");
  r.series("siphon_things_total", {"b"}).add(2);
  r.series("siphon_things_total", {"a"}).add();
  r.series("siphon_level").set(7);
  EXPECT_EQ(r.render(),
            "# HELP siphon_things_total Things that happened.\n"
            "# TYPE siphon_things_total counter\n"
            "siphon_things_total{kind=\"a\"} 1\n"
            "siphon_things_total{kind=\"b\"} 2\n"
            "# HELP siphon_level A level.\n"
            "# TYPE siphon_level gauge\n"
            "siphon_level 7\n");
}

TEST(RegistryTest, CounterIncrementsShowUpAndSeriesStayTheSame) {
  Registry r;
  r.declare("siphon_x_total", Type::kCounter, "x", {"a", "b"});
  Series& s = r.series("siphon_x_total", {"1", "2"});
  EXPECT_EQ(&s, &r.series("siphon_x_total", {"1", "2"}));
  EXPECT_THAT(r.render(), HasSubstr("siphon_x_total{a=\"1\",b=\"2\"} 0\n"));
  s.add(41);
  s.add();
  EXPECT_THAT(r.render(), HasSubstr("siphon_x_total{a=\"1\",b=\"2\"} 42\n"));
}

TEST(RegistryTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(escapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(escapeHelp("a\\b\"c\nd"), "a\\\\b\"c\\nd");
  Registry r;
  r.declare("siphon_e", Type::kGauge, "line one\nline \\two", {"path"});
  r.series("siphon_e", {"C:\\dir \"x\"\n"}).set(1);
  const std::string text = r.render();
  EXPECT_THAT(text, HasSubstr("# HELP siphon_e line one\\nline \\\\two\n"));
  EXPECT_THAT(text, HasSubstr("siphon_e{path=\"C:\\\\dir \\\"x\\\"\\n\"} 1\n"));
}

TEST(RegistryTest, CollectedFamiliesAskAtEveryRender) {
  Registry r;
  int calls = 0;
  r.declareCollected("siphon_c", Type::kGauge, "collected", {"state"}, [&] {
    ++calls;
    return std::vector<Sample>{{{"up"}, 1.5}, {{"down"}, static_cast<double>(calls)}};
  });
  EXPECT_THAT(r.render(), HasSubstr("siphon_c{state=\"up\"} 1.5\nsiphon_c{state=\"down\"} 1\n"));
  EXPECT_THAT(r.render(), HasSubstr("siphon_c{state=\"down\"} 2\n"));
}

TEST(RegistryTest, FormatsValues) {
  EXPECT_EQ(formatValue(0), "0");
  EXPECT_EQ(formatValue(12345678901.0), "12345678901");
  EXPECT_EQ(formatValue(0.25), "0.25");
  EXPECT_EQ(formatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(formatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(formatValue(0.0 / 0.0), "NaN");
}

TEST(RegistryDeathTest, MisuseAborts) {
  Registry r;
  r.declare("siphon_a", Type::kCounter, "a", {"k"});
  EXPECT_DEATH(r.declare("siphon_a", Type::kCounter, "again"), "declared twice");
  EXPECT_DEATH(r.declare("bad-name", Type::kCounter, "x"), "invalid metric name");
  EXPECT_DEATH(r.series("siphon_a"), "wrong number of labels");
  EXPECT_DEATH(r.series("siphon_nope"), "undeclared");
}

TEST(AgentMetricsTest, EveryFamilyIsTypedAndHooksMoveTheirSeries) {
  AgentMetrics m;
  m.setStateSource([] {
    LiveState s;
    s.sessions_attached = 2;
    s.sessions_detached = 1;
    s.streams[static_cast<size_t>(StreamKind::kOutgoingTcp)] = 3;
    s.ready = true;
    return s;
  });
  m.streamOpened(StreamKind::kStolen);
  m.bytesIn(StreamKind::kOutgoingTcp, 10);
  m.bytesOut(StreamKind::kOutgoingTcp, 20);
  m.gap(StreamKind::kMirrored, 100);
  m.errorSent(v1::PORT_BUSY, ErrorFrame::kResponse);
  m.resume("ok");
  m.http2LimitHit("reset_flood");
  v1::Response ok, enoent;
  enoent.mutable_error()->set_code(v1::ERRNO);
  enoent.mutable_error()->set_errno_value(ENOENT);
  m.requestAnswered(v1::Request::kFile, v1::FileRequest::kOpen, ok);
  m.requestAnswered(v1::Request::kFile, v1::FileRequest::kOpen, enoent);
  v1::Response refused;
  refused.mutable_error()->set_code(v1::UNAVAILABLE);
  m.requestAnswered(v1::Request::kDns, 0, refused);

  const std::string text = m.render();
  for (const char* line : {
           "# TYPE siphon_sessions gauge\n",
           "siphon_sessions{state=\"attached\"} 2\n",
           "siphon_sessions{state=\"detached\"} 1\n",
           "siphon_streams{kind=\"outgoing_tcp\"} 3\n",
           "# TYPE siphon_streams_opened_total counter\n",
           "siphon_streams_opened_total{kind=\"stolen\"} 1\n",
           "siphon_stolen_connections_total 1\n",
           "siphon_mirrored_connections_total 0\n",
           "siphon_stream_bytes_in_total{kind=\"outgoing_tcp\"} 10\n",
           "siphon_stream_bytes_out_total{kind=\"outgoing_tcp\"} 20\n",
           "siphon_gaps_total{kind=\"mirrored\"} 1\n",
           "siphon_gap_bytes_total{kind=\"mirrored\"} 100\n",
           "siphon_errors_sent_total{code=\"PORT_BUSY\",frame=\"response\"} 1\n",
           "siphon_errors_sent_total{code=\"ERRNO\",frame=\"response\"} 1\n",
           "siphon_errors_sent_total{code=\"UNAVAILABLE\",frame=\"response\"} 1\n",
           "siphon_resumes_total{result=\"ok\"} 1\n",
           "# TYPE siphon_http2_limits_total counter\n",
           "siphon_http2_limits_total{limit=\"reset_flood\"} 1\n",
           "siphon_file_operations_total{op=\"open\",result=\"ok\"} 1\n",
           "siphon_file_operations_total{op=\"open\",result=\"ENOENT\"} 1\n",
           "siphon_requests_total{kind=\"file\",result=\"ENOENT\"} 1\n",
           "siphon_dns_queries_total{result=\"unavailable\"} 1\n",
           "siphon_ready 1\n",
           "# TYPE siphon_process_cpu_seconds_total counter\n",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
  EXPECT_THAT(text, Not(HasSubstr("siphon_file_operations_total{op=\"none\"")));
  // Every sample line belongs to a family declared with HELP and TYPE.
  std::istringstream in(text);
  std::string l, family;
  while (std::getline(in, l)) {
    if (l.starts_with("# TYPE ")) {
      family = l.substr(7, l.find(' ', 7) - 7);
      continue;
    }
    if (l.starts_with("#")) continue;
    EXPECT_TRUE(l.starts_with(family)) << l << " after # TYPE " << family;
    EXPECT_TRUE(l.starts_with("siphon_")) << l;
  }
}

TEST(ProcessStatsTest, ParsesStatmAndStat) {
  EXPECT_EQ(parseStatmResidentPages("1000 250 100 1 0 300 0\n"), 250u);
  EXPECT_FALSE(parseStatmResidentPages("").has_value());
  // A command name with spaces and parentheses; utime 7, stime 5.
  const std::string stat =
      "42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 123 456 78 1 2 3\n";
  EXPECT_EQ(parseStatCpuTicks(stat), 12u);
  EXPECT_FALSE(parseStatCpuTicks("42 (x) S 1").has_value());
}

TEST(ProcessStatsTest, ReadsThisProcess) {
  ProcessStats st = readProcessStats();
  EXPECT_GT(st.resident_bytes, 0u);
  EXPECT_GE(st.open_fds, 3u);  // stdin, stdout, stderr
  EXPECT_GE(st.cpu_seconds, 0.0);
}

}  // namespace
}  // namespace siphon::agent::metrics
