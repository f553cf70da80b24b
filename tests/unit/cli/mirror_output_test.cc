// The pure parts of `siphon mirror`: flags, records, close reasons, the
// stdout markers and the stderr lines.
#include "cli/mirror_output.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

using ::testing::HasSubstr;

std::string messageOf(const absl::Status& s) { return std::string(s.message()); }

MirrorConnection conn(uint64_t id, bool mid_stream = false) {
  return MirrorConnection{id, "10.0.0.2:51234", "10.0.0.1:80", mid_stream};
}

// ------------------------------------------------------------ flags

TEST(ParseMirrorSpec, PortAndDestination) {
  auto s = parseMirrorSpec("80", "", false, true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->port, 80);
  EXPECT_FALSE(s->to.has_value());
  EXPECT_TRUE(s->both);

  auto to = parseMirrorSpec("65535", "[::1]:9000", false, false);
  ASSERT_TRUE(to.ok()) << to.status();
  ASSERT_TRUE(to->to.has_value());
  EXPECT_EQ(to->to->to(), "[::1]:9000");
  EXPECT_FALSE(to->both);
}

TEST(ParseMirrorSpec, BadValuesAreUsageErrorsNamingTheReason) {
  struct Case {
    std::string port, to;
    bool to_stdout, both;
    std::string why;
  };
  const std::vector<Case> cases = {
      {"0", "", false, false, "bad --port '0'"},
      {"65536", "", false, false, "bad --port '65536'"},
      {"-1", "", false, false, "bad --port"},
      {"http", "", false, false, "bad --port"},
      {"", "", false, false, "bad --port"},
      {"80", "127.0.0.1", false, false, "bad --to"},
      {"80", "127.0.0.1:9000", true, false, "--to and --stdout"},
      {"80", "127.0.0.1:9000", false, true, "--both goes with --stdout only"},
  };
  for (const auto& c : cases) {
    auto s = parseMirrorSpec(c.port, c.to, c.to_stdout, c.both);
    ASSERT_FALSE(s.ok()) << c.port << " " << c.to;
    EXPECT_EQ(errorCodeOf(s.status()), v1::INVALID_ARGUMENT);
    EXPECT_THAT(messageOf(s.status()), HasSubstr(c.why)) << c.port << " " << c.to;
  }
}

// ------------------------------------------------------------ records

TEST(ParseMirrorRecord, DirectionBytesAndFin) {
  const std::string payload("\x01GET /", 6);
  auto r = parseMirrorRecord(payload);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->direction, v1::CLIENT_TO_SERVER);
  EXPECT_EQ(r->bytes, "GET /");
  EXPECT_FALSE(r->fin);

  // Bytes are bytes: NULs and high bytes pass as they are.
  const std::string binary("\x02\x00\xff\n", 4);
  auto b = parseMirrorRecord(binary);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->direction, v1::SERVER_TO_CLIENT);
  EXPECT_EQ(b->bytes, std::string("\x00\xff\n", 3));

  const std::string fin_only("\x02", 1);
  auto fin = parseMirrorRecord(fin_only);
  ASSERT_TRUE(fin.ok()) << fin.status();
  EXPECT_EQ(fin->direction, v1::SERVER_TO_CLIENT);
  EXPECT_TRUE(fin->fin);
  EXPECT_TRUE(fin->bytes.empty());
}

TEST(ParseMirrorRecord, MalformedRecordsAreRefused) {
  EXPECT_EQ(errorCodeOf(parseMirrorRecord("").status()), v1::INVALID_ARGUMENT);
  for (char d : {'\x00', '\x03', '\xff', 'G'}) {
    const std::string payload = std::string(1, d) + "x";
    auto r = parseMirrorRecord(payload);
    EXPECT_FALSE(r.ok()) << int(d);
    EXPECT_THAT(messageOf(r.status()), HasSubstr("direction byte"));
  }
}

TEST(MirrorConnection, NamesItsEnds) {
  v1::MirroredConnection m;
  m.mutable_source()->set_ip("fd00::2");
  m.mutable_source()->set_port(40000);
  m.mutable_destination()->set_ip("10.0.0.1");
  m.mutable_destination()->set_port(80);
  m.set_started_mid_stream(true);
  MirrorConnection c = mirrorConnection(4, m);
  EXPECT_EQ(c.id, 4u);
  EXPECT_EQ(c.client, "[fd00::2]:40000");
  EXPECT_EQ(c.server, "10.0.0.1:80");
  EXPECT_TRUE(c.mid_stream);
  EXPECT_EQ(mirrorConnection(5, v1::MirroredConnection()).client, "?");
}

