// TCX programs attached to interfaces, as the kernel reports them: what the
// mirror tests use to check that the agent's programs are there, and that
// nothing of ours is left. Header-only; needs libbpf and pod_harness.h.
#pragma once

#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"

namespace siphon::harness {

// Debian's linux/bpf.h predates TCX; the kernel's enum bpf_attach_type values.
constexpr int kBpfTcxIngress = 46;
constexpr int kBpfTcxEgress = 47;

// Program ids on one TCX hook of interface `dev` of namespace `netns`.
inline std::vector<uint32_t> tcxProgs(const std::string& netns, const std::string& dev, int hook) {
  std::vector<uint32_t> ids;
  inNetns(netns, [&] {
    int ifindex = static_cast<int>(if_nametoindex(dev.c_str()));
    ASSERT_GT(ifindex, 0) << dev;
    uint32_t prog_ids[16] = {};
    uint32_t count = 16;
    uint32_t attach_flags = 0;
    int err = bpf_prog_query(ifindex, static_cast<bpf_attach_type>(hook), 0, &attach_flags,
                             prog_ids, &count);
    ASSERT_EQ(err, 0) << "query TCX " << hook << " of " << dev << ": " << std::strerror(errno);
    ids.assign(prog_ids, prog_ids + count);
  });
  return ids;
}

// Every TCX program on every interface of the namespace, as "dev hook id".
inline std::vector<std::string> tcxPrograms(const std::string& netns) {
  std::vector<std::string> names;
  inNetns(netns, [&] {
    struct if_nameindex* all = if_nameindex();
    ASSERT_NE(all, nullptr) << std::strerror(errno);
    for (struct if_nameindex* i = all; i->if_index != 0; ++i) names.push_back(i->if_name);
    if_freenameindex(all);
  });
  std::vector<std::string> found;
  for (const std::string& dev : names) {
    for (int hook : {kBpfTcxIngress, kBpfTcxEgress}) {
      for (uint32_t id : tcxProgs(netns, dev, hook)) {
        found.push_back(dev + (hook == kBpfTcxIngress ? " ingress " : " egress ") +
                        std::to_string(id));
      }
    }
  }
  return found;
}

}  // namespace siphon::harness
