// Multi-client isolation, as root, against the real agent: one session's bad
// input, slow consumer or disconnect never stalls or changes another
// session.
//
// A "pod" network namespace holds the target (a sleep) and a TCP server that
// sends an endless byte pattern to whoever connects. One agent targets the
// sleep. Session Y reads a 64 MiB file through the agent (`siphon fs cat`),
// first alone, then while, at the same time:
//   - raw TCP clients send garbage to the agent's listener: bytes that are
//     not a frame, a frame header with an absurd length, undecodable frame
//     bytes, and the same after a valid handshake; and connections that
//     send half a frame header and stall;
//   - session X (`siphon connect` to the pod's endless server) has read a
//     few MiB and is stopped (SIGSTOP): a consumer that no longer reads;
//   - a client connects and disconnects in a loop: plain TCP, a full
//     handshake ended cleanly, and a full handshake cut without a word.
// Y must arrive byte-exact each time, every garbage connection must end
// with its typed error (and the agent must log it), and X, continued, must
// go on receiving its stream byte-exact. How fast Y goes meanwhile is a
// benchmark, not a test: bench/run.py --only isolation measures it against
// Y alone in the same run.
//
// Every kernel object has a unique name and an owner (harness::
// PrivilegedTest); every socket of the test has a timeout. Without root
// every test skips with the reason.
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
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "siphon/protocol/codec.h"
#include "siphon/protocol/handshake.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/privileged_test.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates a network namespace and runs siphon-agent, which enters another "
    "process's network namespace";

constexpr size_t kFileSize = 64u << 20;
// Socket timeouts: a bug fails the test instead of hanging it.
constexpr int kSocketTimeoutSeconds = 5;

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

uint16_t portOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A TCP server on 127.0.0.1 inside the pod: every connection receives
// Pattern(kSeed) until the client goes away or the server stops. Counts what
// the kernel took from it (so a reader that stopped shows as a plateau).
class EndlessServer {
 public:
  static constexpr uint64_t kSeed = 77;

  explicit EndlessServer(const std::string& netns) {
    fd_ = Fd(socketInNetns(netns, AF_INET, SOCK_STREAM));
    sockaddr_in a = loopback(0);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_.get(), 64), 0);
    port_ = portOf(fd_.get());
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~EndlessServer() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (auto& t : workers_) t.join();
  }
  uint16_t port() const { return port_; }
  uint64_t sent() const { return sent_; }

 private:
  void acceptLoop() {
    while (!stop_) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      // Short send timeouts: a stopped reader parks the writer, which
      // checks stop_ between tries.
      timeval tv{0, 100000};
      ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      std::lock_guard<std::mutex> l(mu_);
      workers_.emplace_back([this, c] {
        Pattern p(kSeed);
        std::string buf(256 << 10, '\0');
        size_t off = buf.size();
        while (!stop_) {
          if (off == buf.size()) {
            p.fill(buf.data(), buf.size());
            off = 0;
          }
          ssize_t n = ::send(c, buf.data() + off, buf.size() - off, MSG_NOSIGNAL);
          if (n > 0) {
            off += static_cast<size_t>(n);
            sent_ += static_cast<uint64_t>(n);
          } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            continue;
          } else {
            break;
          }
        }
        ::close(c);
      });
    }
  }

  Fd fd_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
};

// What came back on a raw connection to the agent: the frames, and how it
// ended.
struct RawAnswer {
  std::vector<v1::Frame> frames;
  bool eof = false;        // the agent closed (FIN or RST)
  bool timed_out = false;  // nothing more and no close within the timeout
  std::string decode_error;

  std::string describe() const {
    std::string s;
    for (const auto& f : frames) s += f.ShortDebugString() + "; ";
    return s +
           (eof         ? "closed"
            : timed_out ? "no close before the timeout"
                        : "?") +
           (decode_error.empty() ? "" : " (" + decode_error + ")");
  }
  // The error code of the Reject or Goaway among the frames.
  v1::ErrorCode errorCode() const {
    for (const auto& f : frames) {
      if (f.has_reject()) return f.reject().code();
      if (f.has_goaway()) return f.goaway().code();
    }
    return v1::ERROR_CODE_UNSPECIFIED;
  }
};

