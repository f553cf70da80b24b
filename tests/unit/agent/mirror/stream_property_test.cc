// Randomized streams with fixed seeds: a 1-4 MiB stream cut into random
// segments, reordered within a window, with duplicates and overlaps (and,
// in some tests, segments lost for good). Whatever the order, the output
// must be the original bytes at their offsets, with gaps exactly where
// bytes were lost, and the buffer never above its bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "agent/mirror/reassembly.h"
#include "tests/unit/agent/mirror/test_packets.h"

namespace siphon::agent::mirror {
namespace {

using std::chrono::milliseconds;
using testing::Recorder;

struct Range {
  uint64_t begin;
  uint64_t end;
};

struct Scenario {
  std::string stream;
  uint32_t isn = 0;
  std::vector<Range> sends;    // in arrival order (the FIN is sent separately, last in its window)
  std::vector<Range> dropped;  // merged, in stream order
};

constexpr size_t kWindow = 24;  // how far a segment may move in the arrival order

// Segments of 1-2000 bytes, one in eight of 1-16; `max_segment` caps them.
Scenario makeScenario(uint32_t seed, double drop_rate, uint64_t max_segment = 2000) {
  std::mt19937_64 random(seed);
  Scenario s;
  s.stream.resize(std::uniform_int_distribution<size_t>(1 << 20, 4 << 20)(random));
  for (char& c : s.stream) c = static_cast<char>(random());
  // Close enough to 2^32 that every stream wraps.
  s.isn = static_cast<uint32_t>(0x100000000ull - 1 - random() % (1 << 20));

  std::vector<Range> segments;
  for (uint64_t at = 0; at < s.stream.size();) {
    uint64_t size = random() % 8 == 0 ? 1 + random() % 16 : 1 + random() % 2000;
    size = std::min<uint64_t>({size, max_segment, s.stream.size() - at});
    segments.push_back({at, at + size});
    at += size;
  }
  std::bernoulli_distribution drop(drop_rate), duplicate(0.05), overlap(0.1);
  std::vector<bool> lost(segments.size());
  for (size_t i = 0; i < segments.size(); ++i) {
    lost[i] = drop(random);
    if (lost[i]) {
      if (!s.dropped.empty() && s.dropped.back().end == segments[i].begin) {
        s.dropped.back().end = segments[i].end;
      } else {
        s.dropped.push_back(segments[i]);
      }
    }
  }

  // Each entry with a sort key near its index: no entry moves by more than
  // kWindow places, so reordering alone never leaves a hole open for long.
  std::vector<std::pair<double, Range>> entries;
  std::uniform_real_distribution<double> jitter(0, kWindow);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (lost[i]) continue;
    double index = static_cast<double>(entries.size());
    entries.emplace_back(index + jitter(random), segments[i]);
    if (duplicate(random)) entries.emplace_back(index + jitter(random), segments[i]);
    if (overlap(random)) {
      // A retransmission split differently: any range inside this segment
      // and the next (when that one was not lost).
      uint64_t end =
          i + 1 < segments.size() && !lost[i + 1] ? segments[i + 1].end : segments[i].end;
      uint64_t begin = segments[i].begin + random() % (end - segments[i].begin);
      uint64_t last = begin + 1 + random() % (end - begin);
      entries.emplace_back(index + jitter(random), Range{begin, last});
    }
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [key, range] : entries) s.sends.push_back(range);
  return s;
}

struct Outcome {
  explicit Outcome(std::string_view original) : sink(original) {}
  Recorder sink;
  size_t max_held_seen = 0;  // heldMemory(), what max_buffered bounds
  StreamStats stats;
};

// Plays the scenario, one millisecond per arrival; the FIN (never lost)
// comes after everything.
void play(const Scenario& s, const ReassemblerOptions& options, Outcome& out) {
  StreamReassembler r(options);
  Timestamp now{};
  r.onSegment(s.isn, tcp::kSyn, "", now, out.sink);
  for (const Range& range : s.sends) {
    now += milliseconds(1);
    uint32_t seq = s.isn + 1 + static_cast<uint32_t>(range.begin);
    r.onSegment(seq, tcp::kAck,
                std::string_view(s.stream).substr(range.begin, range.end - range.begin), now,
                out.sink);
    out.max_held_seen = std::max(out.max_held_seen, r.heldMemory());
  }
  now += milliseconds(1);
  r.onSegment(s.isn + 1 + static_cast<uint32_t>(s.stream.size()), tcp::kAck | tcp::kFin, "", now,
              out.sink);
  r.advanceTime(now + options.hole_timeout, out.sink);
  out.stats = r.stats();
}

ReassemblerOptions roomy() {
  ReassemblerOptions options;
  options.max_buffered = 1 << 20;
  // Far longer than any reordering (kWindow arrivals, a few with extra
  // entries), so only real loss times out.
  options.hole_timeout = milliseconds(10 * kWindow);
  return options;
}

TEST(StreamProperty, ReorderedDuplicatedOverlappingStreamIsExact) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    Scenario s = makeScenario(seed, 0);
    Outcome out(s.stream);
    play(s, roomy(), out);
    EXPECT_TRUE(out.sink.data == s.stream)
        << "output differs, " << out.sink.data.size() << " of " << s.stream.size() << " bytes";
    EXPECT_TRUE(out.sink.gaps.empty());
    EXPECT_EQ(out.sink.misplaced_chunks, 0);
    EXPECT_EQ(out.sink.end, StreamEnd::kFin);
    EXPECT_LE(out.max_held_seen, roomy().max_buffered);
    EXPECT_GT(out.max_held_seen, 0u);  // there was reordering to buffer
    EXPECT_GT(out.stats.duplicate_bytes, 0u);
  }
}

