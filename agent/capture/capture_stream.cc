#include "agent/capture/capture_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/capture/pcap_file.h"
#include "agent/common/log.h"
#include "siphon/status.h"

namespace siphon::agent::capture {

namespace asio = net::asio;

namespace {
// Turns read after the client's HalfClose: at the default budgets, 32768
// packets, a full 4 MiB ring of the smallest (128-byte) ring frames.
constexpr int kFinishTurns = 32;
}  // namespace

CaptureStream::CaptureStream(asio::any_io_executor ex, uint64_t stream_id,
                             std::weak_ptr<SessionHost> host, Options options)
    : ex_(ex),
      id_(stream_id),
      host_(std::move(host)),
      options_(std::move(options)),
      wait_fd_(ex),
      finish_timer_(ex) {}

CaptureStream::~CaptureStream() { stop("gone"); }

void CaptureStream::start(std::unique_ptr<PacketSource> source) {
  if (dead_) return;  // `source` closes here
  auto self = shared_from_this();
  if (client_done_) {
    // The client gave up before the capture began: nothing to send but the
    // end. The source was never read.
    source_ = std::move(source);
    started_ = true;
    finish();
    return;
  }
  // Asio owns (and closes) the descriptor it waits on: give it a dup, the
  // source keeps its own.
  const int fd = ::fcntl(source->selectableFd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    reset(toProtoError(lastErrnoStatus("capture: dup")));
    return;
  }
  net::error_code ec;
  wait_fd_.assign(fd, ec);
  if (ec) {
    ::close(fd);
    reset(toProtoError(protoError(v1::INTERNAL, absl::StrCat("capture: ", ec.message()))));
    return;
  }
  source_ = std::move(source);
  started_ = true;
  header_ = globalHeader(source_->linkType(), source_->snaplen());
  log::info("capture_started", {{"session", options_.session_id},
                                {"stream", id_},
                                {"interface", options_.interface},
                                {"filter", options_.filter},
                                {"snaplen", source_->snaplen()},
                                {"linktype", source_->linkType()}});
  trySendHeader();
}

void CaptureStream::trySendHeader() {
  protocol::Session* s = host_.session();
  if (s == nullptr) {
    stop("session ended");
    return;
  }
  // No packet is read before the header is out: the file must begin with
  // it. Until then the kernel's ring holds what comes (a full ring shows up
  // in the kernel's drop count, reported as a gap).
  if (s->sendCredit(id_, header_.size()) < header_.size()) return;  // onWritable()
  host_.sent(id_, header_.size());
  absl::Status st = s->sendData(id_, header_);
  if (!st.ok()) {
    fail(st);
    return;
  }
  header_sent_ = true;
  host_.wake();
  armWait();
}

void CaptureStream::armWait() {
  if (waiting_ || turn_posted_ || dead_ || frozen_ || !header_sent_) return;
  waiting_ = true;
  // async_wait re-arms the descriptor in epoll (EPOLL_CTL_MOD), which
  // reports a descriptor that is readable already: a wait started after a
  // drained read never misses packets that came in between.
  wait_fd_.async_wait(
      asio::posix::descriptor_base::wait_read, [self = shared_from_this()](net::error_code ec) {
        self->waiting_ = false;
        if (self->dead_ || ec == asio::error::operation_aborted) return;
        if (ec) {
          self->fail(protoError(v1::UNAVAILABLE, absl::StrCat("capture: wait: ", ec.message())));
          return;
        }
        self->readTurn();
      });
}

void CaptureStream::readTurn() {
  if (dead_ || frozen_ || !source_) return;
  auto self = shared_from_this();
  protocol::Session* s = host_.session();
  if (s == nullptr) {
    stop("session ended");
    return;
  }
  bool more = false;
  if (!readSome(*s, &more)) return;
  pollKernelDrops(*s, /*force=*/false);
  host_.wake();
  if (more) {
    // The budget ran out with packets left: let the loop serve others, then
    // go on without waiting for a readiness that may already have passed.
    turn_posted_ = true;
    asio::post(ex_, [self] {
      self->turn_posted_ = false;
      self->readTurn();
    });
    return;
  }
  armWait();
}

bool CaptureStream::readSome(protocol::Session& s, bool* more) {
  *more = false;
  turn_session_ = &s;
  for (int i = 0; i < options_.reads_per_turn; ++i) {
    absl::StatusOr<int> n = source_->read(options_.packets_per_read, *this);
    if (!n.ok()) {
      turn_session_ = nullptr;
      fail(n.status());
      return false;
    }
    if (*n < options_.packets_per_read) {
      turn_session_ = nullptr;
      return true;
    }
  }
  turn_session_ = nullptr;
  *more = true;
  return true;
}

void CaptureStream::onPacket(const Packet& packet) {
  protocol::Session& s = *turn_session_;
  const size_t size = recordSize(packet);
  // Asking for the whole record also asks the session to call onWritable()
  // once credit grows: the gap goes out then even if no packet follows.
  if (s.sendCredit(id_, size) < size) {
    ledger_.dropped(size);
    smallest_dropped_ = smallest_dropped_ == 0 ? size : std::min(smallest_dropped_, size);
    return;
  }
  flushGaps(s);
  host_.sent(id_, size);
  absl::Status st = s.sendData(id_, record(packet));
  if (!st.ok()) {
    // Within the credit just checked, on an open stream: cannot fail.
    log::error("capture_send_failed", {{"stream", id_}, {"error", sv(st.message())}});
    return;
  }
  ++packets_;
  bytes_ += size;
}

void CaptureStream::pollKernelDrops(protocol::Session& s, bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_stats_ < options_.stats_interval) return;
  last_stats_ = now;
  absl::StatusOr<uint32_t> drops = source_->kernelDrops();
  if (!drops.ok()) return;  // a statistics hiccup is not worth the capture
  const uint64_t before = ledger_.totals().kernel_packets;
  ledger_.kernelDropTotal(*drops);
  // Kernel drops are reported as they are seen, even when no packet
  // follows, once the client reads (else onWritable() will).
  if (ledger_.totals().kernel_packets != before && reportable(s)) flushGaps(s);
}

