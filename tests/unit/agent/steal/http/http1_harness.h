// What the HTTP/1 engine tests share: an HttpEngine on an event loop thread
// of its own, fed by a loopback listener (the "stolen" port); a fake router
// whose stolen requests reach a test-written session on a thread; an
// application server on loopback whose connections run a test-written
// handler; and blocking socket helpers with Beast parsers for both.
//
// Everything the tests write is blocking code on plain threads; the engine
// alone runs on the loop. No timing: waits are for bytes, EOF, or a
// condition polled until a generous deadline.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/steal/http/engine.h"
#include "tests/fakes/eventually.h"

namespace siphon::agent::steal::http::testing {

namespace asio = net::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Clock = std::chrono::steady_clock;

// A blocking fd as a Beast SyncReadStream/SyncWriteStream.
struct FdStream {
  int fd;
  template <class Buffers>
  size_t read_some(const Buffers& b, boost::system::error_code& ec) {
    const asio::mutable_buffer buf = *asio::buffer_sequence_begin(b);
    ssize_t n;
    do {
      n = ::recv(fd, buf.data(), buf.size(), 0);
    } while (n < 0 && errno == EINTR);
    ec = {};
    if (n == 0 && buf.size() > 0) ec = asio::error::eof;
    if (n < 0) ec = boost::system::error_code(errno, boost::system::system_category());
    return n > 0 ? static_cast<size_t>(n) : 0;
  }
  template <class Buffers>
  size_t read_some(const Buffers& b) {
    return orThrow([&](boost::system::error_code& ec) { return read_some(b, ec); });
  }
  template <class Buffers>
  size_t write_some(const Buffers& b, boost::system::error_code& ec) {
    size_t total = 0;
    for (auto it = asio::buffer_sequence_begin(b); it != asio::buffer_sequence_end(b); ++it) {
      const asio::const_buffer buf = *it;
      if (buf.size() == 0) continue;
      ssize_t n;
      do {
        n = ::send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
      } while (n < 0 && errno == EINTR);
      if (n < 0) {
        ec = boost::system::error_code(errno, boost::system::system_category());
        return total;
      }
      total += static_cast<size_t>(n);
      if (static_cast<size_t>(n) < buf.size()) break;
    }
    ec = {};
    return total;
  }
  template <class Buffers>
  size_t write_some(const Buffers& b) {
    return orThrow([&](boost::system::error_code& ec) { return write_some(b, ec); });
  }

