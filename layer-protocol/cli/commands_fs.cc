// `siphon fs ...`: files inside the target's root, through the agent's file
// requests (siphon.v1.FileRequest).
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
#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/json_writer.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::cli {
namespace {

// Requests kept in flight by cat and write: enough to hide the round trip
// behind the agent's reads and writes; each is at most max_read_size.
constexpr size_t kPipelineDepth = 4;
constexpr size_t kStatDepth = 16;  // lstat calls of `ls -l`
constexpr uint32_t kDirBatch = 1024;

// ------------------------------------------------------------ errors

// Reports a failed operation `what` ("fs cat /etc/shadow") and returns the
// exit code.
int report(std::string_view what, const absl::Status& status) {
  const int err = errnoOf(status);
  if (errorCodeOf(status) == v1::ERRNO && err != 0) {
    const char* name = ::strerrorname_np(err);
    // The agent's own reason, when the errno is its answer rather than the
    // kernel's: "Too many open files (EMFILE): open file and directory limit
    // of 64 reached (siphon-agent --max-open-files raises it)".
    const std::string_view reason = errnoReason(status);
    printError(absl::StrCat(asv(what), ": ", std::strerror(err), " (",
                            name != nullptr ? std::string(name) : absl::StrCat("errno ", err), ")",
                            reason.empty() ? "" : ": ", asv(reason)));
    return kExitError;
  }
  Failure f = requestFailure(what, status);
  printError(f.message);
  return f.exit_code;
}

absl::Status errnoError(int err) { return errnoStatus(err, ""); }

// ------------------------------------------------------------ requests

using FileResult = absl::StatusOr<v1::FileResponse>;

net::awaitable<FileResult> fileCall(std::shared_ptr<client::Client> client,
                                    std::chrono::milliseconds timeout, v1::FileRequest fr) {
  // GCC 12: name by-value coroutine parameters that must live across a
  // suspension.
  const auto keep_alive = std::move(client);
  v1::Request req;
  *req.mutable_file() = std::move(fr);
  auto r = co_await keep_alive->call(std::move(req), timeout);
  if (!r.ok()) co_return r.status();
  if (!r->has_file()) {
    co_return protoError(v1::INTERNAL, "the agent answered with another kind of response");
  }
  co_return std::move(*r->mutable_file());
}

net::awaitable<FileResult> fileCall(const CommandEnv& env, v1::FileRequest fr) {
  co_return co_await fileCall(env.client, env.timeout, std::move(fr));
}

// Requests in flight, answered in the order they were pushed.
class Pipeline {
 public:
  Pipeline(net::asio::any_io_executor ex, const CommandEnv& env)
      : ex_(std::move(ex)), client_(env.client), timeout_(env.timeout) {}

  size_t size() const { return slots_.size(); }

  void push(v1::FileRequest fr) {
    auto slot = std::make_shared<Slot>(ex_);
    slots_.push_back(slot);
    net::spawn(ex_, run(client_, timeout_, std::move(fr), slot), "fs_request", [slot] {
      slot->result = absl::InternalError("the request failed inside the client");
      slot->finished = true;
      slot->done.notify();
    });
  }

  // The answer to the oldest request still queued. Precondition: size() > 0.
  net::awaitable<FileResult> pop() {
    std::shared_ptr<Slot> slot = std::move(slots_.front());
    slots_.pop_front();
    // `finished` is checked first: a notify() before wait() would be lost.
    while (!slot->finished) co_await slot->done.wait();
    co_return std::move(slot->result);
  }

 private:
  struct Slot {
    explicit Slot(net::asio::any_io_executor ex) : done(std::move(ex)) {}
    net::Signal done;
    bool finished = false;
    FileResult result = absl::UnknownError("pending");
  };

  static net::awaitable<void> run(std::shared_ptr<client::Client> client,
                                  std::chrono::milliseconds timeout, v1::FileRequest fr,
                                  std::shared_ptr<Slot> slot) {
    const auto keep_alive = slot;
    keep_alive->result = co_await fileCall(std::move(client), timeout, std::move(fr));
    keep_alive->finished = true;
    keep_alive->done.notify();
  }

