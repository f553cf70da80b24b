// The HTTP/1 side of the HTTP engine, end to end on loopback: a real client
// (raw sockets, or curl), the engine on its loop, an application server and
// a session end written here.
//
// Over 600 lines: one engine's cases sharing the harness below.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <random>

#include "tests/fakes/sanitizers.h"
#include "tests/unit/agent/steal/http/http1_harness.h"

namespace siphon::agent::steal::http::testing {
namespace {

using Request = bhttp::request<bhttp::string_body>;
using Response = bhttp::response<bhttp::string_body>;

// What the application and sessions saw.
struct Log {
  std::mutex mu;
  std::vector<std::string> entries;
  void add(std::string s) {
    std::lock_guard<std::mutex> lock(mu);
    entries.push_back(std::move(s));
  }
  std::vector<std::string> all() {
    std::lock_guard<std::mutex> lock(mu);
    return entries;
  }
};

// One request on a new client connection: its response (nullopt when none
// came), the connection closed after it.
std::optional<Response> oneRequest(EngineHarness& h, std::string_view request) {
  const int c = h.connect();
  Peer client(c);
  std::optional<Response> res;
  if (client.send(request)) {
    res = client.readResponse();
  } else {
    ADD_FAILURE() << "the request could not be sent";
  }
  ::close(c);
  return res;
}

std::string answer(int status, const std::string& body, const std::string& extra = "") {
  return "HTTP/1.1 " + std::to_string(status) +
         " X\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

// An application that answers every request "app <method> <target> <body>",
// keep-alive, and logs each request's head.
AppServer::Handler appAnswering(Log* log) {
  return [log](int fd) {
    Peer peer(fd);
    while (auto req = peer.readRequest()) {
      if (log) log->add(raw(*req));
      const std::string body = "app " + std::string(req->method_string()) + " " +
                               std::string(req->target()) + " " + req->body();
      if (!peer.send(answer(200, body))) return;
    }
  };
}

// A session that answers its one request "session <target> <body>".
FakeRouter::Session sessionAnswering(Log* log) {
  return [log](int fd, RequestHead) {
    Peer peer(fd);
    auto req = peer.readRequest();
    if (!req) return;
    if (log) log->add(raw(*req));
    // The request ends with the engine's half-close.
    char c;
    EXPECT_EQ(::recv(fd, &c, 1, 0), 0);
    peer.send(answer(200, "session " + std::string(req->target()) + " " + req->body()));
  };
}

std::string get(const std::string& target, const std::string& extra = "") {
  return "GET " + target + " HTTP/1.1\r\nHost: t\r\n" + extra + "\r\n";
}

// "/N". Not "/" + std::to_string(n): at -O3 (Release) GCC 12 inlines that
// operator+ (an insert at 0 of the temporary) and warns a bogus
// -Wrestrict overlap in its memcpy, an error under -Werror (GCC bug 105651).
std::string numberedPath(int n) {
  std::string path = "/";
  path += std::to_string(n);
  return path;
}

// Runs a command, returns its stdout and exit status.
std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int rc = ::pclose(f);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

std::string tempFile(const std::string& content) {
  char path[] = "/tmp/siphon-http1-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_TRUE(sendAll(fd, "") || true);
  EXPECT_EQ(::write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
  ::close(fd);
  return path;
}

std::string pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(Http1Engine, RequestsOfOneConnectionGoEachToItsPlaceInOrderPipelined) {
  Log app_log;
  Log session_log;
  AppServer app(appAnswering(&app_log));
  EngineHarness h(app.port());
  h.router.session = sessionAnswering(&session_log);

  const int c = h.connect();
  ASSERT_GE(c, 0);
  Peer client(c);
  // Four requests in one write: the engine must answer them in order.
  ASSERT_TRUE(client.send(get("/a") +
                          get("/b",
                              "x-steal: 1\r\nConnection: keep-alive, x-hop\r\n"
                              "Keep-Alive: timeout=5\r\nx-hop: 1\r\n"
                              "TE: trailers\r\nx-kept: yes\r\n") +
                          get("/c") + get("/d", "x-steal: 1\r\n")));
  const char* expected[] = {"app GET /a ", "session /b ", "app GET /c ", "session /d "};
  for (const char* e : expected) {
    auto res = client.readResponse();
    ASSERT_TRUE(res);
    EXPECT_EQ(res->result_int(), 200u);
    EXPECT_EQ(res->body(), e);
    EXPECT_TRUE(res->keep_alive());
  }
  ::close(c);

  EXPECT_EQ(app.accepts(), 1);  // both application requests on one pooled connection
  EXPECT_EQ(h.router.opens.load(), 2);
  {
    std::lock_guard<std::mutex> lock(h.router.mu);
    EXPECT_EQ(h.router.connection_requests, (std::vector<uint64_t>{2, 4}));
  }
  const auto seen = session_log.all();
  ASSERT_EQ(seen.size(), 2u);
  // Canonical HTTP/1.1 to the session: hop-by-hop headers gone, the rest kept.
  EXPECT_EQ(seen[0], "GET /b\nHost: t\nx-steal: 1\nx-kept: yes\n");
  EXPECT_EQ(app_log.all(), (std::vector<std::string>{"GET /a\nHost: t\n", "GET /c\nHost: t\n"}));
}

TEST(Http1Engine, CurlKeepAliveConnectionSplitsByFilter) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  h.router.steal = [](const RequestHead& head) { return head.path().starts_with("/mine"); };
  h.router.session = sessionAnswering(nullptr);
  const std::string base = "http://127.0.0.1:" + std::to_string(h.port());
  int status = 0;
  const std::string out = run("curl -sS --http1.1 -w ' [%{num_connects}]\\n' " + base + "/x " +
                                  base + "/mine/1 " + base + "/y " + base + "/mine/2",
                              &status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(out, "app GET /x  [1]\nsession /mine/1  [0]\napp GET /y  [0]\nsession /mine/2  [0]\n");
  EXPECT_EQ(app.accepts(), 1);
}

TEST(Http1Engine, ChunkedBodiesBothWaysAreByteExact) {
  // The application echoes the body as a chunked response in pieces of its
  // own size, with a trailer.
  Log app_log;
  AppServer app([&app_log](int fd) {
    Peer peer(fd);
    while (auto req = peer.readRequest()) {
      app_log.add(std::string(req->at(bhttp::field::transfer_encoding)) + "|" +
                  std::string(req->at("x-trailer")));
      std::string out = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\n\r\n";
      const std::string& b = req->body();
      for (size_t i = 0; i < b.size(); i += 1000) {
        const std::string piece = b.substr(i, 1000);
        char size[16];
        std::snprintf(size, sizeof(size), "%zx\r\n", piece.size());
        out += size + piece + "\r\n";
      }
      out += "0\r\nx-sum: " + std::to_string(b.size()) + "\r\n\r\n";
      if (!peer.send(out)) return;
    }
  });
  EngineHarness h(app.port());
  const std::string body = pattern(300 * 1000 + 7, 1);
  const int c = h.connect();
  Peer client(c);
  std::string req = "POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t i = 0; i < body.size(); i += 4093) {
    const std::string piece = body.substr(i, 4093);
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", piece.size());
    req += size + piece + "\r\n";
  }
  req += "0\r\nx-trailer: t1\r\n\r\n";
  std::thread writer([&] { client.send(req); });
  auto res = client.readResponse();
  writer.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body().size(), body.size());
  EXPECT_TRUE(res->body() == body);
  EXPECT_EQ(res->at("x-sum"), std::to_string(body.size()));  // the trailer came through
  EXPECT_EQ(app_log.all(), std::vector<std::string>{"chunked|t1"});
  ::close(c);
}

// A head whose body is not here yet (a stream of events, a server that
// thinks) reaches the client at once, not with the body.
TEST(Http1Engine, AHeadGoesOutBeforeABodyThatHasNotCome) {
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  AppServer app([released](int fd) {
    Peer peer(fd);
    auto req = peer.readRequest();
    if (!req) return;
    peer.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    released.wait_for(std::chrono::seconds(20));  // bounded: a failing test still ends
    peer.send("4\r\nlast\r\n0\r\n\r\n");
    while (peer.readRequest()) {
    }
  });
  EngineHarness h(app.port());
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send(get("/later")));
  // The head comes while the application holds its body back (for 20 s:
  // a head that waited for the body would not be here within 5).
  timeval five{5, 0};
  ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five);
  auto head = client.readResponseHead();
  ASSERT_TRUE(head) << "the head waited for the body";
  EXPECT_EQ(head->result_int(), 200);
  go.set_value();
  std::string rest;
  while (rest.find("0\r\n\r\n") == std::string::npos) {
    rest += client.buffered();
    char b[256];
    const ssize_t n = ::recv(c, b, sizeof b, 0);
    if (n <= 0) break;
    rest.append(b, static_cast<size_t>(n));
  }
  EXPECT_EQ(rest, "4\r\nlast\r\n0\r\n\r\n");
  ::close(c);
}

