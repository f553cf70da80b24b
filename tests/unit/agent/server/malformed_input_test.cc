// Hostile input against a real agent, in process and without root: while
// one healthy session is open and working (requests, an outgoing stream to
// a loopback echo server), raw TCP clients send each class of malformed
// input. Each gets its typed answer (Reject or Goaway with the
// siphon.v1.ErrorCode of docs/PROTOCOL.md §7), its connection is closed by
// the agent, and the healthy session goes on as if nothing happened: its
// requests answer and its stream's bytes come back exact.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "agent/server/server.h"
#include "agent/target/proc_fs.h"
#include "siphon/client/client.h"
#include "siphon/protocol/codec.h"
#include "siphon/protocol/handshake.h"
#include "siphon/status.h"
#include "siphon/transport/frame_io.h"
#include "tests/fakes/loopback.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using std::chrono::milliseconds;

constexpr char kToken[] = "malformed-input-token";

using fakes::loopbackListener;

using fakes::randomBytes;

std::string frameBytes(void (*fill)(v1::Frame&)) {
  v1::Frame f;
  fill(f);
  return protocol::encodeFrame(f);
}

std::string be32(uint32_t n) {
  return {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
          static_cast<char>(n)};
}

v1::StreamOpen outgoingTo(uint16_t port) {
  v1::StreamOpen o;
  o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
  o.mutable_outgoing()->set_host("127.0.0.1");
  o.mutable_outgoing()->set_port(port);
  return o;
}

// One malformed-input class: what the raw client sends (before or after a
// valid Hello) and what must come back.
struct Case {
  std::string name;
  bool after_hello;  // a Hello first, its Welcome read, then `bytes`
  std::string bytes;
  bool half_close = false;  // shutdown(SHUT_WR) after the bytes
  // The code of the Reject (before the Hello) or Goaway (after); nullopt:
  // neither may come (the connection just ends).
  std::optional<v1::ErrorCode> code;
};

// What a raw connection saw: the frames the agent sent and whether it
// closed the connection (EOF, or a reset because bytes it never read were
// still queued when it closed).
struct Seen {
  std::vector<v1::Frame> frames;
  bool closed = false;
  std::string error;  // why reading stopped otherwise
};

// Reads until the agent closes; a watchdog (a hang guard, not a timing
// check) cancels the read after 10 s, which leaves `closed` false.
net::awaitable<Seen> readUntilClosed(net::tcp::socket& socket, const std::string& leftover) {
  Seen seen;
  std::string all = leftover;
  auto fired = std::make_shared<bool>(false);
  asio::steady_timer watchdog(socket.get_executor());
  watchdog.expires_after(std::chrono::seconds(10));
  watchdog.async_wait([&socket, fired](net::error_code ec) {
    if (ec) return;
    *fired = true;
    net::error_code ignored;
    socket.cancel(ignored);
  });
  char buf[4096];
  while (true) {
    net::error_code ec;
    size_t n = co_await socket.async_read_some(asio::buffer(buf),
                                               asio::redirect_error(net::use_awaitable, ec));
    all.append(buf, n);
    if (!ec) continue;
    if (ec == asio::error::eof || ec == asio::error::connection_reset) {
      seen.closed = !*fired;
    } else {
      seen.error = *fired ? "no close within 10 s" : ec.message();
    }
    break;
  }
  watchdog.cancel();
  protocol::FrameDecoder decoder(1 << 20);
  decoder.feed(all);
  while (true) {
    auto next = decoder.next();
    if (!next.ok()) {
      seen.error = "undecodable bytes from the agent: " + std::string(next.status().message());
      break;
    }
    if (!next->has_value()) break;
    if (!(*next)->is_data) seen.frames.push_back((*next)->frame);
  }
  co_return seen;
}