TEST(CloseReason, EachEndHasItsWords) {
  EXPECT_EQ(closeReason(absl::OkStatus()), "closed");
  EXPECT_EQ(closeReason(errnoStatus(ECONNRESET, "read")), "reset by peer");
  EXPECT_EQ(closeReason(protoError(v1::ERRNO, "ECONNRESET")), "reset by peer");
  EXPECT_EQ(closeReason(protoError(v1::TIMEOUT, "idle")), "idle too long");
  EXPECT_EQ(closeReason(protoError(v1::RESOURCE_EXHAUSTED, "full")),
            "dropped: the agent's connection table is full");
  EXPECT_EQ(closeReason(protoError(v1::CANCELLED, "unsubscribed")), "mirror stopped");
  EXPECT_EQ(closeReason(protoError(v1::AGENT_DRAINING, "SIGTERM")), "mirror stopped");
  EXPECT_EQ(closeReason(protoError(v1::AGENT_LOST, "gone")), "the session with the agent is lost");
  EXPECT_EQ(closeReason(protoError(v1::INTERNAL, "boom")), "reset by the agent: INTERNAL: boom");
}

// ------------------------------------------------------------ lines

TEST(MirrorLines, Text) {
  MirrorSpec to_server{80, StealRoute{0, "127.0.0.1", 9000}, false};
  EXPECT_EQ(mirroringLine(to_server, "tc", 1, false),
            "mirror: port 80 (backend tc, subscription 1): client->server bytes replayed to "
            "127.0.0.1:9000\n");
  MirrorSpec both{8080, std::nullopt, true};
  EXPECT_EQ(mirroringLine(both, "", 2, false),
            "mirror: port 8080 (backend unknown, subscription 2): both directions to stdout\n");
  EXPECT_EQ(mirroringLine(MirrorSpec{80, std::nullopt, false}, "tc", 3, false),
            "mirror: port 80 (backend tc, subscription 3): client->server bytes to stdout\n");

  EXPECT_EQ(openedLine(conn(3), false),
            "mirror: connection 3 10.0.0.2:51234 -> 10.0.0.1:80 opened\n");
  EXPECT_EQ(openedLine(conn(3, true), false),
            "mirror: connection 3 10.0.0.2:51234 -> 10.0.0.1:80 opened (joined mid-stream: "
            "earlier bytes unknown)\n");
  EXPECT_EQ(gapLine(conn(3), v1::CLIENT_TO_SERVER, 12345, false),
            "mirror: connection 3: 12345 bytes client->server lost (gap)\n");
  EXPECT_EQ(gapLine(conn(3), v1::SERVER_TO_CLIENT, 1, false),
            "mirror: connection 3: 1 bytes server->client lost (gap)\n");
  EXPECT_EQ(replayFailedLine(conn(2), "127.0.0.1:9000", "connect: Connection refused", false),
            "mirror: connection 2: replay to 127.0.0.1:9000 failed (connect: Connection refused); "
            "the rest of its client->server bytes are dropped\n");
  EXPECT_EQ(notWrittenLine(conn(2), v1::SERVER_TO_CLIENT, 4096, false),
            "mirror: connection 2: 4096 bytes server->client not written: stdout is too slow\n");

  MirrorCounts clean;
  clean.bytes[0] = 120;
  clean.bytes[1] = 4000;
  EXPECT_EQ(closedLine(conn(3), clean, "closed", false, false),
            "mirror: connection 3 10.0.0.2:51234 -> 10.0.0.1:80 closed: client->server 120 bytes, "
            "server->client 4000 bytes\n");
  MirrorCounts lossy = clean;
  lossy.gaps[0] = 10;
  lossy.not_written[1] = 20;
  lossy.replayed = 100;
  lossy.not_replayed = 20;
  EXPECT_EQ(closedLine(conn(3), lossy, "reset by peer", true, false),
            "mirror: connection 3 10.0.0.2:51234 -> 10.0.0.1:80 closed (reset by peer): "
            "client->server 120 bytes, server->client 4000 bytes, 10 bytes client->server lost, "
            "20 bytes server->client not written, replayed 100 bytes, not replayed 20 bytes\n");

  MirrorTotals t;
  t.connections = 2;
  addCounts(t.counts, clean);
  addCounts(t.counts, lossy);
  EXPECT_EQ(mirrorSummaryLine(t, false, false),
            "mirror: summary: 2 connections, client->server 240 bytes (gaps 10 bytes), "
            "server->client 8000 bytes (gaps 0 bytes), 20 bytes not written to stdout\n");
  MirrorTotals one;
  one.connections = 1;
  EXPECT_EQ(mirrorSummaryLine(one, true, false),
            "mirror: summary: 1 connection, client->server 0 bytes (gaps 0 bytes), "
            "server->client 0 bytes (gaps 0 bytes), replayed 0 bytes\n");
  EXPECT_EQ(remirrorFailedLine(80, "10.0.0.9:7140", "PORT_BUSY: x", false),
            "mirror: port 80 on agent 10.0.0.9:7140 failed: PORT_BUSY: x (the port is no longer "
            "mirrored)\n");
}

