#include "cli/format.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

// 2024-05-01 12:00:00 UTC.
constexpr int64_t kMay1Noon = 1714564800;
constexpr int64_t kNs = 1'000'000'000;

client::FileStat regularFile() {
  client::FileStat st;
  st.dev = makedev(8, 1);
  st.ino = 1234;
  st.mode = S_IFREG | 0644;
  st.nlink = 1;
  st.uid = 0;
  st.gid = 0;
  st.size = 11;
  st.blksize = 4096;
  st.blocks = 8;
  st.atime_ns = kMay1Noon * kNs + 123456789;
  st.mtime_ns = kMay1Noon * kNs;
  st.ctime_ns = (kMay1Noon + 61) * kNs + 5;
  return st;
}

// ------------------------------------------------------------ counts, sizes

TEST(Plural, AddsAnSExceptForOne) {
  EXPECT_EQ(plural(0, "packet"), "0 packets");
  EXPECT_EQ(plural(1, "packet"), "1 packet");
  EXPECT_EQ(plural(2, "packet"), "2 packets");
}

TEST(Plural, IrregularForm) {
  EXPECT_EQ(plural(1, "entry", "entries"), "1 entry");
  EXPECT_EQ(plural(7, "entry", "entries"), "7 entries");
}

TEST(ByteSize, WholeUnitsHaveNoDecimals) {
  EXPECT_EQ(byteSize(0), "0 B");
  EXPECT_EQ(byteSize(1023), "1023 B");
  EXPECT_EQ(byteSize(1024), "1 KiB");
  EXPECT_EQ(byteSize(16u << 20), "16 MiB");
  EXPECT_EQ(byteSize(uint64_t{3} << 40), "3 TiB");
}

TEST(ByteSize, OneDecimalOtherwise) {
  EXPECT_EQ(byteSize(1536), "1.5 KiB");
  EXPECT_EQ(byteSize(1025), "1.0 KiB");
  EXPECT_EQ(byteSize(2469606195), "2.3 GiB");
}

TEST(ByteSize, RoundingUpMovesToTheNextUnit) {
  EXPECT_EQ(byteSize((1u << 20) - 1), "1.0 MiB");
  EXPECT_EQ(byteSize((1u << 20) - 60 * 1024 + 1), "964.0 KiB");
  EXPECT_EQ(byteSize(std::numeric_limits<uint64_t>::max()), "16.0 EiB");
}

TEST(JoinLines, EachItemEndsWithANewline) {
  EXPECT_EQ(joinLines(std::vector<std::string>{"a", "b c"}), "a\nb c\n");
  EXPECT_EQ(joinLines(std::vector<std::string>{}), "");
  EXPECT_EQ(joinLines(std::vector<int>{1, 22}), "1\n22\n");
}

// ------------------------------------------------------------ failures

TEST(StatusText, CodeAsOnTheWireThenMessage) {
  EXPECT_EQ(statusText(absl::UnavailableError("connection refused")),
            "UNAVAILABLE: connection refused");
  EXPECT_EQ(statusText(absl::DeadlineExceededError("no answer in 5s")), "TIMEOUT: no answer in 5s");
  EXPECT_EQ(statusText(protoError(v1::AGENT_LOST, "gone")), "AGENT_LOST: gone");
  EXPECT_EQ(statusText(errnoStatus(ENOENT, "open /x")),
            "ERRNO: open /x: No such file or directory");
}

TEST(ErrnoText, StrerrorAndName) {
  EXPECT_EQ(errnoText(EACCES), "Permission denied (EACCES)");
  EXPECT_EQ(errnoText(ELOOP), "Too many levels of symbolic links (ELOOP)");
  EXPECT_EQ(errnoText(4095), "Unknown error 4095 (errno 4095)");
}

TEST(ErrnoFailure, WhatErrnoAndTheAgentsReason) {
  EXPECT_EQ(errnoFailure("fs cat /etc/shadow", EACCES),
            "fs cat /etc/shadow: Permission denied (EACCES)");
  EXPECT_EQ(errnoFailure("fs write /etc/app.conf", EROFS,
                         "the agent serves files read-only (siphon-agent --fs-mode ro)"),
            "fs write /etc/app.conf: Read-only file system (EROFS): the agent serves files "
            "read-only (siphon-agent --fs-mode ro)");
}

