// The program's own namespaces, the ground `siphon exec` (issue 21) stands
// on: a local program started in new network, mount and UTS namespaces (and
// a user namespace when siphon is not root, so no privilege is needed where
// unprivileged user namespaces are allowed), where every TCP connection it
// or any child makes, IPv4 and IPv6, loopback included, is redirected (nat
// OUTPUT REDIRECT in that namespace) to one of two listeners that siphon
// holds. siphon accepts on them from its own namespace (a socket keeps the
// namespace it was made in) and learns from SO_ORIGINAL_DST where each was
// going: it then makes the connection from the target through the agent,
// or locally. No LD_PRELOAD: static binaries, Go, JVMs and shell scripts
// are steered the same way.
//
// Inside, the namespace's loopback is up, a default route (IPv4 and IPv6)
// goes into it from an address of its own (kSandboxAddress4/6), and the
// rules are `iptables`/`ip6tables` ones made by those commands (iproute2's
// `ip` too): all three must be installed. The program runs as the caller's
// uid and gid (a second user namespace maps them back once the network is
// made), in its own process group.
//
// The program starts with 0, 1 and 2 and SandboxSpec::keep_fds, whatever
// else siphon holds (exec/fds.h).
//
// Threads: startSandbox() forks; call it before any thread of the process
// holds a lock the child would need (the child runs only system calls and
// execs until the program starts).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::exec {

// The program's own addresses in its namespace (the source of what it
// sends): from ranges no pod uses (RFC 2544's benchmarking range, a ULA).
inline constexpr const char* kSandboxAddress4 = "198.18.255.254";
inline constexpr const char* kSandboxAddress6 = "fd5e:5e00::1";

// A file of siphon's shown at `target` in the program's view (a bind mount
// in its mount namespace): the target's resolv.conf and hosts.
struct FileOverlay {
  std::string source;  // a regular file the caller made; may be removed once started
  std::string target;  // an existing file (symlinks followed), e.g. /etc/resolv.conf
};

// A directory (or file) of siphon's shown at `target` in the program's view,
// with what is mounted under it (a recursive bind mount in its mount
// namespace): the target's files from siphon's FUSE mount (--fs-remote,
// --fs-root). A `target` that does not exist on this machine is made in the
// program's view only: its deepest existing ancestor is covered by a tmpfs
// holding that ancestor's entries (each bound from the original, so what
// is mounted under them stays; symlinks recreated) and the missing path;
// nothing changes on this machine. The root itself cannot be covered so.
struct MountOverlay {
  std::string source;     // an existing directory, or a file
  std::string target;     // absolute
  bool directory = true;  // what `source` is (what a missing `target` is made as)
};

// The program's UDP: a TUN device (kTunName) takes every UDP datagram to a
// non-local address (a routing rule by protocol), IPv4 and IPv6; siphon
// reads and writes whole IP packets on it (exec/packet.h).
inline constexpr const char* kTunName = "siphon0";

struct SandboxSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  std::vector<std::string> env;   // the program's environment, NAME=VALUE
  std::string hostname;           // of its UTS namespace; empty: the machine's
  std::vector<FileOverlay> files;
  std::vector<MountOverlay> mounts;  // in order: a later one may be under an earlier one
  // An empty directory of siphon's where a missing target's tmpfs is made
  // (in the program's namespace; nothing shows here). Needed with mounts.
  std::string scratch;
  bool udp = false;  // make the TUN device (Sandbox::tun())
  // Descriptors of siphon's the program gets at the same numbers, besides
  // 0, 1 and 2 (--keep-fd); it gets no other (exec/fds.h), nor do the
  // set-up's commands and the connector.
  std::vector<int> keep_fds;
};

class Sandbox {
 public:
  Sandbox() = default;
  ~Sandbox();
  Sandbox(Sandbox&& other) noexcept;
  Sandbox& operator=(Sandbox&& other) noexcept;
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  // The program; it leads its own process group (signals go to -pid()).
  pid_t pid() const { return pid_; }
  // The listeners every redirected connection arrives at (-1: none, when
  // the machine has no IPv6). Owned here; release() hands one over.
  int tcp4() const { return tcp4_; }
  int tcp6() const { return tcp6_; }
  // The TUN device's descriptor (SandboxSpec::udp), non-blocking; -1 without.
  int tun() const { return tun_; }
  int releaseTcp4();
  int releaseTcp6();
  int releaseTun();
  // A socket to the connector, a process in the program's namespace that
  // makes connections there (connectInside()); it ends when this closes.
  int connector() const { return connector_; }
  int releaseConnector();

 private:
  friend absl::StatusOr<Sandbox> startSandbox(const SandboxSpec& spec);
  void reset();

  pid_t pid_ = -1;
  int tcp4_ = -1;
  int tcp6_ = -1;
  int tun_ = -1;
  int connector_ = -1;
};

// Starts the program in its namespaces. Errors: FAILED_PRECONDITION when
// namespaces cannot be made here (unprivileged user namespaces are off: the
// message names the setting to check) or a needed command is missing;
// NOT_FOUND / PERMISSION_DENIED when the program cannot be executed (its
// errno), after which nothing of it is left; INVALID_ARGUMENT for a
// keep_fds entry below 3 or not open, or more than kMaxKeptDescriptors - 1.
absl::StatusOr<Sandbox> startSandbox(const SandboxSpec& spec);

// Where a connection accepted on a Sandbox listener was going (its
// SO_ORIGINAL_DST, IPv4 or IPv6): an address and a port.
struct Destination {
  std::string address;  // numeric
  uint16_t port = 0;
  bool loopback = false;  // 127.0.0.0/8 or ::1
};
absl::StatusOr<Destination> originalDestination(int accepted_fd);

// A TCP connection to ADDRESS:PORT (numeric, IPv4 or IPv6: the program's
// loopback, usually) made inside the program's namespace by the connector:
// a non-blocking socket, its connect under way (wait until writable, then
// SO_ERROR). Blocks for the connector's answer, which makes no system call
// that waits. UNAVAILABLE when the connector is gone or the socket could
// not be made; INVALID_ARGUMENT for an address that is not numeric.
absl::StatusOr<int> connectInside(int connector, const std::string& address, uint16_t port);

}  // namespace siphon::exec
