// The one way the agent opens a path inside a target's root: openat2(root_fd,
// path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS). "/" and ".." stop at
// root_fd, absolute symlinks are taken relative to it, and procfs magic
// links (/proc/self/root, /proc/PID/fd/N) fail with ELOOP; the kernel checks
// this during the walk itself. Used by the file service (agent/files/
// root_fs.h), DNS (resolv.conf, hosts) and unix sockets (agent/outgoing/
// address.cc).
//
// openat2 answers EAGAIN when a rename or mount anywhere on the system may
// have moved the walk, and EINTR on a signal: both are retried, at most
// kMaxRootPathAttempts times in all, so a target that renames in a tight loop
// cannot hold a thread forever (the caller then gets EAGAIN).
//
// Threads: any; blocking (file-system I/O).
#pragma once

#include <linux/openat2.h>
#include <sys/types.h>

#include <cstddef>
#include <string_view>

#include "agent/common/unique_fd.h"

namespace siphon::agent {

inline constexpr int kMaxRootPathAttempts = 64;

// The system call, replaceable in tests: returns the fd or -1 with errno.
using Openat2Fn = long (*)(int dirfd, const char* path, const struct open_how* how, size_t size);

// openat2 of `path` under `root_fd` with `flags` (O_CLOEXEC added) and
// `mode`. Returns 0 and sets `out`, or the errno: EINVAL for a path holding
// a NUL byte, ENOENT for an empty one. `openat2` null: the real call.
int openInRoot(int root_fd, std::string_view path, int flags, mode_t mode, UniqueFd* out,
               Openat2Fn openat2 = nullptr);

}  // namespace siphon::agent
