#include "agent/capture/pcap_file.h"

#include <cstring>

namespace siphon::agent::capture {
namespace {

template <typename T>
char* put(char* out, T value) {
  std::memcpy(out, &value, sizeof(value));
  return out + sizeof(value);
}

}  // namespace

std::string globalHeader(uint32_t linktype, uint32_t snaplen) {
  std::string out(kGlobalHeaderSize, '\0');
  char* p = out.data();
  p = put(p, kMagicMicroseconds);
  p = put(p, kVersionMajor);
  p = put(p, kVersionMinor);
  p = put(p, int32_t{0});   // thiszone: timestamps are UTC
  p = put(p, uint32_t{0});  // sigfigs
  p = put(p, snaplen);
  put(p, linktype);
  return out;
}

std::string record(const Packet& packet) {
  std::string out(recordSize(packet), '\0');
  char* p = out.data();
  p = put(p, static_cast<uint32_t>(packet.ts_sec));
  p = put(p, static_cast<uint32_t>(packet.ts_usec));
  p = put(p, packet.caplen);
  p = put(p, packet.len);
  if (packet.caplen > 0) std::memcpy(p, packet.data, packet.caplen);
  return out;
}

}  // namespace siphon::agent::capture
