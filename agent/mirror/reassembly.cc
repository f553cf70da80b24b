// TCP reassembly for mirroring, without I/O: packet parsing, one
// StreamReassembler per direction (ordered delivery, holes that become
// gaps, memory counted as held), and the ConnectionTable over them. Over
// 600 lines because the three sections (marked below) are the one tested
// unit (tests/unit/agent/mirror/reassembly_test.cc) and share the cost
// accounting that keeps the documented bound.
#include "agent/mirror/reassembly.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace siphon::agent::mirror {
namespace {

// Broken internal invariants abort loudly rather than corrupt a stream.
void invariant(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "mirror reassembly invariant broken: %s\n", what);
    std::abort();
  }
}

uint8_t byteAt(std::string_view data, size_t offset) { return static_cast<uint8_t>(data[offset]); }
uint16_t read16(std::string_view data, size_t offset) {
  return static_cast<uint16_t>(byteAt(data, offset) << 8 | byteAt(data, offset + 1));
}
uint32_t read32(std::string_view data, size_t offset) {
  return uint32_t{read16(data, offset)} << 16 | read16(data, offset + 2);
}

absl::Status malformed(const std::string& what) {
  return absl::InvalidArgumentError("malformed packet: " + what);
}
absl::Status unsupported(const std::string& what) {
  return absl::UnimplementedError("unsupported packet: " + what);
}

constexpr uint8_t kProtocolTcp = 6;
constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint16_t kEtherTypeIpv6 = 0x86dd;
constexpr uint16_t kEtherTypeVlan = 0x8100;
constexpr uint16_t kEtherTypeQinQ = 0x88a8;
constexpr size_t kEthernetHeader = 14;
constexpr size_t kVlanTag = 4;
constexpr int kMaxVlanTags = 2;
constexpr size_t kIpv4MinHeader = 20;
constexpr size_t kIpv6Header = 40;
constexpr size_t kTcpMinHeader = 20;
// More extension headers than any sane packet carries; the bound keeps a
// hostile chain from costing more than a few reads.
constexpr int kMaxIpv6ExtensionHeaders = 8;

// ---------------------------------------------------------------- memory
// One held segment used to be counted as its payload bytes while a 1-byte
// segment held about 150 bytes of heap: a flood of tiny out-of-order
// segments grew the heap ~150x past max_buffered. What is counted now is
// the heap blocks themselves.

// The heap block malloc hands out for `request` bytes: glibc rounds the
// request plus an 8-byte size header up to 16 bytes, 32 at least
// (request2size); jemalloc and tcmalloc size classes are no coarser for
// these sizes by more than a few bytes.
constexpr size_t mallocBlock(size_t request) {
  return std::max<size_t>(4 * sizeof(size_t), (request + sizeof(size_t) + 15) & ~size_t{15});
}

// A red-black tree node (std::map, std::multiset) carries its colour and
// three links before the value: libstdc++'s _Rb_tree_node_base, libc++'s
// __tree_node_base plus the colour are the same four words.
constexpr size_t kTreeNodeHeader = 4 * sizeof(void*);

// The heap block behind a string's bytes: none while they fit in the
// string itself (small-string optimisation).
size_t stringHeap(const std::string& s) {
  const char* object = reinterpret_cast<const char*>(&s);
  if (s.data() >= object && s.data() < object + sizeof s) return 0;
  return mallocBlock(s.capacity() + 1);
}

absl::StatusOr<TcpSegment> parseTcp(std::string_view tcp, TcpSegment segment) {
  if (tcp.size() < kTcpMinHeader) return malformed("TCP header truncated");
  size_t header = static_cast<size_t>(byteAt(tcp, 12) >> 4) * 4;
  if (header < kTcpMinHeader) return malformed("TCP data offset below 5");
  if (header > tcp.size()) return malformed("TCP options past the end of the packet");
  segment.source.port = read16(tcp, 0);
  segment.destination.port = read16(tcp, 2);
  segment.seq = read32(tcp, 4);
  segment.ack = read32(tcp, 8);
  segment.flags = byteAt(tcp, 13);
  segment.payload = tcp.substr(header);
  return segment;
}

