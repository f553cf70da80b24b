#include "exec/listeners.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

namespace siphon::exec {
namespace {

// Hex digits only, all of them (std::from_chars takes no "0x" or sign).
bool parseHex(std::string_view s, uint32_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

// The words of a line, split at runs of blanks.
std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

// The kernel prints each 32-bit word of an address as it lies in memory,
// read as a host-order integer ("%08X"): writing the parsed integer back
// to memory gives the address's bytes again.
bool parseAddress(std::string_view hex, bool v6, std::string* out) {
  unsigned char bytes[16] = {};
  const size_t words = v6 ? 4 : 1;
  if (hex.size() != words * 8) return false;
  for (size_t i = 0; i < words; ++i) {
    uint32_t word = 0;
    if (!parseHex(hex.substr(i * 8, 8), &word)) return false;
    std::memcpy(bytes + i * 4, &word, 4);
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(v6 ? AF_INET6 : AF_INET, bytes, text, sizeof(text)) == nullptr) return false;
  *out = text;
  return true;
}

}  // namespace

std::string Listener::dialAddress() const {
  if (address == "0.0.0.0") return "127.0.0.1";
  if (address == "::") return "::1";
  return address;
}

std::vector<Listener> parseListeners(std::string_view text, bool v6) {
  std::vector<Listener> out;
  bool header = true;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (header) {  // "  sl  local_address rem_address   st ..."
      header = false;
      continue;
    }
    const std::vector<std::string_view> fields = words(line);
    if (fields.size() < 4 || fields[3] != "0A") continue;
    const std::string_view local = fields[1];
    const size_t colon = local.find(':');
    if (colon == std::string_view::npos) continue;
    Listener l;
    l.v6 = v6;
    uint32_t port = 0;
    if (!parseAddress(local.substr(0, colon), v6, &l.address)) continue;
    if (!parseHex(local.substr(colon + 1), &port) || port == 0 || port > 65535) {
      continue;
    }
    l.port = static_cast<uint16_t>(port);
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace siphon::exec
