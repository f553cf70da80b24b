// The descriptors a child of siphon's starts with (issue 40): only those it
// is meant to have. siphon's own descriptors are not close-on-exec (Asio
// makes its sockets without SOCK_CLOEXEC), so a child that simply execs
// inherits siphon's connection to the agent (the session's frames, without
// TLS), sockets of this machine's network namespace (a way out of the
// program's), the FUSE device: a child gets 0, 1 and 2 and what it is
// given by name, and nothing is chased one socket at a time.
//
// Both calls are async-signal-safe (no allocation, system calls only): for a
// child between fork and exec of a process with other threads.
#pragma once

#include <cstddef>

namespace siphon::exec {

// At most this many descriptors are kept by name (--keep-fd and the
// child's own).
inline constexpr size_t kMaxKeptDescriptors = 64;

enum class FdAction {
  kClose,        // every other descriptor from 3 up is closed
  kCloseOnExec,  // every other one is marked close-on-exec; `keep` are made inheritable
};

// Every descriptor from 3 up but those in `keep` (numbers below 3 and
// repeats are ignored): closed, or marked close-on-exec. close_range(2) for
// the gaps between the kept ones (CLOSE_RANGE_CLOEXEC for kCloseOnExec);
// where the kernel has no close_range (before 5.9) or no
// CLOSE_RANGE_CLOEXEC (before 5.11), each entry of /proc/self/fd (read
// with getdents64); without /proc, every number below RLIMIT_NOFILE.
// Returns 0, EINVAL for more than kMaxKeptDescriptors, else the errno of a
// kept descriptor that could not be made inheritable (EBADF: not open).
int keepOnlyDescriptors(const int* keep, size_t n, FdAction action);

// The same by one way, for tests of each: close_range, the /proc listing,
// or every number.
enum class FdMethod { kCloseRange, kListing, kEveryNumber };
int keepOnlyDescriptorsForTest(const int* keep, size_t n, FdAction action, FdMethod method);

}  // namespace siphon::exec
