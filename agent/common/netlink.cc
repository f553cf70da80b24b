#include "agent/common/netlink.h"

#include <linux/netlink.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent {

absl::Status netlinkSend(int fd, const void* request, size_t size, std::string_view what) {
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  for (;;) {
    const ssize_t n =
        ::sendto(fd, request, size, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel));
    if (n == static_cast<ssize_t>(size)) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return lastErrnoStatus(what);
    return protoError(v1::INTERNAL, absl::StrCat(asv(what), ": short netlink send"));
  }
}

absl::StatusOr<size_t> netlinkReceive(int fd, std::vector<char>& buf, std::string_view what,
                                      std::chrono::milliseconds wait) {
  for (;;) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(wait.count()));
      if (ready == 0) {
        return protoError(v1::UNAVAILABLE, absl::StrCat(asv(what), ": no answer from the kernel in ",
                                                        wait.count(), " ms"));
      }
      if (ready < 0 && errno != EINTR) return lastErrnoStatus(what);
      continue;
    }
    if (n < 0) return lastErrnoStatus(what);
    return protoError(v1::INTERNAL, absl::StrCat(asv(what), ": netlink socket closed"));
  }
}

}  // namespace siphon::agent
