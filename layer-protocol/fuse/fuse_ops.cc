// The mount's operations (fuse_mount.h): each kernel request starts a
// coroutine on the Client's event loop that asks the agent (siphon/client/
// files.h) and answers the kernel. Coroutines are free functions taking
// their arguments by value (a lambda coroutine's captures would dangle), and
// never co_await inside ?: (GCC 12 destroys the result twice).
//
// Over 600 lines: one function per FUSE operation, each short; splitting
// them by kind would only scatter the helpers they share.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuse/fuse_impl.h"
#include "siphon/client/errors.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::fuse {
namespace {

using Impl = FuseMount::Impl;
using client::FileStat;

constexpr int64_t kTimeOmit = -1;  // the agent's "leave it" (files.proto)
constexpr int64_t kTimeNow = -2;   // the agent's "now"

Impl& implOf(fuse_req_t req) { return *static_cast<Impl*>(fuse_req_userdata(req)); }

// The errno to answer for a failed call: the agent's own, else EIO (the
// session lost, a timeout, a protocol error: the work is lost, not refused).
int errOf(const absl::Status& s) {
  if (s.ok()) return 0;
  const int e = client::errnoValue(s);
  return e > 0 ? e : EIO;
}

// A handle's failure: EIO once its session is gone (the handle is never
// reopened on another agent), the agent's errno otherwise. ESTALE as it
// is: a workload's session reopened the file on another pod and found
// another file there (ClientOptions::reopen_files).
int handleErr(const client::File& f, const absl::Status& s) {
  if (client::errnoValue(s) == ESTALE) return ESTALE;
  if (!f.alive().ok()) return EIO;
  return errOf(s);
}

net::awaitable<void> counted(Impl* m, net::awaitable<void> op) {
  struct Done {
    Impl* m;
    ~Done() {
      if (--m->inflight == 0) m->idle.notify();
    }
  } done{m};
  co_await std::move(op);
}

void start(fuse_req_t req, net::awaitable<void> op) {
  spawnCounted(implOf(req), std::move(op), "fuse_op");
}

// An operation that changes the target: once it is answered, the listings
// lookups are served from are stale (listingsChanged).
net::awaitable<void> changing(Impl* m, net::awaitable<void> op) {
  co_await std::move(op);
  listingsChanged(*m);
}

void startChanging(fuse_req_t req, net::awaitable<void> op) {
  Impl& m = implOf(req);
  start(req, changing(&m, std::move(op)));
}

int64_t seconds(int64_t ns) { return ns >= 0 ? ns / 1000000000 : -((-ns + 999999999) / 1000000000); }

struct timespec toTimespec(int64_t ns) {
  struct timespec ts {};
  ts.tv_sec = seconds(ns);
  ts.tv_nsec = ns - ts.tv_sec * 1000000000;
  return ts;
}

struct stat toStat(const FileStat& f) {
  struct stat st {};
  st.st_dev = f.dev;
  st.st_ino = f.ino;
  st.st_mode = f.mode;
  st.st_nlink = f.nlink;
  st.st_uid = f.uid;
  st.st_gid = f.gid;
  st.st_rdev = f.rdev;
  st.st_size = f.size;
  st.st_blksize = f.blksize;
  st.st_blocks = f.blocks;
  st.st_atim = toTimespec(f.atime_ns);
  st.st_mtim = toTimespec(f.mtime_ns);
  st.st_ctim = toTimespec(f.ctime_ns);
  return st;
}

// What readlink answers for the target's link text (see fuse_mount.h).
std::string shownLink(const Impl& m, const std::string& text) {
  if (text.empty() || text[0] != '/') return text;
  if (m.remote_dir == "/") return m.mountpoint + text;
  if (text == m.remote_dir) return m.mountpoint;
  if (text.size() > m.remote_dir.size() && text.compare(0, m.remote_dir.size(), m.remote_dir) == 0 &&
      text[m.remote_dir.size()] == '/') {
    return m.mountpoint + text.substr(m.remote_dir.size());
  }
  return m.mountpoint + "/" + kOutsideMount + text;
}

// lstat of `path`, as it is: a symlink's size too is the link's own (the
// length of its text in the target). Reading the text to size what
// readlink answers for an absolute link would change the link's atime in
// the target: looking must not modify.
net::awaitable<absl::StatusOr<struct stat>> attrOf(Impl* m, std::string path) {
  auto st = co_await m->files.lstat(path);
  if (!st.ok()) co_return st.status();
  co_return toStat(*st);
}

// What the node table keys a file by (inode_table.h).
FileIdentity identityOf(const struct stat& st) {
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                      static_cast<uint32_t>(st.st_mode)};
}

// How long the kernel may keep a name of `parent` (or its absence): the
// attribute timeout, or, while the agent watches `parent` (its creations,
// removals and renames come as invalidations, fuse_watch.cc), at least
// kWatchedEntryTimeout, so a walk does not look up again every directory it
// met a second ago. --attr-timeout 0 keeps nothing. Absences keep the
// attribute timeout.
constexpr double kWatchedEntryTimeout = 60.0;

double entryTimeout(const Impl& m, uint64_t parent) {
  if (m.attr_timeout <= 0 || !m.watch_of.contains(parent)) return m.attr_timeout;
  return std::max(m.attr_timeout, kWatchedEntryTimeout);
}

