// The mount's push invalidation (fuse_impl.h): every directory the kernel
// has a node for is watched on the agent (Files::watch, inotify in the
// target), and what a watch reports becomes FUSE invalidation notices, so a
// change in the target is seen at once, not at the end of the attribute
// timeout (`tail -f` of a log in the target, an editor's reload).
//
// What a change does (node D the watched directory, `name` its entry):
//   created / removed   the kernel's entry for name dropped (positive or
//                       negative), D's attributes and listing dropped;
//   content             the entry's attributes and pages dropped, and its
//                       keep_cache stamp, so the next open reads anew;
//   attributes          the entry's attributes dropped;
//   overflow, or the watches lost with a failover: every name's entry and
//                       every node's attributes and pages dropped; the
//                       directories watched again.
// While a directory is watched the kernel keeps its names for longer than
// the attribute timeout (entryTimeout, fuse_ops.cc).
//
// The notices go out from their own thread (Notifier): the kernel may hold
// a notice until pages that are being read are unlocked, and the event loop
// must go on answering those reads meanwhile. Watches are best effort: an
// agent without them (or one that refuses) leaves the mount on its
// attribute timeout, which always bounds how long a change goes unseen.
#include <sys/stat.h>

#include <utility>
#include <vector>

#include "fuse/fuse_impl.h"
#include "siphon/transport/spawn.h"

namespace siphon::fuse {

// ---------------------------------------------------------------- Notifier

Notifier::Notifier(struct fuse_session* se) : se_(se), thread_([this] { run(); }) {}

Notifier::~Notifier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Notifier::push(Notice n) {
  {
    std::lock_guard lock(mu_);
    if (quiescing_) return;
    queue_.push_back(std::move(n));
  }
  cv_.notify_one();
}

void Notifier::quiesce(std::function<void()> idle) {
  bool now = false;
  {
    std::lock_guard lock(mu_);
    quiescing_ = true;
    queue_.clear();
    if (busy_) {
      on_idle_ = std::move(idle);
    } else {
      now = true;
    }
  }
  if (now) idle();
}

uint64_t Notifier::sent() const {
  std::lock_guard lock(mu_);
  return sent_;
}

void Notifier::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Notice n = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    // Errors are the kernel's "no such node any more" (ENOENT) or "the
    // mount is gone" (ENODEV, EBADF): nothing left to invalidate.
    if (n.entry) {
      (void)fuse_lowlevel_notify_inval_entry(se_, n.ino, n.name.data(), n.name.size());
    } else {
      (void)fuse_lowlevel_notify_inval_inode(se_, n.ino, n.off, n.len);
    }
    lock.lock();
    busy_ = false;
    ++sent_;
    if (quiescing_ && on_idle_) {
      auto idle = std::exchange(on_idle_, nullptr);
      lock.unlock();
      idle();
      lock.lock();
    }
  }
}

// ---------------------------------------------------------------- watches

namespace {

using Impl = FuseMount::Impl;

// Attributes only (off < 0), or attributes and every page (0, 0).
constexpr int64_t kAttributesOnly = -1;

void invalInode(Impl& m, uint64_t ino, int64_t off) {
  if (m.notifier) m.notifier->push(Notice{false, ino, off, 0, {}});
}

void invalEntry(Impl& m, uint64_t parent, const std::string& name) {
  if (m.notifier) m.notifier->push(Notice{true, parent, 0, 0, name});
}

net::awaitable<void> doUnwatch(Impl* m, uint64_t watch) { (void)co_await m->files.unwatch(watch); }

net::awaitable<void> refreshDirAttr(Impl* m, uint64_t node) {
  auto path = m->table.path(node);
  if (!path) co_return;
  const uint64_t changes = m->modifications;
  auto st = co_await m->files.lstat(*path);
  auto it = m->dir_attrs.find(node);
  if (it == m->dir_attrs.end()) co_return;  // dropped meanwhile
  if (!st.ok() || changes != m->modifications) {
    m->dir_attrs.erase(it);
    co_return;
  }
  const struct stat& kept = it->second;
  const bool same = kept.st_mtim.tv_sec == st->mtime_ns / 1000000000 &&
                    kept.st_mtim.tv_nsec == st->mtime_ns % 1000000000 &&
                    kept.st_ctim.tv_sec == st->ctime_ns / 1000000000 &&
                    kept.st_ctim.tv_nsec == st->ctime_ns % 1000000000 &&
                    static_cast<uint64_t>(kept.st_nlink) == st->nlink;
  if (!same) {
    m->dir_attrs.erase(it);
    invalInode(*m, node, kAttributesOnly);
  }
}

// A watch whose node is gone.
void dropWatch(Impl& m, uint64_t watch) {
  auto it = m.node_of.find(watch);
  if (it == m.node_of.end()) return;
  m.dir_attrs.erase(it->second);
  m.watch_of.erase(it->second);
  m.node_of.erase(it);
}

// What the kernel holds may all be stale: every node's attributes and
// pages, and every name (those of watched directories are kept for long,
// fuse_ops.cc).
void everythingChanged(Impl& m) {
  listingsChanged(m);
  m.stamps.clear();
  for (uint64_t id : m.table.ids()) invalInode(m, id, 0);
  for (const auto& [parent, name] : m.table.names()) invalEntry(m, parent, name);
}

}  // namespace

