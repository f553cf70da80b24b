#include "agent/steal/iptables/owner_lock.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "agent/netns/netns_thread.h"
#include "agent/steal/iptables/iptables_rules.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// A unix socket made in the netns `netns_fd` (its abstract names are that
// netns'): a socket keeps the netns it was created in.
absl::StatusOr<UniqueFd> unixSocketIn(int netns_fd) {
  UniqueFd fd;
  RETURN_IF_ERROR(runInNetns(netns_fd, "iptables owner lock", [&]() -> absl::Status {
    const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return lastErrnoStatus("iptables owner lock: socket in the target's netns");
    fd = UniqueFd(s);
    return absl::OkStatus();
  }));
  return fd;
}

}  // namespace

OwnerLock netnsOwnerLock(int netns_fd, uint64_t netns_inode) {
  return [netns_fd, netns_inode](std::string_view owner) -> absl::StatusOr<UniqueFd> {
    ASSIGN_OR_RETURN(UniqueFd sock, unixSocketIn(netns_fd));
    const std::string name = ownerLockName(netns_inode, owner);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (name.size() + 1 > sizeof addr.sun_path) {
      return absl::InvalidArgumentError(absl::StrCat("owner lock name too long: ", name));
    }
    std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
      if (errno == EADDRINUSE) {
        return absl::AlreadyExistsError(
            absl::StrCat("owner ", asv(owner), " is alive (@", name, " is bound)"));
      }
      return lastErrnoStatus(absl::StrCat("iptables owner lock: bind @", name));
    }
    return sock;
  };
}

std::string newOwnerId() {
  unsigned char bytes[kOwnerIdLength / 2] = {};
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      // No entropy source: the address of a stack object and the time still
      // differ between agents; a clash is caught by the lock anyway.
      uintptr_t v = reinterpret_cast<uintptr_t>(&got) ^ static_cast<uintptr_t>(time(nullptr));
      for (auto& b : bytes) b = static_cast<unsigned char>(v >>= 8);
      break;
    }
  }
  std::string id;
  char buf[4];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    id += buf;
  }
  return id;
}

}  // namespace siphon::agent::steal
