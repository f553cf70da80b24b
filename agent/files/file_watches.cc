#include "agent/files/file_watches.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/files/file_system.h"
#include "siphon/status.h"
#include "siphon/v1/files.pb.h"

namespace siphon::agent::files {

namespace asio = net::asio;

namespace {

// What a watch reports. IN_EXCL_UNLINK: nothing about entries after they
// were unlinked (a program writing to a deleted log would flood us).
constexpr uint32_t kMask = IN_MODIFY | IN_CLOSE_WRITE | IN_ATTRIB | IN_CREATE | IN_DELETE |
                           IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF |
                           IN_EXCL_UNLINK;

struct Change {
  bool content = false;
  bool attributes = false;
  bool created = false;
  bool removed = false;
  bool ended = false;
};

}  // namespace

struct FileWatches::SessionWatches {
  SessionWatches(asio::io_context& io, std::weak_ptr<SessionHost> h)
      : desc(io), timer(io), host(std::move(h)) {}

  int fd() { return desc.native_handle(); }
  bool hasInstance() const { return desc.is_open(); }
  // Closes the instance now (its watches go with it); handlers still
  // queued see `closed`.
  void close() {
    closed = true;
    queue.clear();
    net::error_code ignored;
    timer.cancel(ignored);
    desc.close(ignored);
  }

  asio::posix::stream_descriptor desc;  // the inotify instance, owned (once made)
  asio::steady_timer timer;
  std::weak_ptr<SessionHost> host;
  std::string session_id;
  std::unordered_map<int, uint64_t> counts;  // watch descriptor -> watches of it
  // Gathered, not sent yet: (watch, name) -> what happened, in order of
  // first sight.
  std::vector<std::pair<std::pair<int, std::string>, Change>> pending;
  std::map<std::pair<int, std::string>, size_t> pending_index;
  bool overflow = false;
  bool timer_armed = false;
  bool closed = false;
  // Bumped by a freeze and a thaw: a wait started before is stale.
  uint64_t reading = 0;
  // Watches waiting for the session's instance, which one of them is
  // making (`creating`); once it exists, watches go to the pool at once.
  struct ToPlace {
    std::string path;
    Done done;
  };
  std::deque<ToPlace> queue;
  bool creating = false;
  size_t in_flight = 0;  // watches on the pool
};

struct FileWatches::Core : std::enable_shared_from_this<Core> {
  Core(asio::io_context& i, asio::thread_pool& b, std::shared_ptr<FileSystem> f, WatchLimits l)
      : io(i), blocking(b), fs(std::move(f)), limits(l) {}

  // What came back from the pool for one watch.
  struct Placed {
    UniqueFd created;  // the session's new instance, when it had none
    absl::StatusOr<int> wd = absl::UnknownError("not placed");
  };

  size_t total() const {
    size_t n = 0;
    for (const auto& [id, s] : sessions) n += s->counts.size();
    return n;
  }
  size_t instances() const {
    size_t n = 0;
    for (const auto& [id, s] : sessions) n += s->hasInstance() || s->creating ? 1 : 0;
    return n;
  }
  // Watches on the pool now: each may add one.
  size_t inFlight() const {
    size_t n = 0;
    for (const auto& [id, s] : sessions) n += s->in_flight;
    return n;
  }

  // The agent's limits for one more watch of `s`.
  absl::Status admit(const SessionWatches& s) const {
    if (s.counts.size() + s.in_flight >= limits.per_session) {
      return errnoRefusal(ENOSPC, absl::StrCat("this session watches ", limits.per_session,
                                               " objects already (the agent's limit per "
                                               "session)"));
    }
    if (total() + inFlight() >= limits.watches) {
      return errnoRefusal(ENOSPC, absl::StrCat("file watch limit of ", limits.watches,
                                               " reached, all sessions together (siphon-agent "
                                               "--max-file-watches raises it)"));
    }
    if (!s.hasInstance() && instances() >= limits.instances) {
      return errnoRefusal(EMFILE, absl::StrCat("file watch instance limit of ", limits.instances,
                                               " reached: that many sessions watch files already "
                                               "(siphon-agent --max-file-watch-instances raises "
                                               "it)"));
    }
    return absl::OkStatus();
  }

