// Mirror: from copied packets to the two ordered byte streams of each TCP
// connection. The TC program copies every packet of a mirrored port; nothing
// here does I/O or needs root: packets and timestamps in, events out.
//
// Three layers, each usable alone:
//  - parsePacket(): raw IPv4/IPv6 packet (or Ethernet frame) -> TcpSegment.
//    The input is whatever crossed the target's interface, so every length
//    is checked; a bad packet is a status with the reason, never a crash.
//  - StreamReassembler: one direction of one connection; segments in any
//    order -> in-order bytes and explicit gaps. Loss is never silent: for
//    every stream, bytes delivered + bytes reported as gaps == the sequence
//    span seen once the stream has ended (or been finished by the caller).
//  - ConnectionTable: both directions of every connection, bounded in
//    number and time, reporting per-connection events.
//
// Timestamps are whatever monotonic clock the caller uses (the BPF side
// stamps packets with bpf_ktime_get_ns); only differences matter.
//
// Threads: none of these classes is thread-safe; one thread feeds a table.
// Sinks are called synchronously and must not call back into the object
// that calls them.
#pragma once

#include <array>
#include <chrono>
#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent::mirror {

using Timestamp = std::chrono::nanoseconds;

// ---------------------------------------------------------------- packets

enum class LinkType {
  kRawIp,     // the packet starts at the IP header (version from its first nibble)
  kEthernet,  // an Ethernet II frame, optionally with up to two VLAN tags
};

struct IpAddress {
  uint8_t family = 4;  // 4 or 6
  // IPv4 uses the first 4 bytes; the rest stays zero so comparison works.
  std::array<uint8_t, 16> bytes{};

  static IpAddress v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d);
  std::string toString() const;
  auto operator<=>(const IpAddress&) const = default;
};

struct Endpoint {
  IpAddress address;
  uint16_t port = 0;

  std::string toString() const;  // "10.0.0.1:80", "[fd00::1]:80"
  auto operator<=>(const Endpoint&) const = default;
};

namespace tcp {
inline constexpr uint8_t kFin = 0x01;
inline constexpr uint8_t kSyn = 0x02;
inline constexpr uint8_t kRst = 0x04;
inline constexpr uint8_t kPsh = 0x08;
inline constexpr uint8_t kAck = 0x10;
}  // namespace tcp

struct TcpSegment {
  Endpoint source;
  Endpoint destination;
  uint32_t seq = 0;
  uint32_t ack = 0;
  uint8_t flags = 0;  // tcp::k*
  // Points into the packet given to parsePacket(): valid as long as it is.
  std::string_view payload;

  bool has(uint8_t flag) const { return (flags & flag) != 0; }
};

// Errors: INVALID_ARGUMENT for a malformed or truncated packet (bad version,
// header lengths past the end, IP length larger than the capture);
// UNIMPLEMENTED for a well-formed packet this code does not follow (not TCP,
// IP fragments, IPv6 jumbograms, ESP, unknown ethertype). The message says
// which. Checksums are not verified: the kernel has already judged the
// packet, and with offloads the copy often carries a partial checksum.
absl::StatusOr<TcpSegment> parsePacket(std::string_view packet, LinkType link);
// The segment points into the packet: a temporary string would be freed
// before the segment is read.
template <typename T>
  requires std::same_as<std::remove_cvref_t<T>, std::string> && (!std::is_lvalue_reference_v<T>)
absl::StatusOr<TcpSegment> parsePacket(T&& packet, LinkType link) = delete;

// ---------------------------------------------------------------- one direction

enum class StreamEnd {
  kFin,    // the sender finished; everything before the FIN was delivered or reported
  kReset,  // RST: holes before the highest byte seen were reported as gaps
};

// Receives one direction's stream, in order. A gap stands for `bytes`
// sequence numbers that will never be delivered (lost in the copy, or not
// retransmitted in time); the data after it follows at once.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual void onData(std::string_view bytes) = 0;
  virtual void onGap(uint64_t bytes) = 0;
  virtual void onEnd(StreamEnd how) = 0;
};

struct ReassemblerOptions {
  // Memory held for out-of-order data per direction: each held segment
  // costs its payload's allocation plus its bookkeeping (about 150 bytes,
  // StreamReassembler::segmentCost()), so a flood of tiny segments holds no
  // more memory than a few large ones. When a segment would not fit, the
  // oldest hole is given up (reported as a gap) until it does.
  size_t max_buffered = 1 << 20;
  // A hole not filled this long after data past it arrived is given up.
  Timestamp hole_timeout = std::chrono::seconds(2);
};

