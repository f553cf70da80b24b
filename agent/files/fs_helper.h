// The file helper: a separate process that does the file service's system
// calls with the target's identity, never with the agent's powers.
//
// Why a process: a thread of the agent that only changed its credentials is
// still the agent (its /proc/self is the agent's memory, environment and
// fds), and a fork() without exec would copy the TLS key and the sessions'
// resume tokens. So the agent exec's its own binary
// (`siphon-agent fs-helper ...`, AgentConfig::fs_helper_exe) with an EMPTY
// environment and only these descriptors:
//   0, 1   /dev/null;  2  the agent's stderr (the helper's fatal errors);
//   3      the target's root (O_PATH directory);
//   4...   one end of kConnections socketpairs.
// Before it reads a request the helper takes the identity (takeIdentity):
// setgroups, setresgid, setresuid to the target's ids (--fs-identity
// target: read by the agent while the target's pidfd pins it, just before
// the start, Target::identity; no helper starts while the target is down),
// or uid/gid 0 (root); capset to the target's capabilities among
// the file ones (CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID; all
// of those with root), which also drops CAP_SETUID/SETGID for good;
// PR_SET_NO_NEW_PRIVS; PR_SET_DUMPABLE 0 (the target's processes, same uid,
// cannot ptrace it and use its sockets). Then it starts one thread per
// connection (after the identity: credentials are per thread) and serves
// them with a LocalFileSystem (fs_guard.h checks every open).
//
// Wire (each socketpair, SOCK_STREAM, little-endian): the helper first
// writes 'R' (ready) or 'E' + a message, then answers requests one at a
// time:
//   request  u32 length | u8 kind | u32 aux | u64 handle | FileRequest
//   answer   u32 length | u8 ok   | u64 handle | FileResponse or Error
// (length counts what follows it). Handles are the helper's own numbers.
// A descriptor may ride on a frame's first bytes (SCM_RIGHTS): an open's
// answer carries the file's when the agent may read it itself; for a
// handover (docs/CONTINUITY.md) an export's answer carries the handle's
// and an adopt's request a descriptor the new helper takes as a handle;
// for file watches (file_watches.h) a new inotify instance's answer
// carries the instance (made here: charged to the helper's user) and a
// watch's request the session's instance, to which the helper adds the
// watch on the object it resolved itself.
//
// A helper that dies or answers garbage is killed; the call that saw it and
// every handle it held answer EIO/EBADF with a message saying so, and the
// next call starts a new helper (logged as fs_helper_started/fs_helper_lost).
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/files/file_system.h"
#include "agent/server/config.h"
#include "agent/target/target.h"

namespace siphon::agent {
struct ServiceContext;
}

namespace siphon::agent::files {

inline constexpr std::string_view kFsHelperCommand = "fs-helper";
inline constexpr int kHelperConnections = 4;

struct HelperOptions {
  std::string exe;   // a binary whose main() runs fsHelperMain for kFsHelperCommand
  int root_fd = -1;  // not owned
  FsIdentity identity = FsIdentity::kTarget;
  // The target's identity (Target::identity: read while its pidfd pins
  // it), asked at each start: its credentials for kTarget, its user
  // namespace for both. An error (the target is down between a restart
  // and its adoption: EAGAIN) is the call's answer, and no helper starts.
  // Null: targetless, the agent's own uid and gids with no capabilities.
  std::function<absl::StatusOr<TargetIdentity>()> target;
  bool all_processes = false;  // GuardOptions::all_processes
};

// The file system of the file helper. Calls start the helper when none
// runs; an error starting it is the call's answer.
std::shared_ptr<FileSystem> makeHelperFileSystem(HelperOptions options);

// What the file service uses for `ctx`: the helper (ctx.config.fs_helper_exe
// set), else a LocalFileSystem on the target's root.
std::shared_ptr<FileSystem> makeFileSystem(ServiceContext& ctx);

// `siphon-agent fs-helper ...` (main.cc). Returns the exit code.
int fsHelperMain(int argc, char** argv);

}  // namespace siphon::agent::files