absl::StatusOr<TcpSegment> parseIpv4(std::string_view ip) {
  if (ip.size() < kIpv4MinHeader) return malformed("IPv4 header truncated");
  if (byteAt(ip, 0) >> 4 != 4) return malformed("IP version is not 4");
  size_t header = size_t{byteAt(ip, 0) & 0x0fu} * 4;
  if (header < kIpv4MinHeader) return malformed("IPv4 header length below 5");
  if (header > ip.size()) return malformed("IPv4 options past the end of the packet");
  size_t total = read16(ip, 2);
  // BIG TCP (GSO beyond 64 KiB) sets the length to 0: the TC program sizes
  // its copies for 64 KiB, so such a packet could not be whole anyway.
  if (total == 0) return unsupported("IPv4 total length 0 (BIG TCP)");
  if (total < header) return malformed("IPv4 total length shorter than its header");
  if (total > ip.size()) return malformed("IPv4 packet truncated (total length past the capture)");
  // A fragment's TCP header is elsewhere (or its payload is partial); the
  // target's stack reassembles them, and so should a mirror that wants them.
  uint16_t fragment = read16(ip, 6);
  if ((fragment & 0x2000u) != 0 || (fragment & 0x1fffu) != 0) return unsupported("IPv4 fragment");
  if (byteAt(ip, 9) != kProtocolTcp) {
    return unsupported(absl::StrCat("IPv4 protocol ", byteAt(ip, 9), " is not TCP"));
  }
  TcpSegment segment;
  segment.source.address.family = 4;
  segment.destination.address.family = 4;
  for (size_t i = 0; i < 4; ++i) {
    segment.source.address.bytes[i] = byteAt(ip, 12 + i);
    segment.destination.address.bytes[i] = byteAt(ip, 16 + i);
  }
  // Past `total` is link padding (short Ethernet frames), not TCP payload.
  return parseTcp(ip.substr(header, total - header), segment);
}

absl::StatusOr<TcpSegment> parseIpv6(std::string_view ip) {
  if (ip.size() < kIpv6Header) return malformed("IPv6 header truncated");
  if (byteAt(ip, 0) >> 4 != 6) return malformed("IP version is not 6");
  size_t payload_length = read16(ip, 4);
  if (payload_length == 0) return unsupported("IPv6 jumbogram or BIG TCP (payload length 0)");
  if (kIpv6Header + payload_length > ip.size()) {
    return malformed("IPv6 packet truncated (payload length past the capture)");
  }
  TcpSegment segment;
  segment.source.address.family = 6;
  segment.destination.address.family = 6;
  for (size_t i = 0; i < 16; ++i) {
    segment.source.address.bytes[i] = byteAt(ip, 8 + i);
    segment.destination.address.bytes[i] = byteAt(ip, 24 + i);
  }
  std::string_view rest = ip.substr(kIpv6Header, payload_length);
  uint8_t next = byteAt(ip, 6);
  for (int i = 0; i <= kMaxIpv6ExtensionHeaders; ++i) {
    size_t length = 0;
    switch (next) {
      case kProtocolTcp:
        return parseTcp(rest, segment);
      case 0:   // hop-by-hop options
      case 43:  // routing
      case 60:  // destination options
        if (rest.size() < 2) return malformed("IPv6 extension header truncated");
        length = (size_t{byteAt(rest, 1)} + 1) * 8;
        break;
      case 51:  // authentication header: its length counts 4-byte units, minus 2
        if (rest.size() < 2) return malformed("IPv6 extension header truncated");
        length = (size_t{byteAt(rest, 1)} + 2) * 4;
        break;
      case 44:
        return unsupported("IPv6 fragment");
      case 50:
        return unsupported("IPv6 ESP (encrypted)");
      case 59:
        return unsupported("IPv6 no next header");
      default:
        return unsupported(absl::StrCat("IPv6 next header ", next, " is not TCP"));
    }
    if (length > rest.size()) return malformed("IPv6 extension header past the end of the packet");
    next = byteAt(rest, 0);
    rest.remove_prefix(length);
  }
  return unsupported("IPv6: too many extension headers");
}

absl::StatusOr<TcpSegment> parseIp(std::string_view ip) {
  if (ip.empty()) return malformed("empty packet");
  switch (byteAt(ip, 0) >> 4) {
    case 4:
      return parseIpv4(ip);
    case 6:
      return parseIpv6(ip);
    default:
      return malformed(absl::StrCat("IP version ", byteAt(ip, 0) >> 4));
  }
}

absl::StatusOr<TcpSegment> parseEthernet(std::string_view frame) {
  if (frame.size() < kEthernetHeader) return malformed("Ethernet header truncated");
  size_t offset = 12;
  uint16_t type = read16(frame, offset);
  for (int tags = 0; type == kEtherTypeVlan || type == kEtherTypeQinQ; ++tags) {
    if (tags == kMaxVlanTags) return unsupported("more than two VLAN tags");
    offset += kVlanTag;
    if (frame.size() < offset + 2) return malformed("VLAN tag truncated");
    type = read16(frame, offset);
  }
  std::string_view ip = frame.substr(offset + 2);
  if (type == kEtherTypeIpv4) return parseIpv4(ip);
  if (type == kEtherTypeIpv6) return parseIpv6(ip);
  return unsupported(absl::StrCat("ethertype 0x", absl::Hex(type), " is not IP"));
}

}  // namespace

