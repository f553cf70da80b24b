#include "agent/capture/gap_ledger.h"

namespace siphon::agent::capture {

void GapLedger::dropped(uint64_t record_bytes) {
  ++pending_packets_;
  pending_bytes_ += record_bytes;
  ++totals_.slow_client_packets;
  totals_.slow_client_bytes += record_bytes;
}

void GapLedger::kernelDropTotal(uint32_t total) {
  // Unsigned arithmetic is modulo 2^32: right across a wrap too.
  const uint32_t delta = total - kernel_seen_;
  kernel_seen_ = total;
  pending_kernel_ += delta;
  totals_.kernel_packets += delta;
}

std::vector<v1::StreamGap> GapLedger::take(uint64_t stream_id) {
  std::vector<v1::StreamGap> out;
  if (pending_packets_ > 0) {
    v1::StreamGap g;
    g.set_stream_id(stream_id);
    g.set_packets(pending_packets_);
    g.set_bytes(pending_bytes_);
    out.push_back(std::move(g));
  }
  if (pending_kernel_ > 0) {
    v1::StreamGap g;
    g.set_stream_id(stream_id);
    g.set_packets(pending_kernel_);
    out.push_back(std::move(g));
  }
  pending_packets_ = pending_bytes_ = pending_kernel_ = 0;
  return out;
}

}  // namespace siphon::agent::capture
