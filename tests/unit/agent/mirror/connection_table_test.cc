#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "agent/mirror/reassembly.h"
#include "tests/unit/agent/mirror/test_packets.h"

namespace siphon::agent::mirror {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::ipv4Packet;
using testing::TcpFields;

class RecordingEvents : public ConnectionEvents {
 public:
  void onOpened(const ConnectionInfo& connection) override {
    opened.push_back(connection);
    log.push_back("open " + std::to_string(connection.id));
  }
  void onData(uint64_t id, Direction direction, std::string_view bytes) override {
    data[{id, direction}] += bytes;
  }
  void onGap(uint64_t id, Direction direction, uint64_t bytes) override {
    gaps[{id, direction}] += bytes;
  }
  void onEnd(uint64_t id, Direction direction) override {
    log.push_back("end " + std::to_string(id) +
                  (direction == Direction::kClientToServer ? " c2s" : " s2c"));
  }
  void onClosed(uint64_t id, CloseReason reason) override {
    closed[id] = reason;
    log.push_back("close " + std::to_string(id) + " " + std::string(closeReasonName(reason)));
  }

  std::vector<ConnectionInfo> opened;
  std::map<std::pair<uint64_t, Direction>, std::string> data;
  std::map<std::pair<uint64_t, Direction>, uint64_t> gaps;
  std::map<uint64_t, CloseReason> closed;
  std::vector<std::string> log;
};

constexpr auto kC2S = Direction::kClientToServer;
constexpr auto kS2C = Direction::kServerToClient;

Endpoint endpoint(uint8_t last, uint16_t port) { return {IpAddress::v4(10, 0, 0, last), port}; }

TcpSegment segment(Endpoint from, Endpoint to, uint32_t seq, uint8_t flags,
                   std::string_view payload = "", uint32_t ack = 0) {
  TcpSegment s;
  s.source = from;
  s.destination = to;
  s.seq = seq;
  s.ack = ack;
  s.flags = flags;
  s.payload = payload;
  return s;
}

struct Fixture {
  explicit Fixture(ConnectionTableOptions options = defaults()) : table(options, events) {}
  static ConnectionTableOptions defaults() {
    ConnectionTableOptions options;
    options.server_ports = {80};
    return options;
  }
  RecordingEvents events;
  ConnectionTable table;
};

const Endpoint kClient = endpoint(1, 40000);
const Endpoint kServer = endpoint(2, 80);

TEST(ConnectionTable, HandshakeBothDirectionsAndFinBothWays) {
  Fixture f;
  f.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), Timestamp{});
  f.table.onSegment(segment(kServer, kClient, 900, tcp::kSyn | tcp::kAck, "", 101), Timestamp{});
  f.table.onSegment(segment(kClient, kServer, 101, tcp::kAck, "GET /"), Timestamp{});
  f.table.onSegment(segment(kServer, kClient, 901, tcp::kAck, "200 OK"), Timestamp{});
  f.table.onSegment(segment(kClient, kServer, 106, tcp::kAck | tcp::kFin), Timestamp{});
  EXPECT_TRUE(f.events.closed.empty());  // half-closed: the server may still send
  f.table.onSegment(segment(kServer, kClient, 907, tcp::kAck | tcp::kFin), Timestamp{});

  ASSERT_EQ(f.events.opened.size(), 1u);
  const ConnectionInfo& info = f.events.opened[0];
  EXPECT_EQ(info.client, kClient);
  EXPECT_EQ(info.server, kServer);
  EXPECT_FALSE(info.started_mid_stream);
  EXPECT_EQ((f.events.data[{info.id, kC2S}]), "GET /");
  EXPECT_EQ((f.events.data[{info.id, kS2C}]), "200 OK");
  EXPECT_EQ(f.events.log,
            (std::vector<std::string>{"open 1", "end 1 c2s", "end 1 s2c", "close 1 fin"}));
  EXPECT_EQ(f.table.size(), 0u);
  // The final ACK of a closed connection opens nothing.
  f.table.onSegment(segment(kClient, kServer, 107, tcp::kAck), Timestamp{});
  EXPECT_EQ(f.table.size(), 0u);
  EXPECT_EQ(f.table.counters().ignored_segments, 1u);
  EXPECT_EQ(f.table.counters().delivered_bytes, 11u);
}