IpAddress IpAddress::v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  IpAddress address;
  address.family = 4;
  address.bytes[0] = a;
  address.bytes[1] = b;
  address.bytes[2] = c;
  address.bytes[3] = d;
  return address;
}

std::string IpAddress::toString() const {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(family == 6 ? AF_INET6 : AF_INET, bytes.data(), text, sizeof text);
  return text;
}

std::string Endpoint::toString() const {
  if (address.family == 6) return absl::StrCat("[", address.toString(), "]:", port);
  return absl::StrCat(address.toString(), ":", port);
}

absl::StatusOr<TcpSegment> parsePacket(std::string_view packet, LinkType link) {
  return link == LinkType::kEthernet ? parseEthernet(packet) : parseIp(packet);
}

// ---------------------------------------------------------------- StreamReassembler

StreamReassembler::StreamReassembler(ReassemblerOptions options) : options_(options) {}

size_t StreamReassembler::nodeCost() {
  // The pending_ node (key and Chunk) and the arrivals_ node.
  return mallocBlock(kTreeNodeHeader + sizeof(std::pair<const uint64_t, Chunk>)) +
         mallocBlock(kTreeNodeHeader + sizeof(Timestamp));
}

size_t StreamReassembler::chunkCost(const Chunk& chunk) {
  return nodeCost() + stringHeap(chunk.bytes);
}

size_t StreamReassembler::segmentCost(size_t bytes) {
  // What store() makes: a copy of the view, its capacity exactly `bytes`
  // once past what the string holds inline (chunkCost() of it, without
  // allocating it to find out).
  static const size_t kInline = std::string().capacity();
  return nodeCost() + (bytes <= kInline ? 0 : mallocBlock(bytes + 1));
}

void StreamReassembler::start(uint32_t first_data_seq, bool mid_stream) {
  started_ = true;
  started_mid_stream_ = mid_stream;
  first_seq_ = first_data_seq;
}

void StreamReassembler::startAt(uint32_t seq) {
  if (!started_) start(seq, /*mid_stream=*/false);
}

uint64_t StreamReassembler::knownEnd() const {
  return std::max({next_, highest_end_, fin_end_.value_or(0)});
}

void StreamReassembler::onSegment(uint32_t seq, uint8_t flags, std::string_view payload,
                                  Timestamp now, StreamSink& sink) {
  if (ended_) {
    stats_.ignored_bytes += payload.size();
    return;
  }
  bool syn = (flags & tcp::kSyn) != 0;
  if (!started_) {
    if (syn) isn_ = seq;
    start(syn ? seq + 1 : seq, /*mid_stream=*/!syn);
  }
  if (flags & tcp::kRst) {
    reportAllHoles(sink);
    ended_ = true;
    sink.onEnd(StreamEnd::kReset);
    return;
  }

  // The SYN occupies one sequence number before the data.
  uint32_t data_seq = syn ? seq + 1 : seq;
  // Relative to the next expected byte, as a signed 32-bit distance: this
  // is what makes the 2^32 wrap invisible.
  uint32_t next_seq = first_seq_ + static_cast<uint32_t>(next_);
  int64_t offset = static_cast<int64_t>(next_) + static_cast<int32_t>(data_seq - next_seq);
  if (offset < 0) {
    // Bytes from before the stream's start (joined mid-stream after a
    // reordered segment): unknowable, and outside the span we account for.
    // Restored without a known start: bytes the earlier owner handled.
    size_t before = std::min(payload.size(), static_cast<size_t>(-offset));
    (restored_mid_way_ ? stats_.duplicate_bytes : stats_.ignored_bytes) += before;
    payload.remove_prefix(before);
    offset = 0;
  }
  uint64_t begin = static_cast<uint64_t>(offset);
  uint64_t end = begin + payload.size();

  if ((flags & tcp::kFin) && !fin_end_) {
    // A FIN that claims to end before data already seen is not believed
    // that far: the seen bytes stay accounted for.
    fin_end_ = std::max({end, highest_end_, next_});
    fin_arrival_ = now;
  }
  if (fin_end_ && end > *fin_end_) {
    uint64_t past = end - std::max(begin, *fin_end_);
    stats_.ignored_bytes += past;
    payload.remove_suffix(past);
    end -= past;
  }
  if (begin < next_) {
    uint64_t old = std::min(end, next_) - begin;
    stats_.duplicate_bytes += old;
    payload.remove_prefix(old);
    begin += old;
  }
  if (begin < end) {
    highest_end_ = std::max(highest_end_, end);
    // Cut the segment around what is already buffered: the first copy wins.
    std::vector<std::pair<uint64_t, std::string_view>> pieces;
    uint64_t cursor = begin;
    auto it = pending_.upper_bound(cursor);
    if (it != pending_.begin()) {
      auto before = std::prev(it);
      uint64_t before_end = before->first + before->second.bytes.size();
      if (before_end > cursor) cursor = std::min(before_end, end);
    }
    while (cursor < end) {
      uint64_t piece_end = it == pending_.end() ? end : std::min(end, it->first);
      if (piece_end > cursor) {
        pieces.emplace_back(cursor, payload.substr(cursor - begin, piece_end - cursor));
      }
      if (it == pending_.end() || it->first >= end) break;
      cursor = std::min(end, it->first + it->second.bytes.size());
      ++it;
    }
    uint64_t fresh = 0;
    for (const auto& [piece_offset, bytes] : pieces) fresh += bytes.size();
    stats_.duplicate_bytes += (end - begin) - fresh;
    for (const auto& [piece_offset, bytes] : pieces) place(piece_offset, bytes, now, sink);
  }
  expireHoles(now, sink);
  endIfFinished(sink);
}