net::awaitable<void> watchNow(Impl* m, uint64_t node, std::string path, uint64_t generation) {
  auto watch = co_await m->files.watch(path);
  m->watching.erase(node);
  if (generation != m->watch_generation) {
    // The session moved meanwhile: this id is the old agent's.
    co_return;
  }
  if (!watch.ok()) {
    // No watches from this agent (an older one: no such op): the mount
    // lives on its attribute timeout. Other refusals (EACCES, ENOENT: it
    // went) concern this directory only.
    if (absl::IsInvalidArgument(watch.status())) m->watches_work = false;
    co_return;
  }
  if (!m->table.known(node) || m->watch_of.contains(node)) {
    // Forgotten meanwhile, or watched by a lookup that raced this one (the
    // same id, counted twice on the agent): give one back.
    spawnUnwatch(*m, *watch);
    co_return;
  }
  m->watch_of[node] = *watch;
  m->node_of[*watch] = node;
  if (m->dir_attrs.contains(node)) {
    // Kept from before its own watch was in place: what changed meanwhile
    // was seen by nobody. Asked once more, beside the kernel's requests.
    spawnCounted(*m, refreshDirAttr(m, node), "fuse_dir_attr");
  }
}

void keepDirAttr(Impl& m, uint64_t node, const struct stat& st) {
  if (!S_ISDIR(st.st_mode) || m.attr_timeout <= 0) return;
  const uint64_t parent = m.table.parentOf(node);
  if (parent == 0 || !m.watch_of.contains(parent)) return;
  m.dir_attrs[node] = st;
}

const struct stat* dirAttr(const Impl& m, uint64_t node) {
  auto it = m.dir_attrs.find(node);
  if (it == m.dir_attrs.end() || !m.watch_of.contains(node)) return nullptr;
  const uint64_t parent = m.table.parentOf(node);
  if (parent == 0 || !m.watch_of.contains(parent)) return nullptr;
  return &it->second;
}

void spawnUnwatch(Impl& m, uint64_t watch) {
  if (m.stopping) return;  // the session's end drops it on the agent
  spawnCounted(m, doUnwatch(&m, watch), "fuse_unwatch");
}

bool needsWatch(const Impl& m, uint64_t node) {
  return m.watches_work && !m.stopping && !m.watch_of.contains(node) && !m.watching.contains(node);
}

void watchNode(Impl& m, uint64_t node) {
  if (!needsWatch(m, node)) return;
  auto path = m.table.path(node);
  if (!path) return;
  m.watching.insert(node);
  spawnCounted(m, watchNow(&m, node, *std::move(path), m.watch_generation), "fuse_watch");
}

void nodeForgotten(Impl& m, uint64_t node) {
  if (m.table.known(node)) return;
  m.dir_attrs.erase(node);
  auto it = m.watch_of.find(node);
  if (it == m.watch_of.end()) return;
  const uint64_t watch = it->second;
  m.node_of.erase(watch);
  m.watch_of.erase(it);
  spawnUnwatch(m, watch);
}

void onChanges(Impl& m, const client::FileChanges& c) {
  if (m.stopping) return;
  if (c.watches_lost) {
    // A failover: the old agent's watches are gone, the ids mean nothing
    // on the new one. What changed meanwhile is unknown.
    std::vector<uint64_t> watched;
    for (const auto& [node, watch] : m.watch_of) watched.push_back(node);
    everythingChanged(m);  // before the watches go: names are dropped by what the table knows
    m.watch_of.clear();
    m.node_of.clear();
    m.watching.clear();
    ++m.watch_generation;
    m.watches_work = true;
    for (uint64_t node : watched) watchNode(m, node);
    return;
  }
  if (c.overflow) everythingChanged(m);
  for (const client::FileChange& f : c.changes) {
    auto it = m.node_of.find(f.watch);
    if (it == m.node_of.end()) continue;
    const uint64_t dir = it->second;
    if (!m.table.known(dir)) {
      dropWatch(m, f.watch);
      if (!f.watch_ended) spawnUnwatch(m, f.watch);
      continue;
    }
    ++m.changes_seen;
    m.listings.erase(dir);
    if (f.name.empty() || f.created || f.removed) m.dir_attrs.erase(dir);
    if (!f.name.empty()) {
      if (const uint64_t child = m.table.find(dir, f.name); child != 0) m.dir_attrs.erase(child);
    }
    if (f.name.empty()) {
      if (f.content || f.attributes) invalInode(m, dir, kAttributesOnly);
    } else {
      const uint64_t child = m.table.find(dir, f.name);
      if (f.created || f.removed) {
        invalEntry(m, dir, f.name);
        invalInode(m, dir, 0);  // its attributes and its listing
        // Its node keeps the name: the event may be older than the mount's
        // own new file of that name. The kernel's next lookup stats it
        // anew (and a node whose type changed is a new inode to it).
        if (f.removed && child != 0) invalInode(m, child, kAttributesOnly);  // link count
      }
      if (child != 0 && (f.content || (f.created && !f.removed))) {
        // Written, or another file renamed onto the name.
        m.stamps.erase(child);
        invalInode(m, child, 0);
      } else if (child != 0 && f.attributes) {
        invalInode(m, child, kAttributesOnly);
      }
    }
    if (f.watch_ended) dropWatch(m, f.watch);
  }
}

}  // namespace siphon::fuse
