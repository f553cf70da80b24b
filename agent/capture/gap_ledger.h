// The packets a capture could not deliver, counted until they are reported
// (StreamGap) so that no loss is ever silent. Two causes, reported apart
// because they call for different remedies:
//  - the client had no credit for a packet's record (it reads slower than
//    the traffic): packets and record bytes;
//  - the kernel's ring was full (pcap_stats ps_drop): packets only, the
//    kernel does not say how large they were.
//
// Call order: dropped() / kernelDropTotal() as losses are seen, take() when
// a gap may be sent (before the next record, when credit returns, at the
// end); take() clears what it returns. No I/O.
#pragma once

#include <cstdint>
#include <vector>

#include "siphon/v1/streams.pb.h"

namespace siphon::agent::capture {

class GapLedger {
 public:
  struct Totals {
    uint64_t slow_client_packets = 0;
    uint64_t slow_client_bytes = 0;
    uint64_t kernel_packets = 0;
  };

  // One packet whose record (`record_bytes` long) the client had no credit for.
  void dropped(uint64_t record_bytes);
  // The kernel's drop counter as libpcap reports it: cumulative since the
  // capture began, 32 bits (it wraps; a difference modulo 2^32 is the count).
  void kernelDropTotal(uint32_t total);

  bool pending() const { return pending_packets_ > 0 || pending_kernel_ > 0; }
  // The gaps to report on `stream_id` now: the slow client's first, then the
  // kernel's; empty when nothing is pending. Direction is unspecified.
  std::vector<v1::StreamGap> take(uint64_t stream_id);
  const Totals& totals() const { return totals_; }

  // Everything it holds (a handover moves it to another agent process).
  struct State {
    uint64_t pending_packets = 0;
    uint64_t pending_bytes = 0;
    uint64_t pending_kernel = 0;
    uint32_t kernel_seen = 0;
    Totals totals;
  };
  State state() const {
    return {pending_packets_, pending_bytes_, pending_kernel_, kernel_seen_, totals_};
  }
  void restore(const State& s) {
    pending_packets_ = s.pending_packets;
    pending_bytes_ = s.pending_bytes;
    pending_kernel_ = s.pending_kernel;
    kernel_seen_ = s.kernel_seen;
    totals_ = s.totals;
  }

 private:
  uint64_t pending_packets_ = 0;
  uint64_t pending_bytes_ = 0;
  uint64_t pending_kernel_ = 0;
  uint32_t kernel_seen_ = 0;
  Totals totals_;
};

}  // namespace siphon::agent::capture