  net::asio::any_io_executor ex_;
  std::shared_ptr<client::Client> client_;
  std::chrono::milliseconds timeout_;
  std::deque<std::shared_ptr<Slot>> slots_;
};

v1::FileRequest openReq(const std::string& path, int flags, uint32_t mode = 0) {
  v1::FileRequest r;
  r.mutable_open()->set_path(path);
  r.mutable_open()->set_flags(flags);
  r.mutable_open()->set_mode(mode);
  return r;
}

v1::FileRequest statReq(const std::string& path, bool follow) {
  v1::FileRequest r;
  r.mutable_stat()->set_path(path);
  r.mutable_stat()->set_follow_symlinks(follow);
  return r;
}

v1::FileRequest readlinkReq(const std::string& path) {
  v1::FileRequest r;
  r.mutable_readlink()->set_path(path);
  return r;
}

v1::FileRequest closeReq(uint64_t fd) {
  v1::FileRequest r;
  r.mutable_close()->set_fd(fd);
  return r;
}

// The largest read or write one request may carry.
uint32_t chunkSize(const CommandEnv& env) {
  const uint32_t max = env.client->welcome().limits().max_read_size();
  return max == 0 ? 64 * 1024 : max;
}

std::string joinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return dir + name;
  return absl::StrCat(dir, "/", name);
}

// ------------------------------------------------------------ text forms

std::string typeName(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "regular file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symbolic link";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "character special file";
    case S_IFBLK:
      return "block special file";
    default:
      return "unknown";
  }
}

// The short type names of --json output.
std::string typeKey(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symlink";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    case S_IFCHR:
      return "char";
    case S_IFBLK:
      return "block";
    default:
      return "unknown";
  }
}

std::string dtypeKey(uint32_t dt) {
  switch (dt) {
    case DT_REG:
      return "file";
    case DT_DIR:
      return "directory";
    case DT_LNK:
      return "symlink";
    case DT_FIFO:
      return "fifo";
    case DT_SOCK:
      return "socket";
    case DT_CHR:
      return "char";
    case DT_BLK:
      return "block";
    default:
      return "unknown";
  }
}

// "-rw-r--r--", with s/S, t/T for the special bits, as ls(1) shows them.
std::string modeString(uint32_t mode) {
  std::string s(10, '-');
  switch (mode & S_IFMT) {
    case S_IFDIR:
      s[0] = 'd';
      break;
    case S_IFLNK:
      s[0] = 'l';
      break;
    case S_IFIFO:
      s[0] = 'p';
      break;
    case S_IFSOCK:
      s[0] = 's';
      break;
    case S_IFCHR:
      s[0] = 'c';
      break;
    case S_IFBLK:
      s[0] = 'b';
      break;
    default:
      break;
  }
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) {
    if (mode & (1u << (8 - i))) s[1 + i] = rwx[i];
  }
  auto special = [&](int pos, uint32_t bit, char set_x, char set_no_x) {
    if (mode & bit) s[pos] = s[pos] == 'x' ? set_x : set_no_x;
  };
  special(3, S_ISUID, 's', 'S');
  special(6, S_ISGID, 's', 'S');
  special(9, S_ISVTX, 't', 'T');
  return s;
}

// "2024-05-01 12:00:00.123456789 +0000" (UTC: the target's zone is unknown).
std::string timeString(int64_t ns, bool with_ns = true) {
  time_t sec = static_cast<time_t>(ns / 1000000000);
  int64_t frac = ns % 1000000000;
  if (frac < 0) {
    frac += 1000000000;
    --sec;
  }
  struct tm tm {};
  ::gmtime_r(&sec, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, with_ns ? "%Y-%m-%d %H:%M:%S" : "%Y-%m-%d %H:%M", &tm);
  if (!with_ns) return buf;
  return fmt::format("{}.{:09d} +0000", buf, frac);
}

