#include "agent/dns/dns_config.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "agent/common/root_path.h"
#include "agent/common/unique_fd.h"
#include "siphon/status.h"

namespace siphon::agent::dns {
namespace {

constexpr size_t kMaxResolvConf = 64 * 1024;
constexpr size_t kMaxHosts = 4 * 1024 * 1024;

// -1 with errno set, as open(2).
int openConfig(int root_fd, const std::string& path) {
  UniqueFd fd;
  if (int err = openInRoot(root_fd, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0, &fd)) {
    errno = err;
    return -1;
  }
  return fd.release();
}

bool sameTime(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

class RootConfigSource : public DnsConfigSource {
 public:
  explicit RootConfigSource(int root_fd)
      : resolv_(root_fd, "/etc/resolv.conf", kMaxResolvConf),
        hosts_(root_fd, "/etc/hosts", kMaxHosts) {}

  DnsConfig load() override {
    if (resolv_.refresh()) {
      auto conf = std::make_shared<const ResolvConf>(parseResolvConf(resolv_.content()));
      // An edit that changes nothing that matters keeps the old pointer, so
      // the resolver keeps its channel (and its open sockets).
      if (!config_.resolv || !(*conf == *config_.resolv)) config_.resolv = std::move(conf);
    }
    if (hosts_.refresh()) {
      config_.hosts = std::make_shared<const HostsFile>(HostsFile::parse(hosts_.content()));
    }
    return config_;
  }

 private:
  RootFile resolv_;
  RootFile hosts_;
  DnsConfig config_;
};

}  // namespace

bool RootFile::sameStamp(const Stamp& a, const Stamp& b) {
  return a.dev == b.dev && a.ino == b.ino && a.size == b.size && sameTime(a.mtime, b.mtime) &&
         sameTime(a.ctime, b.ctime);
}

bool RootFile::refresh() {
  const bool first = std::exchange(first_, false);
  auto missing = [&](absl::Status why) {
    const bool changed = first || found_;
    found_ = false;
    content_.clear();
    stamp_ = Stamp{};
    error_ = std::move(why);
    return changed;
  };

  UniqueFd fd(openConfig(root_fd_, path_));
  if (!fd.valid()) return missing(lastErrnoStatus(absl::StrCat("open ", path_, " in the target")));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return missing(lastErrnoStatus(absl::StrCat("stat ", path_, " in the target")));
  }
  if (!S_ISREG(st.st_mode)) {
    return missing(
        absl::FailedPreconditionError(absl::StrCat(path_, " in the target is not a regular file")));
  }
  const Stamp stamp{st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
  if (found_ && sameStamp(stamp, stamp_)) return false;

  std::string data;
  char buf[16384];
  while (data.size() < max_bytes_) {
    ssize_t n = ::read(fd.get(), buf, std::min(sizeof(buf), max_bytes_ - data.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return missing(lastErrnoStatus(absl::StrCat("read ", path_, " in the target")));
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  const bool changed = first || !found_ || data != content_;
  found_ = true;
  stamp_ = stamp;
  content_ = std::move(data);
  error_ = absl::OkStatus();
  return changed;
}

std::unique_ptr<DnsConfigSource> makeRootConfigSource(int root_fd) {
  return std::make_unique<RootConfigSource>(root_fd);
}

}  // namespace siphon::agent::dns
