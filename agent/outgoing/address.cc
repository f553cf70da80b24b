#include "agent/outgoing/address.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <netinet/in.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/root_path.h"
#include "siphon/status.h"

namespace siphon::agent::outgoing {
namespace {

bool isV4Mapped(const sockaddr_in6& a) { return IN6_IS_ADDR_V4MAPPED(&a.sin6_addr); }

sockaddr_in unmap(const sockaddr_in6& a) {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_port = a.sin6_port;
  std::memcpy(&v4.sin_addr, &a.sin6_addr.s6_addr[12], 4);
  return v4;
}

std::string ipText(const SockAddr& addr, uint16_t* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.family() == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(addr.storage);
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
    *port = ntohs(a.sin_port);
    return buf;
  }
  const auto& a6 = reinterpret_cast<const sockaddr_in6&>(addr.storage);
  if (isV4Mapped(a6)) {
    sockaddr_in v4 = unmap(a6);
    inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof(buf));
  } else {
    inet_ntop(AF_INET6, &a6.sin6_addr, buf, sizeof(buf));
  }
  *port = ntohs(a6.sin6_port);
  return buf;
}

}  // namespace

std::optional<SockAddr> ipAddress(std::string_view host, uint16_t port) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::string h(host);
  SockAddr out;
  sockaddr_in v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    v4.sin_port = htons(port);
    std::memcpy(&out.storage, &v4, sizeof(v4));
    out.len = sizeof(v4);
    return out;
  }
  sockaddr_in6 v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(port);
    std::memcpy(&out.storage, &v6, sizeof(v6));
    out.len = sizeof(v6);
    return out;
  }
  return std::nullopt;
}

absl::StatusOr<SockAddr> forFamily(const SockAddr& addr, int family) {
  if (addr.family() == family) return addr;
  if (addr.family() == AF_INET && family == AF_INET6) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(addr.storage);
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_port = v4.sin_port;
    v6.sin6_addr.s6_addr[10] = 0xff;
    v6.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&v6.sin6_addr.s6_addr[12], &v4.sin_addr, 4);
    SockAddr out;
    std::memcpy(&out.storage, &v6, sizeof(v6));
    out.len = sizeof(v6);
    return out;
  }
  if (addr.family() == AF_INET6 && family == AF_INET) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(addr.storage);
    if (isV4Mapped(v6)) {
      sockaddr_in v4 = unmap(v6);
      SockAddr out;
      std::memcpy(&out.storage, &v4, sizeof(v4));
      out.len = sizeof(v4);
      return out;
    }
  }
  return protoError(v1::INVALID_ARGUMENT,
                    absl::StrCat("address ", formatAddress(addr), " does not fit the socket"));
}

std::string formatAddress(const SockAddr& addr) {
  if (addr.family() == AF_INET || addr.family() == AF_INET6) {
    uint16_t port = 0;
    std::string ip = ipText(addr, &port);
    if (ip.find(':') != std::string::npos) return absl::StrCat("[", ip, "]:", port);
    return absl::StrCat(ip, ":", port);
  }
  if (addr.family() == AF_UNIX) {
    const auto& un = reinterpret_cast<const sockaddr_un&>(addr.storage);
    size_t n =
        addr.len > offsetof(sockaddr_un, sun_path) ? addr.len - offsetof(sockaddr_un, sun_path) : 0;
    if (n == 0) return "(unnamed)";
    if (un.sun_path[0] == '\0') return absl::StrCat("@", std::string(un.sun_path + 1, n - 1));
    return std::string(un.sun_path, strnlen(un.sun_path, n));
  }
  return absl::StrCat("(address family ", addr.family(), ")");
}

v1::SocketAddress toProto(const SockAddr& addr) {
  v1::SocketAddress out;
  if (addr.family() != AF_INET && addr.family() != AF_INET6) return out;
  uint16_t port = 0;
  out.set_ip(ipText(addr, &port));
  out.set_port(port);
  return out;
}

absl::StatusOr<SockAddr> fromProto(const v1::SocketAddress& addr) {
  if (addr.port() > 65535) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("port ", addr.port(), " is out of range"));
  }
  auto a = ipAddress(addr.ip(), static_cast<uint16_t>(addr.port()));
  if (!a) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("'", addr.ip(), "' is not an IP address"));
  }
  return *a;
}

