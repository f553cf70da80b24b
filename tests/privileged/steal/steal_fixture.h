// The steal tests' world (steal_test.cc, handover_test.cc): a "pod" network
// namespace running busybox httpd (the application, answering "original" on
// port 80 and "original-81" on 81), a "client" namespace joined to it by a
// veth pair, the real siphon-agent targeting the httpd by PID, and the real
// `siphon steal` bridging stolen connections to servers the test runs on the
// host's loopback; with the helpers (sockets, local servers, wrk) the cases
// share. Every kernel object has a unique name and an RAII owner. One
// translation unit per test binary includes it (everything is file-local).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/echo_server.h"
#include "tests/privileged/harness/acceptor.h"
#include "tests/privileged/harness/bpf_links.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and a veth pair, runs siphon-agent, which attaches "
    "BPF programs or iptables chains to another process's network namespace";

// ---------------------------------------------------------------- sockets

struct Address {
  int family;
  std::string ip;  // literal, no brackets
  std::string url(uint16_t port, const std::string& path = "/") const {
    return "http://" + (family == AF_INET6 ? "[" + ip + "]" : ip) + ":" + std::to_string(port) +
           path;
  }
};

inline sockaddr_storage sockaddrOf(const Address& a, uint16_t port, socklen_t* len) {
  sockaddr_storage ss{};
  if (a.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    inet_pton(AF_INET, a.ip.c_str(), &in->sin_addr);
    *len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    inet_pton(AF_INET6, a.ip.c_str(), &in6->sin6_addr);
    *len = sizeof(sockaddr_in6);
  }
  return ss;
}

// A blocking TCP connection from the named namespace; -1 on failure.
inline int connectFrom(const std::string& netns, const Address& to, uint16_t port) {
  int fd = socketInNetns(netns, to.family, SOCK_STREAM);
  if (fd < 0) return -1;
  socklen_t len;
  sockaddr_storage ss = sockaddrOf(to, port, &len);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads to EOF and compares with Pattern(seed); returns the bytes that
// matched before the first difference (== total when all is well).
inline uint64_t receivePattern(int fd, uint64_t seed, uint64_t total, bool* clean_eof) {
  Pattern p(seed);
  // 64 KiB: 500 connections at once each with their own buffers.
  std::string buf(64 << 10, '\0'), want(64 << 10, '\0');
  uint64_t good = 0;
  *clean_eof = false;
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) {
      *clean_eof = true;
      return good;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return good;
    p.fill(want.data(), static_cast<size_t>(n));
    if (std::memcmp(buf.data(), want.data(), static_cast<size_t>(n)) != 0 ||
        good + static_cast<uint64_t>(n) > total) {
      return good;
    }
    good += static_cast<uint64_t>(n);
  }
}

// A loopback TCP server on the host (the developer's side of a steal):
// one thread per connection running `serve(fd)`.
class LocalServer {
 public:
  explicit LocalServer(std::function<void(int)> serve)
      : acceptor_(listenOnLoopback(&port_, 1024), kIoTimeoutSeconds, std::move(serve)) {}
  // The same serving `port` on every address (IPv4 and IPv6) inside the
  // named network namespace: an application of the pod.
  LocalServer(std::function<void(int)> serve, const std::string& netns, uint16_t port)
      : port_(port), acceptor_(listenDualStack(netns, port), kIoTimeoutSeconds, std::move(serve)) {}
  uint16_t port() const { return port_; }
  std::string to() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return acceptor_.accepted(); }

 private:
  // A connection idle this long is ended (a hung test ends rather than
  // waits for ctest's bound). Generous: with 500 connections started by
  // 500 threads on two loaded cores under ASan, the last may wait seconds
  // for its thread to write.
  static constexpr int kIoTimeoutSeconds = 30;

  static Fd listenDualStack(const std::string& netns, uint16_t port) {
    Fd fd(socketInNetns(netns, AF_INET6, SOCK_STREAM));
    int zero = 0, one = 1;
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(port);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
    EXPECT_EQ(::listen(fd.get(), 4096), 0);
    return fd;
  }

  uint16_t port_ = 0;
  Acceptor acceptor_;
};

