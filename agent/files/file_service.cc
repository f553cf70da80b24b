#include "agent/files/file_service.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <variant>
#include <cerrno>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/files/file_system.h"
#include "agent/files/file_watches.h"
#include "agent/files/fs_helper.h"
#include "agent/files/fs_policy.h"
#include "agent/files/handles.h"
#include "siphon/status.h"
#include "siphon/text.h"

namespace siphon::agent {
namespace files {
namespace {

using Result = absl::StatusOr<v1::FileResponse>;
using R = v1::FileRequest;

uint64_t handleOf(const R& req) {
  switch (req.op_case()) {
    case R::kRead:
      return req.read().fd();
    case R::kPread:
      return req.pread().fd();
    case R::kWrite:
      return req.write().fd();
    case R::kPwrite:
      return req.pwrite().fd();
    case R::kSeek:
      return req.seek().fd();
    case R::kClose:
      return req.close().fd();
    case R::kFstat:
      return req.fstat().fd();
    case R::kFtruncate:
      return req.ftruncate().fd();
    case R::kFsync:
      return req.fsync().fd();
    case R::kReaddir:
      return req.readdir().dir();
    case R::kClosedir:
      return req.closedir().dir();
    default:
      return 0;
  }
}

// close and closedir (blocking pool): drops the table's reference. The
// object closes here unless a request still running holds it.
Result closeHandle(Handle h) {
  if (auto* f = std::get_if<std::shared_ptr<FileObject>>(&h); f != nullptr && f->use_count() == 1) {
    if (absl::Status s = (*f)->close(); !s.ok()) return s;
  }
  return doneResponse();
}

class FileService : public RequestService, public std::enable_shared_from_this<FileService> {
 public:
  FileService(ServiceContext& ctx, FileServiceOptions options)
      : ctx_(ctx),
        fs_(options.fs ? options.fs : makeFileSystem(ctx)),
        table_(options.max_handles_per_session != 0 ? options.max_handles_per_session
                                                    : ctx.config.max_open_files),
        watches_(ctx.io, ctx.blocking, fs_,
                 WatchLimits{kMaxWatchesPerSession, ctx.config.max_file_watches,
                             ctx.config.max_file_watch_instances}) {
    ctx.target_restarted.push_back([fs = fs_](pid_t pid) { fs->targetRestarted(pid); });
  }

  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    const uint64_t id = request.request_id();
    R req = std::move(*request.mutable_file());
    if (absl::Status s = checkFsMode(ctx_.config.fs_mode, req); !s.ok()) {
      reply(*session, id, s);
      return;
    }
    const std::string& sid = session->id();
    const uint32_t max_read = session->session().limits().max_read_size;
    const std::string_view op = fileOpName(req);
    switch (req.op_case()) {
      case R::OP_NOT_SET:
        reply(*session, id, protoError(v1::INVALID_ARGUMENT, "file request with no op"));
        return;
      case R::kOpen:
      case R::kOpendir:
        startOpen(std::move(session), id, std::move(req));
        return;
      case R::kRead:
      case R::kPread:
      case R::kWrite:
      case R::kPwrite:
      case R::kSeek:
      case R::kFstat:
      case R::kFtruncate:
      case R::kFsync: {
        auto file = table_.file(sid, handleOf(req), op);
        if (!file.ok()) {
          reply(*session, id, file.status());
          return;
        }
        if (req.op_case() == R::kFsync && ctx_.config.fs_mode == FsMode::kReadOnly) {
          // Every handle here is open for reading (fs_policy.h): nothing of
          // ours can be dirty, and a flush of the target's own writes is
          // not the agent's to start.
          reply(*session, id, doneResponse());
          return;
        }
        uint32_t read_size = max_read;
        if (req.op_case() == R::kRead || req.op_case() == R::kPread) {
          // Room for the answer before the read: a read the buffer has no
          // room for is refused before it moves the file offset.
          auto room = reserveRead(
              *session, id, req.op_case() == R::kRead ? req.read().size() : req.pread().size(),
              max_read);
          if (!room.ok()) {
            reply(*session, id, room.status());
            return;
          }
          read_size = *room;
        }
        if (req.op_case() == R::kPread && read_size >= protocol::kDetachedDataMin &&
            protocol::PipedBytes::live() < pipe_budget_) {
          runPread(std::move(session), id, *std::move(file), std::move(req), read_size);
          return;
        }
        runBlocking(std::move(session), id,
                    [file = *std::move(file), req = std::move(req), read_size] {
                      return file->call(req, read_size);
                    });
        return;
      }
      case R::kReaddir: {
        auto dir = table_.dir(sid, req.readdir().dir(), op);
        if (!dir.ok()) {
          reply(*session, id, dir.status());
          return;
        }
        uint32_t max_entries = req.readdir().max_entries();
        max_entries = max_entries == 0 ? kDefaultDirEntries : std::min(max_entries, kMaxDirEntries);
        auto room = reserveRead(*session, id, max_read, max_read);
        if (!room.ok()) {
          reply(*session, id, room.status());
          return;
        }
        runBlocking(std::move(session), id,
                    [dir = *std::move(dir), max_entries, bytes = *room,
                     with_stat = req.readdir().with_stat()]() -> Result {
                      auto entries = dir->read(max_entries, bytes, with_stat);
                      if (!entries.ok()) return entries.status();
                      v1::FileResponse r;
                      *r.mutable_entries() = *std::move(entries);
                      return r;
                    });
        return;
      }
      case R::kWatch:
        startWatch(std::move(session), id, std::move(req));
        return;
      case R::kUnwatch:
        reply(*session, id, [&]() -> Result {
          if (absl::Status s = watches_.remove(sid, req.unwatch().watch()); !s.ok()) return s;
          return doneResponse();
        }());
        return;
      case R::kClose:
      case R::kClosedir: {
        auto h = table_.remove(sid, handleOf(req), req.op_case() == R::kClosedir, op);
        if (!h.ok()) {
          reply(*session, id, h.status());
          return;
        }
        runBlocking(std::move(session), id,
                    [h = *std::move(h)]() mutable { return closeHandle(std::move(h)); });
        return;
      }
      default: {
        const bool writes_refused = ctx_.config.fs_mode == FsMode::kReadOnly;
        runBlocking(std::move(session), id,
                    [fs = fs_, req = std::move(req), writes_refused, max_read] {
                      return fitAnswer(fs->path(req, writes_refused), max_read);
                    });
        return;
      }
    }
  }

