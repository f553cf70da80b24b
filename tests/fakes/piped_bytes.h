// A PipedBytes (siphon/protocol/piped_bytes.h) holding given bytes, for
// tests of the splice path: a pipe sized to them (at most 1 MiB without
// CAP_SYS_RESOURCE), filled, its write end closed.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string_view>

#include "siphon/protocol/piped_bytes.h"

namespace siphon::fakes {

inline std::shared_ptr<protocol::PipedBytes> pipeHolding(std::string_view bytes) {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  EXPECT_GE(::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(std::max<size_t>(bytes.size(), 4096))),
            0);
  EXPECT_EQ(::write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fds[1]);
  return std::make_shared<protocol::PipedBytes>(fds[0], bytes.size());
}

}  // namespace siphon::fakes
