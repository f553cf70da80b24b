// Small helpers the in-process agent tests share: a listening socket on
// 127.0.0.1 (port chosen by the kernel) and reproducible random payloads.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstring>
#include <random>
#include <string>

namespace siphon::fakes {

// A listening TCP socket on 127.0.0.1, any port; the caller owns the fd.
inline int loopbackListener() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 16), 0);
  return fd;
}

// A socket of `type` bound to 127.0.0.1, any port, listening when it is
// SOCK_STREAM; the caller owns the fd.
inline int loopbackSocket(int type, int backlog = 64) {
  int fd = ::socket(AF_INET, type | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  if (type == SOCK_STREAM) {
    EXPECT_EQ(::listen(fd, backlog), 0);
  }
  return fd;
}

// A listening unix socket (SOCK_STREAM or SOCK_SEQPACKET) at `path_or_at`
// ("@name": abstract); the caller owns the fd.
inline int unixListener(const std::string& path_or_at, int type) {
  int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  socklen_t len;
  if (path_or_at[0] == '@') {
    std::memcpy(a.sun_path + 1, path_or_at.data() + 1, path_or_at.size() - 1);
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_or_at.size());
  } else {
    std::strncpy(a.sun_path, path_or_at.c_str(), sizeof(a.sun_path) - 1);
    len = sizeof(a);
  }
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0) << path_or_at;
  EXPECT_EQ(::listen(fd, 16), 0);
  return fd;
}

// `n` bytes from a generator seeded with `seed`: the same every run.
inline std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace siphon::fakes