struct StreamStats {
  uint64_t delivered_bytes = 0;
  uint64_t gap_bytes = 0;
  uint64_t gaps = 0;
  uint64_t duplicate_bytes = 0;  // already delivered, buffered or reported
  uint64_t ignored_bytes = 0;    // before the stream's start, past its FIN, or after its end
};

// One direction as a StreamReassembler holds it: enough to rebuild it in
// another reassembler (another process, after a handover) that goes on
// exactly where this one stopped. Sequence numbers, not offsets: the two
// need not agree on where the stream started.
struct StreamSnapshot {
  bool started = false;
  bool mid_stream = false;
  bool ended = false;
  std::optional<uint32_t> isn;
  uint32_t next_seq = 0;  // the first byte not yet delivered or reported as a gap
  // Out-of-order bytes held past holes: (sequence number of the first byte,
  // bytes), in stream order.
  std::vector<std::pair<uint32_t, std::string>> pending;
  std::optional<uint32_t> fin_seq;  // just past the last data byte, once a FIN was seen
};

// One direction of a TCP connection.
//
// Call order: onSegment()/advanceTime() any number of times; finish() at
// most once, when the caller gives up on the stream (connection closed for
// another reason). After the stream ended (FIN reached, RST, finish()),
// further segments are counted as ignored and produce no events.
//
// Sequence numbers are mapped to 64-bit stream offsets relative to the
// next byte expected, so a stream crosses 2^32 freely; a segment more than
// 2^31 before that point is taken as old data, as TCP itself would.
//
// snapshot() any time; restore() only on a reassembler that has seen
// nothing yet, instead of its first segment.
class StreamReassembler {
 public:
  explicit StreamReassembler(ReassemblerOptions options = {});

  // Fixes the stream's start without a SYN: the first data byte has
  // sequence number `seq`. Used when the peer's SYN-ACK tells where this
  // direction starts. Ignored once the stream has started.
  void startAt(uint32_t seq);

  // One segment of this direction. A SYN sets the ISN (data starts at
  // ISN+1); without one, the first segment seen starts the stream
  // (startedMidStream()). A FIN ends the stream once everything before it
  // was delivered or reported; an RST ends it at once (its payload is a
  // diagnostic, not stream data), reporting holes as gaps.
  void onSegment(uint32_t seq, uint8_t flags, std::string_view payload, Timestamp now,
                 StreamSink& sink);

  // Gives up holes older than hole_timeout. Call periodically: a hole after
  // which nothing arrives would otherwise wait for the next segment.
  void advanceTime(Timestamp now, StreamSink& sink);

  // Delivers what is buffered, reports every hole up to the highest byte
  // seen as a gap, and ends the stream without an onEnd (the caller knows
  // why it stops). No-op on an ended stream.
  void finish(StreamSink& sink);

  // Gives up the first hole (a gap) and delivers what follows it up to the
  // next hole: memory is needed elsewhere. No-op with nothing buffered.
  void shed(StreamSink& sink);

  // What this direction holds, to rebuild it elsewhere (restore()).
  StreamSnapshot snapshot() const;
  // Becomes the reassembler `snapshot` was taken of, with fresh stats: the
  // held chunks count as arrived at `now` (their hole timeouts restart).
  // Bytes before next_seq count as duplicates (they were delivered or
  // reported before the snapshot), also when the stream's start is not
  // known. Produces no events: a chunk at next_seq, which a snapshot never
  // holds, would wait for the next segment. Held memory may exceed
  // max_buffered when this one's is smaller than the snapshot's; the next
  // segment that needs room gives up holes as usual.
  void restore(const StreamSnapshot& snapshot, Timestamp now);

  // What holding one separate out-of-order segment of `bytes` bytes costs:
  // its payload's heap block (none when short enough for the string
  // itself), the map and arrival-set nodes, each rounded as malloc rounds
  // (16-byte blocks with an 8-byte header, 32 at least: glibc's rule, which
  // other allocators do not undercut by much). Adjacent small segments are
  // merged into one buffer of at most kCoalesceLimit bytes, which costs
  // less than the sum.
  static size_t segmentCost(size_t bytes);
  static constexpr size_t kCoalesceLimit = 1024;