TEST(ConnectionTable, SynAckFirstStartsTheClientStreamAtTheAck) {
  Fixture f;
  f.table.onSegment(segment(kClient, kServer, 105, tcp::kAck, "world"), Timestamp{});
  ASSERT_EQ(f.events.opened.size(), 1u);  // mid-stream by then: the handshake was missed
  Fixture g;
  g.table.onSegment(segment(kServer, kClient, 900, tcp::kSyn | tcp::kAck, "", 101), Timestamp{});
  g.table.onSegment(segment(kClient, kServer, 106, tcp::kAck, "world"), Timestamp{});
  g.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), Timestamp{});  // reordered SYN
  g.table.onSegment(segment(kClient, kServer, 101, tcp::kAck, "hello"), Timestamp{});
  ASSERT_EQ(g.events.opened.size(), 1u);
  EXPECT_EQ(g.events.opened[0].client, kClient);
  EXPECT_FALSE(g.events.opened[0].started_mid_stream);
  EXPECT_EQ((g.events.data[{1, kC2S}]), "helloworld");
  EXPECT_TRUE(g.events.closed.empty());
}

TEST(ConnectionTable, MidStreamJoinUsesTheServerPort) {
  Fixture f;
  // The first packet seen goes from the server to the client.
  f.table.onSegment(segment(kServer, kClient, 5000, tcp::kAck, "response"), Timestamp{});
  ASSERT_EQ(f.events.opened.size(), 1u);
  EXPECT_EQ(f.events.opened[0].client, kClient);
  EXPECT_EQ(f.events.opened[0].server, kServer);
  EXPECT_TRUE(f.events.opened[0].started_mid_stream);
  f.table.onSegment(segment(kClient, kServer, 7000, tcp::kAck, "next request"), Timestamp{});
  EXPECT_EQ((f.events.data[{1, kS2C}]), "response");
  EXPECT_EQ((f.events.data[{1, kC2S}]), "next request");
  EXPECT_EQ(f.table.size(), 1u);
}

TEST(ConnectionTable, RstClosesAndReportsWhatIsMissingBothWays) {
  Fixture f;
  f.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), Timestamp{});
  f.table.onSegment(segment(kServer, kClient, 900, tcp::kSyn | tcp::kAck, "", 101), Timestamp{});
  f.table.onSegment(segment(kClient, kServer, 104, tcp::kAck, "def"), Timestamp{});  // 101-103 lost
  f.table.onSegment(segment(kServer, kClient, 906, tcp::kAck, "x"), Timestamp{});    // 901-905 lost
  f.table.onSegment(segment(kServer, kClient, 907, tcp::kRst), Timestamp{});
  EXPECT_EQ(f.events.closed[1], CloseReason::kReset);
  EXPECT_EQ((f.events.gaps[{1, kC2S}]), 3u);
  EXPECT_EQ((f.events.gaps[{1, kS2C}]), 5u);
  EXPECT_EQ((f.events.data[{1, kC2S}]), "def");
  EXPECT_EQ(f.table.size(), 0u);
  EXPECT_EQ(f.table.counters().gap_bytes, 8u);
  // An RST of an unknown connection opens nothing.
  f.table.onSegment(segment(kClient, kServer, 1, tcp::kRst), Timestamp{});
  EXPECT_EQ(f.table.size(), 0u);
}

TEST(ConnectionTable, OldestIdleConnectionIsEvictedWhenFull) {
  ConnectionTableOptions options = Fixture::defaults();
  options.max_connections = 2;
  Fixture f(options);
  for (uint16_t port : {40001, 40002}) {
    f.table.onSegment(segment(endpoint(1, port), kServer, 1, tcp::kSyn), Timestamp{});
  }
  // 40001 is active again: 40002 is now the least recently active.
  f.table.onSegment(segment(endpoint(1, 40001), kServer, 2, tcp::kAck, "a"), milliseconds(5));
  f.table.onSegment(segment(endpoint(1, 40003), kServer, 1, tcp::kSyn), milliseconds(6));
  EXPECT_EQ(f.table.size(), 2u);
  EXPECT_EQ(f.events.closed.size(), 1u);
  EXPECT_EQ(f.events.closed[2], CloseReason::kEvicted);
  EXPECT_EQ(f.table.counters().evictions, 1u);
}

