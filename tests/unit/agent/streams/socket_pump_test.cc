// SocketPump without root: the "target" socket is one end of a loopback TCP
// connection, a socketpair or a UDP socket; the test holds the other end (the
// "remote" peer). The stream runs between two in-process protocol::Sessions
// (agent and client) joined by a pipe that moves takeWrites() bytes into the
// other's onBytes(). The event loop is driven with poll() until nothing
// moves, so no result depends on timing.
//
// Over 600 lines: one component's cases (TCP, unix, UDP, backpressure, ends) sharing the session pair below.
#include "agent/streams/socket_pump.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "siphon/protocol/session.h"
#include "siphon/status.h"

namespace siphon::agent::streams {
namespace {

namespace asio = net::asio;
using outgoing::formatAddress;
using outgoing::ipAddress;
using outgoing::localAddress;
using outgoing::toProto;

// ------------------------------------------------------------ sockets

struct Pair {
  UniqueFd agent;   // handed to the pump
  UniqueFd remote;  // the test plays the peer on the target side
};

// A connected TCP pair on 127.0.0.1.
Pair tcpPair() {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(listener.get(), 1), 0);
  socklen_t len = sizeof(a);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len);
  UniqueFd agent(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(agent.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  UniqueFd remote(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(remote.valid());
  return {std::move(agent), std::move(remote)};
}

Pair unixPair(int type) {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, type | SOCK_CLOEXEC, 0, fds), 0);
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

UniqueFd udpSocket() {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

SockAddr addressOf(int fd) {
  auto a = localAddress(fd);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? *a : SockAddr{};
}

// Connected UDP pair on 127.0.0.1.
Pair udpPair() {
  Pair p{udpSocket(), udpSocket()};
  SockAddr a = addressOf(p.agent.get()), r = addressOf(p.remote.get());
  EXPECT_EQ(::connect(p.agent.get(), r.get(), r.len), 0);
  EXPECT_EQ(::connect(p.remote.get(), a.get(), a.len), 0);
  return p;
}

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// Everything readable now (the socket is non-blocking); `eof` when the peer
// closed its end.
std::string readAvailable(int fd, bool* eof = nullptr, int* error = nullptr) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 && eof) *eof = true;
    if (n < 0 && errno != EAGAIN && error) *error = errno;
    return out;
  }
}

size_t unreadBytes(int fd) {
  int n = 0;
  ::ioctl(fd, FIONREAD, &n);
  return static_cast<size_t>(n);
}

// --------------------------------------------------------- the sessions

protocol::SessionLimits smallWindows() {
  protocol::SessionLimits l;
  l.initial_stream_window = 4096;
  // A reader that keeps up may grow a window this far (session.h).
  l.max_stream_window = 16384;
  return l;
}

// The client side: records what arrives; consumes only when told to.
class ClientSide : public protocol::SessionHandler {
 public:
  explicit ClientSide(protocol::Session& s) : session(s) {}
  protocol::Session& session;
  bool consume_all = true;
  std::set<uint64_t> hold;  // streams whose data is not consumed (yet)

  std::map<uint64_t, std::string> data;
  std::map<uint64_t, std::vector<std::string>> frames;
  std::map<uint64_t, uint64_t> unconsumed;
  std::vector<v1::StreamDatagram> datagrams;
  std::set<uint64_t> half_closed;
  std::map<uint64_t, v1::Error> resets;
  std::set<uint64_t> accepted;

  void onStreamAccept(v1::StreamAccept a) override { accepted.insert(a.stream_id()); }
  void onStreamData(uint64_t id, std::string_view payload) override {
    data[id].append(payload);
    frames[id].emplace_back(payload);
    if (consume_all && !hold.contains(id)) {
      session.consumed(id, payload.size());
    } else {
      unconsumed[id] += payload.size();
    }
  }
  void onStreamDatagram(v1::StreamDatagram d) override {
    if (consume_all && !hold.contains(d.stream_id())) {
      session.consumed(d.stream_id(), d.payload().size());
    } else {
      unconsumed[d.stream_id()] += d.payload().size();
    }
    datagrams.push_back(std::move(d));
  }
  void onStreamHalfClose(uint64_t id) override { half_closed.insert(id); }
  void onStreamReset(uint64_t id, v1::Error e) override { resets[id] = std::move(e); }

