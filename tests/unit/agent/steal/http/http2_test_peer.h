// Test peers for the HTTP/2 engine: a blocking nghttp2 client (the test
// thread drives it with a deadline) and an h2c application server (a thread
// per connection) that echoes requests, both over loopback TCP.
//
// Over 600 lines: the two peers share the nghttp2 callback plumbing kept here.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace siphon::agent::steal::http::testing {

using Headers = std::vector<std::pair<std::string, std::string>>;

inline std::string headerValue(const Headers& h, std::string_view name) {
  for (const auto& [n, v] : h) {
    if (n == name) return v;
  }
  return "";
}

inline nghttp2_nv testNv(const std::string& n, const std::string& v) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(n.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(v.data())), n.size(), v.size(),
                    NGHTTP2_NV_FLAG_NONE};
}

// An nghttp2 session on a non-blocking socket, driven by poll().
class H2Peer {
 public:
  virtual ~H2Peer() {
    if (session_ != nullptr) nghttp2_session_del(session_);
    if (fd_ >= 0) ::close(fd_);
  }

  // One round of I/O: false once the connection is over (EOF, error, or
  // nothing left to do).
  bool step(int timeout_ms) {
    if (fd_ < 0) return false;
    while (out_.size() < 256 * 1024) {
      const uint8_t* data;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) return fail("mem_send");
      if (n == 0) break;
      out_.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
    }
    if (out_.empty() && !nghttp2_session_want_read(session_) &&
        !nghttp2_session_want_write(session_)) {
      return false;
    }
    pollfd p{fd_, static_cast<short>(POLLIN | (out_.empty() ? 0 : POLLOUT)), 0};
    if (::poll(&p, 1, timeout_ms) < 0) return fail("poll");
    if (p.revents & POLLOUT) {
      const ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) return fail("send");
      if (n > 0) out_.erase(0, static_cast<size_t>(n));
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[16384];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN)) {
        eof_ = true;
        return false;
      }
      if (n > 0 && nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(buf),
                                            static_cast<size_t>(n)) < 0) {
        return fail("mem_recv");
      }
    }
    return true;
  }

  bool eof() const { return eof_; }

  // Reads (and drops) until the peer closes its end, or `timeout`.
  bool waitEof(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!eof_ && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) < 0) return false;
      if (p.revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN)) eof_ = true;
    }
    return eof_;
  }
  const std::string& error() const { return error_; }

 protected:
  bool fail(const char* what) {
    error_ = std::string(what) + ": " + std::strerror(errno);
    return false;
  }
  void setFd(int fd) {
    fd_ = fd;
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  // The session (nghttp2's defaults: automatic WINDOW_UPDATE), its empty
  // SETTINGS queued; `setCallbacks` installs the callbacks, which get
  // `user_data`.
  void startSession(bool server, void (*setCallbacks)(nghttp2_session_callbacks*),
                    void* user_data) {
    nghttp2_session_callbacks* cbs;
    nghttp2_session_callbacks_new(&cbs);
    setCallbacks(cbs);
    if (server) {
      nghttp2_session_server_new(&session_, cbs, user_data);
    } else {
      nghttp2_session_client_new(&session_, cbs, user_data);
    }
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, nullptr, 0);
  }

  int fd_ = -1;
  nghttp2_session* session_ = nullptr;
  std::string out_;
  bool eof_ = false;
  std::string error_;
};

struct TestRequest {
  std::string method = "GET";
  std::string path = "/";
  std::string authority = "app.test";
  Headers headers;
  std::optional<std::string> body;  // a body (DATA frames) when set
  Headers trailers;
};

struct TestResponse {
  int status = 0;
  Headers headers;
  std::string body;
  Headers trailers;
  bool closed = false;
  uint32_t error_code = 0;  // RST_STREAM's, when reset
};

