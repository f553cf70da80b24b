// The typed file API (siphon/client/files.h) over FileRequests.
#include "siphon/client/files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <deque>

#include "absl/strings/str_cat.h"
#include "client/file_call.h"
#include "client/target_core.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::client {

// A handle on the agent under this client's number. The last copy of a
// File or Directory closes it (without waiting) unless close() did.
struct HandleState {
  HandleState(std::shared_ptr<TargetCore> c, uint64_t h, bool dir)
      : core(std::move(c)), handle(h), directory(dir) {}
  ~HandleState() {
    if (!closed) core->client->closeHandleNoWait(handle, directory);
  }
  std::shared_ptr<TargetCore> core;
  const uint64_t handle;
  const bool directory;
  bool closed = false;
};

net::awaitable<FileResult> fileCall(std::shared_ptr<TargetCore> core_in, v1::FileRequest f,
                                    std::shared_ptr<protocol::PipedBytes>* piped) {
  const std::shared_ptr<TargetCore> core = std::move(core_in);
  v1::Request request;
  *request.mutable_file() = std::move(f);
  auto r = co_await core->call(std::move(request), piped);
  if (!r.ok()) co_return r.status();
  if (!r->has_file()) co_return wrongKind("file");
  co_return std::move(*r->mutable_file());
}

net::awaitable<absl::Status> doneCall(std::shared_ptr<TargetCore> core, v1::FileRequest f) {
  auto r = co_await fileCall(std::move(core), std::move(f));
  co_return r.status();
}

bool FileStat::isDirectory() const { return S_ISDIR(mode); }
bool FileStat::isRegular() const { return S_ISREG(mode); }
bool FileStat::isSymlink() const { return S_ISLNK(mode); }

