// A stand-in for a service mesh's sidecar proxy (Envoy in Istio,
// linkerd2-proxy in Linkerd), as the mesh tests need it: run by the test as
// the mesh's proxy uid (setpriv), inside the pod's namespace, behind the
// nat rules the mesh's init container writes.
//
//   mesh_proxy --inbound PORT --outbound PORT [--inbound-source4 ADDR]
//              [--inbound-source6 ADDR] [--preface TEXT]
//
// Inbound (what the PREROUTING REDIRECT sends it): reads the "handshake"
// `--preface` first, as a real proxy ends mTLS before the application's
// bytes (a connection whose first bytes differ is closed, as a failed TLS
// handshake would be), then connects to the connection's original
// destination (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST), from
// `--inbound-source4/6` when given (Istio's inbound passthrough binds
// 127.0.0.6 and ::6), and copies both ways. Outbound (the OUTPUT REDIRECT):
// the same without preface or source. Every connection is one line on
// stdout, "inbound|outbound ORIGINAL-DESTINATION", once its upstream is
// connected (or "... failed: ERROR"), so a test counts what went through
// the mesh. "ready" once both ports listen.
#include <arpa/inet.h>
#include <linux/netfilter_ipv4.h>
#include <linux/netfilter_ipv6/ip6_tables.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::mutex out_mu;

void say(const std::string& line) {
  std::lock_guard<std::mutex> l(out_mu);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

std::string addressText(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
    return std::string(ip) + ":" + std::to_string(ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
  return "[" + std::string(ip) + "]:" + std::to_string(ntohs(in6->sin6_port));
}

int listenOn(int family, uint16_t port) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage ss{};
  socklen_t len;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    len = sizeof *in;
  } else {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    len = sizeof *in6;
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 512) != 0) {
    std::perror("mesh_proxy: listen");
    std::exit(1);
  }
  return fd;
}

// Copies `from` to `to` until EOF (then half-closes `to`) or an error
// (then aborts both).
void pump(int from, int to) {
  char buf[16384];
  while (true) {
    ssize_t n = ::read(from, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      ::shutdown(to, SHUT_WR);
      return;
    }
    if (n < 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ::shutdown(from, SHUT_RDWR);
        ::shutdown(to, SHUT_RDWR);
        return;
      }
      off += w;
    }
  }
  ::shutdown(to, SHUT_RDWR);
}

struct Options {
  std::string preface;
  std::string source4, source6;
};

void serve(int client, bool inbound, const Options& opt) {
  const char* kind = inbound ? "inbound" : "outbound";
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(client, reinterpret_cast<sockaddr*>(&ss), &len);
  const int family = ss.ss_family;
  len = sizeof ss;
  int rc = family == AF_INET ? ::getsockopt(client, SOL_IP, SO_ORIGINAL_DST, &ss, &len)
                             : ::getsockopt(client, SOL_IPV6, IP6T_SO_ORIGINAL_DST, &ss, &len);
  if (rc != 0) {
    say(std::string(kind) + " failed: original destination: " + std::strerror(errno));
    ::close(client);
    return;
  }
  const std::string dst = addressText(ss);
  if (inbound && !opt.preface.empty()) {
    std::string got(opt.preface.size(), '\0');
    size_t have = 0;
    while (have < got.size()) {
      ssize_t n = ::read(client, got.data() + have, got.size() - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      have += static_cast<size_t>(n);
    }
    if (have != got.size() || got != opt.preface) {
      say(std::string(kind) + " " + dst + " failed: no handshake");
      ::close(client);
      return;
    }
  }
  int up = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const std::string& source = family == AF_INET ? opt.source4 : opt.source6;
  if (inbound && !source.empty()) {
    sockaddr_storage src{};
    socklen_t src_len;
    if (family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&src);
      in->sin_family = AF_INET;
      inet_pton(AF_INET, source.c_str(), &in->sin_addr);
      src_len = sizeof *in;
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&src);
      in6->sin6_family = AF_INET6;
      inet_pton(AF_INET6, source.c_str(), &in6->sin6_addr);
      src_len = sizeof *in6;
    }
    if (::bind(up, reinterpret_cast<sockaddr*>(&src), src_len) != 0) {
      say(std::string(kind) + " " + dst + " failed: bind " + source + ": " + std::strerror(errno));
      ::close(up);
      ::close(client);
      return;
    }
  }
  if (::connect(up, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    say(std::string(kind) + " " + dst + " failed: " + std::strerror(errno));
    ::close(up);
    ::close(client);
    return;
  }
  say(std::string(kind) + " " + dst);
  std::thread back([up, client] { pump(up, client); });
  pump(client, up);
  back.join();
  ::close(up);
  ::close(client);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  int inbound_port = 0, outbound_port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--inbound") inbound_port = std::atoi(value.c_str());
    if (flag == "--outbound") outbound_port = std::atoi(value.c_str());
    if (flag == "--inbound-source4") opt.source4 = value;
    if (flag == "--inbound-source6") opt.source6 = value;
    if (flag == "--preface") opt.preface = value;
  }
  if (inbound_port <= 0 || outbound_port <= 0) {
    std::fputs("usage: mesh_proxy --inbound PORT --outbound PORT [...]\n", stderr);
    return 2;
  }
  struct Listener {
    int fd;
    bool inbound;
  };
  std::vector<Listener> listeners;
  for (int family : {AF_INET, AF_INET6}) {
    listeners.push_back({listenOn(family, static_cast<uint16_t>(inbound_port)), true});
    listeners.push_back({listenOn(family, static_cast<uint16_t>(outbound_port)), false});
  }
  say("ready");
  std::vector<pollfd> fds;
  for (const Listener& l : listeners) fds.push_back({l.fd, POLLIN, 0});
  while (true) {
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      int c = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const bool inbound = listeners[i].inbound;
      std::thread([c, inbound, opt] { serve(c, inbound, opt); }).detach();
    }
  }
}
