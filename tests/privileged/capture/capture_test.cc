// Capture end to end, as root, with real traffic: a "pod" network namespace
// (a sleeping process is the agent's target; the test's own servers listen
// there), a "client" namespace joined to it by a veth pair, the real
// siphon-agent targeting the pod's process, and the real `siphon capture`.
// What was captured is read back with tshark and compared with what was
// sent. The slow-client case speaks the protocol itself (protocol::Session
// over a socket) to hold the stream's credit and see each StreamGap.
//
// Every kernel object has a unique name and an RAII owner, so a failed
// assertion still kills the processes and deletes the namespaces. Without
// root every test skips with the reason.
//
// Over 600 lines: one area's end-to-end cases sharing the namespaces and servers set up below.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "siphon/protocol/handshake.h"
#include "siphon/protocol/limits.h"
#include "siphon/protocol/session.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "siphon/transport/session_transport.h"
#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace siphon::harness;  // NOLINT: test file

constexpr const char* kSkipReason =
    "needs root: creates network namespaces and a veth pair, runs siphon-agent, which opens "
    "packet sockets (CAP_NET_RAW) in another process's network namespace";

// ---------------------------------------------------------------- helpers

sockaddr_in ipv4(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

uint16_t localPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// A socket of `type` bound to ip:0 inside `netns` (listening, for TCP).
Fd boundIn(const std::string& netns, int type, const std::string& ip) {
  Fd fd(socketInNetns(netns, AF_INET, type));
  sockaddr_in a = ipv4(ip, 0);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << strerror(errno);
  if (type == SOCK_STREAM) {
    EXPECT_EQ(::listen(fd.get(), 16), 0);
  }
  return fd;
}

// Accepts one connection on `listener` and reads it to EOF, on a thread.
class OneConnectionSink {
 public:
  explicit OneConnectionSink(int listener)
      : thread_([this, listener] {
          Fd c(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
          if (c.get() < 0) return;
          setTimeouts(c.get(), 20);
          readAll(c.get(), &received_);
        }) {}
  // The bytes received, once the peer closed.
  const std::string& wait() {
    if (thread_.joinable()) thread_.join();
    return received_;
  }
  ~OneConnectionSink() { wait(); }

 private:
  std::string received_;
  std::thread thread_;
};

// Connects from `netns` to ip:port, sends `data`, closes.
::testing::AssertionResult sendTcp(const std::string& netns, const std::string& ip, uint16_t port,
                                   const std::string& data) {
  Fd fd(socketInNetns(netns, AF_INET, SOCK_STREAM));
  setTimeouts(fd.get(), 20);
  sockaddr_in a = ipv4(ip, port);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return ::testing::AssertionFailure()
           << "connect " << ip << ":" << port << ": " << strerror(errno);
  }
  if (!writeAll(fd.get(), data))
    return ::testing::AssertionFailure() << "send: " << strerror(errno);
  ::shutdown(fd.get(), SHUT_WR);
  char c;
  (void)!::read(fd.get(), &c, 1);  // the server's close: every byte was taken
  return ::testing::AssertionSuccess();
}

std::string patternBytes(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  Pattern(seed).fill(s.data(), n);
  return s;
}

std::string fromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// What the client of the first TCP conversation in `file` sent, as tshark
// reassembles it (`-z follow,tcp,raw,0`: one hex line per segment, the
// server's lines indented by a tab).
std::string clientBytesOfFirstTcpStream(const std::string& file, std::string* diag) {
  Result r = run({"tshark", "-n", "-r", file, "-q", "-z", "follow,tcp,raw,0"});
  *diag = r.out + r.err;
  if (r.exit_code != 0) return "tshark exit " + std::to_string(r.exit_code);
  std::istringstream in(r.out);
  std::string line, hex;
  bool body = false;
  while (std::getline(in, line)) {
    if (line.rfind("Node 1:", 0) == 0) {
      body = true;
      continue;
    }
    if (!body) continue;
    if (line.rfind("=====", 0) == 0) break;
    if (!line.empty() && line[0] != '\t') hex += line;
  }
  return fromHex(hex);
}

// ------------------------------------------------- a client that holds credit

// The protocol spoken by hand: a session with a small stream window whose
// capture stream's data is not consumed until release(). Records the Data
// frames and every StreamGap. Runs its own event loop thread.
class HoldingCaptureClient : public protocol::SessionHandler {
 public:
  HoldingCaptureClient(const std::string& endpoint, const std::string& token,
                       const std::string& filter)
      : thread_([this, endpoint, token, filter] { run(endpoint, token, filter); }) {}
  ~HoldingCaptureClient() {
    net::asio::post(io_, [this] {
      if (transport_) transport_->close();
    });
    thread_.join();
  }

  struct State {
    bool accepted = false;
    bool half_closed = false;
    std::string error;     // a reset, or a failure to connect
    uint64_t frames = 0;   // Data frames, the header included
    uint64_t records = 0;  // Data frames after the header
    uint64_t gaps = 0;
    uint64_t gap_packets = 0;
    uint64_t gap_bytes = 0;
  };
  State state() {
    std::lock_guard<std::mutex> l(mu_);
    return state_;
  }
  template <typename Pred>
  bool waitFor(Pred pred, std::chrono::seconds limit = std::chrono::seconds(30)) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (pred(state())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred(state());
  }

  // Consumes what was held, and everything that comes from now on.
  void release() {
    net::asio::post(io_, [this] {
      hold_ = false;
      session_->consumed(id_, held_);
      held_ = 0;
      transport_->wake();
    });
  }
  void halfClose() {
    net::asio::post(io_, [this] {
      (void)session_->halfClose(id_);
      transport_->wake();
    });
  }

  // SessionHandler (on the client's thread)
  void onStreamAccept(v1::StreamAccept) override {
    std::lock_guard<std::mutex> l(mu_);
    state_.accepted = true;
  }
  void onStreamData(uint64_t id, std::string_view payload) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (state_.frames++ > 0) ++state_.records;
    }
    if (hold_) {
      held_ += payload.size();
    } else {
      session_->consumed(id, payload.size());
    }
  }
  void onStreamGap(v1::StreamGap gap) override {
    std::lock_guard<std::mutex> l(mu_);
    ++state_.gaps;
    state_.gap_packets += gap.packets();
    state_.gap_bytes += gap.bytes();
  }
  void onStreamHalfClose(uint64_t) override {
    std::lock_guard<std::mutex> l(mu_);
    state_.half_closed = true;
  }
  void onStreamReset(uint64_t, v1::Error e) override {
    std::lock_guard<std::mutex> l(mu_);
    state_.error = v1::ErrorCode_Name(e.code()) + ": " + e.message();
  }

 private:
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> l(mu_);
    state_.error = why;
  }

  void run(const std::string& endpoint, const std::string& token, const std::string& filter) {
    net::asio::co_spawn(io_, connect(endpoint, token, filter), net::asio::detached);
    io_.run();
  }

  net::awaitable<void> connect(std::string endpoint, std::string token, std::string filter) {
    const std::string ep = std::move(endpoint), tok = std::move(token), flt = std::move(filter);
    std::string host, port;
    (void)net::splitHostPort(ep, &host, &port);
    net::tcp::socket socket(io_);
    net::error_code ec;
    co_await socket.async_connect(
        net::tcp::endpoint(net::asio::ip::make_address(host), std::stoi(port)),
        net::asio::redirect_error(net::use_awaitable, ec));
    if (ec) {
      fail("connect: " + ec.message());
      co_return;
    }
    protocol::SessionLimits asked;
    // The smallest window a session may have (kMinStreamWindow, 16 KiB):
    // credit runs out after some 15 packets of 1000 bytes.
    asked.initial_stream_window = protocol::kMinStreamWindow;
    absl::Status s = co_await net::writeFrame(
        socket, protocol::makeHello("holding-capture", tok, protocol::toProto(asked), nullptr));
    auto first = co_await net::readFirstFrame(socket, std::chrono::seconds(10),
                                              protocol::kDefaultMaxFrameSize);
    if (!s.ok() || !first.ok()) {
      fail("handshake failed");
      co_return;
    }
    auto welcome = protocol::welcomeFrom(first->frame);
    if (!welcome.ok()) {
      fail("handshake: " + std::string(welcome.status().message()));
      co_return;
    }
    session_.emplace(protocol::Role::kClient, protocol::fromProto(welcome->limits()));
    v1::StreamOpen open;
    open.mutable_capture()->set_filter(flt);
    auto id = session_->openStream(open);
    if (!id.ok()) {
      fail("open: " + std::string(id.status().message()));
      co_return;
    }
    id_ = *id;
    transport_ = std::make_shared<net::SessionTransport>(std::move(socket), *session_, *this,
                                                         std::move(first->leftover));
    transport_->wake();
    (void)co_await transport_->run();
  }

  net::asio::io_context io_;
  std::optional<protocol::Session> session_;
  std::shared_ptr<net::SessionTransport> transport_;
  uint64_t id_ = 0;
  bool hold_ = true;
  uint64_t held_ = 0;
  std::mutex mu_;
  State state_;
  std::thread thread_;  // last: starts once the rest exists
};