  // Handover (docs/CONTINUITY.md): requests under way are the sessions'
  // blockers (answers owed); what stays open moves as descriptors: each
  // handle's open file (its offset, a directory's position) and each
  // session's inotify instance (its watches and queued events).
  void freeze() override { watches_.freeze(); }
  void thaw() override { watches_.thaw(); }
  void startAfterHandover() override { watches_.start(); }

  absl::Status exportState(v1::AgentState* out, std::vector<UniqueFd>* fds) override {
    std::map<std::string, v1::SessionFilesExport*> by_session;
    auto entry = [&](const std::string& sid) {
      v1::SessionFilesExport*& e = by_session[sid];
      if (e == nullptr) {
        e = out->add_files();
        e->set_session_id(sid);
        e->set_inotify(-1);
      }
      return e;
    };
    size_t moved = 0;
    for (const auto& [sid, s] : table_.sessions()) {
      v1::SessionFilesExport* e = entry(sid);
      e->set_next_handle(s.next);
      for (const auto& [number, h] : s.handles) {
        const auto* dir = std::get_if<std::shared_ptr<DirObject>>(&h);
        absl::StatusOr<UniqueFd> fd =
            dir != nullptr ? (*dir)->exportFd() : std::get<std::shared_ptr<FileObject>>(h)->exportFd();
        if (!fd.ok() && errnoOf(fd.status()) == EBADF) {
          // Its file helper was lost: it answers EBADF here, and will
          // there as a handle the session does not hold.
          log::info("file_not_handed_over", {{"session", sid}, {"handle", number},
                                             {"error", sv(fd.status().message())}});
          continue;
        }
        if (!fd.ok()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "session ", sid, ", file handle ", number, ": ", fd.status().message()));
        }
        v1::FileHandleExport* x = e->add_handles();
        x->set_handle(number);
        x->set_dir(dir != nullptr);
        x->set_fd(static_cast<int32_t>(fds->size()));
        fds->push_back(*std::move(fd));
        ++moved;
      }
    }
    ASSIGN_OR_RETURN(std::vector<FileWatches::Exported> watched, watches_.exportState());
    for (FileWatches::Exported& w : watched) {
      v1::SessionFilesExport* e = entry(w.session_id);
      e->set_inotify(static_cast<int32_t>(fds->size()));
      fds->push_back(std::move(w.instance));
      for (const auto& [wd, count] : w.counts) {
        v1::FileWatchExport* x = e->add_watches();
        x->set_watch(wd);
        x->set_count(count);
      }
    }
    if (moved > 0 || !watched.empty()) {
      log::info("files_exported", {{"handles", static_cast<uint64_t>(moved)},
                                   {"watches", static_cast<uint64_t>(watches_.total())}});
    }
    return absl::OkStatus();
  }

