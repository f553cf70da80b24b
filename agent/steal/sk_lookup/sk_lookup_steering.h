// The sk_lookup steering backend: a BPF sk_lookup program (bpf/steal.bpf.c)
// attached to the target's netns by a bpf_link that only the agent's fd
// holds. When the agent dies, however it dies, the kernel closes the fd, the
// link goes and connections reach the application again: nothing to clean.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/outgoing/address.h"
#include "agent/steal/source_prefix.h"

namespace siphon::agent::steal {
// steering.h names SockAddr unqualified.
using outgoing::SockAddr;
}  // namespace siphon::agent::steal

#include "agent/steal/steering.h"

namespace siphon::agent::steal {

// Loads the program, puts `listeners` (created in the netns of `netns_fd`,
// listening; v6 optional when listeners.v6 < 0) in its map and attaches it
// to that netns. No port is steered yet.
//
// Errors: "sk_lookup unavailable: <why>", with the code of the cause
// (PermissionDenied without CAP_BPF/CAP_NET_ADMIN, InvalidArgument on a
// kernel without sk_lookup...). The caller falls back to iptables then.
//
// The Steering it returns:
//   exempt(fd): binds an unbound socket to its family's wildcard address,
//     port 0, and exempts the source port it got (for an AF_INET6 socket
//     without IPV6_V6ONLY, both IPv6 and v4-mapped IPv4 packets).
//   originalDestination(fd): getsockname(); an sk_lookup-assigned socket
//     keeps the address the client connected to as its local address.
//
// Connections from `exempt_sources` (--probe-source) are never steered.
absl::StatusOr<std::unique_ptr<Steering>> makeSkLookupSteering(
    int netns_fd, Listeners listeners, const std::vector<SourcePrefix>& exempt_sources = {});

}  // namespace siphon::agent::steal
