// HTTP-filtered steal end to end, as root, with real clients and servers
// (docs/STEAL.md, issue 8):
//
//   client ns ──veth── pod ns                         host (root ns)
//   curl, nghttp,      nginx :80 (HTTP/1.1)           siphon-agent targeted --pid nginx
//   h2load, python     nginx :81 (HTTP/2, h2c)        siphon steal --filter-... sessions
//   WebSocket client,  python WebSocket echo :82      their local servers on 127.0.0.1:0
//   the test's own     the test's HTTP server :84     (the test's HTTP server, a python
//   HTTP/1 and HTTP/2  a greeting server :85           WebSocket echo)
//   clients            (server-first)
//
// Every answer names who gave it ("app ...", "app-h2 ...", "local-A ...")
// and echoes the request's path and x-user header, so a misrouted request
// is seen in the body it got; the servers also count what they received.
//
// Every kernel object has a unique name and an RAII owner, so a failed
// assertion still kills the processes and deletes the namespaces. Without
// root every test skips with the reason.
//
// Over 600 lines: one area's end-to-end cases sharing the namespaces, servers and agent below.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/fakes/sanitizers.h"
#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file
constexpr size_t npos = std::string::npos;

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and a veth pair, runs siphon-agent, which attaches "
    "a BPF program (or iptables chains) to another process's network namespace";

// The pod's applications.
constexpr uint16_t kHttp1Port = 80;      // nginx, HTTP/1.1
constexpr uint16_t kHttp2Port = 81;      // nginx, HTTP/2 (h2c prior knowledge)
constexpr uint16_t kWebSocketPort = 82;  // python3-websockets echo
constexpr uint16_t kBodyPort = 84;       // HttpServer (checks and sends bodies)
constexpr uint16_t kGreetingPort = 85;   // server-first: speaks before the client

// Debian's python (python3-websockets), whatever python3 comes first in PATH.
constexpr const char* kPython = "/usr/bin/python3";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

size_t countOf(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = 0; (at = haystack.find(needle, at)) != std::string::npos; at += needle.size()) {
    ++n;
  }
  return n;
}

// A blocking socket reader with its own buffer: lines, exact counts.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd) {}
  // More bytes into the buffer; false at EOF or on an error.
  bool fill() {
    char chunk[65536];
    while (true) {
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      buf_.append(chunk, static_cast<size_t>(n));
      return true;
    }
  }
  // Up to "\r\n\r\n" included; nullopt at EOF first.
  std::optional<std::string> head() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (buf_.size() > (1 << 20) || !fill()) return std::nullopt;
    }
    std::string h = buf_.substr(0, end + 4);
    buf_.erase(0, end + 4);
    return h;
  }
  std::optional<std::string> line() {
    size_t end;
    while ((end = buf_.find("\r\n")) == std::string::npos) {
      if (!fill()) return std::nullopt;
    }
    std::string l = buf_.substr(0, end);
    buf_.erase(0, end + 2);
    return l;
  }
  // Exactly n bytes, handed to `sink` as they come.
  bool take(uint64_t n, const std::function<void(const char*, size_t)>& sink) {
    while (n > 0) {
      if (buf_.empty() && !fill()) return false;
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, buf_.size()));
      sink(buf_.data(), k);
      buf_.erase(0, k);
      n -= k;
    }
    return true;
  }
  // A body framed as `headers` say (chunked, Content-Length, or to EOF when
  // `to_eof_allowed`).
  bool body(const std::map<std::string, std::string>& headers, bool to_eof_allowed,
            const std::function<void(const char*, size_t)>& sink) {
    auto te = headers.find("transfer-encoding");
    if (te != headers.end() && lower(te->second).find("chunked") != std::string::npos) {
      while (true) {
        auto size_line = line();
        if (!size_line) return false;
        uint64_t size = std::strtoull(size_line->c_str(), nullptr, 16);
        if (size == 0) {
          // Trailers, up to an empty line.
          while (true) {
            auto t = line();
            if (!t) return false;
            if (t->empty()) return true;
          }
        }
        if (!take(size, sink)) return false;
        auto crlf = line();
        if (!crlf || !crlf->empty()) return false;
      }
    }
    auto cl = headers.find("content-length");
    if (cl != headers.end()) return take(std::strtoull(cl->second.c_str(), nullptr, 10), sink);
    if (!to_eof_allowed) return true;
    while (true) {
      if (!buf_.empty()) {
        sink(buf_.data(), buf_.size());
        buf_.clear();
      }
      if (!fill()) return true;
    }
  }

 private:
  int fd_;
  std::string buf_;
};

// "name: value" lines of a head (names lowercased), after its first line.
std::map<std::string, std::string> parseHeaders(const std::string& head, std::string* first) {
  std::map<std::string, std::string> headers;
  std::istringstream in(head);
  std::string l;
  std::getline(in, l);
  if (!l.empty() && l.back() == '\r') l.pop_back();
  *first = l;
  while (std::getline(in, l)) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    size_t colon = l.find(':');
    if (colon == std::string::npos) continue;
    std::string value = l.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    headers[lower(l.substr(0, colon))] = value;
  }
  return headers;
}

// Checks a byte stream against Pattern(seed) as it passes.
class PatternCheck {
 public:
  explicit PatternCheck(uint64_t seed) : p_(seed) {}
  void operator()(const char* data, size_t n) {
    want_.resize(std::max(want_.size(), n));
    p_.fill(want_.data(), n);
    if (ok_ && std::memcmp(data, want_.data(), n) != 0) ok_ = false;
    bytes_ += n;
  }
  bool ok() const { return ok_; }
  uint64_t bytes() const { return bytes_; }

 private:
  Pattern p_;
  std::string want_;
  bool ok_ = true;
  uint64_t bytes_ = 0;
};

// ---------------------------------------------------------- HTTP servers

// What an HttpServer received.
struct SeenRequest {
  std::string method, target, user;
  uint64_t body_bytes = 0;
  bool body_ok = true;  // matched Pattern(x-seed), when the request had x-seed
};

// An HTTP/1.1 server of the test (keep-alive, one thread per connection),
// on the host's loopback (port 0: a session's local server) or on a fixed
// port of every address in a namespace (an application of the pod). Each
// answer is "<name> <method> <target> <x-user>[ bytes=N ok=0|1]\n", where
// bytes/ok describe a request body checked against Pattern(x-seed). A
// request with `x-reply-bytes: N` is answered with N bytes of
// Pattern(x-reply-seed) instead, chunked in uneven chunks; one whose path
// starts with /slow is answered only after release().
class HttpServer {
 public:
  explicit HttpServer(std::string name)
      : name_(std::move(name)),
        acceptor_(listenOnLoopback(&port_, 1024), kIoTimeoutSeconds,
                  [this](int fd) { serve(fd); }) {}
  HttpServer(std::string name, const std::string& netns, uint16_t port)
      : name_(std::move(name)),
        port_(port),
        acceptor_(listenInNetns(netns, port, 1024), kIoTimeoutSeconds,
                  [this](int fd) { serve(fd); }) {}
  // Held /slow requests are let go before the Acceptor shuts down and
  // joins the workers.
  ~HttpServer() { release(); }

  std::string to() const { return "127.0.0.1:" + std::to_string(port_); }
  int connections() const { return acceptor_.accepted(); }

