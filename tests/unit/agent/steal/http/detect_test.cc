#include "agent/steal/http/detect.h"

#include <gtest/gtest.h>

#include <string>

namespace siphon::agent::steal::http {
namespace {

TEST(DetectProtocol, Http2PrefaceWholeAndEveryPrefix) {
  const std::string preface(kHttp2Preface);
  EXPECT_EQ(detectProtocol(preface), Protocol::kHttp2);
  EXPECT_EQ(detectProtocol(preface + "\x00\x00\x12\x04", 64), Protocol::kHttp2);
  for (size_t n = 1; n < preface.size(); ++n) {
    EXPECT_EQ(detectProtocol(preface.substr(0, n)), Protocol::kNeedMore) << n;
  }
  EXPECT_EQ(detectProtocol(""), Protocol::kNeedMore);
}

TEST(DetectProtocol, Http1DecidedAtTheVersion) {
  const std::string line = "GET /index.html?a=b HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(detectProtocol(line), Protocol::kHttp1);
  const size_t decided = std::string("GET /index.html?a=b HTTP/1.").size();
  for (size_t n = 1; n < decided; ++n) {
    EXPECT_EQ(detectProtocol(line.substr(0, n)), Protocol::kNeedMore) << line.substr(0, n);
  }
  EXPECT_EQ(detectProtocol(line.substr(0, decided)), Protocol::kHttp1);
  EXPECT_EQ(detectProtocol("POST * HTTP/1.0\r\n"), Protocol::kHttp1);
  EXPECT_EQ(detectProtocol("CONNECT example.com:443 HTTP/1.1\r\n"), Protocol::kHttp1);
  EXPECT_EQ(detectProtocol("M-SEARCH http://h/x HTTP/1.1\r\n"), Protocol::kHttp1);
  // "PRI" is a method token too: a request line that leaves the preface.
  EXPECT_EQ(detectProtocol("PRI /x HTTP/1.1\r\n"), Protocol::kHttp1);
}

TEST(DetectProtocol, TextProtocolsThatStartWithAWordAreNotHttp) {
  EXPECT_EQ(detectProtocol("SET key value\r\n"), Protocol::kOther);  // Redis inline
  EXPECT_EQ(detectProtocol("get key\r\n"), Protocol::kOther);        // memcached
  EXPECT_EQ(detectProtocol("PING\r\n"), Protocol::kOther);
  EXPECT_EQ(detectProtocol("GET /\r\n"), Protocol::kOther);  // HTTP/0.9
  EXPECT_EQ(detectProtocol("GET / HTTP/2.0\r\n"), Protocol::kOther);
  EXPECT_EQ(detectProtocol("GET  / HTTP/1.1\r\n"), Protocol::kOther);  // two spaces
  EXPECT_EQ(detectProtocol(" GET / HTTP/1.1\r\n"), Protocol::kOther);
  EXPECT_EQ(detectProtocol("\x16\x03\x01\x02\x00"), Protocol::kOther);  // TLS
  EXPECT_EQ(detectProtocol(std::string("\0\0\0\x08", 4)), Protocol::kOther);
  EXPECT_EQ(detectProtocol("*2\r\n$3\r\nGET\r\n"), Protocol::kOther);  // RESP
  EXPECT_EQ(detectProtocol(std::string(40, 'A')), Protocol::kOther);   // no method is that long
}

TEST(DetectProtocol, BoundedOnAnEndlessTarget) {
  const std::string start = "GET /" + std::string(200, 'a');
  EXPECT_EQ(detectProtocol(start, 1024), Protocol::kNeedMore);
  EXPECT_EQ(detectProtocol(start, 100), Protocol::kHttp1);  // the parser answers 431
}

}  // namespace
}  // namespace siphon::agent::steal::http
