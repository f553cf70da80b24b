// The handover socket (docs/CONTINUITY.md, "Handover"): the unix socket
// over which a new agent process takes over a running one. One
// siphon.v1.HandoverMessage per packet (SOCK_SEQPACKET), descriptors on
// packets as SCM_RIGHTS, the state itself in a memfd (it can be larger than
// any packet: the sessions' replay buffers).
//
// Only root or the agent's own uid may use it: the socket file is 0600 and
// each side checks the other's SO_PEERCRED.
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

// The listening socket at `path` (a stale socket file is replaced; any
// other file there is an error), mode 0600.
absl::StatusOr<UniqueFd> listen(const std::string& path);
absl::StatusOr<UniqueFd> connect(const std::string& path);

// The peer's credentials; PERMISSION_DENIED, with the uid in the message,
// when it is neither root nor this process's effective uid.
absl::StatusOr<ucred> checkPeer(int sock);

// One message, with `fds` attached.
absl::Status send(int sock, const v1::HandoverMessage& message, std::span<const int> fds = {});
// One message; descriptors that came with it are appended to `fds`.
// DEADLINE_EXCEEDED after `timeout`, UNAVAILABLE when the peer closed.
absl::StatusOr<v1::HandoverMessage> receive(int sock, std::chrono::milliseconds timeout,
                                            std::vector<UniqueFd>* fds);

// The state in a sealed memfd, and back.
absl::StatusOr<UniqueFd> toMemfd(const std::string& bytes);
absl::StatusOr<std::string> fromMemfd(int fd, uint64_t size);

// A HandoverMessage holding only `refused` with `reason`.
v1::HandoverMessage refusal(std::string reason);

}  // namespace siphon::agent::handover
