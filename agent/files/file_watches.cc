#include "agent/files/file_watches.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
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
  SessionWatches(asio::io_context& io, int fd, std::weak_ptr<SessionHost> h)
      : desc(io, fd), timer(io), host(std::move(h)) {}

  int fd() { return desc.native_handle(); }
  // Closes the instance now (its watches go with it); handlers still
  // queued see `closed`.
  void close() {
    closed = true;
    net::error_code ignored;
    timer.cancel(ignored);
    desc.close(ignored);
  }

  asio::posix::stream_descriptor desc;  // the inotify instance, owned
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
};

FileWatches::~FileWatches() { stop(); }

absl::StatusOr<uint64_t> FileWatches::add(const std::shared_ptr<SessionHost>& session,
                                          int object_fd) {
  auto& slot = sessions_[session->id()];
  if (!slot) {
    const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      sessions_.erase(session->id());
      if (err == EMFILE) {
        return errnoRefusal(EMFILE, "no inotify instance left (sysctl fs.inotify.max_user_instances)");
      }
      return errnoStatus(err, "inotify_init1");
    }
    slot = std::make_shared<SessionWatches>(io_, fd, session);
    slot->session_id = session->id();
    if (!frozen_) startReading(slot);
  }
  SessionWatches& s = *slot;
  if (s.counts.size() >= kMaxWatchesPerSession) {
    return errnoRefusal(ENOSPC, absl::StrCat("this session watches ", kMaxWatchesPerSession,
                                             " objects already (the agent's limit)"));
  }
  const std::string proc = absl::StrCat("/proc/self/fd/", object_fd);
  const int wd = ::inotify_add_watch(s.fd(), proc.c_str(), kMask);
  if (wd < 0) {
    const int err = errno;
    if (err == ENOSPC) {
      return errnoRefusal(ENOSPC, "no inotify watch left (sysctl fs.inotify.max_user_watches)");
    }
    return errnoStatus(err, "inotify_add_watch");
  }
  ++s.counts[wd];
  return static_cast<uint64_t>(wd);
}

absl::Status FileWatches::remove(const std::string& session_id, uint64_t watch) {
  auto it = sessions_.find(session_id);
  const int wd = static_cast<int>(watch);
  if (it == sessions_.end() || watch == 0 || watch > static_cast<uint64_t>(INT32_MAX) ||
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

size_t FileWatches::total() const {
  size_t n = 0;
  for (const auto& [id, s] : sessions_) n += s->counts.size();
  return n;
}

size_t FileWatches::watches(const std::string& session_id) const {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? 0 : it->second->counts.size();
}

void FileWatches::sessionEnded(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  log::debug("file_watches_closed",
             {{"session", session_id}, {"watches", it->second->counts.size()}});
  it->second->close();
  sessions_.erase(it);
}

void FileWatches::stop() {
  for (auto& [id, s] : sessions_) s->close();
  sessions_.clear();
}

void FileWatches::freeze() {
  frozen_ = true;
  for (auto& [id, s] : sessions_) {
    ++s->reading;
    net::error_code ignored;
    s->desc.cancel(ignored);
    s->timer.cancel(ignored);
    s->timer_armed = false;
    if (!s->pending.empty() || s->overflow) flush(*s);
  }
}

void FileWatches::thaw() {
  if (!frozen_) return;
  frozen_ = false;
  start();
}

void FileWatches::start() {
  for (auto& [id, s] : sessions_) {
    ++s->reading;
    startReading(s);
  }
}

absl::StatusOr<std::vector<FileWatches::Exported>> FileWatches::exportState() const {
  std::vector<Exported> out;
  for (const auto& [id, s] : sessions_) {
    if (s->closed) continue;
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
  auto s = std::make_shared<SessionWatches>(io_, e.instance.release(), session);
  s->session_id = session->id();
  s->counts.insert(e.counts.begin(), e.counts.end());
  sessions_[s->session_id] = std::move(s);
}

void FileWatches::startReading(std::shared_ptr<SessionWatches> s) {
  SessionWatches* raw = s.get();
  raw->desc.async_wait(asio::posix::descriptor_base::wait_read,
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
      std::string name = ev->len > 0 ? std::string(ev->name, strnlen(ev->name, ev->len))
                                     : std::string();
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