  bool started() const { return started_; }
  bool startedMidStream() const { return started_mid_stream_; }
  bool ended() const { return ended_; }
  std::optional<uint32_t> isn() const { return isn_; }
  // Sequence number of the stream's first data byte (valid once started).
  uint32_t firstSeq() const { return first_seq_; }
  // Offset of the next byte to deliver, from the stream's first byte.
  uint64_t nextOffset() const { return next_; }
  // Out-of-order payload bytes held (what finish() would still deliver).
  size_t bufferedBytes() const { return buffered_; }
  // The memory those bytes hold, as counted against max_buffered: never
  // more than max_buffered, never less than what the heap holds for them.
  size_t heldMemory() const { return held_; }
  const StreamStats& stats() const { return stats_; }

 private:
  struct Chunk {
    std::string bytes;
    Timestamp arrival;  // the earliest of the segments merged into it
  };
  static size_t nodeCost();
  static size_t chunkCost(const Chunk& chunk);

  void start(uint32_t first_data_seq, bool mid_stream);
  void place(uint64_t offset, std::string_view bytes, Timestamp now, StreamSink& sink);
  void store(uint64_t offset, std::string_view bytes, Timestamp now);
  bool coalesce(uint64_t offset, std::string_view bytes, Timestamp now);
  void setArrival(Chunk& chunk, Timestamp arrival);
  void deliver(std::string_view bytes, StreamSink& sink);
  void skipTo(uint64_t offset, StreamSink& sink);
  void drain(StreamSink& sink);
  void skipFirstHole(StreamSink& sink);
  void expireHoles(Timestamp now, StreamSink& sink);
  void reportAllHoles(StreamSink& sink);
  void endIfFinished(StreamSink& sink);
  uint64_t knownEnd() const;

  ReassemblerOptions options_;
  bool started_ = false;
  bool started_mid_stream_ = false;
  bool ended_ = false;
  std::optional<uint32_t> isn_;
  // Restored without knowing the stream's first byte (no ISN): offset 0 is
  // where the snapshot had got to, and what comes before it was handled by
  // the reassembler the snapshot came from (duplicates, not "before the
  // start").
  bool restored_mid_way_ = false;
  uint32_t first_seq_ = 0;  // sequence number of stream offset 0
  uint64_t next_ = 0;       // offset of the next byte to deliver
  uint64_t highest_end_ = 0;
  std::optional<uint64_t> fin_end_;  // offset just past the last data byte
  Timestamp fin_arrival_{};
  // Out-of-order data: non-overlapping, every key > next_. Adjacent chunks
  // may stay apart (one past kCoalesceLimit); they always drain together.
  std::map<uint64_t, Chunk> pending_;
  std::multiset<Timestamp> arrivals_;  // of pending_ chunks: when the oldest hole appeared
  size_t buffered_ = 0;                // payload bytes in pending_
  size_t held_ = 0;                    // sum of chunkCost() over pending_
  StreamStats stats_;
};

// ---------------------------------------------------------------- connections

enum class Direction { kClientToServer, kServerToClient };

enum class CloseReason {
  kFin,       // FIN both ways
  kReset,     // RST from either side
  kIdle,      // nothing for idle_timeout
  kEvicted,   // the table was full and this was the least recently active
  kReplaced,  // a new SYN with another ISN on the same 4-tuple
  kShutdown,  // closeAll()
};

std::string_view closeReasonName(CloseReason reason);

struct ConnectionInfo {
  uint64_t id = 0;
  Endpoint client;
  Endpoint server;
  // Joined without seeing the handshake: the streams start at the first
  // segment seen, and earlier bytes of the connection are unknown.
  bool started_mid_stream = false;
};

// One connection as a ConnectionTable holds it (ConnectionTable::snapshot()).
struct ConnectionSnapshot {
  ConnectionInfo info;
  StreamSnapshot client_to_server, server_to_client;
};

// Per-connection events. Every opened connection gets exactly one
// onClosed(); before it, every gap and all data of both directions.
class ConnectionEvents {
 public:
  virtual ~ConnectionEvents() = default;
  virtual void onOpened(const ConnectionInfo& connection) = 0;
  virtual void onData(uint64_t id, Direction direction, std::string_view bytes) = 0;
  virtual void onGap(uint64_t id, Direction direction, uint64_t bytes) = 0;
  // The sender of `direction` finished (FIN); the other direction may go on.
  virtual void onEnd(uint64_t id, Direction direction) = 0;
  virtual void onClosed(uint64_t id, CloseReason reason) = 0;
};