std::string statText(const std::string& path, const v1::FileStat& st, const std::string& target) {
  std::string out = fmt::format("  File: {}{}\n", path, target.empty() ? "" : " -> " + target);
  out += fmt::format("  Size: {:<15} Blocks: {:<10} IO Block: {:<6} {}\n", st.size(), st.blocks(),
                     st.blksize(), typeName(st.mode()));
  const dev_t dev = static_cast<dev_t>(st.dev());
  out += fmt::format("Device: {},{:<12} Inode: {:<11} Links: {}", major(dev), minor(dev), st.ino(),
                     st.nlink());
  if (S_ISCHR(st.mode()) || S_ISBLK(st.mode())) {
    const dev_t rdev = static_cast<dev_t>(st.rdev());
    out += fmt::format("     Device type: {},{}", major(rdev), minor(rdev));
  }
  out += "\n";
  out += fmt::format("Access: ({:04o}/{})  Uid: {}  Gid: {}\n", st.mode() & 07777,
                     modeString(st.mode()), st.uid(), st.gid());
  out += fmt::format("Access: {}\nModify: {}\nChange: {}\n", timeString(st.atime_ns()),
                     timeString(st.mtime_ns()), timeString(st.ctime_ns()));
  return out;
}

void statJson(JsonWriter& j, const v1::FileStat& st) {
  j.key("type").value(typeKey(st.mode()));
  j.key("mode").value(st.mode());
  j.key("permissions").value(fmt::format("{:04o}", st.mode() & 07777));
  j.key("size").value(st.size());
  j.key("blocks").value(st.blocks());
  j.key("blksize").value(st.blksize());
  j.key("dev").value(st.dev());
  j.key("ino").value(st.ino());
  j.key("nlink").value(st.nlink());
  j.key("uid").value(st.uid());
  j.key("gid").value(st.gid());
  j.key("rdev").value(st.rdev());
  j.key("atime_ns").value(st.atime_ns());
  j.key("mtime_ns").value(st.mtime_ns());
  j.key("ctime_ns").value(st.ctime_ns());
}

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

absl::StatusOr<uint32_t> parseMode(const std::string& text) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode: '", text, "' is not an octal mode like 0644"));
  }
  return static_cast<uint32_t>(std::stoul(text, nullptr, 8));
}

// ------------------------------------------------------------ cat