namespace {

FileStat statFrom(const v1::FileStat& s) {
  FileStat out;
  out.dev = s.dev();
  out.ino = s.ino();
  out.mode = s.mode();
  out.nlink = s.nlink();
  out.uid = s.uid();
  out.gid = s.gid();
  out.rdev = s.rdev();
  out.size = s.size();
  out.blksize = s.blksize();
  out.blocks = s.blocks();
  out.atime_ns = s.atime_ns();
  out.mtime_ns = s.mtime_ns();
  out.ctime_ns = s.ctime_ns();
  return out;
}

absl::StatusOr<FileData> dataFrom(FileResult r) {
  if (!r.ok()) return r.status();
  if (!r->has_data()) return wrongKind("read");
  return FileData{std::move(*r->mutable_data()->mutable_data()), r->data().eof(), nullptr};
}

absl::StatusOr<uint64_t> writtenFrom(const FileResult& r) {
  if (!r.ok()) return r.status();
  if (!r->has_written()) return wrongKind("write");
  return r->written().written();
}

absl::Status closedStatus(uint64_t handle) {
  return errnoStatus(EBADF, absl::StrCat("fd ", handle, " is closed"));
}

v1::FileRequest preadRequest(uint64_t fd, int64_t offset, uint32_t size) {
  v1::FileRequest f;
  f.mutable_pread()->set_fd(fd);
  f.mutable_pread()->set_offset(offset);
  f.mutable_pread()->set_size(size);
  return f;
}

v1::FileRequest pwriteRequest(uint64_t fd, int64_t offset, std::string data) {
  v1::FileRequest f;
  f.mutable_pwrite()->set_fd(fd);
  f.mutable_pwrite()->set_offset(offset);
  f.mutable_pwrite()->set_data(std::move(data));
  return f;
}

v1::FileRequest statRequest(std::string path, bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_stat()->set_path(std::move(path));
  f.mutable_stat()->set_follow_symlinks(follow_symlinks);
  return f;
}

absl::StatusOr<FileStat> statOf(FileResult r, std::string_view what) {
  if (!r.ok()) return r.status();
  if (!r->has_stat()) return wrongKind(what);
  return statFrom(r->stat());
}

// Pipelined calls: started detached, answered into a slot. Requests go out
// in the order they were started (spawn queues them on the executor).
net::awaitable<void> runPread(std::shared_ptr<HandleState> state_in, int64_t offset, uint32_t size,
                              bool piped, std::shared_ptr<PendingSlot<FileData>> slot_in) {
  const auto state = std::move(state_in);
  const auto slot = std::move(slot_in);
  if (state->closed) {
    slot->set(closedStatus(state->handle));
    co_return;
  }
  std::shared_ptr<protocol::PipedBytes> pipe;
  auto data = dataFrom(co_await fileCall(state->core, preadRequest(state->handle, offset, size),
                                         piped ? &pipe : nullptr));
  if (data.ok()) data->piped = std::move(pipe);
  slot->set(std::move(data));
}

net::awaitable<void> runPwrite(std::shared_ptr<HandleState> state_in, int64_t offset,
                               std::string data, std::shared_ptr<PendingSlot<uint64_t>> slot_in) {
  const auto state = std::move(state_in);
  const auto slot = std::move(slot_in);
  if (state->closed) {
    slot->set(closedStatus(state->handle));
    co_return;
  }
  slot->set(writtenFrom(
      co_await fileCall(state->core, pwriteRequest(state->handle, offset, std::move(data)))));
}

net::awaitable<void> runStat(std::shared_ptr<TargetCore> core_in, std::string path,
                             bool follow_symlinks, std::shared_ptr<PendingSlot<FileStat>> slot_in) {
  const auto core = std::move(core_in);
  const auto slot = std::move(slot_in);
  slot->set(statOf(co_await fileCall(core, statRequest(std::move(path), follow_symlinks)),
                   follow_symlinks ? "stat" : "lstat"));
}

DirBatch batchFrom(v1::FileDirEntries& entries, bool with_stat) {
  DirBatch out;
  out.eof = entries.eof();
  for (v1::DirEntry& e : *entries.mutable_entries()) {
    DirEntry entry;
    entry.name = std::move(*e.mutable_name());
    entry.ino = e.ino();
    entry.type = e.type();
    if (with_stat && e.has_stat()) entry.stat = statFrom(e.stat());
    out.entries.push_back(std::move(entry));
  }
  return out;
}

// One readdir; with_stat asks for each entry's lstat, which an agent that
// predates the field leaves out (the entries come without stat then).
net::awaitable<absl::StatusOr<DirBatch>> readBatch(std::shared_ptr<HandleState> state_in,
                                                   uint32_t max_entries, bool with_stat) {
  const auto state = std::move(state_in);
  if (!state || state->closed) co_return closedStatus(state ? state->handle : 0);
  v1::FileRequest f;
  f.mutable_readdir()->set_dir(state->handle);
  f.mutable_readdir()->set_max_entries(max_entries);
  f.mutable_readdir()->set_with_stat(with_stat);
  auto r = co_await fileCall(state->core, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_entries()) co_return wrongKind("readdir");
  co_return batchFrom(*r->mutable_entries(), with_stat);
}

template <typename T>
std::function<void()> failSlot(std::shared_ptr<PendingSlot<T>> slot) {
  return [slot] {
    if (!slot->result) slot->set(protoError(v1::INTERNAL, "the file call failed"));
  };
}

}  // namespace

// ------------------------------------------------------------------- File

uint64_t File::handle() const { return state_ ? state_->handle : 0; }

absl::Status File::alive() const {
  if (!state_) return errnoStatus(EBADF, "no file");
  if (state_->closed) return closedStatus(state_->handle);
  return state_->core->client->handleStatus(state_->handle);
}

net::awaitable<absl::StatusOr<FileData>> File::read(uint32_t size) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  v1::FileRequest f;
  f.mutable_read()->set_fd(state->handle);
  f.mutable_read()->set_size(size);
  co_return dataFrom(co_await fileCall(state->core, std::move(f)));
}

net::awaitable<absl::StatusOr<FileData>> File::pread(int64_t offset, uint32_t size) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  co_return dataFrom(co_await fileCall(state->core, preadRequest(state->handle, offset, size)));
}

net::awaitable<absl::StatusOr<uint64_t>> File::write(std::string data) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  v1::FileRequest f;
  f.mutable_write()->set_fd(state->handle);
  f.mutable_write()->set_data(std::move(data));
  co_return writtenFrom(co_await fileCall(state->core, std::move(f)));
}

net::awaitable<absl::StatusOr<uint64_t>> File::pwrite(int64_t offset, std::string data) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  co_return writtenFrom(
      co_await fileCall(state->core, pwriteRequest(state->handle, offset, std::move(data))));
}

Pending<FileData> File::startPread(int64_t offset, uint32_t size, bool piped) {
  auto slot = std::make_shared<PendingSlot<FileData>>(state_->core->ex);
  net::spawn(state_->core->ex, runPread(state_, offset, size, piped, slot), "client_pread",
             failSlot(slot));
  return Pending<FileData>(slot);
}

