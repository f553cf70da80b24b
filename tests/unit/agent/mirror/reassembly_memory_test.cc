// The out-of-order buffers' bound is a bound on memory: a flood of tiny
// out-of-order segments (each costing ~150 bytes of heap for one byte of
// payload) must stay within max_buffered / max_buffered_total as the heap
// sees it, with every byte given up reported as a gap.
//
// The heap is measured with mallinfo2() (glibc): bytes in allocated blocks,
// headers included, before and after the flood in the same test. It is a
// bound on memory, not on time. Sanitizer allocators keep their own books,
// so there the heap part is skipped and the accounting still checked.
#include <gtest/gtest.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "agent/mirror/reassembly.h"
#include "tests/fakes/sanitizers.h"

namespace siphon::agent::mirror {
namespace {

using std::chrono::seconds;

// Slack for what the heap holds besides the buffer: glibc's per-thread
// cache keeps up to 7 freed blocks of each small size "in use", and the
// tree's transient allocations.
constexpr size_t kHeapSlack = 64u << 10;

bool canMeasureHeap() {
#if defined(__GLIBC__)
  return !fakes::kSanitizedBuild;
#else
  return false;
#endif
}

size_t heapInUse() {
#if defined(__GLIBC__)
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#else
  return 0;
#endif
}

size_t grownSince(size_t before) {
  const size_t now = heapInUse();
  return now > before ? now - before : 0;
}

// The stream's byte at `offset`: a pattern that does not repeat with any
// small period, so a byte delivered at the wrong place is seen.
char patternAt(uint64_t offset) { return static_cast<char>(offset * 131 + (offset >> 9)); }

std::string patternRange(uint64_t begin, uint64_t end) {
  std::string bytes;
  bytes.reserve(end - begin);
  for (uint64_t i = begin; i < end; ++i) bytes.push_back(patternAt(i));
  return bytes;
}

// Checks every delivered byte against the pattern at its offset; keeps only
// counters, so the sink itself does not grow the heap being measured.
class PatternSink : public StreamSink {
 public:
  void onData(std::string_view bytes) override {
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] != patternAt(offset + i)) ++misplaced;
    }
    offset += bytes.size();
    delivered += bytes.size();
  }
  void onGap(uint64_t bytes) override {
    offset += bytes;
    gap_bytes += bytes;
    ++gaps;
  }
  void onEnd(StreamEnd) override { ++ends; }

  uint64_t offset = 0;
  uint64_t delivered = 0;
  uint64_t gap_bytes = 0;
  uint64_t gaps = 0;
  uint64_t misplaced = 0;
  int ends = 0;
};

constexpr uint32_t kIsn = 7000;