  void consumeNow(uint64_t id) {
    hold.erase(id);
    session.consumed(id, unconsumed[id]);
    unconsumed[id] = 0;
  }
};

// The agent side: routes frames to pumps like AgentSession does, and is
// every pump's host.
class AgentSide : public protocol::SessionHandler, public SessionHost {
 public:
  AgentSide(protocol::Session& s, std::function<void()> wake)
      : session_(s), wake_(std::move(wake)) {}

  std::map<uint64_t, std::shared_ptr<SocketPump>> pumps;
  std::set<uint64_t> released;
  bool is_ended = false;
  std::vector<v1::StreamOpen> opens;

  // SessionHost: what a pump uses of it.
  const std::string& id() const override { return id_; }
  const std::string& clientName() const override { return id_; }
  bool ended() const override { return is_ended; }
  protocol::Session& session() override { return session_; }
  void respond(v1::Response) override {}
  void registerStream(uint64_t, std::shared_ptr<StreamEndpoint>) override {}
  void unregisterStream(uint64_t id) override {
    released.insert(id);
    pumps.erase(id);
  }
  absl::StatusOr<uint64_t> openStream(v1::StreamOpen open) override {
    return session_.openStream(std::move(open));
  }
  void resetStream(uint64_t id, const v1::Error& error) override {
    session_.resetStream(id, error);
  }
  void wake() override { wake_(); }
  void countSent(uint64_t, uint64_t) override {}
  void countGap(uint64_t, uint64_t) override {}
  void logLimitHit(const absl::Status&) override {}

  void onStreamOpen(v1::StreamOpen open) override { opens.push_back(std::move(open)); }
  void onStreamData(uint64_t id, std::string_view payload) override {
    if (auto* p = pump(id)) {
      p->onData(payload);
    } else {
      session_.consumed(id, payload.size());
    }
  }
  void onStreamDatagram(v1::StreamDatagram d) override {
    if (auto* p = pump(d.stream_id())) p->onDatagram(std::move(d));
  }
  void onStreamHalfClose(uint64_t id) override {
    if (auto* p = pump(id)) p->onHalfClose();
  }
  void onStreamReset(uint64_t id, v1::Error e) override {
    auto it = pumps.find(id);
    if (it == pumps.end()) return;
    auto p = it->second;
    pumps.erase(it);
    p->onReset(e);
  }
  void onStreamWritable(uint64_t id) override {
    if (auto* p = pump(id)) p->onWritable();
  }

 private:
  SocketPump* pump(uint64_t id) {
    auto it = pumps.find(id);
    return it == pumps.end() ? nullptr : it->second.get();
  }
  std::string id_ = "pump-test";
  protocol::Session& session_;
  std::function<void()> wake_;
};

class SocketPumpTest : public testing::Test {
 protected:
  void SetUp() override { build(protocol::SessionLimits{}); }

  void TearDown() override {
    // Pumps and their host hold each other: close the pumps and let their
    // aborted waits run before the loop goes away.
    for (auto& [id, p] : std::map(agent_->pumps)) p->close();
    agent_->pumps.clear();
    io_.restart();
    io_.poll();
  }

  void build(protocol::SessionLimits limits) {
    client_session_.emplace(protocol::Role::kClient, limits);
    agent_session_.emplace(protocol::Role::kAgent, limits);
    client_.emplace(*client_session_);
    agent_ = std::make_shared<AgentSide>(*agent_session_, [this] {
      agent_awake_ = true;
      asio::post(io_, [this] { pipe(); });
    });
  }

