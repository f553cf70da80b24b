// ringGeometry() and adoptRing(): the TPACKET_V3 ring of a packet socket
// libpcap set up in another process, read here the way libpcap 1.10 reads
// it (pcap-linux.c, pcap_read_linux_mmap_v3 and pcap_handle_packet_mmap).
// Over 600 lines because the netlink dump, the ring walk and the record
// building each must match the kernel's and libpcap's own to the byte.
#include "agent/capture/adopted_ring.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <linux/packet_diag.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <pcap/dlt.h>
#include <pcap/sll.h>
#include <pcap/vlan.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/netlink.h"
#include "siphon/status.h"

namespace siphon::agent::capture {
namespace {

// enum tpacket_versions counts from TPACKET_V1 = 0.
constexpr uint32_t kTpacketV3 = TPACKET_V3;

// ------------------------------------------------------------ packet_diag

struct DiagRequest {
  nlmsghdr header;
  packet_diag_req body;
};

// NLMSG_OK with the types spelled out: glibc's macro compares the unsigned
// nlmsg_len with an int, which clang's -Wsign-compare rejects.
bool messageFits(const char* at, size_t left) {
  if (left < sizeof(nlmsghdr)) return false;
  nlmsghdr h;
  std::memcpy(&h, at, sizeof(h));
  return h.nlmsg_len >= sizeof(nlmsghdr) && h.nlmsg_len <= left;
}

// What the dump said about the socket we look for.
struct DiagFound {
  int socket_type = 0;
  std::optional<packet_diag_info> info;
  std::optional<packet_diag_ring> rx_ring;
};

// The attributes of one packet_diag_msg (`body` is the message's payload).
void readAttributes(const char* body, size_t size, DiagFound* out) {
  size_t at = NLMSG_ALIGN(sizeof(packet_diag_msg));
  while (at + sizeof(rtattr) <= size) {
    rtattr a;
    std::memcpy(&a, body + at, sizeof(a));
    if (a.rta_len < sizeof(rtattr) || at + a.rta_len > size) return;
    const char* payload = body + at + RTA_LENGTH(0);
    const size_t payload_size = a.rta_len - RTA_LENGTH(0);
    if (a.rta_type == PACKET_DIAG_INFO && payload_size >= sizeof(packet_diag_info)) {
      packet_diag_info info;
      std::memcpy(&info, payload, sizeof(info));
      out->info = info;
    } else if (a.rta_type == PACKET_DIAG_RX_RING && payload_size >= sizeof(packet_diag_ring)) {
      packet_diag_ring ring;
      std::memcpy(&ring, payload, sizeof(ring));
      out->rx_ring = ring;
    }
    at += RTA_ALIGN(a.rta_len);
  }
}

// --------------------------------------------------------------- records

// Where the kernel puts a packet's sockaddr_ll: after its tpacket3_hdr,
// aligned (TPACKET3_HDRLEN without the sockaddr).
constexpr size_t kSllOffset = TPACKET_ALIGN(sizeof(tpacket3_hdr));

// libpcap's vlan_offset: where the tag the kernel took off goes back in a
// record. After the two MAC addresses of an Ethernet header; in a cooked
// header, before its last field (the protocol). None for other link types.
int vlanOffset(int data_link) {
  switch (data_link) {
    case DLT_EN10MB:
      return 12;
    case DLT_LINUX_SLL:
      return SLL_HDR_LEN - 2;
    default:
      return -1;
  }
}

// libpcap's cooked header (struct sll_header), built from the packet's
// sockaddr_ll: type, ARPHRD, address length and 8 address bytes in network
// order, then the protocol as the kernel gave it (network order already).
void cookedHeader(const sockaddr_ll& sll, uint8_t out[SLL_HDR_LEN]) {
  const uint16_t pkttype = htons(sll.sll_pkttype);
  const uint16_t hatype = htons(sll.sll_hatype);
  const uint16_t halen = htons(sll.sll_halen);
  std::memcpy(out, &pkttype, 2);
  std::memcpy(out + 2, &hatype, 2);
  std::memcpy(out + 4, &halen, 2);
  std::memcpy(out + 6, sll.sll_addr, SLL_ADDRLEN);
  std::memcpy(out + 6 + SLL_ADDRLEN, &sll.sll_protocol, 2);
}

// Copies bytes [from, to) of the record libpcap would hold before a VLAN
// tag goes in: `head` (the cooked header, or nothing) then the packet from
// its MAC header on.
void copyRecordBytes(uint8_t* dst, const uint8_t* head, size_t head_len, const uint8_t* mac,
                     size_t from, size_t to) {
  if (from < head_len) {
    const size_t n = std::min(to, head_len) - from;
    std::memcpy(dst, head + from, n);
    dst += n;
    from += n;
  }
  if (to > from) std::memcpy(dst, mac + (from - head_len), to - from);
}

// ---------------------------------------------------------------- source

// Call order: read() walks the ring like libpcap: from its current block
// (the first time, the oldest the kernel handed over), packet by packet,
// handing a block back once all its packets are out. Stopping at `max`
// keeps its place in the block for the next call.
class AdoptedRingSource final : public PacketSource {
 public:
  AdoptedRingSource(AdoptedRing ring, uint8_t* map, size_t map_size, int loopback_ifindex)
      : socket_(std::move(ring.socket)),
        geometry_(ring.geometry),
        link_type_(ring.link_type),
        snaplen_(ring.snaplen),
        data_link_(ring.data_link),
        drops_(ring.kernel_drops),
        map_(map),
        map_size_(map_size),
        cooked_(ring.geometry.socket_type == SOCK_DGRAM),
        vlan_offset_(vlanOffset(ring.data_link)),
        loopback_ifindex_(loopback_ifindex) {}