TEST(ReassemblyMemory, TinySegmentFloodStaysWithinTheBoundOnTheHeap) {
  ReassemblerOptions options;
  options.max_buffered = 1u << 20;
  options.hole_timeout = seconds(3600);  // only the bound gives holes up
  StreamReassembler r(options);
  PatternSink sink;
  r.onSegment(kIsn, tcp::kSyn, "", Timestamp{}, sink);

  // Every other byte, one byte per segment: no two are adjacent, so each
  // is held on its own. 2^20 of them, each worth ~150 bytes of heap when
  // held: counted as one byte each, they held ~150 MiB under a 1 MiB bound.
  constexpr uint64_t kSegments = 1u << 20;
  const size_t heap_before = heapInUse();
  size_t held_peak = 0;
  size_t heap_peak = 0;
  for (uint64_t i = 0; i < kSegments; ++i) {
    const uint64_t offset = 2 * i + 1;
    const char byte = patternAt(offset);
    r.onSegment(kIsn + 1 + static_cast<uint32_t>(offset), tcp::kAck, std::string_view(&byte, 1),
                Timestamp{}, sink);
    held_peak = std::max(held_peak, r.heldMemory());
    if (i % 1024 == 1023) heap_peak = std::max(heap_peak, grownSince(heap_before));
  }
  const size_t heap_grown = grownSince(heap_before);
  heap_peak = std::max(heap_peak, heap_grown);

  EXPECT_LE(held_peak, options.max_buffered);
  EXPECT_GT(r.heldMemory(), options.max_buffered / 2);  // the buffer was in use
  EXPECT_GT(r.bufferedBytes(), 0u);
  if (canMeasureHeap()) {
    // The bound holds for the heap, and the figure counted covers it.
    EXPECT_LE(heap_peak, options.max_buffered + kHeapSlack)
        << "heap grew by " << heap_peak << " bytes under a " << options.max_buffered
        << "-byte bound (" << r.bufferedBytes() << " payload bytes held)";
    EXPECT_LE(heap_grown, r.heldMemory() + kHeapSlack)
        << "held " << r.heldMemory() << " bytes counted, the heap grew by " << heap_grown;
  }
  // What was given up was reported, hole by hole: each one byte.
  EXPECT_GT(sink.gaps, 0u);
  EXPECT_EQ(sink.gap_bytes, sink.gaps);
  EXPECT_EQ(sink.delivered + sink.gap_bytes, r.nextOffset());
  EXPECT_EQ(sink.misplaced, 0u);
  const uint64_t gap_bytes_after_flood = sink.gap_bytes;

  // The whole stream then comes in order, MSS-sized, with 64 KiB more:
  // the holes still open are filled, the rest is duplicate, and the stream
  // comes out byte-exact with no new gap.
  const uint64_t span = 2 * kSegments + (64u << 10);
  const std::string stream = patternRange(0, span);
  for (uint64_t at = 0; at < span; at += 1448) {
    const uint64_t n = std::min<uint64_t>(1448, span - at);
    r.onSegment(kIsn + 1 + static_cast<uint32_t>(at), tcp::kAck,
                std::string_view(stream).substr(at, n), Timestamp{}, sink);
  }
  r.onSegment(kIsn + 1 + static_cast<uint32_t>(span), tcp::kAck | tcp::kFin, "", Timestamp{}, sink);
  EXPECT_EQ(sink.misplaced, 0u);
  EXPECT_EQ(sink.gap_bytes, gap_bytes_after_flood);
  EXPECT_EQ(sink.delivered + sink.gap_bytes, span);
  EXPECT_EQ(sink.ends, 1);
  EXPECT_EQ(r.bufferedBytes(), 0u);
  EXPECT_EQ(r.heldMemory(), 0u);
}

TEST(ReassemblyMemory, AdjacentTinySegmentsShareOneBuffer) {
  // Tiny segments after a hole, forwards and backwards: they merge into
  // buffers of up to kCoalesceLimit bytes, so the bound holds far more of
  // them than if each were held alone, and the hole's fill delivers them
  // all in order.
  constexpr uint64_t kRun = 16u << 10;
  ReassemblerOptions options;
  options.max_buffered = 1u << 20;
  options.hole_timeout = seconds(3600);
  StreamReassembler r(options);
  PatternSink sink;
  r.onSegment(kIsn, tcp::kSyn, "", Timestamp{}, sink);
  // [1, 1 + kRun) forwards, then [2 + 2 kRun, 2 + kRun) backwards, with one
  // hole at 0 and one at 1 + kRun.
  for (uint64_t offset = 1; offset < 1 + kRun; ++offset) {
    const char byte = patternAt(offset);
    r.onSegment(kIsn + 1 + static_cast<uint32_t>(offset), tcp::kAck, std::string_view(&byte, 1),
                Timestamp{}, sink);
  }
  for (uint64_t offset = 1 + 2 * kRun; offset >= 2 + kRun; --offset) {
    const char byte = patternAt(offset);
    r.onSegment(kIsn + 1 + static_cast<uint32_t>(offset), tcp::kAck, std::string_view(&byte, 1),
                Timestamp{}, sink);
  }
  EXPECT_EQ(r.bufferedBytes(), 2 * kRun);
  EXPECT_EQ(sink.gaps, 0u);  // everything fitted
  // Merged: at most twice the payload plus one chunk's bookkeeping per
  // kCoalesceLimit / 2 bytes, where one chunk per byte would cost
  // 2 kRun * segmentCost(1).
  EXPECT_LE(r.heldMemory(), 2 * (2 * kRun) + (2 * kRun) / (StreamReassembler::kCoalesceLimit / 2) *
                                                 StreamReassembler::segmentCost(0));
  EXPECT_LT(r.heldMemory() * 20, 2 * kRun * StreamReassembler::segmentCost(1));

  // The two holes filled: everything comes out in order.
  const std::string fill0 = patternRange(0, 1);
  const std::string fill1 = patternRange(1 + kRun, 2 + kRun);
  r.onSegment(kIsn + 1 + static_cast<uint32_t>(1 + kRun), tcp::kAck, fill1, Timestamp{}, sink);
  r.onSegment(kIsn + 1, tcp::kAck, fill0, Timestamp{}, sink);
  EXPECT_EQ(sink.delivered, 2 + 2 * kRun);
  EXPECT_EQ(sink.misplaced, 0u);
  EXPECT_EQ(sink.gaps, 0u);
  EXPECT_EQ(r.heldMemory(), 0u);
}

