// The CLI's small text forms, in one place for every command: counts and
// sizes, failed statuses and errnos, file modes and types, UTC
// times, and the stat(1)- and ls(1)-like output of `siphon fs`. Pure
// functions of their arguments (no I/O, no protobuf), so tests/unit/cli
// pins every format; scripts read these, so a change here is a change of the
// CLI's output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/json_writer.h"
#include "siphon/client/files.h"

namespace siphon::cli {

// ------------------------------------------------------------ counts, sizes

// "1 packet", "3 packets": `one` with an "s" unless n is 1.
std::string plural(uint64_t n, std::string_view one);
// "1 entry", "3 entries".
std::string plural(uint64_t n, std::string_view one, std::string_view many);

// "0 B", "1023 B", "1.5 KiB", "16 MiB", "2.3 GiB": binary units, a whole
// number when it is one, else one decimal (rounded; never "1024.0 KiB").
std::string byteSize(uint64_t bytes);

// Each item followed by '\n' ("a\nb\n"); "" for none. Items are anything
// absl::StrAppend takes.
template <typename Range>
std::string joinLines(const Range& items) {
  std::string out;
  for (const auto& item : items) absl::StrAppend(&out, item, "\n");
  return out;
}

// ------------------------------------------------------------ failures

// "CODE: message" ("AGENT_LOST: the agent went away"), the code named as on
// the wire (client::errorName): how event lines show a failed status.
std::string statusText(const absl::Status& status);

// "10.0.0.1:80", "[::1]:80", "db:5432": brackets around hosts with a ':'.
std::string hostPort(std::string_view host, uint32_t port);

// "Permission denied (EACCES)": strerror and the errno's name ("errno N"
// for a number without one).
std::string errnoText(int err);

// One failed file operation, as `siphon fs` reports it:
// "fs cat /etc/shadow: Permission denied (EACCES)", followed by ": reason"
// when the agent gave one (an errno it answers by its own rule, a limit or
// --fs-mode ro; siphon::errnoReason).
std::string errnoFailure(std::string_view what, int err, std::string_view reason = {});

// ------------------------------------------------------------ file modes

// stat(1)'s names of the file type in st_mode: "regular file", "directory",
// "symbolic link", "fifo", "socket", "character special file", "block
// special file", "unknown".
std::string fileTypeName(uint32_t mode);
// The short names of --json: "file", "directory", "symlink", "fifo",
// "socket", "char", "block", "unknown".
std::string fileTypeKey(uint32_t mode);
// The same short names for a readdir DT_* type.
std::string direntTypeKey(uint32_t dtype);

// "-rw-r--r--", "drwxr-xr-x", "lrwxrwxrwx", with s/S and t/T for setuid,
// setgid and sticky, as ls(1) shows them.
std::string modeString(uint32_t mode);
// The permission and special bits in octal, four digits: "0644", "4755".
std::string octalPermissions(uint32_t mode);

// An octal mode as the --mode flags take it: 1 to 4 digits 0-7 ("644",
// "0644", "1777"). InvalidArgument "--mode: 'x' is not an octal mode like
// 0644" otherwise (`flag` names the option).
absl::StatusOr<uint32_t> parseOctalMode(std::string_view text, std::string_view flag = "--mode");

// ------------------------------------------------------------ times

// Nanoseconds since the epoch in UTC (the CLI does not know the target's
// zone): "2024-05-01 12:00:00.123456789 +0000". Times before 1970 too.
std::string utcTime(int64_t ns);
// To the minute, as ls -l shows it: "2024-05-01 12:00".
std::string utcMinute(int64_t ns);

// ------------------------------------------------------------ paths

// `name` under `dir`, with one '/' between them ("/etc" + "passwd",
// "/" + "etc").
std::string joinPath(std::string_view dir, std::string_view name);

// Whether `path` is made of nothing but '/', "." and ".." parts ("", "/",
// "/.", "//./..", ".."): the root itself, as the agent resolves ".." at the
// root to the root. A path with a named part ("/tmp/..") is not.
bool isRootLike(std::string_view path);
// Whether the last named part of `path` is "." or ".." ("/tmp/..", "a/./",
// "."): rm(1) refuses to remove those, as "/tmp/.." is the target's root
// (or another directory than the one named) however it is spelt.
bool endsInDotOrDotDot(std::string_view path);

// The directories `mkdir -p` makes, outermost first: "/a//b/./c" gives
// "/a", "/a/b", "/a/b/c"; "a/b" gives "a", "a/b". Empty and "." parts are
// skipped; ".." is kept as a part.
std::vector<std::string> pathPrefixes(std::string_view path);

// ------------------------------------------------------------ siphon fs

// `siphon fs stat`, like stat(1): "  File: PATH[ -> LINK]", size, blocks,
// IO block and type; device, inode, links (and the device type of a device
// file); permissions, uid and gid; access, modify and change times (UTC).
// `link_target` is the symlink's target, or empty.
std::string statText(std::string_view path, const client::FileStat& st,
                     std::string_view link_target);

// The members of one stat in --json, into an object the caller has begun:
// type, mode, permissions, size, blocks, blksize, dev, ino, nlink, uid,
// gid, rdev, atime_ns, mtime_ns, ctime_ns.
void appendStatJson(JsonWriter& j, const client::FileStat& st);

// One name `siphon fs ls` shows.
struct ListEntry {
  std::string name;
  uint32_t dtype = 0;  // readdir's DT_* (DT_UNKNOWN, 0, for a file listed by itself)
  uint64_t ino = 0;
  std::optional<client::FileStat> stat;  // with -l, or a file listed by itself
  std::string link_target;               // of a symlink with its stat
};

// The names, one a line.
std::string listingText(const std::vector<ListEntry>& entries);
// ls -l: "MODE LINKS UID GID SIZE YYYY-MM-DD HH:MM NAME[ -> LINK]", the
// numbers right-aligned in columns as wide as their widest; an entry
// without a stat (gone before its lstat) shows '?' in every column.
std::string longListing(const std::vector<ListEntry>& entries);
// --json: an array of {name, then the stat's members (appendStatJson) and
// "target" of a symlink} or, without a stat, {name, type (DT_*), ino}.
std::string listingJson(const std::vector<ListEntry>& entries);

}  // namespace siphon::cli
