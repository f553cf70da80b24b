// Where a capture's packets come from: libpcap on a packet socket of the
// target's network namespace (openPcap), or a test's fake. The capture
// stream (capture_stream.h) only reads through this interface.
//
// Threads: openPcap() blocks briefly (socket, ring setup) and must run on a
// thread inside the target's netns (the NetnsWorker): a packet socket sees
// the namespace it was created in, for life. The filter is compiled
// elsewhere (filter_compiler.h) and installed with setFilter(). Everything
// else runs on the event loop and never blocks.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/capture/capture_spec.h"
#include "agent/capture/filter_compiler.h"
#include "agent/capture/pcap_file.h"

namespace siphon::agent::capture {

class PacketSink {
 public:
  virtual ~PacketSink() = default;
  // `packet.data` is valid during the call only.
  virtual void onPacket(const Packet& packet) = 0;
};

class PacketSource {
 public:
  virtual ~PacketSource() = default;  // closes the capture

  // The LINKTYPE_ value for the file's header (LINKTYPE_LINUX_SLL for "any").
  virtual uint32_t linkType() const = 0;
  // The snapshot length in effect (what the file's header states).
  virtual uint32_t snaplen() const = 0;
  // The DLT_ value filters are compiled for (compilePcapFilter).
  virtual int dataLink() const = 0;
  // Installs `filter` in the kernel (a setsockopt: cheap, any thread, no
  // netns needed). Packets the ring took before are filtered in user space,
  // so nothing unfiltered is read afterwards. INVALID_ARGUMENT with
  // libpcap's words.
  virtual absl::Status setFilter(const CompiledFilter& filter) = 0;
  // A descriptor that polls readable when packets wait. Owned by the source.
  virtual int selectableFd() const = 0;
  // Hands up to `max` waiting packets to `sink` without blocking; returns
  // how many. Fewer than `max` means none are left now: wait for the fd.
  // An error (UNAVAILABLE: the interface went away or down) ends the capture.
  virtual absl::StatusOr<int> read(int max, PacketSink& sink) = 0;
  // Packets the kernel dropped since the capture began (its ring was full),
  // modulo 2^32.
  virtual absl::StatusOr<uint32_t> kernelDrops() = 0;
};

// libpcap: pcap_create on spec.interface, snaplen, a TPACKET_V3 ring of
// spec.buffer_bytes whose blocks are handed over when full or after
// spec.block_timeout_ms, activate, non-blocking. No filter: spec.filter is
// compiled off the NetnsWorker and installed with setFilter().
//
// Errors carry libpcap's own words:
//   NOT_FOUND          no such interface in the target's netns;
//   PERMISSION_DENIED  no CAP_NET_RAW;
//   UNAVAILABLE        the interface is down, or another failure of activation.
absl::StatusOr<std::unique_ptr<PacketSource>> openPcap(const CaptureSpec& spec);

}  // namespace siphon::agent::capture