TEST(ReassemblyMemory, HeldSegmentsAreChargedTheirBookkeeping) {
  // One held byte costs far more than one byte; a large segment little
  // more than its payload.
  ReassemblerOptions options;
  StreamReassembler r(options);
  PatternSink sink;
  r.onSegment(kIsn, tcp::kSyn, "", Timestamp{}, sink);
  r.onSegment(kIsn + 1 + 10, tcp::kAck, "x", Timestamp{}, sink);
  EXPECT_EQ(r.bufferedBytes(), 1u);
  EXPECT_EQ(r.heldMemory(), StreamReassembler::segmentCost(1));
  EXPECT_GE(StreamReassembler::segmentCost(1), 100u);
  const std::string large(1448, 'y');
  r.onSegment(kIsn + 1 + 100, tcp::kAck, large, Timestamp{}, sink);
  EXPECT_EQ(r.heldMemory(),
            StreamReassembler::segmentCost(1) + StreamReassembler::segmentCost(1448));
  EXPECT_GT(StreamReassembler::segmentCost(1448), 1448u);
  EXPECT_LT(StreamReassembler::segmentCost(1448), 1448u + 256);
  // The figure place() charges before storing is what storing then holds.
  for (size_t size : {15u, 16u, 100u, 1023u, 1025u, 9000u, 65536u}) {
    SCOPED_TRACE(size);
    StreamReassembler one(options);
    one.onSegment(kIsn, tcp::kSyn, "", Timestamp{}, sink);
    one.onSegment(kIsn + 1 + 1, tcp::kAck, std::string(size, 'z'), Timestamp{}, sink);
    EXPECT_EQ(one.heldMemory(), StreamReassembler::segmentCost(size));
  }
  // A bound smaller than one segment's bookkeeping holds nothing: the
  // hole before the segment is given up and the segment delivered.
  ReassemblerOptions tiny;
  tiny.max_buffered = StreamReassembler::segmentCost(1) - 1;
  StreamReassembler t(tiny);
  PatternSink tiny_sink;
  t.onSegment(kIsn, tcp::kSyn, "", Timestamp{}, tiny_sink);
  t.onSegment(kIsn + 1 + 3, tcp::kAck, "x", Timestamp{}, tiny_sink);
  EXPECT_EQ(t.heldMemory(), 0u);
  EXPECT_EQ(tiny_sink.gap_bytes, 3u);
  EXPECT_EQ(tiny_sink.delivered, 1u);
}

// ---------------------------------------------------------------- table

