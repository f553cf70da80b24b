// A process's credentials as the file helper takes them (agent/files/
// fs_helper.h): uids, gids, supplementary groups and capability sets, from
// the Uid/Gid/Groups/Cap* lines of /proc/PID/status. Read them for the
// target through Target::identity(), which reads while the target's pidfd
// pins it: a /proc/PID read alone may be another process's once the pid
// was reused.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::agent {

struct Credentials {
  std::array<uint32_t, 4> uid{};  // real, effective, saved, filesystem
  std::array<uint32_t, 4> gid{};
  std::vector<uint32_t> groups;
  uint64_t cap_effective = 0, cap_permitted = 0, cap_inheritable = 0;
};

// Parses the text of /proc/PID/status. InvalidArgument naming the line when
// one of Uid, Gid, Groups, CapInh, CapPrm, CapEff is missing or malformed.
absl::StatusOr<Credentials> parseProcStatus(std::string_view status);

// The calling process's own ids and supplementary groups, no capabilities.
Credentials ownIdsWithoutCapabilities();

}  // namespace siphon::agent
