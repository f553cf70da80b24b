// The HTTP engine's side of a handover (engine.h, "handover"): connections
// park between requests, an engine in another place adopts them and goes
// on from the bytes the first one had read, and a request under way is
// answered whole before its connection parks. Two engines on loopback stand
// for the old and the new agent; the client never notices.
#include <gtest/gtest.h>

#include "tests/unit/agent/steal/http/http1_harness.h"

namespace siphon::agent::steal::http::testing {
namespace {

using Response = bhttp::response<bhttp::string_body>;

std::string parkAnswer(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// An application answering "app <target>" to every request, keep-alive.
AppServer::Handler parkApp() {
  return [](int fd) {
    Peer peer(fd);
    while (auto req = peer.readRequest()) {
      if (!peer.send(parkAnswer("app " + std::string(req->target())))) return;
    }
  };
}

// Parks every connection of `h` and waits until they all are.
void parkAll(EngineHarness& h) {
  h.park();
  ASSERT_TRUE(eventually([&] { return h.unparked() == 0; })) << h.unparked() << " not parked";
}

TEST(HttpPark, AParkedConnectionGoesOnInAnotherEngineFromWhatTheFirstRead) {
  AppServer app(parkApp());
  EngineHarness old_engine(app.port());
  EngineHarness new_engine(app.port());
  new_engine.router.session = [](int fd, RequestHead head) {
    Peer peer(fd);
    if (peer.readRequest()) peer.send(parkAnswer("session " + head.target));
  };

  const int c = old_engine.connect();
  Peer client(c);
  ASSERT_TRUE(client.send("GET /1 HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto first = client.readResponse();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->body(), "app /1");
  // Half of the next request: the old engine may have read it or not yet;
  // either way none of it may be lost or seen twice.
  ASSERT_TRUE(client.send("GET /2 HTTP/1.1\r\nHo"));
  parkAll(old_engine);
  auto parked = old_engine.exportParked();
  ASSERT_TRUE(parked.ok()) << parked.status();
  ASSERT_EQ(parked->size(), 1u);
  EXPECT_FALSE((*parked)[0].detecting);
  EXPECT_EQ((*parked)[0].requests, 1u);
  EXPECT_TRUE(std::string_view("GET /2 HTTP/1.1\r\nHo").starts_with((*parked)[0].received))
      << (*parked)[0].received;

  new_engine.adopt(std::move(*parked));
  ASSERT_TRUE(client.send("st: t\r\n\r\n"));
  auto second = client.readResponse();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->body(), "app /2");
  // The new engine goes on counting the connection's requests.
  ASSERT_TRUE(client.send("GET /3 HTTP/1.1\r\nHost: t\r\nx-steal: 1\r\n\r\n"));
  auto third = client.readResponse();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->body(), "session /3");
  {
    std::lock_guard<std::mutex> lock(new_engine.router.mu);
    EXPECT_EQ(new_engine.router.connection_requests, std::vector<uint64_t>{3});
  }
  EXPECT_EQ(old_engine.router.opens.load(), 0);
  ::close(c);
}

TEST(HttpPark, ARequestUnderWayIsAnsweredWholeBeforeItsConnectionParks) {
  AppServer app(parkApp());
  EngineHarness h(app.port());
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> asked{false};
  h.router.session = [&](int fd, RequestHead) {
    Peer peer(fd);
    if (!peer.readRequest()) return;
    asked = true;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
    peer.send(parkAnswer(std::string(100000, 'x')));
  };
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send("GET /slow HTTP/1.1\r\nHost: t\r\nx-steal: 1\r\n\r\n"));
  ASSERT_TRUE(eventually([&] { return asked.load(); }));
  h.park();
  EXPECT_EQ(h.unparked(), 1u);  // its request is under way
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  auto res = client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body().size(), 100000u);
  EXPECT_TRUE(res->keep_alive());  // parked, not drained: no Connection: close
  EXPECT_TRUE(eventually([&] { return h.unparked() == 0; }));
  // A request sent while parked waits; unparked (the handover failed), the
  // same engine answers it.
  ASSERT_TRUE(client.send("GET /after HTTP/1.1\r\nHost: t\r\n\r\n"));
  h.unpark();
  auto after = client.readResponse();
  ASSERT_TRUE(after);
  EXPECT_EQ(after->body(), "app /after");
  ::close(c);
}

TEST(HttpPark, AConnectionStillDetectingParksWithItsBytesAndIsDetectedAnew) {
  AppServer app(parkApp());
  EngineHarness old_engine(app.port());
  EngineHarness new_engine(app.port());
  const int c = old_engine.connect();
  ASSERT_TRUE(sendAll(c, "GE"));
  // The harness hands the engine what it accepted on a thread of its own.
  ASSERT_TRUE(eventually([&] { return old_engine.connections() == 1; }));
  parkAll(old_engine);
  auto parked = old_engine.exportParked();
  ASSERT_TRUE(parked.ok()) << parked.status();
  ASSERT_EQ(parked->size(), 1u);
  EXPECT_TRUE((*parked)[0].detecting);
  EXPECT_TRUE(std::string_view("GE").starts_with((*parked)[0].received));
  new_engine.adopt(std::move(*parked));
  ASSERT_TRUE(sendAll(c, "T /d HTTP/1.1\r\nHost: t\r\n\r\n"));
  Peer client(c);
  auto res = client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body(), "app /d");
  ::close(c);
}

// SIGTERM during a handover's preparation: parked connections do not
// wait for an unpark that will not come. An idle HTTP/1 one closes, a
// detecting one passes through with its bytes.
TEST(HttpPark, ADrainWhileParkedLetsEveryConnectionEnd) {
  AppServer app(parkApp());
  EngineHarness h(app.port());
  const int idle = h.connect();
  Peer idle_client(idle);
  ASSERT_TRUE(idle_client.send("GET /1 HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(idle_client.readResponse());
  const int detecting = h.connect();
  ASSERT_TRUE(sendAll(detecting, "GE"));
  ASSERT_TRUE(eventually([&] { return h.connections() == 2; }));
  parkAll(h);
  h.drain();
  EXPECT_EQ(readToEof(idle), "");
  ASSERT_TRUE(sendAll(detecting, "T /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  Peer detecting_client(detecting);
  auto res = detecting_client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body(), "app /x");
  ::close(idle);
  ::close(detecting);
  EXPECT_TRUE(eventually([&] { return h.connections() == 0; }));
}

TEST(HttpPark, ExportRefusesWhileAConnectionIsNotParked) {
  AppServer app(parkApp());
  EngineHarness h(app.port());
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send("GET /1 HTTP/1.1\r\nHost: t\r\n\r\n"));
  ASSERT_TRUE(client.readResponse());
  // Not parked: nothing to export, and the export says so.
  auto parked = h.exportParked();
  EXPECT_FALSE(parked.ok());
  ::close(c);
}

}  // namespace
}  // namespace siphon::agent::steal::http::testing