// Answers one HTTP request with `body`.
inline std::function<void(int)> httpAnswer(std::string body) {
  return [body](int fd) {
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string resp = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    writeAll(fd, resp.data(), resp.size());
  };
}

// Answers HTTP requests with `body` on one connection until the client
// asks for the end (HTTP/1.1 `Connection: close`, HTTP/1.0 without
// keep-alive) or goes away: what a keep-alive server does.
inline std::function<void(int)> httpKeepAlive(std::string body) {
  return [body](int fd) {
    std::string buf;
    char chunk[4096];
    while (true) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        buf.append(chunk, static_cast<size_t>(n));
      }
      std::string head = buf.substr(0, end);
      buf.erase(0, end + 4);
      std::transform(head.begin(), head.end(), head.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      // HTTP/1.0 closes unless asked to keep alive; HTTP/1.1 the other way.
      const bool http10 = head.substr(0, head.find("\r\n")).find(" http/1.0") != std::string::npos;
      const bool close = http10 ? head.find("connection: keep-alive") == std::string::npos
                                : head.find("connection: close") != std::string::npos;
      std::string resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\n" +
                         (close ? "Connection: close\r\n" : "") + "\r\n" + body;
      if (!writeAll(fd, resp.data(), resp.size()) || close) return;
    }
  };
}

// What wrk saw, counted by the Lua script below: its socket errors, the
// answers that were not 2xx, and the answers by body (who served them).
struct WrkCounts {
  std::string raw;
  bool parsed = false;
  int64_t requests = 0, connect = 0, read = 0, write = 0, timeout = 0, non2xx = 0;
  int64_t stolen = 0, original = 0, other = 0;
  int64_t socketErrors() const { return connect + read + write + timeout; }
};

inline std::ostream& operator<<(std::ostream& os, const WrkCounts& w) { return os << w.raw; }

// wrk's Lua hooks: each thread counts answers by status and body; done()
// sums the threads and prints one line the test parses.
constexpr const char* kWrkScript = R"lua(
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) stolen, original, other, non2xx = 0, 0, 0, 0 end
function response(status, headers, body)
  if status < 200 or status > 299 then non2xx = non2xx + 1 end
  if body == "stolen\n" then stolen = stolen + 1
  elseif body == "original\n" then original = original + 1
  else other = other + 1 end
end
function done(summary, latency, requests)
  local s, o, x, n = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    s = s + t:get("stolen"); o = o + t:get("original")
    x = x + t:get("other"); n = n + t:get("non2xx")
  end
  local e = summary.errors
  io.write(string.format("siphon-wrk requests=%d connect=%d read=%d write=%d timeout=%d " ..
      "non2xx=%d stolen=%d original=%d other=%d\n", summary.requests, e.connect, e.read,
      e.write, e.timeout, n, s, o, x))
end
)lua";

inline WrkCounts parseWrk(const Result& r) {
  WrkCounts w;
  w.raw = r.out + r.err;
  size_t at = r.out.find("siphon-wrk ");
  if (at == std::string::npos) return w;
  std::istringstream in(r.out.substr(at + 11, r.out.find('\n', at) - at - 11));
  std::map<std::string, int64_t> kv;
  std::string word;
  while (in >> word) {
    size_t eq = word.find('=');
    if (eq != std::string::npos) kv[word.substr(0, eq)] = std::stoll(word.substr(eq + 1));
  }
  w.requests = kv["requests"];
  w.connect = kv["connect"];
  w.read = kv["read"];
  w.write = kv["write"];
  w.timeout = kv["timeout"];
  w.non2xx = kv["non2xx"];
  w.stolen = kv["stolen"];
  w.original = kv["original"];
  w.other = kv["other"];
  w.parsed = kv.size() == 9;
  return w;
}

// ------------------------------------------------------------ the fixture

struct Param {
  std::string backend;  // sk_lookup | iptables
  int family;
};

// Readable in ctest's output (GetParam() = sk_lookup/IPv6), not raw bytes.
inline void PrintTo(const Param& p, std::ostream* os) {
  *os << p.backend << (p.family == AF_INET ? "/IPv4" : "/IPv6");
}

inline std::string paramName(const testing::TestParamInfo<Param>& info) {
  return info.param.backend + (info.param.family == AF_INET ? "_ipv4" : "_ipv6");
}

