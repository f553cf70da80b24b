// The handover socket (docs/CONTINUITY.md, "Handover"): the unix socket
// over which a new agent process takes over a running one. One
// siphon.v1.HandoverMessage per packet (SOCK_SEQPACKET), descriptors on
// packets as SCM_RIGHTS, the state itself in a memfd (it can be larger than
// any packet: the sessions' replay buffers).
//
// Only root or the agent's own uid may use it: the socket file is 0600 and
// each side checks the other's SO_PEERCRED. Being root is not enough: the
// socket lives in the agent's own file system (checkSocketPlace), and each
// side proves it holds the handover key before anything else
// (handover_auth.h).
//
// Threads: blocking calls, each bounded by its timeout; any thread.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "siphon/v1/handover.pb.h"

namespace siphon::agent::handover {

// The state format this agent writes, and the oldest it reads.
inline constexpr uint32_t kFormat = 3;  // 3: filtered steals (HTTP connections, filters)
inline constexpr uint32_t kMinFormat = 1;
// Descriptors per packet (the kernel's SCM_MAX_FD is 253).
inline constexpr size_t kMaxFdsPerPacket = 250;
inline constexpr size_t kMaxPacket = 64 * 1024;

// Whether `path` (--handover-socket) is a place only this agent's own can
// reach: an absolute path whose directory, and each directory above it, is
// owned by root or this agent's uid and writable by no one else (a sticky
// directory above, like /tmp, may be: no one else can move ours away), and
// not the pod's /dev/shm, which containerd and CRI-O bind into every
// container of the pod. INVALID_ARGUMENT naming the flag and the directory
// otherwise. A volume shared with another container is shared whatever
// its modes (an emptyDir is 0777, so it is refused): in a container, the
// place is the container's own /dev, a tmpfs of its own that the read-only
// root does not cover, reached from elsewhere only through
// /proc/PID/root of the agent (docs/SECURITY.md).
absl::Status checkSocketPlace(const std::string& path);

// The listening socket at `path` (a stale socket file is replaced; any
// other file there is an error), mode 0600.
absl::StatusOr<UniqueFd> listen(const std::string& path);
// Connected within `timeout` (a listener whose queue is full, or that
// never accepts, cannot hold the caller).
absl::StatusOr<UniqueFd> connect(const std::string& path,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(5));

// The peer's credentials; PERMISSION_DENIED, with the uid in the message,
// when it is neither root nor this process's effective uid.
absl::StatusOr<ucred> checkPeer(int sock);

// One message, with `fds` attached.
absl::Status send(int sock, const v1::HandoverMessage& message, std::span<const int> fds = {});
// One message; descriptors that came with it are appended to `fds`.
// DEADLINE_EXCEEDED after `timeout`, UNAVAILABLE when the peer closed.
absl::StatusOr<v1::HandoverMessage> receive(int sock, std::chrono::milliseconds timeout,
                                            std::vector<UniqueFd>* fds);

// The state in a sealed memfd, and back. fromMemfd() reads only a memfd
// sealed against writing, growing and shrinking (the sender cannot change
// what is being parsed), of exactly `size` bytes, at most `max_bytes`
// (checked before a byte is read or allocated: a sparse memfd costs its
// sender nothing). DATA_LOSS for a size other than `size`,
// RESOURCE_EXHAUSTED above `max_bytes`, PERMISSION_DENIED for a descriptor
// that is not a sealed memfd.
absl::StatusOr<UniqueFd> toMemfd(const std::string& bytes);
absl::StatusOr<std::string> fromMemfd(int fd, uint64_t size, uint64_t max_bytes);

// Each session's limits in an imported state within the bounds a client's
// Hello gets (protocol::clampLimits: frame size, windows, streams, pending
// requests, replay buffer, keepalive, grace, read size), and its receive
// windows, which are each side's own, within a window's ceiling and the
// default growth budget. A state an agent wrote holds them already.
void clampImportedLimits(v1::AgentState* state);

// Descriptors this process can still take in: the soft RLIMIT_NOFILE less
// those open and a reserve for serving (a state naming more is refused
// before any is received).
size_t descriptorRoom();

// A HandoverMessage holding only `refused` with `reason`.
v1::HandoverMessage refusal(std::string reason);

}  // namespace siphon::agent::handover
