#include <gtest/gtest.h>

#include <chrono>

#include "agent/mirror/reassembly.h"
#include "tests/unit/agent/mirror/test_packets.h"

namespace siphon::agent::mirror {
namespace {

using std::chrono::milliseconds;
using testing::Recorder;

constexpr uint8_t kData = tcp::kAck;

// A stream whose first data byte has sequence number `base` (SYN at base-1).
struct Stream {
  explicit Stream(uint32_t isn = 1000, ReassemblerOptions options = {})
      : isn(isn), reassembler(options) {
    reassembler.onSegment(isn, tcp::kSyn, "", Timestamp{}, sink);
  }
  void send(uint32_t offset, std::string_view bytes, uint8_t flags = kData,
            Timestamp now = Timestamp{}) {
    reassembler.onSegment(isn + 1 + offset, flags, bytes, now, sink);
  }
  uint32_t isn;
  StreamReassembler reassembler;
  Recorder sink;
};

TEST(StreamReassembler, InOrder) {
  Stream s;
  s.send(0, "hello ");
  s.send(6, "world");
  EXPECT_EQ(s.sink.data, "hello world");
  EXPECT_TRUE(s.sink.gaps.empty());
  EXPECT_EQ(s.reassembler.isn(), 1000u);
  EXPECT_FALSE(s.reassembler.startedMidStream());
  EXPECT_EQ(s.reassembler.stats().delivered_bytes, 11u);
  EXPECT_EQ(s.reassembler.bufferedBytes(), 0u);
}

TEST(StreamReassembler, ReorderedSegmentsWaitForTheHole) {
  Stream s;
  s.send(6, "world");
  s.send(11, "!");
  EXPECT_EQ(s.sink.data, "");
  EXPECT_EQ(s.reassembler.bufferedBytes(), 6u);
  s.send(0, "hello ");
  EXPECT_EQ(s.sink.data, "hello world!");
  EXPECT_EQ(s.reassembler.bufferedBytes(), 0u);
  EXPECT_TRUE(s.sink.gaps.empty());
}

TEST(StreamReassembler, DuplicatesAreDroppedAndCounted) {
  Stream s;
  s.send(0, "abc");
  s.send(0, "abc");
  s.send(6, "ghi");
  s.send(6, "ghi");
  s.send(3, "def");
  s.send(3, "def");
  EXPECT_EQ(s.sink.data, "abcdefghi");
  EXPECT_EQ(s.reassembler.stats().duplicate_bytes, 9u);
}

TEST(StreamReassembler, OverlapsKeepTheFirstCopyWhateverTheSplit) {
  // Original: "0123456789". Later copies carry different bytes ('x') where
  // they overlap earlier ones, so the test sees which copy won.
  Stream s;
  s.send(2, "23");       // buffered
  s.send(6, "6789");     // buffered
  s.send(1, "1xx45xx");  // covers 1..7: fills 1, 4-5; overlaps both chunks
  s.send(0, "0x");       // fills 0, overlaps 1
  EXPECT_EQ(s.sink.data, "0123456789");

  Stream t;
  t.send(0, "0123");
  t.send(2, "xx4567");  // starts inside delivered data
  t.send(6, "xx89");
  EXPECT_EQ(t.sink.data, "0123456789");

  Stream u;
  u.send(3, "3");
  u.send(5, "5");
  u.send(7, "7");
  u.send(0, "012x4x6x89");  // one segment spanning three buffered chunks
  EXPECT_EQ(u.sink.data, "0123456789");
  EXPECT_EQ(u.reassembler.stats().duplicate_bytes, 3u);
}

TEST(StreamReassembler, SequenceNumbersWrapAround) {
  // ISN just below 2^32: data starts at 0xfffffffc and crosses zero.
  Stream s(0xfffffffb);
  s.send(8, "89");    // seq 4
  s.send(0, "0123");  // seq 0xfffffffc..0xffffffff
  s.send(4, "4567");  // seq 0..3
  EXPECT_EQ(s.sink.data, "0123456789");
  EXPECT_TRUE(s.sink.gaps.empty());
  EXPECT_EQ(s.reassembler.nextOffset(), 10u);
}

TEST(StreamReassembler, MoreThanFourGibibytesKeepCounting) {
  // Offsets are 64-bit: the stream passes the same 32-bit sequence numbers
  // twice and is still in order.
  struct Counting : StreamSink {
    void onData(std::string_view bytes) override { delivered += bytes.size(); }
    void onGap(uint64_t) override { ++gaps; }
    void onEnd(StreamEnd) override {}
    uint64_t delivered = 0;
    int gaps = 0;
  } sink;
  StreamReassembler r;
  std::string block(1 << 20, 'z');
  uint32_t seq = 5;
  r.onSegment(seq - 1, tcp::kSyn, "", Timestamp{}, sink);
  for (int i = 0; i < 4096 + 16; ++i) {
    r.onSegment(seq, kData, block, Timestamp{}, sink);
    seq += block.size();
  }
  EXPECT_EQ(r.nextOffset(), (uint64_t{4096} + 16) << 20);
  EXPECT_EQ(sink.delivered, r.nextOffset());
  EXPECT_EQ(sink.gaps, 0);
  EXPECT_EQ(r.stats().gap_bytes, 0u);
  EXPECT_EQ(r.stats().duplicate_bytes, 0u);
}

TEST(StreamReassembler, SynPayloadStartsAfterTheIsn) {
  StreamReassembler r;
  Recorder sink;
  r.onSegment(500, tcp::kSyn, "fast open", Timestamp{}, sink);
  r.onSegment(500, tcp::kSyn, "fast open", Timestamp{}, sink);  // retransmitted SYN
  r.onSegment(510, kData, " data", Timestamp{}, sink);
  EXPECT_EQ(sink.data, "fast open data");
  EXPECT_EQ(r.isn(), 500u);
}

TEST(StreamReassembler, FinEndsAfterWhatPrecedesIt) {
  Stream s;
  s.send(5, "world", kData | tcp::kFin);  // FIN arrives before the data before it
  EXPECT_EQ(s.sink.ends, 0);
  s.send(0, "hello");
  EXPECT_EQ(s.sink.data, "helloworld");
  ASSERT_EQ(s.sink.ends, 1);
  EXPECT_EQ(s.sink.end, StreamEnd::kFin);
  EXPECT_TRUE(s.reassembler.ended());
  // After the end: ignored, no events.
  s.send(10, "more");
  s.send(5, "world", kData | tcp::kFin);
  EXPECT_EQ(s.sink.data, "helloworld");
  EXPECT_EQ(s.sink.ends, 1);
  EXPECT_EQ(s.reassembler.stats().ignored_bytes, 9u);
}

TEST(StreamReassembler, DataPastTheFinIsIgnored) {
  Stream s;
  s.send(0, "abc", kData | tcp::kFin);
  EXPECT_EQ(s.sink.end, StreamEnd::kFin);
  Stream t;
  t.send(3, "", kData | tcp::kFin);  // FIN at offset 3, data 0..2 missing
  t.send(2, "cdef");                 // only "c" is inside the stream
  t.send(0, "ab");
  EXPECT_EQ(t.sink.data, "abc");
  EXPECT_EQ(t.reassembler.stats().ignored_bytes, 3u);
}

TEST(StreamReassembler, RstReportsHolesAndEnds) {
  Stream s;
  s.send(0, "ab");
  s.send(5, "fg");
  s.send(10, "k");
  s.reassembler.onSegment(s.isn + 1 + 11, tcp::kRst, "diagnostic text", Timestamp{}, s.sink);
  EXPECT_EQ(s.sink.data, "abfgk");
  EXPECT_EQ(s.sink.gaps, (std::vector<std::pair<uint64_t, uint64_t>>{{2, 3}, {7, 3}}));
  EXPECT_EQ(s.sink.end, StreamEnd::kReset);
  EXPECT_EQ(s.sink.delivered + s.sink.gap_bytes, 11u);
}

TEST(StreamReassembler, MidStreamJoinStartsAtTheFirstSegment) {
  StreamReassembler r;
  Recorder sink;
  r.onSegment(0x7fff0000, kData, "middle", Timestamp{}, sink);
  EXPECT_TRUE(r.startedMidStream());
  EXPECT_FALSE(r.isn().has_value());
  // A reordered earlier segment is from before the start: not part of the stream.
  r.onSegment(0x7fff0000 - 4, kData, "xxxxmid", Timestamp{}, sink);
  r.onSegment(0x7fff0006, kData, " end", Timestamp{}, sink);
  EXPECT_EQ(sink.data, "middle end");
  EXPECT_EQ(r.stats().ignored_bytes, 4u);
  EXPECT_EQ(r.stats().duplicate_bytes, 3u);
}

TEST(StreamReassembler, StartAtFixesTheStartWithoutSyn) {
  StreamReassembler r;
  Recorder sink;
  r.startAt(100);
  r.onSegment(103, kData, "def", Timestamp{}, sink);
  r.onSegment(100, kData, "abc", Timestamp{}, sink);
  EXPECT_EQ(sink.data, "abcdef");
  EXPECT_FALSE(r.startedMidStream());
}

TEST(StreamReassembler, HoleTimeoutReportsTheExactGap) {
  ReassemblerOptions options;
  options.hole_timeout = milliseconds(100);
  Stream s(1000, options);
  s.send(0, "ab", kData, milliseconds(0));
  s.send(5, "fg", kData, milliseconds(10));
  s.send(9, "j", kData, milliseconds(50));
  s.reassembler.advanceTime(milliseconds(109), s.sink);
  EXPECT_EQ(s.sink.data, "ab");
  s.reassembler.advanceTime(milliseconds(110), s.sink);
  // The first hole was known since 10 ms; the second since 50 ms (when "j"
  // arrived), so it is not given up yet.
  EXPECT_EQ(s.sink.data, "abfg");
  EXPECT_EQ(s.sink.gaps, (std::vector<std::pair<uint64_t, uint64_t>>{{2, 3}}));
  s.send(7, "h", kData, milliseconds(120));  // fills part of the second hole
  EXPECT_EQ(s.sink.data, "abfgh");
  s.send(10, "k", kData | tcp::kFin, milliseconds(149));  // FIN after the hole at 8
  EXPECT_EQ(s.sink.ends, 0);
  s.reassembler.advanceTime(milliseconds(150), s.sink);  // "j" is 100 ms old
  EXPECT_EQ(s.sink.data, "abfghjk");
  EXPECT_EQ(s.sink.gaps, (std::vector<std::pair<uint64_t, uint64_t>>{{2, 3}, {8, 1}}));
  EXPECT_EQ(s.sink.end, StreamEnd::kFin);
  EXPECT_EQ(s.sink.delivered + s.sink.gap_bytes, 11u);
}

TEST(StreamReassembler, MissingTailBeforeFinTimesOut) {
  ReassemblerOptions options;
  options.hole_timeout = milliseconds(100);
  Stream s(1000, options);
  s.send(0, "ab", kData, milliseconds(0));
  s.send(6, "", kData | tcp::kFin, milliseconds(10));  // bytes 2..5 lost
  s.reassembler.advanceTime(milliseconds(109), s.sink);
  EXPECT_EQ(s.sink.ends, 0);
  s.reassembler.advanceTime(milliseconds(110), s.sink);
  EXPECT_EQ(s.sink.gaps, (std::vector<std::pair<uint64_t, uint64_t>>{{2, 4}}));
  EXPECT_EQ(s.sink.end, StreamEnd::kFin);
}

TEST(StreamReassembler, FullBufferGivesUpTheOldestHole) {
  // Room for two small segments: the bound counts what each one holds.
  ReassemblerOptions options;
  options.max_buffered = 2 * StreamReassembler::segmentCost(2);
  Stream s(1000, options);
  s.send(2, "cd");
  s.send(6, "gh");
  EXPECT_EQ(s.reassembler.bufferedBytes(), 4u);
  EXPECT_EQ(s.reassembler.heldMemory(), options.max_buffered);
  s.send(9, "j");  // does not fit: the hole at 0 goes, "cd" is delivered
  EXPECT_EQ(s.sink.data, "cd");
  EXPECT_EQ(s.sink.gaps, (std::vector<std::pair<uint64_t, uint64_t>>{{0, 2}}));
  EXPECT_EQ(s.reassembler.bufferedBytes(), 3u);
  EXPECT_LE(s.reassembler.heldMemory(), options.max_buffered);
  // A segment larger than the whole buffer, with nothing before it: the
  // holes before it go and it is delivered at once.
  const std::string large(options.max_buffered, 'm');
  s.send(12, large);
  EXPECT_EQ(s.sink.data, "cdghj" + large);
  EXPECT_EQ(s.sink.gaps,
            (std::vector<std::pair<uint64_t, uint64_t>>{{0, 2}, {4, 2}, {8, 1}, {10, 2}}));
  EXPECT_EQ(s.reassembler.bufferedBytes(), 0u);
  EXPECT_EQ(s.reassembler.heldMemory(), 0u);
  // The bytes given up arrive late: already reported, nothing delivered twice.
  s.send(0, "abcdefghijkl");
  EXPECT_EQ(s.sink.data, "cdghj" + large);
  EXPECT_EQ(s.reassembler.stats().duplicate_bytes, 12u);
}

TEST(StreamReassembler, FinishReportsEverythingMissing) {
  Stream s;
  s.send(0, "a");
  s.send(3, "d");
  s.send(8, "i");
  s.reassembler.finish(s.sink);
  EXPECT_EQ(s.sink.data, "adi");
  EXPECT_EQ(s.sink.gap_bytes, 6u);
  EXPECT_EQ(s.sink.ends, 0);
  EXPECT_TRUE(s.reassembler.ended());
  EXPECT_EQ(s.reassembler.bufferedBytes(), 0u);
}

// One direction rebuilt from its snapshot across the 2^32 wrap: the
// original and the copy deliver the stream once between them, the copy
// counts what the original had as duplicates, and its FIN ends it.
TEST(StreamReassembler, SnapshotRestoreAcrossTheWrap) {
  const std::string original = "the quick brown fox jumps over the lazy dog";  // 43 bytes
  Stream a(0xfffffff0u);  // data from 0xfffffff1: the wrap is at offset 15
  a.send(0, original.substr(0, 10));
  a.send(20, original.substr(20, 10));  // held past a hole, across the wrap
  a.send(35, original.substr(35), kData | tcp::kFin);
  const StreamSnapshot snap = a.reassembler.snapshot();
  EXPECT_TRUE(snap.started);
  EXPECT_FALSE(snap.mid_stream);
  EXPECT_EQ(snap.isn, 0xfffffff0u);
  EXPECT_EQ(snap.next_seq, 0xfffffff1u + 10);
  ASSERT_EQ(snap.pending.size(), 2u);
  EXPECT_EQ(snap.pending[0].first, 0xfffffff1u + 20);  // 4 past the wrap
  EXPECT_EQ(snap.pending[1].second, original.substr(35));
  EXPECT_EQ(snap.fin_seq, static_cast<uint32_t>(0xfffffff1u + 43));

  StreamReassembler b;
  b.restore(snap, Timestamp{});
  EXPECT_EQ(b.bufferedBytes(), a.reassembler.bufferedBytes());
  testing::Recorder sink;
  auto send = [&](uint32_t offset, std::string_view bytes) {
    b.onSegment(0xfffffff1u + offset, kData, bytes, Timestamp{}, sink);
  };
  send(0, original.substr(0, 15));  // 10 old, 5 new
  send(20, original.substr(20, 5));
  send(15, original.substr(15, 20));  // 5 new, 10 held already, 5 new
  EXPECT_EQ(a.sink.data + sink.data, original);
  EXPECT_TRUE(sink.gaps.empty());
  EXPECT_EQ(sink.ends, 1);
  EXPECT_EQ(b.stats().duplicate_bytes, 10u + 5u + 10u);
  EXPECT_EQ(b.stats().ignored_bytes, 0u);
}

// Without a known start (joined mid-stream), what came before the restored
// point is a duplicate too, not "before the start"; a stream restored
// before it started starts on its first segment as usual.
TEST(StreamReassembler, SnapshotRestoreMidStreamAndUnstarted) {
  StreamReassembler a;
  Recorder a_sink;
  a.onSegment(5000, kData, "abc", Timestamp{}, a_sink);
  a.onSegment(5006, kData, "ghi", Timestamp{}, a_sink);
  StreamReassembler b;
  b.restore(a.snapshot(), milliseconds(10));
  EXPECT_TRUE(b.startedMidStream());
  Recorder b_sink;
  b.onSegment(5000, kData, "abcdef", milliseconds(10), b_sink);
  EXPECT_EQ(a_sink.data + b_sink.data, "abcdefghi");
  EXPECT_EQ(b.stats().duplicate_bytes, 3u);
  EXPECT_EQ(b.stats().ignored_bytes, 0u);
  // The restored hole times out from the restore, not from the original's
  // arrival: nothing given up before hole_timeout after it.
  StreamReassembler c;
  Recorder c_sink;
  c.restore(a.snapshot(), milliseconds(1500));
  c.advanceTime(milliseconds(1500) + ReassemblerOptions{}.hole_timeout - milliseconds(1), c_sink);
  EXPECT_TRUE(c_sink.gaps.empty());
  c.advanceTime(milliseconds(1500) + ReassemblerOptions{}.hole_timeout, c_sink);
  EXPECT_EQ(c_sink.gap_bytes, 3u);
  EXPECT_EQ(c_sink.data, "ghi");

  StreamReassembler fresh;
  StreamReassembler d;
  d.restore(fresh.snapshot(), Timestamp{});
  EXPECT_FALSE(d.started());
  Recorder d_sink;
  d.onSegment(77, tcp::kSyn, "", Timestamp{}, d_sink);
  d.onSegment(78, kData, "x", Timestamp{}, d_sink);
  EXPECT_EQ(d_sink.data, "x");
  EXPECT_EQ(d.isn(), 77u);
}

}  // namespace
}  // namespace siphon::agent::mirror
