// The inside of a FuseMount (fuse_mount.h): what the operations share.
// Private to layer-protocol/fuse/.
#pragma once

#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fuse/fuse_mount.h"
#include "fuse/inode_table.h"
#include "siphon/client/client.h"
#include "siphon/client/files.h"
#include "siphon/client/target.h"
#include "siphon/transport/asio.h"

namespace siphon::fuse {

// The largest read and write the kernel sends (max_read, max_write): 1 MiB,
// or less so that one kernel read is one agent read (ioSize).
inline constexpr uint32_t kMaxIo = 1 << 20;
// kMaxIo, or the agent's read limit rounded down to whole pages when that
// is smaller (the default limit is 1 MiB less a frame's headroom: a 1 MiB
// read would be two agent reads, one of 1 KiB, and a copy to join them).
uint32_t ioSize(uint32_t agent_max_read);
// The read size of a mount that splices when no pipe holds a whole kMaxIo.
inline constexpr uint32_t kSpliceIo = 512 * 1024;
// The mount's readahead: four reads (with splice, 2 MiB of kSpliceIo
// reads measured 1,230-1,420 MB/s against 1,190-1,200 for 4 MiB).
constexpr uint32_t readaheadBytes(uint32_t io) { return 4 * io; }
// Whether this process can have a pipe that holds a read of `io` bytes
// with libfuse's header pages (what its splice write needs).
bool pipeHoldsRead(uint32_t io);
// Where an absolute symlink that leaves the mounted directory points.
inline constexpr const char* kOutsideMount = ".siphon-outside-mount";

struct OpenFile {
  client::File file;
  uint64_t node = 0;
};

struct OpenDir {
  client::Directory dir;
  // The whole listing, read at opendir: offsets into it stay valid while
  // the program reads (telldir/seekdir), whatever the target does meanwhile.
  std::vector<client::DirEntry> entries;
};

// What a node's content looked like when it was last opened: its pages are
// kept (keep_cache) while these are unchanged.
struct ContentStamp {
  int64_t size = -1;
  int64_t mtime_ns = -1;
};

// One invalidation notice for the kernel: an entry (parent, name), or a
// node's attributes (off < 0) or attributes and pages from `off`, `len`
// bytes (0: to the end).
struct Notice {
  bool entry = false;
  uint64_t ino = 0;
  int64_t off = 0;
  int64_t len = 0;
  std::string name;
};

// Sends notices from its own thread (fuse_watch.cc): the kernel may hold a
// notice until pages being read are unlocked, which takes the event loop's
// answers, so the loop never sends one itself.
class Notifier {
 public:
  explicit Notifier(struct fuse_session* se);
  ~Notifier();  // joins; the session must still exist
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  void push(Notice n);
  // No more notices: the queued ones are dropped, and `idle` runs (on the
  // notifier's thread, or here when it is idle now) once none is being
  // sent. A later push() is dropped.
  void quiesce(std::function<void()> idle);
  uint64_t sent() const;

 private:
  void run();

  struct fuse_session* se_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Notice> queue_;
  std::function<void()> on_idle_;
  bool busy_ = false;
  bool quiescing_ = false;
  bool stop_ = false;
  uint64_t sent_ = 0;
  std::thread thread_;  // last: starts once the rest is made
};

// A directory's listing that lookups are answered from (fuse_ops.cc).
struct Listing {
  std::unordered_map<std::string, std::optional<client::FileStat>> stats;
  std::chrono::steady_clock::time_point at;
  int misses = 0;       // lookups that went to the agent meanwhile
  bool loading = false;
  bool ready = false;
};

// The last lookup that failed for want of the agent (fuse_ops.cc).
struct FailedLookup {
  uint64_t parent = 0;
  std::string name;
  std::chrono::steady_clock::time_point at;
};

struct FuseMount::Impl {
  Impl(client::Target target, MountOptions options);
  ~Impl();

  client::Target target;
  client::Files files;
  InodeTable table;
  net::asio::posix::stream_descriptor fd;
  struct fuse_session* se = nullptr;
  struct fuse_buf buf {};
  bool mounted = false;

  std::string mountpoint;
  std::string mount_path;  // mountpoint made absolute before the mount (raiseReadahead)
  // The mount in this process's mount namespace: its device (MAJ:MIN in
  // /proc/self/mountinfo, "" if it could not be read), and /proc/self/
  // mountinfo waited on for changes (watchMounts in fuse_mount.cc). An
  // unmount here does not end the kernel's connection while a copy of the
  // mount lives in another mount namespace (one made while it was mounted,
  // `unshare -m`, `ip netns exec`, a container's): /dev/fuse says nothing,
  // so the mount table is watched, and `detached` once ours is gone.
  std::string device;
  net::asio::posix::stream_descriptor mounts;
  bool detached = false;
  // A second descriptor of the mount's /dev/fuse, numbered above
  // fusermount3's socket (holdDeviceAboveSocket in fuse_mount.cc); -1 if none.
  int device_guard = -1;
  // Closed before an unmount, which libfuse makes with no descriptor of
  // the device left open (it closes its own first).
  void closeDeviceGuard() {
    if (device_guard >= 0) ::close(device_guard);
    device_guard = -1;
  }
  std::string remote_dir;
  bool read_only = false;
  double attr_timeout = 1.0;
  uint32_t max_io = kMaxIo;  // ioSize() of the session the mount began on
  // Reads come in pipes and are spliced into /dev/fuse (replyPiped in
  // fuse_ops.cc): libfuse's pipe must then hold a whole read and its
  // header, above the unprivileged fs.pipe-max-size (1 MiB) for the
  // largest reads; pipeHoldsRead() probes it at mount.
  bool splice_reads = false;