void replyEntry(Impl& m, fuse_req_t req, uint64_t parent, const std::string& name,
                const struct stat& st) {
  struct fuse_entry_param e {};
  e.ino = m.table.lookup(parent, name, identityOf(st));
  if (e.ino == 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  e.attr = st;
  e.attr_timeout = m.attr_timeout;
  e.entry_timeout = entryTimeout(m, parent);
  if (fuse_reply_entry(req, &e) != 0) {
    m.table.forget(e.ino, 1);  // the kernel did not take it
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    watchNode(m, e.ino);
    keepDirAttr(m, e.ino, st);
  }
}

// After an operation that made `name` in `parent`: its attributes, as a
// new entry for the kernel.
net::awaitable<void> entryAfter(Impl* m, fuse_req_t req, uint64_t parent, std::string name,
                                std::string path) {
  auto st = co_await attrOf(m, path);
  if (!st.ok()) {
    fuse_reply_err(req, errOf(st.status()));
    co_return;
  }
  replyEntry(*m, req, parent, name, *st);
}

// ------------------------------------------------------------ names

// The kernel looks a name up again at once when the revalidation of its
// cached entry failed: after a lookup that failed for want of the agent (no
// answer within the call timeout, the session lost) the next lookup of the
// same name, within kRelookupWindow, fails at once, so a stat on a cut link
// waits one call timeout, not two.
constexpr auto kRelookupWindow = std::chrono::seconds(1);

// Lookups of names never listed (git status lstat()s every file of its
// index; a build tool its sources) would cost a round trip each. The second
// lookup that misses in a directory lists it instead (its entries and their
// lstats, one round trip, fetched beside the lookups in flight), and while
// that listing is fresh the directory's lookups are answered from it: a
// name it lacks is ENOENT.
// Fresh: for the attribute timeout; while the directory is watched, until
// the watch reports a change in it (fuse_watch.cc) or kWatchedEntryTimeout.
// Any change the mount makes drops every listing (startChanging), and a
// listing fetched across one is not kept.
constexpr size_t kMaxListingEntries = 20000;

bool listingFresh(const Impl& m, uint64_t dir, const Listing& l) {
  if (!l.ready || m.attr_timeout <= 0) return false;
  const double life = m.watch_of.contains(dir) ? std::max(m.attr_timeout, kWatchedEntryTimeout)
                                               : m.attr_timeout;
  return std::chrono::steady_clock::now() - l.at < std::chrono::duration<double>(life);
}

net::awaitable<void> fetchListing(Impl* m, uint64_t dir, std::string path) {
  const uint64_t changes = m->modifications;
  auto entries = co_await m->files.list(path, true);
  auto it = m->listings.find(dir);
  if (it == m->listings.end()) co_return;  // dropped meanwhile
  if (!entries.ok() || changes != m->modifications || !m->table.known(dir) ||
      entries->size() > kMaxListingEntries) {
    // Kept as a failure (a directory too big to keep, one that may be
    // searched but not read): its lookups ask one by one until the next
    // change drops the listings.
    it->second.loading = false;
    it->second.misses = -1000000;
    co_return;
  }
  Listing& l = it->second;
  l.loading = false;
  l.ready = true;
  l.at = std::chrono::steady_clock::now();
  l.stats.clear();
  for (client::DirEntry& e : *entries) {
    if (e.name == "." || e.name == "..") continue;
    l.stats.emplace(std::move(e.name), std::move(e.stat));
  }
}

// The listing's answer for `name`: true when it answered the kernel.
bool lookupFromListing(Impl& m, fuse_req_t req, uint64_t parent, const std::string& name,
                       const std::string& parent_path) {
  Listing& l = m.listings[parent];
  if (listingFresh(m, parent, l)) {
    auto it = l.stats.find(name);
    if (it == l.stats.end()) {
      struct fuse_entry_param e {};
      e.entry_timeout = m.attr_timeout;
      fuse_reply_entry(req, &e);
      return true;
    }
    if (it->second) {
      replyEntry(m, req, parent, name, toStat(*it->second));
      return true;
    }
    return false;  // an entry that vanished while listed
  }
  if (l.ready) l = Listing{};  // stale
  if (!l.loading && ++l.misses >= 2 && m.attr_timeout > 0) {
    l.loading = true;
    spawnCounted(m, fetchListing(&m, parent, parent_path), "fuse_listing");
  }
  return false;
}

net::awaitable<void> doLookup(Impl* m, fuse_req_t req, uint64_t parent, std::string name) {
  auto path = m->table.childPath(parent, name);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  if (auto dir_path = m->table.path(parent);
      dir_path && lookupFromListing(*m, req, parent, name, *dir_path)) {
    co_return;
  }
  FailedLookup& last = m->failed_lookup;
  if (last.parent == parent && last.name == name &&
      std::chrono::steady_clock::now() - last.at < kRelookupWindow) {
    last = FailedLookup{};
    fuse_reply_err(req, EIO);
    co_return;
  }
  auto st = co_await attrOf(m, *path);
  if (!st.ok()) {
    const int err = errOf(st.status());
    if (client::errnoValue(st.status()) <= 0) {
      m->failed_lookup = FailedLookup{parent, name, std::chrono::steady_clock::now()};
    }
    if (err == ENOENT) {
      // A negative entry, cached as long as a positive one.
      struct fuse_entry_param e {};
      // (Never longer: after a failover or an overflow the mount cannot
      // name the absences it handed out to drop them.)
      e.entry_timeout = m->attr_timeout;
      fuse_reply_entry(req, &e);
    } else {
      fuse_reply_err(req, err);
    }
    co_return;
  }
  replyEntry(*m, req, parent, name, *st);
}

void opLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  start(req, doLookup(&implOf(req), req, parent, name));
}

void opForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Impl& m = implOf(req);
  m.table.forget(ino, nlookup);
  nodeForgotten(m, ino);
  fuse_reply_none(req);
}

void opForgetMulti(fuse_req_t req, size_t count, struct fuse_forget_data* forgets) {
  Impl& m = implOf(req);
  for (size_t i = 0; i < count; ++i) {
    m.table.forget(forgets[i].ino, forgets[i].nlookup);
    nodeForgotten(m, forgets[i].ino);
  }
  fuse_reply_none(req);
}

// ------------------------------------------------------------ attributes

// An open file of `ino`: the one `fh` names, else any the node has whose
// session is alive (an open file's handle is the file itself, whatever
// its names became: unlinked, renamed over).
std::optional<client::File> openFileOf(const Impl& m, uint64_t ino, uint64_t fh) {
  if (auto it = m.open_files.find(fh); fh != 0 && it != m.open_files.end()) {
    return it->second.file;
  }
  auto [first, last] = m.handles_of.equal_range(ino);
  for (auto h = first; h != last; ++h) {
    auto it = m.open_files.find(h->second);
    if (it != m.open_files.end() && it->second.file.alive().ok()) return it->second.file;
  }
  return std::nullopt;
}

net::awaitable<void> doGetattr(Impl* m, fuse_req_t req, uint64_t ino, uint64_t fh) {
  // An open file answers through its handle (fstat on the agent), also
  // once it has no name left (nlink 0): the kernel sends fstat(2) of a
  // file open through the mount as a getattr of its node, with no handle.
  if (std::optional<client::File> file = openFileOf(*m, ino, fh)) {
    auto st = co_await file->stat();
    if (st.ok()) {
      struct stat out = toStat(*st);
      fuse_reply_attr(req, &out, m->attr_timeout);
      co_return;
    }
    // A handle of a session that is gone: its file answers EIO, the node
    // is asked by its path (on the agent the session moved to).
    if (fh != 0 || file->alive().ok() || !m->table.path(ino)) {
      fuse_reply_err(req, handleErr(*file, st.status()));
      co_return;
    }
  }
  if (const struct stat* kept = dirAttr(*m, ino)) {
    fuse_reply_attr(req, kept, m->attr_timeout);
    co_return;
  }
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  auto st = co_await attrOf(m, *path);
  if (!st.ok()) {
    fuse_reply_err(req, errOf(st.status()));
    co_return;
  }
  keepDirAttr(*m, ino, *st);
  fuse_reply_attr(req, &*st, m->attr_timeout);
}

void opGetattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  start(req, doGetattr(&implOf(req), req, ino, fi ? fi->fh : 0));
}

int64_t timeArg(int to_set, int set_flag, int now_flag, const struct timespec& ts) {
  if ((to_set & now_flag) != 0) return kTimeNow;
  if ((to_set & set_flag) == 0) return kTimeOmit;
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

net::awaitable<void> doSetattr(Impl* m, fuse_req_t req, uint64_t ino, struct stat attr, int to_set,
                               uint64_t fh) {
  auto path = m->table.path(ino);
  std::optional<client::File> file;
  if (auto it = m->open_files.find(fh); fh != 0 && it != m->open_files.end()) {
    file = it->second.file;
  }
  if (!path && !file) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s;
  if (s.ok() && (to_set & FUSE_SET_ATTR_MODE) != 0) {
    if (path) {
      s = co_await m->files.chmod(*path, attr.st_mode & 07777);
    } else {
      s = errnoStatus(ENOENT, "removed");
    }
  }
  if (s.ok() && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) != 0) {
    const int64_t uid = (to_set & FUSE_SET_ATTR_UID) != 0 ? int64_t{attr.st_uid} : -1;
    const int64_t gid = (to_set & FUSE_SET_ATTR_GID) != 0 ? int64_t{attr.st_gid} : -1;
    if (path) {
      s = co_await m->files.chown(*path, uid, gid, false);
    } else {
      s = errnoStatus(ENOENT, "removed");
    }
  }
  if (s.ok() && (to_set & FUSE_SET_ATTR_SIZE) != 0) {
    if (file) {
      s = co_await file->truncate(attr.st_size);
    } else {
      s = co_await m->files.truncate(*path, attr.st_size);
    }
    if (!s.ok() && file && !file->alive().ok()) s = errnoStatus(EIO, "the handle's session is gone");
  }
  const int times = FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_ATIME_NOW |
                    FUSE_SET_ATTR_MTIME_NOW;
  if (s.ok() && (to_set & times) != 0) {
    const int64_t a =
        timeArg(to_set, FUSE_SET_ATTR_ATIME, FUSE_SET_ATTR_ATIME_NOW, attr.st_atim);
    const int64_t mt =
        timeArg(to_set, FUSE_SET_ATTR_MTIME, FUSE_SET_ATTR_MTIME_NOW, attr.st_mtim);
    if (path) {
      s = co_await m->files.utimens(*path, a, mt, false);
    } else {
      s = errnoStatus(ENOENT, "removed");
    }
  }
  if (!s.ok()) {
    fuse_reply_err(req, errOf(s));
    co_return;
  }
  if (file) {
    auto st = co_await file->stat();
    if (st.ok()) {
      struct stat out = toStat(*st);
      fuse_reply_attr(req, &out, m->attr_timeout);
      co_return;
    }
    if (!path) {
      fuse_reply_err(req, handleErr(*file, st.status()));
      co_return;
    }
  }
  auto st = co_await attrOf(m, *path);
  if (!st.ok()) {
    fuse_reply_err(req, errOf(st.status()));
    co_return;
  }
  fuse_reply_attr(req, &*st, m->attr_timeout);
}

void opSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set,
               struct fuse_file_info* fi) {
  startChanging(req, doSetattr(&implOf(req), req, ino, *attr, to_set, fi ? fi->fh : 0));
}

net::awaitable<void> doAccess(Impl* m, fuse_req_t req, uint64_t ino, int mask) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  fuse_reply_err(req, errOf(co_await m->files.access(*path, mask)));
}

void opAccess(fuse_req_t req, fuse_ino_t ino, int mask) {
  start(req, doAccess(&implOf(req), req, ino, mask));
}

net::awaitable<void> doReadlink(Impl* m, fuse_req_t req, uint64_t ino) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  auto text = co_await m->files.readlink(*path);
  if (!text.ok()) {
    fuse_reply_err(req, errOf(text.status()));
    co_return;
  }
  fuse_reply_readlink(req, shownLink(*m, *text).c_str());
}

void opReadlink(fuse_req_t req, fuse_ino_t ino) { start(req, doReadlink(&implOf(req), req, ino)); }

net::awaitable<void> doStatfs(Impl* m, fuse_req_t req, uint64_t ino) {
  auto path = m->table.path(ino);
  auto fs = co_await m->files.statfs(path ? *path : m->remote_dir);
  if (!fs.ok()) {
    fuse_reply_err(req, errOf(fs.status()));
    co_return;
  }
  struct statvfs v {};
  v.f_bsize = fs->bsize;
  v.f_frsize = fs->frsize != 0 ? fs->frsize : fs->bsize;
  v.f_blocks = fs->blocks;
  v.f_bfree = fs->bfree;
  v.f_bavail = fs->bavail;
  v.f_files = fs->files;
  v.f_ffree = fs->ffree;
  v.f_favail = fs->ffree;
  v.f_namemax = fs->namelen;
  fuse_reply_statfs(req, &v);
}

void opStatfs(fuse_req_t req, fuse_ino_t ino) { start(req, doStatfs(&implOf(req), req, ino)); }

// ------------------------------------------------------------ changes

net::awaitable<void> doMkdir(Impl* m, fuse_req_t req, uint64_t parent, std::string name,
                             uint32_t mode) {
  auto path = m->table.childPath(parent, name);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s = co_await m->files.mkdir(*path, mode & 07777);
  if (!s.ok()) {
    fuse_reply_err(req, errOf(s));
    co_return;
  }
  co_await entryAfter(m, req, parent, name, *path);
}

void opMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  startChanging(req, doMkdir(&implOf(req), req, parent, name, mode));
}

net::awaitable<void> doRemove(Impl* m, fuse_req_t req, uint64_t parent, std::string name,
                              bool dir) {
  auto path = m->table.childPath(parent, name);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s;
  if (dir) {
    s = co_await m->files.rmdir(*path);
  } else {
    s = co_await m->files.unlink(*path);
  }
  if (s.ok()) m->table.removed(parent, name);
  fuse_reply_err(req, errOf(s));
}

void opUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  startChanging(req, doRemove(&implOf(req), req, parent, name, false));
}
void opRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  startChanging(req, doRemove(&implOf(req), req, parent, name, true));
}

net::awaitable<void> doRename(Impl* m, fuse_req_t req, uint64_t parent, std::string name,
                              uint64_t new_parent, std::string new_name, unsigned flags) {
  auto from = m->table.childPath(parent, name);
  auto to = m->table.childPath(new_parent, new_name);
  if (!from || !to) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s = co_await m->files.rename(*from, *to, flags);
  if (s.ok()) m->table.renamed(parent, name, new_parent, new_name, (flags & RENAME_EXCHANGE) != 0);
  fuse_reply_err(req, errOf(s));
}

void opRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned int flags) {
  startChanging(req, doRename(&implOf(req), req, parent, name, new_parent, new_name, flags));
}

net::awaitable<void> doSymlink(Impl* m, fuse_req_t req, std::string text, uint64_t parent,
                               std::string name) {
  auto path = m->table.childPath(parent, name);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s = co_await m->files.symlink(text, *path);
  if (!s.ok()) {
    fuse_reply_err(req, errOf(s));
    co_return;
  }
  co_await entryAfter(m, req, parent, name, *path);
}

void opSymlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  startChanging(req, doSymlink(&implOf(req), req, link, parent, name));
}

net::awaitable<void> doLink(Impl* m, fuse_req_t req, uint64_t ino, uint64_t new_parent,
                            std::string new_name) {
  auto from = m->table.path(ino);
  auto to = m->table.childPath(new_parent, new_name);
  if (!from || !to) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s = co_await m->files.link(*from, *to);
  if (!s.ok()) {
    fuse_reply_err(req, errOf(s));
    co_return;
  }
  // The reply names the linked node itself (the new name becomes one of
  // its names: the table keys a file by its inode), so the kernel keeps
  // one inode and takes its new link count now.
  auto st = co_await attrOf(m, *to);
  if (!st.ok()) {
    fuse_reply_err(req, errOf(st.status()));
    co_return;
  }
  replyEntry(*m, req, new_parent, new_name, *st);
}

void opLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) {
  startChanging(req, doLink(&implOf(req), req, ino, new_parent, new_name));
}