// An echo server for connections that stay open.
inline void echoServe(int fd) {
  char buf[16384];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || !writeAll(fd, buf, static_cast<size_t>(n))) return;
  }
}

// Sends `msg` and reads as many bytes back (5 s at most); what came back.
inline std::string echoOnce(int fd, const std::string& msg) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (!writeAll(fd, msg.data(), msg.size())) return "write failed: " + std::string(strerror(errno));
  std::string got;
  char buf[4096];
  while (got.size() < msg.size()) {
    ssize_t n = ::read(fd, buf, std::min(sizeof buf, msg.size() - got.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return got + (n == 0 ? " <EOF>" : " <" + std::string(strerror(errno)) + ">");
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

class StealTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    // 500 concurrent connections need more than the default 1024 fds
    // across the test's ends.
    rlimit rl{8192, 8192};
    ::setrlimit(RLIMIT_NOFILE, &rl);
    dir_.emplace();
    token_file_ = dir_->file("token", "tok-" + randomHex(32) + "\n");
    pod_.emplace();
    client_.emplace();
    ASSERT_TRUE(pod_->created() && client_->created());

    // A veth pair between the two namespaces: unique names (15 chars at
    // most), addresses that exist only inside them.
    const std::string tag = randomHex(6);
    const std::string pod_if = "sp" + tag + "p", client_if = "sp" + tag + "c";
    const int subnet =
        1 + static_cast<int>(std::strtoul(tag.substr(0, 2).c_str(), nullptr, 16) % 254);
    pod_ip4_ = "10.251." + std::to_string(subnet) + ".1";
    pod_ip6_ = "fd00:5150:" + tag.substr(0, 4) + "::1";
    client_if_ = client_if;
    probe_ip4_ = "10.251." + std::to_string(subnet) + ".3";
    probe_ip6_ = "fd00:5150:" + tag.substr(0, 4) + "::3";
    for (const auto& argv : std::vector<std::vector<std::string>>{
             {"ip", "link", "add", pod_if, "netns", pod_->name(), "type", "veth", "peer", "name",
              client_if, "netns", client_->name()},
             {"ip", "-n", pod_->name(), "addr", "add", pod_ip4_ + "/24", "dev", pod_if},
             {"ip", "-n", client_->name(), "addr", "add",
              "10.251." + std::to_string(subnet) + ".2/24", "dev", client_if},
             {"ip", "-n", pod_->name(), "-6", "addr", "add", pod_ip6_ + "/64", "dev", pod_if,
              "nodad"},
             {"ip", "-n", client_->name(), "-6", "addr", "add",
              "fd00:5150:" + tag.substr(0, 4) + "::2/64", "dev", client_if, "nodad"},
             {"ip", "-n", pod_->name(), "link", "set", pod_if, "up"},
             {"ip", "-n", client_->name(), "link", "set", client_if, "up"},
         }) {
      Result r = run(argv);
      ASSERT_EQ(r.exit_code, 0) << r;
    }

    // The application: busybox httpd on 80 (the target) and 81.
    std::string www80 = dir_->path() + "/www80", www81 = dir_->path() + "/www81";
    std::filesystem::create_directories(www80);
    std::filesystem::create_directories(www81);
    dir_->file("www80/index.html", "original\n");
    dir_->file("www81/index.html", "original-81\n");
    ASSERT_NO_FATAL_FAILURE(startPod(&httpd80_, 80, www80));
    ASSERT_NO_FATAL_FAILURE(startPod(&httpd81_, 81, www81));
    ASSERT_NO_FATAL_FAILURE(waitForHttp(80, "original\n"));
    ASSERT_NO_FATAL_FAILURE(waitForHttp(81, "original-81\n"));
    ASSERT_NO_FATAL_FAILURE(startAgent());
  }

  void TearDown() override {
    for (auto& p : steals_) {
      p->signal(SIGKILL);
      p->finish();
    }
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  Address podAddress() const {
    return GetParam().family == AF_INET ? Address{AF_INET, pod_ip4_} : Address{AF_INET6, pod_ip6_};
  }

  void startPod(Child* child, int port, const std::string& www) {
    *child = spawn({"ip", "netns", "exec", pod_->name(), "busybox", "httpd", "-f", "-p",
                    std::to_string(port), "-h", www},
                   std::nullopt, -1, -1);
    ASSERT_GT(child->pid(), 0);
    const auto deadline = Clock::now() + kProcessDeadline;
    while (Clock::now() < deadline) {
      if (netnsInodeOf(child->pid()) == pod_->inode() &&
          readFile("/proc/" + std::to_string(child->pid()) + "/comm") == "busybox\n") {
        return;
      }
      if (child->waitUntil(Clock::now())) FAIL() << "httpd on " << port << " exited";
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "httpd on " << port << " never started in " << pod_->name();
  }

  void startAgent(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {"--listen",
                                     "127.0.0.1:0",
                                     "--token-file",
                                     token_file_,
                                     "--first-client-timeout",
                                     "120s",
                                     "--session-grace",
                                     "3s",
                                     "--log-level",
                                     "debug",
                                     "--steal-backend",
                                     GetParam().backend};
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (const char* a : {"targeted", "--pid"}) argv.push_back(a);
    argv.push_back(std::to_string(httpd80_.pid()));
    agent_.emplace(argv, cleanEnv(), dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  // `siphon steal` of port 80 to `local` (an echo server) and one client
  // connection through it, checked with an echo: the connection, or none
  // (with the failure recorded).
  Fd stealAndConnect(const LocalServer& local, Proc** steal_proc) {
    *steal_proc = steal({"--port", "80", "--to", local.to()});
    if ((*steal_proc)->err.find("stealing port 80") == std::string::npos) {
      ADD_FAILURE() << "siphon steal did not start: " << (*steal_proc)->err;
      return Fd();
    }
    Fd c(connectFrom(client_->name(), podAddress(), 80));
    if (c.get() < 0) {
      ADD_FAILURE() << "connect to the stolen port: " << strerror(errno);
      return Fd();
    }
    if (std::string got = echoOnce(c.get(), "before"); got != "before") {
      ADD_FAILURE() << "echo through the stolen connection: " << got;
      return Fd();
    }
    return c;
  }

  // curl from the client namespace; the body, or "curl exit N" on failure.
  std::string curl(uint16_t port, std::optional<Address> to = std::nullopt) {
    Address a = to.value_or(podAddress());
    Result r = run({"ip", "netns", "exec", client_->name(), "curl", "-sS", "-g", "--max-time", "5",
                    a.url(port)});
    if (r.exit_code != 0) return "curl exit " + std::to_string(r.exit_code) + ": " + r.err;
    return r.out;
  }

  // curl from inside the pod itself (a sidecar, a health check).
  std::string curlInPod(const std::string& url) {
    Result r =
        run({"ip", "netns", "exec", pod_->name(), "curl", "-sS", "-g", "--max-time", "5", url});
    if (r.exit_code != 0) return "curl exit " + std::to_string(r.exit_code) + ": " + r.err;
    return r.out;
  }

  void waitForHttp(uint16_t port, const std::string& body) {
    const auto deadline = Clock::now() + kProcessDeadline;
    std::string got;
    while (Clock::now() < deadline) {
      got = curl(port);
      if (got == body) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "port " << port << " never answered " << body << "; last: " << got;
  }

  // `siphon steal` with `args`; waits until it says it is stealing every
  // port (or exits).
  Proc* steal(const std::vector<std::string>& args, int ports = 1) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent",   endpoint_,
                                     "--token-file", token_file_, "steal"};
    argv.insert(argv.end(), args.begin(), args.end());
    steals_.push_back(std::make_unique<Proc>(argv, cleanEnv()));
    Proc* p = steals_.back().get();
    p->readUntil([ports](const std::string&, const std::string& err) {
      size_t n = 0, at = 0;
      while ((at = err.find("stealing port", at)) != std::string::npos) ++n, ++at;
      return static_cast<int>(n) >= ports || err.find("siphon:") != std::string::npos;
    });
    return p;
  }

  // What of ours is left in the pod: sk_lookup links on its netns, SIPHON
  // chains in either iptables.
  std::string leftovers() {
    std::string out;
    for (const harness::BpfLink& link : harness::bpfLinks()) {
      if (link.type == BPF_LINK_TYPE_NETNS && link.netns_ino == pod_->inode()) {
        out += "an sk_lookup link on the pod; ";
      }
    }
    for (const char* tool : {"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save",
                             "ip6tables-legacy-save"}) {
      Result r = run({"ip", "netns", "exec", pod_->name(), tool});
      if (r.out.find("SIPHON") != std::string::npos) out += std::string(tool) + ": " + r.out;
    }
    return out;
  }

  // An HTTP/1.0 GET from the client namespace to the pod's `port`, read to
  // EOF before the client closes (5 s at most per call): the whole response,
  // or nullopt if the connection or the exchange failed.
  std::optional<std::string> getToEof(uint16_t port) {
    Fd c(connectFrom(client_->name(), podAddress(), port));
    if (c.get() < 0) return std::nullopt;
    setTimeouts(c.get(), 5);
    const std::string req = "GET / HTTP/1.0\r\n\r\n";
    std::string resp;
    if (!writeAll(c.get(), req.data(), req.size()) || !readAll(c.get(), &resp)) {
      return std::nullopt;
    }
    return resp;
  }

  // Polls until the pod answers `body` on `port` again, at most `limit`.
  bool originalWithin(std::chrono::milliseconds limit, uint16_t port = 80) {
    const auto deadline = Clock::now() + limit;
    do {
      auto resp = getToEof(port);
      if (resp && resp->find("\r\n\r\noriginal\n") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } while (Clock::now() < deadline);
    return false;
  }

  std::optional<TempDir> dir_;
  std::string token_file_;
  std::optional<NetNs> pod_, client_;
  std::string pod_ip4_, pod_ip6_;
  std::string client_if_, probe_ip4_, probe_ip6_;  // a second client address: the "node"
  Child httpd80_, httpd81_;
  std::optional<Agent> agent_;
  std::string endpoint_;
  std::vector<std::unique_ptr<Proc>> steals_;
};

// ------------------------------------------------------- SIGTERM under load

// The pod's application in these tests: an HTTP server of the test inside
// the pod. busybox httpd listens with a backlog of 9 and, under wrk's load,
// drops SYNs by itself (1 s retransmissions with no agent anywhere); with
// a normal backlog every delay wrk measures is the switch's.
constexpr uint16_t kLoadPort = 8080;

class StealDrainLoadTest : public StealTest {
 protected:
  // Restarts the fixture's agent (it has no session yet: SIGTERM ends it at
  // once) with `extra` flags.
  void restartAgent(const std::vector<std::string>& extra) {
    ASSERT_GT(agent_->child().pid(), 0);
    ::kill(agent_->child().pid(), SIGTERM);
    ASSERT_EQ(agent_->child().waitUntil(Clock::now() + std::chrono::seconds(5)), 0)
        << agent_->log();
    ASSERT_NO_FATAL_FAILURE(startAgent(extra));
  }

  // Reads what `p` prints while a load runs, until the returned stopper is
  // called: `siphon steal` prints a line per connection, and a pipe nobody
  // reads would block it after 64 KiB (and with it every stolen connection).
  std::function<void()> drainOutput(Proc* p) {
    auto stop = std::make_shared<std::atomic<bool>>(false);
    auto reader = std::make_shared<std::thread>([p, stop] {
      p->readUntil([stop](const std::string&, const std::string&) { return stop->load(); });
    });
    return [stop, reader] {
      *stop = true;
      reader->join();
    };
  }

  // wrk from the client namespace against kLoadPort of the pod for
  // `seconds`, 2 threads, 16 connections, `extra` arguments before the
  // URL; started at once, its counts when it ends. A request unanswered
  // for 2 s counts as a timeout.
  std::future<WrkCounts> startWrk(int seconds, const std::vector<std::string>& extra) {
    const std::string script = dir_->file("count.lua", kWrkScript);
    std::vector<std::string> argv = {
        "ip",        "netns", "exec", client_->name(),
        "wrk",       "-t2",   "-c16", "-d" + std::to_string(seconds) + "s",
        "--timeout", "2s",    "-s",   script};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(podAddress().url(kLoadPort));
    return std::async(std::launch::async, [argv] { return parseWrk(run(argv)); });
  }

  static int64_t msSince(Clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  }
};

}  // namespace
}  // namespace siphon