// A head that came with its first piece goes out in one write with it (one
// system call fewer per answer): the answer stays whole and framed right.
TEST(Http1Engine, AHeadAndTheFirstPieceThatCameWithItArriveTogetherAndWhole) {
  AppServer app([](int fd) {
    Peer peer(fd);
    while (auto req = peer.readRequest()) {
      // Head and first chunk in one write; the rest after a pause.
      peer.send("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      peer.send("4\r\nlast\r\n0\r\n\r\n");
    }
  });
  EngineHarness h(app.port());
  for (int i = 0; i < 3; ++i) {  // keep-alive: each answer framed right
    auto res = oneRequest(h, get("/together"));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->body(), "firstlast");
  }
}

TEST(Http1Engine, CurlChunkedUploadToTheSessionIsByteExact) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  Log session_log;
  h.router.session = [&session_log](int fd, RequestHead) {
    Peer peer(fd);
    auto req = peer.readRequest();
    if (!req) return;
    session_log.add(std::string(req->at(bhttp::field::transfer_encoding)));
    // A response without length: ends with the session's half-close.
    peer.send("HTTP/1.1 200 OK\r\n\r\n" + req->body());
  };
  const std::string body = pattern(1000 * 1000, 2);
  const std::string in = tempFile(body);
  const std::string out = in + ".out";
  int status = 0;
  run("curl -sS --http1.1 -H 'x-steal: 1' -H 'Transfer-Encoding: chunked' --data-binary @" + in +
          " -o " + out + " -D " + out + ".h http://127.0.0.1:" + std::to_string(h.port()) + "/u",
      &status);
  EXPECT_EQ(status, 0);
  std::ifstream f(out, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::ifstream hf(out + ".h");
  const std::string headers((std::istreambuf_iterator<char>(hf)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got.size(), body.size());
  EXPECT_TRUE(got == body);
  // No length from the session: chunked to an HTTP/1.1 client.
  EXPECT_NE(headers.find("Transfer-Encoding: chunked"), std::string::npos) << headers;
  EXPECT_EQ(session_log.all(), std::vector<std::string>{"chunked"});
  ::unlink(in.c_str());
  ::unlink(out.c_str());
  ::unlink((out + ".h").c_str());
}

long maxRssKiB() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(Http1Engine, LargeBodiesStreamBothWaysInBoundedMemory) {
  constexpr size_t kSize = 192u << 20;
  // The application echoes as it reads: the response streams while the
  // request still comes (nothing here holds a body either).
  AppServer app([](int fd) {
    Peer peer(fd);
    bhttp::request_parser<bhttp::buffer_body> p;
    p.body_limit(std::numeric_limits<uint64_t>::max());
    FdStream s{fd};
    beast::flat_buffer buf;
    boost::system::error_code ec;
    bhttp::read_header(s, buf, p, ec);
    if (ec) return;
    const uint64_t len = *p.content_length();
    if (!sendAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(len) + "\r\n\r\n")) {
      return;
    }
    std::vector<char> piece(256 * 1024);
    while (!p.is_done()) {
      p.get().body().data = piece.data();
      p.get().body().size = piece.size();
      bhttp::read_some(s, buf, p, ec);
      if (ec == bhttp::error::need_buffer) ec = {};
      if (ec) return;
      if (!sendAll(fd, {piece.data(), piece.size() - p.get().body().size})) return;
    }
    peer.readRequest();  // until the client closes
  });
  EngineHarness h(app.port());
  const long before = maxRssKiB();
  const int c = h.connect();
  std::thread writer([c] {
    sendAll(
        c, "PUT /big HTTP/1.1\r\nHost: t\r\nContent-Length: " + std::to_string(kSize) + "\r\n\r\n");
    std::string block(1 << 20, '\0');
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 7 + i / 251);
    for (size_t sent = 0; sent < kSize; sent += block.size()) {
      if (!sendAll(c, block)) return;
    }
  });
  // Read the head, then check the body as it comes, never whole.
  std::string head;
  char ch;
  while (head.find("\r\n\r\n") == std::string::npos && ::recv(c, &ch, 1, 0) == 1) head += ch;
  EXPECT_NE(head.find("Content-Length: " + std::to_string(kSize)), std::string::npos) << head;
  size_t got = 0;
  bool same = true;
  std::vector<char> buf(1 << 16);
  while (got < kSize) {
    const ssize_t n = ::recv(c, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      const size_t at = (got + static_cast<size_t>(i)) % (1 << 20);
      same = same && buf[static_cast<size_t>(i)] == static_cast<char>(at * 7 + at / 251);
    }
    got += static_cast<size_t>(n);
  }
  writer.join();
  ::close(c);
  EXPECT_EQ(got, kSize);
  EXPECT_TRUE(same);
  // Each side's buffers, not the body: far below its 192 MiB. (Not in a
  // sanitizer build: its allocator's quarantine holds freed buffers.)
  if (!fakes::kSanitizedBuild) {
    EXPECT_LT(maxRssKiB() - before, 48 * 1024)
        << "peak RSS grew by " << (maxRssKiB() - before) << " KiB";
  }
}

