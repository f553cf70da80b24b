// The remote file and directory handles of each session.
//
// A client never sees a host fd: it gets a handle, a small integer counted
// from 1 per session and never reused within it, so a stale handle (closed,
// or from another session) is always EBADF rather than some other open file.
// The objects behind handles are shared: a blocking job keeps the one it
// works on alive, so a close racing a pread never lets the pread run on a
// descriptor number the kernel has already handed to someone else; the fd
// closes when the last holder lets go.
#pragma once

#include <dirent.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/files/root_fs.h"
#include "siphon/v1/files.pb.h"

namespace siphon::agent::files {

// An open file of a session, in whichever FileSystem opened it
// (file_system.h): an fd of the agent (OpenFile) or a handle in the file
// helper (fs_helper.h). Thread-safe as the fd calls it makes are.
class FileObject {
 public:
  virtual ~FileObject() = default;  // releases it; an error is dropped
  // read, pread, write, pwrite, seek, fstat, ftruncate, fsync: the request as the
  // client sent it, its read size already clamped to `max_read`.
  virtual absl::StatusOr<v1::FileResponse> call(const v1::FileRequest& req, uint32_t max_read) = 0;
  // A pread whose bytes go into a pipe (root_fs.h, splicePreadFd), when
  // this object can do that; nullopt sends the caller to call().
  virtual absl::StatusOr<std::optional<PipedRead>> splicePread(int64_t /*offset*/,
                                                               uint32_t /*size*/) {
    return std::nullopt;
  }
  // The client's close, once no other request holds the object: its error
  // (EIO, ENOSPC on NFS...). Called at most once; the destructor then does
  // nothing more.
  virtual absl::Status close() = 0;
  // Handover (docs/CONTINUITY.md): a descriptor of this open file (the same
  // open file description: its offset and flags go with it), for a new
  // agent's FileSystem::adopt().
  virtual absl::StatusOr<UniqueFd> exportFd() = 0;
};

// An open directory of a session, read in batches (see OpenDir::read).
class DirObject {
 public:
  virtual ~DirObject() = default;
  // `with_stat`: each entry carries its lstat (readdirplus).
  virtual absl::StatusOr<v1::FileDirEntries> read(uint32_t max_entries, size_t max_bytes,
                                                  bool with_stat) = 0;
  // Handover: a descriptor of the directory placed at the first entry its
  // client has not been given yet (what was read ahead and kept is read
  // again from there), for a new agent's FileSystem::adopt().
  virtual absl::StatusOr<UniqueFd> exportFd() = 0;
};

// One open file of a session, an fd of this process.
struct OpenFile : FileObject {
  explicit OpenFile(UniqueFd f) : fd(std::move(f)) {}
  absl::StatusOr<v1::FileResponse> call(const v1::FileRequest& req, uint32_t max_read) override;
  absl::StatusOr<std::optional<PipedRead>> splicePread(int64_t offset, uint32_t size) override {
    return splicePreadFd(fd.get(), size, offset);
  }
  absl::Status close() override;
  absl::StatusOr<UniqueFd> exportFd() override;
  UniqueFd fd;
};

// One open directory of a session, read in batches. Thread-safe: two
// readdir requests on the same handle may run on two pool threads at once.
class OpenDir : public DirObject {
 public:
  // Takes `fd` (a directory opened O_RDONLY|O_DIRECTORY) of the tree under
  // `root_fd` (not kept; -1: unknown, see read()).
  static absl::StatusOr<std::shared_ptr<OpenDir>> create(UniqueFd fd, int root_fd = -1);
  ~OpenDir() override;
  OpenDir(const OpenDir&) = delete;
  OpenDir& operator=(const OpenDir&) = delete;

  // The next entries, in the kernel's order, "." and ".." included: at most
  // `max_entries`, and no more than about `max_bytes` of entries so the
  // answer fits one frame (at least one entry when there is one). eof is
  // set once the end has been reached: an entry that does not fit is kept
  // for the next call, so eof is exact. Names that are not valid UTF-8
  // (they travel in a proto3 string) have each bad run replaced by U+FFFD.
  //
  // `with_stat`: each entry's stat is fstatat(dir, name, AT_SYMLINK_NOFOLLOW)
  // (a symlink is described itself), taken when the entry is read; an entry
  // that vanished meanwhile has none. ".." of the root directory is the
  // root itself (as in a chroot: fstatat(root, "..") would describe the
  // host directory above it); ".." with the root unknown has no stat.
  absl::StatusOr<v1::FileDirEntries> read(uint32_t max_entries, size_t max_bytes,
                                          bool with_stat) override;
  // The directory's position goes back to the entry kept for the next
  // batch, if any (seekdir), so this object and the exported descriptor,
  // which share that position, both go on from there.
  absl::StatusOr<UniqueFd> exportFd() override;

 private:
  OpenDir(DIR* dir, bool is_root, bool root_known)
      : dir_(dir), is_root_(is_root), root_known_(root_known) {}
  // Sets or clears `e`'s stat (a pending entry may come from a read that
  // asked the other way).
  void fillStat(v1::DirEntry& e, const std::string& raw_name, bool with_stat) const;

  std::mutex mu_;
  DIR* dir_;
  const bool is_root_;     // the directory is the root itself
  const bool root_known_;  // create() was given the root
  std::optional<v1::DirEntry> pending_;
  std::string pending_raw_name_;  // its name as the kernel gave it
  long pending_pos_ = 0;          // telldir() before it was read
  bool eof_ = false;
};

using Handle = std::variant<std::shared_ptr<FileObject>, std::shared_ptr<DirObject>>;

// Handles per session id. Not thread-safe: the file service uses it on the
// event loop only.
class HandleTable {
 public:
  explicit HandleTable(size_t max_per_session) : max_per_session_(max_per_session) {}

  // Whether the session holds max_per_session handles already.
  bool full(const std::string& session) const;
  // A new handle for `h`. EMFILE when the session is full, the message
  // naming the limit and its flag (limitText()).
  absl::StatusOr<uint64_t> add(const std::string& session, Handle h);
  // The object behind a handle. EBADF when the session has no such handle,
  // or it is a directory (file()) / a file (dir()). `op` names the call in
  // the message ("pread fd 7: Bad file descriptor").
  absl::StatusOr<std::shared_ptr<FileObject>> file(const std::string& session, uint64_t handle,
                                                   std::string_view op) const;
  absl::StatusOr<std::shared_ptr<DirObject>> dir(const std::string& session, uint64_t handle,
                                                 std::string_view op) const;
  // Takes a handle out of the table (close, closedir); EBADF as above.
  absl::StatusOr<Handle> remove(const std::string& session, uint64_t handle, bool is_dir,
                                std::string_view op);
  // Every handle of the session, taken out (the session ended).
  std::vector<Handle> removeSession(const std::string& session);
  size_t count(const std::string& session) const;
  // Handles of every session.
  size_t total() const;
  // "open file and directory limit of N reached (siphon-agent
  // --max-open-files raises it)".
  std::string limitText() const;

  // Handover: a session's handles by number, and the number its next one
  // gets (numbers are never reused within a session, on any agent).
  struct Session {
    uint64_t next = 1;
    std::map<uint64_t, Handle> handles;
  };
  const std::map<std::string, Session>& sessions() const { return sessions_; }
  // A session's handles as another agent had them (none yet here).
  void restore(const std::string& session, Session handles) {
    sessions_[session] = std::move(handles);
  }

 private:
  const Handle* find(const std::string& session, uint64_t handle) const;

  size_t max_per_session_;
  std::map<std::string, Session> sessions_;
};

}  // namespace siphon::agent::files
