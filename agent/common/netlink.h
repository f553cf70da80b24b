// The two system calls every netlink question of the agent makes (sock_diag
// dumps: the steal's socket destruction, a handover's capture ring), with
// EINTR retried and the failure named by `what`.
#pragma once

#include <chrono>
#include <cstddef>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent {

// Sends `size` bytes of one request to the kernel. A short send is
// INTERNAL; a failed one carries its errno.
absl::Status netlinkSend(int fd, const void* request, size_t size, std::string_view what);

// One recv() of netlink messages into `buf`: how many bytes came. A
// non-blocking socket is waited for, at most `wait` (UNAVAILABLE after it);
// a closed socket is INTERNAL.
absl::StatusOr<size_t> netlinkReceive(int fd, std::vector<char>& buf, std::string_view what,
                                      std::chrono::milliseconds wait = std::chrono::seconds(5));

}  // namespace siphon::agent
