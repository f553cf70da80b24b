#include "agent/steal/http/detect.h"

namespace siphon::agent::steal::http {
namespace {

// RFC 9110 §5.6.2 tchar.
bool isTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// Visible characters of a request target (RFC 9112 §3.2; obs-text allowed,
// as servers accept it).
bool isTargetChar(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u != 0x7f;
}

// Longest method we take: the registered ones are at most 17 characters
// (VERSION-CONTROL); anything much longer is not HTTP.
constexpr size_t kMaxMethod = 32;
constexpr std::string_view kVersionPrefix = "HTTP/1.";

}  // namespace

Protocol detectProtocol(std::string_view bytes, size_t max_line) {
  if (bytes.empty()) return Protocol::kNeedMore;
  // The preface begins with "PRI *", which is also a consistent HTTP/1
  // start: compare with the preface first.
  const size_t common = bytes.size() < kHttp2Preface.size() ? bytes.size() : kHttp2Preface.size();
  if (bytes.substr(0, common) == kHttp2Preface.substr(0, common)) {
    return common == kHttp2Preface.size() ? Protocol::kHttp2 : Protocol::kNeedMore;
  }

  size_t i = 0;
  while (i < bytes.size() && isTokenChar(bytes[i])) {
    if (++i > kMaxMethod) return Protocol::kOther;
  }
  if (i == bytes.size()) return i > 0 ? Protocol::kNeedMore : Protocol::kOther;
  if (i == 0 || bytes[i] != ' ') return Protocol::kOther;
  ++i;

  const size_t target = i;
  while (i < bytes.size() && isTargetChar(bytes[i])) {
    if (i >= max_line) return Protocol::kHttp1;
    ++i;
  }
  if (i == bytes.size()) return Protocol::kNeedMore;
  if (i == target || bytes[i] != ' ') return Protocol::kOther;
  ++i;

  const std::string_view rest = bytes.substr(i);
  const size_t n = rest.size() < kVersionPrefix.size() ? rest.size() : kVersionPrefix.size();
  if (rest.substr(0, n) != kVersionPrefix.substr(0, n)) return Protocol::kOther;
  return n == kVersionPrefix.size() ? Protocol::kHttp1 : Protocol::kNeedMore;
}

}  // namespace siphon::agent::steal::http
