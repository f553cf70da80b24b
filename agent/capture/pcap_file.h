// The bytes of a capture stream: a pcap file (the classic format tcpdump -w
// writes, microsecond timestamps), cut so that the first Data frame is the
// 24-byte global header and each later Data frame is one record (16-byte
// record header and the captured bytes). No I/O.
//
// Byte order: the writer's own, as in every pcap file; the magic number
// tells the reader which it is (0xa1b2c3d4 read back as 0xd4c3b2a1 means
// swapped).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace siphon::agent::capture {

inline constexpr size_t kGlobalHeaderSize = 24;
inline constexpr size_t kRecordHeaderSize = 16;
inline constexpr uint32_t kMagicMicroseconds = 0xa1b2c3d4;
inline constexpr uint16_t kVersionMajor = 2;
inline constexpr uint16_t kVersionMinor = 4;

// One captured packet as the capture library hands it over; `data` holds
// `caplen` bytes, valid during the call it is given in.
struct Packet {
  int64_t ts_sec = 0;
  int64_t ts_usec = 0;
  uint32_t caplen = 0;  // bytes captured (at most the snapshot length)
  uint32_t len = 0;     // the packet's length on the wire
  const uint8_t* data = nullptr;
};

// The global header: magic, version 2.4, zone and sigfigs 0, the snapshot
// length and the LINKTYPE_ value (the file format's numbers, which differ
// from libpcap's DLT_ values for a few link types, DLT_RAW among them).
std::string globalHeader(uint32_t linktype, uint32_t snaplen);

// The record of `packet`: its header, then its `caplen` bytes. Seconds are
// stored in 32 bits as the format has them (unsigned: good until 2106).
std::string record(const Packet& packet);

// The size record(packet) will have.
inline size_t recordSize(const Packet& packet) { return kRecordHeaderSize + packet.caplen; }

}  // namespace siphon::agent::capture
