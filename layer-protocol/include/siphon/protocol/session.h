// The reliable, multiplexed session: no I/O, bytes and calls in, frames and
// handler callbacks out (the Boost.Redis style). One object per side of a
// session; it outlives transports, so a cut connection is resumed with
// nothing lost and nothing duplicated.
//
// Layers inside:
//  - reliability: sequenced frames (see frame.proto) are numbered implicitly
//    from 1 per direction, kept in a bounded replay buffer until the peer's
//    cumulative Ack covers them, and replayed on resume from the peer's
//    last-received count;
//  - multiplexing: request ids, stream ids (client odd, agent even) and
//    credit-based flow control per stream, so a stream without credit stops
//    only itself; credit returns in quarter-window steps, and the window of
//    a stream whose reader keeps up grows (SessionLimits::max_stream_window);
//  - keepalive: Ping at an interval, the peer declared lost after a timeout.
//  - acks: cumulative, and never sent for their own sake while something
//    else is going out (one rides with every batch of other frames). Alone,
//    an ack goes kAckDelay after the first frame it covers, or at once when
//    a quarter of the replay buffer is unacked: a one-way flow still frees
//    the sender's buffer, and a busy one costs the sender no extra wake-up
//    per read.
//
// Call-order rules:
//  - After a transport is up and the handshake is done: onBytes()/onRead()
//    with everything the transport receives, takeWrites() whenever
//    hasWrites() and the transport can write, onTick() periodically.
//  - When the transport dies: onTransportLost(). Application calls keep
//    working (frames queue in the replay buffer, within its bound).
//  - On a new transport: resume(peer_last_received) with the count from the
//    peer's Hello/Welcome, then as above. The local count to send the peer
//    is receivedCount().
//  - Handler callbacks run inside onBytes()/onRead()/onTick(); a handler may
//    call the application methods but never onBytes()/onRead() itself.
//  - A non-OK status from onBytes()/onRead()/onTick() ends the transport: send
//    goawayFrame(status) if the transport still works, then close it. Protocol
//    errors (PROTOCOL_ERROR, FRAME_TOO_LARGE, FLOW_CONTROL_ERROR) also end the
//    session; a silent peer (UNAVAILABLE from onTick) only the transport.
//
// Limits (SessionLimits; docs/SECURITY.md#limits), each hit reported to the
// limit observer and, where the peer caused it, to the peer with a typed
// code whose message names the limit, its value and the agent flag:
//  - streams: one more open is refused (TOO_MANY_STREAMS: a StreamReset to
//    the peer, a status to a local caller); the session goes on;
//  - pending requests: one more is answered TOO_MANY_PENDING_REQUESTS (or
//    refused to a local caller); the session goes on;
//  - frame size: FRAME_TOO_LARGE from onBytes()/onRead(), which ends the
//    session (a protocol error);
//  - buffered bytes (replay_buffer_bytes, "B"): stream data stops at B (no
//    credit: backpressure). Answers may take the buffer up to 2B: a caller
//    reserves room for a large one first (reserveResponse: the read is
//    shortened, or refused with SESSION_BUFFER_FULL), and a large answer
//    with no room is replaced by a SESSION_BUFFER_FULL error. On the agent
//    side a peer whose frames take the buffer above 2B anyway (it sends
//    requests and reads nothing) gets SESSION_BUFFER_FULL from onBytes(),
//    which ends the session. Control frames (acks, pings, pongs, goaways)
//    count in the buffered bytes too, and cannot pile up: a later ack, ping
//    or pong replaces (or stands for) the one still waiting to go, so a peer
//    that pings or sends window updates without reading holds at most one
//    of each.
//  - keepalive: at most one Ping per keepalive_interval, and none while the
//    last one has not gone out yet; the negotiated interval is at least
//    kMinKeepaliveInterval (clampLimits), so the ticker never spins.
//
// Attachments (resume races): each resume() starts attachment n+1; the
// transport meant for attachment n calls attach(n) before it runs, and is
// refused when a later resume() came in between (two resumes of one session
// racing in the agent's handshake). The later resume wins; the earlier
// transport is closed before it writes or reads a frame, and the winner's
// replay starts at the first frame its peer lacks.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/protocol/codec.h"
#include "siphon/protocol/limits.h"
#include "siphon/protocol/piped_bytes.h"
#include "siphon/v1/frame.pb.h"
#include "siphon/v1/handover.pb.h"

