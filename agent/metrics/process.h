// The agent process's own resource use, read from /proc/self at scrape
// time. Parsers are separate so they are tested on fixed text.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace siphon::agent::metrics {

struct ProcessStats {
  uint64_t resident_bytes = 0;
  uint64_t open_fds = 0;
  double cpu_seconds = 0;  // user + system
};

// Reads /proc/self/{statm,stat,fd}; fields it cannot read stay 0.
ProcessStats readProcessStats();

// Descriptors this process holds open (entries of /proc/self/fd, less the
// one reading it); 0 when it cannot be read. Also the admission's fd
// reserve check (agent/server/admission.h).
uint64_t countOpenFds();

// /proc/self/statm: "size resident shared ..." in pages.
std::optional<uint64_t> parseStatmResidentPages(std::string_view statm);
// /proc/self/stat: utime and stime (fields 14 and 15, after the "(comm)"
// that may itself hold spaces and parentheses), in clock ticks.
std::optional<uint64_t> parseStatCpuTicks(std::string_view stat);

}  // namespace siphon::agent::metrics
