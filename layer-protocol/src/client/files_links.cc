// The typed file calls (siphon/client/files.h) for links, special files and
// extended attributes, and watches.
#include "client/file_call.h"
#include "siphon/client/files.h"
#include "siphon/status.h"

namespace siphon::client {

net::awaitable<absl::Status> Files::symlink(std::string target, std::string linkpath) {
  v1::FileRequest f;
  f.mutable_symlink()->set_target(std::move(target));
  f.mutable_symlink()->set_linkpath(std::move(linkpath));
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::link(std::string existing, std::string newpath) {
  v1::FileRequest f;
  f.mutable_link()->set_existing(std::move(existing));
  f.mutable_link()->set_newpath(std::move(newpath));
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::mknod(std::string path, uint32_t mode, uint64_t rdev) {
  v1::FileRequest f;
  f.mutable_mknod()->set_path(std::move(path));
  f.mutable_mknod()->set_mode(mode);
  f.mutable_mknod()->set_rdev(rdev);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::StatusOr<std::string>> Files::getxattr(std::string path, std::string name,
                                                            bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_getxattr()->set_path(std::move(path));
  f.mutable_getxattr()->set_name(std::move(name));
  f.mutable_getxattr()->set_follow_symlinks(follow_symlinks);
  auto r = co_await fileCall(core_, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_xattr_value()) co_return wrongKind("getxattr");
  co_return std::move(*r->mutable_xattr_value()->mutable_value());
}

net::awaitable<absl::StatusOr<std::vector<std::string>>> Files::listxattr(std::string path,
                                                                          bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_listxattr()->set_path(std::move(path));
  f.mutable_listxattr()->set_follow_symlinks(follow_symlinks);
  auto r = co_await fileCall(core_, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_xattr_names()) co_return wrongKind("listxattr");
  std::vector<std::string> names;
  for (std::string& n : *r->mutable_xattr_names()->mutable_names()) names.push_back(std::move(n));
  co_return names;
}

net::awaitable<absl::Status> Files::setxattr(std::string path, std::string name, std::string value,
                                             int flags, bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_setxattr()->set_path(std::move(path));
  f.mutable_setxattr()->set_name(std::move(name));
  f.mutable_setxattr()->set_value(std::move(value));
  f.mutable_setxattr()->set_flags(flags);
  f.mutable_setxattr()->set_follow_symlinks(follow_symlinks);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::Status> Files::removexattr(std::string path, std::string name,
                                                bool follow_symlinks) {
  v1::FileRequest f;
  f.mutable_removexattr()->set_path(std::move(path));
  f.mutable_removexattr()->set_name(std::move(name));
  f.mutable_removexattr()->set_follow_symlinks(follow_symlinks);
  co_return co_await doneCall(core_, std::move(f));
}

net::awaitable<absl::StatusOr<uint64_t>> Files::watch(std::string path) {
  v1::FileRequest f;
  f.mutable_watch()->set_path(std::move(path));
  auto r = co_await fileCall(core_, std::move(f));
  if (!r.ok()) co_return r.status();
  if (!r->has_watched()) co_return wrongKind("watch");
  co_return r->watched().watch();
}

net::awaitable<absl::Status> Files::unwatch(uint64_t watch) {
  v1::FileRequest f;
  f.mutable_unwatch()->set_watch(watch);
  co_return co_await doneCall(core_, std::move(f));
}

void Files::setChangesHandler(std::function<void(const FileChanges&)> handler) {
  core_->on_file_changes = std::move(handler);
}

}  // namespace siphon::client