net::awaitable<void> doMknod(Impl* m, fuse_req_t req, uint64_t parent, std::string name,
                             uint32_t mode, uint64_t rdev) {
  auto path = m->table.childPath(parent, name);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  absl::Status s = co_await m->files.mknod(*path, mode, rdev);
  if (!s.ok()) {
    fuse_reply_err(req, errOf(s));
    co_return;
  }
  co_await entryAfter(m, req, parent, name, *path);
}

void opMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  startChanging(req, doMknod(&implOf(req), req, parent, name, mode, rdev));
}

// Extended attributes: `size` 0 asks for the length only; a value that
// does not fit is ERANGE, as the kernel's own.
void replyXattr(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0) {
    fuse_reply_xattr(req, value.size());
  } else if (value.size() > size) {
    fuse_reply_err(req, ERANGE);
  } else {
    fuse_reply_buf(req, value.data(), value.size());
  }
}

net::awaitable<void> doGetxattr(Impl* m, fuse_req_t req, uint64_t ino, std::string name,
                                size_t size) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  auto value = co_await m->files.getxattr(*path, name, false);
  if (!value.ok()) {
    fuse_reply_err(req, errOf(value.status()));
    co_return;
  }
  replyXattr(req, *value, size);
}

void opGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  start(req, doGetxattr(&implOf(req), req, ino, name, size));
}

net::awaitable<void> doListxattr(Impl* m, fuse_req_t req, uint64_t ino, size_t size) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  auto names = co_await m->files.listxattr(*path, false);
  if (!names.ok()) {
    fuse_reply_err(req, errOf(names.status()));
    co_return;
  }
  std::string packed;  // NUL after each name, as listxattr(2) answers
  for (const auto& n : *names) {
    packed += n;
    packed.push_back('\0');
  }
  replyXattr(req, packed, size);
}

void opListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  start(req, doListxattr(&implOf(req), req, ino, size));
}

net::awaitable<void> doSetxattr(Impl* m, fuse_req_t req, uint64_t ino, std::string name,
                                std::string value, int flags) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  fuse_reply_err(req, errOf(co_await m->files.setxattr(*path, name, value, flags, false)));
}

void opSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) {
  start(req, doSetxattr(&implOf(req), req, ino, name, std::string(value, size), flags));
}

net::awaitable<void> doRemovexattr(Impl* m, fuse_req_t req, uint64_t ino, std::string name) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  fuse_reply_err(req, errOf(co_await m->files.removexattr(*path, name, false)));
}

void opRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  start(req, doRemovexattr(&implOf(req), req, ino, name));
}

// ------------------------------------------------------------ files

uint64_t addFile(Impl& m, client::File file, uint64_t node) {
  const uint64_t fh = m.next_handle++;
  m.open_files.emplace(fh, OpenFile{std::move(file), node});
  m.handles_of.emplace(node, fh);
  return fh;
}

// The open file of `fh` taken out of the mount's tables.
std::optional<client::File> takeFile(Impl& m, uint64_t fh) {
  auto it = m.open_files.find(fh);
  if (it == m.open_files.end()) return std::nullopt;
  auto [first, last] = m.handles_of.equal_range(it->second.node);
  for (auto h = first; h != last; ++h) {
    if (h->second == fh) {
      m.handles_of.erase(h);
      break;
    }
  }
  client::File file = std::move(it->second.file);
  m.open_files.erase(it);
  return file;
}

// keep_cache while the content looks as at the last open: the kernel then
// keeps the pages it has of the file.
bool keepCache(Impl& m, uint64_t node, const absl::StatusOr<FileStat>& st) {
  if (!st.ok()) return false;
  ContentStamp now{st->size, st->mtime_ns};
  auto& last = m.stamps[node];
  const bool same = last.size == now.size && last.mtime_ns == now.mtime_ns;
  last = now;
  return same;
}

net::awaitable<void> doOpen(Impl* m, fuse_req_t req, uint64_t ino, struct fuse_file_info fi) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  // O_DIRECT is the kernel's business here (direct_io: no page cache for
  // this open); the agent's pread into its own buffers must not have it
  // (EINVAL for buffers not aligned to the target's blocks).
  const bool direct = (fi.flags & O_DIRECT) != 0;
  const int flags = fi.flags & ~(O_CREAT | O_EXCL | O_NOCTTY | O_DIRECT);
  // The stat for keep_cache goes with the open: one round trip for both.
  auto stamp = m->files.startLstat(*path);
  auto file = co_await m->files.open(*path, flags);
  auto st = co_await stamp.get();
  if (!file.ok()) {
    fuse_reply_err(req, errOf(file.status()));
    co_return;
  }
  fi.fh = addFile(*m, std::move(*file), ino);
  fi.keep_cache = (flags & O_TRUNC) == 0 && keepCache(*m, ino, st) ? 1 : 0;
  fi.direct_io = direct ? 1 : 0;
  if ((flags & O_TRUNC) != 0) m->stamps.erase(ino);
  if (fuse_reply_open(req, &fi) != 0) {
    // The kernel gave up on the open (interrupted): nobody will release it.
    if (std::optional<client::File> f = takeFile(*m, fi.fh)) (void)co_await f->close();
  }
}

void opOpen(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  if ((fi->flags & O_TRUNC) != 0) {
    startChanging(req, doOpen(&implOf(req), req, ino, *fi));
  } else {
    start(req, doOpen(&implOf(req), req, ino, *fi));
  }
}

