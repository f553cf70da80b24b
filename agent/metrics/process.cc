#include "agent/metrics/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <string>

namespace siphon::agent::metrics {

namespace {

std::string readSmallFile(const char* path) {
  std::string out;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::optional<uint64_t> parseU64(std::string_view s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) return std::nullopt;
  return v;
}

// The n-th (0-based) space-separated field of `s`.
std::string_view field(std::string_view s, size_t n) {
  size_t pos = 0;
  for (size_t i = 0;; ++i) {
    while (pos < s.size() && s[pos] == ' ') ++pos;
    if (pos >= s.size()) return {};
    size_t end = s.find(' ', pos);
    if (end == std::string_view::npos) end = s.size();
    if (i == n) return s.substr(pos, end - pos);
    pos = end;
  }
}

}  // namespace

std::optional<uint64_t> parseStatmResidentPages(std::string_view statm) {
  return parseU64(field(statm, 1));
}

std::optional<uint64_t> parseStatCpuTicks(std::string_view stat) {
  // The command name may hold anything: fields resume after its last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = stat.substr(close + 1);
  // rest starts at field 3 (state): utime is field 14, stime 15.
  auto utime = parseU64(field(rest, 11));
  auto stime = parseU64(field(rest, 12));
  if (!utime || !stime) return std::nullopt;
  return *utime + *stime;
}

ProcessStats readProcessStats() {
  ProcessStats st;
  static const long page = sysconf(_SC_PAGESIZE);
  static const long ticks = sysconf(_SC_CLK_TCK);
  if (auto pages = parseStatmResidentPages(readSmallFile("/proc/self/statm"))) {
    st.resident_bytes = *pages * static_cast<uint64_t>(page > 0 ? page : 4096);
  }
  if (auto t = parseStatCpuTicks(readSmallFile("/proc/self/stat")); t && ticks > 0) {
    st.cpu_seconds = static_cast<double>(*t) / static_cast<double>(ticks);
  }
  st.open_fds = countOpenFds();
  return st;
}

uint64_t countOpenFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  uint64_t n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n > 0 ? n - 1 : 0;  // not the directory's own fd
}

}  // namespace siphon::agent::metrics