namespace siphon::protocol {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

enum class Role { kClient, kAgent };

// File read answers at least this large carry their bytes as a separate
// buffer (codec.h, encodeFileDataResponseHead).
inline constexpr size_t kDetachedDataMin = 16 * 1024;

// Answers up to this size need no room in the session buffer: errors and
// small answers always go (the 2B cut-off above bounds what they add up to).
inline constexpr size_t kSmallResponse = 4096;

// How long a lone ack may wait for other frames to ride with.
inline constexpr std::chrono::milliseconds kAckDelay{10};
// A stream whose reader consumed a quarter of its window within this time
// of the previous WindowUpdate, or within two round trips of the path
// (Session::setPathRtt) when that is longer, gets its window doubled
// (within the limits): a sender that its window holds back sends a window
// per round trip, so over a long path a quarter of a window that is still
// below the bandwidth-delay product arrives in less than two round trips.
inline constexpr std::chrono::milliseconds kWindowGrowPeriod{10};

// One encoded frame: `head` holds the whole frame, or for data frames and
// large file read answers the hand-written header with the bytes in
// `payload` (two buffers on the wire), or for a file read the agent
// spliced, in `piped` (piped_bytes.h: the transport sends them).
struct OutFrame {
  std::string head;
  std::string payload;
  std::shared_ptr<PipedBytes> piped;
  bool sequenced = false;
  uint64_t stream_id = 0;  // a StreamData frame's stream (its unsent bytes count there)
  size_t size() const { return head.size() + payload.size() + (piped ? piped->size() : 0); }
};

// Frames to write, in order. Keep the batch alive until the write completes.
struct WriteBatch {
  std::vector<std::shared_ptr<const OutFrame>> frames;
  size_t bytes = 0;
  bool empty() const { return frames.empty(); }
  // Views of every buffer, in wire order (two per data frame). A piped
  // frame's bytes are there only once materialized (PipedBytes): a
  // transport that splices sends them itself.
  std::vector<std::string_view> buffers() const;
};

// Callbacks for what the peer sent. Defaults ignore the event.
class SessionHandler {
 public:
  virtual ~SessionHandler() = default;
  // Answer each with sendResponse(). Past max_pending_requests unanswered
  // requests the session answers TOO_MANY_PENDING_REQUESTS itself, without a call.
  virtual void onRequest(v1::Request /*request*/) {}
  virtual void onResponse(v1::Response /*response*/) {}
  // An answer to a request marked with expectPiped() whose data came into
  // a pipe: FileData.data holds the first bytes, `piped` the rest. The
  // default reads the pipe and calls onResponse() above.
  virtual void onResponse(v1::Response response, std::shared_ptr<PipedBytes> piped);
  // The peer opened a stream: answer with acceptStream() or resetStream().
  virtual void onStreamOpen(v1::StreamOpen /*open*/) {}
  virtual void onStreamAccept(v1::StreamAccept /*accept*/) {}
  // `payload` is valid during the call only. Call consumed() once the bytes
  // are delivered (written to a socket, say): that returns credit to the peer.
  virtual void onStreamData(uint64_t /*stream_id*/, std::string_view /*payload*/) {}
  virtual void onStreamDatagram(v1::StreamDatagram /*datagram*/) {}
  virtual void onStreamHalfClose(uint64_t /*stream_id*/) {}
  virtual void onStreamReset(uint64_t /*stream_id*/, v1::Error /*error*/) {}
  virtual void onStreamGap(v1::StreamGap /*gap*/) {}
  // A stream that had no send credit (sendCredit() returned 0) has some now.
  virtual void onStreamWritable(uint64_t /*stream_id*/) {}
  virtual void onDraining(v1::Draining /*draining*/) {}
  virtual void onNotice(v1::SubscriptionNotice /*notice*/) {}
  virtual void onFileEvents(v1::FileEvents /*events*/) {}
  virtual void onTargetRestarted(v1::TargetRestarted /*restarted*/) {}
  virtual void onGoaway(v1::Goaway /*goaway*/) {}
};

class Session {
 public:
  Session(Role role, SessionLimits limits, TimePoint now = Clock::now());

  Role role() const { return role_; }
  const SessionLimits& limits() const { return limits_; }

