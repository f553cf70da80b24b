// File watches (FileWatch, FileUnwatch and FileEvents in files.proto): what
// lets `siphon fs mount` drop its cached attributes and pages the moment the
// target changes a file, instead of at the end of its attribute timeout.
//
// Each session that watches gets one inotify(7) instance, made at its first
// watch by the file system (file_system.h): in the file helper, with the
// target's identity, so that the kernel charges the instance and its
// watches to the target's user rather than to the agent's uid 0. The agent
// holds the instance and reads its events. A watch is placed by the file
// system too: it resolves the path in the target's root and adds the watch
// on the very object it resolved, with the target's read permission
// checked by the kernel; the agent never resolves a watched path itself (a
// rename between a check and a second resolution could put the watch on a
// directory the target cannot list). Its id is the instance's watch
// descriptor: watching one object twice answers the same id, counted, and
// each watch takes one unwatch. A session's first watch makes its
// instance; the watches asked meanwhile wait for it, later ones go to the
// pool at once.
//
// Events are read when inotify has some, gathered for kGatherDelay, merged
// per (watch, name), and sent as one FileEvents frame on the session
// (sequenced: a resume loses none). A watch whose object is removed, moved
// away or unmounted ends (watch_ended; inotify drops it, and a moved one is
// removed here: its path is no longer the one watched). A queue overflow is
// sent as `overflow`: the client must assume everything changed.
//
// Limits (WatchLimits; each refusal names its limit, and is logged as a
// limit hit): kMaxWatchesPerSession per session (ENOSPC); watches of all
// sessions together, --max-file-watches (ENOSPC); instances, one per
// watching session, --max-file-watch-instances (EMFILE), both well below
// the node's per-user limits (watch_limits.h). The kernel's own refusals
// name its sysctls: fs.inotify.max_user_instances (EMFILE) and
// max_user_watches (ENOSPC) of the target's user.
//
// Handover (docs/CONTINUITY.md): freeze() stops reading and sends what
// was gathered; the instances move to the new agent as descriptors (the
// same instances: their watches, and the events queued in them, go on),
// each watch with its count; the new agent reads them from start() on, and
// its file helper places later watches in them.
//
// Threads: the event loop; add() places the watch on the blocking pool and
// answers on the event loop.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
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

class FileSystem;

struct WatchLimits {
  size_t per_session = kMaxWatchesPerSession;
  size_t watches = 2048;  // all sessions: --max-file-watches
  size_t instances = 32;  // watching sessions: --max-file-watch-instances
};

class FileWatches {
 public:
  // Watch answers: the watch's id, or why not.
  using Done = std::function<void(absl::StatusOr<uint64_t>)>;

  // `fs` makes the instances and places the watches (on `blocking`).
  FileWatches(net::asio::io_context& io, net::asio::thread_pool& blocking,
              std::shared_ptr<FileSystem> fs, WatchLimits limits);
  ~FileWatches();
  FileWatches(const FileWatches&) = delete;
  FileWatches& operator=(const FileWatches&) = delete;

  // Watches `path` (a path in the target's root) for `session`. `done`
  // runs later on the event loop with the watch's id or the error (an
  // errno status); never once the session ended.
  void add(const std::shared_ptr<SessionHost>& session, std::string path, Done done);
  // One watch of `watch` less; EINVAL (as an errno status) for an id the
  // session does not hold.
  absl::Status remove(const std::string& session_id, uint64_t watch);
  // The session is gone: its instance closes, its events and the watches
  // still to place are dropped.
  void sessionEnded(const std::string& session_id);
  // The agent stops: every instance closes.
  void stop();

  // Handover. freeze(): nothing is read until thaw() (the handover failed)
  // or ever (it succeeded); what was gathered is sent now.
  void freeze();
  void thaw();
  struct Exported {
    std::string session_id;
    UniqueFd instance;               // a copy of the session's inotify descriptor
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
  // inotify instances held (or being made), one per watching session.
  size_t instances() const;

 private:
  struct SessionWatches;
  struct Core;
  static void startReading(std::shared_ptr<SessionWatches> s);
  static void readEvents(const std::shared_ptr<SessionWatches>& s);
  static void flush(SessionWatches& s);

  // What add() and its answers from the pool share; the pool's answers
  // hold it weakly (they come to nothing once the FileWatches is gone).
  std::shared_ptr<Core> core_;
};

}  // namespace siphon::agent::files