 private:
  // The throwing overloads the stream concepts also ask for: `op` with an
  // error code, thrown.
  template <class Op>
  static size_t orThrow(Op op) {
    boost::system::error_code ec;
    const size_t n = op(ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
};

inline bool sendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads until EOF (or an error, returned in *err).
inline std::string readToEof(int fd, int* err = nullptr) {
  std::string out;
  char buf[16384];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (err) *err = errno;
      return out;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  if (err) *err = 0;
  return out;
}

// Reads exactly n bytes (fewer at EOF or error).
inline std::string readExactly(int fd, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

// A blocking HTTP/1 peer on one socket: requests or responses parsed whole.
class Peer {
 public:
  explicit Peer(int fd) : fd_(fd), stream_{fd} {}
  int fd() const { return fd_; }
  // nullopt at EOF or a parse error (ec says which).
  std::optional<bhttp::request<bhttp::string_body>> readRequest(
      boost::system::error_code* err = nullptr) {
    bhttp::request_parser<bhttp::string_body> p;
    p.body_limit(std::numeric_limits<uint64_t>::max());
    boost::system::error_code ec;
    bhttp::read(stream_, buf_, p, ec);
    if (err) *err = ec;
    if (ec) return std::nullopt;
    return p.release();
  }
  std::optional<bhttp::response<bhttp::string_body>> readResponse(
      bool head_request = false, boost::system::error_code* err = nullptr) {
    bhttp::response_parser<bhttp::string_body> p;
    p.body_limit(std::numeric_limits<uint64_t>::max());
    if (head_request) p.skip(true);
    boost::system::error_code ec;
    bhttp::read(stream_, buf_, p, ec);
    if (err) *err = ec;
    if (ec) return std::nullopt;
    return p.release();
  }
  // Reads the head only.
  std::optional<bhttp::response<bhttp::string_body>> readResponseHead() {
    bhttp::response_parser<bhttp::string_body> p;
    boost::system::error_code ec;
    bhttp::read_header(stream_, buf_, p, ec);
    if (ec) return std::nullopt;
    return p.release();
  }
  bool send(std::string_view bytes) { return sendAll(fd_, bytes); }
  // Bytes read past the last message.
  std::string buffered() {
    std::string s(static_cast<const char*>(buf_.data().data()), buf_.size());
    buf_.consume(buf_.size());
    return s;
  }

 private:
  int fd_;
  FdStream stream_;
  beast::flat_buffer buf_;
};

inline std::string raw(const bhttp::request<bhttp::string_body>& r) {
  std::string out = std::string(r.method_string()) + " " + std::string(r.target()) + "\n";
  for (const auto& f : r)
    out += std::string(f.name_string()) + ": " + std::string(f.value()) + "\n";
  return out;
}

inline int tcpListener(uint16_t* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 128) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

inline int connectTo(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  // A test whose answer never comes fails instead of hanging.
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

// fakes::eventually with this harness's defaults: 10 s, every 5 ms.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds within = std::chrono::seconds(10)) {
  return fakes::eventually(done, within, std::chrono::milliseconds(5));
}

// Threads that each own a socket; joined (their sockets shut down first)
// when the owner goes.
class Threads {
 public:
  ~Threads() { joinAll(); }
  void start(int fd, std::function<void(int)> body) {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.push_back(fd);
    threads_.emplace_back([fd, body = std::move(body)] {
      body(fd);
      ::close(fd);
    });
  }
  void joinAll() {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(threads_);
      fds_.clear();
    }
    for (auto& t : threads) t.join();
  }

 private:
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> threads_;
};

// The application: a loopback listener; every connection runs `handler`
// on a thread of its own (the socket is closed after it returns).
class AppServer {
 public:
  using Handler = std::function<void(int fd)>;
  explicit AppServer(Handler handler) : handler_(std::move(handler)) {
    fd_ = tcpListener(&port_);
    accept_ = std::thread([this] {
      while (true) {
        const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          return;
        }
        if (stopping_) {
          ::close(c);
          return;
        }
        ++accepts_;
        threads_.start(c, handler_);
      }
    });
  }
  ~AppServer() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    accept_.join();
    ::close(fd_);
    threads_.joinAll();
  }
  uint16_t port() const { return port_; }
  int accepts() const { return accepts_.load(); }

 private:
  Handler handler_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepts_{0};
  std::thread accept_;
  Threads threads_;
};

// Requests with "x-steal" go to the session; the rest to the application.
// A handler a test sets on its own thread while the engine's loop may call
// it: set and read under a lock. (The order is real, given by the test's
// sockets, but ThreadSanitizer cannot see it through the kernel.)
template <typename F>
class LockedHandler {
 public:
  explicit LockedHandler(F f = {}) : f_(std::move(f)) {}
  LockedHandler& operator=(F f) {
    std::lock_guard<std::mutex> lock(mu_);
    f_ = std::move(f);
    return *this;
  }
  F get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return f_;
  }

 private:
  mutable std::mutex mu_;
  F f_;
};

class FakeRouter : public HttpRouter {
 public:
  // Runs on a thread of its own with the session's end of the socketpair
  // (blocking) and the head the engine routed.
  using Session = std::function<void(int fd, RequestHead head)>;

  LockedHandler<std::function<bool(const RequestHead&)>> steal{[](const RequestHead& h) {
    return !h.values("x-steal").empty();
  }};
  LockedHandler<Session> session;
  std::atomic<bool> fail_open{false};
  std::atomic<int> app_connects{0};
  std::atomic<int> opens{0};
  std::mutex mu;
  std::vector<uint64_t> connection_requests;

  ~FakeRouter() override { sessions_.joinAll(); }

