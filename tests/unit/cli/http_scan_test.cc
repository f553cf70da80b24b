#include "cli/http_scan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "siphon/status.h"

namespace siphon::cli {
namespace {

using ::testing::HasSubstr;

// Feeds `bytes` in pieces of `step` as a reader would (keeping what put()
// left); returns how many bytes the message took (npos: never done).
template <bool kRequest>
size_t scanInSteps(HttpScanner<kRequest>& s, const std::string& bytes, size_t step) {
  std::string pending;
  size_t taken = 0;
  for (size_t off = 0; off < bytes.size() && !s.done(); off += step) {
    pending += bytes.substr(off, step);
    auto n = s.put(pending);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok()) return std::string::npos;
    taken += *n;
    pending.erase(0, *n);
  }
  return s.done() ? taken : std::string::npos;
}

TEST(ResponseScanner, ContentLengthEndsTheResponseWhereverTheBytesAreCut) {
  const std::string response = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
  for (size_t step : {1u, 2u, 7u, 100u}) {
    ResponseScanner s;
    EXPECT_EQ(scanInSteps(s, response + "HTTP/1.1 204", step), response.size()) << step;
    EXPECT_EQ(s.status(), 200);
    EXPECT_TRUE(s.keepAlive());
    EXPECT_FALSE(s.needEof());
  }
}

TEST(ResponseScanner, ChunkedWithTrailers) {
  const std::string response =
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n10;ext=1\r\n0123456789abcdef\r\n0\r\nX-Sum: 1\r\n\r\n";
  for (size_t step : {1u, 3u, 64u}) {
    ResponseScanner s;
    EXPECT_EQ(scanInSteps(s, response + "junk", step), response.size()) << step;
  }
}

TEST(ResponseScanner, AHugeBodyIsCountedNotHeld) {
  ResponseScanner s;
  const uint64_t size = uint64_t{5} << 30;  // far above any default body limit
  auto n = s.put("HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(size) + "\r\n\r\n");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_TRUE(s.headerDone());
  const std::string block(1 << 20, 'x');
  for (uint64_t i = 0; i < 4; ++i) {
    auto b = s.put(block);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*b, block.size());
  }
  EXPECT_FALSE(s.done());
}

TEST(ResponseScanner, CloseDelimitedBodyEndsAtEof) {
  ResponseScanner s;
  auto n = s.put("HTTP/1.0 200 OK\r\n\r\nsome body");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 28u);
  EXPECT_TRUE(s.needEof());
  EXPECT_FALSE(s.keepAlive());
  EXPECT_FALSE(s.done());
  EXPECT_TRUE(s.putEof().ok());
  EXPECT_TRUE(s.done());
}

TEST(ResponseScanner, CutShortIsAnError) {
  ResponseScanner s;
  ASSERT_TRUE(s.put("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc").ok());
  absl::Status eof = s.putEof();
  EXPECT_FALSE(eof.ok());
  EXPECT_THAT(std::string(eof.message()), HasSubstr("cut short"));
}

TEST(ResponseScanner, InterimResponsesAndUpgrades) {
  ResponseScanner s;
  const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
  auto n = s.put(cont + "HTTP/1.1 200 OK\r\n");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, cont.size());
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.status(), 100);
  s.reset();
  EXPECT_FALSE(s.headerDone());

  const std::string upgrade =
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
  auto u = s.put(upgrade + "\x81\x05hello");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(*u, upgrade.size());
  EXPECT_EQ(s.status(), 101);
  EXPECT_TRUE(s.done());
}

TEST(ResponseScanner, HeadResponsesHaveNoBody) {
  ResponseScanner s;
  s.reset(/*no_body=*/true);
  const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
  auto n = s.put(head);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, head.size());
  EXPECT_TRUE(s.done());
}

TEST(ResponseScanner, ConnectionCloseIsNotKeepAlive) {
  ResponseScanner s;
  ASSERT_TRUE(s.put("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n").ok());
  EXPECT_TRUE(s.done());
  EXPECT_FALSE(s.keepAlive());
}

TEST(ResponseScanner, GarbageIsRefused) {
  ResponseScanner s;
  auto n = s.put("SSH-2.0-OpenSSH_9.2\r\n");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(errorCodeOf(n.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("not an HTTP/1.x response"));
}

TEST(RequestScanner, FindsTheEndOfEachRequest) {
  const std::string get = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string post =
      "POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
  RequestScanner s;
  EXPECT_EQ(scanInSteps(s, get + post, 5), get.size());
  EXPECT_EQ(s.method(), "GET");
  EXPECT_TRUE(s.keepAlive());
  s.reset();
  EXPECT_EQ(scanInSteps(s, post, 5), post.size());
  EXPECT_EQ(s.method(), "POST");
}

}  // namespace
}  // namespace siphon::cli