  // Moves frames both ways until neither side has any to move. Like the
  // agent's transport, the agent side writes only after handling received
  // bytes or when woken: a frame the pump queues without wake() stays put,
  // and the test sees it stuck.
  void pipe() {
    bool moved = true;
    while (moved) {
      moved = false;
      auto now = protocol::Clock::now();
      while (agent_awake_ && agent_session_->hasWrites()) {
        std::string bytes;
        const protocol::WriteBatch batch = agent_session_->takeWrites();  // owns the buffers
        for (auto b : batch.buffers()) bytes.append(b);
        ASSERT_TRUE(client_session_->onBytes(bytes, *client_, now).ok());
        moved = true;
      }
      agent_awake_ = false;
      while (client_session_->hasWrites()) {
        std::string bytes;
        const protocol::WriteBatch batch = client_session_->takeWrites();  // owns the buffers
        for (auto b : batch.buffers()) bytes.append(b);
        ASSERT_TRUE(agent_session_->onBytes(bytes, *agent_, now).ok());
        agent_awake_ = true;
        moved = true;
      }
    }
  }

  // Runs the loop and the pipe until nothing moves any more.
  void settle() {
    for (int quiet = 0; quiet < 3;) {
      pipe();
      size_t n = io_.poll();
      io_.restart();
      quiet = (n == 0 && !client_session_->hasWrites()) ? quiet + 1 : 0;
    }
  }

  // Opens a stream from the client, makes the pump on the agent side with
  // `fd` and accepts it, as the outgoing service does.
  std::shared_ptr<SocketPump> open(UniqueFd fd, SocketPump::Options options,
                                   uint32_t client_window = 0) {
    v1::StreamOpen o;
    o.set_initial_window(client_window);
    o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
    auto id = client_session_->openStream(o);
    EXPECT_TRUE(id.ok());
    pipe();
    EXPECT_FALSE(agent_->opens.empty());
    options.peer_window = agent_->opens.back().initial_window();
    auto pump = std::make_shared<SocketPump>(io_.get_executor(), *id, agent_, std::move(options));
    EXPECT_TRUE(pump->attach(std::move(fd)).ok());
    agent_->pumps[*id] = pump;
    v1::StreamAccept accept;
    accept.set_stream_id(*id);
    EXPECT_TRUE(agent_session_->acceptStream(accept).ok());
    agent_->wake();
    pump->start();
    settle();
    EXPECT_TRUE(client_->accepted.contains(*id));
    id_ = *id;
    return pump;
  }

  // Sends `bytes` from the client as the credit allows, settling between.
  void clientSend(uint64_t id, std::string bytes) {
    while (!bytes.empty()) {
      size_t credit = client_session_->sendCredit(id);
      ASSERT_GT(credit, 0u) << "the client has no credit left";
      size_t n = std::min(credit, bytes.size());
      ASSERT_TRUE(client_session_->sendData(id, bytes.substr(0, n)).ok());
      bytes.erase(0, n);
      settle();
    }
  }

  asio::io_context io_;
  std::optional<protocol::Session> client_session_;
  std::optional<protocol::Session> agent_session_;
  std::optional<ClientSide> client_;
  std::shared_ptr<AgentSide> agent_;
  uint64_t id_ = 0;
  bool agent_awake_ = false;
};

SocketPump::Options streamOptions(bool tcp = true) {
  SocketPump::Options o;
  o.kind = SocketPump::Kind::kStream;
  o.tcp = tcp;
  o.label = "the remote";
  return o;
}

SocketPump::Options messageOptions(bool udp) {
  SocketPump::Options o;
  o.kind = SocketPump::Kind::kMessage;
  o.udp = udp;
  o.label = "the remote";
  return o;
}

TEST_F(SocketPumpTest, BytesFlowBothWaysInOrder) {
  Pair p = tcpPair();
  const int remote = p.remote.get();
  setNonBlocking(remote);
  auto pump = open(std::move(p.agent), streamOptions());
  const std::string up = randomBytes(1 << 20, 1);   // remote -> client
  const std::string down = randomBytes(300000, 2);  // client -> remote
  size_t up_sent = 0, down_sent = 0;
  std::string remote_got;
  for (int i = 0; i < 100000; ++i) {
    if (client_->data[id_].size() == up.size() && remote_got.size() == down.size()) break;
    if (up_sent < up.size()) {
      ssize_t n = ::send(remote, up.data() + up_sent, up.size() - up_sent, MSG_DONTWAIT);
      if (n > 0) up_sent += static_cast<size_t>(n);
    }
    if (size_t credit = client_session_->sendCredit(id_); credit > 0 && down_sent < down.size()) {
      size_t n = std::min(credit, down.size() - down_sent);
      ASSERT_TRUE(client_session_->sendData(id_, down.substr(down_sent, n)).ok());
      down_sent += n;
    }
    settle();
    remote_got += readAvailable(remote);
  }
  EXPECT_TRUE(client_->data[id_] == up) << "target -> client bytes differ";
  EXPECT_TRUE(remote_got == down) << "client -> target bytes differ";
  EXPECT_EQ(pump->bytesIn(), up.size());
  EXPECT_EQ(pump->bytesOut(), down.size());
  EXPECT_TRUE(client_->resets.empty());
}