  // Called with the typed status of every limit hit (see the top), from
  // whichever call hit it; for the owner's log line. Optional.
  using LimitObserver = std::function<void(const absl::Status&)>;
  void setLimitObserver(LimitObserver observer) { limit_observer_ = std::move(observer); }

  // ---- transport side ----

  // Decodes `bytes` and dispatches every complete frame to `handler`.
  absl::Status onBytes(std::string_view bytes, SessionHandler& handler, TimePoint now);
  // Zero-copy form: read into readBuffer(), then onRead(n).
  std::span<char> readBuffer(size_t min = 64 * 1024) { return decoder_.prepare(min); }
  absl::Status onRead(size_t n, SessionHandler& handler, TimePoint now);
  // Piped receive (client side, codec.h): the answer being received is to
  // a request marked expectPiped() and pipeWanted() of its bytes are still
  // to come. The transport splices them into a pipe and hands it to
  // onPiped(), or reads them as usual (readBuffer() takes them in memory).
  size_t pipeWanted() const { return decoder_.pipeWanted(); }
  absl::Status onPiped(std::shared_ptr<PipedBytes> piped, SessionHandler& handler, TimePoint now);
  // Bytes of the answer being piped arrived: the peer is not silent
  // (keepalive), though no frame is complete yet.
  void onPipedProgress(TimePoint now) { last_received_ = now; }

  bool hasWrites() const;
  // Frames to write now, up to about `max_bytes` (at least one frame).
  WriteBatch takeWrites(size_t max_bytes = 1 << 20);

  // Keepalive and delayed acks. Sends a Ping or a lone Ack when due;
  // UNAVAILABLE when the peer has been silent past the timeout. Only while a
  // transport is attached.
  absl::Status onTick(TimePoint now);
  // When the next onTick() has work to do.
  TimePoint nextTick() const;

  // The transport is gone. Unsent control frames are dropped, the partial
  // frame being received is discarded (the peer replays it).
  void onTransportLost();
  bool attached() const { return attached_; }

  // A new transport is attached and the peer has received
  // `peer_last_received` of our sequenced frames. RESUME_FAILED when that
  // count is outside what we can replay.
  absl::Status resume(uint64_t peer_last_received, TimePoint now);
  // The latest resume(): 0 before any, then 1, 2, ... (see the top).
  uint64_t attachment() const { return attachment_; }
  // The transport of attachment `n` is about to run: OK when `n` is still
  // the latest, and the replay restarts at the first frame the peer lacks
  // (whatever an earlier transport took meanwhile); FAILED_PRECONDITION when
  // a later resume() superseded it (close that transport without a frame;
  // the session is untouched) or the session is not attached.
  absl::Status attach(uint64_t n);

  // Sequenced frames received from the peer (what the peer replays after).
  uint64_t receivedCount() const { return received_; }
  uint64_t sentCount() const { return sent_; }
  // Bytes of sequenced frames the peer has not acked yet.
  uint64_t unackedBytes() const { return replay_bytes_; }
  // What this session holds for the peer: unacked frames (sent or not),
  // control frames not yet taken, and room reserved for answers being
  // prepared.
  uint64_t bufferedBytes() const { return replay_bytes_ + control_bytes_ + reserved_total_; }
  // Control frames (acks, pings, pongs, goaways) not yet taken, and their bytes.
  size_t queuedControlFrames() const { return control_.size(); }
  uint64_t queuedControlBytes() const { return control_bytes_; }
  // Pings queued since the session began.
  uint64_t pingsSent() const { return ping_nonce_; }

  // ---- application side ----

