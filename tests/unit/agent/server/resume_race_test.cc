// Resumes of one session that race, end to end against an in-process agent
// on loopback (docs/CONTINUITY.md): a raw client opens a session, has the
// agent queue known answers it never acknowledges, cuts the connection and
// fires several resumes of the session at once, round after round. The agent
// replays everything unacknowledged each time; every connection must see a
// prefix of one sequence (an earlier resume that lost is closed before any
// session frame reaches it, or was superseded after it had a run), and the
// winner every frame exactly once, in order. No root: the target is a fake
// /proc.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/server/server.h"
#include "siphon/protocol/codec.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "siphon/transport/session_transport.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using std::chrono::milliseconds;

constexpr pid_t kPodPid = 4242;
constexpr char kToken[] = "race-token";
constexpr int kRequests = 40;  // answers queued before the cut
constexpr int kResumes = 8;    // resumes fired at once, per round
constexpr int kRounds = 200;

v1::Frame infoRequest(uint64_t id) {
  v1::Frame f;
  f.mutable_request()->mutable_info();
  f.mutable_request()->set_request_id(id);
  return f;
}

net::awaitable<bool> connectTo(net::tcp::socket& socket, const std::string& address) {
  std::string host, port;
  EXPECT_TRUE(net::splitHostPort(address, &host, &port).ok());
  net::error_code ec;
  co_await socket.async_connect(
      net::tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(std::stoi(port))),
      asio::redirect_error(net::use_awaitable, ec));
  EXPECT_FALSE(ec) << ec.message();
  co_return !ec;
}

// The next frame from `socket`, or nullopt at EOF or an error.
net::awaitable<std::optional<v1::Frame>> nextFrame(net::tcp::socket& socket,
                                                   protocol::FrameDecoder& decoder) {
  while (true) {
    auto next = decoder.next();
    if (!next.ok()) {
      ADD_FAILURE() << next.status();
      co_return std::nullopt;
    }
    if (next->has_value()) {
      EXPECT_FALSE((*next)->is_data) << "no stream is open";
      co_return std::move((*next)->frame);
    }
    auto buf = decoder.prepare(64 * 1024);
    net::error_code ec;
    size_t n = co_await socket.async_read_some(asio::buffer(buf.data(), buf.size()),
                                               asio::redirect_error(net::use_awaitable, ec));
    if (ec) co_return std::nullopt;
    decoder.commit(n);
  }
}

// What one resumed connection saw: the answers (request id and bytes) in
// the order they came, and whether its own probe's answer was among them.
struct Seen {
  std::vector<uint64_t> ids;
  std::vector<std::string> bytes;
  bool welcomed = false;
  bool own_answer = false;
  bool done = false;
};

class ResumeRaceTest : public testing::Test {
 protected:
  void SetUp() override {
    AgentConfig config;
    config.token = kToken;
    auto procfs = std::make_unique<fakes::FakeProcFs>();
    procfs->setSelfPid(kPodPid);
    fakes::FakeProcess pod;
    pod.netns_inode = 4026530001;
    procfs->addProcess(kPodPid, pod);
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::move(procfs), spec);
  }

  fakes::InProcessAgent agent_;
};

// One resume: Hello with the session's id, token and 0 frames received (the
// raw client never acks), the Welcome, then a probe request of its own; reads
// answers until its probe is answered, or the agent closes the connection.
net::awaitable<void> resumeOnce(net::tcp::socket& socket, const v1::ResumeRequest& resume,
                                uint64_t probe, Seen& seen) {
  if (probe == 0) {
    // A client that gives up at once: its Hello, then a reset (no linger),
    // so the agent reads the Hello but cannot write the Welcome.
    (void)co_await net::writeFrame(socket, protocol::makeHello("race", kToken, {}, &resume));
    net::error_code ignored;
    socket.set_option(asio::socket_base::linger(true, 0), ignored);
    socket.close(ignored);
    seen.done = true;
    co_return;
  }
  asio::steady_timer hang_guard(socket.get_executor());
  hang_guard.expires_after(std::chrono::seconds(10));
  hang_guard.async_wait([&socket](net::error_code ec) {
    if (ec) return;
    ADD_FAILURE() << "a resumed connection neither ended nor got its answer";
    net::error_code ignored;
    socket.close(ignored);
  });
  protocol::FrameDecoder decoder(1 << 20);
  if ((co_await net::writeFrame(socket, protocol::makeHello("race", kToken, {}, &resume))).ok()) {
    auto first = co_await net::readFirstFrame(socket, milliseconds(5000), 1 << 20);
    if (first.ok()) {
      EXPECT_TRUE(first->frame.has_welcome()) << first->frame.ShortDebugString();
      seen.welcomed = first->frame.has_welcome() && first->frame.welcome().resumed();
      decoder.feed(first->leftover);
    }
  }
  if (seen.welcomed && (co_await net::writeFrame(socket, infoRequest(probe))).ok()) {
    while (auto f = co_await nextFrame(socket, decoder)) {
      if (f->has_goaway()) break;
      if (!f->has_response()) continue;  // acks, pings
      seen.ids.push_back(f->response().request_id());
      seen.bytes.push_back(f->response().SerializeAsString());
      if (f->response().request_id() == probe) {
        seen.own_answer = true;
        break;
      }
    }
  }
  hang_guard.cancel();
  seen.done = true;
}