Pending<uint64_t> File::startPwrite(int64_t offset, std::string data) {
  auto slot = std::make_shared<PendingSlot<uint64_t>>(state_->core->ex);
  net::spawn(state_->core->ex, runPwrite(state_, offset, std::move(data), slot), "client_pwrite",
             failSlot(slot));
  return Pending<uint64_t>(slot);
}

net::awaitable<absl::StatusOr<int64_t>> File::seek(int64_t offset, int whence) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  v1::FileRequest f;
  f.mutable_seek()->set_fd(state->handle);
  f.mutable_seek()->set_offset(offset);
  f.mutable_seek()->set_whence(whence);
  auto r = co_await fileCall(state->core, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_offset()) co_return wrongKind("seek");
  co_return r->offset().offset();
}

net::awaitable<absl::StatusOr<FileStat>> File::stat() {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  v1::FileRequest f;
  f.mutable_fstat()->set_fd(state->handle);
  auto r = co_await fileCall(state->core, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_stat()) co_return wrongKind("fstat");
  co_return statFrom(r->stat());
}

net::awaitable<absl::Status> File::truncate(int64_t length) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  v1::FileRequest f;
  f.mutable_ftruncate()->set_fd(state->handle);
  f.mutable_ftruncate()->set_length(length);
  co_return co_await doneCall(state->core, std::move(f));
}

net::awaitable<absl::Status> File::fsync(bool datasync) {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  v1::FileRequest f;
  f.mutable_fsync()->set_fd(state->handle);
  f.mutable_fsync()->set_datasync(datasync);
  co_return co_await doneCall(state->core, std::move(f));
}

net::awaitable<absl::Status> File::close() {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  state->closed = true;
  v1::FileRequest f;
  f.mutable_close()->set_fd(state->handle);
  co_return co_await doneCall(state->core, std::move(f));
}

// -------------------------------------------------------------- Directory

uint64_t Directory::handle() const { return state_ ? state_->handle : 0; }

absl::Status Directory::alive() const {
  if (!state_) return errnoStatus(EBADF, "no directory");
  if (state_->closed) return closedStatus(state_->handle);
  return state_->core->client->handleStatus(state_->handle);
}

net::awaitable<absl::StatusOr<std::vector<DirEntry>>> Directory::next(uint32_t max_entries) {
  auto batch = co_await nextBatch(max_entries);
  if (!batch.ok()) co_return batch.status();
  co_return std::move(batch->entries);
}

net::awaitable<absl::StatusOr<DirBatch>> Directory::nextBatch(uint32_t max_entries) {
  co_return co_await readBatch(state_, max_entries, false);
}

net::awaitable<absl::StatusOr<DirBatch>> Directory::nextBatchPlus(uint32_t max_entries) {
  co_return co_await readBatch(state_, max_entries, true);
}

net::awaitable<absl::Status> Directory::close() {
  const auto state = state_;
  if (!state || state->closed) co_return closedStatus(handle());
  state->closed = true;
  v1::FileRequest f;
  f.mutable_closedir()->set_dir(state->handle);
  co_return co_await doneCall(state->core, std::move(f));
}

// ------------------------------------------------------------------ Files

Files::Files(const Target& target) : core_(target.core()) {}

uint32_t Files::maxReadSize() const { return core_->client->maxReadSize(); }

uint32_t Files::readChunk() const {
  const uint32_t max = maxReadSize();
  return max >= 4096 ? max / 4096 * 4096 : max;
}

net::awaitable<absl::StatusOr<File>> Files::open(std::string path, int flags, uint32_t mode) {
  const auto core = core_;
  v1::FileRequest f;
  f.mutable_open()->set_path(std::move(path));
  f.mutable_open()->set_flags(flags);
  f.mutable_open()->set_mode(mode);
  auto r = co_await fileCall(core, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_opened()) co_return wrongKind("open");
  co_return File(std::make_shared<HandleState>(core, r->opened().fd(), false));
}

net::awaitable<absl::StatusOr<Directory>> Files::openDirectory(std::string path) {
  const auto core = core_;
  v1::FileRequest f;
  f.mutable_opendir()->set_path(std::move(path));
  auto r = co_await fileCall(core, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_opened()) co_return wrongKind("opendir");
  co_return Directory(std::make_shared<HandleState>(core, r->opened().fd(), true));
}