class CountingEvents : public ConnectionEvents {
 public:
  void onOpened(const ConnectionInfo&) override { ++opened; }
  void onData(uint64_t, Direction, std::string_view bytes) override { delivered += bytes.size(); }
  void onGap(uint64_t, Direction, uint64_t bytes) override {
    gap_bytes += bytes;
    ++gaps;
  }
  void onEnd(uint64_t, Direction) override {}
  void onClosed(uint64_t, CloseReason) override { ++closed; }

  int opened = 0;
  int closed = 0;
  uint64_t delivered = 0;
  uint64_t gap_bytes = 0;
  uint64_t gaps = 0;
};

TcpSegment segmentOf(uint16_t client_port, uint32_t seq, uint8_t flags, std::string_view payload) {
  TcpSegment s;
  s.source = {IpAddress::v4(127, 0, 0, 2), client_port};
  s.destination = {IpAddress::v4(127, 0, 0, 1), 80};
  s.seq = seq;
  s.flags = flags;
  s.payload = payload;
  return s;
}

TEST(ReassemblyMemory, TinySegmentFloodAcrossConnectionsStaysWithinTheTotalOnTheHeap) {
  // Four connections, each allowed the whole total on its own, flooded in
  // turn with every other byte: together they stay within the table's
  // bound, on the heap too.
  constexpr int kConnections = 4;
  constexpr uint64_t kSegmentsEach = 1u << 18;
  ConnectionTableOptions options;
  options.server_ports = {80};
  options.max_buffered_total = 1u << 20;
  options.stream.max_buffered = 1u << 20;
  options.stream.hole_timeout = seconds(3600);
  CountingEvents events;
  ConnectionTable table(options, events);
  for (int c = 0; c < kConnections; ++c) {
    table.onSegment(segmentOf(static_cast<uint16_t>(40000 + c), kIsn, tcp::kSyn, ""), seconds(0));
  }
  ASSERT_EQ(events.opened, kConnections);

  const size_t heap_before = heapInUse();
  size_t held_peak = 0;
  size_t heap_peak = 0;
  const char byte = 'z';
  for (uint64_t i = 0; i < kSegmentsEach; ++i) {
    for (int c = 0; c < kConnections; ++c) {
      table.onSegment(
          segmentOf(static_cast<uint16_t>(40000 + c), kIsn + 1 + static_cast<uint32_t>(2 * i + 1),
                    tcp::kAck, std::string_view(&byte, 1)),
          seconds(0));
      held_peak = std::max(held_peak, table.heldMemory());
    }
    if (i % 256 == 255) heap_peak = std::max(heap_peak, grownSince(heap_before));
  }
  const size_t heap_grown = grownSince(heap_before);
  heap_peak = std::max(heap_peak, heap_grown);

  EXPECT_LE(held_peak, options.max_buffered_total);
  EXPECT_GT(table.heldMemory(), options.max_buffered_total / 2);
  if (canMeasureHeap()) {
    EXPECT_LE(heap_peak, options.max_buffered_total + kHeapSlack)
        << "heap grew by " << heap_peak << " bytes under a " << options.max_buffered_total
        << "-byte bound (" << table.bufferedBytes() << " payload bytes held)";
    EXPECT_LE(heap_grown, table.heldMemory() + kHeapSlack);
  }
  EXPECT_GT(events.gaps, 0u);
  EXPECT_EQ(table.size(), static_cast<size_t>(kConnections));  // shed, none evicted

  // Closing reports everything still missing: every byte of every span is
  // delivered or a gap.
  const uint64_t held_bytes = table.bufferedBytes();
  const uint64_t delivered_before = events.delivered;
  table.closeAll();
  EXPECT_EQ(events.delivered - delivered_before, held_bytes);
  EXPECT_EQ(events.delivered + events.gap_bytes, kConnections * 2 * kSegmentsEach);
  EXPECT_EQ(events.closed, kConnections);
  EXPECT_EQ(table.heldMemory(), 0u);
}

}  // namespace
}  // namespace siphon::agent::mirror