TEST(Http1Engine, ExpectContinueIsForwardedBeforeTheBodyIsSent) {
  AppServer app([](int fd) {
    Peer peer(fd);
    FdStream s{fd};
    beast::flat_buffer buf;
    bhttp::request_parser<bhttp::string_body> p;
    boost::system::error_code ec;
    bhttp::read_header(s, buf, p, ec);
    if (ec) return;
    EXPECT_EQ(p.get()[bhttp::field::expect], "100-continue");
    sendAll(fd, "HTTP/1.1 100 Continue\r\n\r\n");
    bhttp::read(s, buf, p, ec);
    if (ec) return;
    sendAll(fd, answer(201, "got " + p.get().body()));
    peer.readRequest();
  });
  EngineHarness h(app.port());
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send(
      "POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"));
  // The body is only sent once the 100 arrives: a 100 the engine kept
  // would hang here (the harness' deadline ends the test).
  const std::string interim = readExactly(c, std::string("HTTP/1.1 100 Continue\r\n\r\n").size());
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(client.send("hello"));
  auto res = client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->result_int(), 201u);
  EXPECT_EQ(res->body(), "got hello");
  ::close(c);
}

TEST(Http1Engine, SessionGoneBeforeAnsweringIs502AndTheConnectionGoesOn) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  h.router.session = [](int fd, RequestHead) {
    Peer peer(fd);
    peer.readRequest();  // and closes without answering
  };
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send(get("/gone", "x-steal: 1\r\n") + get("/after")));
  auto res = client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->result_int(), 502u);
  EXPECT_EQ(res->at(bhttp::field::content_type), "text/plain; charset=utf-8");
  EXPECT_NE(res->body().find("siphon-agent"), std::string::npos) << res->body();
  EXPECT_NE(res->body().find("session"), std::string::npos) << res->body();
  auto next = client.readResponse();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->body(), "app GET /after ");
  ::close(c);
}