  std::vector<SeenRequest> requests() const {
    std::lock_guard<std::mutex> l(mu_);
    return seen_;
  }
  // Requests received, by x-user ("" without the header).
  std::map<std::string, int> byUser() const {
    std::lock_guard<std::mutex> l(mu_);
    std::map<std::string, int> m;
    for (const auto& r : seen_) ++m[r.user];
    return m;
  }
  // Waits until `n` /slow requests are held; false after kProcessDeadline.
  bool waitHeld(int n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, kProcessDeadline, [&] { return held_ >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  static constexpr int kIoTimeoutSeconds = 30;

  void serve(int fd) {
    Reader in(fd);
    while (true) {
      auto head = in.head();
      if (!head) return;
      std::string first;
      auto headers = parseHeaders(*head, &first);
      SeenRequest seen;
      std::istringstream rl(first);
      std::string version;
      rl >> seen.method >> seen.target >> version;
      seen.user = headers.count("x-user") ? headers["x-user"] : "";
      if (lower(headers["expect"]) == "100-continue" &&
          !writeAll(fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
        return;
      }
      std::optional<PatternCheck> check;
      if (headers.count("x-seed")) check.emplace(std::stoull(headers["x-seed"]));
      uint64_t bytes = 0;
      if (!in.body(headers, false, [&](const char* d, size_t n) {
            bytes += n;
            if (check) (*check)(d, n);
          })) {
        return;
      }
      seen.body_bytes = bytes;
      seen.body_ok = !check || check->ok();
      {
        std::lock_guard<std::mutex> l(mu_);
        seen_.push_back(seen);
      }
      if (seen.target.rfind("/slow", 0) == 0) {
        std::unique_lock<std::mutex> l(mu_);
        ++held_;
        cv_.notify_all();
        cv_.wait_for(l, kProcessDeadline, [&] { return released_; });
      }
      const bool close = lower(headers["connection"]) == "close" || version == "HTTP/1.0";
      const std::string conn = close ? "Connection: close\r\n" : "";
      if (headers.count("x-reply-bytes")) {
        if (!sendChunkedPattern(fd, std::stoull(headers["x-reply-seed"]),
                                std::stoull(headers["x-reply-bytes"]), conn)) {
          return;
        }
      } else {
        std::string body = name_ + " " + seen.method + " " + seen.target + " " + seen.user;
        if (bytes > 0 || check) {
          body += " bytes=" + std::to_string(bytes) + " ok=" + (seen.body_ok ? "1" : "0");
        }
        body += "\n";
        std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\n" + conn + "\r\n" + body;
        if (!writeAll(fd, resp)) return;
      }
      if (close) return;
    }
  }

  // Chunks of uneven sizes (1 byte to ~64 KiB), then a trailer.
  static bool sendChunkedPattern(int fd, uint64_t seed, uint64_t total, const std::string& conn) {
    if (!writeAll(fd,
                  "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                  "Transfer-Encoding: chunked\r\n" +
                      conn + "\r\n")) {
      return false;
    }
    Pattern p(seed);
    std::string chunk;
    uint64_t size = 1;
    while (total > 0) {
      const uint64_t n = std::min<uint64_t>(total, size);
      chunk.resize(n);
      p.fill(chunk.data(), n);
      char line[32];
      std::snprintf(line, sizeof line, "%llx\r\n", static_cast<unsigned long long>(n));
      if (!writeAll(fd, line) || !writeAll(fd, chunk) || !writeAll(fd, "\r\n")) return false;
      total -= n;
      size = size * 7 % 65521 + 1;
    }
    return writeAll(fd, "0\r\nx-trailer: done\r\n\r\n");
  }

  std::string name_;
  uint16_t port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<SeenRequest> seen_;
  int held_ = 0;
  bool released_ = false;
  Acceptor acceptor_;  // last: its workers use the members above
};

// A server-first application (SMTP-like): a greeting as soon as a client
// connects, then "250 <line>" for every line it gets.
void greetingServe(int fd) {
  if (!writeAll(fd, "220 pod greeting\r\n")) return;
  Reader in(fd);
  while (auto l = in.line()) {
    if (!writeAll(fd, "250 " + *l + "\r\n")) return;
  }
}

// ------------------------------------------------------------ HTTP/2 client

// The test's own HTTP/2 client (nghttp2, prior knowledge) over a blocking
// socket: many streams on one connection, each with its own headers, which
// h2load and nghttp cannot do (their headers are per run). The answers by
// stream, in the order the requests were submitted.
struct H2Answer {
  int status = 0;
  std::string body;
  bool closed = false;
  uint32_t error = 0;
};

class H2Client {
 public:
  // `requests`: (path, x-user or "" for none). A failure is in error().
  std::vector<H2Answer> run(int fd, const std::string& authority,
                            const std::vector<std::pair<std::string, std::string>>& requests) {
    fd_ = fd;
    nghttp2_session_callbacks* cbs;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_send_callback(cbs, &H2Client::onSend);
    nghttp2_session_callbacks_set_on_header_callback(cbs, &H2Client::onHeader);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &H2Client::onData);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &H2Client::onClose);
    nghttp2_session* s;
    nghttp2_session_client_new(&s, cbs, this);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, nullptr, 0);
    std::vector<int32_t> ids;
    for (const auto& [path, user] : requests) {
      std::vector<nghttp2_nv> nva = {nv(":method", "GET"), nv(":scheme", "http"),
                                     nv(":authority", authority), nv(":path", path)};
      if (!user.empty()) nva.push_back(nv("x-user", user));
      int32_t id = nghttp2_submit_request(s, nullptr, nva.data(), nva.size(), nullptr, nullptr);
      ids.push_back(id);
      answers_[id];
      ++open_;
    }
    const auto deadline = Clock::now() + kProcessDeadline;
    while (open_ > 0 && error_.empty() && Clock::now() < deadline) {
      if (int rv = nghttp2_session_send(s); rv != 0) {
        error_ = std::string("send: ") + nghttp2_strerror(rv);
        break;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[65536];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) {
        error_ = n == 0 ? "EOF with streams open" : std::string("read: ") + strerror(errno);
        break;
      }
      ssize_t used =
          nghttp2_session_mem_recv(s, reinterpret_cast<uint8_t*>(buf), static_cast<size_t>(n));
      if (used < 0) error_ = std::string("recv: ") + nghttp2_strerror(static_cast<int>(used));
    }
    if (open_ > 0 && error_.empty()) error_ = std::to_string(open_) + " streams never ended";
    nghttp2_session_del(s);
    std::vector<H2Answer> out;
    for (int32_t id : ids) out.push_back(answers_[id]);
    return out;
  }
  const std::string& error() const { return error_; }