// An HTTP/2 client (prior knowledge) on a loopback connection.
class H2Client : public H2Peer {
 public:
  explicit H2Client(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) error_ = "connect";
    setFd(fd);
    startSession(
        /*server=*/false,
        [](nghttp2_session_callbacks* cbs) {
          nghttp2_session_callbacks_set_on_header_callback(cbs, &onHeader);
          nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &onData);
          nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &onClose);
          nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &onFrame);
        },
        this);
  }

  int32_t submit(TestRequest r) {
    auto req = std::make_unique<Request>();
    req->r = std::move(r);
    std::vector<nghttp2_nv> nva;
    const std::string m = ":method", s = ":scheme", a = ":authority", p = ":path", http = "http";
    nva.push_back(testNv(m, req->r.method));
    nva.push_back(testNv(s, http));
    nva.push_back(testNv(a, req->r.authority));
    nva.push_back(testNv(p, req->r.path));
    for (const auto& [n, v] : req->r.headers) nva.push_back(testNv(n, v));
    nghttp2_data_provider prd;
    prd.source.ptr = req.get();
    prd.read_callback = &readBody;
    const int32_t id = nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(),
                                              req->r.body ? &prd : nullptr, nullptr);
    req->id = id;
    requests_[id] = std::move(req);
    responses_[id];
    return id;
  }

  // Runs until `done` holds (checked between rounds), the connection ends,
  // or `timeout`; returns whether `done` holds.
  bool runUntil(const std::function<bool()>& done,
                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      if (!step(50)) return done();
    }
    return true;
  }
  // Until every submitted stream closed.
  bool run(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    return runUntil([this] { return allClosed(); }, timeout);
  }
  bool allClosed() const {
    for (const auto& [id, r] : responses_) {
      if (!r.closed) return false;
    }
    return true;
  }

  TestResponse& response(int32_t id) { return responses_[id]; }
  bool goawayReceived() const { return goaway_; }

 private:
  struct Request {
    TestRequest r;
    int32_t id = 0;
    size_t sent = 0;
  };

  static H2Client* self(void* ud) { return static_cast<H2Client*>(ud); }
  static ssize_t readBody(nghttp2_session* session, int32_t id, uint8_t* buf, size_t len,
                          uint32_t* flags, nghttp2_data_source* src, void*) {
    auto* req = static_cast<Request*>(src->ptr);
    const std::string& b = *req->r.body;
    const size_t n = std::min(len, b.size() - req->sent);
    std::memcpy(buf, b.data() + req->sent, n);
    req->sent += n;
    if (req->sent == b.size()) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!req->r.trailers.empty()) {
        std::vector<nghttp2_nv> nva;
        for (const auto& [k, v] : req->r.trailers) nva.push_back(testNv(k, v));
        nghttp2_submit_trailer(session, id, nva.data(), nva.size());
        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      }
    }
    return static_cast<ssize_t>(n);
  }
  static int onHeader(nghttp2_session*, const nghttp2_frame* f, const uint8_t* name, size_t nlen,
                      const uint8_t* value, size_t vlen, uint8_t, void* ud) {
    TestResponse& r = self(ud)->responses_[f->hd.stream_id];
    std::string n(reinterpret_cast<const char*>(name), nlen);
    std::string v(reinterpret_cast<const char*>(value), vlen);
    if (f->headers.cat == NGHTTP2_HCAT_RESPONSE) {
      if (n == ":status") {
        r.status = std::stoi(v);
      } else {
        r.headers.emplace_back(n, v);
      }
    } else {
      r.trailers.emplace_back(n, v);
    }
    return 0;
  }
  static int onData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                    void* ud) {
    self(ud)->responses_[id].body.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }
  static int onClose(nghttp2_session*, int32_t id, uint32_t code, void* ud) {
    TestResponse& r = self(ud)->responses_[id];
    r.closed = true;
    r.error_code = code;
    return 0;
  }
  static int onFrame(nghttp2_session*, const nghttp2_frame* f, void* ud) {
    if (f->hd.type == NGHTTP2_GOAWAY) self(ud)->goaway_ = true;
    return 0;
  }

  std::map<int32_t, std::unique_ptr<Request>> requests_;
  std::map<int32_t, TestResponse> responses_;
  bool goaway_ = false;
};

