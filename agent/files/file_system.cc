#include "agent/files/file_system.h"

#include <fcntl.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::files {
namespace {

using R = v1::FileRequest;
using Result = absl::StatusOr<v1::FileResponse>;

Result doneOr(const absl::Status& s) {
  if (!s.ok()) return s;
  return doneResponse();
}

}  // namespace

absl::StatusOr<UniqueFd> LocalFileSystem::guardedOpen(std::string_view path, int flags,
                                                      uint32_t mode, bool dir) const {
  // A device must not even be opened (a tty or a watchdog acts on open):
  // look at what the path names first, without opening it.
  {
    auto pre = root_.resolve(path, O_PATH | (flags & O_NOFOLLOW));
    if (pre.ok()) {
      if (auto s = checkBeforeOpen(pre->get(), path); !s.ok()) return s;
    }
  }
  auto fd = dir ? root_.openDir(path) : root_.open(path, flags, mode);
  if (!fd.ok()) return fd.status();
  if (auto s = checkOpened(fd->get(), dir ? O_RDONLY : flags, root_fd_, path, guard_); !s.ok()) {
    return s;
  }
  return fd;
}

absl::StatusOr<Handle> LocalFileSystem::open(const R& req) {
  if (req.op_case() == R::kOpendir) {
    auto fd = guardedOpen(req.opendir().path(), O_RDONLY | O_DIRECTORY, 0, true);
    if (!fd.ok()) return fd.status();
    auto dir = OpenDir::create(*std::move(fd), root_fd_);
    if (!dir.ok()) return dir.status();
    return Handle(std::shared_ptr<DirObject>(*std::move(dir)));
  }
  if (req.op_case() != R::kOpen) return protoError(v1::INTERNAL, "not an open request");
  auto fd = guardedOpen(req.open().path(), req.open().flags(), req.open().mode(), false);
  if (!fd.ok()) return fd.status();
  return Handle(std::shared_ptr<FileObject>(std::make_shared<OpenFile>(*std::move(fd))));
}

absl::StatusOr<Handle> LocalFileSystem::adopt(UniqueFd fd, bool dir) {
  if (!dir) return Handle(std::shared_ptr<FileObject>(std::make_shared<OpenFile>(std::move(fd))));
  auto d = OpenDir::create(std::move(fd), root_fd_);
  if (!d.ok()) return d.status();
  return Handle(std::shared_ptr<DirObject>(*std::move(d)));
}

absl::StatusOr<UniqueFd> LocalFileSystem::newWatchInstance() {
  UniqueFd fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd) {
    const int err = errno;
    if (err == EMFILE) {
      return errnoRefusal(EMFILE, absl::StrCat("uid ", ::geteuid(),
                                               " has no inotify instance left on this node "
                                               "(sysctl fs.inotify.max_user_instances)"));
    }
    return errnoStatus(err, "inotify_init1");
  }
  return fd;
}

absl::StatusOr<int> LocalFileSystem::addWatch(int instance, const std::string& path,
                                              uint32_t mask) {
  // Resolved once, here, with this process's identity; the watch goes on
  // what this descriptor holds, whatever the path names by then.
  auto object = root_.resolve(path, O_PATH);
  if (!object.ok()) return object.status();
  const std::string proc = absl::StrCat("/proc/self/fd/", object->get());
  const int wd = ::inotify_add_watch(instance, proc.c_str(), mask);
  if (wd < 0) {
    const int err = errno;
    if (err == ENOSPC) {
      return errnoRefusal(ENOSPC, absl::StrCat("uid ", ::geteuid(),
                                               " has no inotify watch left on this node "
                                               "(sysctl fs.inotify.max_user_watches)"));
    }
    return errnoStatus(err, "watch " + path);
  }
  return wd;
}

Result LocalFileSystem::path(const R& req, bool writes_refused) {
  v1::FileResponse r;
  switch (req.op_case()) {
    case R::kStat: {
      auto st = root_.stat(req.stat().path(), req.stat().follow_symlinks());
      if (!st.ok()) return st.status();
      *r.mutable_stat() = *std::move(st);
      return r;
    }
    case R::kStatfs: {
      auto st = root_.statfs(req.statfs().path());
      if (!st.ok()) return st.status();
      *r.mutable_fs_stat() = *std::move(st);
      return r;
    }
    case R::kAccess:
      return doneOr(root_.access(req.access().path(), req.access().mode(), writes_refused));
    case R::kReadlink: {
      auto target = root_.readlink(req.readlink().path());
      if (!target.ok()) return target.status();
      r.mutable_link()->set_target(*std::move(target));  // bytes, as stored
      return r;
    }
    case R::kMkdir:
      return doneOr(root_.mkdir(req.mkdir().path(), req.mkdir().mode()));
    case R::kRmdir:
      return doneOr(root_.rmdir(req.rmdir().path()));
    case R::kUnlink:
      return doneOr(root_.unlink(req.unlink().path()));
    case R::kRename:
      return doneOr(root_.rename(req.rename().from(), req.rename().to(), req.rename().flags()));
    case R::kTruncate: {
      // Through the guarded open: a truncate of a procfs file or a device
      // is a write to it.
      if (req.truncate().length() < 0) {
        return errnoStatus(EINVAL, "truncate " + req.truncate().path());
      }
      auto fd = guardedOpen(req.truncate().path(), O_WRONLY, 0, false);
      if (!fd.ok()) return fd.status();
      if (::ftruncate(fd->get(), req.truncate().length()) != 0) {
        return lastErrnoStatus("truncate " + req.truncate().path());
      }
      return doneResponse();
    }
    case R::kChmod:
      return doneOr(root_.chmod(req.chmod().path(), req.chmod().mode()));
    case R::kChown:
      return doneOr(root_.chown(req.chown().path(), req.chown().uid(), req.chown().gid(),
                                req.chown().follow_symlinks()));
    case R::kUtimens:
      return doneOr(root_.utimens(req.utimens().path(), req.utimens().atime_ns(),
                                  req.utimens().mtime_ns(), req.utimens().follow_symlinks()));
    case R::kSymlink:
      return doneOr(root_.symlink(req.symlink().target(), req.symlink().linkpath()));
    case R::kLink:
      return doneOr(root_.link(req.link().existing(), req.link().newpath()));
    case R::kMknod:
      return doneOr(root_.mknod(req.mknod().path(), req.mknod().mode(), req.mknod().rdev()));
    case R::kGetxattr: {
      const auto& g = req.getxattr();
      auto value = root_.getxattr(g.path(), g.name(), g.follow_symlinks());
      if (!value.ok()) return value.status();
      r.mutable_xattr_value()->set_value(*std::move(value));
      return r;
    }
    case R::kListxattr: {
      auto names = root_.listxattr(req.listxattr().path(), req.listxattr().follow_symlinks());
      if (!names.ok()) return names.status();
      v1::FileXattrNames* out = r.mutable_xattr_names();  // set even when empty
      for (const std::string& n : *names) out->add_names(n);
      return r;
    }
    case R::kSetxattr: {
      const auto& x = req.setxattr();
      return doneOr(root_.setxattr(x.path(), x.name(), x.value(), x.flags(), x.follow_symlinks()));
    }
    case R::kRemovexattr: {
      const auto& x = req.removexattr();
      return doneOr(root_.removexattr(x.path(), x.name(), x.follow_symlinks()));
    }
    default:
      return protoError(v1::INTERNAL, "not a path request");
  }
}

}  // namespace siphon::agent::files
