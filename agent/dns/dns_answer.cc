#include "agent/dns/dns_answer.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>

#include "agent/dns/dns_names.h"

namespace siphon::agent::dns {
namespace {

constexpr size_t kHeaderSize = 12;
// Longer CNAME chains are loops or abuse; resolvers give up far earlier.
constexpr int kMaxChain = 16;

uint16_t get16(const unsigned char* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t get32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | p[3];
}

absl::Status malformed(const char* what) {
  return absl::InvalidArgumentError(std::string("malformed DNS response: ") + what);
}

// Expands the (possibly compressed) name at `at`; `*used` is its length in
// place.
absl::StatusOr<std::string> expandName(const unsigned char* buf, size_t len,
                                       const unsigned char* at, long* used) {
  char* name = nullptr;
  if (ares_expand_name(at, buf, static_cast<int>(len), &name, used) != ARES_SUCCESS) {
    return malformed("bad name");
  }
  std::string out(name);
  ares_free_string(name);
  return out;
}

struct Record {
  std::string owner;
  int type;
  uint32_t ttl;
  std::string data;  // an address's text, or a name (CNAME, PTR)
};

}  // namespace

absl::StatusOr<DnsAnswer> parseDnsAnswer(const unsigned char* buf, size_t len, int qtype) {
  if (len < kHeaderSize || len > INT_MAX) return malformed("short header");
  const int qdcount = get16(buf + 4);
  const int ancount = get16(buf + 6);
  if (qdcount != 1) return malformed("not exactly one question");

  const unsigned char* p = buf + kHeaderSize;
  const unsigned char* end = buf + len;
  long used = 0;
  auto qname = expandName(buf, len, p, &used);
  if (!qname.ok()) return qname.status();
  p += used;
  if (end - p < 4) return malformed("truncated question");
  p += 4;

  std::vector<Record> records;
  for (int i = 0; i < ancount; ++i) {
    auto owner = expandName(buf, len, p, &used);
    if (!owner.ok()) return owner.status();
    p += used;
    if (end - p < 10) return malformed("truncated record");
    const int type = get16(p);
    const int klass = get16(p + 2);
    const uint32_t ttl = get32(p + 4);
    const size_t rdlen = get16(p + 8);
    p += 10;
    if (static_cast<size_t>(end - p) < rdlen) return malformed("truncated record data");
    const unsigned char* rdata = p;
    p += rdlen;
    if (klass != kClassIn) continue;

    Record r{*std::move(owner), type, ttl, {}};
    char text[INET6_ADDRSTRLEN];
    if (type == kTypeA && rdlen == sizeof(in_addr)) {
      if (inet_ntop(AF_INET, rdata, text, sizeof(text)) == nullptr) continue;
      r.data = text;
    } else if (type == kTypeAaaa && rdlen == sizeof(in6_addr)) {
      if (inet_ntop(AF_INET6, rdata, text, sizeof(text)) == nullptr) continue;
      r.data = text;
    } else if (type == kTypeCname || type == kTypePtr) {
      auto target = expandName(buf, len, rdata, &used);
      if (!target.ok()) return target.status();
      if (static_cast<size_t>(used) > rdlen) return malformed("name overruns its record");
      r.data = *std::move(target);
    } else {
      continue;
    }
    records.push_back(std::move(r));
  }

  DnsAnswer answer;
  answer.canonical = *qname;
  auto lowerTtl = [&answer](uint32_t ttl) {
    answer.ttl = answer.ttl ? std::min(*answer.ttl, ttl) : ttl;
  };
  // Follow the chain: the records that count are those of its last name.
  for (int hop = 0; hop < kMaxChain; ++hop) {
    auto cname = std::find_if(records.begin(), records.end(), [&](const Record& r) {
      return r.type == kTypeCname && sameName(r.owner, answer.canonical);
    });
    if (cname == records.end() || qtype == kTypeCname) break;
    lowerTtl(cname->ttl);
    answer.canonical = cname->data;
  }
  for (const auto& r : records) {
    if (r.type != qtype || !sameName(r.owner, answer.canonical)) continue;
    auto& into = qtype == kTypePtr ? answer.names : answer.addresses;
    if (std::find(into.begin(), into.end(), r.data) != into.end()) continue;
    into.push_back(r.data);
    lowerTtl(r.ttl);
  }
  if (answer.addresses.empty() && answer.names.empty()) answer.ttl.reset();
  return answer;
}

}  // namespace siphon::agent::dns