TEST(MirrorLines, JsonIsOneObjectPerLine) {
  EXPECT_EQ(openedLine(conn(3, true), true),
            "{\"event\":\"open\",\"connection\":3,\"source\":\"10.0.0.2:51234\",\"destination\":"
            "\"10.0.0.1:80\",\"mid_stream\":true}\n");
  EXPECT_EQ(
      gapLine(conn(3), v1::SERVER_TO_CLIENT, 7, true),
      "{\"event\":\"gap\",\"connection\":3,\"direction\":\"server_to_client\",\"bytes\":7}\n");
  MirrorCounts n;
  n.bytes[0] = 5;
  n.gaps[1] = 2;
  EXPECT_EQ(closedLine(conn(1), n, "idle too long", false, true),
            "{\"event\":\"close\",\"connection\":1,\"source\":\"10.0.0.2:51234\",\"destination\":"
            "\"10.0.0.1:80\",\"reason\":\"idle too long\",\"client_to_server\":5,"
            "\"server_to_client\":0,\"gap_client_to_server\":0,\"gap_server_to_client\":2,"
            "\"not_written_client_to_server\":0,\"not_written_server_to_client\":0}\n");
  MirrorTotals t;
  t.connections = 1;
  t.counts = n;
  EXPECT_EQ(mirrorSummaryLine(t, true, true),
            "{\"event\":\"summary\",\"connections\":1,\"client_to_server\":5,"
            "\"server_to_client\":0,\"gap_client_to_server\":0,\"gap_server_to_client\":2,"
            "\"not_written_client_to_server\":0,\"not_written_server_to_client\":0,"
            "\"replayed\":0,\"not_replayed\":0}\n");
  MirrorSpec spec{80, std::nullopt, true};
  EXPECT_EQ(mirroringLine(spec, "tc", 1, true),
            "{\"event\":\"mirroring\",\"port\":80,\"backend\":\"tc\",\"subscription_id\":1,"
            "\"to\":\"stdout\",\"both\":true}\n");
  for (const std::string& line :
       {replayFailedLine(conn(1), "h:1", "a \"quoted\"\nreason", true), stdoutLeftLine(9, true),
        notWrittenLine(conn(1), v1::CLIENT_TO_SERVER, 1, true),
        remirrorFailedLine(80, "a", "b", true), mirrorDrainingLine("SIGTERM", true)}) {
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.find('\n'), line.size() - 1) << line;  // one line, whatever the text
  }
}

// ------------------------------------------------------------ stdout

// What a reader of stdout does with the framed output: splits it back into
// runs (marker line, bytes), dropping the one newline before each marker.
struct FramedRun {
  std::string marker;
  std::string bytes;
  bool operator==(const FramedRun&) const = default;
};
std::vector<FramedRun> unframe(const std::string& out) {
  std::vector<FramedRun> runs;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t eol = out.find('\n', pos);
    FramedRun r{out.substr(pos, eol - pos), ""};
    pos = eol + 1;
    // The bytes run to the next "\n>>> #" or "\n<<< #" (or the end).
    size_t next = std::min(out.find("\n>>> #", pos), out.find("\n<<< #", pos));
    if (next == std::string::npos) next = out.size();
    r.bytes = out.substr(pos, next - pos);
    pos = next == out.size() ? next : next + 1;
    runs.push_back(std::move(r));
  }
  return runs;
}