// The application: an h2c server (prior knowledge) on 127.0.0.1:0. Each
// request is answered once complete: 200, "x-app: yes", "x-app-path", the
// request body echoed, and as trailers "x-app-trailer: <the request's
// x-req-trailer trailer>" when the request had trailers. GOAWAY after
// `goaway_after` streams on a connection when set.
class H2AppServer {
 public:
  explicit H2AppServer(int goaway_after = 0) : goaway_after_(goaway_after) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~H2AppServer() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    ::close(listen_fd_);
    std::vector<std::thread> workers;
    {
      std::lock_guard lock(mu_);
      workers = std::move(workers_);
    }
    for (auto& t : workers) t.join();
  }

  uint16_t port() const { return port_; }
  int connections() const { return connections_; }
  int streams() const { return streams_; }
  // Heads of requests received (":path" first, then the other headers).
  std::vector<Headers> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  struct Stream {
    Headers head;
    std::string path;
    std::string body;
    Headers trailers;
    std::string out;
    size_t sent = 0;
  };

  class Conn : public H2Peer {
   public:
    Conn(H2AppServer* server, int fd) : server_(server) {
      setFd(fd);
      startSession(
          /*server=*/true,
          [](nghttp2_session_callbacks* cbs) {
            nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &onBegin);
            nghttp2_session_callbacks_set_on_header_callback(cbs, &onHeader);
            nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &onData);
            nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &onFrame);
            nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &onClose);
          },
          this);
    }
    void run(const std::atomic<bool>& stop) {
      while (!stop && step(50)) {
      }
    }

   private:
    static Conn* self(void* ud) { return static_cast<Conn*>(ud); }
    static int onBegin(nghttp2_session*, const nghttp2_frame* f, void* ud) {
      if (f->hd.type == NGHTTP2_HEADERS && f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        self(ud)->streams_[f->hd.stream_id];
      }
      return 0;
    }
    static int onHeader(nghttp2_session*, const nghttp2_frame* f, const uint8_t* name, size_t nlen,
                        const uint8_t* value, size_t vlen, uint8_t, void* ud) {
      auto it = self(ud)->streams_.find(f->hd.stream_id);
      if (it == self(ud)->streams_.end()) return 0;
      std::string n(reinterpret_cast<const char*>(name), nlen);
      std::string v(reinterpret_cast<const char*>(value), vlen);
      if (f->headers.cat == NGHTTP2_HCAT_REQUEST) {
        if (n == ":path") it->second.path = v;
        it->second.head.emplace_back(n, v);
      } else {
        it->second.trailers.emplace_back(n, v);
      }
      return 0;
    }
    static int onData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                      void* ud) {
      auto it = self(ud)->streams_.find(id);
      if (it != self(ud)->streams_.end()) {
        it->second.body.append(reinterpret_cast<const char*>(data), len);
      }
      return 0;
    }
    static int onFrame(nghttp2_session* session, const nghttp2_frame* f, void* ud) {
      Conn* c = self(ud);
      if ((f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) ||
          !(f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        return 0;
      }
      auto it = c->streams_.find(f->hd.stream_id);
      if (it == c->streams_.end()) return 0;
      Stream& s = it->second;
      {
        std::lock_guard lock(c->server_->mu_);
        c->server_->requests_.push_back(s.head);
      }
      ++c->server_->streams_;
      s.out = s.body;
      static const std::string st = ":status", ok = "200", xa = "x-app", yes = "yes",
                               xp = "x-app-path";
      std::vector<nghttp2_nv> nva{testNv(st, ok), testNv(xa, yes), testNv(xp, s.path)};
      nghttp2_data_provider prd;
      prd.source.ptr = &s;
      prd.read_callback = &readOut;
      nghttp2_submit_response(session, f->hd.stream_id, nva.data(), nva.size(), &prd);
      if (c->server_->goaway_after_ > 0 && ++c->answered_ == c->server_->goaway_after_) {
        nghttp2_submit_goaway(session, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_NO_ERROR,
                              nullptr, 0);
      }
      return 0;
    }
    static ssize_t readOut(nghttp2_session* session, int32_t id, uint8_t* buf, size_t len,
                           uint32_t* flags, nghttp2_data_source* src, void*) {
      auto* s = static_cast<Stream*>(src->ptr);
      const size_t n = std::min(len, s->out.size() - s->sent);
      std::memcpy(buf, s->out.data() + s->sent, n);
      s->sent += n;
      if (s->sent == s->out.size()) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        if (!s->trailers.empty()) {
          static const std::string name = "x-app-trailer";
          const std::string value = headerValue(s->trailers, "x-req-trailer");
          nghttp2_nv t = testNv(name, value);
          nghttp2_submit_trailer(session, id, &t, 1);
          *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
        }
      }
      return static_cast<ssize_t>(n);
    }
    static int onClose(nghttp2_session*, int32_t id, uint32_t, void* ud) {
      self(ud)->streams_.erase(id);
      return 0;
    }

    H2AppServer* server_;
    std::map<int32_t, Stream> streams_;
    int answered_ = 0;
  };

  void acceptLoop() {
    while (!stop_) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++connections_;
      std::lock_guard lock(mu_);
      workers_.emplace_back([this, fd] {
        Conn c(this, fd);
        c.run(stop_);
      });
    }
  }

  int goaway_after_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> streams_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
  std::vector<Headers> requests_;
};