 private:
  // Points at `value`: a view, so that a literal is not copied into a
  // temporary string that is gone before nghttp2 reads it.
  static nghttp2_nv nv(const char* name, std::string_view value) {
    return {reinterpret_cast<uint8_t*>(const_cast<char*>(name)),
            reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), std::strlen(name),
            value.size(), NGHTTP2_NV_FLAG_NONE};
  }
  static ssize_t onSend(nghttp2_session*, const uint8_t* data, size_t len, int, void* self) {
    auto* c = static_cast<H2Client*>(self);
    if (!writeAll(c->fd_, reinterpret_cast<const char*>(data), len)) {
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    return static_cast<ssize_t>(len);
  }
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* self) {
    auto* c = static_cast<H2Client*>(self);
    if (std::string_view(reinterpret_cast<const char*>(name), namelen) == ":status") {
      c->answers_[frame->hd.stream_id].status =
          std::atoi(std::string(reinterpret_cast<const char*>(value), valuelen).c_str());
    }
    return 0;
  }
  static int onData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                    void* self) {
    static_cast<H2Client*>(self)->answers_[id].body.append(reinterpret_cast<const char*>(data),
                                                           len);
    return 0;
  }
  static int onClose(nghttp2_session*, int32_t id, uint32_t error, void* self) {
    auto* c = static_cast<H2Client*>(self);
    c->answers_[id].closed = true;
    c->answers_[id].error = error;
    --c->open_;
    return 0;
  }

  int fd_ = -1;
  std::map<int32_t, H2Answer> answers_;
  int open_ = 0;
  std::string error_;
};

// ------------------------------------------------------------ siphon steal

// `siphon steal` with its stderr in a file: a load makes thousands of
// per-request lines, and a file never blocks the CLI nor needs a reader.
class StealCli {
 public:
  StealCli(std::vector<std::string> argv, const std::string& log_path) : log_path_(log_path) {
    Fd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    child_ = spawn(argv, cleanEnv(), -1, log.get());
  }
  std::string log() const { return readFile(log_path_); }
  // Waits until its log has `text` (true), or it exits / kProcessDeadline.
  bool waitFor(const std::string& text, bool case_insensitive = false) {
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      const std::string l = case_insensitive ? lower(log()) : log();
      if (l.find(text) != std::string::npos) return true;
      if (exited()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  bool exited() {
    if (!code_) code_ = child_.waitUntil(Clock::now());
    return code_.has_value();
  }
  // The exit code (nullopt: still running after kProcessDeadline).
  std::optional<int> wait() {
    if (!code_) code_ = child_.waitUntil(Clock::now() + kProcessDeadline);
    return code_;
  }
  void signal(int sig) {
    if (!exited() && child_.pid() > 0) ::kill(child_.pid(), sig);
  }

 private:
  std::string log_path_;
  Child child_;
  std::optional<int> code_;
};

// ------------------------------------------------------------ the fixture

// nginx's master, stopped with SIGTERM (a SIGKILLed master leaves its
// workers running), SIGKILL if it is still there after 5 s.
class Nginx {
 public:
  Nginx() = default;
  Nginx& operator=(Child c) {
    child_ = std::move(c);
    return *this;
  }
  ~Nginx() {
    if (child_.pid() <= 0) return;
    ::kill(child_.pid(), SIGTERM);
    child_.waitUntil(Clock::now() + std::chrono::seconds(5));
  }
  Child& child() { return child_; }
  pid_t pid() const { return child_.pid(); }

 private:
  Child child_;
};

// Polls `get` until it equals `want` (the application logs a request just
// after answering it); the last value.
template <typename T>
T eventually(const std::function<T()>& get, const T& want) {
  T got;
  fakes::eventually([&] { return (got = get()) == want; }, std::chrono::seconds(5),
                    std::chrono::milliseconds(20));
  return got;
}

class HttpStealTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    rlimit rl{16384, 16384};
    ::setrlimit(RLIMIT_NOFILE, &rl);
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    pod_.emplace();
    client_.emplace();
    ASSERT_TRUE(pod_->created() && client_->created());
    PodLink link;
    ASSERT_TRUE(linkPodToClient(*pod_, *client_, "hs", &link));
    pod_ip_ = link.pod_ip;

    ASSERT_NO_FATAL_FAILURE(startNginx());
    ASSERT_NO_FATAL_FAILURE(writeScripts());
    ASSERT_NO_FATAL_FAILURE(startWebSocketEcho("app", pod_->name(), kWebSocketPort, &ws_app_));
    body_app_.emplace("app", pod_->name(), kBodyPort);
    greeting_app_.emplace(listenInNetns(pod_->name(), kGreetingPort, 128), 10, greetingServe);
    ASSERT_NO_FATAL_FAILURE(startAgent());
  }

  void TearDown() override {
    steals_.clear();  // SIGKILLed and reaped
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
    if (HasFailure() && dir_) {
      std::cerr << "--- nginx error log\n"
                << readFile(dir_->path() + "/nginx/error.log") << "---\n";
    }
  }

