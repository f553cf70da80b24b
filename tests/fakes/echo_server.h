// Echo servers for tests of outgoing connections: they serve a socket the
// test made (so it may live in any network namespace or root) on threads of
// their own, until destroyed.
//
//  - stream (TCP, unix stream) and seqpacket: every connection is echoed
//    until the client's EOF, then the server half-closes (so a client sees
//    its whole echo, then EOF); seqpacket records keep their boundaries.
//  - datagram (UDP): every datagram goes back to its sender.
//
// Header-only; blocking sockets, poll() with a stop pipe, no timing.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace siphon::fakes {

class EchoServer {
 public:
  enum class Kind { kStream, kDatagram };

  // Takes `fd`: listening (kStream) or bound (kDatagram).
  EchoServer(int fd, Kind kind) : fd_(fd), kind_(kind) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) == 0) {
      stop_r_ = p[0];
      stop_w_ = p[1];
    }
    threads_.emplace_back([this] { kind_ == Kind::kStream ? acceptLoop() : datagramLoop(); });
  }
  ~EchoServer() {
    char c = 'x';
    (void)!::write(stop_w_, &c, 1);
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
    // Connection threads started after the swap are not possible: the
    // accept loop was joined first and no longer starts any.
    for (auto& t : late_) t.join();
    ::close(fd_);
    ::close(stop_r_);
    ::close(stop_w_);
  }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  // The bound port (TCP/UDP), 0 for other families.
  uint16_t port() const {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len);
    if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in&>(ss).sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(ss).sin6_port);
    return 0;
  }
  int connections() const { return connections_.load(); }

 private:
  // Waits for `fd` to be readable; false when the server stops.
  bool waitReadable(int fd) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_r_, POLLIN, 0}};
    while (true) {
      int n = ::poll(p, 2, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (p[1].revents & POLLIN)) return false;
      if (p[0].revents != 0) return true;
    }
  }

  void acceptLoop() {
    while (waitReadable(fd_)) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++connections_;
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        ::close(c);
        return;
      }
      late_.emplace_back([this, c] { serveConnection(c); });
    }
  }

  void serveConnection(int c) {
    std::vector<char> buf(256 * 1024);
    while (waitReadable(c)) {
      ssize_t n = ::recv(c, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      size_t off = 0;
      while (off < static_cast<size_t>(n)) {
        ssize_t w = ::send(c, buf.data() + off, static_cast<size_t>(n) - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          ::close(c);
          return;
        }
        off += static_cast<size_t>(w);
      }
    }
    ::shutdown(c, SHUT_WR);
    // Wait for the client to close too before letting go of the socket.
    char c2;
    while (waitReadable(c) && ::recv(c, &c2, 1, 0) > 0) {
    }
    ::close(c);
  }

  void datagramLoop() {
    std::vector<char> buf(65536);
    while (waitReadable(fd_)) {
      sockaddr_storage from{};
      socklen_t len = sizeof(from);
      ssize_t n = ::recvfrom(fd_, buf.data(), buf.size(), MSG_DONTWAIT,
                             reinterpret_cast<sockaddr*>(&from), &len);
      if (n < 0) continue;
      ::sendto(fd_, buf.data(), static_cast<size_t>(n), 0, reinterpret_cast<sockaddr*>(&from), len);
    }
  }

  int fd_;
  Kind kind_;
  int stop_r_ = -1;
  int stop_w_ = -1;
  std::mutex mu_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::vector<std::thread> late_;
  std::atomic<int> connections_{0};
};

}  // namespace siphon::fakes
