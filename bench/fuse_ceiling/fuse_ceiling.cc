// The FUSE ceiling of the mount group's sequential read: a FUSE file system
// that does no work, one read-only file whose bytes are in this process's
// memory (touched before the mount), answered with fuse_reply_buf from a
// single-threaded loop, with the kernel settings `siphon fs mount` uses
// (max_read here; bench/run.py raises the readahead to four reads, as the
// mount does for itself, from its own process: a stat of a FUSE mount from
// the process serving it is how a killed server hangs). What a read through it costs is
// FUSE's own: the kernel's request, the copy into the mount's page cache,
// the reader's copy out. bench/run.py reads the same file size through it
// beside the real mount, so "how far from FUSE itself" is a ratio of one run.
//
//   fuse_ceiling MOUNTPOINT --size-mib N [--max-read BYTES]
// Prints "mounted" once the mount is up; serves until SIGTERM/SIGINT or
// fusermount3 -u.
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace {

constexpr fuse_ino_t kFileIno = 2;
constexpr const char* kFileName = "big.bin";

struct Ceiling {
  std::vector<char> bytes;
  unsigned max_read = 0;
  std::string mountpoint;
};

Ceiling& self(fuse_req_t req) { return *static_cast<Ceiling*>(fuse_req_userdata(req)); }

void fill(const Ceiling& c, fuse_ino_t ino, struct stat* st) {
  *st = {};
  st->st_ino = ino;
  if (ino == FUSE_ROOT_ID) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
  } else {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = static_cast<off_t>(c.bytes.size());
  }
}

void opInit(void* userdata, struct fuse_conn_info* conn) {
  auto* c = static_cast<Ceiling*>(userdata);
  conn->max_read = c->max_read;
  conn->max_readahead = c->max_read;
}

void opLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent != FUSE_ROOT_ID || std::strcmp(name, kFileName) != 0) {
    fuse_reply_err(req, ENOENT);
    return;
  }
  struct fuse_entry_param e {};
  e.ino = kFileIno;
  e.attr_timeout = e.entry_timeout = 1.0;
  fill(self(req), kFileIno, &e.attr);
  fuse_reply_entry(req, &e);
}

void opGetattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info*) {
  struct stat st {};
  fill(self(req), ino, &st);
  fuse_reply_attr(req, &st, 1.0);
}

void opOpen(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  if (ino != kFileIno) {
    fuse_reply_err(req, EISDIR);
    return;
  }
  fi->keep_cache = 0;  // each open reads through FUSE, as a new mount does
  fuse_reply_open(req, fi);
}

void opRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, struct fuse_file_info*) {
  const auto& bytes = self(req).bytes;
  const auto total = static_cast<off_t>(bytes.size());
  if (off >= total) {
    fuse_reply_buf(req, nullptr, 0);
    return;
  }
  fuse_reply_buf(req, bytes.data() + off, std::min<size_t>(size, static_cast<size_t>(total - off)));
}

}  // namespace

int main(int argc, char** argv) {
  Ceiling c;
  unsigned size_mib = 256;
  c.max_read = (1u << 20) - 4096;  // siphon's mount with the agent's default read limit
  CLI::App app{"fuse_ceiling: a FUSE file system that does no work (bench/ baseline)"};
  app.add_option("mountpoint", c.mountpoint, "an empty directory")->required();
  app.add_option("--size-mib", size_mib, "size of big.bin")->check(CLI::Range(1u, 4096u));
  app.add_option("--max-read", c.max_read, "max_read and readahead unit, bytes")
      ->check(CLI::Range(4096u, 1u << 20));
  CLI11_PARSE(app, argc, argv);
  c.bytes.assign(static_cast<size_t>(size_mib) << 20, '\x5a');  // touched: no page faults later

  struct fuse_lowlevel_ops ops {};
  ops.init = opInit;
  ops.lookup = opLookup;
  ops.getattr = opGetattr;
  ops.open = opOpen;
  ops.read = opRead;
  const std::string opts = "fsname=fuse_ceiling,ro,max_read=" + std::to_string(c.max_read);
  std::vector<std::string> args = {"fuse_ceiling", "-o", opts};
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  struct fuse_args fargs = FUSE_ARGS_INIT(static_cast<int>(cargs.size()), cargs.data());
  struct fuse_session* se = fuse_session_new(&fargs, &ops, sizeof ops, &c);
  fuse_opt_free_args(&fargs);
  if (se == nullptr) {
    std::fprintf(stderr, "fuse_ceiling: libfuse refused the options\n");
    return 1;
  }
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, c.mountpoint.c_str()) != 0) {
    std::fprintf(stderr, "fuse_ceiling: cannot mount %s\n", c.mountpoint.c_str());
    fuse_session_destroy(se);
    return 1;
  }
  std::printf("mounted\n");
  std::fflush(stdout);
  const int rc = fuse_session_loop(se);
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc < 0 ? 1 : 0;
}