bool CaptureStream::reportable(protocol::Session& s) {
  if (!ledger_.pending()) return false;
  // A client that stopped reading keeps some credit, too little for the
  // records it missed, and every ack of ours makes the session call
  // onWritable(): reporting then would send it a gap each round trip while
  // it reads nothing. Report once it could take one of them again.
  if (smallest_dropped_ > 0) return s.sendCredit(id_, smallest_dropped_) >= smallest_dropped_;
  return s.sendCredit(id_) > 0;
}

void CaptureStream::flushGaps(protocol::Session& s) {
  if (!ledger_.pending()) return;
  smallest_dropped_ = 0;
  for (v1::StreamGap& gap : ledger_.take(id_)) {
    log::debug("capture_gap",
               {{"stream", id_}, {"packets", gap.packets()}, {"bytes", gap.bytes()}});
    host_.gap(id_, gap.bytes());
    (void)s.sendGap(std::move(gap));  // STREAM_CLOSED only once the stream is gone
  }
}

void CaptureStream::onData(std::string_view payload) {
  // The client has nothing to say on a capture: take it and grant the credit back.
  if (protocol::Session* s = host_.session()) s->consumed(id_, payload.size());
}

void CaptureStream::onHalfClose() {
  if (dead_) return;
  auto self = shared_from_this();
  client_done_ = true;
  if (!source_) return;  // not started yet: start() finishes
  if (!header_sent_ || options_.finish_delay.count() == 0) {
    finish();
    return;
  }
  // The ring hands over a partly filled block only once the block timeout
  // passed: packets that came just before the client's "stop" (the end of
  // a transfer, say) are still in the kernel's block. Read on for a while,
  // then finish.
  finish_timer_.expires_after(options_.finish_delay);
  finish_timer_.async_wait([self = shared_from_this()](net::error_code ec) {
    if (ec || self->dead_) return;
    self->finish();
  });
  // Not started yet: start() finishes.
}

void CaptureStream::finish() {
  protocol::Session* s = host_.session();
  if (s == nullptr) {
    stop("session ended");
    return;
  }
  if (header_sent_) {
    // What is in the ring came before the client's "stop": it belongs in
    // the file. Bounded, so that traffic that keeps coming cannot keep the
    // loop (or the stream) busy.
    bool more = true;
    for (int turn = 0; more && turn < kFinishTurns; ++turn) {
      if (!readSome(*s, &more)) return;
    }
    pollKernelDrops(*s, /*force=*/true);
  }
  flushGaps(*s);
  (void)s->halfClose(id_);
  host_.wake();
  host_.release(id_);
  stop("client finished");
}

void CaptureStream::onReset(const v1::Error& error) {
  if (dead_) return;
  auto self = shared_from_this();
  host_.release(id_);
  stop(absl::StrCat("client reset: ", error.message()));
}

void CaptureStream::onWritable() {
  if (dead_ || !started_) return;
  auto self = shared_from_this();
  protocol::Session* s = host_.session();
  if (s == nullptr) return;
  if (!header_sent_) {
    trySendHeader();
    return;
  }
  if (!reportable(*s)) return;
  flushGaps(*s);
  host_.wake();
}

void CaptureStream::close() { stop("session ended"); }

// ---- handover ----

void CaptureStream::freeze() {
  if (dead_ || frozen_) return;
  frozen_ = true;
  net::error_code ignored;
  wait_fd_.cancel(ignored);
  if (!started_ || !header_sent_ || !source_) return;
  protocol::Session* s = host_.session();
  if (s == nullptr) return;
  // No count limit: libpcap (and the adopted reader) then stop only where
  // no block is left to read, never inside one, so the next agent starts
  // at the next block the kernel hands over and reads nothing twice.
  turn_session_ = s;
  absl::StatusOr<int> n = source_->read(std::numeric_limits<int>::max(), *this);
  turn_session_ = nullptr;
  if (!n.ok()) {
    fail(n.status());
    return;
  }
  pollKernelDrops(*s, /*force=*/true);
  host_.wake();
}

