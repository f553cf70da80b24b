// Running a program to completion with its output captured, optionally
// inside a network namespace: how the iptables backend drives
// iptables-restore/-save in the target's netns without moving the agent,
// and how containerd is asked through siphon-containerd.
//
// Threads: any thread; blocks until the program exits (or the deadline).
// Safe in a multithreaded process: everything the child needs is built
// before fork(), and the child makes only async-signal-safe calls.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent {

struct ExecResult {
  int exit_code = -1;  // 128+N when killed by signal N
  std::string out;
  std::string err;
};

struct ExecOptions {
  // setns(netns_fd, CLONE_NEWNET) in the child before exec; -1: ours.
  int netns_fd = -1;
  // The program is killed past it (an iptables waiting forever on the
  // xtables lock must not wedge the agent).
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // The capabilities the program gets (ambient; the agent runs with
  // SECBIT_NOROOT, so exec'ing as root gives nothing else):
  // caps::kIptablesAmbient, what iptables needs; false: none (a helper
  // that needs only the agent's uid, such as siphon-containerd).
  bool iptables_capabilities = true;
};

// Runs argv[0] (an absolute path) with `input` on its stdin and a minimal
// environment (PATH, LC_ALL=C, and the agent's XTABLES_LOCKFILE when set),
// its other descriptors closed. A non-zero
// exit is a result, not an error; errors are failures to run it at all:
// INTERNAL (fork, pipes), the errno of setns/exec ("setns: ...",
// "exec /usr/sbin/x: No such file or directory"), DEADLINE_EXCEEDED.
absl::StatusOr<ExecResult> execCapture(const std::vector<std::string>& argv, std::string_view input,
                                       const ExecOptions& options = {});

// execCapture() that wants exit 0: its stdout, or an error naming the
// program, its exit code and stderr ("iptables-nft-restore: exit 1: line 2
// failed: ..."), code INTERNAL.
absl::StatusOr<std::string> execChecked(const std::vector<std::string>& argv,
                                        std::string_view input, const ExecOptions& options = {});

// The absolute path of an installed tool ("iptables-nft-restore") found in
// the sbin and bin directories, or "" when none is executable.
std::string findTool(std::string_view name);

}  // namespace siphon::agent
