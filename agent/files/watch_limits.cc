#include "agent/files/watch_limits.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace siphon::agent::files {
namespace {

void readPositive(const std::string& path, uint64_t* out) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return;
  uint64_t v = 0;
  if (absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v) && v > 0) *out = v;
}

absl::StatusOr<uint32_t> pick(std::optional<uint64_t> given, uint64_t node, const char* flag,
                              const char* sysctl) {
  // The counters behind the flags are 32-bit; so is every node limit.
  const uint64_t ceiling = std::min<uint64_t>(node, std::numeric_limits<uint32_t>::max());
  if (!given) return static_cast<uint32_t>(std::max<uint64_t>(ceiling / 4, 1));
  if (*given == 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " 0: must be at least 1"));
  }
  if (*given > ceiling) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", *given, ": above this node's ", sysctl, " (", node,
        "), which the node's other processes of the same user (kubelet, containerd and "
        "systemd for uid 0) share"));
  }
  return static_cast<uint32_t>(*given);
}

}  // namespace

NodeInotifyLimits readNodeInotifyLimits(const std::string& dir) {
  NodeInotifyLimits limits;
  readPositive(dir + "/max_user_watches", &limits.max_user_watches);
  readPositive(dir + "/max_user_instances", &limits.max_user_instances);
  return limits;
}

absl::StatusOr<WatchBudget> watchBudget(std::optional<uint64_t> watches,
                                        std::optional<uint64_t> instances,
                                        const NodeInotifyLimits& node) {
  WatchBudget b;
  auto w =
      pick(watches, node.max_user_watches, "--max-file-watches", "fs.inotify.max_user_watches");
  if (!w.ok()) return w.status();
  auto i = pick(instances, node.max_user_instances, "--max-file-watch-instances",
                "fs.inotify.max_user_instances");
  if (!i.ok()) return i.status();
  b.watches = *w;
  b.instances = *i;
  return b;
}

}  // namespace siphon::agent::files
