// Loader of the mirror TC capture program (bpf/mirror.bpf.c).
//
// The program copies the TCP packets of the mirrored ports, seen at TC
// ingress and egress of the attached interfaces, to a ring buffer; this
// class reads them back. It never changes a packet's fate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct mirror_bpf;  // The generated skeleton (mirror.skel.h), private to the .cc.
struct ring_buffer;

namespace siphon::bpf {

enum class MirrorDirection : uint8_t { kIngress = 0, kEgress = 1 };

// The header of every captured packet: struct mirror_event_header of
// mirror.bpf.c, field for field (checked by static_assert in the .cc).
struct MirrorPacketHeader {
  uint64_t timestamp_ns;  // CLOCK_MONOTONIC, when TC saw the packet
  uint32_t ifindex;       // the interface, in the netns it was attached in
  uint32_t orig_len;      // bytes from the IP header to the end of the packet
  uint32_t cap_len;       // of them, the bytes captured (orig_len up to 64 KiB)
  uint8_t direction;      // MirrorDirection
  uint8_t pad[3];
};

// One captured packet. `data` starts at the IP (v4 or v6) header and is
// valid only during the callback.
struct MirrorPacket {
  MirrorPacketHeader header;
  std::span<const uint8_t> data;
  MirrorDirection direction() const { return static_cast<MirrorDirection>(header.direction); }
};

// Sums over all CPUs.
struct MirrorCounters {
  uint64_t seen = 0;    // TCP packets of a mirrored port
  uint64_t copied = 0;  // of them, put in the ring buffer
  uint64_t failed = 0;  // of them, lost (ring buffer full, unreadable packet)
};

// One loaded mirror program, its maps and its TCX links (two per attached
// interface). Nothing is pinned: each link belongs to one of this object's
// fds, so the destructor, or the process dying however it dies (SIGKILL
// included), detaches everything; the kernel then frees the program and maps.
//
// Needs CAP_BPF + CAP_NET_ADMIN (or CAP_SYS_ADMIN) and Linux >= 6.6 (TCX
// links; the program also uses the bpf_cast_to_kern_ctx kfunc of 6.3).
//
// Threads: not thread-safe; one call at a time, not concurrent with
// destruction. The callbacks run on the thread that calls consume() or
// consumeAdopted().
class MirrorLoader {
 public:
  struct Options {
    // Ring buffer size: a power of two multiple of the page size. Sized for
    // bursts of 64 KiB super-packets while the reader is busy.
    uint32_t ring_bytes = 8u << 20;
  };

  using PacketCallback = std::function<void(const MirrorPacket&)>;
  // `lost`: packets the program saw but could not hand over since the last
  // report (the ring buffer was full).
  using LossCallback = std::function<void(uint64_t lost)>;

  // Opens the embedded skeleton, sizes its maps and loads it. Errors (from
  // the kernel's errno): PermissionDenied without the capabilities;
  // InvalidArgument when the verifier or the kernel rejects it (libbpf logs
  // why through spdlog).
  static absl::StatusOr<std::unique_ptr<MirrorLoader>> load(Options options);
  static absl::StatusOr<std::unique_ptr<MirrorLoader>> load() { return load(Options{}); }

  // Detaches from every interface and unloads.
  ~MirrorLoader();

  MirrorLoader(const MirrorLoader&) = delete;
  MirrorLoader& operator=(const MirrorLoader&) = delete;

  // Which hooks of an interface to attach to. Loopback needs one: every
  // packet it sends leaves through its egress and comes back through its
  // ingress, so both would copy it twice.
  enum class Hooks { kBoth, kIngressOnly };

  // Attaches to TC ingress and egress of interface `ifindex` of the calling
  // thread's network namespace (setns() to the target first), through TCX
  // links after any programs already there; they keep running.
  // Errors: AlreadyExists when attached to it already; NotFound (ENODEV) for
  // no such interface; PermissionDenied; InvalidArgument on a kernel without
  // TCX (< 6.6). Attaches every hook asked for or none.
  absl::Status attach(int ifindex, Hooks hooks = Hooks::kBoth);

  // Releases both links of `ifindex`. NotFound when not attached to it.
  absl::Status detach(int ifindex);
  bool attached(int ifindex) const { return links_.contains(ifindex); }

  // Mirrors / stops mirroring packets whose source or destination port is
  // `port` (host order), from the next packet on. Both are idempotent.
  absl::Status addPort(uint16_t port);
  absl::Status removePort(uint16_t port);

  absl::StatusOr<MirrorCounters> counters() const;

  // The reader. startReader() once, then poll fd() for POLLIN (an epoll fd:
  // readable when records wait) and call consume(), which hands every
  // waiting packet to `on_packet`, then reports packets lost since the last
  // report to `on_loss`. consume() returns the number of packets delivered.
  // Errors: FailedPrecondition when started twice or not started.
  absl::Status startReader(PacketCallback on_packet, LossCallback on_loss);
  int fd() const;
  absl::StatusOr<size_t> consume();

  // The ring buffer map's fd (this object's): what another reader dups to
  // take the ring over (a new agent process, agent/mirror/mirror_engine.h).
  int ringFd() const;

  // A second reader, on another loader's ring buffer (a dup of its
  // ringFd(), maybe from another process): consumeAdopted() hands every
  // record waiting there to the same `on_packet` as consume() (startReader()
  // first). It maps the same consumer position, so it goes on exactly where
  // the other reader stopped. No loss reports: the counters are the other
  // program's. closeAdopted() drops the reader; `ring_fd` stays the
  // caller's, open until then. Errors: FailedPrecondition when adopted
  // twice or the reader is not started; the kernel's on a map that is not a
  // ring buffer.
  absl::Status adoptRing(int ring_fd);
  absl::StatusOr<size_t> consumeAdopted();
  void closeAdopted();

 private:
  struct Links {
    int ingress = -1;
    int egress = -1;
  };

  explicit MirrorLoader(mirror_bpf* skel);
  static int onRecord(void* ctx, void* data, size_t size);

  mirror_bpf* skel_;  // owned; destroyed by mirror_bpf__destroy
  std::map<int, Links> links_;
  ::ring_buffer* reader_ = nullptr;   // owned; ring_buffer__free
  ::ring_buffer* adopted_ = nullptr;  // owned; ring_buffer__free
  PacketCallback on_packet_;
  LossCallback on_loss_;
  uint64_t lost_reported_ = 0;
  bool bad_record_ = false;
};

}  // namespace siphon::bpf