// --- Raw frames, for what no well-behaved client sends (floods, crafted
// HPACK).

// HPACK (RFC 7541): an integer with a `prefix_bits` prefix (5.1), the
// first byte's other bits `flags`.
inline std::string hpackInt(uint8_t flags, int prefix_bits, size_t v) {
  const size_t max = (size_t{1} << prefix_bits) - 1;
  std::string out;
  if (v < max) {
    out.push_back(static_cast<char>(flags | v));
    return out;
  }
  out.push_back(static_cast<char>(flags | max));
  v -= max;
  while (v >= 128) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
inline std::string hpackString(std::string_view s) {
  return hpackInt(0, 7, s.size()) + std::string(s);
}
// A field from the static or dynamic table (6.1).
inline std::string hpackIndexed(size_t index) { return hpackInt(0x80, 7, index); }
// A literal field, new name, added to the dynamic table (6.2.1): it
// becomes index 62 (the first dynamic entry).
inline std::string hpackLiteralIndexed(std::string_view name, std::string_view value) {
  return hpackInt(0x40, 6, 0) + hpackString(name) + hpackString(value);
}
// A literal field, new name, not indexed (6.2.2).
inline std::string hpackLiteral(std::string_view name, std::string_view value) {
  return hpackInt(0x00, 4, 0) + hpackString(name) + hpackString(value);
}
// The pseudo-headers of "GET http://app.test/`path`": :method GET,
// :scheme http (static table), :authority and :path as literals.
inline std::string hpackGet(std::string_view path = "/") {
  return hpackIndexed(2) + hpackIndexed(6) + hpackInt(0x00, 4, 1) + hpackString("app.test") +
         hpackInt(0x00, 4, 4) + hpackString(path);
}

struct RawFrame {
  uint8_t type = 0;
  uint8_t flags = 0;
  int32_t stream = 0;
  std::string payload;

  // GOAWAY / RST_STREAM: the error code.
  uint32_t errorCode() const {
    const size_t at = type == NGHTTP2_GOAWAY ? 4 : 0;
    if (payload.size() < at + 4) return UINT32_MAX;
    uint32_t v = 0;
    for (size_t i = at; i < at + 4; ++i) v = (v << 8) | static_cast<uint8_t>(payload[i]);
    return v;
  }
};

inline std::string rawFrame(uint8_t type, uint8_t flags, int32_t stream,
                            std::string_view payload = {}) {
  std::string out;
  const size_t n = payload.size();
  out.push_back(static_cast<char>(n >> 16));
  out.push_back(static_cast<char>(n >> 8));
  out.push_back(static_cast<char>(n));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>((stream >> shift) & 0xff));
  out.append(payload);
  return out;
}

