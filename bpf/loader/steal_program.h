// Loader of the steal sk_lookup program (bpf/steal.bpf.c).
//
// The program steers new TCP connections to the steered ports of one network
// namespace to the agent's listeners in that namespace, except the agent's
// own passthrough connections (exempted by source port).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct steal_bpf;  // The generated skeleton (steal.skel.h), private to the .cc.
struct bpf_link;

namespace siphon::bpf {

// One loaded steal program, its maps and (once attached) its link to one
// netns. Nothing is pinned: the link is held only by this object's fd, so
// the destructor, or the process dying however it dies, detaches the program
// from the netns; the kernel then frees the program and maps.
//
// Loading and attaching need CAP_BPF + CAP_NET_ADMIN (or CAP_SYS_ADMIN);
// sk_lookup needs Linux >= 5.9.
//
// Threads: not thread-safe; one call at a time, not concurrent with
// destruction. Map updates take effect for the next connection the kernel
// looks up, on any CPU.
class StealProgram {
 public:
  // Opens the skeleton embedded in the binary and loads the program and its
  // maps. Errors (from the kernel's errno): PermissionDenied without the
  // capabilities; InvalidArgument when the kernel has no sk_lookup or the
  // verifier rejects the program (libbpf logs why through spdlog).
  static absl::StatusOr<std::unique_ptr<StealProgram>> load();

  // Detaches (if attached) and unloads.
  ~StealProgram();

  StealProgram(const StealProgram&) = delete;
  StealProgram& operator=(const StealProgram&) = delete;

  // Attaches the program to the netns of `netns_fd` (an fd of
  // /proc/PID/ns/net or /var/run/netns/NAME) through a bpf_link; other
  // sk_lookup programs on that netns keep running. Call once.
  // Errors: FailedPrecondition when already attached; the errno of
  // BPF_LINK_CREATE otherwise ("attach sk_lookup to netns: Operation not
  // permitted").
  absl::Status attachToNetns(int netns_fd);

  // Releases the link now: from the next lookup on, the netns behaves as if
  // the program had never been there. Idempotent.
  void detach();
  bool attached() const { return link_ != nullptr; }

  // Puts listener `fd` (a listening TCP socket in the attached netns) in the
  // listeners map for `family` (AF_INET, or AF_INET6 for an IPV6_V6ONLY
  // listener). The map takes its own reference to the socket.
  // Errors: InvalidArgument for another family; the kernel's errno
  // (EOPNOTSUPP when the socket is not a listening TCP socket...).
  absl::Status setListener(int family, int fd);

  // Steers / stops steering new connections to local `port` (host order).
  // Both are idempotent.
  absl::Status addPort(uint16_t port);
  absl::Status removePort(uint16_t port);

  // Exempts / un-exempts connections whose packets are of `family`
  // (AF_INET, AF_INET6) and come from source `port`: the agent's own
  // passthrough connections. Both are idempotent.
  absl::Status exempt(int family, uint16_t port);
  absl::Status unexempt(int family, uint16_t port);

  // Exempts connections from the source prefix `addr`/`prefixlen` (16
  // bytes, IPv4 as v4-mapped IPv6 with its prefix length + 96) from every
  // steered port: --probe-source. Idempotent.
  absl::Status exemptSource(const uint8_t (&addr)[16], uint32_t prefixlen);

 private:
  explicit StealProgram(steal_bpf* skel);

  steal_bpf* skel_;             // owned; destroyed by steal_bpf__destroy
  ::bpf_link* link_ = nullptr;  // owned; destroyed by bpf_link__destroy
};

}  // namespace siphon::bpf