// Reads frames until the agent closes the connection or `stop_at(frames)`
// holds, bounded by the socket's receive timeout.
template <typename Pred>
RawAnswer readAnswer(int fd, Pred stop_at) {
  RawAnswer a;
  protocol::FrameDecoder decoder(64u << 20);
  char buf[65536];
  while (true) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      a.eof = true;
      return a;
    }
    if (n < 0) {
      a.timed_out = true;
      return a;
    }
    decoder.feed(std::string_view(buf, static_cast<size_t>(n)));
    while (true) {
      auto next = decoder.next();
      if (!next.ok()) {
        a.decode_error = std::string(next.status().message());
        return a;
      }
      if (!next->has_value()) break;
      if (!(*next)->is_data) a.frames.push_back(std::move((*next)->frame));
      if (stop_at(a.frames)) return a;
    }
  }
}

RawAnswer readToClose(int fd) {
  return readAnswer(fd, [](const std::vector<v1::Frame>&) { return false; });
}

std::string lengthPrefix(uint32_t n) {
  uint32_t be = htonl(n);
  return std::string(reinterpret_cast<const char*>(&be), 4);
}

class IsolationTest : public PrivilegedTest {
 protected:
  IsolationTest() : PrivilegedTest(kSkipReason) {}

  void SetUp() override {
    PrivilegedTest::SetUp();
    if (IsSkipped()) return;
    rlimit rl{8192, 8192};
    ::setrlimit(RLIMIT_NOFILE, &rl);
    dir_ = &dir();
    token_ = "tok-" + randomHex(32);
    token_file_ = dir_->file("token", token_ + "\n");
    netns_ = &addNetns();
    ASSERT_TRUE(netns_->created());
    endless_.emplace(netns_->name());

    // The file Y reads: random bytes, kept here to compare with.
    file_content_.resize(kFileSize);
    std::mt19937_64 rng(4242);
    for (size_t i = 0; i < kFileSize; i += 8) {
      uint64_t v = rng();
      std::memcpy(file_content_.data() + i, &v, 8);
    }
    file_path_ = dir_->path() + "/big.bin";
    {
      Fd f(::open(file_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      ASSERT_GE(f.get(), 0);
      ASSERT_EQ(::write(f.get(), file_content_.data(), kFileSize), static_cast<ssize_t>(kFileSize));
    }

    pod_ = spawn({"ip", "netns", "exec", netns_->name(), "sleep", "600"}, std::nullopt, -1, -1);
    ASSERT_GT(pod_.pid(), 0);
    fakes::eventually(
        [&] {
          return readFile("/proc/" + std::to_string(pod_.pid()) + "/comm") == "sleep\n" &&
                 netnsInodeOf(pod_.pid()) == netns_->inode();
        },
        kProcessDeadline);
    ASSERT_EQ(netnsInodeOf(pod_.pid()), netns_->inode());

    agent_.emplace(std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                            "--first-client-timeout", "60s", "--log-level", "debug",
                                            "targeted", "--pid", std::to_string(pod_.pid())},
                   cleanEnv(), dir_->path() + "/agent.log");
    showOnFailure("agent log (last 20000 bytes)", [this] {
      std::string log = agent_->log();
      return log.substr(log.size() > 20000 ? log.size() - 20000 : 0);
    });
    ASSERT_TRUE(agent_->ready(&endpoint_));
    agent_port_ = static_cast<uint16_t>(std::stoul(endpoint_.substr(endpoint_.rfind(':') + 1)));
  }

  std::vector<std::string> cli(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // A TCP connection to the agent's listener, with timeouts; -1 on failure.
  int connectAgent() const {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    setTimeouts(fd, kSocketTimeoutSeconds);
    sockaddr_in a = loopback(agent_port_);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  std::string hello(const std::string& name) const {
    return protocol::encodeFrame(protocol::makeHello(name, token_, v1::Limits(), nullptr));
  }

  // Y: the whole file through `siphon fs cat`, to a file, compared.
  ::testing::AssertionResult readFileThroughAgent() {
    const std::string out_path = dir_->path() + "/y.out";
    Fd out(::open(out_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    Fd err(::open((dir_->path() + "/y.err").c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    Child y = spawn(cli({"fs", "cat", file_path_}), cleanEnv(), out.get(), err.get());
    auto code = y.waitUntil(Clock::now() + kProcessDeadline);
    if (code != 0) {
      return ::testing::AssertionFailure() << "siphon fs cat exited " << code.value_or(-1) << ": "
                                           << readFile(dir_->path() + "/y.err");
    }
    std::string got = readFile(out_path);
    if (got.size() != kFileSize || got != file_content_) {
      size_t at = 0;
      while (at < std::min(got.size(), kFileSize) && got[at] == file_content_[at]) ++at;
      return ::testing::AssertionFailure()
             << "siphon fs cat gave " << got.size() << " bytes, first difference at " << at;
    }
    return ::testing::AssertionSuccess();
  }

  // Destroyed in reverse: agent, pod, server; then (PrivilegedTest) the
  // namespace and the directory.
  TempDir* dir_ = nullptr;
  std::string token_, token_file_;
  NetNs* netns_ = nullptr;
  std::optional<EndlessServer> endless_;
  std::string file_content_, file_path_;
  Child pod_;
  std::optional<Agent> agent_;
  std::string endpoint_;
  uint16_t agent_port_ = 0;
};

// One garbage exchange and what must come of it.
struct GarbageCase {
  const char* name;
  v1::ErrorCode expected;
};

TEST_F(IsolationTest, MisbehavingClientsDoNotSlowOrChangeAnotherSession) {
  // ---- Y alone.
  ASSERT_TRUE(readFileThroughAgent()) << "Y alone";

  // ---- X: reads a few MiB of its endless stream, then stops reading.
  Proc x(cli({"--client-name", "x", "connect", "127.0.0.1:" + std::to_string(endless_->port())}),
         cleanEnv());
  ASSERT_TRUE(x.readUntil([](const std::string& out, const std::string&) {
    return out.size() >= (4u << 20);
  })) << "X got "
      << x.out.size() << " bytes; stderr: " << x.err;
  x.signal(SIGSTOP);
  const size_t x_read_before = x.out.size();

  // ---- the misbehaving clients, until `stop`.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> garbage_failures;
  std::atomic<int> garbage_rounds{0}, churn_rounds{0};
  auto garbageFailed = [&](const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    if (garbage_failures.size() < 20) garbage_failures.push_back(what);
  };

  // Connections that send half a frame header and stall: each is a
  // handshake the agent waits for (up to its handshake timeout) without
  // holding anyone else.
  std::vector<Fd> stalled;
  for (int i = 0; i < 8; ++i) {
    Fd fd(connectAgent());
    ASSERT_GE(fd.get(), 0);
    ASSERT_TRUE(writeAll(fd.get(), lengthPrefix(100).substr(0, 2)));
    stalled.push_back(std::move(fd));
  }

  std::thread garbage([&] {
    while (!stop) {
      ++garbage_rounds;
      // 1. Not a frame at all (an HTTP request): its first four bytes read
      //    as a length of 1.2 GB.
      // 2. A frame header with an absurd length.
      // 3. A frame of the right length whose bytes are not a Frame.
      const std::vector<std::pair<GarbageCase, std::string>> before_handshake = {
          {{"http request", v1::FRAME_TOO_LARGE}, "GET / HTTP/1.1\r\nHost: agent\r\n\r\n"},
          {{"absurd length", v1::FRAME_TOO_LARGE}, lengthPrefix(0xfffffff0u) + "xxxx"},
          {{"undecodable frame", v1::PROTOCOL_ERROR}, lengthPrefix(16) + std::string(16, '\xff')},
      };
      for (const auto& [c, bytes] : before_handshake) {
        Fd fd(connectAgent());
        if (fd.get() < 0) {
          garbageFailed(std::string(c.name) + ": connect failed");
          continue;
        }
        writeAll(fd.get(), bytes);
        RawAnswer a = readToClose(fd.get());
        if (a.errorCode() != c.expected || !a.eof || a.frames.size() != 1 ||
            !a.frames[0].has_reject()) {
          garbageFailed(std::string(c.name) + ": " + a.describe());
        }
      }
      // 4-5. The same after a valid handshake: the session's transport
      //      answers with a Goaway and closes (and the session ends).
      const std::vector<std::pair<GarbageCase, std::string>> after_handshake = {
          {{"absurd length in a session", v1::FRAME_TOO_LARGE}, lengthPrefix(0x7fffffffu)},
          {{"undecodable frame in a session", v1::PROTOCOL_ERROR},
           lengthPrefix(16) + std::string(16, '\xff')},
      };
      for (const auto& [c, bytes] : after_handshake) {
        Fd fd(connectAgent());
        if (fd.get() < 0 || !writeAll(fd.get(), hello(c.name))) {
          garbageFailed(std::string(c.name) + ": connect failed");
          continue;
        }
        RawAnswer w =
            readAnswer(fd.get(), [](const std::vector<v1::Frame>& f) { return !f.empty(); });
        if (w.frames.empty() || !w.frames[0].has_welcome()) {
          garbageFailed(std::string(c.name) + ": no Welcome: " + w.describe());
          continue;
        }
        writeAll(fd.get(), bytes);
        RawAnswer a = readToClose(fd.get());
        if (a.errorCode() != c.expected || !a.eof) {
          garbageFailed(std::string(c.name) + ": " + a.describe());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  // Connects and disconnects: plain TCP; a handshake then a clean Goaway
  // (what `siphon info` in a loop does); a handshake then a cut. The cut
  // ones leave detached sessions waiting for a resume: more of them than
  // --max-sessions (64) first, so every later session needs the agent to
  // make room.
  auto handshakeThenCut = [&] {
    Fd fd(connectAgent());
    if (fd.get() < 0) return;
    writeAll(fd.get(), hello("churn"));
    readAnswer(fd.get(), [](const std::vector<v1::Frame>& f) { return !f.empty(); });
  };
  for (int i = 0; i < 80; ++i) handshakeThenCut();
  std::thread churn([&] {
    v1::Frame goaway;
    goaway.mutable_goaway()->set_code(v1::CANCELLED);
    goaway.mutable_goaway()->set_message("bye");
    const std::string goaway_bytes = protocol::encodeFrame(goaway);
    while (!stop) {
      const int round = ++churn_rounds;
      Fd fd(connectAgent());
      if (fd.get() < 0) continue;
      if (round % 3 == 0) continue;  // plain connect, close
      writeAll(fd.get(), hello("churn"));
      RawAnswer w =
          readAnswer(fd.get(), [](const std::vector<v1::Frame>& f) { return !f.empty(); });
      if (round % 3 == 1) writeAll(fd.get(), goaway_bytes);
      // round % 3 == 2: cut without a word
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });

  // ---- Y again, with all of that going on.
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(readFileThroughAgent()) << "Y with misbehaving clients, run " << i;
  // X's server goes on until the windows and buffers between it and the
  // stopped reader are full (a 16 MiB stream window, the session socket's
  // send buffer of up to 8 MiB, the kernel's), which may take longer than
  // Y's reads: wait until it sent nothing for 300 ms, at most 10 s. A
  // server still sending then has no bound.
  uint64_t x_sent_mid = endless_->sent();
  uint64_t x_sent_end = x_sent_mid;
  for (const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    x_sent_end = endless_->sent();
    if (x_sent_end == x_sent_mid || std::chrono::steady_clock::now() > give_up) break;
    x_sent_mid = x_sent_end;
  }
  stop = true;
  garbage.join();
  churn.join();
  stalled.clear();

  std::cerr << garbage_rounds << " garbage rounds, " << churn_rounds
            << " connect/disconnect rounds\n";

  // Every garbage connection got its typed error, then the close.
  EXPECT_GT(garbage_rounds.load(), 0);
  EXPECT_THAT(garbage_failures, ::testing::IsEmpty());
  const std::string log = agent_->log();
  EXPECT_THAT(log, HasSubstr("client_rejected"));
  EXPECT_THAT(log, HasSubstr("code=FRAME_TOO_LARGE"));
  EXPECT_THAT(log, HasSubstr("code=PROTOCOL_ERROR"));
  EXPECT_THAT(log, HasSubstr("session_protocol_error"));
  // The cut sessions filled the session limit; the agent made room by
  // ending those with nothing to resume.
  EXPECT_THAT(log, HasSubstr("session_evicted"));

  // X, stopped, held back its own stream only: the pod's server could send
  // no more than the windows and socket buffers hold, and stopped sending.
  const uint64_t unread = x_sent_end - x_read_before;
  std::cerr << "X read " << x_read_before << " bytes before it stopped; the server sent "
            << x_sent_end << " (" << unread << " held in buffers and windows)\n";
  EXPECT_EQ(x_sent_mid, x_sent_end) << "the server kept sending to a reader that stopped";
  EXPECT_LT(unread, 96u << 20);

  // X continued: its stream goes on where it stopped, byte-exact.
  x.signal(SIGCONT);
  const size_t want = x_read_before + (16u << 20);
  ASSERT_TRUE(x.readUntil([want](const std::string& out, const std::string&) {
    return out.size() >= want;
  })) << "X got "
      << x.out.size() << " bytes after SIGCONT; stderr: " << x.err;
  std::string expect(x.out.size(), '\0');
  Pattern(EndlessServer::kSeed).fill(expect.data(), expect.size());
  size_t at = 0;
  while (at < x.out.size() && x.out[at] == expect[at]) ++at;
  EXPECT_EQ(at, x.out.size()) << "X's stream differs at byte " << at;
  EXPECT_EQ(x.err, "");
  x.signal(SIGKILL);

  // The agent is still there for everyone.
  EXPECT_TRUE(readFileThroughAgent());
}

}  // namespace
}  // namespace siphon