  // nginx in the pod: HTTP/1.1 on kHttp1Port, HTTP/2 with prior knowledge
  // on kHttp2Port; every request logged as "<port> <x-user> <uri>
  // <connection number>".
  void startNginx() {
    const std::string d = dir_->path() + "/nginx";
    std::filesystem::create_directories(d);
    dir_->file("nginx/nginx.conf", R"(
user root;
worker_processes 1;
pid )" + d + R"(/nginx.pid;
error_log )" + d + R"(/error.log;
daemon off;
events { worker_connections 4096; }
http {
  log_format siphon '$server_port <$http_x_user> $request_uri $connection';
  access_log )" + d + R"(/access.log siphon;
  client_body_temp_path )" + d + R"(;
  proxy_temp_path )" + d + R"(;
  fastcgi_temp_path )" + d + R"(;
  uwsgi_temp_path )" + d + R"(;
  scgi_temp_path )" + d + R"(;
  keepalive_requests 1000000;
  client_max_body_size 0;
  server {
    listen )" + std::to_string(kHttp1Port) +
                                       R"( backlog=4096;
    location / { return 200 "app $request_uri $http_x_user\n"; }
  }
  server {
    listen )" + std::to_string(kHttp2Port) +
                                       R"( http2 backlog=4096;
    location / { return 200 "app-h2 $request_uri $http_x_user\n"; }
    location /files/ { root )" + d + R"(; }
  }
}
)");
    nginx_ = spawn({"ip", "netns", "exec", pod_->name(), "nginx", "-e", d + "/error.log", "-p", d,
                    "-c", d + "/nginx.conf"},
                   std::nullopt, -1, -1);
    ASSERT_GT(nginx_.pid(), 0);
    // `ip netns exec` execs in place: the child becomes nginx's master,
    // the agent's target.
    const auto deadline = Clock::now() + kProcessDeadline;
    std::string got;
    while (Clock::now() < deadline) {
      if (nginx_.child().waitUntil(Clock::now()))
        FAIL() << "nginx exited: " << readFile(d + "/error.log");
      if (netnsInodeOf(nginx_.pid()) == pod_->inode()) {
        got = curl({url(kHttp1Port, "/ready")});
        if (got == "app /ready \n") break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(got, "app /ready \n");
    ASSERT_EQ(curl({"--http2-prior-knowledge", url(kHttp2Port, "/ready")}), "app-h2 /ready \n");
  }

  void writeScripts() {
    // Echoes each message as "<name>:<message>"; prints its port once up.
    ws_server_ = dir_->file("ws_server.py", R"(
import asyncio, sys, websockets
async def main():
    name, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    async def echo(ws, path=None):
        async for m in ws:
            await ws.send(name + ":" + m)
    async with websockets.serve(echo, host, port) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()
asyncio.run(main())
)");
    // Connects with the given headers, sends three messages, prints each
    // answer on a line.
    ws_client_ = dir_->file("ws_client.py", R"(
import asyncio, sys, websockets
async def main():
    headers = [tuple(h.split(": ", 1)) for h in sys.argv[2:]]
    async with websockets.connect(sys.argv[1], extra_headers=headers, open_timeout=10) as ws:
        for i in range(3):
            await ws.send("m%d" % i)
            print(await asyncio.wait_for(ws.recv(), 10), flush=True)
asyncio.run(main())
)");
  }

  // A WebSocket echo server (in `netns`, or on the host when empty); its
  // port.
  uint16_t startWebSocketEcho(const std::string& name, const std::string& netns, uint16_t port,
                              std::unique_ptr<Proc>* proc) {
    std::vector<std::string> argv;
    if (!netns.empty()) argv = {"ip", "netns", "exec", netns};
    for (const std::string& a :
         {std::string(kPython), ws_server_, name,
          std::string(netns.empty() ? "127.0.0.1" : "0.0.0.0"), std::to_string(port)}) {
      argv.push_back(a);
    }
    *proc = std::make_unique<Proc>(argv, cleanEnv());
    EXPECT_TRUE((*proc)->readUntil([](const std::string& out, const std::string&) {
      return out.find('\n') != std::string::npos;
    })) << "WebSocket server "
        << name << " did not start: " << (*proc)->err;
    return static_cast<uint16_t>(std::atoi((*proc)->out.c_str()));
  }

  void startAgent(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {"--listen",
                                     "127.0.0.1:0",
                                     "--token-file",
                                     token_file_,
                                     "--first-client-timeout",
                                     "120s",
                                     "--session-grace",
                                     "1s",
                                     "--log-level",
                                     "debug",
                                     "--steal-backend",
                                     GetParam()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (const char* a : {"targeted", "--pid"}) argv.push_back(a);
    argv.push_back(std::to_string(nginx_.pid()));
    agent_.emplace(argv, cleanEnv(), dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  // `siphon steal` with `args`; waits for "stealing port" (or its exit:
  // then the caller checks the code).
  StealCli* steal(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent",   endpoint_,
                                     "--token-file", token_file_, "steal"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = dir_->path() + "/steal-" + std::to_string(steals_.size()) + ".log";
    steals_.push_back(std::make_unique<StealCli>(argv, log));
    StealCli* s = steals_.back().get();
    s->waitFor("stealing port");
    return s;
  }

  // `siphon steal` of `port` to `to` for the requests `filter_header`
  // matches, in *s; a failure, with its log, unless it is stealing the
  // port.
  ::testing::AssertionResult stealFiltered(uint16_t port, const std::string& to,
                                           const std::string& filter_header, StealCli** s) {
    const std::string p = std::to_string(port);
    *s = steal({"--port", p, "--to", to, "--filter-header", filter_header});
    if ((*s)->waitFor("stealing port " + p)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not stealing port " << p << ":\n" << (*s)->log();
  }

  std::string url(uint16_t port, const std::string& path) const {
    return "http://" + pod_ip_ + ":" + std::to_string(port) + path;
  }

  // A command in the client namespace.
  Result inClient(std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"ip", "netns", "exec", client_->name()});
    return run(argv);
  }

  // curl from the client namespace; the body, or "curl exit N: ..." on a
  // failure.
  std::string curl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"curl", "-sS", "--max-time", "10"};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r = inClient(argv);
    if (r.exit_code != 0) return "curl exit " + std::to_string(r.exit_code) + ": " + r.err;
    return r.out;
  }

  // nginx's access log lines for `port`, as "<user> <uri> <connection>".
  std::vector<std::string> appLog(uint16_t port) {
    std::vector<std::string> lines;
    std::istringstream in(readFile(dir_->path() + "/nginx/access.log"));
    std::string l;
    const std::string prefix = std::to_string(port) + " ";
    while (std::getline(in, l)) {
      if (l.rfind(prefix, 0) == 0) lines.push_back(l.substr(prefix.size()));
    }
    return lines;
  }
  using UserCounts = std::map<std::string, int>;
  // What the application got by x-user, once it is `want` (or 5 s).
  UserCounts usersAtApp(uint16_t port, const UserCounts& want) {
    return eventually<UserCounts>([&] { return appByUser(port); }, want);
  }
  UserCounts appByUser(uint16_t port) {
    UserCounts m;
    for (const std::string& l : appLog(port)) {
      if (l.find("/ready") != std::string::npos) continue;
      // nginx logs an absent header as "-".
      const std::string user = l.substr(1, l.find('>') - 1);
      ++m[user == "-" ? "" : user];
    }
    return m;
  }

  // A TCP connection from the client namespace to the pod's `port`.
  Fd connectToPod(uint16_t port) {
    Fd fd(socketInNetns(client_->name(), AF_INET, SOCK_STREAM));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, pod_ip_.c_str(), &a.sin_addr);
    if (fd.get() < 0 || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ADD_FAILURE() << "connect to the pod's port " << port << ": " << strerror(errno);
      return Fd();
    }
    setTimeouts(fd.get(), 15);
    return fd;
  }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> pod_, client_;
  std::string pod_ip_;
  Nginx nginx_;
  std::string ws_server_, ws_client_;
  std::unique_ptr<Proc> ws_app_;
  std::optional<HttpServer> body_app_;
  std::optional<Acceptor> greeting_app_;  // greetingServe on kGreetingPort
  std::optional<Agent> agent_;
  std::string endpoint_;
  std::vector<std::unique_ptr<StealCli>> steals_;
};

std::vector<std::string> splitLines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  return lines;
}

// ------------------------------------------------------------------ HTTP/1

// One curl, one keep-alive connection (--next reuses it), requests with
// and without the header alternating: each answered by the right side, in
// order, and the connection was never reopened.
TEST_P(HttpStealTest, KeepAliveRequestsAreRoutedOneByOneOnOneConnection) {
  HttpServer local("local-A");
  StealCli* s;
  ASSERT_TRUE(stealFiltered(80, local.to(), "x-user: ^alice$", &s));

  std::vector<std::string> argv = {"curl", "-sS", "--max-time", "10"};
  const std::vector<std::string> users = {"alice", "", "alice", "bob", "", "alice"};
  for (size_t i = 0; i < users.size(); ++i) {
    if (i > 0) argv.push_back("--next");
    if (!users[i].empty()) argv.insert(argv.end(), {"-H", "x-user: " + users[i]});
    argv.insert(argv.end(), {"-w", "conn=%{num_connects}\n", url(80, "/r" + std::to_string(i))});
  }
  Result r = inClient(argv);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out,
            "local-A GET /r0 alice\nconn=1\n"
            "app /r1 \nconn=0\n"
            "local-A GET /r2 alice\nconn=0\n"
            "app /r3 bob\nconn=0\n"
            "app /r4 \nconn=0\n"
            "local-A GET /r5 alice\nconn=0\n");
  EXPECT_EQ(local.byUser(), (std::map<std::string, int>{{"alice", 3}}));
  EXPECT_EQ(usersAtApp(80, {{"", 2}, {"bob", 1}}), (UserCounts{{"", 2}, {"bob", 1}}));

  // Two more client connections, one passthrough request each: the agent
  // reuses its connection to the application (a pool), so the five
  // passthrough requests share it.
  EXPECT_EQ(curl({url(80, "/again1")}), "app /again1 \n");
  EXPECT_EQ(curl({"-H", "x-user: carol", url(80, "/again2")}), "app /again2 carol\n");
  std::set<std::string> app_connections;
  for (const std::string& l : appLog(80)) {
    if (l.find("/ready") == std::string::npos) app_connections.insert(l.substr(l.rfind(' ') + 1));
  }
  EXPECT_EQ(app_connections.size(), 1u) << "the application saw a connection per request?";
  // The session printed a line per request it got (once answered), not
  // for the others.
  EXPECT_TRUE(s->waitFor(" /r5 ")) << s->log();
  EXPECT_EQ(countOf(s->log(), "/r0"), 1u) << s->log();
  EXPECT_EQ(countOf(s->log(), "/r1"), 0u) << s->log();
}