  // Assigns and returns the request id. TOO_MANY_PENDING_REQUESTS past the pending
  // request limit.
  absl::StatusOr<uint64_t> sendRequest(v1::Request request);
  // A response larger than kSmallResponse that fits neither the room
  // reserved for it nor the buffer (up to 2 x replay_buffer_bytes) is
  // replaced by a SESSION_BUFFER_FULL error.
  void sendResponse(v1::Response response);
  // A file read's answer whose bytes are in `data` (piped_bytes.h), sent
  // after the answer's head as FileData.data; `response` holds that
  // FileData without data. The same room rules as above.
  void sendResponse(v1::Response response, std::shared_ptr<PipedBytes> data);
  // Room for up to `wanted` bytes of the answer to incoming request
  // `request_id` (a file read), held until sendResponse() for it: the
  // lesser of `wanted` and what the buffer has left below 2 x
  // replay_buffer_bytes; SESSION_BUFFER_FULL when nothing is left. A
  // request already answered (or unknown) reserves nothing: `wanted`.
  absl::StatusOr<size_t> reserveResponse(uint64_t request_id, size_t wanted);
  size_t pendingRequests() const { return pending_requests_.size(); }
  // The peer's requests not answered yet.
  size_t unansweredRequests() const { return incoming_requests_.size(); }
  // Requests still waiting for a response (to fail them when the session dies).
  std::vector<uint64_t> pendingRequestIds() const;
  // The answer to request `request_id` (a file read) may come with its
  // bytes in a pipe (SessionHandler::onResponse with `piped`), when the
  // transport can splice; forgetPiped() when its caller gave up.
  void expectPiped(uint64_t request_id) { decoder_.expectPiped(request_id); }
  void forgetPiped(uint64_t request_id) { decoder_.forgetPiped(request_id); }

  // Early stream data (protocol 1.2, docs/PROTOCOL.md): the opener of a
  // stream may send Data and HalfClose on it before the StreamAccept, up to
  // the session's initial_stream_window, which the accepter grants from the
  // stream's first byte (its StreamAccept then adds only what its window
  // has beyond that). Set once the handshake agreed on 1.2: `send` on the
  // side that opens the streams it answers without waiting (the agent, for
  // stolen connections and requests), `receive` on the side that takes
  // them (the client). A peer that sends early without it is refused as
  // before (FLOW_CONTROL_ERROR).
  void allowEarlyData(bool send, bool receive) {
    early_send_ = send;
    early_receive_ = receive;
  }
  bool sendsEarly() const { return early_send_; }

  // The round-trip time of the transport's path (its TCP smoothed RTT): it
  // sets how soon a reader must take a quarter of its window for the
  // window to grow (kWindowGrowPeriod). Zero until the transport says.
  void setPathRtt(std::chrono::microseconds rtt) { path_rtt_ = rtt; }
  std::chrono::microseconds pathRtt() const { return path_rtt_; }

  // Opens a stream; assigns and returns its id and sets the credit the peer
  // gets. TOO_MANY_STREAMS past the stream limit. With early data (above),
  // the stream takes sendData() at once.
  absl::StatusOr<uint64_t> openStream(v1::StreamOpen open);
  // Accepts a stream the peer opened. STREAM_CLOSED for an unknown stream.
  absl::Status acceptStream(v1::StreamAccept accept);
  // Bytes sendData() takes now on this stream: the least of its credit, the
  // free replay buffer and the room left under kMaxUnsentPerStream. 0 means
  // wait for onStreamWritable(); so does less than `wanted` (a datagram or
  // record that must go in one frame).
  size_t sendCredit(uint64_t stream_id, size_t wanted = 1);
  // Payload bytes of one stream queued here and not yet taken by the
  // transport (takeWrites). A bulk stream's bytes wait in its socket beyond
  // this, not in front of other streams' frames: a small answer queued now
  // waits behind at most this much of each busy stream, instead of the
  // stream's whole window (4 MiB, 160 ms at 200 Mbit/s).
  static constexpr uint64_t kMaxUnsentPerStream = 256 * 1024;
  // For a stream whose sender has no socket to leave its bytes in and drops
  // what it cannot queue (a capture: its only buffer is its credit), the
  // bound is its credit instead: no bound here. Its frames still never hold
  // other streams' small frames back (queueStreamFrame).
  void unboundUnsent(uint64_t stream_id);
  // After takeWrites(): tells streams that waited for their unsent bytes
  // to go (down to half of kMaxUnsentPerStream) that they may send again.
  // The transport calls it with its handler.
  void pollWritable(SessionHandler& handler);
  // Sends payload (at most sendCredit() bytes), cut into frames as needed.
  // FLOW_CONTROL_ERROR beyond sendCredit() (or before the peer accepted the
  // stream), STREAM_CLOSED on a closed stream.
  absl::Status sendData(uint64_t stream_id, std::string payload);
  absl::Status sendDatagram(v1::StreamDatagram datagram);
  absl::Status halfClose(uint64_t stream_id);
  // Ends the stream both ways (no-op for an unknown stream).
  void resetStream(uint64_t stream_id, v1::Error error);
  // Bytes of the stream that will never come (mirrors, captures), in order
  // with its data. STREAM_CLOSED on a closed stream or after halfClose():
  // the half-close is the end of the stream's bytes, gaps included.
  absl::Status sendGap(v1::StreamGap gap);
  // `n` bytes of the stream's received data were delivered: grants credit.
  void consumed(uint64_t stream_id, size_t n);
  bool streamOpen(uint64_t stream_id) const { return streams_.contains(stream_id); }
  size_t streamCount() const { return streams_.size(); }
  std::vector<uint64_t> streamIds() const;