TEST(Http1Engine, OpenStolenRequestFailingIs502) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  h.router.fail_open = true;
  auto res = oneRequest(h, get("/s", "x-steal: 1\r\n"));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->result_int(), 502u);
  EXPECT_NE(res->body().find("too many streams"), std::string::npos) << res->body();
}

TEST(Http1Engine, SessionGoneMidResponseResetsTheClient) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  h.router.session = [](int fd, RequestHead) {
    Peer peer(fd);
    peer.readRequest();
    peer.send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789");
  };
  const int c = h.connect();
  ASSERT_TRUE(sendAll(c, get("/half", "x-steal: 1\r\n")));
  int err = 0;
  const std::string got = readToEof(c, &err);
  // The head and the ten bytes came, then an RST: never a clean EOF that
  // could pass for the end of the response.
  EXPECT_NE(got.find("Content-Length: 100"), std::string::npos) << got;
  EXPECT_EQ(err, ECONNRESET) << got;
  ::close(c);
}

TEST(Http1Engine, ApplicationUnreachableIs502) {
  uint16_t port = 0;
  const int l = tcpListener(&port);
  ::close(l);  // nothing listens there now
  EngineHarness h(port);
  auto res = oneRequest(h, get("/x"));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->result_int(), 502u);
  EXPECT_NE(res->body().find("could not be reached"), std::string::npos) << res->body();
}

