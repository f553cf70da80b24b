// `siphon fs ...`: files inside the target's root, through the typed file
// API (siphon/client/files.h) over the command's Target.
//
//   siphon fs stat [-L] PATH...       stat(1)-like text, or --json
//   siphon fs ls [-l] [-a] PATH       entries sorted by name
//   siphon fs cat PATH...             raw bytes to stdout
//   siphon fs readlink PATH
//   siphon fs write [--mode M] PATH   stdin to PATH (created or truncated)
//   siphon fs mkdir [-p] [--mode M] PATH
//   siphon fs rm [-r] PATH
//   siphon fs mv FROM TO
//
// A failed operation prints one line, "siphon: fs cat /etc/shadow: Permission
// denied (EACCES)", followed by the agent's reason when the errno is its own
// answer (a limit, --fs-mode ro), and the command exits 1 (3 when the agent
// went away).
// Commands over several paths go on with the next path and exit 1 at the
// end, as cat(1) and stat(1) do.
// The text and JSON forms are cli/format.h's.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/format.h"
#include "cli/json_writer.h"
#include "siphon/client/errors.h"
#include "siphon/client/files.h"
#include "siphon/status.h"

namespace siphon::cli {
namespace {

using client::DirEntry;
using client::FileData;
using client::Files;
using client::FileStat;
using client::Pending;

// Requests kept in flight by cat and write: enough to hide the round trip
// behind the agent's reads and writes; each is at most max_read_size.
constexpr size_t kPipelineDepth = 4;
constexpr size_t kStatDepth = 16;  // lstat calls of `ls -l`
constexpr uint32_t kDirBatch = 1024;

// ------------------------------------------------------------ errors

// Reports a failed operation `what` ("fs cat /etc/shadow") and returns the
// exit code.
int report(std::string_view what, const absl::Status& status) {
  const int err = client::errnoValue(status);
  if (client::errorCode(status) == client::ErrorCode::kErrno && err != 0) {
    // The agent's own reason, when the errno is its answer rather than the
    // kernel's: "Too many open files (EMFILE): open file and directory limit
    // of 64 reached (siphon-agent --max-open-files raises it)".
    printError(errnoFailure(what, err, errnoReason(status)));
    return kExitError;
  }
  Failure f = requestFailure(what, status);
  printError(f.message);
  return f.exit_code;
}

// ------------------------------------------------------------ stdin, stdout

// Writes all of `data` to stdout (fd 1, unbuffered: raw bytes of cat).
bool writeStdout(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(STDOUT_FILENO, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

absl::Status stdoutFailed() { return absl::InternalError("cannot write to stdout"); }

// Up to `size` bytes of stdin (fewer only at its end). Blocking: the bytes
// come from a file or a pipe that is expected to keep up; while it does not,
// the session's keepalive waits, and a cut transport resumes.
absl::StatusOr<std::string> readStdin(size_t size) {
  std::string buf(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::read(STDIN_FILENO, buf.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return lastErrnoStatus("read stdin");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  buf.resize(got);
  return buf;
}

// ------------------------------------------------------------ cat

// `file` to stdout with preads kept in flight, written in order. A short
// read that is not the end (procfs, a file being truncated) drops the reads
// issued past it and goes on from where the data stopped; a file that
// cannot pread (a FIFO, a device: ESPIPE at its first read) is read with
// plain reads, one at a time (two on the agent's pool could finish out of
// order).
net::awaitable<absl::Status> catFile(client::File& file, uint32_t chunk) {
  auto st = co_await file.stat();
  if (!st.ok()) co_return st.status();
  // Regular files of known size get reads in flight up to that size; others
  // one read at a time.
  const int64_t size = st->isRegular() ? st->size : 0;

  struct Issued {
    uint64_t generation;
    Pending<FileData> answer;
  };
  std::deque<Issued> issued;  // oldest first
  int64_t next = 0;           // offset of the next pread to issue
  int64_t cursor = 0;         // bytes written to stdout
  // Reads issued before a short read belong to an older generation: their
  // answers are dropped.
  uint64_t generation = 0;
  size_t live = 0;  // reads of the current generation in flight
  // One more pread is always in flight until the end is seen (the file may
  // have grown).
  auto refill = [&] {
    while (live < kPipelineDepth && (next < size || live == 0)) {
      issued.push_back({generation, file.startPread(next, chunk)});
      next += chunk;
      ++live;
    }
  };
  absl::Status failure;
  bool sequential = false;
  refill();
  while (!issued.empty()) {
    Issued head = std::move(issued.front());
    issued.pop_front();
    auto r = co_await head.answer.get();
    if (head.generation != generation) continue;
    --live;
    if (!r.ok()) {
      sequential = cursor == 0 && client::errnoValue(r.status()) == ESPIPE;
      if (!sequential) failure = r.status();
      break;
    }
    if (!writeStdout(r->data)) {
      failure = stdoutFailed();
      break;
    }
    cursor += static_cast<int64_t>(r->data.size());
    if (r->eof) break;
    if (r->data.size() < chunk) {
      // A short read that is not the end: reads issued past it may have
      // left a hole. Drop them and go on from here.
      ++generation;
      live = 0;
      next = cursor;
    }
    refill();
  }
  // The answers still to come are taken (and dropped) before the close.
  while (!issued.empty()) {
    (void)co_await issued.front().answer.get();
    issued.pop_front();
  }
  if (!sequential) co_return failure;
  while (true) {
    auto r = co_await file.read(chunk);
    if (!r.ok()) co_return r.status();
    if (!writeStdout(r->data)) co_return stdoutFailed();
    if (r->eof) co_return absl::OkStatus();
  }
}

net::awaitable<int> catOne(const CommandEnv& env, const std::string& path) {
  const std::string what = absl::StrCat("fs cat ", path);
  Files files(env.target);
  auto file = co_await files.open(path, O_RDONLY);
  if (!file.ok()) co_return report(what, file.status());
  const absl::Status failure = co_await catFile(*file, files.readChunk());
  (void)co_await file->close();  // a read-only close has nothing to report
  if (!failure.ok()) co_return report(what, failure);
  co_return kExitOk;
}

// ------------------------------------------------------------ write

// stdin to `file` with pwrites kept in flight. A short write is completed
// by another pwrite of the rest.
net::awaitable<absl::Status> writeFromStdin(client::File& file, uint32_t chunk) {
  struct Issued {
    int64_t offset;
    std::string data;
    Pending<uint64_t> answer;
  };
  std::deque<Issued> issued;
  auto push = [&](int64_t offset, std::string data) {
    Pending<uint64_t> answer = file.startPwrite(offset, data);
    issued.push_back({offset, std::move(data), std::move(answer)});
  };
  int64_t offset = 0;
  bool input_done = false;
  absl::Status failure;
  while (true) {
    while (failure.ok() && !input_done && issued.size() < kPipelineDepth) {
      auto data = readStdin(chunk);
      if (!data.ok()) {
        failure = data.status();
        break;
      }
      if (data->empty()) {
        input_done = true;
        break;
      }
      const int64_t at = offset;
      offset += static_cast<int64_t>(data->size());
      push(at, *std::move(data));
    }
    if (issued.empty()) break;
    Issued head = std::move(issued.front());
    issued.pop_front();
    auto written = co_await head.answer.get();
    if (!failure.ok()) continue;  // the rest is taken, not acted on
    if (!written.ok()) {
      failure = written.status();
    } else if (*written == 0 && !head.data.empty()) {
      failure = errnoStatus(EIO, "");
    } else if (*written < head.data.size()) {
      push(head.offset + static_cast<int64_t>(*written), head.data.substr(*written));
    }
  }
  co_return failure;
}

net::awaitable<int> writeOne(const CommandEnv& env, const std::string& path, uint32_t mode) {
  const std::string what = absl::StrCat("fs write ", path);
  Files files(env.target);
  auto file = co_await files.open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (!file.ok()) co_return report(what, file.status());
  const absl::Status failure = co_await writeFromStdin(*file, files.maxReadSize());
  const absl::Status closed = co_await file->close();
  if (!failure.ok()) co_return report(what, failure);
  if (!closed.ok()) co_return report(what, closed);
  co_return kExitOk;
}

// ------------------------------------------------------------ directories

// Every entry of a directory, "." and ".." included, in the agent's order.
net::awaitable<absl::StatusOr<std::vector<ListEntry>>> listDir(Files& files,
                                                               const std::string& path) {
  auto dir = co_await files.openDirectory(path);
  if (!dir.ok()) co_return dir.status();
  std::vector<ListEntry> out;
  absl::Status failure;
  while (true) {
    auto batch = co_await dir->nextBatch(kDirBatch);
    if (!batch.ok()) {
      failure = batch.status();
      break;
    }
    for (DirEntry& e : batch->entries) out.push_back({std::move(e.name), e.type, e.ino, {}, {}});
    if (batch->eof) break;
    if (batch->entries.empty()) {
      failure = absl::InternalError("the agent returned an empty batch before the end");
      break;
    }
  }
  (void)co_await dir->close();
  if (!failure.ok()) co_return failure;
  co_return out;
}

// The target of the symlink at `path`, or "" when it cannot be read (the
// listing shows the link without it).
net::awaitable<std::string> linkTarget(Files& files, const std::string& path) {
  auto t = co_await files.readlink(path);
  co_return t.ok() ? *std::move(t) : std::string();
}

// lstat (and readlink for links) of every entry, kStatDepth at a time.
net::awaitable<absl::Status> statEntries(Files& files, const std::string& dir,
                                         std::vector<ListEntry>& entries) {
  std::deque<Pending<FileStat>> inflight;
  absl::Status failure;
  size_t sent = 0, got = 0;
  while (got < entries.size()) {
    while (sent < entries.size() && inflight.size() < kStatDepth) {
      inflight.push_back(files.startLstat(joinPath(dir, entries[sent].name)));
      ++sent;
    }
    Pending<FileStat> head = std::move(inflight.front());
    inflight.pop_front();
    auto st = co_await head.get();
    ListEntry& e = entries[got++];
    if (!st.ok()) {
      // Gone between readdir and lstat: leave it without details.
      if (client::errnoValue(st.status()) != ENOENT && failure.ok()) failure = st.status();
      continue;
    }
    e.stat = *st;
  }
  for (ListEntry& e : entries) {
    if (e.stat && e.stat->isSymlink())
      e.link_target = co_await linkTarget(files, joinPath(dir, e.name));
  }
  co_return failure;
}

net::awaitable<int> ls(const CommandEnv& env, const std::string& path, bool long_form, bool all) {
  const std::string what = absl::StrCat("fs ls ", path);
  Files files(env.target);
  auto listed = co_await listDir(files, path);
  std::vector<ListEntry> entries;
  if (!listed.ok() && client::errnoValue(listed.status()) == ENOTDIR) {
    // ls of a file shows the file.
    auto st = co_await files.lstat(path);
    if (!st.ok()) co_return report(what, st.status());
    ListEntry e{path, DT_UNKNOWN, st->ino, *st, {}};
    if (st->isSymlink()) e.link_target = co_await linkTarget(files, path);
    entries.push_back(std::move(e));
  } else if (!listed.ok()) {
    co_return report(what, listed.status());
  } else {
    for (auto& e : *listed) {
      if (!all && !e.name.empty() && e.name[0] == '.') continue;
      entries.push_back(std::move(e));
    }
    std::sort(entries.begin(), entries.end(),
              [](const ListEntry& a, const ListEntry& b) { return a.name < b.name; });
    if (long_form) {
      absl::Status s = co_await statEntries(files, path, entries);
      if (!s.ok()) co_return report(what, s);
    }
  }
  if (env.json) co_return printOutput(listingJson(entries));
  if (long_form) co_return printOutput(longListing(entries));
  co_return printOutput(listingText(entries));
}

// ------------------------------------------------------------ stat

net::awaitable<int> statAll(const CommandEnv& env, const std::vector<std::string>& paths,
                            bool follow) {
  Files files(env.target);
  int rc = kExitOk;
  JsonWriter j;
  j.beginArray();
  std::string text;
  for (const auto& path : paths) {
    absl::StatusOr<FileStat> st;
    if (follow) {
      st = co_await files.stat(path);
    } else {
      st = co_await files.lstat(path);
    }
    if (!st.ok()) {
      rc = std::max(rc, report(absl::StrCat("fs stat ", path), st.status()));
      continue;
    }
    std::string target;
    if (st->isSymlink()) target = co_await linkTarget(files, path);
    if (env.json) {
      j.beginObject();
      j.key("path").value(path);
      appendStatJson(j, *st);
      if (!target.empty()) j.key("target").value(target);
      j.endObject();
    } else {
      text += statText(path, *st, target);
    }
  }
  j.endArray();
  const int printed = printOutput(env.json ? j.take() : text);
  co_return rc != kExitOk ? rc : printed;
}

// ------------------------------------------------------------ mkdir, rm

net::awaitable<int> mkdirAll(const CommandEnv& env, const std::string& path, bool parents,
                             uint32_t mode) {
  const std::string what = absl::StrCat("fs mkdir ", path);
  Files files(env.target);
  const std::vector<std::string> steps =
      parents ? pathPrefixes(path) : std::vector<std::string>{path};
  for (const auto& step : steps) {
    const absl::Status made = co_await files.mkdir(step, mode);
    if (made.ok()) continue;
    if (parents && client::errnoValue(made) == EEXIST) {
      auto st = co_await files.stat(step);
      if (st.ok() && st->isDirectory()) continue;
    }
    co_return report(what, made);
  }
  co_return kExitOk;
}

// Removes `path` and, for a directory, everything below it (never following
// symlinks: a link is removed, not what it names).
net::awaitable<absl::Status> removeTree(Files& files, const std::string& path, bool is_dir) {
  if (!is_dir) co_return co_await files.unlink(path);
  auto listed = co_await listDir(files, path);
  if (!listed.ok()) co_return listed.status();
  for (const auto& e : *listed) {
    if (e.name == "." || e.name == "..") continue;
    const std::string child = joinPath(path, e.name);
    bool child_dir = e.dtype == DT_DIR;
    if (e.dtype == DT_UNKNOWN) {
      auto st = co_await files.lstat(child);
      if (!st.ok()) co_return st.status();
      child_dir = st->isDirectory();
    }
    CO_RETURN_IF_ERROR(co_await removeTree(files, child, child_dir));
  }
  co_return co_await files.rmdir(path);
}

net::awaitable<int> rm(const CommandEnv& env, const std::string& path, bool recursive) {
  const std::string what = absl::StrCat("fs rm ", path);
  Files files(env.target);
  auto st = co_await files.lstat(path);
  if (!st.ok()) co_return report(what, st.status());
  const bool is_dir = st->isDirectory();
  if (is_dir && !recursive) co_return report(what, errnoStatus(EISDIR, ""));
  // Like rm(1) without --no-preserve-root.
  if (is_dir && isRootLike(path)) {
    printError(absl::StrCat(what, ": refusing to remove the root directory"));
    co_return kExitError;
  }
  // Like rm(1) too: "/tmp/.." names the parent (here the root), "x/." the
  // directory itself; a recursive remove of either is refused.
  if (is_dir && endsInDotOrDotDot(path)) {
    printError(absl::StrCat(what, ": refusing to remove '.' or '..' (name the directory itself)"));
    co_return kExitError;
  }
  const absl::Status s = co_await removeTree(files, path, is_dir);
  if (!s.ok()) co_return report(what, s);
  co_return kExitOk;
}

// Parses a --mode flag into *mode; false after printing why (a usage error).
bool parseModeOrReport(const std::string& text, uint32_t* mode) {
  auto parsed = parseOctalMode(text);
  if (!parsed.ok()) {
    printError(sv(parsed.status().message()));
    return false;
  }
  *mode = *parsed;
  return true;
}

}  // namespace

void addFsCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* fs = app.add_subcommand("fs", "Files inside the target's root");
  fs->require_subcommand(1);
  addFsMountCommand(*fs, out);

  {
    struct Flags {
      std::vector<std::string> paths;
      bool follow = false;
    };
    auto f = std::make_shared<Flags>();
    CLI::App* c = fs->add_subcommand("stat", "Status of files (lstat; -L follows links)");
    c->add_option("path", f->paths, "Paths inside the target's root")->required();
    c->add_flag("-L,--dereference", f->follow, "Follow a final symlink");
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     co_return co_await statAll(env, f->paths, f->follow);
                   }});
  }
  {
    struct Flags {
      std::string path;
      bool long_form = false;
      bool all = false;
    };
    auto f = std::make_shared<Flags>();
    CLI::App* c = fs->add_subcommand("ls", "Entries of a directory, sorted by name");
    c->add_option("path", f->path, "Directory (or file) inside the target's root")->required();
    c->add_flag("-l", f->long_form, "Mode, links, owner, size, mtime (UTC)");
    c->add_flag("-a,--all", f->all, "Include names that start with '.'");
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     co_return co_await ls(env, f->path, f->long_form, f->all);
                   }});
  }
  {
    auto paths = std::make_shared<std::vector<std::string>>();
    CLI::App* c = fs->add_subcommand("cat", "Write files to stdout, byte for byte");
    c->add_option("path", *paths, "Files inside the target's root")->required();
    out.push_back({c, [paths](const CommandEnv& env) -> net::awaitable<int> {
                     int rc = kExitOk;
                     for (const auto& p : *paths) rc = std::max(rc, co_await catOne(env, p));
                     co_return rc;
                   }});
  }
  {
    auto path = std::make_shared<std::string>();
    CLI::App* c = fs->add_subcommand("readlink", "The target of a symlink");
    c->add_option("path", *path, "Symlink inside the target's root")->required();
    out.push_back({c, [path](const CommandEnv& env) -> net::awaitable<int> {
                     Files files(env.target);
                     auto target = co_await files.readlink(*path);
                     if (!target.ok()) {
                       co_return report(absl::StrCat("fs readlink ", *path), target.status());
                     }
                     co_return printOutput(*target + "\n");
                   }});
  }
  {
    struct Flags {
      std::string path;
      std::string mode = "0644";
    };
    auto f = std::make_shared<Flags>();
    CLI::App* c =
        fs->add_subcommand("write", "Write stdin to a file (created, or truncated first)");
    c->add_option("path", f->path, "File inside the target's root")->required();
    c->add_option("--mode", f->mode, "Mode of a new file (octal; made as given)")
        ->capture_default_str();
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     uint32_t mode = 0;
                     if (!parseModeOrReport(f->mode, &mode)) co_return kExitUsage;
                     co_return co_await writeOne(env, f->path, mode);
                   }});
  }
  {
    struct Flags {
      std::string path;
      bool parents = false;
      std::string mode = "0755";
    };
    auto f = std::make_shared<Flags>();
    CLI::App* c = fs->add_subcommand("mkdir", "Create a directory");
    c->add_option("path", f->path, "Directory inside the target's root")->required();
    c->add_flag("-p,--parents", f->parents,
                "Create missing parents; an existing directory is fine");
    c->add_option("--mode", f->mode, "Mode of a new directory (octal; made as given)")
        ->capture_default_str();
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     uint32_t mode = 0;
                     if (!parseModeOrReport(f->mode, &mode)) co_return kExitUsage;
                     co_return co_await mkdirAll(env, f->path, f->parents, mode);
                   }});
  }
  {
    struct Flags {
      std::string path;
      bool recursive = false;
    };
    auto f = std::make_shared<Flags>();
    CLI::App* c = fs->add_subcommand("rm", "Remove a file, a symlink, or (-r) a directory tree");
    c->add_option("path", f->path, "Path inside the target's root")->required();
    c->add_flag("-r,-R,--recursive", f->recursive, "Remove a directory and everything below it");
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     co_return co_await rm(env, f->path, f->recursive);
                   }});
  }
  {
    struct Flags {
      std::string from, to;
    };
    auto f = std::make_shared<Flags>();
    CLI::App* c = fs->add_subcommand("mv", "Rename FROM to TO (rename(2): same file system)");
    c->add_option("from", f->from, "Existing path")->required();
    c->add_option("to", f->to, "New path (replaced if it exists)")->required();
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     Files files(env.target);
                     const absl::Status moved = co_await files.rename(f->from, f->to);
                     if (!moved.ok()) {
                       co_return report(absl::StrCat("fs mv ", f->from, " ", f->to), moved);
                     }
                     co_return kExitOk;
                   }});
  }
}

}  // namespace siphon::cli
