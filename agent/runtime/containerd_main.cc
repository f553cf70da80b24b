// siphon-containerd: asks containerd for one container's task and spec, for
// the agent (containerd_client.cc runs it once per resolution):
//
//   siphon-containerd --socket PATH --namespace NS --timeout-ms N ID
//
// Prints the answer in containerd_query.h's format on stdout and exits 0,
// or 1 when containerd refused or failed (the error in the same format),
// 2 for a wrong command line. gRPC lives in this process only, for the
// second or so it runs: the agent itself does not load it.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "agent/runtime/containerd_query.h"

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "siphon-containerd: %s\n"
               "usage: siphon-containerd --socket PATH --namespace NS --timeout-ms N ID\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, ns, id;
  long long timeout_ms = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--socket" && has_value) {
      socket = argv[++i];
    } else if (arg == "--namespace" && has_value) {
      ns = argv[++i];
    } else if (arg == "--timeout-ms" && has_value) {
      const std::string_view v = argv[++i];
      const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), timeout_ms);
      if (ec != std::errc() || p != v.data() + v.size() || timeout_ms <= 0) {
        return usage("--timeout-ms wants a positive number of milliseconds");
      }
    } else if (!arg.empty() && arg[0] != '-' && id.empty()) {
      id = std::string(arg);
    } else {
      return usage(("unexpected argument " + std::string(arg)).c_str());
    }
  }
  if (socket.empty() || ns.empty() || id.empty() || timeout_ms <= 0) {
    return usage("--socket, --namespace, --timeout-ms and a container ID are all needed");
  }
  const auto answer = siphon::agent::runtime::queryContainerd(
      socket, ns, id, std::chrono::milliseconds(timeout_ms));
  const std::string out = siphon::agent::runtime::formatContainerdAnswer(answer);
  const bool written = std::fwrite(out.data(), 1, out.size(), stdout) == out.size();
  if (std::fflush(stdout) != 0 || !written) return 3;
  return answer.ok() ? 0 : 1;
}