  // Sends the watches of `s` waiting to the pool: all of them once its
  // instance exists, else the first, which makes it.
  void next(const std::shared_ptr<SessionWatches>& s) {
    while (!s->creating && !s->closed && !s->queue.empty()) {
      SessionWatches::ToPlace p = std::move(s->queue.front());
      s->queue.pop_front();
      if (absl::Status refused = admit(*s); !refused.ok()) {
        if (auto host = s->host.lock()) host->logLimitHit(refused);
        p.done(refused);
        continue;
      }
      // The session's instance, as a copy the pool's job owns (the session
      // may end meanwhile and close its own).
      UniqueFd instance;
      if (s->hasInstance()) {
        instance.reset(::fcntl(s->fd(), F_DUPFD_CLOEXEC, 0));
        if (!instance) {
          p.done(lastErrnoStatus("file watch: dup the session's inotify instance"));
          continue;
        }
      } else {
        s->creating = true;
      }
      ++s->in_flight;
      asio::post(blocking, [weak = weak_from_this(), io = &io, fs = fs, s,
                            instance = std::move(instance), p = std::move(p)]() mutable {
        Placed placed;
        if (!instance) {
          absl::StatusOr<UniqueFd> made = fs->newWatchInstance();
          if (made.ok()) {
            placed.created = *std::move(made);
          } else {
            placed.wd = made.status();
          }
        }
        const int into = instance ? instance.get() : placed.created.get();
        if (into >= 0) placed.wd = fs->addWatch(into, p.path, kMask);
        instance.reset();
        asio::post(*io, [weak, s = std::move(s), placed = std::move(placed),
                         done = std::move(p.done)]() mutable {
          if (auto core = weak.lock()) core->placed(s, std::move(placed), std::move(done));
        });
      });
    }
  }

  // Event loop: a watch of `s` came back from the pool.
  void placed(const std::shared_ptr<SessionWatches>& s, Placed placed, Done done) {
    --s->in_flight;
    s->creating = false;  // while it is set, only the watch making the instance is out
    // An ended session's instance closed; a new one closes with `placed`.
    if (s->closed) return;
    if (placed.created) {
      net::error_code ec;
      s->desc.assign(placed.created.get(), ec);
      if (ec) {
        done(errnoStatus(ec.value(), "file watch: take the inotify instance"));
        next(s);
        return;
      }
      (void)placed.created.release();
      if (!frozen) startReading(s);
    }
    if (placed.wd.ok()) {
      ++s->counts[*placed.wd];
      done(static_cast<uint64_t>(*placed.wd));
    } else {
      done(placed.wd.status());
    }
    next(s);
  }