net::awaitable<void> doCreate(Impl* m, fuse_req_t req, uint64_t parent, std::string name,
                              uint32_t mode, struct fuse_file_info fi) {
  auto path = m->table.childPath(parent, name);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  const bool direct = (fi.flags & O_DIRECT) != 0;
  auto file = co_await m->files.open(*path, (fi.flags & ~O_DIRECT) | O_CREAT, mode & 07777);
  if (!file.ok()) {
    fuse_reply_err(req, errOf(file.status()));
    co_return;
  }
  client::File f = *file;
  auto st = co_await f.stat();
  if (!st.ok()) {
    (void)co_await f.close();
    fuse_reply_err(req, handleErr(f, st.status()));
    co_return;
  }
  struct fuse_entry_param e {};
  e.attr = toStat(*st);
  e.ino = m->table.lookup(parent, name, identityOf(e.attr));
  e.attr_timeout = m->attr_timeout;
  e.entry_timeout = entryTimeout(*m, parent);
  fi.fh = addFile(*m, f, e.ino);
  fi.direct_io = direct ? 1 : 0;
  m->stamps[e.ino] = ContentStamp{st->size, st->mtime_ns};
  if (fuse_reply_create(req, &e, &fi) != 0) {
    m->table.forget(e.ino, 1);
    (void)takeFile(*m, fi.fh);
    (void)co_await f.close();
  }
}

void opCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              struct fuse_file_info* fi) {
  startChanging(req, doCreate(&implOf(req), req, parent, name, mode, *fi));
}

// A read some of whose parts came in pipes: each part's bytes in memory,
// then its pipe's. libfuse splices the pipes into its own and that into
// /dev/fuse (FUSE_CAP_SPLICE_WRITE), so the bytes reach the mount's page
// cache with the kernel's one copy; when its pipe cannot hold them it reads
// them into memory and writes them as usual.
void replyPiped(fuse_req_t req, std::vector<client::FileData>& parts) {
  const size_t count = 2 * parts.size();
  std::vector<char> storage(sizeof(struct fuse_bufvec) + count * sizeof(struct fuse_buf));
  auto* bufv = reinterpret_cast<struct fuse_bufvec*>(storage.data());
  *bufv = FUSE_BUFVEC_INIT(0);
  bufv->count = 0;
  for (client::FileData& p : parts) {
    if (!p.data.empty()) {
      struct fuse_buf& b = bufv->buf[bufv->count++];
      b = fuse_buf{};
      b.size = p.data.size();
      b.mem = p.data.data();
    }
    if (p.piped && p.piped->size() > 0) {
      struct fuse_buf& b = bufv->buf[bufv->count++];
      b = fuse_buf{};
      b.size = p.piped->size();
      b.flags = FUSE_BUF_IS_FD;
      b.fd = p.piped->fd();
    }
  }
  if (bufv->count == 0) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  fuse_reply_data(req, bufv, FUSE_BUF_SPLICE_MOVE);
}

net::awaitable<void> doRead(Impl* m, fuse_req_t req, uint64_t fh, size_t size, off_t off) {
  auto it = m->open_files.find(fh);
  if (it == m->open_files.end()) {
    fuse_reply_err(req, EBADF);
    co_return;
  }
  client::File file = it->second.file;
  // The agent's largest read each, all in flight together.
  const uint32_t chunk = std::max<uint32_t>(4096, m->files.maxReadSize());
  std::vector<client::Pending<client::FileData>> parts;
  for (size_t done = 0; done < size; done += chunk) {
    const auto n = static_cast<uint32_t>(std::min<size_t>(chunk, size - done));
    parts.push_back(file.startPread(off + static_cast<off_t>(done), n, m->splice_reads));
  }
  // The parts go to the kernel as they are, gathered (fuse_reply_iov, or
  // fuse_reply_data when some came in pipes): no copy to join them.
  std::vector<client::FileData> data;
  bool piped = false;
  absl::Status failed;
  bool short_read = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto part = co_await parts[i].get();
    if (short_read) continue;  // past the end: the rest is not the file's
    if (!part.ok()) {
      failed = part.status();
      short_read = true;
      continue;
    }
    const size_t want = std::min<size_t>(chunk, size - i * chunk);
    const size_t got = part->size();
    piped = piped || part->piped;
    data.push_back(*std::move(part));
    // A short part or the end: the file ends there; later parts are past it.
    if (got < want || part->eof) short_read = true;
  }
  if (!failed.ok() && data.empty()) {
    fuse_reply_err(req, handleErr(file, failed));
    co_return;
  }
  if (piped) {
    replyPiped(req, data);
    co_return;
  }
  std::vector<struct iovec> iov;
  iov.reserve(data.size());
  for (client::FileData& d : data) {
    if (!d.data.empty()) iov.push_back(iovec{d.data.data(), d.data.size()});
  }
  fuse_reply_iov(req, iov.data(), static_cast<int>(iov.size()));
}

void opRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, struct fuse_file_info* fi) {
  start(req, doRead(&implOf(req), req, fi->fh, size, off));
}