TEST(Http1Engine, HeadOverTheLimitIs431) {
  AppServer app(appAnswering(nullptr));
  HttpOptions o;
  o.max_head_bytes = 4096;
  EngineHarness h(app.port(), o);
  auto res = oneRequest(h, get("/x", "x-big: " + std::string(8000, 'b') + "\r\n"));
  ASSERT_TRUE(res);
  EXPECT_EQ(res->result_int(), 431u);
  EXPECT_FALSE(res->keep_alive());
  EXPECT_EQ(app.accepts(), 0);
}

TEST(Http1Engine, BodyOverTheLimitIs413) {
  AppServer app(appAnswering(nullptr));
  HttpOptions o;
  o.max_request_body = 1000;
  EngineHarness h(app.port(), o);
  {
    // Declared too long: refused before the application hears of it.
    auto res = oneRequest(h, "POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->result_int(), 413u);
    EXPECT_EQ(app.accepts(), 0);
  }
  {
    // Chunked: found out on the way, before any response.
    h.router.session = [](int fd, RequestHead) {
      Peer peer(fd);
      peer.readRequest();  // never complete: the engine gives up first
    };
    auto res = oneRequest(h,
                          "POST /x HTTP/1.1\r\nHost: t\r\nx-steal: 1\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n800\r\n" +
                              std::string(0x800, 'z') + "\r\n");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->result_int(), 413u);
  }
}

// An upgrade answered 101 by `server` (application or session), then an
// echo of raw bytes.
void upgradeAndEcho(int fd) {
  Peer peer(fd);
  auto req = peer.readRequest();
  if (!req) return;
  EXPECT_EQ(req->at(bhttp::field::upgrade), "websocket");
  EXPECT_EQ(req->at(bhttp::field::connection), "Upgrade");
  peer.send(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "\r\nhello from the server;");
  std::string pending = peer.buffered();
  if (!pending.empty()) sendAll(fd, pending);
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    if (!sendAll(fd, {buf, static_cast<size_t>(n)})) break;
  }
  ::shutdown(fd, SHUT_WR);
}

