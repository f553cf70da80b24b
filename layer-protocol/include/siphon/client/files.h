// Files of the target, under its root (the agent resolves every path with
// openat2 RESOLVE_IN_ROOT: no ".." or symlink leaves it). Failures are
// kErrno statuses with the Linux errno (errors.h): ENOENT, EACCES, EROFS
// (an agent run with --fs-mode ro), EMFILE (its --max-open-files)...
//
// A File or Directory is a handle on the agent that belongs to the session
// that opened it: it dies with that session. After a failover to another
// agent, or once the session is lost, every call on it answers EBADF (its
// message names the agent); it is never reopened behind the program's back.
// alive() says so without a round trip. A handle not closed is closed when
// its last copy goes (without waiting for the answer).
//
// Pipelining: startPread()/startPwrite() (and Files::startStat()/
// startLstat()) queue their request at once and return a Pending answer, so
// many can be in flight (readFile() and writeFile() keep `depth` of them).
// Plain read()/write() use the file offset: have one of those in flight at a
// time.
//
// Threads: as the Target's (target.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/client/pending.h"
#include "siphon/client/target.h"
#include "siphon/protocol/piped_bytes.h"

namespace siphon::client {

struct FileStat {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint32_t mode = 0;  // st_mode: type and permission bits
  uint64_t nlink = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t rdev = 0;
  int64_t size = 0;
  int64_t blksize = 0;
  int64_t blocks = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool isDirectory() const;
  bool isRegular() const;
  bool isSymlink() const;
};

struct FsStat {
  uint64_t type = 0, bsize = 0, blocks = 0, bfree = 0, bavail = 0, files = 0, ffree = 0,
           namelen = 0, frsize = 0, flags = 0;
};

struct DirEntry {
  std::string name;
  uint64_t ino = 0;
  uint32_t type = 0;  // DT_* value
  // Directory::nextBatchPlus only: the entry's lstat (a symlink described
  // itself), taken by the agent as it read the entry. Absent when the entry
  // vanished meanwhile, and from an agent too old to send stats.
  std::optional<FileStat> stat;
};

// One answer of a directory read: at most the entries asked for, and
// whether they reach the end of the directory (the agent says so exactly:
// no further read is needed to learn it).
struct DirBatch {
  std::vector<DirEntry> entries;
  bool eof = false;
};

// What a read returned: the bytes, and whether the end of the file was seen.
// A read started with `piped` (startPread) may have its bytes in two parts:
// `data`, then those in `piped` (a pipe the caller splices on, or reads
// with PipedBytes::materialize()). size() counts both.
struct FileData {
  std::string data;
  bool eof = false;
  std::shared_ptr<protocol::PipedBytes> piped;
  size_t size() const { return data.size() + (piped ? piped->size() : 0); }
};

struct HandleState;

class File {
 public:
  File() = default;
  // This client's number for the handle (also in the agent's logs).
  uint64_t handle() const;
  // OK while the handle can be used; EBADF once closed or its session lost.
  absl::Status alive() const;

  net::awaitable<absl::StatusOr<FileData>> read(uint32_t size);
  net::awaitable<absl::StatusOr<FileData>> pread(int64_t offset, uint32_t size);
  net::awaitable<absl::StatusOr<uint64_t>> write(std::string data);
  net::awaitable<absl::StatusOr<uint64_t>> pwrite(int64_t offset, std::string data);
  // With `piped`, a large answer's bytes may stay in a pipe (FileData):
  // over plain TCP the agent splices the file's pages into the socket and
  // the client splices them out, so neither copies them.
  Pending<FileData> startPread(int64_t offset, uint32_t size, bool piped = false);
  Pending<uint64_t> startPwrite(int64_t offset, std::string data);
  net::awaitable<absl::StatusOr<int64_t>> seek(int64_t offset, int whence);
  net::awaitable<absl::StatusOr<FileStat>> stat();
  net::awaitable<absl::Status> truncate(int64_t length);
  // fsync(2), or fdatasync(2) with `datasync`. An agent run read-only
  // answers OK without the call (its handles are all open for reading).
  net::awaitable<absl::Status> fsync(bool datasync);
  net::awaitable<absl::Status> close();