net::awaitable<void> doWrite(Impl* m, fuse_req_t req, uint64_t fh, std::string data, off_t off) {
  auto it = m->open_files.find(fh);
  if (it == m->open_files.end()) {
    fuse_reply_err(req, EBADF);
    co_return;
  }
  client::File file = it->second.file;
  const uint32_t chunk = std::max<uint32_t>(4096, m->files.maxReadSize());
  std::vector<client::Pending<uint64_t>> parts;
  std::vector<size_t> sizes;
  for (size_t done = 0; done < data.size(); done += chunk) {
    const size_t n = std::min<size_t>(chunk, data.size() - done);
    parts.push_back(file.startPwrite(off + static_cast<off_t>(done), data.substr(done, n)));
    sizes.push_back(n);
  }
  size_t written = 0;
  bool stopped = false;
  absl::Status failed;
  for (size_t i = 0; i < parts.size(); ++i) {
    auto n = co_await parts[i].get();
    if (stopped) continue;
    if (!n.ok()) {
      failed = n.status();
      stopped = true;
      continue;
    }
    written += *n;
    if (*n < sizes[i]) stopped = true;  // short: what follows is not contiguous
  }
  m->stamps.erase(it->second.node);
  if (written == 0 && !failed.ok()) {
    fuse_reply_err(req, handleErr(file, failed));
    co_return;
  }
  fuse_reply_write(req, written);
}

void opWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
             struct fuse_file_info* fi) {
  startChanging(req, doWrite(&implOf(req), req, fi->fh, std::string(buf, size), off));
}

void opFlush(fuse_req_t req, fuse_ino_t, struct fuse_file_info*) {
  // Nothing is buffered here: every write was answered after the agent's
  // pwrite returned.
  fuse_reply_err(req, 0);
}

net::awaitable<void> doFsync(Impl* m, fuse_req_t req, uint64_t fh, bool datasync) {
  auto it = m->open_files.find(fh);
  if (it == m->open_files.end()) {
    fuse_reply_err(req, EBADF);
    co_return;
  }
  client::File file = it->second.file;
  absl::Status s = co_await file.fsync(datasync);
  fuse_reply_err(req, s.ok() ? 0 : handleErr(file, s));
}

void opFsync(fuse_req_t req, fuse_ino_t, int datasync, struct fuse_file_info* fi) {
  start(req, doFsync(&implOf(req), req, fi->fh, datasync != 0));
}

net::awaitable<void> doRelease(Impl* m, fuse_req_t req, uint64_t fh) {
  std::optional<client::File> file = takeFile(*m, fh);
  // Closed before the answer, so that what follows the close(2) in the
  // program sees the agent's handle gone.
  if (file) (void)co_await file->close();
  fuse_reply_err(req, 0);
  endIfDetached(*m);
}

void opRelease(fuse_req_t req, fuse_ino_t, struct fuse_file_info* fi) {
  start(req, doRelease(&implOf(req), req, fi->fh));
}

// ------------------------------------------------------------ directories

net::awaitable<void> doOpendir(Impl* m, fuse_req_t req, uint64_t ino, struct fuse_file_info fi) {
  auto path = m->table.path(ino);
  if (!path) {
    fuse_reply_err(req, ENOENT);
    co_return;
  }
  // The whole listing with each entry's lstat: one round trip for a
  // directory that fits one answer (the agent closes it itself).
  auto entries = co_await m->files.list(*path, true);
  if (!entries.ok()) {
    // EBADF: a listing of several answers whose handle died with its
    // session (a failover between them); the work is lost, as elsewhere.
    const int err = errOf(entries.status());
    fuse_reply_err(req, err == EBADF ? EIO : err);
    co_return;
  }
  OpenDir listing;
  listing.entries = *std::move(entries);
  fi.fh = m->next_handle++;
  m->open_dirs.emplace(fi.fh, std::move(listing));
  if (fuse_reply_open(req, &fi) != 0) m->open_dirs.erase(fi.fh);
}

void opOpendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  start(req, doOpendir(&implOf(req), req, ino, *fi));
}

// Answers a readdir or readdirplus from the listing read at opendir: the
// entries from `off` that fit in `size` bytes, each written by
// `add(entry, buffer, room, next_offset)`, which answers the bytes it needs
// (more than `room`: it did not fit, and wrote nothing).
template <typename Add>
void replyListing(fuse_req_t req, uint64_t fh, size_t size, off_t off, Add add) {
  Impl& m = implOf(req);
  auto it = m.open_dirs.find(fh);
  if (it == m.open_dirs.end()) {
    fuse_reply_err(req, EBADF);
    return;
  }
  const auto& entries = it->second.entries;
  std::string out(size, '\0');
  size_t used = 0;
  for (size_t i = static_cast<size_t>(std::max<off_t>(off, 0)); i < entries.size(); ++i) {
    const size_t need = add(entries[i], out.data() + used, size - used, static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, out.data(), used);
}

void opReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, struct fuse_file_info* fi) {
  replyListing(req, fi->fh, size, off,
               [req](const client::DirEntry& d, char* buf, size_t room, off_t next) {
                 struct stat st {};
                 st.st_ino = d.ino;
                 st.st_mode = DTTOIF(d.type);
                 return fuse_add_direntry(req, buf, room, d.name.c_str(), &st, next);
               });
}

// The listing with each entry's attributes (the agent's lstat, in the same
// answer as the names): the kernel caches them, so `ls -l`, `find` and
// `git status` need no lookup per entry. Each entry handed out with a node
// counts as a lookup; "." and ".." and entries without attributes go
// without one (the kernel looks them up).
void opReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info* fi) {
  Impl& m = implOf(req);
  replyListing(req, fi->fh, size, off,
               [&m, req, ino](const client::DirEntry& d, char* buf, size_t room, off_t next) {
                 struct fuse_entry_param e {};
                 e.attr.st_ino = d.ino;
                 e.attr.st_mode = DTTOIF(d.type);
                 const bool dots = d.name == "." || d.name == "..";
                 const bool with_node = !dots && d.stat;
                 if (with_node) {
                   e.attr = toStat(*d.stat);
                   e.attr_timeout = m.attr_timeout;
                   e.entry_timeout = entryTimeout(m, ino);
                 }
                 // Sized first with no lookup counted: an entry that does
                 // not fit must not count.
                 const size_t need = fuse_add_direntry_plus(req, nullptr, 0, d.name.c_str(), &e, 0);
                 if (need > room) return need;
                 if (with_node) {
                   e.ino = m.table.lookup(ino, d.name, identityOf(e.attr));
                   if (e.ino != 0 && S_ISDIR(d.stat->mode)) {
                     watchNode(m, e.ino);
                     keepDirAttr(m, e.ino, e.attr);
                   }
                 }
                 return fuse_add_direntry_plus(req, buf, room, d.name.c_str(), &e, next);
               });
}

