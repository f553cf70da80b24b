// The inside of a FuseMount (fuse_mount.h): what the operations share.
// Private to layer-protocol/fuse/.
#pragma once

#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "fuse/fuse_mount.h"
#include "fuse/inode_table.h"
#include "siphon/client/client.h"
#include "siphon/client/files.h"
#include "siphon/client/target.h"
#include "siphon/transport/asio.h"

namespace siphon::fuse {

// The largest read and write the kernel sends (max_read, max_write).
inline constexpr uint32_t kMaxIo = 1 << 20;
// Where an absolute symlink that leaves the mounted directory points.
inline constexpr const char* kOutsideMount = ".siphon-outside-mount";

struct OpenFile {
  client::File file;
  uint64_t node = 0;
};

struct OpenDir {
  client::Directory dir;
  // The whole listing, read at opendir: offsets into it stay valid while
  // the program reads (telldir/seekdir), whatever the target does meanwhile.
  std::vector<client::DirEntry> entries;
};

// What a node's content looked like when it was last opened: its pages are
// kept (keep_cache) while these are unchanged.
struct ContentStamp {
  int64_t size = -1;
  int64_t mtime_ns = -1;
};

struct FuseMount::Impl {
  Impl(client::Target target, MountOptions options);
  ~Impl();

  client::Target target;
  client::Files files;
  InodeTable table;
  net::asio::posix::stream_descriptor fd;
  struct fuse_session* se = nullptr;
  struct fuse_buf buf {};
  bool mounted = false;

  std::string mountpoint;
  std::string remote_dir;
  bool read_only = false;
  double attr_timeout = 1.0;

  uint64_t next_handle = 1;
  std::unordered_map<uint64_t, OpenFile> open_files;
  std::unordered_map<uint64_t, OpenDir> open_dirs;
  std::unordered_map<uint64_t, ContentStamp> stamps;

  // Operations whose answer the kernel still waits for.
  int inflight = 0;
  net::Signal idle;
};

// libfuse's operation table (fuse_ops.cc).
const struct fuse_lowlevel_ops& operations();

}  // namespace siphon::fuse