TEST(StreamProperty, LostSegmentsBecomeGapsAtTheirRanges) {
  for (uint32_t seed : {11u, 12u, 13u}) {
    SCOPED_TRACE(seed);
    Scenario s = makeScenario(seed, 0.02);
    ASSERT_FALSE(s.dropped.empty());
    Outcome out(s.stream);
    play(s, roomy(), out);
    EXPECT_EQ(out.sink.delivered + out.sink.gap_bytes, s.stream.size());
    EXPECT_EQ(out.sink.misplaced_chunks, 0);
    ASSERT_EQ(out.sink.gaps.size(), s.dropped.size());
    for (size_t i = 0; i < s.dropped.size(); ++i) {
      EXPECT_EQ(out.sink.gaps[i].first, s.dropped[i].begin) << "gap " << i;
      EXPECT_EQ(out.sink.gaps[i].second, s.dropped[i].end - s.dropped[i].begin) << "gap " << i;
    }
    EXPECT_EQ(out.sink.end, StreamEnd::kFin);
    EXPECT_EQ(out.stats.delivered_bytes, out.sink.delivered);
    EXPECT_EQ(out.stats.gap_bytes, out.sink.gap_bytes);
    EXPECT_LE(out.max_held_seen, roomy().max_buffered);
  }
}

TEST(StreamProperty, SmallBufferStaysBoundedAndAccountsForEveryByte) {
  // The reordering window holds more than the buffer: holes are given up
  // under pressure, bytes arriving after that are duplicates, and the
  // accounting still adds up with every delivered byte in its place.
  for (auto [seed, drop_rate] : {std::pair{21u, 0.0}, std::pair{22u, 0.02}}) {
    SCOPED_TRACE(seed);
    Scenario s = makeScenario(seed, drop_rate);
    ReassemblerOptions options = roomy();
    options.max_buffered = 8 << 10;
    Outcome out(s.stream);
    play(s, options, out);
    EXPECT_EQ(out.sink.delivered + out.sink.gap_bytes, s.stream.size());
    EXPECT_EQ(out.sink.misplaced_chunks, 0);
    EXPECT_LE(out.max_held_seen, options.max_buffered);
    EXPECT_FALSE(out.sink.gaps.empty());  // the bound did bite
    EXPECT_EQ(out.sink.end, StreamEnd::kFin);
  }
}

TEST(StreamProperty, TinySegmentsMergeBoundedAndExact) {
  // Segments of 1-24 bytes: held ones merge with their neighbours (and
  // retransmissions overlapping them are cut around them), with a roomy
  // bound and with one that bites; the output stays exact either way.
  for (auto [seed, drop_rate] : {std::pair{31u, 0.0}, std::pair{32u, 0.02}}) {
    SCOPED_TRACE(seed);
    Scenario s = makeScenario(seed, drop_rate, 24);
    for (size_t max_buffered : {size_t{1} << 20, size_t{16} << 10}) {
      SCOPED_TRACE(max_buffered);
      ReassemblerOptions options = roomy();
      options.max_buffered = max_buffered;
      Outcome out(s.stream);
      play(s, options, out);
      EXPECT_EQ(out.sink.delivered + out.sink.gap_bytes, s.stream.size());
      EXPECT_EQ(out.sink.misplaced_chunks, 0);
      EXPECT_LE(out.max_held_seen, options.max_buffered);
      EXPECT_GT(out.max_held_seen, 0u);
      EXPECT_EQ(out.sink.end, StreamEnd::kFin);
      if (drop_rate == 0 && max_buffered == roomy().max_buffered) {
        EXPECT_TRUE(out.sink.data == s.stream);
        EXPECT_TRUE(out.sink.gaps.empty());
      }
    }
  }
}

}  // namespace
}  // namespace siphon::agent::mirror
