#include "loader/libbpf_log.h"

#include <bpf/libbpf.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string_view>

#include "spdlog/spdlog.h"

namespace siphon::bpf {
namespace {

// Its lines already start with "libbpf: ".
int libbpfPrint(enum libbpf_print_level level, const char* format, va_list args) {
  char buf[1024];
  int n = std::vsnprintf(buf, sizeof(buf), format, args);
  if (n < 0) return n;
  std::string_view line(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
  while (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  if (level == LIBBPF_WARN) {
    spdlog::warn("{}", line);
  } else {
    spdlog::debug("{}", line);
  }
  return n;
}

}  // namespace

void routeLibbpfLogs() {
  static std::once_flag once;
  std::call_once(once, [] { libbpf_set_print(libbpfPrint); });
}

}  // namespace siphon::bpf