// `bytes` at `offset` overlap nothing buffered and nothing delivered.
void StreamReassembler::place(uint64_t offset, std::string_view bytes, Timestamp now,
                              StreamSink& sink) {
  // Make room by giving up the oldest holes, but only those before this
  // piece: giving up one after it would report bytes we are holding. Room
  // for a separate segment is made even when it may merge with a
  // neighbour: store() merges only when that fits as well.
  const size_t cost = segmentCost(bytes.size());
  while (offset > next_ && held_ + cost > options_.max_buffered && !pending_.empty() &&
         pending_.begin()->first < offset) {
    skipFirstHole(sink);
  }
  invariant(offset >= next_, "a piece starts before the next byte to deliver");
  if (offset > next_ && held_ + cost > options_.max_buffered) {
    // Nothing buffered before this piece, and it still does not fit: the
    // hole before it is given up and the piece delivered straight away.
    skipTo(offset, sink);
  }
  if (offset == next_) {
    deliver(bytes, sink);
    drain(sink);
    return;
  }
  store(offset, bytes, now);
  invariant(held_ <= options_.max_buffered, "out-of-order data holds more than max_buffered");
}

// There is room for `bytes` at `offset` as a separate chunk.
void StreamReassembler::store(uint64_t offset, std::string_view bytes, Timestamp now) {
  if (coalesce(offset, bytes, now)) return;
  auto [it, inserted] = pending_.emplace(offset, Chunk{std::string(bytes), now});
  invariant(inserted, "two buffered chunks at one offset");
  arrivals_.insert(now);
  buffered_ += bytes.size();
  held_ += chunkCost(it->second);
}

void StreamReassembler::setArrival(Chunk& chunk, Timestamp arrival) {
  if (arrival >= chunk.arrival) return;
  arrivals_.erase(arrivals_.find(chunk.arrival));
  arrivals_.insert(arrival);
  chunk.arrival = arrival;
}