net::awaitable<absl::StatusOr<std::vector<DirEntry>>> Files::readdir(std::string path) {
  co_return co_await list(std::move(path), false);
}

net::awaitable<absl::StatusOr<std::vector<DirEntry>>> Files::list(std::string path,
                                                                  bool with_stat) {
  const auto core = core_;
  v1::FileRequest f;
  f.mutable_opendir()->set_path(std::move(path));
  f.mutable_opendir()->set_read_entries(kListBatch);
  f.mutable_opendir()->set_with_stat(with_stat);
  f.mutable_opendir()->set_close_at_eof(true);
  auto r = co_await fileCall(core, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_opened()) co_return wrongKind("opendir");
  v1::FileOpened& opened = *r->mutable_opened();
  std::vector<DirEntry> all;
  bool eof = false;
  if (opened.has_entries()) {
    DirBatch first = batchFrom(*opened.mutable_entries(), with_stat);
    eof = first.eof || first.entries.empty();
    all = std::move(first.entries);
  }
  if (opened.closed()) co_return all;
  // An older agent (the handle alone), or more than one batch.
  Directory dir(std::make_shared<HandleState>(core, opened.fd(), true));
  while (!eof) {
    auto some = co_await readBatch(dir.state_, kListBatch, with_stat);
    if (!some.ok()) co_return some.status();
    for (auto& e : some->entries) all.push_back(std::move(e));
    // An empty batch is the end too, whatever its flag says: asking again
    // would only get the same.
    eof = some->eof || some->entries.empty();
  }
  CO_RETURN_IF_ERROR(co_await dir.close());
  co_return all;
}

net::awaitable<absl::StatusOr<std::string>> Files::readFile(std::string path, size_t depth,
                                                            uint32_t chunk) {
  const auto core = core_;
  auto file = co_await open(std::move(path), O_RDONLY);
  if (!file.ok()) co_return file.status();
  if (chunk == 0) chunk = readChunk();
  depth = std::max<size_t>(depth, 1);
  // Preads ahead up to `depth`; a short read that is not the end (the file
  // changed under us) drops what was issued past it and goes on from there.
  std::string out;
  std::deque<std::pair<int64_t, Pending<FileData>>> inflight;
  int64_t next = 0;
  absl::Status failure;
  bool eof = false;
  while (failure.ok() && !eof) {
    while (inflight.size() < depth) {
      inflight.emplace_back(next, file->startPread(next, chunk));
      next += chunk;
    }
    auto [offset, pending] = std::move(inflight.front());
    inflight.pop_front();
    auto r = co_await pending.get();
    if (!r.ok()) {
      failure = r.status();
      break;
    }
    if (offset != static_cast<int64_t>(out.size())) continue;  // dropped after a short read
    out += r->data;
    if (r->eof || r->data.empty()) {
      eof = true;
    } else if (r->data.size() < chunk) {
      next = static_cast<int64_t>(out.size());
    }
  }
  // Answers still in flight are not waited for; the close goes after them.
  absl::Status closed = co_await file->close();
  if (!failure.ok()) co_return failure;
  if (!closed.ok()) co_return closed;
  co_return out;
}

