// The ctest fixture every privileged test requires (tests/CMakeLists.txt):
// removes the namespaces, links and iptables chains that test processes
// which no longer run left behind (reaper.h). Never fails the run: what it
// cannot remove is reported and the tests go on.
#include <unistd.h>

#include <cstdio>

#include "tests/privileged/harness/reaper.h"

int main() {
  if (geteuid() != 0) {
    std::printf("reap_leftovers: skipped, needs root (no test made anything without it)\n");
    return 77;  // SKIP_RETURN_CODE
  }
  siphon::harness::Reaped r = siphon::harness::reapLeftovers();
  for (const std::string& what : r.removed)
    std::printf("reap_leftovers: removed %s\n", what.c_str());
  for (const std::string& what : r.errors) {
    std::fprintf(stderr, "reap_leftovers: could not remove %s\n", what.c_str());
  }
  std::printf("reap_leftovers: %zu removed, %zu left\n", r.removed.size(), r.errors.size());
  return 0;
}
