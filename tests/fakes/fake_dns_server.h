// DNS messages for tests, and a tiny authoritative DNS server on UDP
// 127.0.0.1:<ephemeral port> answering from a FakeZone. No root needed.
// Header-only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace siphon::fakes {

inline constexpr int kRcodeNoError = 0;
inline constexpr int kRcodeFormErr = 1;
inline constexpr int kRcodeServFail = 2;
inline constexpr int kRcodeNxDomain = 3;
inline constexpr int kRcodeNotImp = 4;
inline constexpr int kRcodeRefused = 5;

inline void put16(std::string& out, unsigned v) {
  out.push_back(static_cast<char>((v >> 8) & 0xff));
  out.push_back(static_cast<char>(v & 0xff));
}
inline void put32(std::string& out, uint32_t v) {
  put16(out, v >> 16);
  put16(out, v & 0xffff);
}

// Uncompressed wire form of a name ("a.b" -> 1a1b0).
inline std::string encodeName(std::string_view name) {
  std::string out;
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    out.push_back(static_cast<char>(dot - start));
    out.append(name.substr(start, dot - start));
    start = dot + 1;
  }
  out.push_back('\0');
  return out;
}

inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

// One resource record of an answer section.
struct FakeRr {
  std::string owner;  // written in full; "" means a pointer to the question name
  int type;
  uint32_t ttl;
  std::string rdata;  // raw
  int klass = 1;
};

inline std::string rdataA(const char* text) {
  in_addr a{};
  inet_pton(AF_INET, text, &a);
  return std::string(reinterpret_cast<const char*>(&a), sizeof(a));
}
inline std::string rdataAaaa(const char* text) {
  in6_addr a{};
  inet_pton(AF_INET6, text, &a);
  return std::string(reinterpret_cast<const char*>(&a), sizeof(a));
}

// A response message: header, the question, the answers.
inline std::string buildResponse(uint16_t id, std::string_view qname, int qtype, int rcode,
                                 const std::vector<FakeRr>& answers) {
  std::string out;
  put16(out, id);
  put16(out, 0x8180 | static_cast<unsigned>(rcode));  // QR, RD, RA
  put16(out, 1);
  put16(out, static_cast<unsigned>(answers.size()));
  put16(out, 0);
  put16(out, 0);
  out += encodeName(qname);
  put16(out, static_cast<unsigned>(qtype));
  put16(out, 1);
  for (const auto& rr : answers) {
    if (rr.owner.empty()) {
      put16(out, 0xc00c);  // compression pointer to the question's name
    } else {
      out += encodeName(rr.owner);
    }
    put16(out, static_cast<unsigned>(rr.type));
    put16(out, static_cast<unsigned>(rr.klass));
    put32(out, rr.ttl);
    put16(out, static_cast<unsigned>(rr.rdata.size()));
    out += rr.rdata;
  }
  return out;
}

// The question of a query: id, name (lower case, no trailing dot), type.
struct FakeQuestion {
  uint16_t id = 0;
  std::string name;
  int type = 0;
};

inline std::optional<FakeQuestion> parseQuery(std::string_view q) {
  if (q.size() < 12) return std::nullopt;
  auto u8 = [&](size_t i) { return static_cast<unsigned char>(q[i]); };
  FakeQuestion out;
  out.id = static_cast<uint16_t>(u8(0) << 8 | u8(1));
  size_t i = 12;
  std::string name;
  while (i < q.size() && u8(i) != 0) {
    size_t len = u8(i);
    if (i + 1 + len > q.size()) return std::nullopt;
    if (!name.empty()) name.push_back('.');
    name.append(q.substr(i + 1, len));
    i += 1 + len;
  }
  if (i + 5 > q.size()) return std::nullopt;
  out.name = lower(name);
  out.type = u8(i + 1) << 8 | u8(i + 2);
  return out;
}

// What the fake server knows. Names are compared in lower case without a
// trailing dot.
struct FakeZone {
  std::map<std::string, std::vector<std::string>> a, aaaa, ptr;
  std::map<std::string, std::string> cname;
  std::map<std::string, int> rcode;  // forced response code for a name
  std::set<std::string> silent;      // names never answered
  uint32_t ttl = 300;

  // nullopt: no reply.
  std::optional<std::string> answer(std::string_view query) const {
    auto q = parseQuery(query);
    if (!q) return std::nullopt;
    if (silent.count(q->name)) return std::nullopt;
    if (auto r = rcode.find(q->name); r != rcode.end()) {
      return buildResponse(q->id, q->name, q->type, r->second, {});
    }
    std::vector<FakeRr> rrs;
    std::string name = q->name;
    for (int hop = 0; hop < 8; ++hop) {
      auto c = cname.find(name);
      if (c == cname.end()) break;
      rrs.push_back({name, 5, ttl - 100, encodeName(c->second)});
      name = lower(c->second);
    }
    auto add = [&](const std::map<std::string, std::vector<std::string>>& m, int type,
                   std::string (*rdata)(const char*)) {
      auto it = m.find(name);
      if (it == m.end() || q->type != type) return;
      for (const auto& v : it->second) rrs.push_back({name, type, ttl, rdata(v.c_str())});
    };
    add(a, 1, rdataA);
    add(aaaa, 28, rdataAaaa);
    add(ptr, 12, [](const char* n) { return encodeName(n); });
    const bool exists = a.count(name) || aaaa.count(name) || ptr.count(name) || !rrs.empty();
    return buildResponse(q->id, q->name, q->type, exists ? kRcodeNoError : kRcodeNxDomain, rrs);
  }
};

// A UDP DNS server on 127.0.0.1 answering from a zone, on its own thread.
class FakeDnsServer {
 public:
  explicit FakeDnsServer(FakeZone zone) : zone_(std::move(zone)) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeDnsServer() {
    uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof(one));
    thread_.join();
    ::close(fd_);
    ::close(stop_fd_);
  }

  uint16_t port() const { return port_; }

  // Every question received so far, in order ("name/type").
  std::vector<std::string> questions() const {
    std::lock_guard<std::mutex> lock(mu_);
    return questions_;
  }

 private:
  void serve() {
    while (true) {
      pollfd p[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) continue;
      if (p[1].revents) return;
      char buf[4096];
      sockaddr_storage from{};
      socklen_t from_len = sizeof(from);
      ssize_t n =
          ::recvfrom(fd_, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
      if (n <= 0) continue;
      std::string_view query(buf, static_cast<size_t>(n));
      if (auto q = parseQuery(query)) {
        std::lock_guard<std::mutex> lock(mu_);
        questions_.push_back(q->name + "/" + typeName(q->type));
      }
      if (auto reply = zone_.answer(query)) {
        ::sendto(fd_, reply->data(), reply->size(), 0, reinterpret_cast<sockaddr*>(&from),
                 from_len);
      }
    }
  }
  static std::string typeName(int t) {
    switch (t) {
      case 1:
        return "A";
      case 28:
        return "AAAA";
      case 12:
        return "PTR";
      default:
        return std::to_string(t);
    }
  }

  FakeZone zone_;
  int fd_ = -1;
  int stop_fd_ = -1;
  uint16_t port_ = 0;
  mutable std::mutex mu_;
  std::vector<std::string> questions_;
  std::thread thread_;
};

}  // namespace siphon::fakes
