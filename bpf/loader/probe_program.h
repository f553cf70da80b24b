// Loader of the probe socket filter (bpf/probe.bpf.c).
//
// The probe counts the UDP datagrams queued to the sockets it is attached to.
// It proves the BPF path end to end (build, skeleton, load, attach) and tells
// whether a socket sees traffic.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct probe_bpf;  // The generated skeleton (probe.skel.h), private to the .cc.

namespace siphon::bpf {

// What the probe has counted since load.
struct ProbeCounters {
  uint64_t packets = 0;        // UDP datagrams that matched Options::source_port
  uint64_t payload_bytes = 0;  // their UDP payload, headers excluded
  uint64_t ignored = 0;        // packets seen but not matched (other port, not UDP)
};

// One loaded probe program and its own counters map. Every socket it is
// attached to adds to the same counters. Nothing is pinned: the program and
// map live as long as this object, or as long as a socket still holds the
// program (see attachToSocket).
//
// Loading needs CAP_BPF (or CAP_SYS_ADMIN) unless kernel.unprivileged_bpf_disabled
// is 0; Debian's default (2) forbids unprivileged loads.
//
// Threads: methods may be called from any thread, but not concurrently with
// destruction. counters() may race with traffic; each field is read atomically.
class ProbeProgram {
 public:
  // Settings fixed at load time (const volatile globals of the program).
  struct Options {
    // Count only datagrams from this UDP source port; 0 counts every datagram.
    uint16_t source_port = 0;
  };

  // Opens the skeleton embedded in the binary, applies `options` and loads
  // the program and its map into the kernel.
  // Errors (from the kernel's errno): PermissionDenied without the capability
  // above; InvalidArgument or Internal when the verifier rejects the program
  // (libbpf logs the verifier output as a warning through spdlog).
  static absl::StatusOr<std::unique_ptr<ProbeProgram>> load(const Options& options);

  // Unloads the program (closes its fds). Sockets it is attached to keep
  // filtering through their own reference until detached or closed.
  ~ProbeProgram();

  ProbeProgram(const ProbeProgram&) = delete;
  ProbeProgram& operator=(const ProbeProgram&) = delete;

  // Attaches the program to socket `fd` (SO_ATTACH_BPF), replacing the filter
  // the socket had. The socket takes its own reference to the program: the
  // destructor cannot detach it, because by then `fd` may be closed and its
  // number reused by an unrelated socket. Call detachFromSocket() first, or
  // close the socket.
  // Errors: EBADF, ENOTSOCK (InvalidArgument/Internal with the errno kept).
  absl::Status attachToSocket(int fd);

  // Removes the filter of socket `fd` (SO_DETACH_BPF), whichever program it
  // is. Errors: ENOENT (NotFound) when the socket has no filter; EBADF,
  // ENOTSOCK.
  absl::Status detachFromSocket(int fd);

  // Reads the counters map.
  absl::StatusOr<ProbeCounters> counters() const;

  // counters()->packets.
  absl::StatusOr<uint64_t> count() const;

 private:
  explicit ProbeProgram(probe_bpf* skel);

  probe_bpf* skel_;  // owned; destroyed by probe_bpf__destroy
};

}  // namespace siphon::bpf
