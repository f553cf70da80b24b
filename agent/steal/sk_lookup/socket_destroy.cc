#include "agent/steal/sk_lookup/socket_destroy.h"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/netlink.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// NLMSG_OK with the types spelled out: glibc's macro compares the unsigned
// nlmsg_len with the int length left, which clang's -Wsign-compare rejects.
bool messageFits(const nlmsghdr* h, int left) {
  return left >= static_cast<int>(sizeof(nlmsghdr)) && h->nlmsg_len >= sizeof(nlmsghdr) &&
         h->nlmsg_len <= static_cast<unsigned>(left);
}

// The states of a connection's server side once the listener has answered
// the SYN. Asking for TCP_SYN_RECV also dumps the request sockets of
// handshakes in progress (TCP_NEW_SYN_RECV). Not TCP_LISTEN (the
// application's listener stays), not TCP_SYN_SENT (a client), not
// TCP_TIME_WAIT / TCP_CLOSE (nothing left to flush, and a timewait socket is
// no full socket to abort).
constexpr uint32_t kConnectionStates =
    (1u << TCP_ESTABLISHED) | (1u << TCP_SYN_RECV) | (1u << TCP_FIN_WAIT1) | (1u << TCP_FIN_WAIT2) |
    (1u << TCP_CLOSE_WAIT) | (1u << TCP_LAST_ACK) | (1u << TCP_CLOSING);

struct Request {
  nlmsghdr header;
  inet_diag_req_v2 body;
};

const char* familyName(int family) { return family == AF_INET ? "IPv4" : "IPv6"; }

absl::Status sendRequest(int fd, const Request& request, std::string_view what) {
  return netlinkSend(fd, &request, sizeof(request), what);
}

// The ids of the connections on `port` of one family, from a dump.
absl::StatusOr<std::vector<inet_diag_msg>> dumpConnections(int fd, int family, uint16_t port,
                                                           uint32_t seq) {
  const std::string what = absl::StrCat("dump TCP sockets (", familyName(family), ")");
  Request request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.header.nlmsg_seq = seq;
  request.body.sdiag_family = static_cast<uint8_t>(family);
  request.body.sdiag_protocol = IPPROTO_TCP;
  request.body.idiag_states = kConnectionStates;
  RETURN_IF_ERROR(sendRequest(fd, request, what));

  std::vector<inet_diag_msg> found;
  std::vector<char> buf(64 * 1024);
  for (;;) {
    ASSIGN_OR_RETURN(size_t len, netlinkReceive(fd, buf, what));
    int left = static_cast<int>(len);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); messageFits(h, left);
         h = NLMSG_NEXT(h, left)) {
      // Stale answers of an earlier, abandoned request on this socket.
      if (h->nlmsg_seq != seq) continue;
      if (h->nlmsg_type == NLMSG_DONE) return found;
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        return errnoStatus(-err->error, what);
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(inet_diag_msg))) continue;
      const auto* msg = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      // The server side of a connection has the listener's port as its
      // source port; the client side has it as its destination.
      if (ntohs(msg->id.idiag_sport) == port) found.push_back(*msg);
    }
  }
}

// SOCK_DESTROY of one socket: 0, or the kernel's errno.
absl::StatusOr<int> destroyOne(int fd, const inet_diag_msg& msg, uint32_t seq) {
  Request request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = SOCK_DESTROY;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  request.header.nlmsg_seq = seq;
  request.body.sdiag_family = msg.idiag_family;
  request.body.sdiag_protocol = IPPROTO_TCP;
  request.body.idiag_states = ~0u;
  // The full id (addresses, ports, interface and cookie) names exactly the
  // dumped socket: a new socket with the same addresses has another cookie.
  request.body.id = msg.id;
  RETURN_IF_ERROR(sendRequest(fd, request, "send SOCK_DESTROY"));

  std::vector<char> buf(8 * 1024);
  for (;;) {
    ASSIGN_OR_RETURN(size_t len, netlinkReceive(fd, buf, "receive SOCK_DESTROY answer"));
    int left = static_cast<int>(len);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); messageFits(h, left);
         h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_seq != seq || h->nlmsg_type != NLMSG_ERROR) continue;
      return -static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
    }
  }
}

std::string describe(const inet_diag_msg& msg) {
  char src[INET6_ADDRSTRLEN] = "?";
  char dst[INET6_ADDRSTRLEN] = "?";
  inet_ntop(msg.idiag_family, msg.id.idiag_src, src, sizeof(src));
  inet_ntop(msg.idiag_family, msg.id.idiag_dst, dst, sizeof(dst));
  return absl::StrCat("destroy TCP socket ", src, ":", ntohs(msg.id.idiag_sport), " <- ", dst, ":",
                      ntohs(msg.id.idiag_dport));
}

}  // namespace

absl::StatusOr<FlushResult> destroyEstablished(int diag_fd, uint16_t local_port) {
  // Everything is dumped first and destroyed after: a netlink socket answers
  // one request at a time, and destroying during the dump would shift the
  // kernel's walk of the hash table.
  uint32_t seq = 1;
  std::vector<inet_diag_msg> targets;
  for (int family : {AF_INET, AF_INET6}) {
    ASSIGN_OR_RETURN(std::vector<inet_diag_msg> found,
                     dumpConnections(diag_fd, family, local_port, seq++));
    targets.insert(targets.end(), found.begin(), found.end());
  }

  FlushResult result;
  for (const inet_diag_msg& msg : targets) {
    ASSIGN_OR_RETURN(int err, destroyOne(diag_fd, msg, seq++));
    if (err == 0) {
      ++result.destroyed;
    } else if (err == ENOENT) {
      // Closed on its own since the dump.
    } else {
      if (result.failed++ == 0)
        result.first_error = std::string(errnoStatus(err, describe(msg)).message());
    }
  }
  return result;
}

}  // namespace siphon::agent::steal
