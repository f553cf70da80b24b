#include "agent/files/file_service.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

#include "agent/common/log.h"
#include "agent/files/fs_policy.h"
#include "agent/files/handles.h"
#include "agent/files/root_fs.h"
#include "agent/server/server.h"
#include "siphon/status.h"
#include "siphon/text.h"

namespace siphon::agent {
namespace files {
namespace {

using Result = absl::StatusOr<v1::FileResponse>;
using R = v1::FileRequest;

v1::FileResponse done() {
  v1::FileResponse r;
  r.mutable_done();
  return r;
}

Result doneOr(const absl::Status& s) {
  if (!s.ok()) return s;
  return done();
}

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
    case R::kReaddir:
      return req.readdir().dir();
    case R::kClosedir:
      return req.closedir().dir();
    default:
      return 0;
  }
}

// Requests on an open file (blocking pool).
Result onFile(const OpenFile& file, const R& req, uint32_t max_read) {
  const int fd = file.fd.get();
  v1::FileResponse r;
  switch (req.op_case()) {
    case R::kRead: {
      auto d = readFd(fd, std::min(req.read().size(), max_read));
      if (!d.ok()) return d.status();
      *r.mutable_data() = *std::move(d);
      return r;
    }
    case R::kPread: {
      auto d = preadFd(fd, std::min(req.pread().size(), max_read), req.pread().offset());
      if (!d.ok()) return d.status();
      *r.mutable_data() = *std::move(d);
      return r;
    }
    case R::kWrite: {
      auto n = writeFd(fd, req.write().data());
      if (!n.ok()) return n.status();
      r.mutable_written()->set_written(*n);
      return r;
    }
    case R::kPwrite: {
      auto n = pwriteFd(fd, req.pwrite().data(), req.pwrite().offset());
      if (!n.ok()) return n.status();
      r.mutable_written()->set_written(*n);
      return r;
    }
    case R::kSeek: {
      auto off = seekFd(fd, req.seek().offset(), req.seek().whence());
      if (!off.ok()) return off.status();
      r.mutable_offset()->set_offset(*off);
      return r;
    }
    case R::kFstat: {
      auto st = fstatFd(fd);
      if (!st.ok()) return st.status();
      *r.mutable_stat() = *std::move(st);
      return r;
    }
    case R::kFtruncate:
      return doneOr(ftruncateFd(fd, req.ftruncate().length()));
    default:
      return protoError(v1::INTERNAL, "not a file-handle request");
  }
}

// Requests on a path (blocking pool).
Result onPath(const RootFs& root, const R& req, bool writes_refused) {
  v1::FileResponse r;
  switch (req.op_case()) {
    case R::kStat: {
      auto st = root.stat(req.stat().path(), req.stat().follow_symlinks());
      if (!st.ok()) return st.status();
      *r.mutable_stat() = *std::move(st);
      return r;
    }
    case R::kStatfs: {
      auto st = root.statfs(req.statfs().path());
      if (!st.ok()) return st.status();
      *r.mutable_fs_stat() = *std::move(st);
      return r;
    }
    case R::kAccess:
      return doneOr(root.access(req.access().path(), req.access().mode(), writes_refused));
    case R::kReadlink: {
      auto target = root.readlink(req.readlink().path());
      if (!target.ok()) return target.status();
      // A proto3 string must be UTF-8 (the peer's parser rejects it
      // otherwise); odd bytes become U+FFFD.
      r.mutable_link()->set_target(toUtf8Lossy(*target));
      return r;
    }
    case R::kMkdir:
      return doneOr(root.mkdir(req.mkdir().path(), req.mkdir().mode()));
    case R::kRmdir:
      return doneOr(root.rmdir(req.rmdir().path()));
    case R::kUnlink:
      return doneOr(root.unlink(req.unlink().path()));
    case R::kRename:
      return doneOr(root.rename(req.rename().from(), req.rename().to(), req.rename().flags()));
    case R::kTruncate:
      return doneOr(root.truncate(req.truncate().path(), req.truncate().length()));
    case R::kChmod:
      return doneOr(root.chmod(req.chmod().path(), req.chmod().mode()));
    case R::kChown:
      return doneOr(root.chown(req.chown().path(), req.chown().uid(), req.chown().gid(),
                               req.chown().follow_symlinks()));
    case R::kUtimens:
      return doneOr(root.utimens(req.utimens().path(), req.utimens().atime_ns(),
                                 req.utimens().mtime_ns(), req.utimens().follow_symlinks()));
    default:
      return protoError(v1::INTERNAL, "not a path request");
  }
}

// open and opendir (blocking pool).
absl::StatusOr<Handle> openHandle(const RootFs& root, const R& req) {
  if (req.op_case() == R::kOpendir) {
    auto fd = root.openDir(req.opendir().path());
    if (!fd.ok()) return fd.status();
    auto dir = OpenDir::create(*std::move(fd));
    if (!dir.ok()) return dir.status();
    return Handle(*std::move(dir));
  }
  auto fd = root.open(req.open().path(), req.open().flags(), req.open().mode());
  if (!fd.ok()) return fd.status();
  return Handle(std::make_shared<OpenFile>(*std::move(fd)));
}

// close and closedir (blocking pool): drops the table's reference. The fd
// closes here unless a request still running holds it.
Result closeHandle(Handle h) {
  if (auto* f = std::get_if<std::shared_ptr<OpenFile>>(&h); f != nullptr && f->use_count() == 1) {
    const int fd = (*f)->fd.release();
    // Linux releases the fd even when close() fails; the error (EIO, ENOSPC
    // on NFS...) is still worth reporting. Never retried (see UniqueFd).
    if (::close(fd) != 0 && errno != EINTR) return lastErrnoStatus("close");
  }
  return done();
}

class FileService : public RequestService, public std::enable_shared_from_this<FileService> {
 public:
  FileService(ServiceContext& ctx, FileServiceOptions options)
      : ctx_(ctx),
        root_(ctx.target.rootFd()),
        table_(options.max_handles_per_session != 0 ? options.max_handles_per_session
                                                    : ctx.config.max_open_files) {}