// ------------------------------------------------------------ file modes

TEST(FileType, NamesAndKeysOfEveryType) {
  struct Case {
    uint32_t mode;
    uint32_t dtype;
    const char* name;
    const char* key;
  };
  const Case cases[] = {
      {S_IFREG | 0644, DT_REG, "regular file", "file"},
      {S_IFDIR | 0755, DT_DIR, "directory", "directory"},
      {S_IFLNK | 0777, DT_LNK, "symbolic link", "symlink"},
      {S_IFIFO | 0600, DT_FIFO, "fifo", "fifo"},
      {S_IFSOCK | 0755, DT_SOCK, "socket", "socket"},
      {S_IFCHR | 0620, DT_CHR, "character special file", "char"},
      {S_IFBLK | 0660, DT_BLK, "block special file", "block"},
      {0644, DT_UNKNOWN, "unknown", "unknown"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(fileTypeName(c.mode), c.name) << std::oct << c.mode;
    EXPECT_EQ(fileTypeKey(c.mode), c.key) << std::oct << c.mode;
    EXPECT_EQ(direntTypeKey(c.dtype), c.key) << c.dtype;
  }
  EXPECT_EQ(direntTypeKey(DT_WHT), "unknown");
}

TEST(ModeString, TypeLetterAndPermissions) {
  EXPECT_EQ(modeString(S_IFREG | 0644), "-rw-r--r--");
  EXPECT_EQ(modeString(S_IFDIR | 0755), "drwxr-xr-x");
  EXPECT_EQ(modeString(S_IFLNK | 0777), "lrwxrwxrwx");
  EXPECT_EQ(modeString(S_IFIFO | 0600), "prw-------");
  EXPECT_EQ(modeString(S_IFSOCK | 0751), "srwxr-x--x");
  EXPECT_EQ(modeString(S_IFCHR | 0620), "crw--w----");
  EXPECT_EQ(modeString(S_IFBLK | 0660), "brw-rw----");
  EXPECT_EQ(modeString(S_IFREG | 0), "----------");
}

TEST(ModeString, SpecialBitsLowerCaseOverExecute) {
  EXPECT_EQ(modeString(S_IFREG | 04755), "-rwsr-xr-x");
  EXPECT_EQ(modeString(S_IFREG | 04644), "-rwSr--r--");
  EXPECT_EQ(modeString(S_IFREG | 02755), "-rwxr-sr-x");
  EXPECT_EQ(modeString(S_IFREG | 02745), "-rwxr-Sr-x");
  EXPECT_EQ(modeString(S_IFDIR | 01777), "drwxrwxrwt");
  EXPECT_EQ(modeString(S_IFDIR | 01776), "drwxrwxrwT");
  EXPECT_EQ(modeString(S_IFREG | 07000), "---S--S--T");
}

TEST(OctalPermissions, FourDigitsWithoutTheType) {
  EXPECT_EQ(octalPermissions(S_IFREG | 0644), "0644");
  EXPECT_EQ(octalPermissions(S_IFREG | 04755), "4755");
  EXPECT_EQ(octalPermissions(S_IFDIR | 0), "0000");
}

TEST(ParseOctalMode, OneToFourOctalDigits) {
  EXPECT_EQ(parseOctalMode("644").value_or(1), 0644u);
  EXPECT_EQ(parseOctalMode("0644").value_or(1), 0644u);
  EXPECT_EQ(parseOctalMode("1777").value_or(1), 01777u);
  EXPECT_EQ(parseOctalMode("0").value_or(1), 0u);
  EXPECT_EQ(parseOctalMode("7777").value_or(1), 07777u);
}

TEST(ParseOctalMode, AnythingElseIsInvalid) {
  for (const char* bad : {"", "0999", "12345", "-1", "0x1f", " 644", "rw"}) {
    auto m = parseOctalMode(bad);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_EQ(parseOctalMode("0999").status().message(),
            "--mode: '0999' is not an octal mode like 0644");
  EXPECT_EQ(parseOctalMode("x", "--dir-mode").status().message(),
            "--dir-mode: 'x' is not an octal mode like 0644");
}

// ------------------------------------------------------------ times

TEST(UtcTime, NanosecondsAndZone) {
  EXPECT_EQ(utcTime(0), "1970-01-01 00:00:00.000000000 +0000");
  EXPECT_EQ(utcTime(kMay1Noon * kNs + 123456789), "2024-05-01 12:00:00.123456789 +0000");
  EXPECT_EQ(utcTime(kMay1Noon * kNs + 7), "2024-05-01 12:00:00.000000007 +0000");
}

TEST(UtcTime, BeforeTheEpochCountsBackFromTheSecondBelow) {
  EXPECT_EQ(utcTime(-500000000), "1969-12-31 23:59:59.500000000 +0000");
  EXPECT_EQ(utcTime(-kNs), "1969-12-31 23:59:59.000000000 +0000");
  EXPECT_EQ(utcMinute(-1), "1969-12-31 23:59");
}

TEST(UtcMinute, TruncatesToTheMinute) {
  EXPECT_EQ(utcMinute(kMay1Noon * kNs + 59 * kNs + 999999999), "2024-05-01 12:00");
  EXPECT_EQ(utcMinute((kMay1Noon + 60) * kNs), "2024-05-01 12:01");
}

// ------------------------------------------------------------ paths

TEST(JoinPath, OneSlashBetween) {
  EXPECT_EQ(joinPath("/etc", "passwd"), "/etc/passwd");
  EXPECT_EQ(joinPath("/", "etc"), "/etc");
  EXPECT_EQ(joinPath("data/", "x"), "data/x");
  EXPECT_EQ(joinPath("data", "x"), "data/x");
}

TEST(IsRootLike, OnlySlashesDotsAndDotDots) {
  for (const char* root : {"", "/", "//", "/.", ".", "..", "/..", "//./..", "./../."}) {
    EXPECT_TRUE(isRootLike(root)) << "'" << root << "'";
  }
  for (const char* other : {"/a", "a", "/./x", "/...", "/.a", "/tmp/..", "x/"}) {
    EXPECT_FALSE(isRootLike(other)) << "'" << other << "'";
  }
}

TEST(EndsInDotOrDotDot, TheLastNamedPartOnly) {
  for (const char* p : {".", "..", "/tmp/..", "/tmp/.", "a/./", "a/..//", "/.."}) {
    EXPECT_TRUE(endsInDotOrDotDot(p)) << "'" << p << "'";
  }
  for (const char* p : {"", "/", "/tmp", "/tmp/../x", "a/...", "/.a", "..b", "./x"}) {
    EXPECT_FALSE(endsInDotOrDotDot(p)) << "'" << p << "'";
  }
}

TEST(PathPrefixes, OutermostFirstSkippingEmptyAndDotParts) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pathPrefixes("/a//b/./c"), (V{"/a", "/a/b", "/a/b/c"}));
  EXPECT_EQ(pathPrefixes("a/b/"), (V{"a", "a/b"}));
  EXPECT_EQ(pathPrefixes("x/../y"), (V{"x", "x/..", "x/../y"}));
  EXPECT_EQ(pathPrefixes("/"), V{});
  EXPECT_EQ(pathPrefixes(""), V{});
}

