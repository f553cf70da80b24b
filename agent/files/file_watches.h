// File watches (FileWatch, FileUnwatch and FileEvents in files.proto): what
// lets `siphon fs mount` drop its cached attributes and pages the moment the
// target changes a file, instead of at the end of its attribute timeout.
//
// Each session that watches gets one inotify(7) instance, made at its first
// watch and closed when the session ends. A watch is added on an object the
// file service resolved in the target's root (an O_PATH fd, so the path is
// confined as every other; inotify_add_watch follows /proc/self/fd/N to it),
// so its id is the instance's watch descriptor: watching one object twice
// answers the same id, counted, and each watch takes one unwatch.
//
// Events are read when inotify has some, gathered for kGatherDelay, merged
// per (watch, name), and sent as one FileEvents frame on the session
// (sequenced: a resume loses none). A watch whose object is removed, moved
// away or unmounted ends (watch_ended; inotify drops it, and a moved one is
// removed here: its path is no longer the one watched). A queue overflow is
// sent as `overflow`: the client must assume everything changed.
//
// Limits: kMaxWatchesPerSession per session (ENOSPC past it, the message
// naming the limit); the system's fs.inotify.max_user_instances and
// max_user_watches answer EMFILE / ENOSPC with the sysctl named.
//
// Handover (docs/CONTINUITY.md): freeze() stops reading and sends what
// was gathered; the instances move to the new agent as descriptors (the
// same instances: their watches, and the events queued in them, go on),
// each watch with its count; the new agent reads them from start() on.
//
// Threads: the event loop only (inotify_add_watch on an fd resolved already
// does not block).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/services/session_host.h"
#include "siphon/transport/asio.h"

namespace siphon::agent::files {

inline constexpr size_t kMaxWatchesPerSession = 16384;
inline constexpr auto kGatherDelay = std::chrono::milliseconds(20);

class FileWatches {
 public:
  explicit FileWatches(net::asio::io_context& io) : io_(io) {}
  ~FileWatches();
  FileWatches(const FileWatches&) = delete;
  FileWatches& operator=(const FileWatches&) = delete;

  // Watches the object `object_fd` (O_PATH, resolved in the root) for
  // `session`; the watch's id.
  absl::StatusOr<uint64_t> add(const std::shared_ptr<SessionHost>& session, int object_fd);
  // One watch of `watch` less; EINVAL (as an errno status) for an id the
  // session does not hold.
  absl::Status remove(const std::string& session_id, uint64_t watch);
  // The session is gone: its instance closes, its events are dropped.
  void sessionEnded(const std::string& session_id);
  // The agent stops: every instance closes.
  void stop();

  // Handover. freeze(): nothing is read until thaw() (the handover failed)
  // or ever (it succeeded); what was gathered is sent now.
  void freeze();
  void thaw();
  struct Exported {
    std::string session_id;
    UniqueFd instance;  // a copy of the session's inotify descriptor
    std::map<int, uint64_t> counts;  // watch -> watches of it
  };
  absl::StatusOr<std::vector<Exported>> exportState() const;
  // On the new agent: a session's instance as exportState() gave it, read
  // from start() on.
  void restore(const std::shared_ptr<SessionHost>& session, Exported e);
  void start();

  size_t watches(const std::string& session_id) const;
  // Watches of every session.
  size_t total() const;

 private:
  struct SessionWatches;
  static void startReading(std::shared_ptr<SessionWatches> s);
  static void readEvents(const std::shared_ptr<SessionWatches>& s);
  static void flush(SessionWatches& s);

  net::asio::io_context& io_;
  std::map<std::string, std::shared_ptr<SessionWatches>> sessions_;
  bool frozen_ = false;
};

}  // namespace siphon::agent::files
