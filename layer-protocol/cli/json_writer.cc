#include "cli/json_writer.h"

#include <cstdio>
#include <cstdlib>

namespace siphon::cli {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629 table
// 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or 0.
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

void die(const char* what) {
  std::fprintf(stderr, "JsonWriter: %s\n", what);
  std::abort();
}

}  // namespace

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

void JsonWriter::newline() {
  out_.push_back('\n');
  out_.append(stack_.size() * 2, ' ');
}

void JsonWriter::beforeValue() {
  if (done_) die("value after the document ended");
  if (stack_.empty()) {
    if (!out_.empty()) die("a second top-level value");
    return;
  }
  Level& top = stack_.back();
  if (top.object) {
    if (!key_pending_) die("value in an object without key()");
    key_pending_ = false;
    return;
  }
  if (!top.empty) out_.push_back(',');
  top.empty = false;
  newline();
}

JsonWriter& JsonWriter::key(std::string_view name) {
  if (stack_.empty() || !stack_.back().object) die("key() outside an object");
  if (key_pending_) die("two key() calls in a row");
  Level& top = stack_.back();
  if (!top.empty) out_.push_back(',');
  top.empty = false;
  newline();
  appendJsonString(out_, name);
  out_ += ": ";
  key_pending_ = true;
  return *this;
}

JsonWriter& JsonWriter::beginObject() {
  beforeValue();
  out_.push_back('{');
  stack_.push_back(Level{.object = true});
  return *this;
}

JsonWriter& JsonWriter::beginArray() {
  beforeValue();
  out_.push_back('[');
  stack_.push_back(Level{.object = false});
  return *this;
}

JsonWriter& JsonWriter::close(bool object, char bracket) {
  if (stack_.empty() || stack_.back().object != object) die("unbalanced end");
  if (key_pending_) die("key() without a value");
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (!empty) newline();
  out_.push_back(bracket);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::endObject() { return close(true, '}'); }
JsonWriter& JsonWriter::endArray() { return close(false, ']'); }

JsonWriter& JsonWriter::value(std::string_view s) {
  beforeValue();
  appendJsonString(out_, s);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(int64_t v) {
  beforeValue();
  out_ += std::to_string(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(uint64_t v) {
  beforeValue();
  out_ += std::to_string(v);
  if (stack_.empty()) done_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(bool v) {
  beforeValue();
  out_ += v ? "true" : "false";
  if (stack_.empty()) done_ = true;
  return *this;
}

std::string JsonWriter::take() {
  if (!done_ || !stack_.empty()) die("take() before the document is complete");
  std::string out = std::move(out_);
  out.push_back('\n');
  out_.clear();
  done_ = false;
  return out;
}

}  // namespace siphon::cli
