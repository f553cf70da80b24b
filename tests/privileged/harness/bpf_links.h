// Every BPF link on the machine, read with the bpf() syscalls rather than
// `bpftool link show`: tests run in parallel, and a link that another test
// creates or releases while bpftool walks the ids makes bpftool fail the
// whole listing ("can't get link by id (N): Resource temporarily
// unavailable"). Here such a link is skipped: it is not the caller's, whose
// own links are settled before the caller asks. Header-only; needs libbpf.
#pragma once

#include <bpf/bpf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace siphon::harness {

struct BpfLink {
  uint32_t id = 0;
  uint32_t type = 0;  // enum bpf_link_type
  uint32_t prog_id = 0;
  uint64_t netns_ino = 0;  // BPF_LINK_TYPE_NETNS (sk_lookup) only
};

inline std::vector<BpfLink> bpfLinks() {
  std::vector<BpfLink> links;
  uint32_t id = 0;
  while (bpf_link_get_next_id(id, &id) == 0) {
    int fd = bpf_link_get_fd_by_id(id);
    if (fd < 0) {
      // ENOENT: released since get_next_id; EAGAIN: not yet settled.
      EXPECT_TRUE(errno == ENOENT || errno == EAGAIN)
          << "link " << id << ": " << std::strerror(errno);
      continue;
    }
    bpf_link_info info = {};
    uint32_t len = sizeof(info);
    const int err = bpf_obj_get_info_by_fd(fd, &info, &len);
    const int saved = errno;
    ::close(fd);
    EXPECT_EQ(err, 0) << "link " << id << ": " << std::strerror(saved);
    if (err != 0) continue;
    BpfLink l{.id = info.id, .type = info.type, .prog_id = info.prog_id};
    if (info.type == BPF_LINK_TYPE_NETNS) l.netns_ino = info.netns.netns_ino;
    links.push_back(l);
  }
  EXPECT_EQ(errno, ENOENT) << "listing links: " << std::strerror(errno);
  return links;
}

}  // namespace siphon::harness