// Merges `bytes` with the chunk ending at `offset` and/or the one starting
// right after them, while the result stays within kCoalesceLimit and
// max_buffered. False when nothing was merged (the caller stores a chunk).
// A merged chunk keeps the earliest arrival of its parts: adjacent chunks
// drain together, so the oldest hole's age is unchanged.
bool StreamReassembler::coalesce(uint64_t offset, std::string_view bytes, Timestamp now) {
  auto after = pending_.upper_bound(offset);
  auto before = after == pending_.begin() ? pending_.end() : std::prev(after);
  size_t size = bytes.size();
  const bool join_before = before != pending_.end() &&
                           before->first + before->second.bytes.size() == offset &&
                           before->second.bytes.size() + size <= kCoalesceLimit;
  if (join_before) size += before->second.bytes.size();
  const bool join_after = after != pending_.end() && after->first == offset + bytes.size() &&
                          size + after->second.bytes.size() <= kCoalesceLimit;
  if (join_after) size += after->second.bytes.size();
  if (!join_before && !join_after) return false;

  const size_t old_cost =
      (join_before ? chunkCost(before->second) : 0) + (join_after ? chunkCost(after->second) : 0);
  Chunk& target = join_before ? before->second : after->second;
  if (join_before && target.bytes.capacity() >= size) {
    // Room in place: no new block, nothing to check.
    target.bytes.append(bytes);
    if (join_after) target.bytes.append(after->second.bytes);
  } else {
    // A new block with room to grow (amortised, like append's own
    // doubling), charged before anything changes.
    std::string merged;
    merged.reserve(std::min(kCoalesceLimit, 2 * size));
    if (join_before) merged.append(before->second.bytes);
    merged.append(bytes);
    if (join_after) merged.append(after->second.bytes);
    const size_t new_cost = nodeCost() + stringHeap(merged);
    if (held_ - old_cost + new_cost > options_.max_buffered) return false;
    target.bytes = std::move(merged);
  }
  setArrival(target, now);
  if (join_before && join_after) {
    setArrival(target, after->second.arrival);
    arrivals_.erase(arrivals_.find(after->second.arrival));
    pending_.erase(after);
  } else if (join_after) {
    // The chunk now starts at `offset`: same node, new key.
    auto node = pending_.extract(after);
    node.key() = offset;
    pending_.insert(std::move(node));
  }
  buffered_ += bytes.size();
  held_ = held_ - old_cost + chunkCost(target);
  return true;
}

void StreamReassembler::deliver(std::string_view bytes, StreamSink& sink) {
  if (bytes.empty()) return;
  next_ += bytes.size();
  stats_.delivered_bytes += bytes.size();
  sink.onData(bytes);
}

void StreamReassembler::skipTo(uint64_t offset, StreamSink& sink) {
  invariant(offset >= next_, "a gap ends before the next byte to deliver");
  if (offset == next_) return;
  uint64_t bytes = offset - next_;
  next_ = offset;
  stats_.gap_bytes += bytes;
  ++stats_.gaps;
  sink.onGap(bytes);
}

void StreamReassembler::drain(StreamSink& sink) {
  while (!pending_.empty() && pending_.begin()->first == next_) {
    auto node = pending_.extract(pending_.begin());
    Chunk& chunk = node.mapped();
    buffered_ -= chunk.bytes.size();
    held_ -= chunkCost(chunk);
    arrivals_.erase(arrivals_.find(chunk.arrival));
    deliver(chunk.bytes, sink);
  }
  invariant(pending_.empty() || pending_.begin()->first > next_,
            "buffered data before the next byte to deliver");
}

// Gives up the hole at next_: up to the first buffered chunk, or to the FIN
// when nothing is buffered.
void StreamReassembler::shed(StreamSink& sink) {
  if (ended_ || pending_.empty()) return;
  skipFirstHole(sink);
  endIfFinished(sink);
}

void StreamReassembler::skipFirstHole(StreamSink& sink) {
  skipTo(pending_.empty() ? knownEnd() : pending_.begin()->first, sink);
  drain(sink);
}

void StreamReassembler::expireHoles(Timestamp now, StreamSink& sink) {
  while (!ended_ && next_ < knownEnd()) {
    // The hole at next_ has been known since the first byte past it arrived.
    Timestamp since = arrivals_.empty() ? fin_arrival_ : *arrivals_.begin();
    if (fin_end_ && *fin_end_ > next_) since = std::min(since, fin_arrival_);
    if (now - since < options_.hole_timeout) return;
    skipFirstHole(sink);
  }
}

void StreamReassembler::reportAllHoles(StreamSink& sink) {
  while (!pending_.empty()) skipFirstHole(sink);
  skipTo(knownEnd(), sink);
}

void StreamReassembler::endIfFinished(StreamSink& sink) {
  if (!ended_ && fin_end_ && next_ == *fin_end_) {
    ended_ = true;
    sink.onEnd(StreamEnd::kFin);
  }
}

void StreamReassembler::advanceTime(Timestamp now, StreamSink& sink) {
  if (ended_) return;
  expireHoles(now, sink);
  endIfFinished(sink);
}

void StreamReassembler::finish(StreamSink& sink) {
  if (ended_) return;
  reportAllHoles(sink);
  ended_ = true;
}

StreamSnapshot StreamReassembler::snapshot() const {
  StreamSnapshot out;
  out.started = started_;
  out.mid_stream = started_mid_stream_;
  out.ended = ended_;
  out.isn = isn_;
  // Offsets back to sequence numbers: modulo 2^32, as on the wire.
  out.next_seq = first_seq_ + static_cast<uint32_t>(next_);
  out.pending.reserve(pending_.size());
  for (const auto& [offset, chunk] : pending_) {
    out.pending.emplace_back(first_seq_ + static_cast<uint32_t>(offset), chunk.bytes);
  }
  if (fin_end_) out.fin_seq = first_seq_ + static_cast<uint32_t>(*fin_end_);
  return out;
}