  ~AdoptedRingSource() override { munmap(map_, map_size_); }  // then socket_ closes

  uint32_t linkType() const override { return link_type_; }
  uint32_t snaplen() const override { return snaplen_; }
  int dataLink() const override { return data_link_; }

  absl::Status setFilter(const CompiledFilter&) override {
    return protoError(v1::FAILED_PRECONDITION, "capture: an adopted capture keeps its filter");
  }

  int selectableFd() const override { return socket_.get(); }

  absl::StatusOr<int> read(int max, PacketSink& sink) override {
    if (!failure_.ok()) return failure_;
    // pcap_dispatch's rule, which openPcap()'s source passes on: no
    // positive count means no limit.
    if (max <= 0) max = INT_MAX;
    int delivered = 0;
    if (left_ == 0 && !blockReady()) {
      // Nothing to read: the moment libpcap looks for errors on the socket.
      failure_ = checkSocket();
      if (!failure_.ok()) return failure_;
      return 0;
    }
    while (delivered < max) {
      if (left_ == 0) {
        if (!blockReady()) break;
        const tpacket_block_desc* b = block(block_);
        left_ = b->hdr.bh1.num_pkts;
        offset_ = b->hdr.bh1.offset_to_first_pkt;
      }
      while (left_ > 0 && delivered < max) {
        absl::StatusOr<bool> handed = handOne(sink);
        if (!handed.ok()) {
          failure_ = handed.status();
          return failure_;
        }
        if (*handed) ++delivered;
      }
      if (left_ == 0) releaseBlock();
    }
    return delivered;
  }

  absl::StatusOr<uint32_t> kernelDrops() override {
    // Reading the statistics resets them in the kernel, as it did for the
    // old agent's libpcap: add them up, modulo 2^32 like pcap_stats.
    tpacket_stats_v3 stats{};
    socklen_t len = sizeof(stats);
    if (getsockopt(socket_.get(), SOL_PACKET, PACKET_STATISTICS, &stats, &len) != 0) {
      return protoError(v1::UNAVAILABLE, absl::StrCat("capture statistics: ", strerror(errno)));
    }
    drops_ += stats.tp_drops;
    return drops_;
  }