// Pipelining: eight requests written at once on one connection, half of
// them stolen; the answers come back complete and in the order asked.
TEST_P(HttpStealTest, PipelinedRequestsAreAnsweredInOrder) {
  HttpServer local("local-A");
  StealCli* s;
  ASSERT_TRUE(stealFiltered(80, local.to(), "x-user: ^alice$", &s));
  Fd c = connectToPod(80);
  ASSERT_GE(c.get(), 0);
  std::string requests, want;
  for (int i = 0; i < 8; ++i) {
    const bool mine = i % 3 != 1;
    const std::string path = "/p" + std::to_string(i);
    requests += "GET " + path + " HTTP/1.1\r\nHost: pod\r\n" + (mine ? "X-User: alice\r\n" : "") +
                (i == 7 ? "Connection: close\r\n" : "") + "\r\n";
    want += mine ? "local-A GET " + path + " alice\n" : "app " + path + " \n";
  }
  ASSERT_TRUE(writeAll(c.get(), requests));
  Reader in(c.get());
  std::string got;
  for (int i = 0; i < 8; ++i) {
    auto head = in.head();
    ASSERT_TRUE(head) << "answer " << i << " missing; so far:\n" << got;
    std::string status;
    auto headers = parseHeaders(*head, &status);
    EXPECT_THAT(status, HasSubstr(" 200 ")) << *head;
    ASSERT_TRUE(in.body(headers, false, [&](const char* d, size_t n) { got.append(d, n); }));
  }
  EXPECT_EQ(got, want);
  std::string rest;
  EXPECT_TRUE(readAll(c.get(), &rest));  // the server closes after the last one
  EXPECT_EQ(rest, "");
}

// Filters on path and method, any-of: a request matching either is stolen.
TEST_P(HttpStealTest, PathAndMethodFiltersCombineAllOfOrAnyOf) {
  HttpServer all("local-all"), any("local-any");
  StealCli* a = steal(
      {"--port", "80", "--to", all.to(), "--filter-path", "^/api/", "--filter-method", "POST"});
  ASSERT_TRUE(a->waitFor("stealing port 80")) << a->log();
  StealCli* b = steal({"--port", "80", "--to", any.to(), "--filter-path", "^/admin",
                       "--filter-method", "DELETE", "--filter-any"});
  ASSERT_TRUE(b->waitFor("stealing port 80")) << b->log();
  EXPECT_EQ(curl({"-X", "POST", url(80, "/api/x?q=1")}), "local-all POST /api/x?q=1 \n");
  EXPECT_EQ(curl({url(80, "/api/x")}), "app /api/x \n");  // GET: not all of them
  EXPECT_EQ(curl({"-X", "POST", url(80, "/web")}), "app /web \n");
  EXPECT_EQ(curl({url(80, "/admin/users")}), "local-any GET /admin/users \n");
  EXPECT_EQ(curl({"-X", "DELETE", url(80, "/web")}), "local-any DELETE /web \n");
  // The path regex also sees the query.
  EXPECT_EQ(curl({url(80, "/x?next=/admin")}), "app /x?next=/admin \n");
}

// ------------------------------------------------------------------ HTTP/2

