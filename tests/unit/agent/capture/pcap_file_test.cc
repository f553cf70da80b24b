// The pcap bytes a capture stream carries, checked field by field against
// the file format (and so against what tcpdump and tshark read).
#include "agent/capture/pcap_file.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace siphon::agent::capture {
namespace {

template <typename T>
T at(const std::string& bytes, size_t offset) {
  T v{};
  std::memcpy(&v, bytes.data() + offset, sizeof(v));
  return v;
}

TEST(PcapFile, GlobalHeaderFields) {
  std::string h = globalHeader(113, 262144);
  ASSERT_EQ(h.size(), kGlobalHeaderSize);
  EXPECT_EQ(at<uint32_t>(h, 0), 0xa1b2c3d4u);  // microseconds, our byte order
  EXPECT_EQ(at<uint16_t>(h, 4), 2);
  EXPECT_EQ(at<uint16_t>(h, 6), 4);
  EXPECT_EQ(at<int32_t>(h, 8), 0);
  EXPECT_EQ(at<uint32_t>(h, 12), 0u);
  EXPECT_EQ(at<uint32_t>(h, 16), 262144u);
  EXPECT_EQ(at<uint32_t>(h, 20), 113u);
}

TEST(PcapFile, GlobalHeaderBytesOnLittleEndian) {
  if (at<uint16_t>(std::string("\x01\x00", 2), 0) != 1) GTEST_SKIP() << "big-endian host";
  const std::string want(
      "\xd4\xc3\xb2\xa1\x02\x00\x04\x00"
      "\x00\x00\x00\x00\x00\x00\x00\x00"
      "\xff\xff\x00\x00\x01\x00\x00\x00",
      24);
  EXPECT_EQ(globalHeader(1, 65535), want);
}

TEST(PcapFile, RecordHeaderThenData) {
  const std::string payload = "\x45\x00\x00\x1c packet bytes";
  Packet p;
  p.ts_sec = 1700000123;
  p.ts_usec = 456789;
  p.caplen = static_cast<uint32_t>(payload.size());
  p.len = 1500;  // truncated by the snapshot length
  p.data = reinterpret_cast<const uint8_t*>(payload.data());
  std::string r = record(p);
  ASSERT_EQ(r.size(), recordSize(p));
  ASSERT_EQ(r.size(), kRecordHeaderSize + payload.size());
  EXPECT_EQ(at<uint32_t>(r, 0), 1700000123u);
  EXPECT_EQ(at<uint32_t>(r, 4), 456789u);
  EXPECT_EQ(at<uint32_t>(r, 8), payload.size());
  EXPECT_EQ(at<uint32_t>(r, 12), 1500u);
  EXPECT_EQ(r.substr(kRecordHeaderSize), payload);
}

TEST(PcapFile, EmptyPacketIsAHeaderAlone) {
  Packet p;
  p.ts_sec = 1;
  p.len = 60;
  std::string r = record(p);
  EXPECT_EQ(r.size(), kRecordHeaderSize);
  EXPECT_EQ(at<uint32_t>(r, 8), 0u);
  EXPECT_EQ(at<uint32_t>(r, 12), 60u);
}

TEST(PcapFile, SecondsPastInt32StayUnsigned) {
  // 2040: beyond a signed 32-bit time_t, still within the format's u32.
  Packet p;
  p.ts_sec = 2208988800LL;
  std::string r = record(p);
  EXPECT_EQ(at<uint32_t>(r, 0), 2208988800u);
}

}  // namespace
}  // namespace siphon::agent::capture