// Streams one file to stdout with preads kept in flight, written in order.
// A short read that is not the end (procfs, a file being truncated) drops
// the reads issued past it and goes on from where the data stopped; a file
// that cannot pread (a FIFO, a device: ESPIPE) is read with plain reads,
// one at a time.
net::awaitable<int> catOne(const CommandEnv& env, const std::string& path) {
  const std::string what = absl::StrCat("fs cat ", path);
  auto opened = co_await fileCall(env, openReq(path, O_RDONLY));
  if (!opened.ok()) co_return report(what, opened.status());
  const uint64_t fd = opened->opened().fd();

  v1::FileRequest fstat;
  fstat.mutable_fstat()->set_fd(fd);
  auto st = co_await fileCall(env, std::move(fstat));
  absl::Status failure = st.ok() ? absl::OkStatus() : st.status();
  // Regular files of known size get reads in flight up to that size; others
  // one read at a time.
  const int64_t size = st.ok() && S_ISREG(st->stat().mode()) ? st->stat().size() : 0;

  const uint32_t chunk = chunkSize(env);
  Pipeline pipe(co_await net::asio::this_coro::executor, env);
  struct Issued {
    uint64_t generation;
  };
  std::deque<Issued> issued;  // what `pipe` holds, oldest first
  int64_t next = 0;           // offset of the next pread to issue
  int64_t cursor = 0;         // bytes written to stdout
  // Reads issued before a short read (or before switching to plain reads)
  // belong to an older generation: their answers are dropped.
  uint64_t generation = 0;
  size_t live = 0;  // reads of the current generation in flight
  bool sequential = false;
  bool done = !failure.ok();
  auto issue = [&] {
    v1::FileRequest r;
    if (sequential) {
      r.mutable_read()->set_fd(fd);
      r.mutable_read()->set_size(chunk);
    } else {
      r.mutable_pread()->set_fd(fd);
      r.mutable_pread()->set_size(chunk);
      r.mutable_pread()->set_offset(next);
      next += chunk;
    }
    pipe.push(std::move(r));
    issued.push_back({generation});
    ++live;
  };
  // Plain reads go one at a time (two on the agent's pool could finish out
  // of order); preads fill the pipeline up to the known size, and one more
  // is always in flight until the end is seen (the file may have grown).
  auto refill = [&] {
    if (done) return;
    if (sequential) {
      if (live == 0) issue();
      return;
    }
    while (live < kPipelineDepth && (next < size || live == 0)) issue();
  };
  refill();
  while (!issued.empty()) {
    const Issued head = issued.front();
    issued.pop_front();
    auto r = co_await pipe.pop();
    if (head.generation != generation) continue;
    --live;
    if (done) continue;
    if (!r.ok()) {
      if (!sequential && cursor == 0 && errnoOf(r.status()) == ESPIPE) {
        sequential = true;
        ++generation;
        live = 0;
        refill();
        continue;
      }
      failure = r.status();
      done = true;
      continue;
    }
    const std::string& data = r->data().data();
    if (!writeStdout(data)) {
      failure = protoError(v1::INTERNAL, "cannot write to stdout");
      done = true;
      continue;
    }
    cursor += static_cast<int64_t>(data.size());
    if (r->data().eof()) {
      done = true;
      continue;
    }
    if (!sequential && data.size() < chunk) {
      // A short read that is not the end: reads issued past it may have
      // left a hole. Drop them and go on from here.
      ++generation;
      live = 0;
      next = cursor;
    }
    refill();
  }
  auto closed = co_await fileCall(env, closeReq(fd));
  if (!failure.ok()) co_return report(what, failure);
  (void)closed;  // a read-only close has nothing to report
  co_return kExitOk;
}

// ------------------------------------------------------------ write