 private:
  tpacket_block_desc* block(uint32_t i) const {
    return reinterpret_cast<tpacket_block_desc*>(map_ + size_t{i} * geometry_.block_size);
  }

  // Whether the kernel handed the block over. Acquire: what it wrote in
  // the block before its release store is visible after this load.
  bool userOwned(uint32_t i) const {
    return (__atomic_load_n(&block(i)->hdr.bh1.block_status, __ATOMIC_ACQUIRE) & TP_STATUS_USER) !=
           0;
  }

  // Whether block_ holds packets for us. Before the first block the place
  // is unknown (libpcap's offset stayed in the old agent): every block user
  // space owns now is unread, and the kernel numbers blocks in the order it
  // fills them, so the lowest number is where libpcap would have gone on.
  bool blockReady() {
    if (!started_) {
      std::optional<uint32_t> oldest;
      uint64_t oldest_seq = 0;
      for (uint32_t i = 0; i < geometry_.block_nr; ++i) {
        if (!userOwned(i)) continue;
        const uint64_t seq = block(i)->hdr.bh1.seq_num;
        if (!oldest || seq < oldest_seq) {
          oldest = i;
          oldest_seq = seq;
        }
      }
      if (!oldest) return false;
      block_ = *oldest;
      started_ = true;
    }
    return userOwned(block_);
  }