void checkUpgrade(EngineHarness& h, const std::string& extra) {
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(
      client.send("GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\n"
                  "Connection: keep-alive, Upgrade\r\n" +
                  extra + "\r\nearly bytes;"));
  auto head = client.readResponseHead();
  ASSERT_TRUE(head);
  EXPECT_EQ(head->result_int(), 101u);
  EXPECT_EQ(head->at(bhttp::field::upgrade), "websocket");
  std::string got = client.buffered();
  const std::string expected = "hello from the server;early bytes;ping";
  ASSERT_TRUE(sendAll(c, "ping"));
  while (got.size() < expected.size()) {
    char buf[256];
    const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, expected);
  // FIN one way comes back as FIN the other way.
  ::shutdown(c, SHUT_WR);
  EXPECT_EQ(readToEof(c), "");
  ::close(c);
}

TEST(Http1Engine, UpgradeToTheApplicationBridgesRawBytes) {
  AppServer app(upgradeAndEcho);
  EngineHarness h(app.port());
  checkUpgrade(h, "");
  EXPECT_TRUE(eventually([&] { return h.connections() == 0; }));
  EXPECT_EQ(app.accepts(), 1);
}

TEST(Http1Engine, UpgradeToTheSessionBridgesRawBytes) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  h.router.session = [](int fd, RequestHead) { upgradeAndEcho(fd); };
  checkUpgrade(h, "x-steal: 1\r\n");
  EXPECT_EQ(app.accepts(), 0);
}

TEST(Http1Engine, PoolKeepsApplicationConnectionsAcrossClientConnections) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  for (int i = 0; i < 3; ++i) {
    auto res = oneRequest(h, get(numberedPath(i)));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->body(), "app GET /" + std::to_string(i) + " ");
  }
  EXPECT_EQ(app.accepts(), 1);
}

TEST(Http1Engine, PoolDropsConnectionsTheApplicationClosed) {
  // The application answers one request per connection, then closes
  // (without saying so: a keep-alive timeout of its own).
  AppServer app([](int fd) {
    Peer peer(fd);
    auto req = peer.readRequest();
    if (req) peer.send(answer(200, "once " + std::string(req->target())));
  });
  EngineHarness h(app.port());
  for (int i = 0; i < 3; ++i) {
    auto res = oneRequest(h, get(numberedPath(i)));
    ASSERT_TRUE(res) << i;
    EXPECT_EQ(res->result_int(), 200u);
    EXPECT_EQ(res->body(), "once /" + std::to_string(i));
    // Wait for the application's close to reach the pooled socket.
    ASSERT_TRUE(eventually([&] { return app.accepts() == i + 1; }));
  }
  EXPECT_EQ(app.accepts(), 3);
}

TEST(Http1Engine, RequestOnAPooledConnectionClosedUnderItIsRetriedOnce) {
  // Each application connection answers its first request; a second one
  // finds it closing (the race of a keep-alive timeout with a request):
  // read, then closed without an answer.
  AppServer app([](int fd) {
    Peer peer(fd);
    auto req = peer.readRequest();
    if (!req) return;
    peer.send(answer(200, "first " + std::string(req->target())));
    peer.readRequest();
  });
  EngineHarness h(app.port());
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send(get("/1")));
  auto one = client.readResponse();
  ASSERT_TRUE(one);
  EXPECT_EQ(one->body(), "first /1");
  ASSERT_TRUE(client.send(get("/2")));
  auto two = client.readResponse();
  ASSERT_TRUE(two);
  EXPECT_EQ(two->result_int(), 200u);
  EXPECT_EQ(two->body(), "first /2");  // on a second connection
  EXPECT_EQ(app.accepts(), 2);
  ::close(c);
}

TEST(Http1Engine, PoolClosesConnectionsIdleForPoolIdleTimeout) {
  std::atomic<int> closed{0};
  AppServer app([&closed](int fd) {
    appAnswering(nullptr)(fd);  // until the engine closes it
    ++closed;
  });
  HttpOptions o;
  o.pool_idle_timeout = std::chrono::milliseconds(50);
  EngineHarness h(app.port(), o);
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send(get("/1")));
  ASSERT_TRUE(client.readResponse());
  // The client stays; its pooled application connection goes.
  EXPECT_TRUE(eventually([&] { return closed.load() == 1; }));
  ASSERT_TRUE(client.send(get("/2")));
  auto res = client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body(), "app GET /2 ");
  EXPECT_EQ(app.accepts(), 2);
  ::close(c);
}

