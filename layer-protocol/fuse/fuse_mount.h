// `siphon fs mount`: the target's files as a local FUSE file system, on the
// client library (siphon/client/files.h). libfuse3's low-level API, driven
// from the Client's event loop: the /dev/fuse descriptor is waited on with
// Asio, each kernel request is read and dispatched there, and each operation
// runs as a coroutine that answers the kernel (fuse_reply_*) when the
// agent's answer comes, so many requests are in flight at once and no
// thread blocks on the network.
//
// What the kernel sees:
//  - node ids from an InodeTable (fuse/inode_table.h): one per file (a
//    hard-linked file's names are one node), paths rebuilt from (parent,
//    name); st_ino is the target's inode number, so tools see the target's
//    identities;
//  - the target's uid, gid, mode, sizes and times as the agent's lstat gives
//    them (a symlink's size too: its text's length in the target); symlinks
//    are symlinks. A relative link's text is the target's. An absolute one
//    is answered as a path inside the mount, so that following it never
//    reaches this machine's own files: under the mounted directory,
//    MOUNTPOINT/rest; outside it, MOUNTPOINT/.siphon-outside-mount/TEXT,
//    which does not resolve;
//  - attributes and entries cached for `attr_timeout`; a file's pages kept
//    between opens while its size and mtime are unchanged;
//  - reads and writes split into the agent's largest request and sent
//    together; the kernel sends up to 1 MiB per request (max_read,
//    max_write) and reads ahead.
//
// Errors: the agent's errno as it is; work lost with the agent (a failed
// session, a handle of a session that is gone) EIO, never a hang past the
// client's call timeout, and never a handle reopened behind the program.
// A read-only mount is mounted "ro" (the kernel answers EROFS); a
// read-only agent answers EROFS whatever the mount says.
//
// Threads: the Target's executor only.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "siphon/client/files.h"
#include "siphon/client/target.h"
#include "siphon/transport/asio.h"

struct fuse_session;

namespace siphon::fuse {

class InodeTable;

struct MountOptions {
  std::string mountpoint;
  std::string remote_dir = "/";  // inside the target's root
  bool read_only = false;
  std::chrono::milliseconds attr_timeout{1000};
  bool debug = false;  // libfuse's request log on stderr
  // serve() ends once the mount is gone from this process's mount
  // namespace (fusermount3 -u, umount), though a copy of it lives on in
  // another namespace (one made while it was mounted), whose unmount alone
  // would end the kernel's connection; a lazy unmount's open files are
  // served until closed. false: it serves while any copy lives (siphon
  // exec's staging mount, detached here once the program's namespace
  // holds it).
  bool end_on_unmount_here = true;
};

// A mountpoint a mount can use: an existing, empty directory that is not a
// mount already. INVALID_ARGUMENT / FAILED_PRECONDITION say which. With
// `reclaimed`, a siphon mount left there by a siphon that is gone (it
// answers ENOTCONN: killed while fusermount3 could not unmount it) is
// unmounted (lazily, as fusermount3's auto_unmount would have) and
// *reclaimed says so; any other FUSE mount whose server is gone is an
// error that says how to unmount it.
absl::Status checkMountpoint(const std::string& path, std::string* reclaimed = nullptr);

// Unmounts the mount at the absolute path `abs` lazily (MNT_DETACH): root
// directly, a user through `fusermount3 -u -z`, which lets a user unmount
// only the user's own mounts (started with 0, 1 and 2 only).
absl::Status detachMount(const std::string& abs);

class FuseMount {
 public:
  // Mounts `options.mountpoint` (checked with checkMountpoint first) for
  // the target's `options.remote_dir`, which the caller checked is a
  // directory. The kernel mount goes through fusermount3 (auto_unmount
  // needs it, as root too); a user's works where the system lets users
  // mount FUSE, and checkUserMount says what is missing otherwise.
  static absl::StatusOr<std::unique_ptr<FuseMount>> mount(client::Target target,
                                                          MountOptions options);
  ~FuseMount();
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  // Serves the kernel's requests until the mount goes (fusermount3 -u,
  // umount) or stop(); then waits for the operations in flight and
  // unmounts. OK when it ended by either.
  net::awaitable<absl::Status> serve();
  // Has the agent watch the mounted directory (fuse_watch.cc) before
  // anything is served, so its names are kept for long from the first
  // listing on. Optional (serve() watches it otherwise, a moment later);
  // a refusal leaves the mount on its attribute timeout.
  net::awaitable<void> watchRoot();
  // Ends serve() (from a signal handler's completion, say).
  void stop();

  const MountOptions& options() const { return options_; }

  // The operations' side (fuse_mount.cc, fuse_ops.cc).
  struct Impl;

 private:
  explicit FuseMount(std::unique_ptr<Impl> impl, MountOptions options);
  std::unique_ptr<Impl> impl_;
  MountOptions options_;
};

}  // namespace siphon::fuse
