// Small helpers the in-process agent tests share: a listening socket on
// 127.0.0.1 (port chosen by the kernel) and reproducible random payloads.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
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

// `n` bytes from a generator seeded with `seed`: the same every run.
inline std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace siphon::fakes
