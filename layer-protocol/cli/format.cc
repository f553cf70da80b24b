#include "cli/format.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstring>
#include <ctime>

#include "absl/strings/str_format.h"
#include "siphon/client/errors.h"
#include "siphon/status.h"

namespace siphon::cli {

// ------------------------------------------------------------ counts, sizes

std::string plural(uint64_t n, std::string_view one) {
  return absl::StrCat(n, " ", asv(one), n == 1 ? "" : "s");
}

std::string plural(uint64_t n, std::string_view one, std::string_view many) {
  return absl::StrCat(n, " ", asv(n == 1 ? one : many));
}

std::string byteSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  constexpr size_t kLast = sizeof(kUnits) / sizeof(kUnits[0]) - 1;
  size_t unit = 0;
  while (unit < kLast && bytes >> (10 * (unit + 1)) != 0) ++unit;
  const uint64_t scale = uint64_t{1} << (10 * unit);
  if (bytes % scale == 0) return absl::StrCat(bytes / scale, " ", kUnits[unit]);
  const double value = static_cast<double>(bytes) / static_cast<double>(scale);
  // 1048575 B is 1023.9990 KiB: one decimal would say "1024.0 KiB".
  if (value >= 1023.95 && unit < kLast) {
    return absl::StrFormat("%.1f %s", value / 1024.0, kUnits[unit + 1]);
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

// ------------------------------------------------------------ failures

std::string statusText(const absl::Status& status) {
  return absl::StrCat(client::errorName(client::errorCode(status)), ": ", status.message());
}

std::string hostPort(std::string_view host, uint32_t port) {
  if (host.find(':') != std::string_view::npos) return absl::StrCat("[", asv(host), "]:", port);
  return absl::StrCat(asv(host), ":", port);
}

std::string errnoText(int err) {
  const char* name = ::strerrorname_np(err);
  return absl::StrCat(std::strerror(err), " (",
                      name != nullptr ? std::string(name) : absl::StrCat("errno ", err), ")");
}

std::string errnoFailure(std::string_view what, int err, std::string_view reason) {
  return absl::StrCat(asv(what), ": ", errnoText(err), reason.empty() ? "" : ": ", asv(reason));
}

// ------------------------------------------------------------ file modes

std::string fileTypeName(uint32_t mode) {
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

std::string fileTypeKey(uint32_t mode) {
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

std::string direntTypeKey(uint32_t dtype) {
  switch (dtype) {
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
  // Lower case when the execute bit under the special bit is set too.
  auto special = [&](int pos, uint32_t bit, char set_x, char set_no_x) {
    if (mode & bit) s[pos] = s[pos] == 'x' ? set_x : set_no_x;
  };
  special(3, S_ISUID, 's', 'S');
  special(6, S_ISGID, 's', 'S');
  special(9, S_ISVTX, 't', 'T');
  return s;
}

std::string octalPermissions(uint32_t mode) { return absl::StrFormat("%04o", mode & 07777); }

absl::StatusOr<uint32_t> parseOctalMode(std::string_view text, std::string_view flag) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(asv(flag), ": '", asv(text), "' is not an octal mode like 0644"));
  }
  uint32_t mode = 0;
  for (char c : text) mode = mode * 8 + static_cast<uint32_t>(c - '0');
  return mode;
}

// ------------------------------------------------------------ times

namespace {

// The broken-down UTC time of `ns` and the nanoseconds past its second
// (never negative: 1969-12-31 23:59:59.5 is second -1 plus 500000000).
struct tm utcParts(int64_t ns, int64_t* frac_out) {
  time_t sec = static_cast<time_t>(ns / 1000000000);
  int64_t frac = ns % 1000000000;
  if (frac < 0) {
    frac += 1000000000;
    --sec;
  }
  struct tm tm {};
  ::gmtime_r(&sec, &tm);
  *frac_out = frac;
  return tm;
}

}  // namespace

std::string utcTime(int64_t ns) {
  int64_t frac = 0;
  const struct tm tm = utcParts(ns, &frac);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return absl::StrFormat("%s.%09d +0000", buf, frac);
}

std::string utcMinute(int64_t ns) {
  int64_t frac = 0;
  const struct tm tm = utcParts(ns, &frac);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

// ------------------------------------------------------------ paths

std::string joinPath(std::string_view dir, std::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(asv(dir), asv(name));
  return absl::StrCat(asv(dir), "/", asv(name));
}

bool isRootLike(std::string_view path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    if (!part.empty() && part != "." && part != "..") return false;
    start = end + 1;
  }
  return true;
}

bool endsInDotOrDotDot(std::string_view path) {
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  const std::string_view last = slash == std::string_view::npos ? path : path.substr(slash + 1);
  return last == "." || last == "..";
}

std::vector<std::string> pathPrefixes(std::string_view path) {
  std::vector<std::string> out;
  std::string prefix = !path.empty() && path[0] == '/' ? "/" : "";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    start = end + 1;
    if (part.empty() || part == ".") continue;
    prefix += part;
    out.push_back(prefix);
    prefix += "/";
  }
  return out;
}

// ------------------------------------------------------------ siphon fs

std::string statText(std::string_view path, const client::FileStat& st,
                     std::string_view link_target) {
  std::string out = absl::StrCat("  File: ", asv(path), link_target.empty() ? "" : " -> ",
                                 asv(link_target), "\n");
  absl::StrAppendFormat(&out, "  Size: %-15d Blocks: %-10d IO Block: %-6d %s\n", st.size, st.blocks,
                        st.blksize, fileTypeName(st.mode));
  const dev_t dev = static_cast<dev_t>(st.dev);
  absl::StrAppendFormat(&out, "Device: %d,%-12d Inode: %-11d Links: %d", major(dev), minor(dev),
                        st.ino, st.nlink);
  if (S_ISCHR(st.mode) || S_ISBLK(st.mode)) {
    const dev_t rdev = static_cast<dev_t>(st.rdev);
    absl::StrAppendFormat(&out, "     Device type: %d,%d", major(rdev), minor(rdev));
  }
  out += "\n";
  absl::StrAppend(&out, "Access: (", octalPermissions(st.mode), "/", modeString(st.mode),
                  ")  Uid: ", st.uid, "  Gid: ", st.gid, "\n");
  absl::StrAppend(&out, "Access: ", utcTime(st.atime_ns), "\nModify: ", utcTime(st.mtime_ns),
                  "\nChange: ", utcTime(st.ctime_ns), "\n");
  return out;
}

void appendStatJson(JsonWriter& j, const client::FileStat& st) {
  j.key("type").value(fileTypeKey(st.mode));
  j.key("mode").value(st.mode);
  j.key("permissions").value(octalPermissions(st.mode));
  j.key("size").value(st.size);
  j.key("blocks").value(st.blocks);
  j.key("blksize").value(st.blksize);
  j.key("dev").value(st.dev);
  j.key("ino").value(st.ino);
  j.key("nlink").value(st.nlink);
  j.key("uid").value(st.uid);
  j.key("gid").value(st.gid);
  j.key("rdev").value(st.rdev);
  j.key("atime_ns").value(st.atime_ns);
  j.key("mtime_ns").value(st.mtime_ns);
  j.key("ctime_ns").value(st.ctime_ns);
}

std::string listingText(const std::vector<ListEntry>& entries) {
  std::string out;
  for (const auto& e : entries) absl::StrAppend(&out, e.name, "\n");
  return out;
}

std::string longListing(const std::vector<ListEntry>& entries) {
  size_t wl = 1, wu = 1, wg = 1, ws = 1;
  for (const auto& e : entries) {
    if (!e.stat) continue;
    wl = std::max(wl, absl::StrCat(e.stat->nlink).size());
    wu = std::max(wu, absl::StrCat(e.stat->uid).size());
    wg = std::max(wg, absl::StrCat(e.stat->gid).size());
    ws = std::max(ws, absl::StrCat(e.stat->size).size());
  }
  const int l = static_cast<int>(wl), u = static_cast<int>(wu), g = static_cast<int>(wg),
            s = static_cast<int>(ws);
  std::string out;
  for (const auto& e : entries) {
    if (!e.stat) {
      absl::StrAppendFormat(&out, "?????????? %*s %*s %*s %*s %-16s %s\n", l, "?", u, "?", g, "?",
                            s, "?", "", e.name);
      continue;
    }
    const client::FileStat& st = *e.stat;
    absl::StrAppendFormat(&out, "%s %*d %*d %*d %*d %s %s%s%s\n", modeString(st.mode), l, st.nlink,
                          u, st.uid, g, st.gid, s, st.size, utcMinute(st.mtime_ns), e.name,
                          e.link_target.empty() ? "" : " -> ", e.link_target);
  }
  return out;
}

std::string listingJson(const std::vector<ListEntry>& entries) {
  JsonWriter j;
  j.beginArray();
  for (const auto& e : entries) {
    j.beginObject();
    j.key("name").value(e.name);
    if (e.stat) {
      appendStatJson(j, *e.stat);
      if (!e.link_target.empty()) j.key("target").value(e.link_target);
    } else {
      j.key("type").value(direntTypeKey(e.dtype));
      j.key("ino").value(e.ino);
    }
    j.endObject();
  }
  j.endArray();
  return j.take();
}

}  // namespace siphon::cli