TEST_F(SocketPumpTest, TargetHalfCloseFirstThenClient) {
  Pair p = tcpPair();
  const int remote = p.remote.get();
  setNonBlocking(remote);
  auto pump = open(std::move(p.agent), streamOptions());

  ASSERT_EQ(::send(remote, "reply", 5, 0), 5);
  ASSERT_EQ(::shutdown(remote, SHUT_WR), 0);
  settle();
  EXPECT_EQ(client_->data[id_], "reply");
  EXPECT_TRUE(client_->half_closed.contains(id_));

  // The client's direction is still open after the target's FIN.
  clientSend(id_, "more after your FIN");
  bool eof = false;
  EXPECT_EQ(readAvailable(remote, &eof), "more after your FIN");
  EXPECT_FALSE(eof);
  EXPECT_FALSE(pump->dead());
  EXPECT_TRUE(agent_session_->streamOpen(id_));

  ASSERT_TRUE(client_session_->halfClose(id_).ok());
  settle();
  readAvailable(remote, &eof);
  EXPECT_TRUE(eof) << "the client's HalfClose must reach the target as a FIN";
  EXPECT_TRUE(pump->dead());
  EXPECT_TRUE(agent_->released.contains(id_));
  EXPECT_FALSE(agent_session_->streamOpen(id_));
  EXPECT_FALSE(client_session_->streamOpen(id_));
  EXPECT_TRUE(client_->resets.empty());
}

TEST_F(SocketPumpTest, ClientHalfCloseFirstThenTarget) {
  Pair p = tcpPair();
  const int remote = p.remote.get();
  setNonBlocking(remote);
  auto pump = open(std::move(p.agent), streamOptions());

  clientSend(id_, "request");
  ASSERT_TRUE(client_session_->halfClose(id_).ok());
  settle();
  bool eof = false;
  EXPECT_EQ(readAvailable(remote, &eof), "request");
  EXPECT_TRUE(eof);

  // The target still answers after the client's FIN.
  ASSERT_EQ(::send(remote, "response", 8, 0), 8);
  settle();
  EXPECT_EQ(client_->data[id_], "response");
  EXPECT_FALSE(client_->half_closed.contains(id_));
  EXPECT_FALSE(pump->dead());

  ASSERT_EQ(::shutdown(remote, SHUT_WR), 0);
  settle();
  EXPECT_TRUE(client_->half_closed.contains(id_));
  EXPECT_TRUE(pump->dead());
  EXPECT_TRUE(agent_->released.contains(id_));
}

