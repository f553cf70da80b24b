// Where the resolver's settings come from: the target's /etc/resolv.conf and
// /etc/hosts, read through its root directory, never the agent's own files.
//
// Threads: a source is used by the resolver's thread only.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "agent/dns/hosts_file.h"
#include "agent/dns/resolv_conf.h"

namespace siphon::agent::dns {

struct DnsConfig {
  std::shared_ptr<const ResolvConf> resolv;
  std::shared_ptr<const HostsFile> hosts;
};

class DnsConfigSource {
 public:
  virtual ~DnsConfigSource() = default;
  // The configuration as of now, called before each batch of requests (all
  // of them made before the call, so none misses an earlier edit). It may block
  // briefly (it reads files) and never fails: a file that cannot be read
  // counts as missing (resolv.conf's defaults, no hosts). While nothing
  // changed it returns the same pointers.
  virtual DnsConfig load() = 0;
};

// One file under a root directory, re-read only when it changed.
//
// The path is resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
// against `root_fd` (the target's /proc/PID/root opened O_PATH): an absolute
// symlink such as /etc/resolv.conf -> /run/systemd/resolve/stub-resolv.conf
// resolves inside the target's root, and nothing ("..", symlinks, /proc
// magic links) leads out of it. The open is O_NONBLOCK and only regular
// files are read, so a FIFO planted by the container cannot hang the reader.
class RootFile {
 public:
  RootFile(int root_fd, std::string path, size_t max_bytes)
      : root_fd_(root_fd), path_(std::move(path)), max_bytes_(max_bytes) {}

  // Opens the file again and reads it when it is not the file read last
  // time (device, inode, size, mtime or ctime differ). True when the content
  // (or its presence) changed since the previous call; true on the first.
  bool refresh();

  bool found() const { return found_; }
  // At most max_bytes; empty when not found.
  const std::string& content() const { return content_; }
  // Why the last refresh found nothing: NotFound for a missing file, or the
  // open/read failure (permission, a loop, not a regular file...).
  const absl::Status& error() const { return error_; }

 private:
  struct Stamp {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    struct timespec mtime {};
    struct timespec ctime {};
  };
  static bool sameStamp(const Stamp& a, const Stamp& b);

  int root_fd_;
  std::string path_;
  size_t max_bytes_;
  bool first_ = true;
  bool found_ = false;
  Stamp stamp_;
  std::string content_;
  absl::Status error_;
};

// The target's /etc/resolv.conf (64 KiB at most) and /etc/hosts (4 MiB at
// most) under `root_fd`, which must stay open while the source is used.
std::unique_ptr<DnsConfigSource> makeRootConfigSource(int root_fd);

}  // namespace siphon::agent::dns