inline std::string rstStreamFrame(int32_t stream, uint32_t code) {
  std::string p;
  for (int shift : {24, 16, 8, 0}) p.push_back(static_cast<char>((code >> shift) & 0xff));
  return rawFrame(NGHTTP2_RST_STREAM, 0, stream, p);
}

// A client connection (prior knowledge) that sends bytes as given: the
// preface and an empty SETTINGS first, then whatever the test writes.
// Reads (and parses frames) while it sends, so the agent's output never
// stops it.
class RawH2 {
 public:
  explicit RawH2(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) eof_ = true;
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    send(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + rawFrame(NGHTTP2_SETTINGS, 0, 0));
  }
  ~RawH2() { ::close(fd_); }

  // Sends `bytes` (reading meanwhile); false when the agent closed first.
  bool send(std::string_view bytes, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!bytes.empty() && !eof_ && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN | POLLOUT, 0};
      if (::poll(&p, 1, 50) < 0) return false;
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) readSome();
      if (p.revents & POLLOUT) {
        const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN) return false;
        if (n > 0) bytes.remove_prefix(static_cast<size_t>(n));
      }
    }
    return bytes.empty();
  }

  // Reads until a frame read so far satisfies `pred`, the agent closes, or
  // `timeout` (a hang guard); returns whether one does.
  bool readUntil(const std::function<bool(const RawFrame&)>& pred,
                 std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (const RawFrame& f : frames) {
        if (pred(f)) return true;
      }
      if (eof_ || std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) < 0) return false;
      if (p.revents != 0) readSome();
    }
  }
  // Reads until the agent closes (or `timeout`); whether it did.
  bool readToEof(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    readUntil([](const RawFrame&) { return false; }, timeout);
    return eof_;
  }

  // The first frame of `type` (on `stream`, when not negative).
  const RawFrame* find(uint8_t type, int32_t stream = -1) const {
    for (const RawFrame& f : frames) {
      if (f.type == type && (stream < 0 || f.stream == stream)) return &f;
    }
    return nullptr;
  }
  size_t count(uint8_t type, uint8_t flags = 0) const {
    size_t n = 0;
    for (const RawFrame& f : frames) {
      if (f.type == type && (f.flags & flags) == flags) ++n;
    }
    return n;
  }

  bool eof() const { return eof_; }
  std::vector<RawFrame> frames;

 private:
  void readSome() {
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN)) {
      eof_ = true;
      return;
    }
    if (n < 0) return;
    in_.append(buf, static_cast<size_t>(n));
    while (in_.size() >= 9) {
      const size_t len = (static_cast<size_t>(static_cast<uint8_t>(in_[0])) << 16) |
                         (static_cast<size_t>(static_cast<uint8_t>(in_[1])) << 8) |
                         static_cast<uint8_t>(in_[2]);
      if (in_.size() < 9 + len) break;
      RawFrame f;
      f.type = static_cast<uint8_t>(in_[3]);
      f.flags = static_cast<uint8_t>(in_[4]);
      f.stream = 0;
      for (int i = 5; i < 9; ++i) f.stream = (f.stream << 8) | static_cast<uint8_t>(in_[i]);
      f.stream &= 0x7fffffff;
      f.payload = in_.substr(9, len);
      frames.push_back(std::move(f));
      in_.erase(0, 9 + len);
    }
  }

  int fd_ = -1;
  std::string in_;
  bool eof_ = false;
};

}  // namespace siphon::agent::steal::http::testing
