// The privileged tests' TCP servers (an application in a pod, a session's
// local server on the host) all serve a listening socket the same way: an
// acceptor thread and a thread per connection. Header-only.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon::harness {

// A TCP listener on 127.0.0.1, on a port the kernel picks (given in *port).
inline Fd listenOnLoopback(uint16_t* port, int backlog) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd.get(), backlog), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// A TCP listener on `port` of every IPv4 address inside the named network
// namespace: an application of the pod. SO_REUSEADDR, so a fixed port is
// free again at once for the next test.
inline Fd listenInNetns(const std::string& netns, uint16_t port, int backlog) {
  Fd fd(socketInNetns(netns, AF_INET, SOCK_STREAM));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
  EXPECT_EQ(::listen(fd.get(), backlog), 0);
  return fd;
}

// Serves a listening socket: an acceptor thread takes each connection,
// gives it send and receive timeouts of `io_timeout_seconds` (a peer that
// stops talking cannot park a worker for ever) and a thread of its own
// running `serve(fd)`; the connection is closed when `serve` returns.
//
// The destructor stops accepting, shuts down the connections still being
// served (a worker blocked reading a keep-alive connection of the CLI or of
// the agent's pool wakes) and joins every worker. `serve` may use its
// owner's members until then: an owner declares its Acceptor last.
class Acceptor {
 public:
  Acceptor(Fd listener, int io_timeout_seconds, std::function<void(int)> serve)
      : listener_(std::move(listener)),
        io_timeout_seconds_(io_timeout_seconds),
        serve_(std::move(serve)) {
    auto [r, w] = makePipe();
    stop_r_ = std::move(r);
    stop_w_ = std::move(w);
    acceptor_ = std::thread([this] { loop(); });
  }
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  ~Acceptor() {
    (void)!::write(stop_w_.get(), "x", 1);
    acceptor_.join();
    // The workers take mu_ as they end: joined without it.
    std::vector<Worker> workers;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
      workers = std::move(workers_);
    }
    for (auto& w : workers) w.thread.join();
  }

  // Connections accepted so far.
  int accepted() const { return accepted_; }

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  void loop() {
    while (true) {
      pollfd p[2] = {{listener_.get(), POLLIN, 0}, {stop_r_.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) continue;
      if (p[1].revents) return;
      int c = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ++accepted_;
      setTimeouts(c, io_timeout_seconds_);
      std::lock_guard<std::mutex> l(mu_);
      reap();
      auto done = std::make_shared<std::atomic<bool>>(false);
      open_.insert(c);
      workers_.push_back({std::thread([this, c, done] {
                            serve_(c);
                            // Out of open_ before the close: the number may
                            // be reused at once, and must not be shut down.
                            {
                              std::lock_guard<std::mutex> l(mu_);
                              open_.erase(c);
                            }
                            ::close(c);
                            *done = true;
                          }),
                          done});
    }
  }

  // Joins the workers that are over: a load makes thousands of
  // connections, and an unjoined thread keeps its stack.
  void reap() {
    std::vector<Worker> running;
    for (auto& w : workers_) {
      if (*w.done) {
        w.thread.join();
      } else {
        running.push_back(std::move(w));
      }
    }
    workers_ = std::move(running);
  }

  Fd listener_;
  const int io_timeout_seconds_;
  std::function<void(int)> serve_;
  Fd stop_r_, stop_w_;
  std::mutex mu_;
  std::vector<Worker> workers_;
  std::set<int> open_;  // connections being served
  std::atomic<int> accepted_{0};
  std::thread acceptor_;  // last: starts once the rest exists
};

}  // namespace siphon::harness