TEST(StdoutFramer, AMarkerBeforeEachRunAndOnlyThere) {
  StdoutFramer f;
  const auto c2s = v1::CLIENT_TO_SERVER;
  const auto s2c = v1::SERVER_TO_CLIENT;
  std::string out;
  out += f.frame(conn(1), c2s, "GET / HTTP/1.1\r\n");
  out += f.frame(conn(1), c2s, "Host: x\r\n\r\n");            // same run: no marker
  out += f.frame(conn(1), s2c, "HTTP/1.1 200 OK\r\n\r\nhi");  // no newline at its end
  out += f.frame(conn(2), c2s, "\n");                         // a run of just a newline
  out += f.frame(conn(1), s2c, "more");
  EXPECT_EQ(out,
            ">>> #1 10.0.0.2:51234 -> 10.0.0.1:80\n"
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            "\n<<< #1 10.0.0.2:51234 <- 10.0.0.1:80\n"
            "HTTP/1.1 200 OK\r\n\r\nhi"
            "\n>>> #2 10.0.0.2:51234 -> 10.0.0.1:80\n"
            "\n"
            "\n<<< #1 10.0.0.2:51234 <- 10.0.0.1:80\n"
            "more");
  // The runs come back exactly, newlines at their ends included.
  EXPECT_EQ(unframe(out),
            (std::vector<FramedRun>{
                {">>> #1 10.0.0.2:51234 -> 10.0.0.1:80", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
                {"<<< #1 10.0.0.2:51234 <- 10.0.0.1:80", "HTTP/1.1 200 OK\r\n\r\nhi"},
                {">>> #2 10.0.0.2:51234 -> 10.0.0.1:80", "\n"},
                {"<<< #1 10.0.0.2:51234 <- 10.0.0.1:80", "more"},
            }));
}

TEST(StdoutFramer, BytesAcrossAHoleAreNeverJoined) {
  StdoutFramer f;
  const auto c2s = v1::CLIENT_TO_SERVER;
  std::string out = f.frame(conn(1), c2s, "aaa");
  f.lost(conn(1), c2s, 100);  // a gap
  out += f.frame(conn(1), c2s, "bbb");
  EXPECT_EQ(out,
            ">>> #1 10.0.0.2:51234 -> 10.0.0.1:80\naaa"
            "\n>>> #1 10.0.0.2:51234 -> 10.0.0.1:80 (100 bytes missing before these)\nbbb");

  // stdout refuses a chunk: its bytes count as missing before the next, and
  // the missing count of its own marker (not written either) carries over.
  out.clear();
  f.lost(conn(1), c2s, 5);
  (void)f.frame(conn(1), c2s, "cc");  // would carry "(5 bytes missing...)"
  f.notWritten(conn(1), c2s, 2);
  out += f.frame(conn(1), c2s, "dd");
  out += f.frame(conn(1), c2s, "ee");
  EXPECT_EQ(out, "\n>>> #1 10.0.0.2:51234 -> 10.0.0.1:80 (7 bytes missing before these)\nddee");

  // The first chunk of all refused: the next marker is the first written,
  // with no newline before it.
  StdoutFramer g;
  (void)g.frame(conn(4), c2s, "x");
  g.notWritten(conn(4), c2s, 1);
  EXPECT_EQ(g.frame(conn(4), c2s, "y"),
            ">>> #4 10.0.0.2:51234 -> 10.0.0.1:80 (1 bytes missing before these)\ny");

  // A connection's losses end with it.
  StdoutFramer h;
  h.lost(conn(5), c2s, 9);
  h.forget(5);
  EXPECT_EQ(h.frame(conn(5), c2s, "z"), ">>> #5 10.0.0.2:51234 -> 10.0.0.1:80\nz");
}

TEST(StdoutFramer, LossesAreKeptPerConnectionAndDirection) {
  StdoutFramer f;
  f.lost(conn(1), v1::SERVER_TO_CLIENT, 3);
  std::string out = f.frame(conn(1), v1::CLIENT_TO_SERVER, "q");
  out += f.frame(conn(1), v1::SERVER_TO_CLIENT, "r");
  EXPECT_EQ(out,
            ">>> #1 10.0.0.2:51234 -> 10.0.0.1:80\nq"
            "\n<<< #1 10.0.0.2:51234 <- 10.0.0.1:80 (3 bytes missing before these)\nr");
}

}  // namespace
}  // namespace siphon::cli
