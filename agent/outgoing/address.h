// Socket addresses of outgoing connections: IP literals and their wire form,
// unix socket addresses (abstract names, and paths reached inside the
// target's root), and the typed errors a failed socket call becomes.
//
// Threads: pure functions, any thread. openInRoot() blocks on the file
// system (one path walk); everything else does no I/O but getsockname().
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "siphon/v1/common.pb.h"

namespace siphon::agent::outgoing {

// One socket address of any family, as the kernel takes it.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
};

// "10.0.0.1", "::1" or "[::1]" with `port`; nullopt when `host` is not an IP
// literal (a name, to be resolved).
std::optional<SockAddr> ipAddress(std::string_view host, uint16_t port);

// The same address for a socket of `family`: an IPv4 address becomes
// v4-mapped IPv6 ("::ffff:10.0.0.1") for an AF_INET6 socket. INVALID_ARGUMENT
// for an IPv6 address and an AF_INET socket.
absl::StatusOr<SockAddr> forFamily(const SockAddr& addr, int family);

// "10.0.0.1:80", "[::1]:80" (v4-mapped addresses print as IPv4); a unix
// address prints as its path, "@name" for an abstract one.
std::string formatAddress(const SockAddr& addr);

// The wire form (ip, port) of an IP address; v4-mapped addresses as IPv4.
// Empty for other families.
v1::SocketAddress toProto(const SockAddr& addr);
// The inverse; INVALID_ARGUMENT when `ip` is not an IP literal.
absl::StatusOr<SockAddr> fromProto(const v1::SocketAddress& addr);

// The port of an IP address (0 for other families).
uint16_t portOf(const SockAddr& addr);
// 0.0.0.0:port or [::]:port.
SockAddr wildcardAddress(int family, uint16_t port = 0);

// getsockname()/getpeername() of a socket.
absl::StatusOr<SockAddr> localAddress(int fd);
absl::StatusOr<SockAddr> peerAddress(int fd);

// An abstract unix address from "@name" (the "@" is the NUL the kernel
// wants first). INVALID_ARGUMENT when the name is empty or too long (107
// bytes). Abstract names live in a network namespace, not a file system:
// the socket must be made in the target's netns.
absl::StatusOr<SockAddr> abstractUnixAddress(std::string_view at_name);

// Opens the file at `path` (absolute or relative: both start at the root)
// O_PATH inside the tree of `root_fd` with openat2(RESOLVE_IN_ROOT |
// RESOLVE_NO_MAGICLINKS): "..", absolute symlinks and relative symlinks all
// resolve inside that root, as they would for a process chrooted there, and
// /proc magic links are refused. NOT_FOUND, PERMISSION_DENIED... with errno.
absl::StatusOr<UniqueFd> openInRoot(int root_fd, std::string_view path);

// The unix address "/proc/self/fd/N" that reaches the socket file held by
// `path_fd` (from openInRoot()). connect() follows that magic link straight
// to the inode the confined walk found, so no part of the container's path
// is looked up again in the agent's own root (a symlink in the container
// cannot point the agent at a host socket), and the path length limit of
// sun_path (108 bytes) does not apply to the container path.
SockAddr procFdUnixAddress(int path_fd);

// The wire error of a failed socket call: "<what>: <strerror>", errno_value
// set, and a code the client can act on: UNAVAILABLE for refused,
// unreachable, reset, timed out and would-block (a full unix backlog);
// NOT_FOUND, PERMISSION_DENIED, INVALID_ARGUMENT (wrong socket type, a file
// that is no socket, bad address); RESOURCE_EXHAUSTED (fds, memory); else
// ERRNO.
v1::Error socketError(int err, std::string_view what);

// A wire error with a code and message (no errno).
v1::Error wireError(v1::ErrorCode code, std::string message);

}  // namespace siphon::agent::outgoing