// nghttp with prior knowledge and with an h2c upgrade, and h2load: streams
// with the header to the local server, the others to the application.
TEST_P(HttpStealTest, Http2PriorKnowledgeAndUpgradeAreRoutedPerStream) {
  HttpServer local("local-A");
  StealCli* s;
  ASSERT_TRUE(stealFiltered(81, local.to(), "x-user: ^alice$", &s));

  Result r = inClient({"nghttp", "-t", "10", "-H", "x-user: alice", url(81, "/pk")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "local-A GET /pk alice\n");
  r = inClient({"nghttp", "-t", "10", url(81, "/pk-app")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "app-h2 /pk-app \n");
  // h2c upgrade: the first request goes as HTTP/1.1 with Upgrade: h2c and
  // is answered as stream 1 after the 101.
  r = inClient({"nghttp", "-u", "-t", "10", "-H", "x-user: alice", url(81, "/up")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "local-A GET /up alice\n");
  r = inClient({"nghttp", "-u", "-t", "10", url(81, "/up-app")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "app-h2 /up-app \n");
  // curl's upgrade too (HTTP/2 once upgraded, not an HTTP/1.1 answer).
  EXPECT_EQ(
      curl({"--http2", "-H", "x-user: alice", "-w", "HTTP/%{http_version}\n", url(81, "/curl-up")}),
      "local-A GET /curl-up alice\nHTTP/2\n");
  EXPECT_EQ(curl({"--http2", "-w", "HTTP/%{http_version}\n", url(81, "/curl-up")}),
            "app-h2 /curl-up \nHTTP/2\n");

  // Several streams of one connection, concurrent: nghttp sends its URIs
  // on one connection; one header set, so the path tells them apart here.
  StealCli* p = steal({"--port", "81", "--to", local.to(), "--filter-path", "^/mine/"});
  ASSERT_TRUE(p->waitFor("stealing port 81")) << p->log();
  r = inClient({"nghttp", "-t", "10", url(81, "/mine/1"), url(81, "/other/1"), url(81, "/mine/2"),
                url(81, "/other/2")});
  EXPECT_EQ(r.exit_code, 0) << r;
  auto lines = splitLines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"app-h2 /other/1 ", "app-h2 /other/2 ",
                                             "local-A GET /mine/1 ", "local-A GET /mine/2 "}))
      << r.out;

  // h2load: 400 requests on 4 connections, 10 streams in flight on each.
  r = inClient(
      {"h2load", "-n", "400", "-c", "4", "-m", "10", "-H", "x-user: alice", url(81, "/load")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("400 succeeded, 0 failed, 0 errored, 0 timeout")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("status codes: 400 2xx")) << r.out;
  r = inClient({"h2load", "-n", "400", "-c", "4", "-m", "10", url(81, "/load-app")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_THAT(r.out, HasSubstr("400 succeeded, 0 failed, 0 errored, 0 timeout")) << r.out;
  int local_load = 0;
  for (const auto& req : local.requests()) local_load += req.target == "/load";
  EXPECT_EQ(local_load, 400);
  EXPECT_EQ(eventually<int>(
                [&] {
                  int n = 0;
                  for (const std::string& l : appLog(81)) n += l.find(" /load-app ") != npos;
                  return n;
                },
                400),
            400);
}

// ------------------------------------------------------------------ WebSocket

// A WebSocket upgrade follows the request: bridged to the session's local
// echo when the header matches, to the application's echo when not.
TEST_P(HttpStealTest, WebSocketFollowsTheUpgradeRequest) {
  std::unique_ptr<Proc> local_ws;
  const uint16_t local_port = startWebSocketEcho("local-A", "", 0, &local_ws);
  ASSERT_GT(local_port, 0);
  StealCli* s;
  ASSERT_TRUE(stealFiltered(82, "127.0.0.1:" + std::to_string(local_port), "x-user: ^alice$", &s));
  const std::string ws_url = "ws://" + pod_ip_ + ":82/chat";
  Result r = inClient({kPython, ws_client_, ws_url, "x-user: alice"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "local-A:m0\nlocal-A:m1\nlocal-A:m2\n");
  r = inClient({kPython, ws_client_, ws_url, "x-user: bob"});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "app:m0\napp:m1\napp:m2\n");
  r = inClient({kPython, ws_client_, ws_url});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "app:m0\napp:m1\napp:m2\n");
}

// ------------------------------------------------------------- two sessions

// Two sessions share port 81 with different header values; a third value
// goes to the application. 10,000 requests: three h2load runs at once
// (one per value: h2load sends one header set per run) and the test's own
// HTTP/2 client mixing the three values on each of its connections. Zero
// errors, and every request reached exactly its own side.
TEST_P(HttpStealTest, TwoSessionsEachGetExactlyTheirRequestsUnderLoad) {
  HttpServer alice("local-A"), bob("local-B");
  StealCli* a;
  ASSERT_TRUE(stealFiltered(81, alice.to(), "x-user: ^alice$", &a));
  StealCli* b;
  ASSERT_TRUE(stealFiltered(81, bob.to(), "X-User: ^bob$", &b));

  // 3 x 3,000 by h2load, 1,000 mixed (4 connections x 250 streams).
  auto h2load = [&](const std::string& user) {
    return std::async(std::launch::async, [this, user] {
      return inClient({"h2load", "-n", "3000", "-c", "4", "-m", "16", "-H", "x-user: " + user,
                       url(81, "/h2load-" + user)});
    });
  };
  auto ra = h2load("alice"), rb = h2load("bob"), rc = h2load("carol");
  const std::vector<std::string> users = {"alice", "bob", "carol"};
  std::vector<std::future<std::string>> mixed;
  for (int c = 0; c < 4; ++c) {
    mixed.push_back(std::async(std::launch::async, [this, c, &users] {
      std::vector<std::pair<std::string, std::string>> reqs;
      for (int i = 0; i < 250; ++i) {
        reqs.emplace_back("/mixed/" + std::to_string(c) + "/" + std::to_string(i), users[i % 3]);
      }
      Fd fd = connectToPod(81);
      if (fd.get() < 0) return std::string("no connection");
      H2Client client;
      auto answers = client.run(fd.get(), pod_ip_ + ":81", reqs);
      if (!client.error().empty()) return "connection " + std::to_string(c) + ": " + client.error();
      std::string wrong;
      for (size_t i = 0; i < answers.size(); ++i) {
        const std::string& u = reqs[i].second;
        const std::string who = u == "alice" ? "local-A GET "
                                : u == "bob" ? "local-B GET "
                                             : "app-h2 ";
        const std::string want = who + reqs[i].first + " " + u + "\n";
        if (answers[i].status != 200 || answers[i].body != want) {
          wrong += reqs[i].first + " (" + u + "): " + std::to_string(answers[i].status) + " " +
                   answers[i].body + "\n";
        }
      }
      return wrong;
    }));
  }
  for (auto* f : {&ra, &rb, &rc}) {
    Result r = f->get();
    EXPECT_EQ(r.exit_code, 0) << r;
    EXPECT_THAT(r.out, HasSubstr("3000 succeeded, 0 failed, 0 errored, 0 timeout")) << r.out;
    EXPECT_THAT(r.out, HasSubstr("status codes: 3000 2xx, 0 3xx, 0 4xx, 0 5xx")) << r.out;
  }
  for (auto& m : mixed) EXPECT_EQ(m.get(), "") << "misrouted or failed streams";

  // 3,000 + 334 (or 333) of its own value each, nothing else.
  EXPECT_EQ(alice.byUser(), (std::map<std::string, int>{{"alice", 3000 + 4 * 84}}));
  EXPECT_EQ(bob.byUser(), (std::map<std::string, int>{{"bob", 3000 + 4 * 83}}));
  const UserCounts carol = {{"carol", 3000 + 4 * 83}};
  EXPECT_EQ(usersAtApp(81, carol), carol);
}

// ----------------------------------------------------------------- bodies

// Chunked request and response bodies, both ways, stolen and passed
// through, byte-exact; and 100 MiB uploads the same way.
TEST_P(HttpStealTest, ChunkedBodiesAndAHundredMebibyteUploadArriveByteExact) {
  HttpServer local("local-A");
  StealCli* s;
  ASSERT_TRUE(stealFiltered(84, local.to(), "x-user: ^alice$", &s));

  // A file of Pattern(seed) bytes for curl to send.
  auto patternFile = [&](const std::string& name, uint64_t seed, uint64_t size) {
    const std::string path = dir_->path() + "/" + name;
    std::ofstream out(path, std::ios::binary);
    Pattern p(seed);
    std::string buf(1 << 20, '\0');
    for (uint64_t left = size; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      p.fill(buf.data(), n);
      out.write(buf.data(), static_cast<std::streamsize>(n));
      left -= n;
    }
    return path;
  };
  auto fileMatches = [](const std::string& path, uint64_t seed, uint64_t size) {
    std::ifstream in(path, std::ios::binary);
    PatternCheck check(seed);
    std::string buf(1 << 20, '\0');
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      if (in.gcount() > 0) check(buf.data(), static_cast<size_t>(in.gcount()));
    }
    return check.ok() && check.bytes() == size;
  };

  constexpr uint64_t kChunked = 3'000'017;
  const std::string small = patternFile("small.bin", 11, kChunked);
  for (const std::string user : {"alice", "bob"}) {
    const std::string who = user == "alice" ? "local-A" : "app";
    // curl sends a chunked body when told so.
    EXPECT_EQ(curl({"-H", "x-user: " + user, "-H", "x-seed: 11", "-H", "Transfer-Encoding: chunked",
                    "--data-binary", "@" + small, url(84, "/chunked-up")}),
              who + " POST /chunked-up " + user + " bytes=" + std::to_string(kChunked) + " ok=1\n");
    // A chunked answer, uneven chunks and a trailer.
    const std::string got = dir_->path() + "/down-" + user;
    EXPECT_EQ(
        curl({"-H", "x-user: " + user, "-H", "x-reply-bytes: " + std::to_string(kChunked), "-H",
              "x-reply-seed: 12", "-o", got, "-w", "%{http_code}", url(84, "/chunked-down")}),
        "200");
    EXPECT_TRUE(fileMatches(got, 12, kChunked)) << "the chunked answer to " << user << " differs";
  }

  // 16 MiB in a sanitizer build, where 100 MiB through the instrumented
  // agent and CLI outlasts curl's minute.
  constexpr uint64_t kBig = fakes::kSanitizedBuild ? 16ull << 20 : 100ull << 20;
  const std::string big = patternFile("big.bin", 13, kBig);
  for (const std::string user : {"alice", "bob"}) {
    const std::string who = user == "alice" ? "local-A" : "app";
    EXPECT_EQ(curl({"--max-time", "60", "-H", "x-user: " + user, "-H", "x-seed: 13",
                    "--data-binary", "@" + big, url(84, "/big")}),
              who + " POST /big " + user + " bytes=" + std::to_string(kBig) + " ok=1\n");
  }
  std::filesystem::remove(big);
}

// ------------------------------------------------------- not HTTP at all

// A server-first protocol on a port with a filtered steal: the client
// sends nothing until it has the greeting; after the detection timeout the
// agent passes the connection through and the conversation works. A
// client-first protocol that is not HTTP passes through at once.
TEST_P(HttpStealTest, ServerFirstAndNonHttpProtocolsPassThroughUntouched) {
  HttpServer local("local-A");
  StealCli* s;
  ASSERT_TRUE(stealFiltered(85, local.to(), "x-user: ^alice$", &s));

  Fd c = connectToPod(85);
  ASSERT_GE(c.get(), 0);
  Reader in(c.get());
  const auto t0 = Clock::now();
  EXPECT_EQ(in.line(), "220 pod greeting");
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE(writeAll(c.get(), "HELO siphon\r\n"));
  EXPECT_EQ(in.line(), "250 HELO siphon");
  // Looks like HTTP now, but the connection was decided: untouched.
  ASSERT_TRUE(writeAll(c.get(), "GET / HTTP/1.1\r\n"));
  EXPECT_EQ(in.line(), "250 GET / HTTP/1.1");

  // Client-first, binary: passed through as soon as it is not HTTP.
  Fd d = connectToPod(85);
  ASSERT_GE(d.get(), 0);
  const std::string binary("\x16\x03\x01\x00\x05hello\r\n", 12);
  ASSERT_TRUE(writeAll(d.get(), binary));
  Reader din(d.get());
  EXPECT_EQ(din.line(), "220 pod greeting");
  EXPECT_EQ(din.line(), "250 " + binary.substr(0, binary.size() - 2));
  EXPECT_EQ(local.connections(), 0);
}

// --------------------------------------------------------- subscriptions

// An unfiltered steal and a filtered one of the same port conflict, in
// either order; two filtered ones share it.
TEST_P(HttpStealTest, UnfilteredAndFilteredStealsOfOnePortArePortBusy) {
  HttpServer local("local-A"), other("local-B");
  StealCli* whole = steal({"--port", "80", "--to", local.to()});
  ASSERT_TRUE(whole->waitFor("stealing port 80")) << whole->log();
  StealCli* filtered =
      steal({"--port", "80", "--to", other.to(), "--filter-header", "x-user: ^bob$"});
  EXPECT_EQ(filtered->wait(), 1) << filtered->log();
  EXPECT_THAT(filtered->log(), HasSubstr("PORT_BUSY")) << filtered->log();
  EXPECT_THAT(filtered->log(), HasSubstr("already stolen by session")) << filtered->log();
  EXPECT_EQ(curl({"-H", "x-user: bob", url(80, "/w")}), "local-A GET /w bob\n");
  whole->signal(SIGINT);
  EXPECT_EQ(whole->wait(), 0) << whole->log();

  StealCli* f1;
  ASSERT_TRUE(stealFiltered(80, local.to(), "x-user: ^alice$", &f1));
  StealCli* f2;
  ASSERT_TRUE(stealFiltered(80, other.to(), "x-user: ^bob$", &f2));
  StealCli* whole2 = steal({"--port", "80", "--to", local.to()});
  EXPECT_EQ(whole2->wait(), 1) << whole2->log();
  EXPECT_THAT(whole2->log(), HasSubstr("PORT_BUSY")) << whole2->log();
  EXPECT_THAT(whole2->log(), HasSubstr("has filtered steals")) << whole2->log();
  EXPECT_EQ(curl({"-H", "x-user: alice", url(80, "/f")}), "local-A GET /f alice\n");
  EXPECT_EQ(curl({"-H", "x-user: bob", url(80, "/f")}), "local-B GET /f bob\n");
  EXPECT_EQ(curl({url(80, "/f")}), "app /f \n");

  // Once the filtered ones end, the port may be stolen whole again.
  f1->signal(SIGINT);
  f2->signal(SIGINT);
  EXPECT_EQ(f1->wait(), 0) << f1->log();
  EXPECT_EQ(f2->wait(), 0) << f2->log();
  EXPECT_EQ(curl({"-H", "x-user: alice", url(80, "/after")}), "app /after alice\n");
  StealCli* whole3 = steal({"--port", "80", "--to", local.to()});
  EXPECT_TRUE(whole3->waitFor("stealing port 80")) << whole3->log();
  EXPECT_EQ(curl({url(80, "/whole")}), "local-A GET /whole \n");
}

// Two filters that both match a request: the earlier subscription gets it,
// the later one is told (an overlap line); requests only the later one
// matches are its own; when the earlier one ends the later one gets them.
TEST_P(HttpStealTest, EarliestSubscriptionWinsAndTheLaterOneIsTold) {
  HttpServer first("local-A"), second("local-B");
  StealCli* a;
  ASSERT_TRUE(stealFiltered(80, first.to(), "x-user: ^alice$", &a));
  StealCli* b;
  ASSERT_TRUE(stealFiltered(80, second.to(), "x-user: ^ali", &b));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(curl({"-H", "x-user: alice", url(80, "/both")}), "local-A GET /both alice\n");
  }
  EXPECT_EQ(curl({"-H", "x-user: alicia", url(80, "/b-only")}), "local-B GET /b-only alicia\n");
  EXPECT_TRUE(b->waitFor("overlap", true)) << b->log();
  EXPECT_THAT(b->log(), HasSubstr("/both")) << b->log();
  EXPECT_THAT(lower(a->log()), Not(HasSubstr("overlap"))) << a->log();
  EXPECT_EQ(second.byUser(), (std::map<std::string, int>{{"alicia", 1}}));

  a->signal(SIGINT);
  EXPECT_EQ(a->wait(), 0) << a->log();
  EXPECT_EQ(curl({"-H", "x-user: alice", url(80, "/both")}), "local-B GET /both alice\n");
}

// ----------------------------------------------------- a session that dies

// `siphon steal` killed while its local server holds a request: once the
// session's grace (1 s here) is over, the client gets a 502 naming the
// agent, not a hang; later requests reach the application. HTTP/1 and
// HTTP/2 alike.
TEST_P(HttpStealTest, SessionKilledMidRequestGetsTheClientA502) {
  HttpServer local("local-A");
  StealCli* s1;
  ASSERT_TRUE(stealFiltered(80, local.to(), "x-user: ^alice$", &s1));
  StealCli* s2;
  ASSERT_TRUE(stealFiltered(81, local.to(), "x-user: ^alice$", &s2));
  auto h1 = std::async(std::launch::async, [this] {
    return curl(
        {"--max-time", "20", "-H", "x-user: alice", "-w", "\n%{http_code}", url(80, "/slow1")});
  });
  auto h2 = std::async(std::launch::async, [this] {
    return inClient({"nghttp", "-t", "20", "-v", "-H", "x-user: alice", url(81, "/slow2")});
  });
  ASSERT_TRUE(local.waitHeld(2)) << s1->log() << s2->log();
  const auto t0 = Clock::now();
  s1->signal(SIGKILL);
  s2->signal(SIGKILL);
  const std::string got1 = h1.get();
  Result got2 = h2.get();
  const auto took = Clock::now() - t0;
  local.release();
  std::cerr << "502 after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
            << " ms; HTTP/1 answer: " << got1 << "\n";
  EXPECT_THAT(got1, HasSubstr("siphon")) << got1;
  EXPECT_THAT(got1, testing::EndsWith("\n502")) << got1;
  EXPECT_THAT(got2.out, HasSubstr(":status: 502")) << got2;
  EXPECT_THAT(got2.out, HasSubstr("siphon")) << got2;
  EXPECT_LT(took, std::chrono::seconds(10));
  EXPECT_EQ(curl({"-H", "x-user: alice", url(80, "/after")}), "app /after alice\n");
}

// Clients that go away in the middle of a large answer (curl reading
// slowly, then giving up; h2load ending its run with streams in flight):
// the agent's writes to them fail, and it goes on serving. Each way, with
// HTTP/1.1 and HTTP/2: stolen (the local server's answer) and passed
// through (the application's).
TEST_P(HttpStealTest, ClientsGoingAwayMidAnswerLeaveTheAgentServing) {
  HttpServer local("local-A");
  StealCli* s1;
  ASSERT_TRUE(stealFiltered(84, local.to(), "x-user: ^alice$", &s1));
  StealCli* s2;
  ASSERT_TRUE(stealFiltered(81, local.to(), "x-user: ^alice$", &s2));
  // 256 MiB for nginx to serve over HTTP/2.
  const std::string files = dir_->path() + "/nginx/files";
  std::filesystem::create_directories(files);
  {
    std::ofstream big(files + "/big.bin", std::ios::binary);
    big.seekp((256 << 20) - 1);
    big.put('x');
  }
  const std::string big = std::to_string(256 << 20);
  auto agentAlive = [&] { return !agent_->child().waitUntil(Clock::now()).has_value(); };
  // curl reads 1 MB/s and gives up after half a second, with the answer's bytes
  // unread: its close resets the connection while the agent still writes.
  auto giveUp = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {"curl", "-sS", "--limit-rate", "1M", "--max-time",
                                     "1",    "-o",  "/dev/null",    "-w", "%{http_code}"};
    argv.insert(argv.end(), args.begin(), args.end());
    return inClient(argv);
  };
  struct Case {
    std::string what;
    std::vector<std::string> args;
  };
  const std::vector<Case> cases = {
      {"HTTP/1.1 stolen",
       {"-H", "x-user: alice", "-H", "x-reply-bytes: " + big, "-H", "x-reply-seed: 1",
        url(84, "/big")}},
      {"HTTP/1.1 passed through",
       {"-H", "x-reply-bytes: " + big, "-H", "x-reply-seed: 1", url(84, "/big")}},
      {"HTTP/2 stolen",
       {"--http2-prior-knowledge", "-H", "x-user: alice", "-H", "x-reply-bytes: " + big, "-H",
        "x-reply-seed: 1", url(81, "/big")}},
      {"HTTP/2 passed through", {"--http2-prior-knowledge", url(81, "/files/big.bin")}},
  };
  for (const Case& c : cases) {
    Result r = giveUp(c.args);
    EXPECT_EQ(r.exit_code, 28) << c.what << ": curl should have timed out reading: " << r;
    EXPECT_EQ(r.out, "200") << c.what;
    // The agent noticed the reset (or will at its next write) and lives on.
    EXPECT_EQ(curl({"--http2-prior-knowledge", url(81, "/after")}), "app-h2 /after \n") << c.what;
    ASSERT_TRUE(agentAlive()) << "the agent died after the client went away (" << c.what
                              << "); exit " << agent_->child().waitUntil(Clock::now()).value_or(-1);
  }
  // h2load ends its connections at the end of a timed run, with streams in
  // flight, stolen and passed through.
  for (int i = 0; i < 4; ++i) {
    for (const std::vector<std::string>& extra :
         {std::vector<std::string>{"-H", "x-user: alice"}, std::vector<std::string>{}}) {
      std::vector<std::string> argv = {"h2load", "-t", "2", "-c", "16", "-m", "32", "-D", "1"};
      argv.insert(argv.end(), extra.begin(), extra.end());
      argv.push_back(url(81, "/h2load"));
      Result r = inClient(argv);
      EXPECT_EQ(r.exit_code, 0) << r;
      ASSERT_TRUE(agentAlive()) << "the agent died after h2load run " << i;
    }
  }
  EXPECT_EQ(curl({"--http2-prior-knowledge", "-H", "x-user: alice", url(81, "/end")}),
            "local-A GET /end alice\n");
  EXPECT_EQ(curl({url(84, "/end")}), "app GET /end \n");
}