uint64_t rssKiB(pid_t pid) {
  std::istringstream in(readFile("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

// ------------------------------------------------------------ the fixture

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    ASSERT_EQ(run({"tshark", "--version"}).exit_code, 0)
        << "tshark is missing: scripts/install-deps.sh installs it";
    dir_.emplace();
    token_ = "tok-" + randomHex(32);
    token_file_ = dir_->file("token", token_ + "\n");
    pod_.emplace();
    client_.emplace();
    ASSERT_TRUE(pod_->created() && client_->created());

    PodLink link;
    ASSERT_TRUE(linkPodToClient(*pod_, *client_, "cp", &link));
    pod_ip_ = link.pod_ip;
    client_ip_ = link.client_ip;
    client_if_ = link.client_if;

    // The target: any process of the pod; its netns is what the agent captures in.
    target_ = spawn({"ip", "netns", "exec", pod_->name(), "sleep", "3600"}, std::nullopt, -1, -1);
    ASSERT_TRUE(fakes::eventually([&] { return netnsInodeOf(target_.pid()) == pod_->inode(); },
                                  kProcessDeadline))
        << "the pod's process never entered " << pod_->name();
    agent_.emplace(
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--token-file", token_file_,
                                 "--first-client-timeout", "120s", "--log-level", "debug",
                                 "targeted", "--pid", std::to_string(target_.pid())},
        cleanEnv(), dir_->path() + "/agent.log");
    ASSERT_TRUE(agent_->ready(&endpoint_));
  }

  void TearDown() override {
    for (auto& p : procs_) {
      p->signal(SIGKILL);
      p->finish();
    }
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  std::vector<std::string> cli(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent", endpoint_, "--token-file",
                                     token_file_};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // `siphon capture ARGS` running; returns once it says it is capturing (or
  // ended).
  Proc* capture(const std::vector<std::string>& args) {
    std::vector<std::string> argv = cli({"capture"});
    argv.insert(argv.end(), args.begin(), args.end());
    return started(std::make_unique<Proc>(argv, cleanEnv()));
  }

  Proc* started(std::unique_ptr<Proc> p) {
    procs_.push_back(std::move(p));
    Proc* proc = procs_.back().get();
    proc->readUntil([](const std::string&, const std::string& err) {
      return err.find("capturing on") != std::string::npos ||
             err.find("siphon:") != std::string::npos;
    });
    return proc;
  }

  std::string file(const std::string& name) const { return dir_->path() + "/" + name; }

  std::optional<TempDir> dir_;
  std::string token_, token_file_;
  std::optional<NetNs> pod_, client_;
  std::string pod_ip_, client_ip_, client_if_;
  Child target_;
  std::optional<Agent> agent_;
  std::string endpoint_;
  std::vector<std::unique_ptr<Proc>> procs_;
};

// ------------------------------------------------------------------ tests

TEST_F(CaptureTest, TcpPayloadFromAnotherPodIsInTheFile) {
  Fd listener = boundIn(pod_->name(), SOCK_STREAM, "0.0.0.0");
  const uint16_t port = localPort(listener.get());
  OneConnectionSink server(listener.get());
  const std::string pcap = file("tcp.pcap");

  Proc* cap = capture({"-w", pcap, "tcp", "port", std::to_string(port)});
  ASSERT_THAT(cap->err, HasSubstr("capturing on any (LINUX_SLL)")) << cap->err;
  ASSERT_THAT(cap->err, HasSubstr("filter 'tcp port " + std::to_string(port) + "'"));

  const std::string sent = patternBytes(7, 300 * 1000);
  ASSERT_TRUE(sendTcp(client_->name(), pod_ip_, port, sent));
  ASSERT_EQ(server.wait().size(), sent.size());

  cap->signal(SIGINT);
  ASSERT_EQ(cap->finish(), 0) << cap->err;
  EXPECT_THAT(cap->err, HasSubstr("packets captured"));
  EXPECT_THAT(cap->err, Not(HasSubstr("dropped")));
  std::string diag;
  std::string got = clientBytesOfFirstTcpStream(pcap, &diag);
  EXPECT_EQ(got.size(), sent.size()) << diag.substr(0, 2000);
  EXPECT_TRUE(got == sent) << "the captured payload differs from what was sent";
}

TEST_F(CaptureTest, LoopbackInsideThePodOnly) {
  // The pod's own loopback: a sidecar talking to its app.
  Fd listener = boundIn(pod_->name(), SOCK_STREAM, "127.0.0.1");
  const uint16_t port = localPort(listener.get());
  OneConnectionSink server(listener.get());
  // The host's loopback, with a marker that must never show up.
  Fd host_listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a = ipv4("127.0.0.1", 0);
  ASSERT_EQ(::bind(host_listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(host_listener.get(), 4), 0);
  OneConnectionSink host_server(host_listener.get());
  const std::string pcap = file("lo.pcap");

  Proc* cap = capture({"--interface", "lo", "-w", pcap, "tcp"});
  ASSERT_THAT(cap->err, HasSubstr("capturing on lo")) << cap->err;

  const std::string marker = "host-loopback-" + randomHex(16);
  Fd host_client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in h = ipv4("127.0.0.1", localPort(host_listener.get()));
  ASSERT_EQ(::connect(host_client.get(), reinterpret_cast<sockaddr*>(&h), sizeof(h)), 0);
  ASSERT_TRUE(writeAll(host_client.get(), marker));
  host_client.reset();
  EXPECT_EQ(host_server.wait(), marker);

  const std::string sent = "pod-loopback-" + randomHex(16) + patternBytes(3, 20000);
  ASSERT_TRUE(sendTcp(pod_->name(), "127.0.0.1", port, sent));
  ASSERT_EQ(server.wait(), sent);

  cap->signal(SIGTERM);
  ASSERT_EQ(cap->finish(), 0) << cap->err;
  std::string diag;
  EXPECT_TRUE(clientBytesOfFirstTcpStream(pcap, &diag) == sent) << diag.substr(0, 2000);
  EXPECT_THAT(readFile(pcap), Not(HasSubstr(marker))) << "the host's loopback was captured";
}

TEST_F(CaptureTest, StdoutPipesIntoTshark) {
  Fd receiver = boundIn(pod_->name(), SOCK_DGRAM, "0.0.0.0");
  const uint16_t port = localPort(receiver.get());
  std::string line;
  for (const auto& w :
       cli({"capture", "--count", "3", "-w", "-", "udp", "port", std::to_string(port)})) {
    line += "'" + w + "' ";
  }
  line = "set -o pipefail; " + line + "| tshark -n -r - -T fields -e data.data";
  Proc* pipe =
      started(std::make_unique<Proc>(std::vector<std::string>{"bash", "-c", line}, cleanEnv()));
  ASSERT_THAT(pipe->err, HasSubstr("capturing on any")) << pipe->err;

  const std::vector<std::string> datagrams = {"one-" + randomHex(8), "two-" + randomHex(8),
                                              "three-" + randomHex(8)};
  Fd sender(socketInNetns(client_->name(), AF_INET, SOCK_DGRAM));
  sockaddr_in to = ipv4(pod_ip_, port);
  for (const auto& d : datagrams) {
    ASSERT_EQ(
        ::sendto(sender.get(), d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)),
        static_cast<ssize_t>(d.size()));
  }
  // --count 3: siphon ends by itself, then tshark at the end of its input.
  ASSERT_EQ(pipe->finish(), 0) << pipe->out << pipe->err;
  std::istringstream out(pipe->out);
  std::vector<std::string> got;
  for (std::string hex; std::getline(out, hex);) got.push_back(fromHex(hex));
  EXPECT_EQ(got, datagrams) << pipe->out << pipe->err;
  EXPECT_THAT(pipe->err, HasSubstr("3 packets captured"));
}

TEST_F(CaptureTest, ABadFilterIsNamedWithLibpcapsWordsAndTheAgentServesOn) {
  const std::string pcap = file("bad.pcap");
  Result r = run(cli({"capture", "-w", pcap, "tcp prot 80"}), cleanEnv());
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("'tcp prot 80'")) << r;
  EXPECT_THAT(r.err, HasSubstr("syntax error")) << r;
  EXPECT_FALSE(std::filesystem::exists(pcap)) << "no file is left for a capture that never ran";

  Result info = run(cli({"info"}), cleanEnv());
  EXPECT_EQ(info.exit_code, 0) << info;
  Proc* cap = capture({"-w", file("after.pcap"), "icmp"});
  EXPECT_THAT(cap->err, HasSubstr("capturing on any")) << cap->err;
  cap->signal(SIGINT);
  EXPECT_EQ(cap->finish(), 0) << cap->err;
}