  void handle(std::shared_ptr<AgentSession> session, v1::Request request) override {
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
      case R::kFtruncate: {
        auto file = table_.file(sid, handleOf(req), op);
        if (!file.ok()) {
          reply(*session, id, file.status());
          return;
        }
        uint32_t read_size = max_read;
        if (req.op_case() == R::kRead || req.op_case() == R::kPread) {
          // Room for the answer before the read: a read the buffer has no
          // room for is refused before it moves the file offset.
          auto room = reserveRead(*session, id,
                                  req.op_case() == R::kRead ? req.read().size()
                                                            : req.pread().size(),
                                  max_read);
          if (!room.ok()) {
            reply(*session, id, room.status());
            return;
          }
          read_size = *room;
        }
        runBlocking(std::move(session), id,
                    [file = *std::move(file), req = std::move(req), read_size] {
                      return onFile(*file, req, read_size);
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
                    [dir = *std::move(dir), max_entries, bytes = *room]() -> Result {
                      auto entries = dir->read(max_entries, bytes);
                      if (!entries.ok()) return entries.status();
                      v1::FileResponse r;
                      *r.mutable_entries() = *std::move(entries);
                      return r;
                    });
        return;
      }
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
        runBlocking(std::move(session), id, [root = root_, req = std::move(req), writes_refused] {
          return onPath(root, req, writes_refused);
        });
        return;
      }
    }
  }

  void sessionEnded(const std::string& session_id) override {
    std::vector<Handle> handles = table_.removeSession(session_id);
    if (handles.empty()) return;
    log::debug("files_closed", {{"session", session_id}, {"handles", handles.size()}});
    dropOnPool(std::move(handles));
  }

 private:
  // Runs `job` (-> Result) on the blocking pool and answers with its result
  // from the event loop. The job, and what it holds (an open file), is
  // destroyed on the pool thread.
  template <typename Job>
  void runBlocking(std::shared_ptr<AgentSession> session, uint64_t id, Job job) {
    net::asio::post(ctx_.blocking, [io = &ctx_.io, session = std::move(session), id,
                                    job = std::move(job)]() mutable {
      Result r = job();
      net::asio::post(*io, [session = std::move(session), id, r = std::move(r)]() mutable {
        reply(*session, id, std::move(r));
      });
    });
  }

  // The bytes a read of `wanted` may answer with: at most max_read, and
  // room held for them in the session's buffer (SESSION_BUFFER_FULL when
  // it has none).
  static absl::StatusOr<uint32_t> reserveRead(AgentSession& session, uint64_t id,
                                              uint32_t wanted, uint32_t max_read) {
    auto room = session.session().reserveResponse(id, std::min(wanted, max_read));
    if (!room.ok()) return room.status();
    return static_cast<uint32_t>(*room);
  }

  void startOpen(std::shared_ptr<AgentSession> session, uint64_t id, R req) {
    if (table_.full(session->id())) {
      absl::Status full = errnoRefusal(EMFILE, table_.limitText());
      session->logLimitHit(full);
      reply(*session, id, full);
      return;
    }
    net::asio::post(ctx_.blocking, [self = shared_from_this(), session = std::move(session), id,
                                    req = std::move(req)]() mutable {
      absl::StatusOr<Handle> h = openHandle(self->root_, req);
      net::asio::post(self->ctx_.io,
                      [self, session = std::move(session), id, h = std::move(h)]() mutable {
                        self->finishOpen(*session, id, std::move(h));
                      });
    });
  }

  // On the event loop, once open() returned.
  void finishOpen(AgentSession& session, uint64_t id, absl::StatusOr<Handle> h) {
    if (!h.ok()) {
      reply(session, id, h.status());
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

  static void reply(AgentSession& session, uint64_t id, Result r) {
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

  ServiceContext& ctx_;
  RootFs root_;
  HandleTable table_;  // event loop only
};

}  // namespace
}  // namespace files

std::shared_ptr<RequestService> makeFileService(ServiceContext& ctx,
                                                files::FileServiceOptions options) {
  return std::make_shared<files::FileService>(ctx, options);
}

}  // namespace siphon::agent