class MalformedInputTest : public testing::Test {
 protected:
  void SetUp() override {
    AgentConfig config;
    config.listen = "127.0.0.1:0";
    config.token = kToken;
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::make_unique<RealProcFs>(), spec);
    std::string host, port;
    ASSERT_TRUE(net::splitHostPort(agent_.address(), &host, &port).ok());
    endpoint_ =
        net::tcp::endpoint(asio::ip::make_address(host), static_cast<uint16_t>(std::stoi(port)));
  }

  // Runs one case on a fresh connection; checks the answer and the close.
  net::awaitable<void> runCase(const Case& c) {
    // No SCOPED_TRACE: its stack is per thread, and coroutines interleave.
    const std::string& name = c.name;
    net::tcp::socket socket(co_await asio::this_coro::executor);
    net::error_code ec;
    co_await socket.async_connect(endpoint_, asio::redirect_error(net::use_awaitable, ec));
    EXPECT_FALSE(ec) << name << ": " << ec.message();
    if (ec) co_return;
    std::string leftover;
    if (c.after_hello) {
      auto hello = protocol::makeHello("malformed", kToken, {}, nullptr);
      EXPECT_TRUE((co_await net::writeFrame(socket, hello)).ok()) << name;
      auto welcome = co_await net::readFirstFrame(socket, milliseconds(10000), 1 << 20);
      EXPECT_TRUE(welcome.ok() && welcome->frame.has_welcome())
          << name << ": "
          << (welcome.ok() ? welcome->frame.DebugString() : welcome.status().ToString());
      if (!welcome.ok()) co_return;
      leftover = welcome->leftover;
    }
    co_await asio::async_write(socket, asio::buffer(c.bytes),
                               asio::redirect_error(net::use_awaitable, ec));
    EXPECT_FALSE(ec) << name << ": " << ec.message();
    if (c.half_close) socket.shutdown(net::tcp::socket::shutdown_send, ec);
    Seen seen = co_await readUntilClosed(socket, leftover);
    EXPECT_TRUE(seen.closed) << name << ": the agent did not close the connection: " << seen.error;
    std::optional<v1::ErrorCode> got;
    std::string message;
    for (const v1::Frame& f : seen.frames) {
      if (f.has_reject()) {
        got = f.reject().code();
        message = f.reject().message();
        EXPECT_FALSE(c.after_hello) << name << ": a Reject after the Welcome";
      } else if (f.has_goaway()) {
        got = f.goaway().code();
        message = f.goaway().message();
        EXPECT_TRUE(c.after_hello) << name << ": a Goaway before any Welcome";
      }
    }
    if (c.code) {
      EXPECT_EQ(got, c.code) << name << ": got " << (got ? v1::ErrorCode_Name(*got) : "nothing")
                             << ", expected " << v1::ErrorCode_Name(*c.code);
      EXPECT_FALSE(message.empty()) << name << ": a typed error says why";
    } else {
      EXPECT_EQ(got, std::nullopt)
          << name << ": unexpected " << v1::ErrorCode_Name(*got) << ": " << message;
    }
    net::error_code ignored;
    socket.close(ignored);
  }

  fakes::InProcessAgent agent_;
  net::tcp::endpoint endpoint_;
};

std::vector<Case> malformedCases() {
  std::vector<Case> cases;
  // ---- before the Hello: the answer is a Reject.
  cases.push_back({"garbage before the Hello (text)", false,
                   "GET / HTTP/1.1\r\nHost: agent\r\n\r\n" +
                       protocol::encodeFrame(protocol::makeHello("x", kToken, {}, nullptr)),
                   false, v1::FRAME_TOO_LARGE});
  cases.push_back({"garbage before the Hello (binary)", false,
                   std::string("\x00\x00\x00\x05\xff\xff\xff\xff\xff", 9) +
                       protocol::encodeFrame(protocol::makeHello("x", kToken, {}, nullptr)),
                   false, v1::PROTOCOL_ERROR});
  cases.push_back({"a frame before the Hello", false, frameBytes([](v1::Frame& f) {
                     f.mutable_request()->set_request_id(1);
                     f.mutable_request()->mutable_info();
                   }),
                   false, v1::PROTOCOL_ERROR});
  cases.push_back({"oversized length prefix before the Hello", false, be32(0x7fffffff), false,
                   v1::FRAME_TOO_LARGE});
  // ---- in a session: the answer is a Goaway and the session ends.
  // 1 GiB: above any --max-frame-size the agent may be given.
  cases.push_back({"oversized length prefix", true, be32(1u << 30), false, v1::FRAME_TOO_LARGE});
  cases.push_back({"zero length", true, be32(0), false, v1::PROTOCOL_ERROR});
  cases.push_back({"bytes that are not a Frame", true,
                   be32(5) + std::string("\xff\xff\xff\xff\xff", 5), false, v1::PROTOCOL_ERROR});
  // Field 100 (varint 1): a frame kind this build does not know.
  cases.push_back({"unknown oneof field", true, be32(3) + std::string("\xa0\x06\x01", 3), false,
                   v1::PROTOCOL_ERROR});
  cases.push_back({"a second Hello", true,
                   protocol::encodeFrame(protocol::makeHello("x", kToken, {}, nullptr)), false,
                   v1::PROTOCOL_ERROR});
  cases.push_back({"data on a stream never opened", true, protocol::encodeDataFrame(41, "hi"),
                   false, v1::PROTOCOL_ERROR});
  cases.push_back({"half-close of a stream never opened", true,
                   frameBytes([](v1::Frame& f) { f.mutable_half_close()->set_stream_id(7); }),
                   false, v1::PROTOCOL_ERROR});
  cases.push_back({"window update of a stream never opened (the agent's parity)", true,
                   frameBytes([](v1::Frame& f) {
                     f.mutable_window_update()->set_stream_id(2);
                     f.mutable_window_update()->set_increment(100);
                   }),
                   false, v1::PROTOCOL_ERROR});
  // The truncated frame: the length promises 100 bytes, 10 come, then the
  // client's FIN. To the agent that is a cut connection (UNAVAILABLE): the
  // half frame is dropped and the session waits for a resume, so nothing
  // is sent, and the connection ends.
  cases.push_back({"truncated frame, then close", true, be32(100) + std::string(10, '\x0a'), true,
                   std::nullopt});
  return cases;
}