  void sendDraining(v1::Draining draining);
  // About one of the peer's subscriptions (agent side).
  void sendNotice(v1::SubscriptionNotice notice);
  // What the peer's file watches saw (agent side).
  void sendFileEvents(v1::FileEvents events);
  // The target restarted (agent side; only to a peer of minor version 1+).
  void sendTargetRestarted(v1::TargetRestarted restarted);
  // Control frames, never sequenced.
  void sendGoaway(v1::ErrorCode code, std::string_view message);

  // ---- handover (docs/CONTINUITY.md, "Handover") ----

  // Everything a new agent process needs to go on with this session where
  // it is: counters, the frames the peer has not acked (a piped file read's
  // bytes read out of their pipe), streams with their credit and windows,
  // the requests it waits on, the limits. Only a detached session whose
  // peer's requests are all answered and that holds no answer room can be
  // exported (FAILED_PRECONDITION otherwise: the reason names what is
  // left). The session itself is not changed, so the old agent goes on
  // with it if the handover fails.
  absl::Status exportState(v1::SessionState* out);
  // The limits an exported session was made with: construct the session
  // with them, then restoreState().
  static SessionLimits limitsOf(const v1::SessionState& state);
  // The other way: `limits` into an exported state (a new agent's import
  // clamps them as a Hello's).
  static void setLimitsOf(const SessionLimits& limits, v1::SessionState* state);
  // Takes the state exportState() gave (on a session just constructed with
  // limitsOf() and the same role). The session is detached: resume() it on
  // the client's next transport. INVALID_ARGUMENT for a state that does not
  // hold together (counters against frames, stream ids against roles).
  absl::Status restoreState(const v1::SessionState& state, TimePoint now);

 private:
  struct Stream {
    bool accepted = false;       // both sides have granted credit
    bool early = false;          // ours, sending before the accept (allowEarlyData)
    uint64_t unsent = 0;         // payload bytes queued, not yet taken by the transport
    uint64_t send_credit = 0;    // bytes we may still send
    uint64_t recv_credit = 0;    // bytes the peer may still send
    uint64_t unreported = 0;     // consumed, not yet returned as credit
    uint32_t recv_window = 0;    // our window: granted at start, plus growth
    uint32_t grown = 0;          // growth above the initial window
    TimePoint last_update;       // when credit last went back (or the stream began)
    bool local_closed = false;   // we half-closed
    bool remote_closed = false;  // the peer half-closed
    bool wants_write = false;    // saw zero credit: notify when it grows
    uint64_t unsent_bound = kMaxUnsentPerStream;  // unboundUnsent(): no bound
  };