void CaptureStream::thaw() {
  if (!frozen_) return;
  frozen_ = false;
  if (dead_ || !started_) return;
  if (!header_sent_) {
    trySendHeader();
    return;
  }
  armWait();
}

std::string CaptureStream::handoverBlocker() const {
  if (dead_) return "";
  if (!started_) return "a packet capture opening";
  if (client_done_) return "a packet capture finishing";
  return "";
}

absl::Status CaptureStream::exportState(v1::PumpExport* out, std::vector<UniqueFd>* fds) {
  if (!started_ || !source_ || client_done_) {
    return absl::FailedPreconditionError("a packet capture opening or finishing");
  }
  const int fd = ::fcntl(source_->selectableFd(), F_DUPFD_CLOEXEC, 3);
  if (fd < 0) return lastErrnoStatus("handover: dup a capture's packet socket");
  out->set_stream_id(id_);
  out->set_fd(-1);
  out->set_service("capture");
  v1::CaptureStreamExport& c = *out->mutable_capture();
  c.set_socket(static_cast<int32_t>(fds->size()));
  fds->emplace_back(fd);
  c.set_interface(options_.interface);
  c.set_filter(options_.filter);
  c.set_link_type(source_->linkType());
  c.set_snaplen(source_->snaplen());
  c.set_data_link(source_->dataLink());
  const GapLedger::State ledger = ledger_.state();
  // Drops since the freeze are counted from here by the next agent.
  absl::StatusOr<uint32_t> drops = source_->kernelDrops();
  c.set_kernel_drops(drops.ok() ? *drops : ledger.kernel_seen);
  c.set_header_sent(header_sent_);
  c.set_packets(packets_);
  c.set_bytes(bytes_);
  c.set_finish_delay_ms(static_cast<uint32_t>(options_.finish_delay.count()));
  c.set_pending_packets(ledger.pending_packets);
  c.set_pending_bytes(ledger.pending_bytes);
  c.set_pending_kernel(ledger.pending_kernel);
  c.set_kernel_seen(ledger.kernel_seen);
  c.set_slow_client_packets(ledger.totals.slow_client_packets);
  c.set_slow_client_bytes(ledger.totals.slow_client_bytes);
  c.set_kernel_packets(ledger.totals.kernel_packets);
  c.set_smallest_dropped(smallest_dropped_);
  return absl::OkStatus();
}

void CaptureStream::restoreFrom(const v1::CaptureStreamExport& in) {
  header_sent_ = in.header_sent();
  packets_ = in.packets();
  bytes_ = in.bytes();
  smallest_dropped_ = static_cast<size_t>(in.smallest_dropped());
  GapLedger::State ledger;
  ledger.pending_packets = in.pending_packets();
  ledger.pending_bytes = in.pending_bytes();
  ledger.pending_kernel = in.pending_kernel();
  ledger.kernel_seen = in.kernel_seen();
  ledger.totals.slow_client_packets = in.slow_client_packets();
  ledger.totals.slow_client_bytes = in.slow_client_bytes();
  ledger.totals.kernel_packets = in.kernel_packets();
  ledger_.restore(ledger);
}

absl::Status CaptureStream::adopt(std::unique_ptr<PacketSource> source) {
  const int fd = ::fcntl(source->selectableFd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return lastErrnoStatus("capture: dup");
  net::error_code ec;
  wait_fd_.assign(fd, ec);
  if (ec) {
    ::close(fd);
    return protoError(v1::INTERNAL, absl::StrCat("capture: ", ec.message()));
  }
  source_ = std::move(source);
  started_ = true;
  frozen_ = true;  // until resume()
  header_ = globalHeader(source_->linkType(), source_->snaplen());
  log::info("capture_adopted", {{"session", options_.session_id},
                                {"stream", id_},
                                {"interface", options_.interface},
                                {"packets", packets_},
                                {"header_sent", header_sent_}});
  return absl::OkStatus();
}

void CaptureStream::reset(v1::Error error) {
  if (dead_) return;
  auto self = shared_from_this();
  if (host_.session()) {
    host_.reset(id_, error);
    host_.wake();
  }
  host_.release(id_);
  stop(error.message());
}

void CaptureStream::fail(const absl::Status& status) {
  log::warn("capture_failed", {{"session", options_.session_id},
                               {"stream", id_},
                               {"interface", options_.interface},
                               {"error", sv(status.message())}});
  reset(toProtoError(status));
}

void CaptureStream::stop(std::string_view reason) {
  if (dead_) return;
  dead_ = true;
  net::error_code ignored;
  wait_fd_.close(ignored);  // cancels a pending wait before the source's fd goes
  finish_timer_.cancel();
  source_.reset();
  if (started_) {
    const GapLedger::Totals& d = ledger_.totals();
    log::info("capture_ended", {{"session", options_.session_id},
                                {"stream", id_},
                                {"reason", reason},
                                {"packets", packets_},
                                {"bytes", bytes_},
                                {"dropped_packets", d.slow_client_packets},
                                {"dropped_bytes", d.slow_client_bytes},
                                {"kernel_drops", d.kernel_packets}});
  }
  if (options_.on_end) std::exchange(options_.on_end, nullptr)();
}

}  // namespace siphon::agent::capture