TEST(Http1Engine, IdleConnectionsCloseAfterTheIdleTimeout) {
  AppServer app(appAnswering(nullptr));
  HttpOptions o;
  o.idle_timeout = std::chrono::milliseconds(100);
  EngineHarness h(app.port(), o);
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send(get("/1")));
  ASSERT_TRUE(client.readResponse());
  // Then nothing: the engine closes it (EOF here, before the 20 s
  // receive timeout of the test's socket).
  int err = -1;
  EXPECT_EQ(readToEof(c, &err), "");
  EXPECT_EQ(err, 0);
  ::close(c);
}

TEST(Http1Engine, StopAbortsRequestsUnderWay) {
  // Before the harness: its session threads read them until it joins them.
  std::atomic<bool> has_request{false};
  std::atomic<bool> checked{false};
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  h.router.session = [&](int fd, RequestHead) {
    Peer peer(fd);
    peer.readRequest();
    has_request = true;
    eventually([&] { return checked.load(); });  // never answers
  };
  const int c = h.connect();
  ASSERT_TRUE(sendAll(c, get("/slow", "x-steal: 1\r\n")));
  ASSERT_TRUE(eventually([&] { return has_request.load(); }));
  h.stopForTest();
  int err = 0;
  EXPECT_EQ(readToEof(c, &err), "");
  EXPECT_EQ(err, ECONNRESET);
  checked = true;
  ::close(c);
}

TEST(Http1Engine, NonHttpPassesThroughByteExact) {
  AppServer app([](int fd) {
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      sendAll(fd, {buf, static_cast<size_t>(n)});
    }
    ::shutdown(fd, SHUT_WR);
  });
  EngineHarness h(app.port());
  const int c = h.connect();
  const std::string tls_like =
      std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) + pattern(5000, 3);
  ASSERT_TRUE(sendAll(c, tls_like));
  ::shutdown(c, SHUT_WR);
  EXPECT_TRUE(readToEof(c) == tls_like);
  ::close(c);
}

TEST(Http1Engine, ServerFirstProtocolPassesThroughAfterTheDetectTimeout) {
  AppServer app([](int fd) {
    sendAll(fd, "220 greetings\r\n");
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      sendAll(fd, "echo " + std::string(buf, static_cast<size_t>(n)));
    }
  });
  HttpOptions o;
  o.detect_timeout = std::chrono::milliseconds(50);
  EngineHarness h(app.port(), o);
  const int c = h.connect();
  // The client waits for the greeting (as SMTP or MySQL clients do).
  EXPECT_EQ(readExactly(c, 15), "220 greetings\r\n");
  ASSERT_TRUE(sendAll(c, "GET / HTTP/1.1\r\n\r\n"));  // HTTP-looking, but too late to matter
  EXPECT_EQ(readExactly(c, 23), "echo GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(h.inFlight(), 1u);  // a passthrough is under way
  ::close(c);
  EXPECT_EQ(app.accepts(), 1);
}

TEST(Http1Engine, DrainClosesIdleConnectionsAndFinishesBusyOnes) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> session_has_request{false};
  h.router.session = [&](int fd, RequestHead) {
    Peer peer(fd);
    auto req = peer.readRequest();
    session_has_request = true;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
    peer.send(answer(200, "late"));
  };
  // An idle keep-alive connection (one answered request).
  const int idle = h.connect();
  Peer idle_client(idle);
  ASSERT_TRUE(idle_client.send(get("/1")));
  ASSERT_TRUE(idle_client.readResponse());
  // A busy one: its request waits in the session.
  const int busy = h.connect();
  Peer busy_client(busy);
  ASSERT_TRUE(busy_client.send(get("/slow", "x-steal: 1\r\n")));
  ASSERT_TRUE(eventually([&] { return session_has_request.load(); }));
  EXPECT_EQ(h.inFlight(), 1u);

  h.drain();
  // The idle one is closed at once (a FIN the client reads as EOF).
  EXPECT_EQ(readToEof(idle), "");
  EXPECT_EQ(h.inFlight(), 1u);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  auto res = busy_client.readResponse();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body(), "late");
  EXPECT_FALSE(res->keep_alive());  // Connection: close
  EXPECT_EQ(res->at(bhttp::field::connection), "close");
  EXPECT_EQ(readToEof(busy), "");
  EXPECT_TRUE(eventually([&] { return h.inFlight() == 0; }));
  ::close(idle);
  ::close(busy);
}