  absl::Status processDecoded(SessionHandler& handler, TimePoint now);
  absl::Status dispatch(DecodedFrame& frame, SessionHandler& handler, TimePoint now);
  absl::Status onData(uint64_t stream_id, std::string_view payload, SessionHandler& handler);
  void onAck(uint64_t received, SessionHandler& handler);
  void notifyWritable(SessionHandler& handler);
  void queueSequenced(std::shared_ptr<OutFrame> frame);
  void queueSequenced(const v1::Frame& frame);
  // Queues a StreamData or datagram frame (its stream_id set). When its
  // stream has nothing else waiting, it goes ahead of the data frames of
  // other streams queued behind the last frame any transport took: a small
  // answer does not wait behind bulk bytes already queued here. Only data
  // of other streams is passed (streams are independent, so their relative
  // order means nothing); opens, closes, answers and the stream's own
  // frames keep their order.
  void queueStreamFrame(std::shared_ptr<OutFrame> frame);
  void queueControl(const v1::Frame& frame);
  // Queues `frame`, or when `slot` holds a frame still waiting in control_,
  // re-encodes that one in its place (a later ack or pong says all an earlier
  // one did). `slot` then names the queued frame.
  void queueReplacing(std::shared_ptr<OutFrame>& slot, const v1::Frame& frame);
  void queueAck();
  void maybeClose(uint64_t stream_id);
  // Removes a stream (its window growth returns to the budget).
  void forget(std::unordered_map<uint64_t, Stream>::iterator it);
  bool forget(uint64_t stream_id);
  bool isLocalStream(uint64_t stream_id) const;
  bool early_send_ = false;
  bool early_receive_ = false;
  bool unsent_drained_ = false;  // takeWrites() made room for a waiting stream
  // The frames from write_next_ on are all unsent again (a new transport):
  // each stream's unsent count from them.
  void recountUnsent();
  uint64_t unsentRoom(const Stream& s) const {
    return s.unsent < s.unsent_bound ? s.unsent_bound - s.unsent : 0;
  }
  // A frame naming a stream we do not hold: OK (dropped) for one that was
  // open and is gone (its frames may still be in flight), PROTOCOL_ERROR
  // for an id never opened by either side.
  absl::Status unknownStream(uint64_t stream_id, std::string_view frame) const;
  uint64_t replayFree() const;
  // What answers may take the buffer up to (2 x replay_buffer_bytes).
  uint64_t answerCap() const { return 2 * limits_.replay_buffer_bytes; }
  // "twice the session buffer limit of N bytes (siphon-agent ... raises it)".
  std::string bufferLimitText() const;
  // Reports a limit hit to the observer; returns `status`.
  absl::Status limitHit(absl::Status status);
  // sendResponse()'s first steps: the request is answered, its reserved
  // room freed; false (and `response` replaced by a SESSION_BUFFER_FULL
  // error) when an answer of `size` bytes does not fit.
  bool admitResponse(v1::Response& response, size_t size);

  Role role_;
  SessionLimits limits_;
  FrameDecoder decoder_;
  bool attached_ = true;

  // Reliability. replay_ holds sequenced frames not yet acked; replay_[i]
  // has seq acked_ + 1 + i. write_next_ is the index in replay_ of the next
  // sequenced frame to hand to the transport.
  std::deque<std::shared_ptr<OutFrame>> replay_;
  uint64_t replay_bytes_ = 0;
  uint64_t acked_ = 0;  // seqs the peer confirmed
  uint64_t sent_ = 0;   // seqs assigned
  size_t write_next_ = 0;
  // Seqs ever taken by a transport (takeWrites): a frame from here on was
  // never on any wire, so its place may still change (queueStreamFrame).
  uint64_t taken_ = 0;
  std::chrono::microseconds path_rtt_{0};
  std::deque<std::shared_ptr<OutFrame>> control_;
  // The pong in control_, not yet taken: a later ping updates it.
  std::shared_ptr<OutFrame> queued_pong_;
  // The same for the ack and the ping.
  std::shared_ptr<OutFrame> queued_ack_;
  std::shared_ptr<OutFrame> queued_ping_;
  uint64_t control_bytes_ = 0;  // bytes of control_
  uint64_t attachment_ = 0;     // resume() count (attach())
  uint64_t received_ = 0;
  uint64_t ack_sent_ = 0;
  uint64_t unacked_in_bytes_ = 0;         // wire bytes received_ - ack_sent_ took
  TimePoint ack_due_ = TimePoint::max();  // when a lone ack goes
  TimePoint now_;                         // the latest time we were given

  // Keepalive.
  TimePoint last_received_;
  TimePoint last_ping_;
  uint64_t ping_nonce_ = 0;

  // Multiplexing.
  uint64_t next_request_id_ = 1;
  std::unordered_set<uint64_t> pending_requests_;   // sent, awaiting a response
  std::unordered_set<uint64_t> incoming_requests_;  // received, not yet answered
  uint64_t next_stream_id_;
  uint64_t highest_peer_stream_ = 0;  // the highest id the peer opened
  std::unordered_map<uint64_t, Stream> streams_;
  uint64_t window_growth_ = 0;  // sum of the open streams' `grown`
  bool any_wants_write_ = false;
  bool recheck_writable_ = false;  // resume() freed replay space

  // Limits.
  std::unordered_map<uint64_t, uint64_t> reserved_;  // request id -> bytes
  uint64_t reserved_total_ = 0;
  LimitObserver limit_observer_;
};

}  // namespace siphon::protocol