// The agent drains (SIGTERM) with a keep-alive connection of a filtered
// port idle between requests: the HTTP engine closes it cleanly at once
// (EOF, not the reset at --drain-timeout an unfiltered steal must use), and
// the agent exits long before its 25 s drain timeout. The client's next
// connection reaches the application.
TEST_P(HttpStealTest, DrainClosesIdleKeepAliveConnectionsCleanly) {
  HttpServer local("local-A");
  StealCli* s;
  ASSERT_TRUE(stealFiltered(80, local.to(), "x-user: ^alice$", &s));
  Fd c = connectToPod(80);
  ASSERT_GE(c.get(), 0);
  Reader in(c.get());
  for (const std::string user : {"alice", ""}) {
    ASSERT_TRUE(writeAll(c.get(), "GET /before HTTP/1.1\r\nHost: pod\r\n" +
                                      (user.empty() ? "" : "X-User: " + user + "\r\n") + "\r\n"));
    auto head = in.head();
    ASSERT_TRUE(head);
    std::string status, body;
    auto headers = parseHeaders(*head, &status);
    ASSERT_TRUE(in.body(headers, false, [&](const char* d, size_t n) { body.append(d, n); }));
    EXPECT_EQ(body, user.empty() ? "app /before \n" : "local-A GET /before alice\n");
  }
  const auto t0 = Clock::now();
  ::kill(agent_->child().pid(), SIGTERM);
  // The idle connection ends with a clean EOF.
  char b;
  errno = 0;
  EXPECT_EQ(::read(c.get(), &b, 1), 0) << "not a clean close: " << strerror(errno);
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + kProcessDeadline), 0) << agent_->log();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(curl({"-H", "x-user: alice", url(80, "/after")}), "app /after alice\n");
}

