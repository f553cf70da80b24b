// SocketPump: one socket inside the target joined to one stream of a
// session, with flow control both ways.
//
//  socket -> stream: the pump reads only as much as the stream's send
//    credit (Session::sendCredit) allows. At 0 it stops reading until
//    onWritable(): the socket's receive buffer fills and the kernel's own
//    flow control (TCP window) slows the remote peer, for this socket only.
//    EOF becomes HalfClose; a read error becomes Reset.
//  stream -> socket: onData() writes to the socket and calls
//    Session::consumed() only for bytes the socket took, so the peer's
//    credit, not the pump, bounds what waits in the pump's queue (at most the
//    window the agent granted). The peer's HalfClose becomes
//    shutdown(SHUT_WR) once the queue is written.
//
// Framing (Kind):
//  - kStream (TCP, unix stream): bytes; frame boundaries mean nothing.
//  - kMessage (connected UDP, unix seqpacket): one Data frame is one datagram
//    or record, both ways. A datagram waits until the credit covers all of
//    it; one larger than a frame or 3/4 of the peer's window (credit comes
//    back in quarter-window steps, so more may never be available) cannot be
//    sent: UDP drops it (UDP may lose datagrams anyway), seqpacket resets
//    the stream with RESOURCE_EXHAUSTED.
//  - kDatagram (unconnected UDP): StreamDatagram frames carry the peer's
//    address each way; same size rules as kMessage.
//
// A stream ends when both directions are closed (kStream, seqpacket), on a
// Reset either way, or when the session ends (close()). UDP has no EOF: a UDP
// stream lasts until a Reset or the session's end.
//
// Call order: construct, attach() the socket (it may come later: until
// then close()/onReset() only mark the pump dead), start() once the stream is
// accepted. Every method runs on the event loop that owns the socket.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "agent/common/unique_fd.h"
#include "agent/outgoing/address.h"
#include "agent/services/service.h"
#include "agent/services/session_host.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::streams {

using outgoing::SockAddr;

class SocketPump : public StreamEndpoint, public std::enable_shared_from_this<SocketPump> {
 public:
  enum class Kind { kStream, kMessage, kDatagram };

  struct Options {
    Kind kind = Kind::kStream;
    bool udp = false;  // kMessage/kDatagram over UDP (drop, never reset, on size)
    bool tcp = false;  // a Reset from the peer closes with RST (SO_LINGER 0)
    // The window the peer granted in Open (0: the session's default).
    uint32_t peer_window = 0;
    // Names the socket in error messages ("127.0.0.1:7000").
    std::string label;
    // Reads per readiness, each up to kReadChunk (kStream): bounds the time
    // one busy socket holds the loop.
    int max_reads_per_wake = 16;
  };
  static constexpr size_t kReadChunk = 64 * 1024;

  // `host`: the session the stream lives on (weak: the pump never keeps an
  // ended session alive).
  SocketPump(net::asio::any_io_executor ex, uint64_t stream_id, std::weak_ptr<SessionHost> host,
             Options options);
  ~SocketPump() override;

  uint64_t streamId() const { return id_; }
  // The pump was closed or reset (its socket is gone or never came).
  bool dead() const { return dead_; }

  // Takes the socket (made non-blocking here). When the pump is already dead
  // the socket is closed at once and CANCELLED returned. Attaching again
  // closes the previous socket (a connect moving on to the next address).
  absl::Status attach(UniqueFd fd);
  int fd() { return sock_.is_open() ? sock_.native_handle() : -1; }

  // Waits until the socket is writable or `deadline` (an in-progress
  // connect); OK when it is, CANCELLED when the pump died meanwhile (a Reset
  // or the session's end closes the socket), DEADLINE_EXCEEDED at the
  // deadline. The caller keeps the pump alive until it returns.
  net::awaitable<absl::Status> waitWritable(std::chrono::steady_clock::time_point deadline);

  // Starts moving data. The stream must be accepted.
  void start();

  // Resets the stream with `error` (sent to the peer, if the session is
  // still there), stops routing its frames here and closes the socket.
  // Also before the stream is accepted (a failed connect).
  void reset(v1::Error error);

  // StreamEndpoint
  void onData(std::string_view payload) override;
  void onDatagram(v1::StreamDatagram datagram) override;
  void onHalfClose() override;
  void onReset(const v1::Error& error) override;
  void onWritable() override;
  // A stream the agent opened (a stolen connection) starts once accepted.
  void onAccept(const v1::StreamAccept& accept) override;
  void close() override;

  // Handover (docs/CONTINUITY.md, "Handover").
  void freeze() override;
  void thaw() override;
  absl::Status exportState(v1::PumpExport* out, std::vector<UniqueFd>* fds) override;
  // The pump exportState() described, on a new agent: `fd` is its socket.
  // Frozen until thaw(), which goes on where the old agent stopped
  // (reading when started, writing what waits, a half-close still due).
  static absl::StatusOr<std::shared_ptr<SocketPump>> restore(net::asio::any_io_executor ex,
                                                             std::weak_ptr<SessionHost> host,
                                                             const v1::PumpExport& state,
                                                             UniqueFd fd);

  // Counters, for tests and logs.
  uint64_t bytesIn() const { return bytes_in_; }    // socket -> stream
  uint64_t bytesOut() const { return bytes_out_; }  // stream -> socket
  uint64_t dropped() const { return dropped_; }     // UDP datagrams too large

 private:
  struct Out {
    std::string data;
    size_t offset = 0;
    std::optional<SockAddr> to;  // kDatagram
  };

  void readMore();
  bool readFailed(int err);
  void arm(net::asio::posix::descriptor_base::wait_type what, bool SocketPump::*armed,
           void (SocketPump::*then)());
  void armRead();
  // One read: true when it made progress and another may follow; false
  // when it stopped (a wait armed, no credit, EOF or failure).
  bool readBytes(protocol::Session& s, bool* queued);
  // One whole datagram or record (kMessage/kDatagram); the same answer.
  bool readMessage(protocol::Session& s, bool* queued);
  void flushWrites();
  void armWrite();
  void maybeFinish();
  void closeSocket(bool abortive);
  size_t maxMessage(protocol::Session& s) const;

  net::asio::posix::stream_descriptor sock_;
  uint64_t id_;
  HostRef host_;
  Options opt_;

  bool started_ = false;
  bool dead_ = false;
  bool frozen_ = false;  // a handover: no reads, no writes
  // socket -> stream
  bool read_armed_ = false;
  bool wants_credit_ = false;
  bool read_done_ = false;  // EOF seen, HalfClose sent
  // stream -> socket
  std::deque<Out> out_;
  bool write_armed_ = false;
  bool peer_closed_ = false;  // HalfClose received
  bool write_done_ = false;   // shutdown(SHUT_WR) done

  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace siphon::agent::streams
