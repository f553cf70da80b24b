// What no file request may open, whoever's identity serves it: checks on the
// opened fd itself (fstat, fstatfs, the procfs inode it names), never on the
// client's path string alone, since a path reaches /proc through any symlink
// the target planted.
//
// Refused with EACCES:
//   - a character or block device other than null, zero, full, random and
//     urandom (1:3, 1:5, 1:7, 1:8, 1:9): whoever serves files is not in the
//     target's devices cgroup, so the kernel would not stop /dev/mem-like
//     nodes the target made itself;
//   - a procfs `mem` (of any process or thread) opened for writing: nothing
//     written through files may reach a process's memory;
//   - a per-process procfs entry (/proc/PID/..., /proc/PID/task/TID/...,
//     reached as /proc/self, /proc/thread-self or a number) outside a short
//     list of descriptive ones (stat, status, cmdline, comm, ...), of the
//     process that serves the request, or of every process when
//     `all_processes` is set (--fs-identity root, targetless: powers that
//     are not the target's own must not read anyone's memory, environment,
//     maps or fds); and any write to such an entry.
// A procfs object the check cannot place (in a procfs instance other than
// the target's /proc) is refused, except a descriptive per-process entry.
//
// Threads: pure system calls on the given fds; any thread.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace siphon::agent::files {

struct GuardOptions {
  bool all_processes = false;
};

// Before an open: `pathfd` is an O_PATH fd of what the open will reach (its
// final symlink followed unless the open has O_NOFOLLOW). A device outside
// the list is refused here, so its open() never runs.
absl::Status checkBeforeOpen(int pathfd, std::string_view path);

// After an open of `path` with `flags` (the open(2) flags) under `root_fd`.
absl::Status checkOpened(int fd, int flags, int root_fd, std::string_view path,
                         const GuardOptions& options);

// Whether a per-process `entry` may be read by a process other than its
// owner's peers (descriptive files only).
bool isDescriptiveProcEntry(std::string_view entry);

}  // namespace siphon::agent::files
