// SessionStolenStream without root: the HTTP engine's side is a ByteStream
// driven by Asio's composed operations, as http1.cc and http2_stolen.cc use
// it; the session side is a FakeSessionHost's real protocol::Session and
// the FakePeer at its other end (tests/fakes/agent/fake_session_host.h), so
// windows, credit and the stream's ends are the protocol's own.
#include "agent/steal/session_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/loopback.h"

namespace siphon::agent::steal {
namespace {

namespace asio = net::asio;
using http::ByteStream;
using fakes::FakePeer;
using fakes::randomBytes;
using fakes::FakeSessionHost;

protocol::SessionLimits smallWindows() {
  protocol::SessionLimits l;
  l.initial_stream_window = 4096;
  l.max_stream_window = 16384;  // a reader that keeps up may grow it this far
  return l;
}

// What the engine's side did: each operation's end.
struct Written {
  bool done = false;
  net::error_code ec;
};
struct Read {
  bool done = false;
  net::error_code ec;
  std::string bytes;
};

class SessionStolenStreamTest : public testing::Test {
 protected:
  void SetUp() override { build(protocol::SessionLimits{}); }
  void TearDown() override {
    // The stream and its host hold each other: end the session and let
    // the aborted operations run before the loop goes away.
    host_->end();
    io_.restart();
    io_.poll();
  }

  void build(protocol::SessionLimits limits) {
    host_ = std::make_shared<FakeSessionHost>("s", "c", limits);
    peer_.emplace(*host_);
  }

  // Moves frames and runs the loop until nothing moves any more.
  void settle() {
    for (int quiet = 0; quiet < 3;) {
      peer_->pipe();
      const size_t n = io_.poll();
      io_.restart();
      quiet = (n == 0 && !peer_->session().hasWrites() && !host_->session().hasWrites())
                  ? quiet + 1
                  : 0;
    }
  }

  // The agent opens a StolenRequest stream and joins a SessionStolenStream
  // to it, as the steal service does; `accept`: the client accepts it.
  std::shared_ptr<SessionStolenStream> open(bool accept = true) {
    peer_->accept_opens = accept;
    v1::StreamOpen o;
    o.mutable_stolen_request()->set_subscription_id(1);
    o.mutable_stolen_request()->set_method("GET");
    auto id = host_->openStream(o);
    EXPECT_TRUE(id.ok()) << id.status();
    id_ = *id;
    auto s = std::make_shared<SessionStolenStream>(io_.get_executor(), id_, host_);
    host_->registerStream(id_, s);
    settle();
    EXPECT_FALSE(peer_->opens.empty());
    return s;
  }

  void acceptNow() {
    v1::StreamAccept a;
    a.set_stream_id(id_);
    ASSERT_TRUE(peer_->session().acceptStream(a).ok());
    settle();
  }

  // The client sends `bytes` as its credit allows.
  void clientSend(std::string bytes) {
    while (!bytes.empty()) {
      const size_t credit = peer_->session().sendCredit(id_);
      ASSERT_GT(credit, 0u) << "the client has no credit left";
      const size_t n = std::min(credit, bytes.size());
      ASSERT_TRUE(peer_->session().sendData(id_, bytes.substr(0, n)).ok());
      bytes.erase(0, n);
      settle();
    }
  }

  // Writes all of `bytes`, then (when `end`) ends the request.
  std::shared_ptr<Written> write(ByteStream& up, std::string bytes, bool end) {
    auto w = std::make_shared<Written>();
    asio::co_spawn(
        io_,
        [&up, w, bytes = std::move(bytes), end]() -> net::awaitable<void> {
          const std::string data = bytes;  // a frame variable (GCC 12)
          co_await asio::async_write(up, asio::buffer(data),
                                     asio::redirect_error(net::use_awaitable, w->ec));
          if (!w->ec && end) up.shutdownSend();
          w->done = true;
        },
        asio::detached);
    return w;
  }

  // Reads until an error (eof at the end), `piece` bytes at a time.
  std::shared_ptr<Read> readAll(ByteStream& up, size_t piece = 10000) {
    auto r = std::make_shared<Read>();
    asio::co_spawn(
        io_,
        [&up, r, piece]() -> net::awaitable<void> {
          std::vector<char> buf(piece);
          while (true) {
            const size_t n = co_await up.async_read_some(
                asio::buffer(buf), asio::redirect_error(net::use_awaitable, r->ec));
            if (r->ec) break;
            r->bytes.append(buf.data(), n);
          }
          r->done = true;
        },
        asio::detached);
    return r;
  }