TEST_F(ResumeRaceTest, ConcurrentResumesGiveTheWinnerEveryFrameOnceInOrder) {
  const std::string address = agent_.address();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    // The session, and kRequests answers it holds unacknowledged.
    v1::ResumeRequest resume;
    std::vector<std::string> expected;
    {
      net::tcp::socket socket(ex);
      if (!co_await connectTo(socket, address)) co_return;
      EXPECT_TRUE(
          (co_await net::writeFrame(socket, protocol::makeHello("race", kToken, {}, nullptr)))
              .ok());
      auto first = co_await net::readFirstFrame(socket, milliseconds(5000), 1 << 20);
      if (!first.ok() || !first->frame.has_welcome()) {
        ADD_FAILURE() << "no Welcome";
        co_return;
      }
      resume.set_session_id(first->frame.welcome().session_id());
      resume.set_resume_token(first->frame.welcome().resume_token());
      resume.set_last_seq_received(0);
      std::string requests;
      for (int i = 1; i <= kRequests; ++i) requests += protocol::encodeFrame(infoRequest(i));
      net::error_code ec;
      co_await asio::async_write(socket, asio::buffer(requests),
                                 asio::redirect_error(net::use_awaitable, ec));
      EXPECT_FALSE(ec) << ec.message();
      protocol::FrameDecoder decoder(1 << 20);
      decoder.feed(first->leftover);
      while (expected.size() < static_cast<size_t>(kRequests)) {
        auto f = co_await nextFrame(socket, decoder);
        if (!f) break;
        if (f->has_response()) {
          EXPECT_EQ(f->response().request_id(), expected.size() + 1);
          expected.push_back(f->response().SerializeAsString());
        }
      }
      EXPECT_EQ(expected.size(), static_cast<size_t>(kRequests));
      if (expected.size() != static_cast<size_t>(kRequests)) co_return;
      socket.close(ec);  // cut: no Goaway, nothing acknowledged
    }

    std::vector<std::string> sequence = expected;  // what the agent replays
    for (int round = 0; round < kRounds; ++round) {
      SCOPED_TRACE(::testing::Message() << "round " << round);
      std::vector<std::unique_ptr<net::tcp::socket>> sockets;
      std::vector<Seen> seen(kResumes);
      seen.reserve(kResumes + 1);  // the coroutines hold references
      for (int k = 0; k < kResumes; ++k) {
        sockets.push_back(std::make_unique<net::tcp::socket>(ex));
        if (!co_await connectTo(*sockets.back(), address)) co_return;
      }
      // All Hellos at once: their handshakes interleave in the agent. Every
      // other client gives up right after its Hello (its Welcome cannot be
      // written); the others read until their probe is answered or the
      // agent closes the connection. A resume that neither happens is a
      // session the agent holds for nobody.
      auto fire = [&](int k, bool gives_up) {
        const uint64_t probe = gives_up ? 0 : 1000 + round * 10 + k;
        asio::co_spawn(ex, resumeOnce(*sockets[k], resume, probe, seen[k]), asio::detached);
      };
      auto allDone = [&] {
        for (const Seen& s : seen) {
          if (!s.done) return false;
        }
        return true;
      };
      for (int k = 0; k < kResumes; ++k) fire(k, k % 2 == 0);
      EXPECT_TRUE(co_await fakes::eventually(allDone));
      bool served = false;
      for (const Seen& s : seen) served = served || s.own_answer;
      if (!served) {
        // The latest resume was one that gave up: the session waits for the
        // next, which gets everything.
        sockets.push_back(std::make_unique<net::tcp::socket>(ex));
        seen.emplace_back();
        if (!co_await connectTo(*sockets.back(), address)) co_return;
        fire(kResumes, false);
        EXPECT_TRUE(co_await fakes::eventually(allDone));
        EXPECT_TRUE(seen.back().own_answer) << "a resume after the race was not served";
      }

      // The longest view is the agent's sequence; every other one a prefix
      // of it (a loser saw nothing, or what it got before it was replaced).
      const Seen* longest = &seen[0];
      for (const Seen& s : seen) {
        if (s.bytes.size() > longest->bytes.size()) longest = &s;
      }
      for (const Seen& s : seen) {
        for (size_t i = 0; i < s.bytes.size(); ++i) {
          EXPECT_EQ(s.bytes[i], longest->bytes[i]) << "frame " << i + 1 << ": answer " << s.ids[i]
                                                   << " where the sequence has " << longest->ids[i];
        }
      }
      // Every frame once, in order: the answers held before (all replayed,
      // since nothing was acked), then this round's.
      std::set<uint64_t> unique(longest->ids.begin(), longest->ids.end());
      EXPECT_EQ(unique.size(), longest->ids.size()) << "an answer came twice";
      EXPECT_GE(longest->bytes.size(), sequence.size());
      for (size_t i = 0; i < std::min(sequence.size(), longest->bytes.size()); ++i) {
        EXPECT_EQ(longest->bytes[i], sequence[i]) << "frame " << i + 1;
      }
      sequence = longest->bytes;
      for (auto& s : sockets) {
        net::error_code ignored;
        s->close(ignored);
      }
      if (testing::Test::HasFailure()) break;
    }
  });
}

}  // namespace
}  // namespace siphon::agent