TEST(ConnectionTable, IdleTimeoutAndHoleTimeoutOnAdvance) {
  ConnectionTableOptions options = Fixture::defaults();
  options.idle_timeout = seconds(10);
  options.stream.hole_timeout = seconds(1);
  Fixture f(options);
  f.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), seconds(0));
  f.table.onSegment(segment(kClient, kServer, 104, tcp::kAck, "def"), seconds(0));
  f.table.advanceTime(milliseconds(999));
  EXPECT_TRUE(f.events.gaps.empty());
  f.table.advanceTime(seconds(1));
  EXPECT_EQ((f.events.gaps[{1, kC2S}]), 3u);
  EXPECT_EQ((f.events.data[{1, kC2S}]), "def");
  f.table.advanceTime(seconds(9));
  EXPECT_EQ(f.table.size(), 1u);
  f.table.advanceTime(seconds(10));
  EXPECT_EQ(f.table.size(), 0u);
  EXPECT_EQ(f.events.closed[1], CloseReason::kIdle);
  EXPECT_EQ(f.table.counters().idle_closes, 1u);
}

TEST(ConnectionTable, NewSynOnTheSameTupleReplacesTheOldConnection) {
  Fixture f;
  f.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), Timestamp{});
  f.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), Timestamp{});  // retransmitted
  EXPECT_EQ(f.events.opened.size(), 1u);
  f.table.onSegment(segment(kClient, kServer, 5555, tcp::kSyn), Timestamp{});
  EXPECT_EQ(f.events.opened.size(), 2u);
  EXPECT_EQ(f.events.closed[1], CloseReason::kReplaced);
}

TEST(ConnectionTable, PacketsAreParsedAndInvalidOnesCounted) {
  Fixture f;
  TcpFields syn;
  syn.source_port = 40000;
  syn.destination_port = 80;
  syn.seq = 10;
  syn.flags = tcp::kSyn;
  EXPECT_TRUE(f.table.onPacket(ipv4Packet(syn), LinkType::kRawIp, Timestamp{}).ok());
  TcpFields data = syn;
  data.seq = 11;
  data.flags = tcp::kAck;
  data.payload = "ping";
  EXPECT_TRUE(f.table.onPacket(ipv4Packet(data), LinkType::kRawIp, Timestamp{}).ok());
  EXPECT_FALSE(f.table.onPacket("\x45garbage", LinkType::kRawIp, Timestamp{}).ok());
  EXPECT_EQ((f.events.data[{1, kC2S}]), "ping");
  EXPECT_EQ(f.table.counters().packets, 3u);
  EXPECT_EQ(f.table.counters().invalid_packets, 1u);
  f.table.addDroppedPackets(4);
  EXPECT_EQ(f.table.counters().dropped_packets, 4u);
  f.table.closeAll();
  EXPECT_EQ(f.events.closed[1], CloseReason::kShutdown);
}

}  // namespace
}  // namespace siphon::agent::mirror