INSTANTIATE_TEST_SUITE_P(SkLookup, HttpStealTest, ::testing::Values("sk_lookup"),
                         [](const auto& info) { return info.param; });

// The engine sits above the steering: the basic routing with the iptables
// backend too.
class HttpStealIptablesTest : public HttpStealTest {};

TEST_P(HttpStealIptablesTest, KeepAliveAndHttp2AreRoutedPerRequest) {
  HttpServer local("local-A");
  StealCli* s1;
  ASSERT_TRUE(stealFiltered(80, local.to(), "x-user: ^alice$", &s1));
  StealCli* s2;
  ASSERT_TRUE(stealFiltered(81, local.to(), "x-user: ^alice$", &s2));
  Result r = inClient({"curl", "-sS", "--max-time", "10", "-H", "x-user: alice", url(80, "/a"),
                       "--next", url(80, "/b")});
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(r.out, "local-A GET /a alice\napp /b \n");
  r = inClient({"nghttp", "-t", "10", "-H", "x-user: alice", url(81, "/h2")});
  EXPECT_EQ(r.out, "local-A GET /h2 alice\n") << r;
  r = inClient({"nghttp", "-t", "10", url(81, "/h2")});
  EXPECT_EQ(r.out, "app-h2 /h2 \n") << r;
}

INSTANTIATE_TEST_SUITE_P(Iptables, HttpStealIptablesTest, ::testing::Values("iptables"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace siphon