// stdin to PATH: O_WRONLY|O_CREAT|O_TRUNC, pwrites kept in flight. A short
// write is completed by another pwrite of the rest.
net::awaitable<int> writeFile(const CommandEnv& env, const std::string& path, uint32_t mode) {
  const std::string what = absl::StrCat("fs write ", path);
  auto opened = co_await fileCall(env, openReq(path, O_WRONLY | O_CREAT | O_TRUNC, mode));
  if (!opened.ok()) co_return report(what, opened.status());
  const uint64_t fd = opened->opened().fd();

  const uint32_t chunk = chunkSize(env);
  Pipeline pipe(co_await net::asio::this_coro::executor, env);
  struct Pending {
    int64_t offset;
    std::string data;
  };
  std::deque<Pending> pending;
  auto push = [&](int64_t offset, std::string data) {
    v1::FileRequest r;
    r.mutable_pwrite()->set_fd(fd);
    r.mutable_pwrite()->set_offset(offset);
    r.mutable_pwrite()->set_data(data);
    pipe.push(std::move(r));
    pending.push_back({offset, std::move(data)});
  };
  int64_t offset = 0;
  bool input_done = false;
  absl::Status failure;
  while (true) {
    while (failure.ok() && !input_done && pending.size() < kPipelineDepth) {
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
    if (pending.empty()) break;
    Pending head = std::move(pending.front());
    pending.pop_front();
    auto r = co_await pipe.pop();
    if (!failure.ok()) continue;
    if (!r.ok()) {
      failure = r.status();
      continue;
    }
    const uint64_t written = r->written().written();
    if (written == 0 && !head.data.empty()) {
      failure = errnoError(EIO);
    } else if (written < head.data.size()) {
      push(head.offset + static_cast<int64_t>(written), head.data.substr(written));
    }
  }
  auto closed = co_await fileCall(env, closeReq(fd));
  if (!failure.ok()) co_return report(what, failure);
  if (!closed.ok()) co_return report(what, closed.status());
  co_return kExitOk;
}

// ------------------------------------------------------------ directories

struct Entry {
  std::string name;
  uint32_t dtype = DT_UNKNOWN;
  uint64_t ino = 0;
  std::optional<v1::FileStat> stat;  // ls -l
  std::string target;                // symlinks, ls -l
};

// Every entry of a directory, "." and ".." included, in the agent's order.
net::awaitable<absl::StatusOr<std::vector<Entry>>> listDir(const CommandEnv& env,
                                                           const std::string& path) {
  v1::FileRequest od;
  od.mutable_opendir()->set_path(path);
  auto opened = co_await fileCall(env, std::move(od));
  if (!opened.ok()) co_return opened.status();
  const uint64_t dir = opened->opened().fd();
  std::vector<Entry> out;
  absl::Status failure;
  while (true) {
    v1::FileRequest rd;
    rd.mutable_readdir()->set_dir(dir);
    rd.mutable_readdir()->set_max_entries(kDirBatch);
    auto batch = co_await fileCall(env, std::move(rd));
    if (!batch.ok()) {
      failure = batch.status();
      break;
    }
    for (const auto& e : batch->entries().entries()) {
      out.push_back({e.name(), e.type(), e.ino(), std::nullopt, ""});
    }
    if (batch->entries().eof()) break;
    if (batch->entries().entries_size() == 0) {
      failure = protoError(v1::INTERNAL, "the agent returned an empty batch before the end");
      break;
    }
  }
  v1::FileRequest cd;
  cd.mutable_closedir()->set_dir(dir);
  (void)co_await fileCall(env, std::move(cd));
  if (!failure.ok()) co_return failure;
  co_return out;
}

// lstat (and readlink for links) of every entry, kStatDepth at a time.
net::awaitable<absl::Status> statEntries(const CommandEnv& env, const std::string& dir,
                                         std::vector<Entry>& entries) {
  Pipeline pipe(co_await net::asio::this_coro::executor, env);
  absl::Status failure;
  size_t sent = 0, got = 0;
  while (got < entries.size()) {
    while (sent < entries.size() && pipe.size() < kStatDepth) {
      pipe.push(statReq(joinPath(dir, entries[sent].name), false));
      ++sent;
    }
    auto r = co_await pipe.pop();
    Entry& e = entries[got++];
    if (!r.ok()) {
      // Gone between readdir and lstat: leave it without details.
      if (errnoOf(r.status()) != ENOENT && failure.ok()) failure = r.status();
      continue;
    }
    e.stat = r->stat();
  }
  for (Entry& e : entries) {
    if (!e.stat || !S_ISLNK(e.stat->mode())) continue;
    auto t = co_await fileCall(env, readlinkReq(joinPath(dir, e.name)));
    if (t.ok()) e.target = t->link().target();
  }
  co_return failure;
}

std::string longListing(const std::vector<Entry>& entries) {
  size_t wl = 1, wu = 1, wg = 1, ws = 1;
  for (const auto& e : entries) {
    if (!e.stat) continue;
    wl = std::max(wl, std::to_string(e.stat->nlink()).size());
    wu = std::max(wu, std::to_string(e.stat->uid()).size());
    wg = std::max(wg, std::to_string(e.stat->gid()).size());
    ws = std::max(ws, std::to_string(e.stat->size()).size());
  }
  std::string out;
  for (const auto& e : entries) {
    if (!e.stat) {
      out += fmt::format("?????????? {:>{}} {:>{}} {:>{}} {:>{}} {:16} {}\n", "?", wl, "?", wu, "?",
                         wg, "?", ws, "", e.name);
      continue;
    }
    const auto& st = *e.stat;
    out +=
        fmt::format("{} {:>{}} {:>{}} {:>{}} {:>{}} {} {}{}\n", modeString(st.mode()), st.nlink(),
                    wl, st.uid(), wu, st.gid(), wg, st.size(), ws, timeString(st.mtime_ns(), false),
                    e.name, e.target.empty() ? "" : " -> " + e.target);
  }
  return out;
}

std::string listingJson(const std::vector<Entry>& entries) {
  JsonWriter j;
  j.beginArray();
  for (const auto& e : entries) {
    j.beginObject();
    j.key("name").value(e.name);
    if (e.stat) {
      statJson(j, *e.stat);
      if (!e.target.empty()) j.key("target").value(e.target);
    } else {
      j.key("type").value(dtypeKey(e.dtype));
      j.key("ino").value(e.ino);
    }
    j.endObject();
  }
  j.endArray();
  return j.take();
}

net::awaitable<int> ls(const CommandEnv& env, const std::string& path, bool long_form, bool all) {
  const std::string what = absl::StrCat("fs ls ", path);
  auto listed = co_await listDir(env, path);
  std::vector<Entry> entries;
  std::string dir = path;
  if (!listed.ok() && errnoOf(listed.status()) == ENOTDIR) {
    // ls of a file shows the file.
    auto st = co_await fileCall(env, statReq(path, false));
    if (!st.ok()) co_return report(what, st.status());
    Entry e{path, DT_UNKNOWN, st->stat().ino(), st->stat(), ""};
    if (S_ISLNK(st->stat().mode())) {
      auto t = co_await fileCall(env, readlinkReq(path));
      if (t.ok()) e.target = t->link().target();
    }
    entries.push_back(std::move(e));
  } else if (!listed.ok()) {
    co_return report(what, listed.status());
  } else {
    for (auto& e : *listed) {
      if (!all && !e.name.empty() && e.name[0] == '.') continue;
      entries.push_back(std::move(e));
    }
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.name < b.name; });
    if (long_form) {
      absl::Status s = co_await statEntries(env, dir, entries);
      if (!s.ok()) co_return report(what, s);
    }
  }
  if (env.json) co_return printOutput(listingJson(entries));
  if (long_form) co_return printOutput(longListing(entries));
  std::string out;
  for (const auto& e : entries) absl::StrAppend(&out, e.name, "\n");
  co_return printOutput(out);
}

