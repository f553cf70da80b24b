// A stand-in agent for the crash-safety tests: steers one port of a netns
// with the iptables backend and serves its listeners until killed. Also
// the guard binary (/proc/self/exe), as siphon-agent is.
//
//   steal_iptables_helper NETNS_PATH FLAVOR PORT [OWNER [REPLY]]
//
// Prints "ready" once the port is steered; answers each stolen connection
// with REPLY ("agent") and a newline. OWNER pins the steering's owner id
// (default: a random one, as the agent's), so that two helpers on one
// target can be told apart.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/steal/iptables/guard.h"
#include "agent/steal/iptables/iptables_steering.h"

namespace {

int listenOn(int family, uint16_t* port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  sockaddr_storage ss{};
  ss.ss_family = static_cast<sa_family_t>(family);
  socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(fd, 64) != 0) return -1;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                  : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace siphon::agent::steal;
  if (argc > 1 && std::string_view(argv[1]) == kIptablesGuardCommand) {
    return iptablesGuardMain(argc, argv);
  }
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr, "usage: %s NETNS_PATH FLAVOR PORT [OWNER [REPLY]]\n", argv[0]);
    return 2;
  }
  const std::string reply = std::string(argc > 5 ? argv[5] : "agent") + "\n";
  int netns = open(argv[1], O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (netns < 0 || fstat(netns, &st) != 0 || setns(netns, CLONE_NEWNET) != 0) {
    std::perror("netns");
    return 1;
  }
  IptablesOptions options;
  options.netns_fd = netns;
  options.netns_inode = st.st_ino;
  options.flavor = argv[2];
  if (argc > 4) options.owner = argv[4];
  options.listeners.v4 = listenOn(AF_INET, &options.listeners.v4_port);
  options.listeners.v6 = listenOn(AF_INET6, &options.listeners.v6_port);
  if (options.listeners.v4 < 0 || options.listeners.v6 < 0) {
    std::perror("listen");
    return 1;
  }
  const int v4 = options.listeners.v4, v6 = options.listeners.v6;
  auto steering = makeIptablesSteering(options);
  if (!steering.ok()) {
    std::fprintf(stderr, "makeIptablesSteering: %s\n", steering.status().ToString().c_str());
    return 1;
  }
  auto added = (*steering)->addPort(static_cast<uint16_t>(std::atoi(argv[3])));
  if (!added.ok()) {
    std::fprintf(stderr, "addPort: %s\n", added.ToString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    pollfd fds[2] = {{v4, POLLIN, 0}, {v6, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) continue;
    for (const auto& p : fds) {
      if (p.revents == 0) continue;
      int c = accept4(p.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ssize_t ignored = write(c, reply.data(), reply.size());
      (void)ignored;
      close(c);
    }
  }
}