namespace siphon::agent::mirror {
namespace {

// Out-of-order bytes of all connections together stay under the table's
// bound: past it, holes are given up (exact gaps), the connection that grew
// first, then the least recently active one; nothing is lost silently.
TEST(ConnectionTable, TotalBufferedBytesAreBounded) {
  ConnectionTableOptions options = Fixture::defaults();
  options.stream.max_buffered = 1 << 20;
  options.max_buffered_total = 1 << 20;
  Fixture f(options);
  const Endpoint other = endpoint(3, 40001);
  const std::string chunk(100 << 10, 'x');
  f.table.onSegment(segment(kClient, kServer, 0, tcp::kSyn), seconds(0));
  f.table.onSegment(segment(other, kServer, 0, tcp::kSyn), seconds(0));
  // Connection 1 holds 600 KiB behind a 1-byte hole at its start.
  for (uint32_t i = 0; i < 6; ++i) {
    f.table.onSegment(segment(kClient, kServer, 2 + i * chunk.size(), tcp::kAck, chunk),
                      seconds(0));
  }
  EXPECT_EQ(f.table.bufferedBytes(), 600u << 10);
  EXPECT_TRUE(f.events.gaps.empty());
  // Connection 2 does the same: the total would pass 1 MiB, so holes go.
  for (uint32_t i = 0; i < 6; ++i) {
    f.table.onSegment(segment(other, kServer, 2 + i * chunk.size(), tcp::kAck, chunk), seconds(0));
    EXPECT_LE(f.table.heldMemory(), 1u << 20);
  }
  uint64_t gap = 0;
  size_t delivered = 0;
  for (auto& [key, bytes] : f.events.gaps) gap += bytes;
  for (auto& [key, bytes] : f.events.data) delivered += bytes.size();
  EXPECT_GT(gap, 0u);
  // Every byte is delivered, buffered or reported as a gap. Each stream
  // with a gap also had its 1-byte hole at the start (data from seq 2, the
  // SYN at 0) reported, which is not payload.
  EXPECT_EQ(delivered + f.table.bufferedBytes() + (gap - f.events.gaps.size()), 12 * chunk.size());
  f.table.closeAll();
  EXPECT_EQ(f.table.bufferedBytes(), 0u);
  EXPECT_EQ(f.table.heldMemory(), 0u);
}

// A handover: one table's connections, holes and held out-of-order data
// included, rebuilt in another that goes on with the rest of the segments
// (some of them seen by the first already, as both rings hold the overlap).
// Between them, each stream is delivered whole, once, without a gap.
TEST(ConnectionTable, SnapshotRestoreGoesOnWithoutGapOrDuplicate) {
  const std::string up = "0123456789abcdefghijklmnopqrst";  // 30 bytes, 6 segments of 5
  const std::string down = "HELLOWORLD";
  const Endpoint other = endpoint(3, 41000);
  auto piece = [&](uint32_t offset) { return std::string_view(up).substr(offset, 5); };

  Fixture a;
  // Connection 1, handshake seen: client ISN 100, server ISN 900.
  a.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), seconds(0));
  a.table.onSegment(segment(kServer, kClient, 900, tcp::kSyn | tcp::kAck, "", 101), seconds(0));
  a.table.onSegment(segment(kClient, kServer, 101 + 0, tcp::kAck, piece(0)), seconds(0));
  a.table.onSegment(segment(kClient, kServer, 101 + 10, tcp::kAck, piece(10)), seconds(0));
  a.table.onSegment(segment(kClient, kServer, 101 + 20, tcp::kAck, piece(20)), seconds(0));
  // The server's second half and its FIN came before its first half.
  a.table.onSegment(segment(kServer, kClient, 906, tcp::kAck | tcp::kFin, "WORLD"), seconds(0));
  // Connection 2, joined mid-stream (no ISN): "xyz" delivered, "pqr" held.
  a.table.onSegment(segment(other, kServer, 5000, tcp::kAck, "xyz"), seconds(0));
  a.table.onSegment(segment(other, kServer, 5010, tcp::kAck, "pqr"), seconds(0));

  ASSERT_EQ(a.events.opened.size(), 2u);
  EXPECT_EQ((a.events.data[{1, kC2S}]), "01234");
  EXPECT_EQ((a.events.data[{1, kS2C}]), "");
  EXPECT_EQ((a.events.data[{2, kC2S}]), "xyz");

  const std::vector<ConnectionSnapshot> snap = a.table.snapshot();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(a.table.nextId(), 3u);
  const ConnectionSnapshot& one = snap[0].info.id == 1 ? snap[0] : snap[1];
  EXPECT_EQ(one.info.client, kClient);
  EXPECT_EQ(one.client_to_server.isn, 100u);
  EXPECT_EQ(one.client_to_server.next_seq, 106u);
  EXPECT_EQ(one.client_to_server.pending,
            (std::vector<std::pair<uint32_t, std::string>>{{111, "abcde"}, {121, "klmno"}}));
  EXPECT_EQ(one.server_to_client.isn, 900u);
  EXPECT_EQ(one.server_to_client.next_seq, 901u);
  EXPECT_EQ(one.server_to_client.fin_seq, 911u);
  const ConnectionSnapshot& two = snap[0].info.id == 2 ? snap[0] : snap[1];
  EXPECT_TRUE(two.client_to_server.mid_stream);
  EXPECT_EQ(two.client_to_server.next_seq, 5003u);

  Fixture b;
  b.table.restore(snap, a.table.nextId(), seconds(1));
  EXPECT_EQ(b.table.size(), 2u);
  EXPECT_TRUE(b.events.opened.empty());  // the consumer knows them
  EXPECT_EQ(b.table.bufferedBytes(), a.table.bufferedBytes());
  EXPECT_EQ(b.table.heldMemory(), a.table.heldMemory());