  uint64_t next_handle = 1;
  std::unordered_map<uint64_t, OpenFile> open_files;
  // The open files' handles by node: a getattr the kernel sends without a
  // handle (fstat(2) sends none) is answered through one of them
  // (fuse_ops.cc doGetattr), also once the file has no name left.
  std::unordered_multimap<uint64_t, uint64_t> handles_of;
  std::unordered_map<uint64_t, OpenDir> open_dirs;
  std::unordered_map<uint64_t, ContentStamp> stamps;
  FailedLookup failed_lookup;
  std::unordered_map<uint64_t, Listing> listings;  // by directory node
  // Directories' attributes kept while pushes keep them true (fuse_watch.cc).
  std::unordered_map<uint64_t, struct stat> dir_attrs;
  uint64_t modifications = 0;  // changes the mount made (listings across one are dropped)

  // Push invalidation (fuse_watch.cc): the watched directories' nodes and
  // their agent watch ids, both ways; nodes whose watch is being made.
  std::unique_ptr<Notifier> notifier;
  std::unordered_map<uint64_t, uint64_t> watch_of;  // node -> watch
  std::unordered_map<uint64_t, uint64_t> node_of;   // watch -> node
  std::unordered_set<uint64_t> watching;
  uint64_t watch_generation = 0;  // one more with each failover
  bool watches_work = true;       // false once the agent showed it has none
  uint64_t changes_seen = 0;
  bool stopping = false;  // serve() is ending: no new watches or notices
  std::shared_ptr<int> life = std::make_shared<int>(0);  // weakly held by what outlives a call

  // Operations whose answer the kernel still waits for, and the mount's
  // own calls (watch, unwatch).
  int inflight = 0;
  net::Signal idle;
};

// Runs `op` on the loop, counted in Impl::inflight (serve() waits for it).
void spawnCounted(FuseMount::Impl& m, net::awaitable<void> op, const char* what);

// fuse_mount.cc: once the mount is gone from this mount namespace and no
// file or directory is open through it any more, serve() ends (a lazy
// unmount's open files are served until closed). Called where that may
// have become true.
void endIfDetached(FuseMount::Impl& m);

// fuse_watch.cc: a directory node the kernel now has is watched (once); a
// node gone from the table gives its watch back; what the watches saw.
void watchNode(FuseMount::Impl& m, uint64_t node);
// Whether `node` has no watch yet, none being made, and watches work.
bool needsWatch(const FuseMount::Impl& m, uint64_t node);
void nodeForgotten(FuseMount::Impl& m, uint64_t node);
void spawnUnwatch(FuseMount::Impl& m, uint64_t watch);
// The watch of `node` at `path`, made now (watchNode spawns this).
net::awaitable<void> watchNow(FuseMount::Impl* m, uint64_t node, std::string path,
                              uint64_t generation);
void onChanges(FuseMount::Impl& m, const client::FileChanges& changes);
// The listings lookups are answered from are stale: every one is dropped.
inline void listingsChanged(FuseMount::Impl& m) {
  ++m.modifications;
  m.listings.clear();
  m.dir_attrs.clear();
}
// Directory attributes (fuse_watch.cc). A directory's attributes change
// only by what watches see: its entries (its own watch: mtime, link
// count) and chmod, chown, utime (its parent's watch). So while both
// watch, its attributes from a listing or a getattr are answered without
// asking the agent again (find stats every directory it enters, after the
// attribute timeout of the listing that named it). keepDirAttr stores
// them when the parent watches; dirAttr answers them when both do.
void keepDirAttr(FuseMount::Impl& m, uint64_t node, const struct stat& st);
const struct stat* dirAttr(const FuseMount::Impl& m, uint64_t node);

// The last mount at `path` (absolute) in /proc/self/mountinfo: its device
// (MAJ:MIN) and type (fuse.siphon for ours); nullopt when nothing is
// mounted there. Read from the table, never by a stat of the path, which
// for our own mount would be served by this process.
struct MountEntry {
  std::string device;
  std::string fstype;
};
std::optional<MountEntry> lastMountAt(const std::string& path);
// Whether a siphon mount of `device` (MAJ:MIN) is mounted anywhere in this
// process's mount namespace (true when the table cannot be read).
bool mountedHere(const std::string& device);

// libfuse's operation table (fuse_ops.cc).
const struct fuse_lowlevel_ops& operations();

}  // namespace siphon::fuse
