// PipeSender and PipeReceiver over a loopback TCP connection: a piped file
// read goes from its pipe into the socket and from the socket into a new
// pipe with the same bytes; the data pipe keeps them (a resume sends them
// again); the receiver takes exactly its frame's bytes, not the next one's.
#include "siphon/transport/pipe_sender.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <string>

#include "siphon/transport/spawn.h"
#include "tests/fakes/piped_bytes.h"

namespace siphon::net {
namespace {


std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 31 + seed) & 0xff);
  return s;
}

struct Pair {
  explicit Pair(asio::io_context& io) : a(io), b(io) {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    a.connect(acceptor.local_endpoint());
    acceptor.accept(b);
  }
  tcp::socket a, b;
};

struct Outcome {
  bool done = false;
  size_t sent_first = 0, sent_again = 0;
  std::string first, second, tail;
  std::string error;
};

awaitable<void> sendTwice(tcp::socket& s, PipeSender& sender, protocol::PipedBytes& data,
                          std::string trailer, Outcome* out) {
  auto first = co_await sender.send(s, data);
  if (!first.ok()) {
    out->error = first.status().ToString();
    co_return;
  }
  out->sent_first = *first;
  auto again = co_await sender.send(s, data);  // a replay: the same bytes
  if (!again.ok()) {
    out->error = again.status().ToString();
    co_return;
  }
  out->sent_again = *again;
  co_await asio::async_write(s, asio::buffer(trailer), use_awaitable);
}

awaitable<void> receiveTwice(tcp::socket& s, PipeReceiver& receiver, size_t n, size_t trailer,
                             Outcome* out) {
  for (std::string* into : {&out->first, &out->second}) {
    auto got = co_await receiver.receive(s, n);
    if (!got.ok()) {
      out->error = got.status().ToString();
      co_return;
    }
    if (got->piped) {
      auto bytes = got->piped->materialize();
      if (!bytes.ok()) {
        out->error = bytes.status().ToString();
        co_return;
      }
      *into = std::string(*bytes);
    } else {
      // The pipe filled: what it held, then the rest from the socket.
      *into = got->partial;
      std::string rest(n - into->size(), '\0');
      co_await asio::async_read(s, asio::buffer(rest), use_awaitable);
      *into += rest;
    }
  }
  out->tail.resize(trailer);
  co_await asio::async_read(s, asio::buffer(out->tail), use_awaitable);
  out->done = true;
}

TEST(PipeTest, BytesGoFromPipeToSocketToPipeAndTheDataPipeKeepsThem) {
  for (size_t n : {size_t{4096}, size_t{300000}, size_t{1} << 20}) {
    SCOPED_TRACE(testing::Message() << n << " bytes");
    asio::io_context io;
    Pair pair(io);
    const std::string bytes = pattern(n, static_cast<int>(n % 251));
    auto data = fakes::pipeHolding(bytes);
    PipeSender sender;
    PipeReceiver receiver;
    Outcome sent, got;
    spawn(io, sendTwice(pair.a, sender, *data, "trailer", &sent), "send");
    spawn(io, receiveTwice(pair.b, receiver, n, 7, &got), "receive");
    io.run();
    ASSERT_EQ(sent.error, "");
    ASSERT_EQ(got.error, "");
    EXPECT_EQ(sent.sent_first, n);
    EXPECT_EQ(sent.sent_again, n);
    ASSERT_TRUE(got.done);
    EXPECT_TRUE(got.first == bytes) << "first copy differs";
    EXPECT_TRUE(got.second == bytes) << "the replay differs";
    EXPECT_EQ(got.tail, "trailer");  // not taken by the second receive
    EXPECT_FALSE(data->materialized());
    auto kept = data->materialize();  // the data pipe still holds them all
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_TRUE(*kept == bytes);
  }
}

