#include "siphon/text.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon {

size_t utf8SequenceAt(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = b(0);
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return len;
}

std::string toUtf8Lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool in_bad_run = false;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8SequenceAt(s, i);
    if (n == 0) {
      if (!in_bad_run) out.append("\xEF\xBF\xBD");  // U+FFFD
      in_bad_run = true;
      ++i;
      continue;
    }
    in_bad_run = false;
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

void appendJsonString(std::string& out, std::string_view s) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      default:
        break;
    }
    if (c < 0x20 || c == 0x7F) {
      // JSON only requires escaping below U+0020; DEL is escaped too so the
      // output never carries a raw terminal control byte.
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    const size_t n = utf8SequenceAt(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  out.push_back('"');
}

std::string jsonString(std::string_view s) {
  std::string out;
  appendJsonString(out, s);
  return out;
}

absl::StatusOr<std::chrono::milliseconds> parseDuration(std::string_view text) {
  auto bad = [&] {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("bad duration '", asv(text), "' (want e.g. 500ms, 5s, 2m, 1h)"));
  };
  size_t unit_at = text.find_first_not_of("0123456789.");
  std::string_view number = text.substr(0, unit_at);
  std::string_view unit = unit_at == std::string_view::npos ? "s" : text.substr(unit_at);
  double scale;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60'000;
  } else if (unit == "h") {
    scale = 3'600'000;
  } else {
    return bad();
  }
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(asv(number), &value) || !std::isfinite(value)) {
    return bad();
  }
  double ms = std::round(value * scale);
  if (ms < 0 || ms > 365.0 * 24 * 3'600'000) return bad();
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace siphon
