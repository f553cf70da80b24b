// The pure parts of `siphon capture`: reading the pcap file a capture stream
// carries (the first chunk is the 24-byte global header, each later chunk
// one record) and the lines the command prints. No I/O, so they are
// unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::cli {

inline constexpr size_t kPcapHeaderSize = 24;
inline constexpr size_t kPcapRecordHeaderSize = 16;

// What the global header says.
struct PcapHeader {
  bool swapped = false;      // written in the other byte order than ours
  bool nanoseconds = false;  // magic 0xa1b23c4d
  uint32_t snaplen = 0;
  uint32_t linktype = 0;
};

// PROTOCOL_ERROR (the agent sent something that is not a pcap file) when the
// chunk is not 24 bytes or has no pcap magic in either byte order.
absl::StatusOr<PcapHeader> parsePcapHeader(std::string_view chunk);

// One record: at least its 16-byte header, whose captured length must be
// exactly the rest of the chunk (each record comes as one chunk) and not
// above the snapshot length. PROTOCOL_ERROR naming what is wrong otherwise.
absl::Status checkPcapRecord(std::string_view chunk, const PcapHeader& header);

// "LINUX_SLL", "EN10MB", "RAW"...; "link-type N" for the others.
std::string linkTypeName(uint32_t linktype);

// The filter words as one expression: `siphon capture tcp port 80` and
// `siphon capture 'tcp port 80'` mean the same.
std::string joinFilter(const std::vector<std::string>& words);

// The lines `siphon capture` prints on stderr, each with its '\n'.
//
// "capturing on any (LINUX_SLL), snapshot length 262144 bytes, filter 'tcp
// port 80', writing to out.pcap": the agent accepted, packets flow.
std::string startedLine(std::string_view interface, const PcapHeader& header,
                        std::string_view filter, std::string_view output);
// A StreamGap: packets the agent dropped because the client had no credit
// (bytes > 0), or the kernel's drops (bytes == 0: the kernel does not say).
std::string gapLine(uint64_t packets, uint64_t bytes);

struct CaptureTotals {
  uint64_t packets = 0;       // records written
  uint64_t bytes = 0;         // record bytes written (record headers included)
  uint64_t slow_packets = 0;  // reported by gaps: the client was slower
  uint64_t slow_bytes = 0;
  uint64_t kernel_packets = 0;  // reported by gaps: dropped in the kernel
};

// "12 packets captured (3456 bytes) to out.pcap", with "; N packets
// dropped ..." parts when gaps were reported.
std::string summaryLine(const CaptureTotals& totals, std::string_view output);

}  // namespace siphon::cli
