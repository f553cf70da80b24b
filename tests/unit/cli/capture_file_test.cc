// The pure parts of `siphon capture`: reading the pcap stream's header and
// records (in either byte order), and the lines it prints.
#include "cli/capture_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

using ::testing::HasSubstr;

template <typename T>
void put(std::string& s, size_t at, T v, bool swap = false) {
  if (swap) {
    if constexpr (sizeof(T) == 4) v = static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
    if constexpr (sizeof(T) == 2) v = static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  }
  std::memcpy(s.data() + at, &v, sizeof(v));
}

std::string header(uint32_t magic, uint32_t snaplen, uint32_t linktype, bool swap = false) {
  std::string h(24, '\0');
  put(h, 0, magic, swap);
  put<uint16_t>(h, 4, 2, swap);
  put<uint16_t>(h, 6, 4, swap);
  put(h, 16, snaplen, swap);
  put(h, 20, linktype, swap);
  return h;
}

std::string record(const std::string& data, bool swap = false, int64_t caplen = -1) {
  std::string r(16, '\0');
  put<uint32_t>(r, 0, 1700000000, swap);
  put<uint32_t>(
      r, 8, caplen < 0 ? static_cast<uint32_t>(data.size()) : static_cast<uint32_t>(caplen), swap);
  put<uint32_t>(r, 12, static_cast<uint32_t>(data.size()), swap);
  return r + data;
}

TEST(PcapHeader, OurByteOrder) {
  auto h = parsePcapHeader(header(0xa1b2c3d4, 262144, 113));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_FALSE(h->swapped);
  EXPECT_FALSE(h->nanoseconds);
  EXPECT_EQ(h->snaplen, 262144u);
  EXPECT_EQ(h->linktype, 113u);
}

TEST(PcapHeader, OtherByteOrderAndNanoseconds) {
  auto h = parsePcapHeader(header(0xa1b23c4d, 65535, 1, /*swap=*/true));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->swapped);
  EXPECT_TRUE(h->nanoseconds);
  EXPECT_EQ(h->snaplen, 65535u);
  EXPECT_EQ(h->linktype, 1u);
}

TEST(PcapHeader, NotAPcapHeader) {
  EXPECT_EQ(errorCodeOf(parsePcapHeader("short").status()), v1::PROTOCOL_ERROR);
  EXPECT_EQ(errorCodeOf(parsePcapHeader(header(0x0a0d0d0a, 0, 1)).status()),  // pcapng
            v1::PROTOCOL_ERROR);
  std::string longer = header(0xa1b2c3d4, 100, 1) + "x";
  EXPECT_EQ(errorCodeOf(parsePcapHeader(longer).status()), v1::PROTOCOL_ERROR);
}

TEST(PcapRecord, LengthMustMatchTheChunk) {
  PcapHeader h{false, false, 1000, 113};
  EXPECT_TRUE(checkPcapRecord(record("packet"), h).ok());
  EXPECT_TRUE(checkPcapRecord(record(""), h).ok());
  EXPECT_EQ(errorCodeOf(checkPcapRecord("tiny", h)), v1::PROTOCOL_ERROR);
  // A record cut in two chunks, or two records in one.
  EXPECT_EQ(errorCodeOf(checkPcapRecord(record("packet", false, 10), h)), v1::PROTOCOL_ERROR);
  EXPECT_EQ(errorCodeOf(checkPcapRecord(record("a") + record("b"), h)), v1::PROTOCOL_ERROR);
  // Above the snapshot length.
  EXPECT_EQ(errorCodeOf(checkPcapRecord(record(std::string(1001, 'x')), h)), v1::PROTOCOL_ERROR);
}

TEST(PcapRecord, OtherByteOrder) {
  PcapHeader h{true, false, 1000, 1};
  EXPECT_TRUE(checkPcapRecord(record("swapped", true), h).ok());
  EXPECT_FALSE(checkPcapRecord(record("swapped", false), h).ok());
}

TEST(CaptureLines, LinkTypeNames) {
  EXPECT_EQ(linkTypeName(113), "LINUX_SLL");
  EXPECT_EQ(linkTypeName(1), "EN10MB");
  EXPECT_EQ(linkTypeName(101), "RAW");
  EXPECT_EQ(linkTypeName(276), "LINUX_SLL2");
  EXPECT_EQ(linkTypeName(9999), "link-type 9999");
}

TEST(CaptureLines, FilterWordsJoin) {
  EXPECT_EQ(joinFilter({"tcp", "port", "80"}), "tcp port 80");
  EXPECT_EQ(joinFilter({"tcp port 80"}), "tcp port 80");
  EXPECT_EQ(joinFilter({}), "");
}

TEST(CaptureLines, Started) {
  PcapHeader h{false, false, 262144, 113};
  EXPECT_EQ(startedLine("any", h, "tcp port 80", "out.pcap"),
            "capturing on any (LINUX_SLL), snapshot length 262144 bytes, filter 'tcp port 80', "
            "writing to out.pcap\n");
  EXPECT_THAT(startedLine("lo", h, "", "-"), HasSubstr("no filter, writing to stdout"));
}

TEST(CaptureLines, Gaps) {
  EXPECT_EQ(gapLine(3, 4500),
            "siphon: capture dropped 3 packets (4500 bytes): the client was slower than the "
            "traffic\n");
  EXPECT_EQ(gapLine(1, 60),
            "siphon: capture dropped 1 packet (60 bytes): the client was slower than the "
            "traffic\n");
  EXPECT_THAT(gapLine(7, 0), HasSubstr("lost 7 packets in the target's kernel"));
}

TEST(CaptureLines, Summary) {
  CaptureTotals t;
  t.packets = 12;
  t.bytes = 3456;
  EXPECT_EQ(summaryLine(t, "out.pcap"), "12 packets captured (3456 bytes) to out.pcap\n");
  t.slow_packets = 5;
  t.slow_bytes = 900;
  t.kernel_packets = 2;
  EXPECT_EQ(summaryLine(t, "-"),
            "12 packets captured (3456 bytes) to stdout; 5 packets (900 bytes) dropped: the "
            "client was slower; 2 packets lost in the target's kernel\n");
}

}  // namespace
}  // namespace siphon::cli