void StreamReassembler::restore(const StreamSnapshot& snapshot, Timestamp now) {
  invariant(!started_ && !ended_ && pending_.empty(), "restore() on a reassembler in use");
  ended_ = snapshot.ended;
  if (!snapshot.started) return;
  started_ = true;
  started_mid_stream_ = snapshot.mid_stream;
  isn_ = snapshot.isn;
  if (isn_) {
    // Offsets from the real first byte, as the original had them (modulo
    // 2^32: only their differences matter), so a retransmitted SYN still
    // matches firstSeq().
    first_seq_ = *isn_ + 1;
    next_ = static_cast<uint32_t>(snapshot.next_seq - first_seq_);
  } else {
    first_seq_ = snapshot.next_seq;
    next_ = 0;
    restored_mid_way_ = true;
  }
  highest_end_ = next_;
  // Like onSegment(): a sequence number as an offset, by its signed 32-bit
  // distance from the next byte.
  auto offsetOf = [&](uint32_t seq) {
    return static_cast<int64_t>(next_) + static_cast<int32_t>(seq - snapshot.next_seq);
  };
  std::optional<uint64_t> fin;
  if (snapshot.fin_seq) {
    fin = static_cast<uint64_t>(std::max<int64_t>(offsetOf(*snapshot.fin_seq), next_));
  }
  // A snapshot holds ordered, disjoint chunks past next_ and before the
  // FIN; one from elsewhere that does not is cut to that, not trusted.
  for (const auto& [seq, bytes] : snapshot.pending) {
    int64_t begin = offsetOf(seq);
    std::string_view piece = bytes;
    const int64_t floor = std::max<int64_t>(next_, highest_end_);
    if (begin < floor) {
      piece.remove_prefix(std::min<uint64_t>(piece.size(), floor - begin));
      begin = floor;
    }
    if (fin && begin + static_cast<int64_t>(piece.size()) > static_cast<int64_t>(*fin)) {
      piece = piece.substr(
          0, static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(*fin) - begin)));
    }
    if (piece.empty()) continue;
    auto [it, inserted] =
        pending_.emplace(static_cast<uint64_t>(begin), Chunk{std::string(piece), now});
    invariant(inserted, "two restored chunks at one offset");
    arrivals_.insert(now);
    buffered_ += piece.size();
    held_ += chunkCost(it->second);
    highest_end_ = static_cast<uint64_t>(begin) + piece.size();
  }
  if (fin) {
    fin_end_ = std::max(*fin, highest_end_);
    fin_arrival_ = now;
  }
}

// ---------------------------------------------------------------- ConnectionTable