void opReleasedir(fuse_req_t req, fuse_ino_t, struct fuse_file_info* fi) {
  Impl& m = implOf(req);  // (the answer frees `req`)
  m.open_dirs.erase(fi->fh);
  fuse_reply_err(req, 0);
  endIfDetached(m);
}

// ------------------------------------------------------------ session

// The kernel's readahead for the mount: the INIT answer can only lower it
// from the 128 KiB every FUSE mount starts with, which keeps about one read
// in flight, so a sequential read waits a round trip per 128 KiB. The bdi's
// read_ahead_kb can raise it (root only: a user's mount keeps 128 KiB).
// The mount's device comes from /proc/self/mountinfo (the last entry at our
// mount point, if it is fuse.siphon: one mounted over ours is refused
// before), never from a stat of the mount: this process serves it, and a
// thread of ours waiting on our own mount when the process is killed can
// never be woken (the kernel waits for a FUSE answer it has sent
// uninterruptibly, and the device that would abort it closes only when
// that thread exits).
void raiseReadahead(const std::string& mount_path, uint32_t kib) {
  if (mount_path.empty()) return;
  const std::optional<MountEntry> entry = lastMountAt(mount_path);
  if (!entry || entry->fstype != "fuse.siphon") return;
  const std::string knob = absl::StrCat("/sys/class/bdi/", entry->device, "/read_ahead_kb");
  const int k = ::open(knob.c_str(), O_WRONLY | O_CLOEXEC);
  if (k < 0) return;
  const std::string value = std::to_string(kib);
  (void)!::write(k, value.data(), value.size());
  ::close(k);
}

void opInit(void* userdata, struct fuse_conn_info* conn) {
  const uint32_t io = static_cast<Impl*>(userdata)->max_io;
  // Readahead of four of the largest reads (readaheadBytes): measured,
  // 128 KiB gave 635 MB/s for a sequential read over loopback, 1 MiB 783,
  // 4 MiB 927, 16 MiB 897. After this INIT answer is written (the kernel
  // applies it in that write).
  Impl* m = static_cast<Impl*>(userdata);
  net::asio::post(m->fd.get_executor(), [path = m->mount_path, kib = readaheadBytes(io) / 1024,
                                         life = std::weak_ptr<int>(m->life)] {
    if (!life.expired()) raiseReadahead(path, kib);
  });
  conn->max_write = io;
  conn->max_read = io;  // as the max_read mount option says
  conn->max_readahead = io;
  // O_TRUNC comes with the open (one round trip, not an open then a
  // truncate).
  if ((conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) != 0) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  // The kernel's own write-back cache would answer writes before the agent
  // has them: off.
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  // A new size or mtime from the agent drops the pages the kernel has.
  if ((conn->capable & FUSE_CAP_AUTO_INVAL_DATA) != 0) conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
  // Reads answered from pipes (replyPiped) when libfuse's pipe can hold one.
  if (m->splice_reads && (conn->capable & FUSE_CAP_SPLICE_WRITE) != 0) {
    conn->want |= FUSE_CAP_SPLICE_WRITE;
  } else {
    m->splice_reads = false;
  }
}

struct fuse_lowlevel_ops makeOperations() {
  struct fuse_lowlevel_ops ops {};
  ops.init = opInit;
  ops.lookup = opLookup;
  ops.forget = opForget;
  ops.forget_multi = opForgetMulti;
  ops.getattr = opGetattr;
  ops.setattr = opSetattr;
  ops.access = opAccess;
  ops.readlink = opReadlink;
  ops.statfs = opStatfs;
  ops.mkdir = opMkdir;
  ops.unlink = opUnlink;
  ops.rmdir = opRmdir;
  ops.rename = opRename;
  ops.open = opOpen;
  ops.create = opCreate;
  ops.read = opRead;
  ops.write = opWrite;
  ops.flush = opFlush;
  ops.release = opRelease;
  ops.opendir = opOpendir;
  ops.readdir = opReaddir;
  ops.releasedir = opReleasedir;
  ops.readdirplus = opReaddirplus;
  ops.symlink = opSymlink;
  ops.link = opLink;
  ops.mknod = opMknod;
  ops.fsync = opFsync;
  ops.getxattr = opGetxattr;
  ops.listxattr = opListxattr;
  ops.setxattr = opSetxattr;
  ops.removexattr = opRemovexattr;
  return ops;
}

}  // namespace

void spawnCounted(FuseMount::Impl& m, net::awaitable<void> op, const char* what) {
  ++m.inflight;
  net::spawn(m.fd.get_executor(), counted(&m, std::move(op)), what);
}

const struct fuse_lowlevel_ops& operations() {
  static const struct fuse_lowlevel_ops ops = makeOperations();
  return ops;
}

}  // namespace siphon::fuse