 private:
  friend class Files;
  explicit File(std::shared_ptr<HandleState> state) : state_(std::move(state)) {}
  std::shared_ptr<HandleState> state_;
};

class Directory {
 public:
  Directory() = default;
  uint64_t handle() const;
  absl::Status alive() const;
  // The next entries (at most `max_entries`, 0: the agent's choice); an
  // empty vector at the end.
  net::awaitable<absl::StatusOr<std::vector<DirEntry>>> next(uint32_t max_entries = 0);
  // The same, with the agent's end-of-directory flag: a listing can stop at
  // the batch that has `eof` rather than ask once more.
  net::awaitable<absl::StatusOr<DirBatch>> nextBatch(uint32_t max_entries = 0);
  // nextBatch with each entry's lstat (DirEntry::stat) in the same answer
  // ("readdirplus": no lstat per entry). An agent that predates it answers
  // as nextBatch does: entries without stat, which the caller then lstats.
  net::awaitable<absl::StatusOr<DirBatch>> nextBatchPlus(uint32_t max_entries = 0);
  net::awaitable<absl::Status> close();

 private:
  friend class Files;
  explicit Directory(std::shared_ptr<HandleState> state) : state_(std::move(state)) {}
  std::shared_ptr<HandleState> state_;
};

// What a watch saw (Files::watch), merged over a few milliseconds.
struct FileChange {
  uint64_t watch = 0;
  // The entry of the watched directory (as readdir names it); empty: the
  // watched object itself.
  std::string name;
  bool content = false;     // written
  bool attributes = false;  // mode, owner, times, link count
  bool created = false;     // made or moved in
  bool removed = false;     // removed or moved out
  // The watch is over (its object removed, moved away, unmounted): no
  // more changes come for it, and it needs no unwatch.
  bool watch_ended = false;
};

struct FileChanges {
  std::vector<FileChange> changes;
  // Changes were missed: the agent's queue overflowed (`overflow`), or the
  // session moved to another agent or the target restarted with a new root
  // (`watches_lost`: every watch is gone or watches the old files; watch
  // again). Whatever was watched may have changed.
  bool overflow = false;
  bool watches_lost = false;
};

class Files {
 public:
  explicit Files(const Target& target);

  // open(2) flags and mode (O_RDONLY is 0). A mode (O_CREAT, O_TMPFILE),
  // like mkdir's and mknod's, is made as given: the agent applies no umask.
  net::awaitable<absl::StatusOr<File>> open(std::string path, int flags = 0, uint32_t mode = 0);
  net::awaitable<absl::StatusOr<Directory>> openDirectory(std::string path);
  // The largest read (read, pread) one request may carry on the current
  // session: the agent's --max-read-size. A larger one is answered short.
  // Writes of this size fit in a frame too.
  uint32_t maxReadSize() const;
  // The size a sequential reader's reads are best of: maxReadSize() in
  // whole pages (when it is one or more), so each read starts on a page and
  // the agent can splice it (a read that straddles one page more than its
  // pipe holds is copied instead).
  uint32_t readChunk() const;

  // Every entry of the directory at `path` ("." and ".." too, as the kernel
  // lists them).
  net::awaitable<absl::StatusOr<std::vector<DirEntry>>> readdir(std::string path);
  // The same, with each entry's lstat when `with_stat` (as nextBatchPlus),
  // in as few round trips as the agent allows: its opendir answer carries
  // the first kListBatch entries and, when that is all, has closed the
  // directory already (one round trip); otherwise batches follow.
  net::awaitable<absl::StatusOr<std::vector<DirEntry>>> list(std::string path, bool with_stat);
  static constexpr uint32_t kListBatch = 4096;

  // The whole file: preads `chunk` bytes each (0: readChunk()),
  // `depth` of them in flight.
  net::awaitable<absl::StatusOr<std::string>> readFile(std::string path, size_t depth = 8,
                                                       uint32_t chunk = 0);
  // Creates or truncates `path`, then pwrites `data`, `depth` in flight.
  net::awaitable<absl::Status> writeFile(std::string path, std::string data, uint32_t mode = 0644,
                                         size_t depth = 8);