uint16_t portOf(const SockAddr& addr) {
  if (addr.family() == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(addr.get())->sin_port);
  }
  if (addr.family() == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(addr.get())->sin6_port);
  }
  return 0;
}

SockAddr wildcardAddress(int family, uint16_t port) {
  SockAddr a;
  if (family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    in6->sin6_port = htons(port);
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    in->sin_port = htons(port);
    a.len = sizeof(sockaddr_in);
  }
  return a;
}

absl::StatusOr<SockAddr> localAddress(int fd) {
  SockAddr out;
  out.len = sizeof(out.storage);
  if (getsockname(fd, out.get(), &out.len) != 0) return lastErrnoStatus("getsockname");
  return out;
}

absl::StatusOr<SockAddr> peerAddress(int fd) {
  SockAddr out;
  out.len = sizeof(out.storage);
  if (getpeername(fd, out.get(), &out.len) != 0) return lastErrnoStatus("getpeername");
  return out;
}

absl::StatusOr<SockAddr> abstractUnixAddress(std::string_view at_name) {
  std::string_view name = at_name.substr(at_name.starts_with('@') ? 1 : 0);
  constexpr size_t kMax = sizeof(sockaddr_un::sun_path) - 1;
  if (name.empty() || name.size() > kMax) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("abstract unix socket name '@", asv(name),
                                                         "' must be 1 to ", kMax, " bytes"));
  }
  SockAddr out;
  auto& un = reinterpret_cast<sockaddr_un&>(out.storage);
  un.sun_family = AF_UNIX;
  un.sun_path[0] = '\0';
  std::memcpy(un.sun_path + 1, name.data(), name.size());
  out.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return out;
}

absl::StatusOr<UniqueFd> openInRoot(int root_fd, std::string_view path) {
  if (path.empty()) return protoError(v1::INVALID_ARGUMENT, "empty unix socket path");
  if (path.find('\0') != std::string_view::npos) {
    return protoError(v1::INVALID_ARGUMENT, "unix socket path holds a NUL byte");
  }
  UniqueFd fd;
  // The bounded EAGAIN retry of agent/common/root_path.h: a target renaming
  // in a loop cannot hold a pool thread forever.
  if (int err = siphon::agent::openInRoot(root_fd, path, O_PATH, 0, &fd)) {
    return errnoStatus(err, absl::StrCat("open ", asv(path), " inside the target root"));
  }
  return fd;
}

SockAddr procFdUnixAddress(int path_fd) {
  SockAddr out;
  auto& un = reinterpret_cast<sockaddr_un&>(out.storage);
  un.sun_family = AF_UNIX;
  std::string p = absl::StrCat("/proc/self/fd/", path_fd);
  std::memcpy(un.sun_path, p.data(), p.size());  // short: always fits, NUL from {}
  out.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + p.size() + 1);
  return out;
}

v1::Error socketError(int err, std::string_view what) {
  v1::ErrorCode code;
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ENETUNREACH:
    case ENETDOWN:
    case ETIMEDOUT:
    case EPIPE:
    case EAGAIN:
    case EADDRNOTAVAIL:
      code = v1::UNAVAILABLE;
      break;
    case ENOENT:
    case ENOTDIR:
      code = v1::NOT_FOUND;
      break;
    case EACCES:
    case EPERM:
      code = v1::PERMISSION_DENIED;
      break;
    case EINVAL:
    case EAFNOSUPPORT:
    case EPROTOTYPE:
    case ENOTSOCK:
    case EMSGSIZE:
    case ELOOP:
    case EXDEV:
    case ENAMETOOLONG:
      code = v1::INVALID_ARGUMENT;
      break;
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
      code = v1::RESOURCE_EXHAUSTED;
      break;
    default:
      code = v1::ERRNO;
  }
  v1::Error e;
  e.set_code(code);
  e.set_message(absl::StrCat(asv(what), ": ", std::strerror(err)));
  e.set_errno_value(err);
  return e;
}

v1::Error wireError(v1::ErrorCode code, std::string message) {
  v1::Error e;
  e.set_code(code);
  e.set_message(std::move(message));
  return e;
}

}  // namespace siphon::agent::outgoing
