// Flushing of established connections (--flush-connections): the server side
// of the target's TCP connections on a port is destroyed through inet_diag's
// SOCK_DESTROY, like `ss -K`, so their clients reconnect, and the new
// connections are stolen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace siphon::agent::steal {

struct FlushResult {
  size_t destroyed = 0;     // sockets the kernel aborted
  size_t failed = 0;        // sockets SOCK_DESTROY failed for
  std::string first_error;  // the first failure, "" when failed == 0
};

// Destroys every TCP socket (IPv4 and IPv6) of the netns of `diag_fd` whose
// local port is `local_port` and that is a connection, not the listener:
// established, syn-recv (a handshake in progress), close-wait and the other
// closing states; also connections still in a listener's accept queue and
// connections the agent itself accepted on that port. TIME_WAIT sockets are
// left alone (there is no connection left to flush). The kernel sends a RST
// to the peer and the local owner gets ECONNABORTED.
//
// `diag_fd`: socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG),
// created inside the target's netns (a netlink socket talks to the netns it
// was created in). Needs CAP_NET_ADMIN there.
//
// Sockets that close on their own between the dump and the destroy count as
// neither destroyed nor failed. Errors: the dump failing (the errno of the
// send or the kernel's answer, "dump TCP sockets (IPv6): ..."); per-socket
// failures are counted, not returned. Blocks on netlink; any thread, one
// call at a time per `diag_fd`.
absl::StatusOr<FlushResult> destroyEstablished(int diag_fd, uint16_t local_port);

}  // namespace siphon::agent::steal
