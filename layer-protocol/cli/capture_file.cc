#include "cli/capture_file.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/format.h"
#include "siphon/status.h"

namespace siphon::cli {
namespace {

constexpr uint32_t kMagicMicro = 0xa1b2c3d4;
constexpr uint32_t kMagicNano = 0xa1b23c4d;

uint32_t read32(std::string_view bytes, size_t offset, bool swapped) {
  uint32_t v = 0;
  std::memcpy(&v, bytes.data() + offset, sizeof(v));
  return swapped ? __builtin_bswap32(v) : v;
}

}  // namespace

absl::StatusOr<PcapHeader> parsePcapHeader(std::string_view chunk) {
  if (chunk.size() != kPcapHeaderSize) {
    return protoError(v1::PROTOCOL_ERROR, absl::StrCat("the capture began with ", chunk.size(),
                                                       " bytes, not a 24-byte pcap header"));
  }
  PcapHeader h;
  const uint32_t magic = read32(chunk, 0, false);
  if (magic == kMagicMicro || magic == kMagicNano) {
    h.nanoseconds = magic == kMagicNano;
  } else if (__builtin_bswap32(magic) == kMagicMicro || __builtin_bswap32(magic) == kMagicNano) {
    h.swapped = true;
    h.nanoseconds = __builtin_bswap32(magic) == kMagicNano;
  } else {
    return protoError(v1::PROTOCOL_ERROR,
                      "the capture did not begin with a pcap header (bad magic)");
  }
  h.snaplen = read32(chunk, 16, h.swapped);
  h.linktype = read32(chunk, 20, h.swapped);
  return h;
}

absl::Status checkPcapRecord(std::string_view chunk, const PcapHeader& header) {
  if (chunk.size() < kPcapRecordHeaderSize) {
    return protoError(v1::PROTOCOL_ERROR,
                      absl::StrCat("a capture record of ", chunk.size(), " bytes is too short"));
  }
  const uint32_t caplen = read32(chunk, 8, header.swapped);
  if (caplen != chunk.size() - kPcapRecordHeaderSize) {
    return protoError(v1::PROTOCOL_ERROR,
                      absl::StrCat("a capture record says ", caplen, " bytes but carries ",
                                   chunk.size() - kPcapRecordHeaderSize));
  }
  if (header.snaplen != 0 && caplen > header.snaplen) {
    return protoError(v1::PROTOCOL_ERROR,
                      absl::StrCat("a capture record of ", caplen,
                                   " bytes exceeds the snapshot length ", header.snaplen));
  }
  return absl::OkStatus();
}

std::string linkTypeName(uint32_t linktype) {
  // The link types a Linux capture gives (LINKTYPE_ numbers, as in files).
  switch (linktype & 0x03ffffff) {  // the upper bits flag FCS lengths
    case 0:
      return "NULL";
    case 1:
      return "EN10MB";
    case 101:
      return "RAW";
    case 105:
      return "IEEE802_11";
    case 113:
      return "LINUX_SLL";
    case 127:
      return "IEEE802_11_RADIOTAP";
    case 228:
      return "IPV4";
    case 229:
      return "IPV6";
    case 276:
      return "LINUX_SLL2";
    default:
      return absl::StrCat("link-type ", linktype);
  }
}

std::string joinFilter(const std::vector<std::string>& words) { return absl::StrJoin(words, " "); }

std::string startedLine(std::string_view interface, const PcapHeader& header,
                        std::string_view filter, std::string_view output) {
  return absl::StrCat(
      "capturing on ", asv(interface), " (", linkTypeName(header.linktype), "), snapshot length ",
      header.snaplen, " bytes, ",
      filter.empty() ? std::string("no filter") : absl::StrCat("filter '", asv(filter), "'"),
      ", writing to ", output == "-" ? "stdout" : asv(output), "\n");
}

std::string gapLine(uint64_t packets, uint64_t bytes) {
  if (bytes == 0) {
    return absl::StrCat("siphon: capture lost ", plural(packets, "packet"),
                        " in the target's kernel: its capture buffer was full\n");
  }
  return absl::StrCat("siphon: capture dropped ", plural(packets, "packet"), " (",
                      plural(bytes, "byte"), "): the client was slower than the traffic\n");
}

std::string summaryLine(const CaptureTotals& t, std::string_view output) {
  std::string line =
      absl::StrCat(plural(t.packets, "packet"), " captured (", plural(t.bytes, "byte"), ") to ",
                   output == "-" ? "stdout" : asv(output));
  if (t.slow_packets > 0) {
    absl::StrAppend(&line, "; ", plural(t.slow_packets, "packet"), " (",
                    plural(t.slow_bytes, "byte"), ") dropped: the client was slower");
  }
  if (t.kernel_packets > 0) {
    absl::StrAppend(&line, "; ", plural(t.kernel_packets, "packet"),
                    " lost in the target's kernel");
  }
  return line + "\n";
}

}  // namespace siphon::cli
