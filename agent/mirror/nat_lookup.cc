// The kernel side of redirected_hops.h: a ctnetlink GET of one connection
// by its original tuple, and the namespace's listeners (/proc) matched
// against this process's descriptors. Both in the calling thread's netns.
#include <arpa/inet.h>
#include <dirent.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "agent/common/unique_fd.h"
#include "agent/mirror/redirected_hops.h"

namespace siphon::agent::mirror {
namespace {

// Appends a netlink attribute (or, with NLA_F_NESTED and no data, the head
// of a nested one, closed by endNest()) to `m`, padded to 4 bytes.
size_t putAttr(std::string& m, uint16_t type, const void* data, size_t len) {
  const size_t at = m.size();
  nlattr a{static_cast<uint16_t>(NLA_HDRLEN + len), type};
  m.append(reinterpret_cast<const char*>(&a), sizeof a);
  if (len > 0) m.append(static_cast<const char*>(data), len);
  m.resize(NLA_ALIGN(m.size()), '\0');
  return at;
}
size_t beginNest(std::string& m, uint16_t type) {
  return putAttr(m, static_cast<uint16_t>(type | NLA_F_NESTED), nullptr, 0);
}
void endNest(std::string& m, size_t at) {
  const auto len = static_cast<uint16_t>(m.size() - at);
  std::memcpy(m.data() + at, &len, sizeof len);
}

// The attribute `type` among those in [data, data + len), or nullptr.
const nlattr* findAttr(const char* data, size_t len, uint16_t type) {
  while (len >= NLA_HDRLEN) {
    const auto* a = reinterpret_cast<const nlattr*>(data);
    if (a->nla_len < NLA_HDRLEN || a->nla_len > len) return nullptr;
    if ((a->nla_type & NLA_TYPE_MASK) == type) return a;
    const size_t step = NLA_ALIGN(a->nla_len);
    if (step >= len) return nullptr;
    data += step;
    len -= step;
  }
  return nullptr;
}
const char* attrData(const nlattr* a) { return reinterpret_cast<const char*>(a) + NLA_HDRLEN; }
size_t attrLen(const nlattr* a) { return a->nla_len - NLA_HDRLEN; }

void putAddress(std::string& m, bool v6, uint16_t type4, uint16_t type6, const IpAddress& a) {
  putAttr(m, v6 ? type6 : type4, a.bytes.data(), v6 ? 16 : 4);
}

class KernelNatLookup : public NatLookup {
 public:
  KernelNatLookup() {
    fd_ = UniqueFd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER));
    if (!fd_) return;
    // A lookup answers at once; the bound keeps the engine's thread from
    // ever waiting on a lost answer.
    timeval tv{0, 100 * 1000};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_nl local{};
    local.nl_family = AF_NETLINK;
    if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) fd_.reset();
  }

  std::optional<uint16_t> translatedPort(const Endpoint& client, const Endpoint& server) override {
    if (!fd_) return std::nullopt;
    const bool v6 = client.address.family == 6;
    std::string m(NLMSG_HDRLEN, '\0');
    nfgenmsg g{};
    g.nfgen_family = v6 ? AF_INET6 : AF_INET;
    g.version = NFNETLINK_V0;
    m.append(reinterpret_cast<const char*>(&g), sizeof g);
    m.resize(NLMSG_ALIGN(m.size()), '\0');
    const size_t orig = beginNest(m, CTA_TUPLE_ORIG);
    const size_t ip = beginNest(m, CTA_TUPLE_IP);
    putAddress(m, v6, CTA_IP_V4_SRC, CTA_IP_V6_SRC, client.address);
    putAddress(m, v6, CTA_IP_V4_DST, CTA_IP_V6_DST, server.address);
    endNest(m, ip);
    const size_t proto = beginNest(m, CTA_TUPLE_PROTO);
    const uint8_t tcp = IPPROTO_TCP;
    putAttr(m, CTA_PROTO_NUM, &tcp, 1);
    const uint16_t sport = htons(client.port), dport = htons(server.port);
    putAttr(m, CTA_PROTO_SRC_PORT, &sport, 2);
    putAttr(m, CTA_PROTO_DST_PORT, &dport, 2);
    endNest(m, proto);
    endNest(m, orig);
    nlmsghdr h{};
    h.nlmsg_len = static_cast<uint32_t>(m.size());
    h.nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET;
    h.nlmsg_flags = NLM_F_REQUEST;
    h.nlmsg_seq = ++seq_;
    std::memcpy(m.data(), &h, sizeof h);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd_.get(), m.data(), m.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                 sizeof kernel) < 0) {
      return std::nullopt;
    }
    alignas(nlmsghdr) char buf[8192];
    while (true) {
      ssize_t n = ::recv(fd_.get(), buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      const auto total = static_cast<size_t>(n);
      for (size_t off = 0; off + NLMSG_HDRLEN <= total;) {
        const auto* r = reinterpret_cast<const nlmsghdr*>(buf + off);
        if (r->nlmsg_len < NLMSG_HDRLEN || r->nlmsg_len > total - off) return std::nullopt;
        off += NLMSG_ALIGN(r->nlmsg_len);
        if (r->nlmsg_seq != seq_) continue;  // a late answer to an earlier question
        if (r->nlmsg_type == NLMSG_ERROR || r->nlmsg_type == NLMSG_DONE) return std::nullopt;
        const size_t head = NLMSG_ALIGN(sizeof(nfgenmsg));
        if (r->nlmsg_len < NLMSG_HDRLEN + head) return std::nullopt;
        const char* attrs = reinterpret_cast<const char*>(r) + NLMSG_HDRLEN + head;
        const size_t len = r->nlmsg_len - NLMSG_HDRLEN - head;
        const nlattr* reply = findAttr(attrs, len, CTA_TUPLE_REPLY);
        if (reply == nullptr) return std::nullopt;
        const nlattr* p = findAttr(attrData(reply), attrLen(reply), CTA_TUPLE_PROTO);
        if (p == nullptr) return std::nullopt;
        const nlattr* port = findAttr(attrData(p), attrLen(p), CTA_PROTO_SRC_PORT);
        if (port == nullptr || attrLen(port) < 2) return std::nullopt;
        uint16_t be;
        std::memcpy(&be, attrData(port), 2);
        return ntohs(be);
      }
    }
  }

  bool ownListener(uint16_t port) override {
    // /proc/thread-self/net: the calling thread's netns (/proc/self/net is
    // the main thread's).
    std::set<std::string> inodes;
    char want[8];
    std::snprintf(want, sizeof want, ":%04X", port);
    for (const char* table : {"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"}) {
      std::ifstream in(table);
      std::string line;
      std::getline(in, line);  // the header
      while (std::getline(in, line)) {
        std::istringstream fields(line);
        std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
        fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
            timeout >> inode;
        if (state == "0A" && local.size() > 5 && local.compare(local.size() - 5, 5, want) == 0) {
          inodes.insert("socket:[" + inode + "]");
        }
      }
    }
    if (inodes.empty()) return false;
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return false;
    bool ours = false;
    while (dirent* e = ::readdir(dir)) {
      char link[64];
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
      if (n <= 0) continue;
      if (inodes.contains(std::string(link, static_cast<size_t>(n)))) {
        ours = true;
        break;
      }
    }
    ::closedir(dir);
    return ours;
  }

 private:
  UniqueFd fd_;
  uint32_t seq_ = 0;
};

}  // namespace

std::unique_ptr<NatLookup> makeKernelNatLookup() { return std::make_unique<KernelNatLookup>(); }

}  // namespace siphon::agent::mirror
