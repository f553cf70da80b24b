// CaptureStream: one capture, the agent side of a stream the client opened
// with StreamOpen{capture}. Its bytes are a pcap file: the first Data frame
// is the global header, each later one exactly one record.
//
// Reading: the PacketSource's descriptor is waited on from the event loop
// (an Asio descriptor on a dup of it); each readiness reads up to
// reads_per_turn x packets_per_read packets without blocking, then yields
// to the loop (a post when more may wait, a new wait otherwise). The only
// buffers are the kernel's ring and the stream's credit, so memory stays
// bounded whatever the traffic or the client does.
//
// Never blocking on a slow client: a packet whose record does not fit in the
// send credit now is dropped and counted (GapLedger). The count goes out as
// a StreamGap{bytes, packets} before the next record, or once the credit
// would take one of the dropped records again (onWritable), or at the end:
// never silently, and never a frame per drop to a client that reads
// nothing. Packets the kernel dropped (pcap_stats, checked every
// stats_interval) become a StreamGap{packets} the same way.
//
// Ends:
//  - the client's HalfClose: reading goes on for finish_delay (the ring's
//    last block arrives after its timeout), then what is left in the ring
//    is read (a bounded number of turns), the pending gaps sent, HalfClose
//    back; the stream is over;
//  - the client's Reset, or the session's end (close()): the capture stops,
//    nothing is sent;
//  - a read error (the interface went away): Reset UNAVAILABLE with libpcap's
//    words.
// Every end closes the source (the packet socket and its ring) at once.
//
// Handover (docs/CONTINUITY.md section 8): freeze() reads what the kernel's
// ring holds, whole blocks (so no block is left half read), counts the
// kernel's drops, and then reads nothing until thaw(); exportState() gives
// a copy of the packet socket (its ring and its filter go with it) and
// where the pcap stream stands. On the new agent: construct, restoreFrom(),
// adopt() the source reading the same ring (adopted_ring.h), resume() once
// it serves: the next record is the packet after the last one sent.
//
// Call order: construct; the service registers it with the session, then
// calls start(source) once it accepted the stream, or reset(error) when
// the source could not be opened. close(), onReset() and onHalfClose() may
// come at any time, before start() too; a start() after the end closes the
// source at once. Everything runs on the event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/capture/gap_ledger.h"
#include "agent/capture/packet_source.h"
#include "agent/services/service.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/v1/handover.pb.h"

namespace siphon::agent::capture {

class CaptureStream : public StreamEndpoint,
                      private PacketSink,
                      public std::enable_shared_from_this<CaptureStream> {
 public:
  struct Options {
    // Packets per PacketSource::read and reads per readiness: bound the
    // time one busy capture holds the event loop.
    int packets_per_read = 64;
    int reads_per_turn = 16;
    // How often the kernel's drop counter is read while packets flow.
    std::chrono::milliseconds stats_interval{250};
    // After the client's HalfClose, how long to read on before the end:
    // the kernel hands over a partly filled ring block only after the block
    // timeout (CaptureSpec::block_timeout_ms). 0: end at once.
    std::chrono::milliseconds finish_delay{50};
    // For the logs.
    std::string session_id;
    std::string interface;
    std::string filter;
    // Called once when the capture ends, however it ends.
    std::function<void()> on_end;
  };

  struct Stats {
    uint64_t packets = 0;  // records sent
    uint64_t bytes = 0;    // record bytes sent (headers included)
    GapLedger::Totals dropped;
  };

  CaptureStream(net::asio::any_io_executor ex, uint64_t stream_id, std::weak_ptr<SessionHost> host,
                Options options);
  ~CaptureStream() override;

  // The stream is accepted and `source` open: send the header, capture.
  void start(std::unique_ptr<PacketSource> source);
  // Ends the stream with a Reset carrying `error` (the open failed).
  void reset(v1::Error error);
  bool dead() const { return dead_; }
  uint64_t streamId() const { return id_; }
  Stats stats() const { return {packets_, bytes_, ledger_.totals()}; }

  // Handover (see above). "" when it can move; else why not (yet).
  std::string handoverBlocker() const;
  void restoreFrom(const v1::CaptureStreamExport& in);
  // The source of an adopted capture (started, frozen until resume()).
  absl::Status adopt(std::unique_ptr<PacketSource> source);
  void resume() { thaw(); }

  // StreamEndpoint
  void freeze() override;
  void thaw() override;
  absl::Status exportState(v1::PumpExport* out, std::vector<UniqueFd>* fds) override;
  void onData(std::string_view payload) override;  // ignored (consumed)
  void onHalfClose() override;
  void onReset(const v1::Error& error) override;
  void onWritable() override;
  void close() override;

 private:
  void onPacket(const Packet& packet) override;
  void trySendHeader();
  void armWait();
  void readTurn();
  // Reads at most one turn's budget. false when the source failed (the
  // stream is reset then); *more when the budget ran out first.
  bool readSome(protocol::Session& s, bool* more);
  void pollKernelDrops(protocol::Session& s, bool force);
  // Whether pending gaps may go out now, without a record to precede.
  bool reportable(protocol::Session& s);
  void flushGaps(protocol::Session& s);
  // The client half-closed: last packets, gaps, HalfClose back.
  void finish();
  void fail(const absl::Status& status);
  // Closes the source; the capture is over.
  void stop(std::string_view reason);

  net::asio::any_io_executor ex_;
  uint64_t id_;
  HostRef host_;
  Options options_;
  net::asio::posix::stream_descriptor wait_fd_;
  net::asio::steady_timer finish_timer_;
  std::unique_ptr<PacketSource> source_;
  GapLedger ledger_;
  std::string header_;
  protocol::Session* turn_session_ = nullptr;  // set while read() hands packets over
  std::chrono::steady_clock::time_point last_stats_{};
  size_t smallest_dropped_ = 0;  // of the records dropped since the last gap; 0: none
  uint64_t packets_ = 0;
  uint64_t bytes_ = 0;
  bool started_ = false;
  bool header_sent_ = false;
  bool waiting_ = false;
  bool turn_posted_ = false;
  bool client_done_ = false;
  bool frozen_ = false;  // a handover: nothing is read
  bool dead_ = false;
};

}  // namespace siphon::agent::capture