// ------------------------------------------------------------ siphon fs

TEST(StatText, RegularFile) {
  EXPECT_EQ(statText("/etc/group", regularFile(), ""),
            "  File: /etc/group\n"
            "  Size: 11              Blocks: 8          IO Block: 4096   regular file\n"
            "Device: 8,1            Inode: 1234        Links: 1\n"
            "Access: (0644/-rw-r--r--)  Uid: 0  Gid: 0\n"
            "Access: 2024-05-01 12:00:00.123456789 +0000\n"
            "Modify: 2024-05-01 12:00:00.000000000 +0000\n"
            "Change: 2024-05-01 12:01:01.000000005 +0000\n");
}

TEST(StatText, SymlinkShowsItsTarget) {
  client::FileStat st = regularFile();
  st.mode = S_IFLNK | 0777;
  const std::string text = statText("/etc/passwd", st, "/outside/secret");
  EXPECT_EQ(text.substr(0, text.find('\n') + 1), "  File: /etc/passwd -> /outside/secret\n");
  EXPECT_NE(text.find(" symbolic link\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Access: (0777/lrwxrwxrwx)"), std::string::npos) << text;
}

TEST(StatText, DeviceFileHasItsDeviceType) {
  client::FileStat st = regularFile();
  st.mode = S_IFCHR | 0666;
  st.rdev = makedev(1, 3);
  st.nlink = 12;
  st.uid = 1000;
  st.gid = 5;
  st.size = 0;
  const std::string text = statText("/dev/null", st, "");
  EXPECT_NE(text.find("Device: 8,1            Inode: 1234        Links: 12     Device type: 1,3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  Size: 0               Blocks: 8"), std::string::npos) << text;
  EXPECT_NE(text.find("Access: (0666/crw-rw-rw-)  Uid: 1000  Gid: 5\n"), std::string::npos) << text;
}

