// Where the file service's system calls run: behind this interface, so the
// protocol logic (file_service.cc: --fs-mode, handles, limits) is the same
// whoever does the work.
//
// Two implementations:
//   LocalFileSystem  this process, through RootFs and fs_guard.h. The file
//                    helper serves with it, under the target's identity;
//                    the agent itself only in in-process tests
//                    (AgentConfig::fs_helper_exe empty).
//   HelperFileSystem (fs_helper.h) the requests go to the file helper
//                    process; what siphon-agent runs.
//
// Threads: every call blocks; run them on the blocking pool. Calls from
// several threads at once are fine.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/files/fs_guard.h"
#include "agent/files/handles.h"
#include "agent/files/root_fs.h"
#include "siphon/v1/files.pb.h"

namespace siphon::agent::files {

// The answer of an operation that succeeded with nothing to return.
inline v1::FileResponse doneResponse() {
  v1::FileResponse r;
  r.mutable_done();
  return r;
}

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // open or opendir: the object behind the new handle (a FileObject for
  // open, a DirObject for opendir).
  virtual absl::StatusOr<Handle> open(const v1::FileRequest& req) = 0;
  // stat, statfs, access, readlink, mkdir, rmdir, unlink, rename, truncate,
  // chmod, chown, utimens, symlink, link, mknod and the xattr calls.
  // `writes_refused`: --fs-mode ro (see RootFs::access).
  virtual absl::StatusOr<v1::FileResponse> path(const v1::FileRequest& req,
                                                bool writes_refused) = 0;
  // The target restarted as process `pid` (Target::adopt); the root fd
  // number it was made with names the new root already. What holds more
  // (a helper process with a copy of the old root) starts again.
  virtual void targetRestarted(pid_t pid) { (void)pid; }
  // Handover (docs/CONTINUITY.md): the object behind a handle another
  // agent exported (FileObject/DirObject::exportFd) and this one takes on:
  // a directory (`dir`) reads on from the descriptor's position.
  virtual absl::StatusOr<Handle> adopt(UniqueFd fd, bool dir) = 0;

  // File watches (file_watches.h). A new inotify instance (non-blocking,
  // close-on-exec) made with this file system's identity: the kernel
  // charges an instance, and every watch later added to it by anyone, to
  // the user that made it (inotify_init1 takes the caller's user for the
  // group; fs.inotify.max_user_instances and max_user_watches are per
  // user), so the file helper's are the target's user's, not uid 0's.
  // EMFILE (a refusal naming the sysctl) when that user has none left.
  virtual absl::StatusOr<UniqueFd> newWatchInstance() = 0;
  // Watches `path`, resolved in the root with this file system's identity,
  // in `instance` (not owned) with `mask`: the watch goes on the very object
  // that resolution reached (inotify_add_watch follows /proc/self/fd/N to
  // the resolved descriptor; nothing looks the path up again), and the
  // kernel checks this identity's read permission on it (EACCES). The
  // watch descriptor (the same for an object the instance watches
  // already). ENOSPC (a refusal naming the sysctl) when the instance's
  // user has no watch left.
  virtual absl::StatusOr<int> addWatch(int instance, const std::string& path, uint32_t mask) = 0;
};

// The calls in this process, on paths under `root_fd` (not owned; it must
// outlive the object), every open checked by fs_guard.h.
class LocalFileSystem : public FileSystem {
 public:
  LocalFileSystem(int root_fd, GuardOptions guard)
      : root_fd_(root_fd), root_(root_fd), guard_(guard) {}
  absl::StatusOr<Handle> open(const v1::FileRequest& req) override;
  absl::StatusOr<v1::FileResponse> path(const v1::FileRequest& req, bool writes_refused) override;
  absl::StatusOr<Handle> adopt(UniqueFd fd, bool dir) override;
  absl::StatusOr<UniqueFd> newWatchInstance() override;
  absl::StatusOr<int> addWatch(int instance, const std::string& path, uint32_t mask) override;

 private:
  // RootFs::open with the guard's checks before and after.
  absl::StatusOr<UniqueFd> guardedOpen(std::string_view path, int flags, uint32_t mode,
                                       bool dir) const;

  int root_fd_;
  RootFs root_;
  GuardOptions guard_;
};

}  // namespace siphon::agent::files