  // Gives the block back to the kernel and moves to the next in the ring.
  void releaseBlock() {
    __atomic_store_n(&block(block_)->hdr.bh1.block_status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
    block_ = (block_ + 1) % geometry_.block_nr;
  }

  // The packet at offset_ of block_: handed to `sink` as libpcap's record
  // (true), or left out as libpcap leaves it out (false). Either way it is
  // consumed.
  absl::StatusOr<bool> handOne(PacketSink& sink) {
    const uint64_t block_size = geometry_.block_size;
    if (offset_ + kSllOffset + sizeof(sockaddr_ll) > block_size) return corrupt("its header");
    const uint8_t* frame = reinterpret_cast<const uint8_t*>(block(block_)) + offset_;
    tpacket3_hdr h;
    std::memcpy(&h, frame, sizeof(h));
    sockaddr_ll sll;
    std::memcpy(&sll, frame + kSllOffset, sizeof(sll));
    if (offset_ + h.tp_mac + h.tp_snaplen > block_size) {
      return corrupt(
          absl::StrCat("its data (mac offset ", h.tp_mac, ", ", h.tp_snaplen, " bytes)"));
    }
    offset_ += h.tp_next_offset;
    --left_;

    // libpcap's direction check, for both directions (pcap's default).
    // Loopback hands each packet to packet sockets twice, going out and
    // coming in; libpcap keeps the second. CAN loops its own frames back
    // the same way.
    if (sll.sll_pkttype == PACKET_OUTGOING &&
        (sll.sll_ifindex == loopback_ifindex_ || sll.sll_hatype == ARPHRD_CAN)) {
      return false;
    }

    const uint8_t* mac = frame + h.tp_mac;
    uint8_t head[SLL_HDR_LEN];
    size_t head_len = 0;
    if (cooked_) {
      cookedHeader(sll, head);
      head_len = SLL_HDR_LEN;
    }
    Packet p;
    p.ts_sec = h.tp_sec;
    p.ts_usec = h.tp_nsec / 1000;
    p.caplen = h.tp_snaplen + static_cast<uint32_t>(head_len);
    p.len = h.tp_len + static_cast<uint32_t>(head_len);
    // The kernel took the VLAN tag off the packet into its header (and
    // before 3.0 said "tag 0" for "no tag"); libpcap puts it back.
    const bool tagged = (h.hv1.tp_vlan_tci != 0 || (h.tp_status & TP_STATUS_VLAN_VALID)) &&
                        vlan_offset_ >= 0 && h.tp_snaplen >= static_cast<uint32_t>(vlan_offset_);
    if (tagged) {
      p.caplen += VLAN_TAG_LEN;
      p.len += VLAN_TAG_LEN;
    }
    // Without a filter the kernel does not cut packets at the snapshot
    // length; libpcap does.
    p.caplen = std::min(p.caplen, snaplen_);

    if (head_len == 0 && !tagged) {
      p.data = mac;
    } else {
      // libpcap builds these in the ring, in the room before the packet;
      // the ring is the kernel's and the old agent's too, so build a copy.
      if (scratch_.size() < p.caplen) scratch_.resize(p.caplen);
      uint8_t* out = scratch_.data();
      const size_t caplen = p.caplen;
      if (!tagged) {
        copyRecordBytes(out, head, head_len, mac, 0, caplen);
      } else {
        const uint16_t tpid =
            htons((h.hv1.tp_vlan_tpid != 0 || (h.tp_status & TP_STATUS_VLAN_TPID_VALID))
                      ? h.hv1.tp_vlan_tpid
                      : ETH_P_8021Q);
        const uint16_t tci = htons(h.hv1.tp_vlan_tci);
        uint8_t tag[VLAN_TAG_LEN];
        std::memcpy(tag, &tpid, 2);
        std::memcpy(tag + 2, &tci, 2);
        const size_t at = static_cast<size_t>(vlan_offset_);
        size_t done = std::min(at, caplen);
        copyRecordBytes(out, head, head_len, mac, 0, done);
        const size_t tag_bytes = std::min<size_t>(VLAN_TAG_LEN, caplen - done);
        std::memcpy(out + done, tag, tag_bytes);
        done += tag_bytes;
        if (done < caplen) copyRecordBytes(out + done, head, head_len, mac, at, at + caplen - done);
      }
      p.data = out;
    }
    sink.onPacket(p);
    return true;
  }

  absl::Status corrupt(std::string_view what) const {
    return protoError(v1::INTERNAL,
                      absl::StrCat("capture: corrupted adopted ring: the packet at offset ",
                                   offset_, " of block ", block_, " has ", asv(what),
                                   " beyond the block's ", geometry_.block_size, " bytes"));
  }

  // libpcap's error checks when the ring is empty (pcap_wait_for_frames_mmap):
  // the socket's pending error, and whether the interface went away. An
  // interface taken down only pauses the capture (the kernel hooks the
  // socket up again when it comes back up); one deleted ends it.
  absl::Status checkSocket() {
    pollfd p{socket_.get(), POLLIN, 0};
    if (poll(&p, 1, 0) < 0 && errno != EINTR) {
      return protoError(v1::UNAVAILABLE,
                        absl::StrCat("capture: can't poll on packet socket: ", strerror(errno)));
    }
    if (p.revents & POLLNVAL) {
      return protoError(v1::UNAVAILABLE, "capture: Invalid polling request on packet socket");
    }
    if (p.revents & (POLLHUP | POLLRDHUP)) {
      return protoError(v1::UNAVAILABLE, "capture: Hangup on packet socket");
    }
    if (p.revents & POLLERR) {
      int err = 0;
      socklen_t len = sizeof(err);
      if (getsockopt(socket_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err == ENETDOWN) {
        netdown_ = true;
      } else {
        return protoError(v1::UNAVAILABLE,
                          absl::StrCat("capture: Error condition on packet socket: ",
                                       err == 0 ? "no error given" : strerror(err)));
      }
    }
    if (netdown_) return checkInterface();
    return absl::OkStatus();
  }

  // After ENETDOWN (or at adoption, where the old agent may have taken the
  // error): the kernel sets the socket's interface index to -1 once the
  // interface is unregistered.
  absl::Status checkInterface() {
    sockaddr_ll addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(socket_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (errno == ENODEV) return disappeared();
      return protoError(v1::UNAVAILABLE,
                        absl::StrCat("capture: getsockname on packet socket: ", strerror(errno)));
    }
    if (addr.sll_ifindex == -1) return disappeared();
    if (addr.sll_ifindex == 0) {  // "any": never goes away
      netdown_ = false;
      return absl::OkStatus();
    }
    // Asked through the packet socket: its namespace's interfaces.
    ifreq ifr{};
    ifr.ifr_ifindex = addr.sll_ifindex;
    if (ioctl(socket_.get(), SIOCGIFNAME, &ifr) != 0) {
      if (errno == ENODEV || errno == ENXIO) return disappeared();
      return absl::OkStatus();  // ask again next time
    }
    if (ioctl(socket_.get(), SIOCGIFFLAGS, &ifr) != 0) {
      if (errno == ENODEV || errno == ENXIO) return disappeared();
      return absl::OkStatus();
    }
    if (ifr.ifr_flags & IFF_UP) netdown_ = false;
    return absl::OkStatus();
  }

  static absl::Status disappeared() {
    return protoError(v1::UNAVAILABLE, "capture: The interface disappeared");
  }

  UniqueFd socket_;
  RingGeometry geometry_;
  uint32_t link_type_;
  uint32_t snaplen_;
  int data_link_;
  uint32_t drops_;  // cumulative, modulo 2^32
  uint8_t* map_;
  size_t map_size_;
  bool cooked_;
  int vlan_offset_;       // -1: no tag goes back
  int loopback_ifindex_;  // -1: none
  // Where reading stands: block_ (valid once started_), and in it, while
  // left_ packets remain, the offset of the next one.
  bool started_ = false;
  uint32_t block_ = 0;
  uint32_t left_ = 0;
  uint64_t offset_ = 0;
  // Unknown at adoption: the old agent may have taken an ENETDOWN.
  bool netdown_ = true;
  absl::Status failure_;          // once set, the capture is over
  std::vector<uint8_t> scratch_;  // records libpcap would have built in the ring
};

}  // namespace

absl::StatusOr<RingGeometry> ringGeometry(int diag_fd, int packet_fd) {
  struct stat st {};
  if (fstat(packet_fd, &st) != 0) {
    return protoError(v1::INTERNAL, absl::StrCat("capture ring: fstat of descriptor ", packet_fd,
                                                 ": ", strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return protoError(v1::NOT_FOUND,
                      absl::StrCat("capture ring: descriptor ", packet_fd, " is not a socket"));
  }

  static std::atomic<uint32_t> next_seq{1};
  const uint32_t seq = next_seq.fetch_add(1);
  DiagRequest request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.header.nlmsg_seq = seq;
  request.body.sdiag_family = AF_PACKET;
  request.body.pdiag_show = PACKET_SHOW_INFO | PACKET_SHOW_RING_CFG;
  RETURN_IF_ERROR(netlinkSend(diag_fd, &request, sizeof(request), "capture ring: packet_diag"));

  // packet_diag only dumps (the inode in the request is not looked at):
  // read every socket of the namespace, to the end, so the netlink socket
  // is left clean for another question.
  std::optional<DiagFound> found;
  std::vector<char> buf(64 * 1024);
  for (bool done = false; !done;) {
    ASSIGN_OR_RETURN(size_t len, netlinkReceive(diag_fd, buf, "capture ring: packet_diag dump"));
    const char* at = buf.data();
    size_t left = len;
    while (messageFits(at, left)) {
      nlmsghdr h;
      std::memcpy(&h, at, sizeof(h));
      const char* body = at + NLMSG_HDRLEN;
      const size_t body_size = h.nlmsg_len - NLMSG_HDRLEN;
      const size_t step = std::min<size_t>(NLMSG_ALIGN(h.nlmsg_len), left);
      at += step;
      left -= step;
      // Answers of an earlier question on this socket, abandoned midway.
      if (h.nlmsg_seq != seq) continue;
      if (h.nlmsg_type == NLMSG_DONE) {
        done = true;
        break;
      }
      if (h.nlmsg_type == NLMSG_ERROR) {
        nlmsgerr err{};
        std::memcpy(&err, body, std::min(sizeof(err), body_size));
        return protoError(v1::UNAVAILABLE,
                          absl::StrCat("capture ring: packet_diag dump: ", strerror(-err.error)));
      }
      if (h.nlmsg_type != SOCK_DIAG_BY_FAMILY || body_size < sizeof(packet_diag_msg)) continue;
      packet_diag_msg msg;
      std::memcpy(&msg, body, sizeof(msg));
      if (msg.pdiag_ino != st.st_ino) continue;
      DiagFound f;
      f.socket_type = msg.pdiag_type;
      readAttributes(body, body_size, &f);
      found = f;
    }
  }

  if (!found) {
    return protoError(
        v1::NOT_FOUND,
        absl::StrCat("capture ring: descriptor ", packet_fd, " (socket inode ", st.st_ino,
                     ") is no packet socket of the network namespace asked"));
  }
  if (!found->rx_ring) {
    return protoError(v1::FAILED_PRECONDITION,
                      absl::StrCat("capture ring: the packet socket of descriptor ", packet_fd,
                                   " has no RX ring"));
  }
  if (!found->info) {
    return protoError(v1::INTERNAL, "capture ring: packet_diag gave no PACKET_DIAG_INFO");
  }
  if (found->info->pdi_version != kTpacketV3) {
    return protoError(
        v1::FAILED_PRECONDITION,
        absl::StrCat("capture ring: the ring of descriptor ", packet_fd, " is TPACKET_V",
                     found->info->pdi_version + 1, ", not TPACKET_V3"));
  }
  RingGeometry g;
  g.block_size = found->rx_ring->pdr_block_size;
  g.block_nr = found->rx_ring->pdr_block_nr;
  g.version = found->info->pdi_version;
  g.reserve = found->info->pdi_reserve;
  g.socket_type = found->socket_type;
  return g;
}

absl::StatusOr<std::unique_ptr<PacketSource>> adoptRing(AdoptedRing ring) {
  const RingGeometry& g = ring.geometry;
  if (!ring.socket.valid()) {
    return protoError(v1::INVALID_ARGUMENT, "capture: no packet socket to adopt");
  }
  if (g.version != kTpacketV3) {
    return protoError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("capture: an adopted ring must be TPACKET_V3, not version ", g.version));
  }
  if (g.block_size == 0 || g.block_nr == 0 || g.block_size % 16 != 0) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("capture: unusable ring geometry (", g.block_nr, " blocks of ",
                                   g.block_size, " bytes)"));
  }
  if (g.socket_type != SOCK_RAW && g.socket_type != SOCK_DGRAM) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("capture: packet socket of type ", g.socket_type,
                                   ", not SOCK_RAW or SOCK_DGRAM"));
  }
  // What libpcap does to these records besides the common steps, this
  // reader does not: a cooked socket read as DLT_LINUX_SLL2, CAN frames
  // rewritten to DLT_CAN_SOCKETCAN's byte order.
  if (g.socket_type == SOCK_DGRAM && ring.data_link != DLT_LINUX_SLL) {
    return protoError(v1::UNIMPLEMENTED,
                      absl::StrCat("capture: an adopted cooked capture must be DLT_LINUX_SLL, not ",
                                   ring.data_link));
  }
  if (ring.data_link == DLT_CAN_SOCKETCAN) {
    return protoError(v1::UNIMPLEMENTED, "capture: a CAN capture cannot be adopted");
  }

  // libpcap's loopback index, asked the same way (through the packet
  // socket, so in its namespace); -1 when there is none.
  int loopback_ifindex = -1;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "lo", sizeof(ifr.ifr_name) - 1);
  if (ioctl(ring.socket.get(), SIOCGIFINDEX, &ifr) == 0) loopback_ifindex = ifr.ifr_ifindex;

  // The kernel maps a ring only whole: exactly its size, from offset 0.
  const size_t size = size_t{g.block_size} * g.block_nr;
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, ring.socket.get(), 0);
  if (map == MAP_FAILED) {
    return protoError(v1::INTERNAL, absl::StrCat("capture: map the adopted ring (", size,
                                                 " bytes): ", strerror(errno)));
  }
  return std::make_unique<AdoptedRingSource>(std::move(ring), static_cast<uint8_t*>(map), size,
                                             loopback_ifindex);
}

}  // namespace siphon::agent::capture