net::awaitable<absl::Status> Files::writeFile(std::string path, std::string data, uint32_t mode,
                                              size_t depth) {
  const auto core = core_;
  const std::string contents = std::move(data);
  auto file = co_await open(std::move(path), O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (!file.ok()) co_return file.status();
  const size_t chunk = core->client->maxReadSize();
  depth = std::max<size_t>(depth, 1);
  struct Issued {
    size_t offset;
    size_t size;
    Pending<uint64_t> answer;
  };
  std::deque<Issued> inflight;
  size_t next = 0;
  absl::Status failure;
  while (failure.ok() && (next < contents.size() || !inflight.empty())) {
    while (next < contents.size() && inflight.size() < depth) {
      const size_t n = std::min(chunk, contents.size() - next);
      inflight.push_back(
          {next, n, file->startPwrite(static_cast<int64_t>(next), contents.substr(next, n))});
      next += n;
    }
    Issued head = std::move(inflight.front());
    inflight.pop_front();
    auto written = co_await head.answer.get();
    if (!written.ok()) {
      failure = written.status();
    } else if (*written == 0) {
      // Nothing taken and no error: asking again could loop for ever.
      failure = errnoStatus(EIO, absl::StrCat("pwrite at offset ", head.offset, " wrote nothing"));
    } else if (*written < head.size) {
      // A short write: the rest again, by itself.
      const size_t at = head.offset + *written;
      inflight.push_front(
          {at, head.size - *written,
           file->startPwrite(static_cast<int64_t>(at), contents.substr(at, head.size - *written))});
    }
  }
  absl::Status closed = co_await file->close();
  co_return failure.ok() ? closed : failure;
}

net::awaitable<absl::StatusOr<FileStat>> Files::stat(std::string path) {
  co_return statOf(co_await fileCall(core_, statRequest(std::move(path), true)), "stat");
}

net::awaitable<absl::StatusOr<FileStat>> Files::lstat(std::string path) {
  co_return statOf(co_await fileCall(core_, statRequest(std::move(path), false)), "lstat");
}

Pending<FileStat> Files::startStat(std::string path) {
  auto slot = std::make_shared<PendingSlot<FileStat>>(core_->ex);
  net::spawn(core_->ex, runStat(core_, std::move(path), true, slot), "client_stat", failSlot(slot));
  return Pending<FileStat>(slot);
}

Pending<FileStat> Files::startLstat(std::string path) {
  auto slot = std::make_shared<PendingSlot<FileStat>>(core_->ex);
  net::spawn(core_->ex, runStat(core_, std::move(path), false, slot), "client_lstat",
             failSlot(slot));
  return Pending<FileStat>(slot);
}

net::awaitable<absl::StatusOr<FsStat>> Files::statfs(std::string path) {
  v1::FileRequest f;
  f.mutable_statfs()->set_path(std::move(path));
  auto r = co_await fileCall(core_, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_fs_stat()) co_return wrongKind("statfs");
  const v1::FsStat& s = r->fs_stat();
  co_return FsStat{s.type(),  s.bsize(), s.blocks(),  s.bfree(),  s.bavail(),
                   s.files(), s.ffree(), s.namelen(), s.frsize(), s.flags()};
}

net::awaitable<absl::Status> Files::access(std::string path, int mode) {
  v1::FileRequest f;
  f.mutable_access()->set_path(std::move(path));
  f.mutable_access()->set_mode(mode);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::StatusOr<std::string>> Files::readlink(std::string path) {
  v1::FileRequest f;
  f.mutable_readlink()->set_path(std::move(path));
  auto r = co_await fileCall(core_, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_link()) co_return wrongKind("readlink");
  co_return r->link().target();
}

net::awaitable<absl::Status> Files::mkdir(std::string path, uint32_t mode) {
  v1::FileRequest f;
  f.mutable_mkdir()->set_path(std::move(path));
  f.mutable_mkdir()->set_mode(mode);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::rmdir(std::string path) {
  v1::FileRequest f;
  f.mutable_rmdir()->set_path(std::move(path));
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::unlink(std::string path) {
  v1::FileRequest f;
  f.mutable_unlink()->set_path(std::move(path));
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::rename(std::string from, std::string to, uint32_t flags) {
  v1::FileRequest f;
  f.mutable_rename()->set_from(std::move(from));
  f.mutable_rename()->set_to(std::move(to));
  f.mutable_rename()->set_flags(flags);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::truncate(std::string path, int64_t length) {
  v1::FileRequest f;
  f.mutable_truncate()->set_path(std::move(path));
  f.mutable_truncate()->set_length(length);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::chmod(std::string path, uint32_t mode) {
  v1::FileRequest f;
  f.mutable_chmod()->set_path(std::move(path));
  f.mutable_chmod()->set_mode(mode);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::chown(std::string path, int64_t uid, int64_t gid,
                                          bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_chown()->set_path(std::move(path));
  f.mutable_chown()->set_uid(uid);
  f.mutable_chown()->set_gid(gid);
  f.mutable_chown()->set_follow_symlinks(follow_symlinks);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::utimens(std::string path, int64_t atime_ns, int64_t mtime_ns,
                                            bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_utimens()->set_path(std::move(path));
  f.mutable_utimens()->set_atime_ns(atime_ns);
  f.mutable_utimens()->set_mtime_ns(mtime_ns);
  f.mutable_utimens()->set_follow_symlinks(follow_symlinks);
  co_return co_await doneCall(core_, std::move(f));
}

}  // namespace siphon::client
