#include "agent/files/handles.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "agent/files/root_fs.h"
#include "siphon/protocol/limits.h"
#include "siphon/status.h"
#include "siphon/text.h"

namespace siphon::agent::files {
namespace {

// Bytes an entry adds to a FileDirEntries message besides its name (tags,
// lengths, varints of ino and type), rounded up.
constexpr size_t kEntryOverhead = 24;
// And what a stat adds besides its own fields (its tag and length).
constexpr size_t kStatOverhead = 4;

std::string handleCtx(std::string_view op, uint64_t handle) {
  return absl::StrCat(asv(op), " fd ", handle);
}

}  // namespace

// ------------------------------------------------------------ OpenFile

absl::StatusOr<v1::FileResponse> OpenFile::call(const v1::FileRequest& req, uint32_t max_read) {
  using R = v1::FileRequest;
  const int f = fd.get();
  v1::FileResponse r;
  switch (req.op_case()) {
    case R::kRead: {
      auto d = readFd(f, std::min(req.read().size(), max_read));
      if (!d.ok()) return d.status();
      *r.mutable_data() = *std::move(d);
      return r;
    }
    case R::kPread: {
      auto d = preadFd(f, std::min(req.pread().size(), max_read), req.pread().offset());
      if (!d.ok()) return d.status();
      *r.mutable_data() = *std::move(d);
      return r;
    }
    case R::kWrite: {
      auto n = writeFd(f, req.write().data());
      if (!n.ok()) return n.status();
      r.mutable_written()->set_written(*n);
      return r;
    }
    case R::kPwrite: {
      auto n = pwriteFd(f, req.pwrite().data(), req.pwrite().offset());
      if (!n.ok()) return n.status();
      r.mutable_written()->set_written(*n);
      return r;
    }
    case R::kSeek: {
      auto off = seekFd(f, req.seek().offset(), req.seek().whence());
      if (!off.ok()) return off.status();
      r.mutable_offset()->set_offset(*off);
      return r;
    }
    case R::kFstat: {
      auto st = fstatFd(f);
      if (!st.ok()) return st.status();
      *r.mutable_stat() = *std::move(st);
      return r;
    }
    case R::kFtruncate: {
      if (auto s = ftruncateFd(f, req.ftruncate().length()); !s.ok()) return s;
      r.mutable_done();
      return r;
    }
    case R::kFsync: {
      if (auto s = fsyncFd(f, req.fsync().datasync()); !s.ok()) return s;
      r.mutable_done();
      return r;
    }
    default:
      return protoError(v1::INTERNAL, "not a file-handle request");
  }
}

absl::Status OpenFile::close() {
  if (!fd.valid()) return absl::OkStatus();
  const int f = fd.release();
  // Linux releases the fd even when close() fails; the error (EIO, ENOSPC
  // on NFS...) is still worth reporting. Never retried (see UniqueFd).
  if (::close(f) != 0 && errno != EINTR) return lastErrnoStatus("close");
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> OpenFile::exportFd() {
  const int f = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  if (f < 0) return lastErrnoStatus("handover: dup an open file");
  return UniqueFd(f);
}

// ------------------------------------------------------------ OpenDir

absl::StatusOr<std::shared_ptr<OpenDir>> OpenDir::create(UniqueFd fd, int root_fd) {
  bool is_root = false;
  if (root_fd >= 0) {
    struct stat d {};
    struct stat r {};
    if (::fstat(fd.get(), &d) != 0 || ::fstat(root_fd, &r) != 0) return lastErrnoStatus("opendir");
    is_root = d.st_dev == r.st_dev && d.st_ino == r.st_ino;
  }
  DIR* dir = ::fdopendir(fd.get());
  if (dir == nullptr) return lastErrnoStatus("opendir");
  (void)fd.release();  // the DIR owns it now
  return std::shared_ptr<OpenDir>(new OpenDir(dir, is_root, root_fd >= 0));
}

void OpenDir::fillStat(v1::DirEntry& e, const std::string& raw_name, bool with_stat) const {
  if (!with_stat) {
    e.clear_stat();
    return;
  }
  if (e.has_stat()) return;
  const char* name = raw_name.c_str();
  if (raw_name == "..") {
    // fstatat(dir, "..") from the root would describe what is above it.
    if (!root_known_) return;
    if (is_root_) name = ".";
  }
  struct stat st {};
  // The name is one component of this directory; AT_SYMLINK_NOFOLLOW keeps
  // a symlink from being followed at all. A vanished entry keeps no stat.
  if (::fstatat(::dirfd(dir_), name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    *e.mutable_stat() = toFileStat(st);
  }
}

OpenDir::~OpenDir() { ::closedir(dir_); }

absl::StatusOr<v1::FileDirEntries> OpenDir::read(uint32_t max_entries, size_t max_bytes,
                                                 bool with_stat) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::FileDirEntries out;
  size_t bytes = 0;
  while (!eof_) {
    std::optional<v1::DirEntry> next = std::move(pending_);
    std::string raw_name = std::move(pending_raw_name_);
    pending_.reset();
    long before = pending_pos_;
    if (!next) {
      before = ::telldir(dir_);
      errno = 0;
      struct dirent* d = ::readdir(dir_);
      if (d == nullptr) {
        if (errno != 0) return lastErrnoStatus("readdir");
        eof_ = true;
        break;
      }
      raw_name = d->d_name;
      next.emplace();
      next->set_name(raw_name);  // bytes: exactly the kernel's name
      next->set_ino(d->d_ino);
      next->set_type(d->d_type);
    }
    fillStat(*next, raw_name, with_stat);
    const size_t cost = next->name().size() + kEntryOverhead +
                        (next->has_stat() ? next->stat().ByteSizeLong() + kStatOverhead : 0);
    if (out.entries_size() > 0 &&
        (static_cast<uint32_t>(out.entries_size()) >= max_entries || bytes + cost > max_bytes)) {
      pending_ = std::move(next);  // first of the next batch
      pending_raw_name_ = std::move(raw_name);
      pending_pos_ = before;
      break;
    }
    bytes += cost;
    *out.add_entries() = std::move(*next);
  }
  out.set_eof(eof_ && !pending_);
  return out;
}

absl::StatusOr<UniqueFd> OpenDir::exportFd() {
  std::lock_guard<std::mutex> lock(mu_);
  // seekdir() also drops what glibc read ahead: the kernel's position is
  // then exactly the next entry not given, for both readers.
  ::seekdir(dir_, pending_ ? pending_pos_ : ::telldir(dir_));
  pending_.reset();
  pending_raw_name_.clear();
  const int f = ::fcntl(::dirfd(dir_), F_DUPFD_CLOEXEC, 0);
  if (f < 0) return lastErrnoStatus("handover: dup an open directory");
  return UniqueFd(f);
}

// ------------------------------------------------------------ HandleTable

bool HandleTable::full(const std::string& session) const {
  return count(session) >= max_per_session_;
}

std::string HandleTable::limitText() const {
  return protocol::limitReached("open file and directory", max_per_session_, "--max-open-files");
}

size_t HandleTable::total() const {
  size_t n = 0;
  for (const auto& [id, s] : sessions_) n += s.handles.size();
  return n;
}

size_t HandleTable::count(const std::string& session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? 0 : it->second.handles.size();
}

absl::StatusOr<uint64_t> HandleTable::add(const std::string& session, Handle h) {
  if (full(session)) {
    return errnoRefusal(EMFILE, limitText());
  }
  Session& s = sessions_[session];
  const uint64_t id = s.next++;
  s.handles.emplace(id, std::move(h));
  return id;
}

const Handle* HandleTable::find(const std::string& session, uint64_t handle) const {
  auto s = sessions_.find(session);
  if (s == sessions_.end()) return nullptr;
  auto h = s->second.handles.find(handle);
  return h == s->second.handles.end() ? nullptr : &h->second;
}

absl::StatusOr<std::shared_ptr<FileObject>> HandleTable::file(const std::string& session,
                                                              uint64_t handle,
                                                              std::string_view op) const {
  const Handle* h = find(session, handle);
  if (h == nullptr || !std::holds_alternative<std::shared_ptr<FileObject>>(*h)) {
    return errnoStatus(EBADF, handleCtx(op, handle));
  }
  return std::get<std::shared_ptr<FileObject>>(*h);
}

absl::StatusOr<std::shared_ptr<DirObject>> HandleTable::dir(const std::string& session,
                                                            uint64_t handle,
                                                            std::string_view op) const {
  const Handle* h = find(session, handle);
  if (h == nullptr || !std::holds_alternative<std::shared_ptr<DirObject>>(*h)) {
    return errnoStatus(EBADF, handleCtx(op, handle));
  }
  return std::get<std::shared_ptr<DirObject>>(*h);
}

absl::StatusOr<Handle> HandleTable::remove(const std::string& session, uint64_t handle, bool is_dir,
                                           std::string_view op) {
  auto s = sessions_.find(session);
  if (s != sessions_.end()) {
    auto h = s->second.handles.find(handle);
    if (h != s->second.handles.end() &&
        std::holds_alternative<std::shared_ptr<DirObject>>(h->second) == is_dir) {
      Handle out = std::move(h->second);
      s->second.handles.erase(h);
      return out;
    }
  }
  return errnoStatus(EBADF, handleCtx(op, handle));
}

std::vector<Handle> HandleTable::removeSession(const std::string& session) {
  std::vector<Handle> out;
  auto s = sessions_.find(session);
  if (s == sessions_.end()) return out;
  for (auto& [id, h] : s->second.handles) out.push_back(std::move(h));
  sessions_.erase(s);
  return out;
}

}  // namespace siphon::agent::files
