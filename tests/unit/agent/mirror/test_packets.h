// Hand-built packets and a recording sink for the mirror tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/mirror/reassembly.h"

namespace siphon::agent::mirror::testing {

inline void put16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value >> 8));
  out.push_back(static_cast<char>(value & 0xff));
}
inline void put32(std::string& out, uint32_t value) {
  put16(out, static_cast<uint16_t>(value >> 16));
  put16(out, static_cast<uint16_t>(value & 0xffff));
}

struct TcpFields {
  uint16_t source_port = 40000;
  uint16_t destination_port = 80;
  uint32_t seq = 1000;
  uint32_t ack = 0;
  uint8_t flags = tcp::kAck;
  std::string options;  // a multiple of 4 bytes
  std::string payload;
};

inline std::string tcpHeader(const TcpFields& f) {
  std::string out;
  put16(out, f.source_port);
  put16(out, f.destination_port);
  put32(out, f.seq);
  put32(out, f.ack);
  out.push_back(static_cast<char>(((20 + f.options.size()) / 4) << 4));
  out.push_back(static_cast<char>(f.flags));
  put16(out, 65535);   // window
  put16(out, 0xdead);  // checksum: not verified
  put16(out, 0);       // urgent pointer
  return out + f.options + f.payload;
}

// IPv4 with `extra` bytes of link padding after the packet.
inline std::string ipv4Packet(const TcpFields& f, std::string ip_options = "",
                              uint16_t fragment = 0x4000 /* DF */, uint8_t protocol = 6) {
  std::string tcp = tcpHeader(f);
  std::string out;
  out.push_back(static_cast<char>(0x40 | ((20 + ip_options.size()) / 4)));
  out.push_back(0);
  put16(out, static_cast<uint16_t>(20 + ip_options.size() + tcp.size()));
  put16(out, 0x1234);
  put16(out, fragment);
  out.push_back(64);
  out.push_back(static_cast<char>(protocol));
  put16(out, 0xbeef);                         // header checksum: not verified
  out += std::string("\x0a\x00\x00\x01", 4);  // 10.0.0.1
  out += std::string("\x0a\x00\x00\x02", 4);  // 10.0.0.2
  return out + ip_options + tcp;
}

// IPv6 fd00::1 -> fd00::2 with extension headers given as (type, body):
// each body is padded by the caller to the header's length rules.
inline std::string ipv6Packet(const TcpFields& f,
                              std::vector<std::pair<uint8_t, std::string>> extensions = {}) {
  std::string tcp = tcpHeader(f);
  std::string chain;
  for (size_t i = 0; i < extensions.size(); ++i) {
    uint8_t next = i + 1 < extensions.size() ? extensions[i + 1].first : 6;
    chain.push_back(static_cast<char>(next));
    chain += extensions[i].second;
  }
  std::string out;
  put32(out, 0x60000000);
  put16(out, static_cast<uint16_t>(chain.size() + tcp.size()));
  out.push_back(static_cast<char>(extensions.empty() ? 6 : extensions[0].first));
  out.push_back(64);
  std::string source(16, '\0'), destination(16, '\0');
  source[0] = destination[0] = '\xfd';
  source[15] = 1;
  destination[15] = 2;
  return out + source + destination + chain + tcp;
}

inline std::string ethernet(uint16_t type, std::string_view payload,
                            std::vector<uint16_t> vlans = {}) {
  std::string out(12, '\x02');  // destination, source MACs
  for (uint16_t vlan : vlans) {
    put16(out, 0x8100);
    put16(out, vlan);
  }
  put16(out, type);
  return out + std::string(payload);
}

// Records one direction's events; optionally checks every byte against the
// original stream at the offset it claims.
class Recorder : public StreamSink {
 public:
  explicit Recorder(std::string_view original = {}) : original_(original) {}

  void onData(std::string_view bytes) override {
    if (!original_.empty()) {
      if (offset_ + bytes.size() > original_.size() ||
          original_.substr(offset_, bytes.size()) != bytes) {
        ++misplaced_chunks;
      }
    }
    data += bytes;
    offset_ += bytes.size();
    delivered += bytes.size();
    events.push_back("data:" + std::string(bytes.size() <= 32 ? bytes : "<long>"));
  }
  void onGap(uint64_t bytes) override {
    gaps.emplace_back(offset_, bytes);
    offset_ += bytes;
    gap_bytes += bytes;
    events.push_back("gap:" + std::to_string(bytes));
  }
  void onEnd(StreamEnd how) override {
    ++ends;
    end = how;
    events.push_back(how == StreamEnd::kFin ? "end:fin" : "end:reset");
  }

  std::string data;                                 // delivered bytes, gaps left out
  std::vector<std::pair<uint64_t, uint64_t>> gaps;  // (stream offset, bytes)
  std::vector<std::string> events;
  uint64_t delivered = 0;
  uint64_t gap_bytes = 0;
  int ends = 0;
  std::optional<StreamEnd> end;
  int misplaced_chunks = 0;

 private:
  std::string_view original_;
  uint64_t offset_ = 0;
};

}  // namespace siphon::agent::mirror::testing