// A materialized frame (TLS took it into memory) is the caller's to send:
// the sender sends none of it.
TEST(PipeTest, AMaterializedFrameIsLeftToTheCaller) {
  asio::io_context io;
  Pair pair(io);
  auto data = fakes::pipeHolding(pattern(8192, 3));
  ASSERT_TRUE(data->materialize().ok());
  PipeSender sender;
  size_t sent = 99;
  spawn(io,
        [](tcp::socket& s, PipeSender& p, protocol::PipedBytes& d,
           size_t* out) -> awaitable<void> {
          auto r = co_await p.send(s, d);
          *out = r.ok() ? *r : 12345;
        }(pair.a, sender, *data, &sent),
        "send");
  io.run();
  EXPECT_EQ(sent, 0u);
}

// Bytes that come slowly are reported as they come (the session's
// keepalive counts them: a read over a slow link outlasts its timeout).
awaitable<void> sendSlowly(asio::io_context& io, tcp::socket& s, std::string bytes) {
  for (size_t at = 0; at < bytes.size(); at += 8192) {
    co_await asio::async_write(s, asio::buffer(bytes.data() + at, 8192), use_awaitable);
    asio::steady_timer t(io, std::chrono::milliseconds(20));
    co_await t.async_wait(use_awaitable);
  }
}

awaitable<void> receiveCounting(tcp::socket& s, PipeReceiver& r, size_t n, int* progress,
                                std::string* out) {
  auto got = co_await r.receive(s, n, [progress] { ++*progress; });
  if (!got.ok() || !got->piped) co_return;
  auto bytes = got->piped->materialize();
  if (bytes.ok()) *out = std::string(*bytes);
}

TEST(PipeTest, SlowBytesAreReportedAsTheyCome) {
  asio::io_context io;
  Pair pair(io);
  const std::string bytes = pattern(4 * 8192, 9);
  PipeReceiver receiver;
  int progress = 0;
  std::string got;
  spawn(io, sendSlowly(io, pair.a, bytes), "send");
  spawn(io, receiveCounting(pair.b, receiver, bytes.size(), &progress, &got), "receive");
  io.run();
  EXPECT_TRUE(got == bytes);
  EXPECT_GE(progress, 4) << "once per chunk at least";
}

// A send into a connection the peer closed is an error for the caller,
// not a SIGPIPE that kills the process (this test process does not ignore
// SIGPIPE: splice has no MSG_NOSIGNAL).
awaitable<void> sendUntilError(tcp::socket& s, PipeSender& sender, protocol::PipedBytes& data,
                               std::string* error) {
  // The first failure is the reset (ECONNRESET); the sends after it get
  // EPIPE, which is what raises the signal.
  for (int i = 0; i < 20; ++i) {
    auto r = co_await sender.send(s, data);
    if (!r.ok()) *error += std::string(r.status().message()) + "; ";
  }
}

TEST(PipeTest, ASendToAClosedPeerIsAnErrorNotASignal) {
  struct sigaction current {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &current), 0);
  ASSERT_NE(current.sa_handler, SIG_IGN) << "the test needs SIGPIPE's default";
  asio::io_context io;
  Pair pair(io);
  pair.b.set_option(asio::socket_base::linger(true, 0));
  pair.b.close();  // RST: the next sends fail with EPIPE or ECONNRESET
  auto data = fakes::pipeHolding(pattern(1 << 20, 5));
  PipeSender sender;
  std::string error;
  spawn(io, sendUntilError(pair.a, sender, *data, &error), "send");
  io.run();
  EXPECT_NE(error, "") << "the sends never failed";
}

// The peer's close during a receive is an error, not bytes.
TEST(PipeTest, ThePeersCloseEndsAReceive) {
  asio::io_context io;
  Pair pair(io);
  PipeReceiver receiver;
  std::string error;
  asio::write(pair.a, asio::buffer(std::string(100, 'x')));
  pair.a.close();
  spawn(io,
        [](tcp::socket& s, PipeReceiver& r, std::string* out) -> awaitable<void> {
          auto got = co_await r.receive(s, 5000);
          *out = got.ok() ? "ok" : std::string(got.status().message());
        }(pair.b, receiver, &error),
        "receive");
  io.run();
  EXPECT_NE(error.find("closed"), std::string::npos) << error;
}

}  // namespace
}  // namespace siphon::net
