// A capture carried over a handover: the packet socket libpcap set up in the
// old agent (a TPACKET_V3 ring), passed over SCM_RIGHTS and read here.
// libpcap cannot adopt a socket it did not create, so this reads the ring
// itself and hands out the records libpcap would have made (the same
// cooked header, VLAN tags, loopback duplicates left out, snapshot length).
//
// Call order: the old agent reads its source to the end (read(INT_MAX)) and
// exports it; the new one asks ringGeometry(), then adoptRing(). From then
// on the source is used like openPcap()'s, on one thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/capture/packet_source.h"
#include "agent/common/unique_fd.h"

namespace siphon::agent::capture {

// The ring of a packet socket, as the kernel reports it (packet_diag).
struct RingGeometry {
  uint32_t block_size = 0;
  uint32_t block_nr = 0;
  uint32_t version = 0;  // PACKET_DIAG_INFO pdi_version: 2 is TPACKET_V3
  uint32_t reserve = 0;  // pdi_reserve (PACKET_RESERVE)
  int socket_type = 0;   // SOCK_RAW (an interface) or SOCK_DGRAM (cooked, "any")
};

// The RX ring geometry of `packet_fd`, asked of the kernel through
// `diag_fd`, a NETLINK_SOCK_DIAG socket made in the same network namespace
// as the packet socket: packet_diag lists the sockets of the netlink
// socket's namespace only. The packet socket is found by its inode.
// Blocks briefly (one netlink dump); any thread.
//
// Errors: INTERNAL or UNAVAILABLE (the dump failed, with the system's
// words); NOT_FOUND when `packet_fd` is no packet socket of that namespace;
// FAILED_PRECONDITION when it has no RX ring or the ring is not TPACKET_V3.
absl::StatusOr<RingGeometry> ringGeometry(int diag_fd, int packet_fd);

// What the new agent needs to carry on an old agent's capture.
struct AdoptedRing {
  UniqueFd socket;  // the packet socket (its ring and kernel filter stay)
  RingGeometry geometry;
  uint32_t link_type = 0;     // LINKTYPE_ for the file header (the old source's linkType())
  uint32_t snaplen = 0;       // the old source's snaplen()
  int data_link = 0;          // the old source's dataLink() (DLT_)
  uint32_t kernel_drops = 0;  // the old source's cumulative kernelDrops() at the export
};

// A PacketSource over the adopted ring: maps it (block_size * block_nr
// bytes, the exact size the kernel insists on) and reads it from the
// oldest block the kernel has handed over. Precondition: every block the
// old agent started was released (it read with max INT_MAX), so each block
// user space owns now is unread. Runs on any thread, one at a time.
//
// It differs from openPcap()'s source in what libpcap does in user space:
// setFilter() is refused (FAILED_PRECONDITION: the kernel filter came with
// the socket), and nothing is filtered here. libpcap filters in user space
// the blocks the ring held when a filter was set, and every packet when
// the kernel cannot run the filter; adopted, those pass unfiltered.
//
// Errors: INVALID_ARGUMENT for no socket or an unusable geometry (not
// TPACKET_V3, no blocks, a socket neither SOCK_RAW nor SOCK_DGRAM);
// UNIMPLEMENTED for records libpcap rewrites further (a cooked capture
// read as anything but DLT_LINUX_SLL, DLT_CAN_SOCKETCAN); INTERNAL when the
// mmap fails. read() fails UNAVAILABLE once the interface is gone ("The
// interface disappeared", as libpcap says) or the socket reports another
// error, INTERNAL on a packet header that points outside its block; a
// failed read() ends the capture (later reads fail the same way).
absl::StatusOr<std::unique_ptr<PacketSource>> adoptRing(AdoptedRing ring);

}  // namespace siphon::agent::capture