TEST(StatJson, EveryMember) {
  JsonWriter j;
  j.beginObject();
  appendStatJson(j, regularFile());
  j.endObject();
  EXPECT_EQ(j.take(),
            "{\n"
            "  \"type\": \"file\",\n"
            "  \"mode\": 33188,\n"
            "  \"permissions\": \"0644\",\n"
            "  \"size\": 11,\n"
            "  \"blocks\": 8,\n"
            "  \"blksize\": 4096,\n"
            "  \"dev\": 2049,\n"
            "  \"ino\": 1234,\n"
            "  \"nlink\": 1,\n"
            "  \"uid\": 0,\n"
            "  \"gid\": 0,\n"
            "  \"rdev\": 0,\n"
            "  \"atime_ns\": 1714564800123456789,\n"
            "  \"mtime_ns\": 1714564800000000000,\n"
            "  \"ctime_ns\": 1714564861000000005\n"
            "}\n");
}

std::vector<ListEntry> sampleListing() {
  std::vector<ListEntry> entries;
  client::FileStat group = regularFile();
  entries.push_back({"group", DT_REG, group.ino, group, ""});
  client::FileStat dir = regularFile();
  dir.mode = S_IFDIR | 0755;
  dir.nlink = 12;
  dir.uid = 1000;
  dir.gid = 100;
  dir.size = 123456;
  dir.mtime_ns = (kMay1Noon + 3600) * kNs;
  entries.push_back({"lib", DT_DIR, 7, dir, ""});
  entries.push_back({"gone", DT_REG, 9, std::nullopt, ""});
  client::FileStat link = regularFile();
  link.mode = S_IFLNK | 0777;
  link.size = 15;
  entries.push_back({"passwd", DT_LNK, 8, link, "/outside/secret"});
  return entries;
}

TEST(Listing, NamesOneALine) {
  EXPECT_EQ(listingText(sampleListing()), "group\nlib\ngone\npasswd\n");
  EXPECT_EQ(listingText({}), "");
}

TEST(Listing, LongFormAlignsColumnsToTheWidest) {
  EXPECT_EQ(longListing(sampleListing()),
            "-rw-r--r--  1    0   0     11 2024-05-01 12:00 group\n"
            "drwxr-xr-x 12 1000 100 123456 2024-05-01 13:00 lib\n"
            "??????????  ?    ?   ?      ?                  gone\n"
            "lrwxrwxrwx  1    0   0     15 2024-05-01 12:00 passwd -> /outside/secret\n");
}

TEST(Listing, LongFormOfNoStatsKeepsOneCharacterColumns) {
  std::vector<ListEntry> entries;
  entries.push_back({"a", DT_REG, 1, std::nullopt, ""});
  EXPECT_EQ(longListing(entries), "?????????? ? ? ? ?                  a\n");
}

TEST(Listing, JsonWithAndWithoutStats) {
  std::vector<ListEntry> entries = sampleListing();
  const std::string json = listingJson(entries);
  // The entry without a stat: its readdir type and inode only.
  EXPECT_NE(json.find("    \"name\": \"gone\",\n    \"type\": \"file\",\n    \"ino\": 9\n"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("    \"name\": \"lib\",\n    \"type\": \"directory\",\n    \"mode\": 16877,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"ctime_ns\": 1714564861000000005,\n    \"target\": \"/outside/secret\"\n"),
            std::string::npos)
      << json;
  EXPECT_EQ(json.front(), '[');
  EXPECT_EQ(listingJson({}), "[]\n");
}

}  // namespace
}  // namespace siphon::cli