TEST(Http1Engine, Http10ClientGetsAnUnframedResponseUntilClose) {
  AppServer app([](int fd) {
    Peer peer(fd);
    if (peer.readRequest()) peer.send("HTTP/1.1 200 OK\r\n\r\nuntil the end");
  });
  EngineHarness h(app.port());
  const int c = h.connect();
  ASSERT_TRUE(sendAll(c, "GET /old HTTP/1.0\r\n\r\n"));
  const std::string got = readToEof(c);
  EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
  EXPECT_EQ(got.find("chunked"), std::string::npos) << got;
  EXPECT_TRUE(got.ends_with("\r\n\r\nuntil the end")) << got;
  ::close(c);
}

TEST(Http1Engine, MalformedRequestIs400) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  const int c = h.connect();
  ASSERT_TRUE(sendAll(c, "GET / HTTP/1.1\r\nHost t\r\n\r\n"));
  const std::string got = readToEof(c);
  EXPECT_TRUE(got.starts_with("HTTP/1.1 400 ")) << got;
  EXPECT_EQ(app.accepts(), 0);
  ::close(c);
}

TEST(Http1Engine, HeadRequestsAndNoContentCarryNoBody) {
  AppServer app([](int fd) {
    Peer peer(fd);
    while (auto req = peer.readRequest()) {
      if (req->method() == bhttp::verb::head) {
        peer.send("HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n");
      } else {
        peer.send("HTTP/1.1 204 No Content\r\n\r\n");
      }
    }
  });
  EngineHarness h(app.port());
  const int c = h.connect();
  Peer client(c);
  ASSERT_TRUE(client.send("HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n" + get("/n") + get("/n2")));
  auto head = client.readResponse(/*head_request=*/true);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->at(bhttp::field::content_length), "1234");
  for (int i = 0; i < 2; ++i) {
    auto res = client.readResponse();
    ASSERT_TRUE(res);
    EXPECT_EQ(res->result_int(), 204u);
  }
  ::close(c);
}

TEST(Http1Engine, H2cUpgradeAndPriorKnowledgeGoToHttp2) {
  AppServer app(appAnswering(nullptr));
  EngineHarness h(app.port());
  Log session_log;
  h.router.session = sessionAnswering(&session_log);
  const std::string url = "http://127.0.0.1:" + std::to_string(h.port()) + "/h2";
  int status = 0;
  // An h2c upgrade (GET, no body): answered over HTTP/2 after the 101.
  EXPECT_EQ(run("curl -sS --http2 -H 'x-steal: 1' -w ' [%{http_version}]' " + url, &status),
            "session /h2  [2]");
  EXPECT_EQ(status, 0);
  // Prior knowledge: detected from the preface.
  EXPECT_EQ(run("curl -sS --http2-prior-knowledge -H 'x-steal: 1' -w ' [%{http_version}]' " + url,
                &status),
            "session /h2  [2]");
  EXPECT_EQ(status, 0);
  // An upgrade request with a body stays HTTP/1.1 (the upgrade is ignored).
  EXPECT_EQ(run("curl -sS --http2 -H 'x-steal: 1' -d abc -w ' [%{http_version}]' " + url, &status),
            "session /h2 abc [1.1]");
  EXPECT_EQ(session_log.all().size(), 3u);
}

}  // namespace
}  // namespace siphon::agent::steal::http::testing
