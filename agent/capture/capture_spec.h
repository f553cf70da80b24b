// What a client asked to capture (CaptureStart), checked and completed with
// the defaults, before anything touches the kernel. No I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "siphon/v1/streams.pb.h"

namespace siphon::agent::capture {

// libpcap's and tcpdump's default, and the largest snapshot length libpcap
// takes.
inline constexpr uint32_t kDefaultSnaplen = 262144;
// Filters are typed by people; anything longer is a mistake or an attack on
// the compiler. libpcap's optimizer grows much faster than the expression:
// a 4 KiB chain of `host A or host B ...` takes it seconds, the 64 KiB the
// agent used to take would hold a thread for hours. The compile is bounded
// in time too (filter_compiler.h); this bounds what a compile past its
// deadline still costs.
inline constexpr size_t kMaxFilterBytes = 4 * 1024;

struct CaptureSpec {
  std::string interface;  // "any" or an interface of the target's netns
  std::string filter;     // pcap filter expression; empty: every packet
  uint32_t snaplen = kDefaultSnaplen;
  // The kernel's ring for this capture (pcap_set_buffer_size): what absorbs
  // a burst while the event loop is busy elsewhere.
  uint32_t buffer_bytes = 4 * 1024 * 1024;
  // A ring block (TPACKET_V3) is handed over when full or after this long:
  // the most a packet waits in the kernel before the agent sees it.
  int block_timeout_ms = 20;
};

// The capture `start` asks for. An empty interface is "any"; snaplen 0 or
// above kDefaultSnaplen is kDefaultSnaplen; the snaplen is then lowered so
// that a record (16-byte header + snaplen) fits in `max_record_bytes`, the
// largest Data payload the session sends as one frame: each record must be
// exactly one Data frame.
//
// INVALID_ARGUMENT (naming what is wrong) for an interface name Linux would
// refuse (longer than 15 bytes, "." or "..", '/', ':', whitespace or NUL),
// a filter with a NUL byte or longer than kMaxFilterBytes, or a
// `max_record_bytes` too small for any packet.
absl::StatusOr<CaptureSpec> captureSpec(const v1::CaptureStart& start, size_t max_record_bytes);

}  // namespace siphon::agent::capture