  absl::Status importState(
      const v1::AgentState& in, std::vector<UniqueFd>& fds,
      const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) override {
    auto take = [&](int32_t i) -> absl::StatusOr<UniqueFd> {
      if (i < 0 || static_cast<size_t>(i) >= fds.size() || !fds[static_cast<size_t>(i)].valid()) {
        return absl::InvalidArgumentError(absl::StrCat("files: descriptor ", i, " is missing"));
      }
      return std::move(fds[static_cast<size_t>(i)]);
    };
    for (const v1::SessionFilesExport& f : in.files()) {
      auto host = sessions.find(f.session_id());
      if (host == sessions.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("files of session ", f.session_id(), ", which did not come"));
      }
      HandleTable::Session handles;
      handles.next = std::max<uint64_t>(f.next_handle(), 1);
      for (const v1::FileHandleExport& h : f.handles()) {
        if (h.handle() == 0 || h.handle() >= handles.next) {
          return absl::InvalidArgumentError(absl::StrCat(
              "session ", f.session_id(), ": file handle ", h.handle(), " is past its next one"));
        }
        ASSIGN_OR_RETURN(UniqueFd fd, take(h.fd()));
        absl::StatusOr<Handle> object = fs_->adopt(std::move(fd), h.dir());
        if (!object.ok()) {
          return absl::Status(object.status().code(),
                              absl::StrCat("session ", f.session_id(), ", file handle ",
                                           h.handle(), ": ", object.status().message()));
        }
        handles.handles.emplace(h.handle(), *std::move(object));
      }
      table_.restore(f.session_id(), std::move(handles));
      if (f.inotify() >= 0) {
        FileWatches::Exported w;
        w.session_id = f.session_id();
        ASSIGN_OR_RETURN(w.instance, take(f.inotify()));
        for (const v1::FileWatchExport& x : f.watches()) w.counts[x.watch()] = x.count();
        watches_.restore(host->second, std::move(w));
      }
    }
    return absl::OkStatus();
  }

  void sessionEnded(const std::string& session_id) override {
    watches_.sessionEnded(session_id);
    std::vector<Handle> handles = table_.removeSession(session_id);
    if (handles.empty()) return;
    log::debug("files_closed", {{"session", session_id}, {"handles", handles.size()}});
    dropOnPool(std::move(handles));
  }

  void agentStopping() override { watches_.stop(); }

 private:
  // Runs `job` (-> Result) on the blocking pool and answers with its result
  // from the event loop. The job, and what it holds (an open file), is
  // destroyed on the pool thread.
  template <typename Job>
  void runBlocking(std::shared_ptr<SessionHost> session, uint64_t id, Job job) {
    net::asio::post(ctx_.blocking, [io = &ctx_.io, session = std::move(session), id,
                                    job = std::move(job)]() mutable {
      Result r = job();
      net::asio::post(*io, [session = std::move(session), id, r = std::move(r)]() mutable {
        reply(*session, id, std::move(r));
      });
    });
  }

  // A large pread on the blocking pool: spliced into a pipe when the file
  // allows (root_fs.h, splicePreadFd), so that the answer's bytes go to the
  // socket uncopied (protocol/piped_bytes.h); otherwise read as any call.
  void runPread(std::shared_ptr<SessionHost> session, uint64_t id,
                std::shared_ptr<FileObject> file, R req, uint32_t read_size) {
    net::asio::post(ctx_.blocking, [io = &ctx_.io, session = std::move(session), id,
                                    file = std::move(file), req = std::move(req),
                                    read_size]() mutable {
      auto piped = file->splicePread(req.pread().offset(), read_size);
      if (piped.ok() && piped->has_value()) {
        net::asio::post(*io, [session = std::move(session), id,
                              p = std::move(**piped)]() mutable {
          v1::Response response;
          response.set_request_id(id);
          response.mutable_file()->mutable_data()->set_eof(p.eof);
          session->respond(std::move(response), std::move(p.bytes));
        });
        return;
      }
      Result r = piped.ok() ? file->call(req, read_size) : Result(piped.status());
      file.reset();  // a close waiting for this read happens here, on the pool
      net::asio::post(*io, [session = std::move(session), id, r = std::move(r)]() mutable {
        reply(*session, id, std::move(r));
      });
    });
  }

  // An xattr value or name list (up to 64 KiB) larger than the session's
  // max_read_size might not fit its frames: E2BIG with the limit named (a
  // rule of the agent's, not the kernel's ERANGE for a short buffer).
  static Result fitAnswer(Result r, uint32_t max_read) {
    if (!r.ok()) return r;
    size_t size = 0;
    if (r->has_xattr_value()) size = r->xattr_value().value().size();
    if (r->has_xattr_names()) size = r->xattr_names().ByteSizeLong();
    if (size > max_read) {
      return errnoRefusal(E2BIG, absl::StrCat("the answer (", size,
                                              " bytes) is larger than this session's read size (",
                                              max_read, ", siphon-agent --max-read-size)"));
    }
    return r;
  }

  // The bytes a read of `wanted` may answer with: at most max_read, and
  // room held for them in the session's buffer (SESSION_BUFFER_FULL when
  // it has none).
  static absl::StatusOr<uint32_t> reserveRead(SessionHost& session, uint64_t id, uint32_t wanted,
                                              uint32_t max_read) {
    auto room = session.session().reserveResponse(id, std::min(wanted, max_read));
    if (!room.ok()) return room.status();
    return static_cast<uint32_t>(*room);
  }

  // What an opendir read at once (FileOpendir.read_entries).
  struct FirstListing {
    v1::FileDirEntries entries;
    bool closed = false;  // all of it, and close_at_eof: the handle is gone
  };

  void startOpen(std::shared_ptr<SessionHost> session, uint64_t id, R req) {
    if (table_.full(session->id())) {
      absl::Status full = errnoRefusal(EMFILE, table_.limitText());
      session->logLimitHit(full);
      reply(*session, id, full);
      return;
    }
    // An opendir that reads its first entries too: room for them, as a
    // readdir holds it.
    uint32_t list_bytes = 0;
    if (req.op_case() == R::kOpendir && req.opendir().read_entries() > 0) {
      const uint32_t max_read = session->session().limits().max_read_size;
      auto room = reserveRead(*session, id, max_read, max_read);
      if (!room.ok()) {
        reply(*session, id, room.status());
        return;
      }
      list_bytes = *room;
    }
    net::asio::post(ctx_.blocking, [self = shared_from_this(), session = std::move(session), id,
                                    req = std::move(req), list_bytes]() mutable {
      absl::StatusOr<Handle> h = self->fs_->open(req);
      std::optional<FirstListing> first;
      if (h.ok() && list_bytes > 0) {
        if (auto* dir = std::get_if<std::shared_ptr<DirObject>>(&*h)) {
          const v1::FileOpendir& o = req.opendir();
          auto entries = (*dir)->read(std::min(o.read_entries(), kMaxDirEntries), list_bytes,
                                      o.with_stat());
          if (!entries.ok()) {
            h = entries.status();  // the directory closes here, on the pool
          } else {
            first.emplace();
            first->entries = *std::move(entries);
            if (first->entries.eof() && o.close_at_eof()) {
              first->closed = true;
              h = Handle{};  // the last reference: closed here, on the pool
            }
          }
        }
      }
      net::asio::post(self->ctx_.io, [self, session = std::move(session), id, h = std::move(h),
                                      first = std::move(first)]() mutable {
        self->finishOpen(*session, id, std::move(h), std::move(first));
      });
    });
  }

  // A watch (file_watches.h): the file system resolves the path and
  // places the watch on what it resolved, with its identity (the file
  // helper's: the target's), on the pool; the answer comes back here.
  void startWatch(std::shared_ptr<SessionHost> session, uint64_t id, R req) {
    std::weak_ptr<SessionHost> weak = session;
    watches_.add(session, std::move(*req.mutable_watch()->mutable_path()),
                 [weak, id](absl::StatusOr<uint64_t> watch) {
                   auto session = weak.lock();
                   if (!session || session->ended()) return;
                   if (!watch.ok()) {
                     reply(*session, id, watch.status());
                     return;
                   }
                   v1::FileResponse r;
                   r.mutable_watched()->set_watch(*watch);
                   reply(*session, id, std::move(r));
                 });
  }

  // On the event loop, once open() returned.
  void finishOpen(SessionHost& session, uint64_t id, absl::StatusOr<Handle> h,
                  std::optional<FirstListing> first) {
    if (!h.ok()) {
      reply(session, id, h.status());
      return;
    }
    if (first && first->closed) {
      v1::FileResponse r;
      r.mutable_opened()->set_closed(true);
      *r.mutable_opened()->mutable_entries() = std::move(first->entries);
      reply(session, id, std::move(r));
      return;
    }
    if (session.ended()) {
      // sessionEnded() already ran: keeping the fd would leak it.
      dropOnPool(*std::move(h));
      return;
    }
    auto handle = table_.add(session.id(), *h);
    if (!handle.ok()) {
      // Opens that raced past the check in startOpen.
      session.logLimitHit(handle.status());
      dropOnPool(*std::move(h));
      reply(session, id, handle.status());
      return;
    }
    v1::FileResponse r;
    r.mutable_opened()->set_fd(*handle);
    if (first) *r.mutable_opened()->mutable_entries() = std::move(first->entries);
    reply(session, id, std::move(r));
  }

  // close(2) may block (NFS, FUSE flush): let the last reference go on the
  // pool.
  template <typename T>
  void dropOnPool(T doomed) {
    net::asio::post(ctx_.blocking, [doomed = std::move(doomed)]() mutable {
      T gone = std::move(doomed);
      (void)gone;
    });
  }

  static void reply(SessionHost& session, uint64_t id, Result r) {
    v1::Response response;
    response.set_request_id(id);
    if (r.ok()) {
      *response.mutable_file() = *std::move(r);
    } else {
      log::debug("file_request_failed",
                 {{"session", session.id()}, {"error", sv(r.status().message())}});
      *response.mutable_error() = toProtoError(r.status());
    }
    session.respond(std::move(response));
  }

  // Pipes that piped reads may hold at once, all sessions together (each
  // is a descriptor until the client acknowledges its answer): an eighth
  // of the descriptor limit; past it reads are copied.
  static int64_t pipeBudget() {
    struct rlimit lim {};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 1024;
    return static_cast<int64_t>(lim.rlim_cur / 8);
  }

  ServiceContext& ctx_;
  const int64_t pipe_budget_ = pipeBudget();
  std::shared_ptr<FileSystem> fs_;
  HandleTable table_;     // event loop only
  FileWatches watches_;  // event loop only
};

}  // namespace
}  // namespace files

std::shared_ptr<RequestService> makeFileService(ServiceContext& ctx,
                                                files::FileServiceOptions options) {
  return std::make_shared<files::FileService>(ctx, options);
}

}  // namespace siphon::agent