  net::awaitable<absl::StatusOr<FileStat>> stat(std::string path);
  net::awaitable<absl::StatusOr<FileStat>> lstat(std::string path);
  // stat()/lstat() queued at once (pipelining, above): many paths in flight.
  Pending<FileStat> startStat(std::string path);
  Pending<FileStat> startLstat(std::string path);
  net::awaitable<absl::StatusOr<FsStat>> statfs(std::string path);
  net::awaitable<absl::Status> access(std::string path, int mode);
  net::awaitable<absl::StatusOr<std::string>> readlink(std::string path);
  net::awaitable<absl::Status> mkdir(std::string path, uint32_t mode = 0755);
  net::awaitable<absl::Status> rmdir(std::string path);
  net::awaitable<absl::Status> unlink(std::string path);
  net::awaitable<absl::Status> rename(std::string from, std::string to, uint32_t flags = 0);
  net::awaitable<absl::Status> truncate(std::string path, int64_t length);
  net::awaitable<absl::Status> chmod(std::string path, uint32_t mode);
  net::awaitable<absl::Status> chown(std::string path, int64_t uid, int64_t gid,
                                     bool follow_symlinks = true);
  net::awaitable<absl::Status> utimens(std::string path, int64_t atime_ns, int64_t mtime_ns,
                                       bool follow_symlinks = true);

  // Creates `linkpath` -> `target`; the target text is stored verbatim (an
  // absolute one resolves inside the target's root when followed).
  net::awaitable<absl::Status> symlink(std::string target, std::string linkpath);
  // A hard link `newpath` to `existing`; a symlink at `existing` is linked
  // itself, never followed. EXDEV across file systems, EPERM for a
  // directory.
  net::awaitable<absl::Status> link(std::string existing, std::string newpath);
  // A regular file (type 0 or S_IFREG), FIFO (S_IFIFO) or socket (S_IFSOCK)
  // with `mode`'s permission bits (as given: the agent applies no umask);
  // `rdev` is not used. S_IFCHR/S_IFBLK: EPERM, the agent makes no device
  // nodes.
  net::awaitable<absl::Status> mknod(std::string path, uint32_t mode, uint64_t rdev);

  // Extended attributes. Names at most 255 bytes (ERANGE), values at most
  // 64 KiB (E2BIG), and an answer no larger than maxReadSize() (E2BIG).
  // follow_symlinks false acts on a final symlink itself (l*xattr). Errnos:
  // ENODATA (no such attribute), ENOTSUP (the file system has none), EPERM
  // (user.* on a symlink or special file), EEXIST / ENODATA for
  // XATTR_CREATE / XATTR_REPLACE; setxattr and removexattr EROFS on an
  // agent run read-only.
  net::awaitable<absl::StatusOr<std::string>> getxattr(std::string path, std::string name,
                                                       bool follow_symlinks = false);
  net::awaitable<absl::StatusOr<std::vector<std::string>>> listxattr(std::string path,
                                                                     bool follow_symlinks = false);
  // flags: 0, XATTR_CREATE or XATTR_REPLACE (<sys/xattr.h>).
  net::awaitable<absl::Status> setxattr(std::string path, std::string name, std::string value,
                                        int flags, bool follow_symlinks = false);
  net::awaitable<absl::Status> removexattr(std::string path, std::string name,
                                           bool follow_symlinks = false);

  // Watches (the agent's inotify, FEATURE_FILE_WATCH): the changes of
  // `path` (a directory's: of its entries, by name, and its own) go to the
  // changes handler. The watch's id; watching one object twice answers the
  // same id, and takes two unwatches. A watch belongs to its session, as a
  // handle: after a failover it is gone (FileChanges::watches_lost).
  // EACCES when the agent's identity cannot read `path`; an agent without
  // watches answers INVALID_ARGUMENT.
  net::awaitable<absl::StatusOr<uint64_t>> watch(std::string path);
  net::awaitable<absl::Status> unwatch(uint64_t watch);
  // Where every watch's changes go, on the Target's executor: one handler
  // per Target (a later one replaces it; nullptr drops them).
  void setChangesHandler(std::function<void(const FileChanges&)> handler);

 private:
  std::shared_ptr<TargetCore> core_;
};

}  // namespace siphon::client