struct ConnectionTableOptions {
  // Mirrored ports: on a mid-stream join, the side using one is the server.
  std::set<uint16_t> server_ports;
  size_t max_connections = 4096;
  // Memory held for out-of-order data by all connections together (as
  // ReassemblerOptions::max_buffered counts it). Past it, the connection
  // that just grew gives up its first hole (then the least recently active
  // ones do), so one busy table cannot grow without bound.
  size_t max_buffered_total = 128u << 20;
  Timestamp idle_timeout = std::chrono::minutes(5);
  ReassemblerOptions stream;
};

struct MirrorCounters {
  uint64_t packets = 0;
  uint64_t invalid_packets = 0;   // parsePacket() refused them
  uint64_t dropped_packets = 0;   // lost before reaching us (addDroppedPackets)
  uint64_t ignored_segments = 0;  // of no known connection and unable to open one
  uint64_t delivered_bytes = 0;
  uint64_t gap_bytes = 0;
  uint64_t gaps = 0;
  uint64_t duplicate_bytes = 0;  // seen again (retransmissions, double copies), of closed connections
  uint64_t connections_opened = 0;
  uint64_t connections_closed = 0;
  uint64_t evictions = 0;
  uint64_t idle_closes = 0;
};

// Call order: onPacket()/onSegment()/advanceTime() in any order, with
// non-decreasing timestamps as far as the caller can tell (a timestamp
// going back only delays timeouts); closeAll() at shutdown.
//
// A connection opens on a SYN (its source is the client), a SYN-ACK (its
// destination is the client; the client's stream starts at the ack), or a
// segment with payload (mid-stream: the side on a server port is the
// server; when neither or both are, the destination). Segments without
// payload of unknown connections (late ACKs and FINs of one already
// closed) and RSTs open nothing.
class ConnectionTable {
 public:
  ConnectionTable(ConnectionTableOptions options, ConnectionEvents& events);
  ~ConnectionTable();
  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  // Parses and feeds a packet; an invalid one is counted and its status
  // returned (for a rate-limited log), the table is unchanged.
  absl::Status onPacket(std::string_view packet, LinkType link, Timestamp now);
  void onSegment(const TcpSegment& segment, Timestamp now);
  // Hole timeouts and idle connections.
  void advanceTime(Timestamp now);
  // Closes every connection (kShutdown), reporting what is still missing.
  void closeAll();
  // The mirrored ports changed: later mid-stream joins use `ports`, and the
  // connections whose server port left the set are closed (kShutdown).
  void setServerPorts(std::set<uint16_t> ports);

  // Every connection, least recently active first, and the id the next one
  // will get: what restore() takes to rebuild this table elsewhere (a new
  // agent process taking over, agent/mirror/mirror_engine.h).
  std::vector<ConnectionSnapshot> snapshot() const;
  uint64_t nextId() const { return next_id_; }
  // Adds the connections of another table's snapshot(), with their ids, in
  // the same activity order, as last active at `now`; later connections get
  // ids from max(next_id, the highest restored id + 1). Emits no onOpened:
  // the consumer knows these connections already. Not counted as opened.
  // Precondition (aborts otherwise): no restored connection's endpoints are
  // in the table already.
  void restore(const std::vector<ConnectionSnapshot>& connections, uint64_t next_id, Timestamp now);

  // Packets the transport lost before they reached us (ring buffer full):
  // counted here so one place holds the mirror's counters.
  void addDroppedPackets(uint64_t count) { counters_.dropped_packets += count; }

  const MirrorCounters& counters() const { return counters_; }
  size_t size() const { return connections_.size(); }
  // Out-of-order payload bytes held by all connections (walks the table).
  size_t bufferedBytes() const;
  // The memory they hold, as counted against max_buffered_total (kept as
  // they change).
  size_t heldMemory() const { return held_total_; }

 private:
  struct Connection;
  class DirectionSink;
  using Key = std::pair<Endpoint, Endpoint>;  // client, server

  Connection* open(const TcpSegment& segment, Timestamp now);
  void close(Connection& connection, CloseReason reason);
  // Keeps held_total_ right after `connection` changed from holding
  // `before` (heldMemory()), and sheds holes past max_buffered_total.
  void accountBuffered(Connection& connection, size_t before);
  static size_t held(const Connection& connection);
  void touch(Connection& connection, Timestamp now);

  ConnectionTableOptions options_;
  ConnectionEvents& events_;
  uint64_t next_id_ = 1;
  std::map<Key, std::unique_ptr<Connection>> connections_;
  std::list<Connection*> by_activity_;  // least recently active first
  size_t held_total_ = 0;
  MirrorCounters counters_;
};

}  // namespace siphon::agent::mirror