TEST_F(MalformedInputTest, EachClassGetsItsTypedErrorAndLeavesOtherSessionsAlone) {
  fakes::EchoServer echo(loopbackListener(), fakes::EchoServer::Kind::kStream);
  const uint16_t echo_port = echo.port();
  std::vector<Case> cases = malformedCases();
  {
    // Window overflow: a stream of the raw session, then a WindowUpdate
    // that takes its credit past the largest window (2^32-1).
    v1::Frame open;
    *open.mutable_open() = outgoingTo(echo_port);
    open.mutable_open()->set_stream_id(1);
    open.mutable_open()->set_initial_window(65536);
    v1::Frame update;
    update.mutable_window_update()->set_stream_id(1);
    update.mutable_window_update()->set_increment(0xffffffffu);
    cases.push_back({"window update overflowing the window", true,
                     protocol::encodeFrame(open) + protocol::encodeFrame(update), false,
                     v1::FLOW_CONTROL_ERROR});
  }

  size_t checked = 0;
  fakes::withClient(agent_.address(), kToken,
                    [&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
                      auto opened = co_await c->openStream(outgoingTo(echo_port));
                      EXPECT_TRUE(opened.ok()) << opened.status();
                      if (!opened.ok()) co_return;
                      const std::shared_ptr<client::ClientStream> stream = *opened;
                      std::string sent, got;
                      // One round of healthy work: a request answered, a chunk echoed back
                      // exactly.
                      auto work = [&](unsigned round) -> net::awaitable<bool> {
                        v1::Request info;
                        info.mutable_info();
                        auto answer = co_await c->call(info, milliseconds(10000));
                        EXPECT_TRUE(answer.ok()) << answer.status();
                        const std::string chunk = randomBytes(32 * 1024 + round, round);
                        sent += chunk;
                        absl::Status wrote = co_await stream->write(chunk);
                        EXPECT_TRUE(wrote.ok()) << wrote;
                        while (answer.ok() && wrote.ok() && got.size() < sent.size()) {
                          auto piece = co_await stream->read();
                          EXPECT_TRUE(piece.ok() && piece->has_value())
                              << (piece.ok() ? "EOF" : piece.status().ToString());
                          if (!piece.ok() || !piece->has_value()) co_return false;
                          got += **piece;
                        }
                        EXPECT_TRUE(got == sent)
                            << "the healthy stream's bytes differ after round " << round
                            << (round > 0 ? " (case: " + cases[round - 1].name + ")" : "");
                        co_return answer.ok() && wrote.ok() && got == sent;
                      };

                      if (!co_await work(0)) co_return;
                      for (size_t i = 0; i < cases.size(); ++i) {
                        co_await runCase(cases[i]);
                        // A failure in work() below names the round: case i ran just before.
                        if (!co_await work(static_cast<unsigned>(i + 1))) co_return;
                        ++checked;
                      }
                      EXPECT_TRUE(stream->halfClose().ok());
                      while (true) {
                        auto piece = co_await stream->read();
                        EXPECT_TRUE(piece.ok()) << piece.status();
                        if (!piece.ok() || !piece->has_value()) break;
                        got += **piece;
                      }
                      EXPECT_TRUE(got == sent) << "the healthy stream's bytes differ at its end";
                      // Still the same session: no malformed one disturbed it.
                      v1::Request info;
                      info.mutable_info();
                      auto last = co_await c->call(info);
                      EXPECT_TRUE(last.ok()) << last.status();
                      if (last.ok()) {
                        EXPECT_EQ(last->info().session_id(), c->welcome().session_id());
                      }
                    });
  EXPECT_EQ(checked, cases.size());
}

}  // namespace
}  // namespace siphon::agent