  asio::io_context& io;
  asio::thread_pool& blocking;
  std::shared_ptr<FileSystem> fs;
  WatchLimits limits;
  std::map<std::string, std::shared_ptr<SessionWatches>> sessions;
  bool frozen = false;
};

FileWatches::FileWatches(asio::io_context& io, asio::thread_pool& blocking,
                         std::shared_ptr<FileSystem> fs, WatchLimits limits)
    : core_(std::make_shared<Core>(io, blocking, std::move(fs), limits)) {}

FileWatches::~FileWatches() { stop(); }

void FileWatches::add(const std::shared_ptr<SessionHost>& session, std::string path, Done done) {
  auto& slot = core_->sessions[session->id()];
  if (!slot) {
    slot = std::make_shared<SessionWatches>(core_->io, session);
    slot->session_id = session->id();
  }
  slot->queue.push_back({std::move(path), std::move(done)});
  core_->next(slot);
}

absl::Status FileWatches::remove(const std::string& session_id, uint64_t watch) {
  auto it = core_->sessions.find(session_id);
  const int wd = static_cast<int>(watch);
  if (it == core_->sessions.end() || watch == 0 || watch > static_cast<uint64_t>(INT32_MAX) ||
      !it->second->counts.contains(wd)) {
    return errnoRefusal(EINVAL, absl::StrCat("watch ", watch, " is not this session's"));
  }
  SessionWatches& s = *it->second;
  if (--s.counts[wd] == 0) {
    s.counts.erase(wd);
    // Its IN_IGNORED comes later, for a watch no longer known: dropped.
    (void)::inotify_rm_watch(s.fd(), wd);
  }
  return absl::OkStatus();
}

size_t FileWatches::total() const { return core_->total(); }

size_t FileWatches::instances() const { return core_->instances(); }

size_t FileWatches::watches(const std::string& session_id) const {
  auto it = core_->sessions.find(session_id);
  return it == core_->sessions.end() ? 0 : it->second->counts.size();
}

void FileWatches::sessionEnded(const std::string& session_id) {
  auto it = core_->sessions.find(session_id);
  if (it == core_->sessions.end()) return;
  log::debug("file_watches_closed",
             {{"session", session_id}, {"watches", it->second->counts.size()}});
  it->second->close();
  core_->sessions.erase(it);
}

void FileWatches::stop() {
  for (auto& [id, s] : core_->sessions) s->close();
  core_->sessions.clear();
}

void FileWatches::freeze() {
  core_->frozen = true;
  for (auto& [id, s] : core_->sessions) {
    ++s->reading;
    net::error_code ignored;
    s->desc.cancel(ignored);
    s->timer.cancel(ignored);
    s->timer_armed = false;
    if (!s->pending.empty() || s->overflow) flush(*s);
  }
}

void FileWatches::thaw() {
  if (!core_->frozen) return;
  core_->frozen = false;
  start();
}

void FileWatches::start() {
  for (auto& [id, s] : core_->sessions) {
    if (!s->hasInstance()) continue;
    ++s->reading;
    startReading(s);
  }
}

absl::StatusOr<std::vector<FileWatches::Exported>> FileWatches::exportState() const {
  std::vector<Exported> out;
  for (const auto& [id, s] : core_->sessions) {
    if (s->closed || !s->hasInstance()) continue;
    Exported e;
    e.session_id = id;
    const int fd = ::fcntl(s->desc.native_handle(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return lastErrnoStatus("handover: dup an inotify instance");
    e.instance.reset(fd);
    e.counts.insert(s->counts.begin(), s->counts.end());
    out.push_back(std::move(e));
  }
  return out;
}

void FileWatches::restore(const std::shared_ptr<SessionHost>& session, Exported e) {
  auto s = std::make_shared<SessionWatches>(core_->io, session);
  s->desc.assign(e.instance.release());
  s->session_id = session->id();
  s->counts.insert(e.counts.begin(), e.counts.end());
  core_->sessions[s->session_id] = std::move(s);
}

void FileWatches::startReading(std::shared_ptr<SessionWatches> s) {
  SessionWatches* raw = s.get();
  raw->desc.async_wait(
      asio::posix::descriptor_base::wait_read,
      [s = std::move(s), reading = raw->reading](const net::error_code& ec) mutable {
        if (ec || s->closed || s->reading != reading) return;
        readEvents(s);
        if (!s->closed) startReading(std::move(s));
      });
}

void FileWatches::readEvents(const std::shared_ptr<SessionWatches>& self) {
  SessionWatches& s = *self;
  alignas(struct inotify_event) char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(s.fd(), buf, sizeof(buf));
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;  // EAGAIN: all read
    }
    for (ssize_t off = 0; off < n;) {
      const auto* ev = reinterpret_cast<const struct inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(struct inotify_event) + ev->len);
      if ((ev->mask & IN_Q_OVERFLOW) != 0) {
        s.overflow = true;
        continue;
      }
      if (!s.counts.contains(ev->wd)) continue;  // removed by an unwatch
      std::string name =
          ev->len > 0 ? std::string(ev->name, strnlen(ev->name, ev->len)) : std::string();
      if ((ev->mask & IN_MOVE_SELF) != 0) {
        // Still watched by inotify, but no longer at the path the client
        // watched: end it here.
        (void)::inotify_rm_watch(s.fd(), ev->wd);
      }
      const bool ended = (ev->mask & (IN_IGNORED | IN_MOVE_SELF | IN_UNMOUNT)) != 0;
      auto key = std::make_pair(ev->wd, std::move(name));
      auto [at, fresh] = s.pending_index.try_emplace(key, s.pending.size());
      if (fresh) s.pending.emplace_back(key, Change{});
      Change& c = s.pending[at->second].second;
      c.content |= (ev->mask & (IN_MODIFY | IN_CLOSE_WRITE)) != 0;
      c.attributes |= (ev->mask & (IN_ATTRIB | IN_DELETE_SELF)) != 0;
      c.created |= (ev->mask & (IN_CREATE | IN_MOVED_TO)) != 0;
      c.removed |= (ev->mask & (IN_DELETE | IN_MOVED_FROM)) != 0;
      if (ended) {
        c.ended = true;
        s.counts.erase(ev->wd);
      }
    }
  }
  if ((s.pending.empty() && !s.overflow) || s.timer_armed) return;
  s.timer_armed = true;
  s.timer.expires_after(kGatherDelay);
  s.timer.async_wait([weak = std::weak_ptr<SessionWatches>(self)](const net::error_code& ec) {
    auto s = weak.lock();
    if (ec || !s || s->closed) return;
    s->timer_armed = false;
    flush(*s);
  });
}

void FileWatches::flush(SessionWatches& s) {
  auto host = s.host.lock();
  if (!host || host->ended()) {
    s.pending.clear();
    s.pending_index.clear();
    return;
  }
  v1::FileEvents out;
  out.set_overflow(std::exchange(s.overflow, false));
  for (auto& [key, c] : s.pending) {
    v1::FileEvent* e = out.add_events();
    e->set_watch(static_cast<uint64_t>(key.first));
    e->set_name(key.second);
    e->set_content(c.content);
    e->set_attributes(c.attributes);
    e->set_created(c.created);
    e->set_removed(c.removed);
    e->set_watch_ended(c.ended);
  }
  s.pending.clear();
  s.pending_index.clear();
  host->session().sendFileEvents(std::move(out));
  host->wake();
}

}  // namespace siphon::agent::files