  // The rest, in another order, with what the first table had already
  // (delivered or held) mixed in.
  b.table.onSegment(segment(kClient, kServer, 101 + 0, tcp::kAck, piece(0)), seconds(1));
  b.table.onSegment(segment(kClient, kServer, 101 + 15, tcp::kAck, piece(15)), seconds(1));
  b.table.onSegment(segment(kClient, kServer, 101 + 5, tcp::kAck, piece(5)), seconds(1));
  b.table.onSegment(segment(kClient, kServer, 101 + 10, tcp::kAck, piece(10)), seconds(1));
  b.table.onSegment(segment(kClient, kServer, 101 + 20, tcp::kAck, piece(20)), seconds(1));
  b.table.onSegment(segment(kClient, kServer, 101 + 25, tcp::kAck, piece(25)), seconds(1));
  b.table.onSegment(segment(kServer, kClient, 901, tcp::kAck, "HELLO"), seconds(1));
  b.table.onSegment(segment(kServer, kClient, 906, tcp::kAck | tcp::kFin, "WORLD"), seconds(1));
  b.table.onSegment(segment(other, kServer, 5000, tcp::kAck, "xyz1234"), seconds(1));
  b.table.onSegment(segment(other, kServer, 5007, tcp::kAck, "567"), seconds(1));
  b.table.onSegment(segment(other, kServer, 5010, tcp::kAck, "pqr"), seconds(1));
  b.table.onSegment(segment(kClient, kServer, 131, tcp::kAck | tcp::kFin), seconds(1));

  EXPECT_EQ((a.events.data[{1, kC2S}] + b.events.data[{1, kC2S}]), up);
  EXPECT_EQ((a.events.data[{1, kS2C}] + b.events.data[{1, kS2C}]), down);
  EXPECT_EQ((a.events.data[{2, kC2S}] + b.events.data[{2, kC2S}]), "xyz1234567pqr");
  EXPECT_TRUE(b.events.gaps.empty());
  EXPECT_EQ(b.events.log, (std::vector<std::string>{"end 1 s2c", "end 1 c2s", "close 1 fin"}));

  // Ids: the restored keep theirs, a new connection gets the next one.
  b.table.onSegment(segment(endpoint(4, 42000), kServer, 7000, tcp::kSyn), seconds(1));
  ASSERT_EQ(b.events.opened.size(), 1u);
  EXPECT_EQ(b.events.opened[0].id, 3u);
  b.table.closeAll();
  EXPECT_TRUE(b.events.gaps.empty());
  EXPECT_EQ(b.events.closed.count(2), 1u);
  // What b saw again was counted as duplicate, not as before a stream's
  // start, even for the connection joined mid-stream: 5 + 5 + 5 bytes of
  // connection 1, "xyz" and "pqr" of connection 2.
  EXPECT_EQ(b.table.counters().duplicate_bytes, 15u + 6u);
  EXPECT_EQ(b.table.counters().delivered_bytes, 25u + 10u + 10u);
}

// Restored ids win over a next id that is too low: new ones never collide.
TEST(ConnectionTable, RestoredIdsStayUnique) {
  Fixture a;
  a.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), seconds(0));
  std::vector<ConnectionSnapshot> snap = a.table.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  snap[0].info.id = 41;
  Fixture b;
  b.table.restore(snap, /*next_id=*/7, seconds(0));
  EXPECT_EQ(b.table.nextId(), 42u);
  b.table.onSegment(segment(endpoint(9, 40000), kServer, 100, tcp::kSyn), seconds(0));
  ASSERT_EQ(b.events.opened.size(), 1u);
  EXPECT_EQ(b.events.opened[0].id, 42u);
  // A retransmitted SYN of the restored connection is the same connection.
  b.table.onSegment(segment(kClient, kServer, 100, tcp::kSyn), seconds(0));
  EXPECT_EQ(b.events.opened.size(), 1u);
  EXPECT_TRUE(b.events.closed.empty());
  b.table.closeAll();
  EXPECT_EQ(b.events.closed.count(41), 1u);
}

}  // namespace
}  // namespace siphon::agent::mirror