TEST_F(CaptureTest, AnUnknownInterfaceIsNotFound) {
  Result r = run(cli({"capture", "-i", "nosuch0", "-w", file("x.pcap")}), cleanEnv());
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_THAT(r.err, HasSubstr("'nosuch0'")) << r;
  EXPECT_THAT(r.err, HasSubstr("No such device")) << r;
  // Another namespace's interface is not the pod's: the veth's client end
  // exists, in the client namespace.
  ASSERT_EQ(run({"ip", "-n", client_->name(), "link", "show", client_if_}).exit_code, 0);
  Result other = run(cli({"capture", "-i", client_if_, "-w", file("y.pcap")}), cleanEnv());
  EXPECT_EQ(other.exit_code, 1) << other;
  EXPECT_THAT(other.err, HasSubstr("No such device")) << other;
}

TEST_F(CaptureTest, AClientThatStopsReadingGetsGapsAndCostsTheAgentNothing) {
  Fd receiver = boundIn(pod_->name(), SOCK_DGRAM, "0.0.0.0");
  const uint16_t port = localPort(receiver.get());
  const std::string filter = "udp port " + std::to_string(port);
  // The application reads every datagram that reaches it: each one passed
  // the capture point on its way in.
  std::atomic<uint64_t> received{0};
  std::atomic<bool> stop_receiving{false};
  std::thread app([&] {
    timeval tv{0, 100 * 1000};
    ::setsockopt(receiver.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[2048];
    while (!stop_receiving) {
      if (::recv(receiver.get(), buf, sizeof buf, 0) > 0) ++received;
    }
  });
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      t.join();
    }
  } joiner{stop_receiving, app};

  HoldingCaptureClient holder(endpoint_, token_, filter);
  ASSERT_TRUE(holder.waitFor([](const auto& s) { return s.frames >= 1 || !s.error.empty(); }));
  ASSERT_TRUE(holder.state().error.empty()) << holder.state().error;
  ASSERT_TRUE(holder.state().accepted);

  // Another session captures the same traffic with the real CLI meanwhile.
  const uint64_t kOtherWants = 200;
  Proc* other = capture({"--count", std::to_string(kOtherWants), "-w", file("other.pcap"), "udp",
                         "port", std::to_string(port)});
  ASSERT_THAT(other->err, HasSubstr("capturing on any")) << other->err;

  const uint64_t rss_before = rssKiB(agent_->child().pid());
  const int kDatagrams = 100000;
  const std::string body = patternBytes(11, 1000);
  Fd sender(socketInNetns(client_->name(), AF_INET, SOCK_DGRAM));
  sockaddr_in to = ipv4(pod_ip_, port);
  int sent = 0;
  for (int i = 0; i < kDatagrams; ++i) {
    if (::sendto(sender.get(), body.data(), body.size(), 0, reinterpret_cast<sockaddr*>(&to),
                 sizeof(to)) == static_cast<ssize_t>(body.size())) {
      ++sent;
    }
  }
  ASSERT_GT(sent, kDatagrams / 2);

  // The other session got its packets at once; the agent answers requests.
  EXPECT_EQ(other->finish(), 0) << other->err;
  EXPECT_THAT(other->err, HasSubstr(std::to_string(kOtherWants) + " packets captured"));
  Result info = run(cli({"info"}), cleanEnv());
  EXPECT_EQ(info.exit_code, 0) << info;
  // The stalled client cost the agent no memory beyond its window: 100 MB
  // went by.
  const uint64_t rss_after = rssKiB(agent_->child().pid());
  EXPECT_LT(rss_after, rss_before + 24 * 1024)
      << "agent RSS grew from " << rss_before << " KiB to " << rss_after << " KiB";

  // Nothing was reported while the client held its credit; once it reads,
  // the gap comes.
  EXPECT_EQ(holder.state().gaps, 0u);
  EXPECT_LT(holder.state().records, 20u) << "16 KiB of credit hold some 15 records";
  holder.release();
  ASSERT_TRUE(holder.waitFor([](const auto& s) { return s.gaps > 0; }))
      << "no gap reported; records " << holder.state().records;
  EXPECT_GT(holder.state().gap_packets, 0u);
  EXPECT_GT(holder.state().gap_bytes, 0u);

  // At the end, every datagram the application got is either a record or
  // counted in a gap (veth may drop some before the pod sees them: those
  // were never there to capture).
  holder.halfClose();
  ASSERT_TRUE(holder.waitFor([](const auto& s) { return s.half_closed || !s.error.empty(); }));
  HoldingCaptureClient::State end = holder.state();
  EXPECT_TRUE(end.error.empty()) << end.error;
  const uint64_t accounted = end.records + end.gap_packets;
  EXPECT_GE(accounted, received.load()) << "captured packets went missing without a gap";
  EXPECT_LE(accounted, static_cast<uint64_t>(sent))
      << "records " << end.records << ", gaps " << end.gaps << " of " << end.gap_packets
      << " packets";
  EXPECT_THAT(agent_->log(), HasSubstr("capture_ended"));
}

}  // namespace
}  // namespace siphon