  std::optional<Route> route(uint16_t, const RequestHead& head) override {
    if (!steal.get()(head)) return std::nullopt;
    return Route{7, {}};
  }
  absl::StatusOr<std::shared_ptr<StolenStream>> openStolenRequest(
      net::asio::any_io_executor ex, const Route& route, const ConnectionInfo&,
      const RequestHead& head, uint64_t connection_request) override {
    EXPECT_EQ(route.subscription_id, 7u);
    if (fail_open) return absl::UnavailableError("too many streams");
    ++opens;
    {
      std::lock_guard<std::mutex> lock(mu);
      connection_requests.push_back(connection_request);
    }
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      return absl::InternalError("socketpair");
    }
    ::fcntl(sv[0], F_SETFL, ::fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    Session s = session.get();
    sessions_.start(sv[1], [s, head](int fd) {
      if (s) s(fd, head);
    });
    return socketStolenStream(ex, UniqueFd(sv[0]));
  }
  net::awaitable<absl::StatusOr<UniqueFd>> connectApplication(SockAddr destination) override {
    const SockAddr dest = destination;
    const int fd = ::socket(dest.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
    // Loopback: connect() completes at once, blocking is harmless here.
    if (::connect(fd, dest.get(), dest.len) != 0) {
      const int err = errno;
      ::close(fd);
      co_return absl::UnavailableError(std::string("connect: ") + ::strerror(err));
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    ++app_connects;
    co_return UniqueFd(fd);
  }

 private:
  Threads sessions_;
};

// An HttpEngine on its own loop thread, serving a loopback port whose
// connections' original destination is `app_port`.
class EngineHarness {
 public:
  EngineHarness(uint16_t app_port, HttpOptions options = {})
      : work_(asio::make_work_guard(io_)), app_port_(app_port) {
    listen_fd_ = tcpListener(&port_);
    engine_ = std::make_unique<HttpEngine>(io_.get_executor(), router, options);
    thread_ = std::thread([this] { io_.run(); });
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~EngineHarness() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    onLoop([this] {
      engine_->stop();
      return 0;
    });
    // Let the aborted connections wind down, then end the loop.
    eventually([this] { return onLoop([this] { return engine_->connections(); }) == 0; },
               std::chrono::seconds(5));
    onLoop([this] {
      engine_.reset();
      return 0;
    });
    work_.reset();
    io_.stop();
    thread_.join();
    ::close(listen_fd_);
  }

  uint16_t port() const { return port_; }
  int connect() const { return connectTo(port_); }

  // Runs `f` on the loop and returns its result.
  template <class F>
  auto onLoop(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    return result.get();
  }
  size_t inFlight() {
    return onLoop([this] { return engine_->inFlight(); });
  }
  size_t connections() {
    return onLoop([this] { return engine_->connections(); });
  }
  void stopForTest() {
    onLoop([this] {
      engine_->stop();
      return 0;
    });
  }
  void drain() {
    onLoop([this] {
      engine_->drain();
      return 0;
    });
  }
  // Handover (engine.h).
  void park() {
    onLoop([this] {
      engine_->park();
      return 0;
    });
  }
  void unpark() {
    onLoop([this] {
      engine_->unpark();
      return 0;
    });
  }
  size_t unparked() {
    return onLoop([this] { return engine_->unparked(); });
  }
  absl::StatusOr<std::vector<ParkedConnection>> exportParked() {
    return onLoop([this] { return engine_->exportParked(); });
  }
  void adopt(std::vector<ParkedConnection> parked) {
    auto held = std::make_shared<std::vector<ParkedConnection>>(std::move(parked));
    onLoop([this, held] {
      engine_->adopt(std::move(*held));
      return 0;
    });
  }

  FakeRouter router;

 private:
  void acceptLoop() {
    while (true) {
      sockaddr_in peer{};
      socklen_t len = sizeof(peer);
      const int c = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &len,
                              SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      ConnectionInfo info;
      std::memcpy(&info.source.storage, &peer, sizeof(peer));
      info.source.len = sizeof(peer);
      sockaddr_in dest{};
      dest.sin_family = AF_INET;
      dest.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      dest.sin_port = htons(app_port_);
      std::memcpy(&info.destination.storage, &dest, sizeof(dest));
      info.destination.len = sizeof(dest);
      info.port = app_port_;
      asio::post(io_, [this, c, info] { engine_->serve(UniqueFd(c), info); });
    }
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  uint16_t app_port_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::unique_ptr<HttpEngine> engine_;
  std::thread thread_;
  std::thread acceptor_;
};

}  // namespace siphon::agent::steal::http::testing