// Removes `path` and, for a directory, everything below it (never following
// symlinks: a link is removed, not what it names).
net::awaitable<absl::Status> removeTree(const CommandEnv& env, const std::string& path,
                                        bool is_dir) {
  if (!is_dir) {
    v1::FileRequest u;
    u.mutable_unlink()->set_path(path);
    auto r = co_await fileCall(env, std::move(u));
    co_return r.status();
  }
  auto listed = co_await listDir(env, path);
  if (!listed.ok()) co_return listed.status();
  for (const auto& e : *listed) {
    if (e.name == "." || e.name == "..") continue;
    const std::string child = joinPath(path, e.name);
    bool child_dir = e.dtype == DT_DIR;
    if (e.dtype == DT_UNKNOWN) {
      auto st = co_await fileCall(env, statReq(child, false));
      if (!st.ok()) co_return st.status();
      child_dir = S_ISDIR(st->stat().mode());
    }
    CO_RETURN_IF_ERROR(co_await removeTree(env, child, child_dir));
  }
  v1::FileRequest rd;
  rd.mutable_rmdir()->set_path(path);
  auto r = co_await fileCall(env, std::move(rd));
  co_return r.status();
}

// Whether `path` names the root itself ("/", "/.", "a/..", ...): rm -r
// refuses it, like rm(1) without --no-preserve-root.
bool isRootLike(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string_view part(path.data() + start, end - start);
    if (!part.empty() && part != "." && part != "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

void addFsCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* fs = app.add_subcommand("fs", "Files inside the target's root");
  fs->require_subcommand(1);

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
                     int rc = kExitOk;
                     JsonWriter j;
                     j.beginArray();
                     std::string text;
                     for (const auto& path : f->paths) {
                       auto st = co_await fileCall(env, statReq(path, f->follow));
                       if (!st.ok()) {
                         rc = std::max(rc, report(absl::StrCat("fs stat ", path), st.status()));
                         continue;
                       }
                       std::string target;
                       if (S_ISLNK(st->stat().mode())) {
                         auto t = co_await fileCall(env, readlinkReq(path));
                         if (t.ok()) target = t->link().target();
                       }
                       if (env.json) {
                         j.beginObject();
                         j.key("path").value(path);
                         statJson(j, st->stat());
                         if (!target.empty()) j.key("target").value(target);
                         j.endObject();
                       } else {
                         text += statText(path, st->stat(), target);
                       }
                     }
                     j.endArray();
                     const int printed = printOutput(env.json ? j.take() : text);
                     co_return rc != kExitOk ? rc : printed;
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
                     auto r = co_await fileCall(env, readlinkReq(*path));
                     if (!r.ok()) co_return report(absl::StrCat("fs readlink ", *path), r.status());
                     co_return printOutput(r->link().target() + "\n");
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
    c->add_option("--mode", f->mode, "Mode of a new file (octal; the agent's umask applies)")
        ->capture_default_str();
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     auto mode = parseMode(f->mode);
                     if (!mode.ok()) {
                       printError(sv(mode.status().message()));
                       co_return kExitUsage;
                     }
                     co_return co_await writeFile(env, f->path, *mode);
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
    c->add_option("--mode", f->mode, "Mode (octal; the agent's umask applies)")
        ->capture_default_str();
    out.push_back({c, [f](const CommandEnv& env) -> net::awaitable<int> {
                     const std::string what = absl::StrCat("fs mkdir ", f->path);
                     auto mode = parseMode(f->mode);
                     if (!mode.ok()) {
                       printError(sv(mode.status().message()));
                       co_return kExitUsage;
                     }
                     std::vector<std::string> steps;
                     if (f->parents) {
                       std::string prefix = !f->path.empty() && f->path[0] == '/' ? "/" : "";
                       size_t start = 0;
                       while (start <= f->path.size()) {
                         size_t end = f->path.find('/', start);
                         if (end == std::string::npos) end = f->path.size();
                         std::string part = f->path.substr(start, end - start);
                         start = end + 1;
                         if (part.empty() || part == ".") continue;
                         prefix += part;
                         steps.push_back(prefix);
                         prefix += "/";
                       }
                     } else {
                       steps.push_back(f->path);
                     }
                     for (const auto& step : steps) {
                       v1::FileRequest r;
                       r.mutable_mkdir()->set_path(step);
                       r.mutable_mkdir()->set_mode(*mode);
                       auto made = co_await fileCall(env, std::move(r));
                       if (made.ok()) continue;
                       if (f->parents && errnoOf(made.status()) == EEXIST) {
                         auto st = co_await fileCall(env, statReq(step, true));
                         if (st.ok() && S_ISDIR(st->stat().mode())) continue;
                       }
                       co_return report(what, made.status());
                     }
                     co_return kExitOk;
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
                     const std::string what = absl::StrCat("fs rm ", f->path);
                     auto st = co_await fileCall(env, statReq(f->path, false));
                     if (!st.ok()) co_return report(what, st.status());
                     const bool is_dir = S_ISDIR(st->stat().mode());
                     if (is_dir && !f->recursive) co_return report(what, errnoError(EISDIR));
                     if (is_dir && isRootLike(f->path)) {
                       printError(absl::StrCat(what, ": refusing to remove the root directory"));
                       co_return kExitError;
                     }
                     absl::Status s = co_await removeTree(env, f->path, is_dir);
                     if (!s.ok()) co_return report(what, s);
                     co_return kExitOk;
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
                     v1::FileRequest r;
                     r.mutable_rename()->set_from(f->from);
                     r.mutable_rename()->set_to(f->to);
                     auto moved = co_await fileCall(env, std::move(r));
                     if (!moved.ok()) {
                       co_return report(absl::StrCat("fs mv ", f->from, " ", f->to),
                                        moved.status());
                     }
                     co_return kExitOk;
                   }});
  }
}

}  // namespace siphon::cli