TEST_F(SocketPumpTest, ANonConsumingClientStopsOnlyItsOwnStream) {
  build(smallWindows());  // 4096-byte windows
  Pair a = tcpPair(), b = tcpPair();
  setNonBlocking(a.remote.get());
  setNonBlocking(b.remote.get());
  auto pump_a = open(std::move(a.agent), streamOptions());
  const uint64_t id_a = id_;
  client_->hold.insert(id_a);
  auto pump_b = open(std::move(b.agent), streamOptions());
  const uint64_t id_b = id_;

  const std::string big = randomBytes(200000, 3);
  size_t sent = 0;
  ssize_t n = ::send(a.remote.get(), big.data(), big.size(), MSG_DONTWAIT);
  ASSERT_GT(n, 4096);
  sent = static_cast<size_t>(n);
  settle();
  // Exactly the window, then the agent stops reading: the rest waits in
  // the kernel's buffers, where TCP flow control slows the sender.
  EXPECT_EQ(client_->data[id_a].size(), 4096u);
  EXPECT_EQ(pump_a->bytesIn(), 4096u);
  EXPECT_GT(unreadBytes(pump_a->fd()), 0u);

  // The other stream is not held up.
  ASSERT_EQ(::send(b.remote.get(), "b still flows", 13, 0), 13);
  settle();
  EXPECT_EQ(client_->data[id_b], "b still flows");
  EXPECT_EQ(client_->data[id_a].size(), 4096u);

  // Consuming lets the stalled stream go on, in order, to the last byte.
  client_->consumeNow(id_a);
  for (int i = 0; i < 100000 && client_->data[id_a].size() < big.size(); ++i) {
    if (sent < big.size()) {
      n = ::send(a.remote.get(), big.data() + sent, big.size() - sent, MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
    }
    settle();
  }
  EXPECT_TRUE(client_->data[id_a] == big);
}

TEST_F(SocketPumpTest, ASlowTargetHoldsTheClientToItsWindow) {
  build(smallWindows());
  // A unix stream pair with a small send buffer: the kernel wakes the writer
  // as soon as the reader takes data (a tiny TCP window would reopen only on
  // a timer).
  Pair p = unixPair(SOCK_STREAM);
  const int remote = p.remote.get();
  setNonBlocking(remote);
  int small = 4096;
  ::setsockopt(p.agent.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  auto pump = open(std::move(p.agent), streamOptions(/*tcp=*/false));

  const std::string big = randomBytes(1 << 20, 4);
  size_t sent = 0;
  // The remote does not read: the client runs out of credit.
  for (int i = 0; i < 10000; ++i) {
    size_t credit = client_session_->sendCredit(id_);
    if (credit == 0) break;
    size_t n = std::min(credit, big.size() - sent);
    ASSERT_TRUE(client_session_->sendData(id_, big.substr(sent, n)).ok());
    sent += n;
    settle();
  }
  EXPECT_EQ(client_session_->sendCredit(id_), 0u);
  EXPECT_LT(sent, big.size());
  // What the agent holds unwritten is bounded by the window it granted
  // (grown, at most, to max_stream_window while the socket took data).
  EXPECT_LE(sent - pump->bytesOut(), smallWindows().max_stream_window);

  std::string got;
  for (int i = 0; i < 100000 && got.size() < big.size(); ++i) {
    got += readAvailable(remote);
    if (size_t credit = client_session_->sendCredit(id_); credit > 0 && sent < big.size()) {
      size_t n = std::min(credit, big.size() - sent);
      ASSERT_TRUE(client_session_->sendData(id_, big.substr(sent, n)).ok());
      sent += n;
    }
    settle();
  }
  EXPECT_TRUE(got == big) << "got " << got.size() << " of " << big.size() << ", sent " << sent
                          << ", written " << pump->bytesOut();
}

TEST_F(SocketPumpTest, TargetResetReachesTheClient) {
  Pair p = tcpPair();
  auto pump = open(std::move(p.agent), streamOptions());
  linger l{1, 0};
  ::setsockopt(p.remote.get(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  p.remote.reset();  // RST
  settle();
  ASSERT_TRUE(client_->resets.contains(id_));
  EXPECT_EQ(client_->resets[id_].code(), v1::UNAVAILABLE);
  EXPECT_EQ(client_->resets[id_].message(), "read from the remote: Connection reset by peer");
  EXPECT_EQ(client_->resets[id_].errno_value(), ECONNRESET);
  EXPECT_TRUE(pump->dead());
  EXPECT_TRUE(agent_->released.contains(id_));
  EXPECT_FALSE(client_session_->streamOpen(id_));
}

TEST_F(SocketPumpTest, ClientResetAbortsTheTargetConnection) {
  Pair p = tcpPair();
  const int remote = p.remote.get();
  setNonBlocking(remote);
  auto pump = open(std::move(p.agent), streamOptions());
  client_session_->resetStream(id_, toProtoError(protoError(v1::CANCELLED, "user abort")));
  settle();
  EXPECT_TRUE(pump->dead());
  int error = 0;
  bool eof = false;
  readAvailable(remote, &eof, &error);
  EXPECT_EQ(error, ECONNRESET) << "a reset stream aborts the TCP connection (RST), eof=" << eof;
}

TEST_F(SocketPumpTest, SessionEndClosesTheSocketAndSendsNothing) {
  Pair p = tcpPair();
  const int remote = p.remote.get();
  setNonBlocking(remote);
  auto pump = open(std::move(p.agent), streamOptions());
  pump->close();
  EXPECT_FALSE(agent_session_->hasWrites());
  bool eof = false;
  readAvailable(remote, &eof);
  EXPECT_TRUE(eof);
}

TEST_F(SocketPumpTest, ConnectedUdpKeepsDatagramBoundaries) {
  Pair p = udpPair();
  const int remote = p.remote.get();
  auto pump = open(std::move(p.agent), messageOptions(/*udp=*/true));
  const std::string a(100, 'a'), b(200, 'b');
  ASSERT_EQ(::send(remote, a.data(), a.size(), 0), 100);
  ASSERT_EQ(::send(remote, b.data(), b.size(), 0), 200);
  ASSERT_EQ(::send(remote, "", 0, 0), 0);  // an empty datagram is a datagram
  settle();
  EXPECT_EQ(client_->frames[id_], (std::vector<std::string>{a, b, ""}));

  ASSERT_TRUE(client_session_->sendData(id_, std::string(300, 'x')).ok());
  ASSERT_TRUE(client_session_->sendData(id_, "yyyyy").ok());
  settle();
  char buf[1000];
  EXPECT_EQ(::recv(remote, buf, sizeof(buf), MSG_DONTWAIT), 300);
  EXPECT_EQ(::recv(remote, buf, sizeof(buf), MSG_DONTWAIT), 5);
  EXPECT_EQ(pump->dropped(), 0u);
}

TEST_F(SocketPumpTest, ADatagramWaitsForCreditAndGoesWhole) {
  build(smallWindows());  // 4096: one 3000-byte datagram fits, two do not
  Pair p = udpPair();
  const int remote = p.remote.get();
  auto pump = open(std::move(p.agent), messageOptions(true));
  client_->hold.insert(id_);
  const std::string a(3000, 'a'), b(3000, 'b');
  ASSERT_EQ(::send(remote, a.data(), a.size(), 0), 3000);
  ASSERT_EQ(::send(remote, b.data(), b.size(), 0), 3000);
  settle();
  EXPECT_EQ(client_->frames[id_], std::vector<std::string>{a});
  client_->consumeNow(id_);
  settle();
  EXPECT_EQ(client_->frames[id_], (std::vector<std::string>{a, b}));
  EXPECT_EQ(pump->dropped(), 0u);
}

TEST_F(SocketPumpTest, AUdpDatagramAboveTheWindowIsDropped) {
  build(smallWindows());  // 3072 bytes at most (3/4 of the window)
  Pair p = udpPair();
  const int remote = p.remote.get();
  auto pump = open(std::move(p.agent), messageOptions(true));
  const std::string big(4000, 'x');
  ASSERT_EQ(::send(remote, big.data(), big.size(), 0), 4000);
  ASSERT_EQ(::send(remote, "small", 5, 0), 5);
  settle();
  EXPECT_EQ(client_->frames[id_], std::vector<std::string>{"small"});
  EXPECT_EQ(pump->dropped(), 1u);
  EXPECT_TRUE(client_->resets.empty());
}

TEST_F(SocketPumpTest, UnconnectedUdpCarriesThePeerAddress) {
  UniqueFd agent_sock = udpSocket();
  const SockAddr agent_addr = addressOf(agent_sock.get());
  UniqueFd remote = udpSocket();
  const SockAddr remote_addr = addressOf(remote.get());
  SocketPump::Options o;
  o.kind = SocketPump::Kind::kDatagram;
  o.udp = true;
  auto pump = open(std::move(agent_sock), o);

  v1::StreamDatagram d;
  d.set_stream_id(id_);
  *d.mutable_peer() = toProto(remote_addr);
  d.set_payload("to the remote");
  ASSERT_TRUE(client_session_->sendDatagram(d).ok());
  settle();
  char buf[100];
  SockAddr from;
  from.len = sizeof(from.storage);
  ssize_t n = ::recvfrom(remote.get(), buf, sizeof(buf), MSG_DONTWAIT, from.get(), &from.len);
  ASSERT_EQ(n, 13);
  EXPECT_EQ(std::string(buf, 13), "to the remote");
  EXPECT_EQ(formatAddress(from), formatAddress(agent_addr));

  ASSERT_EQ(::sendto(remote.get(), "back", 4, 0, agent_addr.get(), agent_addr.len), 4);
  settle();
  ASSERT_EQ(client_->datagrams.size(), 1u);
  EXPECT_EQ(client_->datagrams[0].payload(), "back");
  EXPECT_EQ(client_->datagrams[0].peer().ip(), "127.0.0.1");
  EXPECT_EQ(client_->datagrams[0].peer().port(), toProto(remote_addr).port());
}

// A handover (docs/CONTINUITY.md section 8) of an unconnected UDP stream
// frozen with datagrams waiting to go: each moves with its destination, and
// the restored pump sends each to its own once thawed.
TEST_F(SocketPumpTest, AFrozenUdpStreamsWaitingDatagramsMoveWithTheirDestinations) {
  UniqueFd agent_sock = udpSocket();
  UniqueFd first = udpSocket(), second = udpSocket();
  const SockAddr first_addr = addressOf(first.get()), second_addr = addressOf(second.get());
  SocketPump::Options o;
  o.kind = SocketPump::Kind::kDatagram;
  o.udp = true;
  auto pump = open(std::move(agent_sock), o);
  pump->freeze();
  for (const auto& [to, payload] : {std::pair{&first_addr, "to the first"},
                                    std::pair{&second_addr, "to the second"}}) {
    v1::StreamDatagram d;
    d.set_stream_id(id_);
    *d.mutable_peer() = toProto(*to);
    d.set_payload(payload);
    ASSERT_TRUE(client_session_->sendDatagram(d).ok());
  }
  settle();
  char buf[100];
  EXPECT_LT(::recv(first.get(), buf, sizeof buf, MSG_DONTWAIT), 0) << "frozen: nothing goes";

  v1::PumpExport state;
  std::vector<UniqueFd> fds;
  absl::Status exported = pump->exportState(&state, &fds);
  ASSERT_TRUE(exported.ok()) << exported;
  ASSERT_EQ(state.out_size(), 2);
  ASSERT_EQ(state.out_to_size(), 2);
  ASSERT_EQ(fds.size(), 1u);
  auto restored = SocketPump::restore(io_.get_executor(), agent_, state, std::move(fds[0]));
  ASSERT_TRUE(restored.ok()) << restored.status();
  agent_->pumps[id_] = *restored;
  pump.reset();  // the old agent lets go without a word (it exits)
  (*restored)->thaw();
  settle();
  ssize_t n = ::recv(first.get(), buf, sizeof buf, MSG_DONTWAIT);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "to the first");
  n = ::recv(second.get(), buf, sizeof buf, MSG_DONTWAIT);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "to the second");

  v1::PumpExport broken = state;
  broken.set_out_to(0, std::string(sizeof(sockaddr_storage) + 1, 'x'));
  UniqueFd spare = udpSocket();
  EXPECT_FALSE(SocketPump::restore(io_.get_executor(), agent_, broken, std::move(spare)).ok())
      << "a destination that is no sockaddr is refused";
}

TEST_F(SocketPumpTest, SeqpacketKeepsRecordsAndHalfCloses) {
  Pair p = unixPair(SOCK_SEQPACKET);
  const int remote = p.remote.get();
  setNonBlocking(remote);
  auto pump = open(std::move(p.agent), messageOptions(/*udp=*/false));
  ASSERT_EQ(::send(remote, "rec1", 4, 0), 4);
  ASSERT_EQ(::send(remote, "record-two", 10, 0), 10);
  ASSERT_EQ(::shutdown(remote, SHUT_WR), 0);
  settle();
  EXPECT_EQ(client_->frames[id_], (std::vector<std::string>{"rec1", "record-two"}));
  EXPECT_TRUE(client_->half_closed.contains(id_));

  ASSERT_TRUE(client_session_->sendData(id_, "abc").ok());
  ASSERT_TRUE(client_session_->sendData(id_, "defgh").ok());
  ASSERT_TRUE(client_session_->halfClose(id_).ok());
  settle();
  char buf[100];
  EXPECT_EQ(::recv(remote, buf, sizeof(buf), 0), 3);
  EXPECT_EQ(::recv(remote, buf, sizeof(buf), 0), 5);
  EXPECT_EQ(::recv(remote, buf, sizeof(buf), 0), 0) << "HalfClose -> shutdown(SHUT_WR)";
  EXPECT_TRUE(pump->dead());
  EXPECT_TRUE(agent_->released.contains(id_));
}

TEST_F(SocketPumpTest, ASeqpacketRecordAboveTheWindowResetsTheStream) {
  build(smallWindows());
  Pair p = unixPair(SOCK_SEQPACKET);
  auto pump = open(std::move(p.agent), messageOptions(false));
  const std::string big(4000, 'r');
  ASSERT_EQ(::send(p.remote.get(), big.data(), big.size(), 0), 4000);
  settle();
  ASSERT_TRUE(client_->resets.contains(id_));
  EXPECT_EQ(client_->resets[id_].code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(pump->dead());
}

TEST_F(SocketPumpTest, DataOnAnUnconnectedUdpStreamIsRefused) {
  SocketPump::Options o;
  o.kind = SocketPump::Kind::kDatagram;
  o.udp = true;
  auto pump = open(udpSocket(), o);
  ASSERT_TRUE(client_session_->sendData(id_, "no address").ok());
  settle();
  ASSERT_TRUE(client_->resets.contains(id_));
  EXPECT_EQ(client_->resets[id_].code(), v1::INVALID_ARGUMENT);
}

// Runs `co` on the fixture's loop until it finishes.
template <typename T>
T runOn(asio::io_context& io, net::awaitable<T> co) {
  std::optional<T> result;
  asio::co_spawn(io, std::move(co), [&](std::exception_ptr e, T value) {
    if (e) std::rethrow_exception(e);
    result = std::move(value);
  });
  io.restart();
  while (!result && io.run_one() > 0) {
  }
  return std::move(*result);
}

// A loopback listener whose accept queue is full: it drops further SYNs, so
// a connect to it stays in progress until the caller's deadline.
struct FullBacklog {
  FullBacklog() {
    auto any = ipAddress("127.0.0.1", 0);
    EXPECT_EQ(::bind(listener.get(), any->get(), any->len), 0);
    EXPECT_EQ(::listen(listener.get(), 0), 0);
    addr = addressOf(listener.get());
    EXPECT_EQ(::connect(filler.get(), addr.get(), addr.len), 0);
  }
  UniqueFd listener{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  UniqueFd filler{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  SockAddr addr;
};

TEST_F(SocketPumpTest, AConnectNobodyAnswersTimesOut) {
  FullBacklog full;
  const SockAddr& addr = full.addr;

  auto pump = std::make_shared<SocketPump>(io_.get_executor(), 2, agent_, streamOptions());
  ASSERT_TRUE(pump->attach(UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0))).ok());
  ASSERT_NE(::connect(pump->fd(), addr.get(), addr.len), 0);
  ASSERT_EQ(errno, EINPROGRESS);
  absl::Status s = runOn(
      io_, pump->waitWritable(std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
}

TEST_F(SocketPumpTest, CloseDuringAConnectCancelsTheWait) {
  FullBacklog full;
  const SockAddr& addr = full.addr;

  auto pump = std::make_shared<SocketPump>(io_.get_executor(), 2, agent_, streamOptions());
  ASSERT_TRUE(pump->attach(UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0))).ok());
  ::connect(pump->fd(), addr.get(), addr.len);
  asio::post(io_, [pump] { pump->close(); });  // the client resets meanwhile
  absl::Status s =
      runOn(io_, pump->waitWritable(std::chrono::steady_clock::now() + std::chrono::hours(1)));
  EXPECT_EQ(errorCodeOf(s), v1::CANCELLED) << s;
  EXPECT_FALSE(pump->attach(UniqueFd(::socket(AF_INET, SOCK_STREAM, 0))).ok())
      << "a dead pump takes no socket";
}
}  // namespace
}  // namespace siphon::agent::streams
