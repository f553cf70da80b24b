// A blocking HTTP/1.1 client for the metrics endpoint tests: one request
// on a fresh loopback connection, the answer read to EOF. Receive timeouts
// are hang guards, not timing assertions.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace siphon::agent::metrics::testing {

struct HttpAnswer {
  int status = 0;  // 0: no HTTP answer (closed or reset first)
  std::string head;
  std::string body;
};

// A connected loopback socket to "127.0.0.1:PORT", or -1.
inline int connectTo(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(address.c_str() + colon + 1)));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads to EOF (or an error, or the 20 s guard).
inline std::string readAll(int fd) {
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

inline HttpAnswer parseAnswer(const std::string& raw) {
  HttpAnswer a;
  const size_t end = raw.find("\r\n\r\n");
  if (!raw.starts_with("HTTP/1.") || end == std::string::npos) return a;
  a.status = std::atoi(raw.c_str() + 9);
  a.head = raw.substr(0, end);
  a.body = raw.substr(end + 4);
  return a;
}

// Sends `raw` as is, half-closes, reads the answer.
inline HttpAnswer httpExchange(const std::string& address, const std::string& raw) {
  int fd = connectTo(address);
  if (fd < 0) return {};
  (void)::send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  HttpAnswer a = parseAnswer(readAll(fd));
  ::close(fd);
  return a;
}

inline HttpAnswer get(const std::string& address, const std::string& path,
                      const std::string& method = "GET") {
  return httpExchange(address, method + " " + path + " HTTP/1.1\r\nHost: test\r\n\r\n");
}

// The value of sample `series` (name with its labels, as rendered) in a
// text-format scrape; -1 when absent.
inline double sample(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  size_t pos = 0;
  while ((pos = text.find(key, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::atof(text.c_str() + pos + key.size());
    pos += key.size();
  }
  return -1;
}

}  // namespace siphon::agent::metrics::testing