  // One read of at most `piece` bytes.
  std::shared_ptr<Read> readOnce(ByteStream& up, size_t piece = 10000) {
    auto r = std::make_shared<Read>();
    asio::co_spawn(
        io_,
        [&up, r, piece]() -> net::awaitable<void> {
          std::vector<char> buf(piece);
          const size_t n = co_await up.async_read_some(
              asio::buffer(buf), asio::redirect_error(net::use_awaitable, r->ec));
          r->bytes.assign(buf.data(), n);
          r->done = true;
        },
        asio::detached);
    return r;
  }

  bool streamGone() const {
    return std::find(host_->unregistered.begin(), host_->unregistered.end(), id_) !=
               host_->unregistered.end() &&
           !host_->session().streamOpen(id_);
  }

  asio::io_context io_;
  std::shared_ptr<FakeSessionHost> host_;
  std::optional<FakePeer> peer_;
  uint64_t id_ = 0;
};

// A request larger than the windows goes out as the client's credit comes
// back, a response larger than them comes in as the engine reads it, each
// byte-exact, and the stream ends with both HalfCloses.
TEST_F(SessionStolenStreamTest, ARequestAndItsResponseCrossWholeThroughSmallWindows) {
  build(smallWindows());  // 4096-byte windows
  auto s = open();
  ByteStream up(io_.get_executor(), s);
  const std::string request = randomBytes(300000, 1);
  const std::string response = randomBytes(1 << 20, 2);
  auto w = write(up, request, /*end=*/true);
  auto r = readAll(up);
  settle();
  ASSERT_TRUE(w->done);
  EXPECT_FALSE(w->ec) << w->ec.message();
  EXPECT_TRUE(peer_->data[id_] == request) << "the request differs";
  EXPECT_TRUE(peer_->half_closed.contains(id_));

  clientSend(response);
  ASSERT_TRUE(peer_->session().halfClose(id_).ok());
  settle();
  ASSERT_TRUE(r->done);
  EXPECT_EQ(r->ec, asio::error::eof);
  EXPECT_TRUE(r->bytes == response) << "the response differs";
  EXPECT_EQ(s->bytesIn(), request.size());
  EXPECT_EQ(s->bytesOut(), response.size());
  EXPECT_TRUE(peer_->resets.empty());
  EXPECT_TRUE(streamGone());
  EXPECT_FALSE(s->isOpen());
}

// An engine that stops reading (an HTTP/2 client that reads slowly) holds
// the session's sender to the stream's window: nothing more waits in the
// agent, and reading again lets the rest come.
TEST_F(SessionStolenStreamTest, AnEngineThatStopsReadingStopsTheSessionAtTheWindow) {
  build(smallWindows());
  auto s = open();
  ByteStream up(io_.get_executor(), s);
  auto w = write(up, "GET / HTTP/1.1\r\n\r\n", true);
  settle();
  const std::string response = randomBytes(200000, 3);
  size_t sent = 0;
  while (size_t credit = peer_->session().sendCredit(id_)) {
    ASSERT_LT(sent, response.size()) << "the session's credit never ran out";
    const size_t n = std::min(credit, response.size() - sent);
    ASSERT_TRUE(peer_->session().sendData(id_, response.substr(sent, n)).ok());
    sent += n;
    settle();
  }
  EXPECT_GT(sent, 0u);
  EXPECT_LE(sent, smallWindows().max_stream_window);

  auto r = readAll(up);
  settle();
  EXPECT_GT(peer_->session().sendCredit(id_), 0u) << "reading gave no credit back";
  clientSend(response.substr(sent));
  ASSERT_TRUE(peer_->session().halfClose(id_).ok());
  settle();
  ASSERT_TRUE(r->done);
  EXPECT_TRUE(r->bytes == response);
  EXPECT_EQ(r->ec, asio::error::eof);
}

// Given up on before the request was whole (a body over the limit, an
// aborted client): the session's stream is reset, never ended as if the
// request were complete.
TEST_F(SessionStolenStreamTest, ReleasedBeforeTheRequestIsWholeResetsTheStream) {
  auto s = open();
  {
    ByteStream up(io_.get_executor(), s);
    auto w = write(up, "POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc", /*end=*/false);
    settle();
    ASSERT_TRUE(w->done);
  }  // released here
  settle();
  ASSERT_TRUE(peer_->resets.contains(id_));
  EXPECT_EQ(peer_->resets[id_].code(), v1::CANCELLED);
  EXPECT_FALSE(peer_->half_closed.contains(id_));
  EXPECT_TRUE(streamGone());
}

// Released once the request was whole and the response read (its length
// said so) before the session's HalfClose came: what else the session sends
// is dropped with its credit given back, and the stream ends cleanly.
TEST_F(SessionStolenStreamTest, ReleasedAfterAWholeExchangeEndsCleanlyOnTheSessionsHalfClose) {
  build(smallWindows());
  auto s = open();
  auto up = std::make_unique<ByteStream>(io_.get_executor(), s);
  auto w = write(*up, "GET / HTTP/1.1\r\n\r\n", true);
  settle();
  clientSend("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  auto r = readOnce(*up);
  settle();
  ASSERT_TRUE(r->done);
  EXPECT_EQ(r->bytes, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  up.reset();  // the engine is done
  settle();
  EXPECT_FALSE(streamGone());
  // More than a window: only dropped bytes' credit lets it through.
  clientSend(randomBytes(20000, 4));
  ASSERT_TRUE(peer_->session().halfClose(id_).ok());
  settle();
  EXPECT_TRUE(peer_->resets.empty());
  EXPECT_TRUE(streamGone());
}

// A Reset from the session (the developer's server failed) ends the read
// under way and any later write with connection_reset.
TEST_F(SessionStolenStreamTest, TheSessionsResetFailsTheReadUnderWayAndLaterWrites) {
  auto s = open();
  ByteStream up(io_.get_executor(), s);
  auto r = readOnce(up);
  settle();
  EXPECT_FALSE(r->done);
  v1::Error e;
  e.set_code(v1::UNAVAILABLE);
  e.set_message("local server refused");
  peer_->session().resetStream(id_, e);
  settle();
  ASSERT_TRUE(r->done);
  EXPECT_EQ(r->ec, asio::error::connection_reset);
  auto w = write(up, "more", false);
  settle();
  ASSERT_TRUE(w->done);
  EXPECT_EQ(w->ec, asio::error::connection_reset);
  EXPECT_NE(std::find(host_->unregistered.begin(), host_->unregistered.end(), id_),
            host_->unregistered.end());
}

// The session ended (its client went away for good): what waits fails.
TEST_F(SessionStolenStreamTest, TheSessionsEndFailsWhatWaits) {
  auto s = open();
  ByteStream up(io_.get_executor(), s);
  auto r = readOnce(up);
  settle();
  s->close();
  settle();
  ASSERT_TRUE(r->done);
  EXPECT_EQ(r->ec, asio::error::connection_reset);
  EXPECT_FALSE(up.is_open());
}

// cancel() ends the read under way (a request body that failed ends the
// response read); the stream itself goes on.
TEST_F(SessionStolenStreamTest, CancelEndsTheReadUnderWayButNotTheStream) {
  auto s = open();
  ByteStream up(io_.get_executor(), s);
  auto first = readOnce(up);
  settle();
  up.cancel();
  settle();
  ASSERT_TRUE(first->done);
  EXPECT_EQ(first->ec, asio::error::operation_aborted);
  auto second = readOnce(up);
  clientSend("still here");
  settle();
  ASSERT_TRUE(second->done);
  EXPECT_FALSE(second->ec);
  EXPECT_EQ(second->bytes, "still here");
}

// Without early data the request waits for the session's accept, then
// goes; its end goes after it.
TEST_F(SessionStolenStreamTest, TheRequestWaitsForTheAcceptWithoutEarlyData) {
  auto s = open(/*accept=*/false);
  ByteStream up(io_.get_executor(), s);
  auto w = write(up, "GET /early HTTP/1.1\r\n\r\n", true);
  settle();
  EXPECT_FALSE(w->done);
  EXPECT_TRUE(peer_->data[id_].empty());
  acceptNow();
  ASSERT_TRUE(w->done);
  EXPECT_FALSE(w->ec);
  EXPECT_EQ(peer_->data[id_], "GET /early HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(peer_->half_closed.contains(id_));
}

// A request's end asked for before the accept (nothing written) goes
// after it: never a HalfClose on a stream the session has not taken.
TEST_F(SessionStolenStreamTest, AnEndBeforeTheAcceptGoesAfterIt) {
  auto s = open(/*accept=*/false);
  ByteStream up(io_.get_executor(), s);
  up.shutdownSend();
  settle();
  EXPECT_FALSE(peer_->half_closed.contains(id_));
  acceptNow();
  EXPECT_TRUE(peer_->half_closed.contains(id_));
  EXPECT_TRUE(peer_->resets.empty());
}

// An aborted exchange resets the stream even after the request was whole.
TEST_F(SessionStolenStreamTest, AbortResetsAWholeRequestsStream) {
  auto s = open();
  ByteStream up(io_.get_executor(), s);
  auto w = write(up, "GET / HTTP/1.1\r\n\r\n", true);
  settle();
  up.abort();
  settle();
  ASSERT_TRUE(peer_->resets.contains(id_));
  EXPECT_EQ(peer_->resets[id_].code(), v1::CANCELLED);
  EXPECT_TRUE(streamGone());
}

}  // namespace
}  // namespace siphon::agent::steal