std::string_view closeReasonName(CloseReason reason) {
  switch (reason) {
    case CloseReason::kFin:
      return "fin";
    case CloseReason::kReset:
      return "reset";
    case CloseReason::kIdle:
      return "idle";
    case CloseReason::kEvicted:
      return "evicted";
    case CloseReason::kReplaced:
      return "replaced";
    case CloseReason::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

struct ConnectionTable::Connection {
  ConnectionInfo info;
  StreamReassembler to_server;
  StreamReassembler to_client;
  Timestamp last_seen{};
  std::list<Connection*>::iterator activity;
  bool reset = false;

  Connection(const ReassemblerOptions& options) : to_server(options), to_client(options) {}
  StreamReassembler& stream(Direction direction) {
    return direction == Direction::kClientToServer ? to_server : to_client;
  }
};

// Forwards one direction's stream events to the table's events, counted.
class ConnectionTable::DirectionSink : public StreamSink {
 public:
  DirectionSink(ConnectionTable& table, Connection& connection, Direction direction)
      : table_(table), connection_(connection), direction_(direction) {}

  void onData(std::string_view bytes) override {
    table_.counters_.delivered_bytes += bytes.size();
    table_.events_.onData(connection_.info.id, direction_, bytes);
  }
  void onGap(uint64_t bytes) override {
    table_.counters_.gap_bytes += bytes;
    ++table_.counters_.gaps;
    table_.events_.onGap(connection_.info.id, direction_, bytes);
  }
  void onEnd(StreamEnd how) override {
    if (how == StreamEnd::kReset) {
      connection_.reset = true;  // the table closes it once the segment is done
    } else {
      table_.events_.onEnd(connection_.info.id, direction_);
    }
  }

 private:
  ConnectionTable& table_;
  Connection& connection_;
  Direction direction_;
};

ConnectionTable::ConnectionTable(ConnectionTableOptions options, ConnectionEvents& events)
    : options_(std::move(options)), events_(events) {}

ConnectionTable::~ConnectionTable() = default;

absl::Status ConnectionTable::onPacket(std::string_view packet, LinkType link, Timestamp now) {
  auto segment = parsePacket(packet, link);
  if (!segment.ok()) {
    ++counters_.packets;
    ++counters_.invalid_packets;
    return segment.status();
  }
  onSegment(*segment, now);
  return absl::OkStatus();
}

void ConnectionTable::touch(Connection& connection, Timestamp now) {
  connection.last_seen = std::max(connection.last_seen, now);
  by_activity_.splice(by_activity_.end(), by_activity_, connection.activity);
}

void ConnectionTable::onSegment(const TcpSegment& segment, Timestamp now) {
  ++counters_.packets;
  Connection* connection = nullptr;
  Direction direction = Direction::kClientToServer;
  if (auto it = connections_.find({segment.source, segment.destination});
      it != connections_.end()) {
    connection = it->second.get();
  } else if (auto it = connections_.find({segment.destination, segment.source});
             it != connections_.end()) {
    connection = it->second.get();
    direction = Direction::kServerToClient;
  }

  // A client SYN that does not start the stream we hold: the 4-tuple was
  // reused while we still held the old connection (its end was lost in the
  // copy). A retransmitted or reordered SYN of the same connection starts
  // it exactly where we have it start.
  if (connection && direction == Direction::kClientToServer && segment.has(tcp::kSyn) &&
      !segment.has(tcp::kAck) &&
      !(connection->to_server.started() && connection->to_server.firstSeq() == segment.seq + 1)) {
    close(*connection, CloseReason::kReplaced);
    connection = nullptr;
  }
  if (!connection) {
    connection = open(segment, now);
    if (!connection) {
      ++counters_.ignored_segments;
      return;
    }
    direction = connection->info.client == segment.source ? Direction::kClientToServer
                                                          : Direction::kServerToClient;
  }
  touch(*connection, now);

  const size_t before = held(*connection);
  DirectionSink sink(*this, *connection, direction);
  connection->stream(direction).onSegment(segment.seq, segment.flags, segment.payload, now, sink);
  accountBuffered(*connection, before);
  if (connection->reset) {
    close(*connection, CloseReason::kReset);
  } else if (connection->to_server.ended() && connection->to_client.ended()) {
    close(*connection, CloseReason::kFin);
  }
}

ConnectionTable::Connection* ConnectionTable::open(const TcpSegment& segment, Timestamp now) {
  if (segment.has(tcp::kRst)) return nullptr;
  bool syn = segment.has(tcp::kSyn);
  if (!syn && segment.payload.empty()) return nullptr;

  ConnectionInfo info;
  bool source_is_client = true;
  if (syn) {
    // SYN from the client; SYN-ACK from the server (its SYN was not seen).
    source_is_client = !segment.has(tcp::kAck);
  } else {
    bool destination_serves = options_.server_ports.contains(segment.destination.port);
    bool source_serves = options_.server_ports.contains(segment.source.port);
    source_is_client = destination_serves || !source_serves;
    info.started_mid_stream = true;
  }
  info.client = source_is_client ? segment.source : segment.destination;
  info.server = source_is_client ? segment.destination : segment.source;

  if (connections_.size() >= options_.max_connections && !by_activity_.empty()) {
    ++counters_.evictions;
    close(*by_activity_.front(), CloseReason::kEvicted);
  }
  info.id = next_id_++;
  auto connection = std::make_unique<Connection>(options_.stream);
  connection->info = info;
  connection->last_seen = now;
  if (syn && !source_is_client) {
    // The SYN-ACK acknowledges the client's ISN+1: where its data starts.
    connection->to_server.startAt(segment.ack);
  }
  Connection* raw = connection.get();
  by_activity_.push_back(raw);
  raw->activity = std::prev(by_activity_.end());
  connections_.emplace(Key{info.client, info.server}, std::move(connection));
  ++counters_.connections_opened;
  events_.onOpened(info);
  return raw;
}

void ConnectionTable::close(Connection& connection, CloseReason reason) {
  held_total_ -= held(connection);
  // What is still missing in either direction is reported before the close:
  // a consumer never has to guess whether bytes were lost.
  DirectionSink to_server(*this, connection, Direction::kClientToServer);
  connection.to_server.finish(to_server);
  DirectionSink to_client(*this, connection, Direction::kServerToClient);
  connection.to_client.finish(to_client);
  counters_.duplicate_bytes +=
      connection.to_server.stats().duplicate_bytes + connection.to_client.stats().duplicate_bytes;
  uint64_t id = connection.info.id;
  by_activity_.erase(connection.activity);
  connections_.erase(Key{connection.info.client, connection.info.server});
  ++counters_.connections_closed;
  if (reason == CloseReason::kIdle) ++counters_.idle_closes;
  events_.onClosed(id, reason);
}

void ConnectionTable::advanceTime(Timestamp now) {
  while (!by_activity_.empty() && now - by_activity_.front()->last_seen >= options_.idle_timeout) {
    close(*by_activity_.front(), CloseReason::kIdle);
  }
  // Collected first: a hole given up may end a stream and close its
  // connection, which must not happen under the iteration.
  std::vector<Connection*> all(by_activity_.begin(), by_activity_.end());
  for (Connection* connection : all) {
    const size_t before = held(*connection);
    DirectionSink to_server(*this, *connection, Direction::kClientToServer);
    connection->to_server.advanceTime(now, to_server);
    DirectionSink to_client(*this, *connection, Direction::kServerToClient);
    connection->to_client.advanceTime(now, to_client);
    held_total_ = held_total_ - before + held(*connection);
    if (connection->to_server.ended() && connection->to_client.ended()) {
      close(*connection, CloseReason::kFin);
    }
  }
}

void ConnectionTable::closeAll() {
  while (!by_activity_.empty()) close(*by_activity_.front(), CloseReason::kShutdown);
}

void ConnectionTable::setServerPorts(std::set<uint16_t> ports) {
  options_.server_ports = std::move(ports);
  std::vector<Connection*> gone;
  for (Connection* c : by_activity_) {
    if (!options_.server_ports.contains(c->info.server.port)) gone.push_back(c);
  }
  for (Connection* c : gone) close(*c, CloseReason::kShutdown);
}

std::vector<ConnectionSnapshot> ConnectionTable::snapshot() const {
  std::vector<ConnectionSnapshot> out;
  out.reserve(by_activity_.size());
  for (const Connection* c : by_activity_) {
    out.push_back({c->info, c->to_server.snapshot(), c->to_client.snapshot()});
  }
  return out;
}

void ConnectionTable::restore(const std::vector<ConnectionSnapshot>& connections, uint64_t next_id,
                              Timestamp now) {
  for (const ConnectionSnapshot& s : connections) {
    Key key{s.info.client, s.info.server};
    invariant(!connections_.contains(key), "a restored connection is in the table already");
    auto connection = std::make_unique<Connection>(options_.stream);
    connection->info = s.info;
    connection->last_seen = now;
    connection->to_server.restore(s.client_to_server, now);
    connection->to_client.restore(s.server_to_client, now);
    Connection* raw = connection.get();
    by_activity_.push_back(raw);
    raw->activity = std::prev(by_activity_.end());
    held_total_ += held(*raw);
    next_id_ = std::max(next_id_, s.info.id + 1);
    connections_.emplace(std::move(key), std::move(connection));
  }
  next_id_ = std::max(next_id_, next_id);
}

size_t ConnectionTable::held(const Connection& connection) {
  return connection.to_server.heldMemory() + connection.to_client.heldMemory();
}

size_t ConnectionTable::bufferedBytes() const {
  size_t bytes = 0;
  for (const auto& [key, c] : connections_) {
    bytes += c->to_server.bufferedBytes() + c->to_client.bufferedBytes();
  }
  return bytes;
}

void ConnectionTable::accountBuffered(Connection& connection, size_t before) {
  held_total_ = held_total_ - before + held(connection);
  if (held_total_ <= options_.max_buffered_total) return;
  // The connection that grew pays first, its fuller direction first.
  // False when nothing could be given up (no progress: stop).
  auto shedOne = [this](Connection& c) {
    const size_t was = held(c);
    const Direction d = c.to_server.heldMemory() >= c.to_client.heldMemory()
                            ? Direction::kClientToServer
                            : Direction::kServerToClient;
    DirectionSink sink(*this, c, d);
    c.stream(d).shed(sink);
    held_total_ = held_total_ - was + held(c);
    return held(c) < was;
  };
  while (held_total_ > options_.max_buffered_total && shedOne(connection)) {
  }
  // Then the least recently active. A stream that ends here is closed by
  // the next advanceTime().
  for (Connection* c : by_activity_) {
    while (held_total_ > options_.max_buffered_total && shedOne(*c)) {
    }
    if (held_total_ <= options_.max_buffered_total) break;
  }
}

}  // namespace siphon::agent::mirror
