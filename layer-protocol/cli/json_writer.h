// A small JSON writer for the CLI's --json output: string escaping and a
// pretty-printing builder. Enough for objects, arrays, strings, integers and
// booleans; not a general JSON library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "siphon/text.h"  // appendJsonString, jsonString

namespace siphon::cli {

// Builds one JSON document, indented by two spaces. Call-order rules: inside
// an object, every value (scalar, object or array) is preceded by key(); in an
// array, values come without keys; take() once every object and array is
// closed. A broken rule is a bug in the caller and aborts.
class JsonWriter {
 public:
  JsonWriter& beginObject();
  JsonWriter& endObject();
  JsonWriter& beginArray();
  JsonWriter& endArray();
  JsonWriter& key(std::string_view name);
  JsonWriter& value(std::string_view s);
  JsonWriter& value(const char* s) { return value(std::string_view(s)); }
  JsonWriter& value(int64_t v);
  JsonWriter& value(uint64_t v);
  JsonWriter& value(int32_t v) { return value(static_cast<int64_t>(v)); }
  JsonWriter& value(uint32_t v) { return value(static_cast<uint64_t>(v)); }
  JsonWriter& value(bool v);
  // The document, with a trailing newline.
  std::string take();

 private:
  struct Level {
    bool object;
    bool empty = true;
  };
  void beforeValue();
  void newline();
  JsonWriter& close(bool object, char bracket);

  std::string out_;
  std::vector<Level> stack_;
  bool key_pending_ = false;
  bool done_ = false;
};

// A one-line JSON object for event lines: JSON Lines, so a reader can split
// on '\n' (JsonWriter pretty-prints over several lines). Starts with an
// "event" member.
class JsonLine {
 public:
  // out_ starts as "{" by construction: GCC 12 at -O3 warns (-Wrestrict, a
  // false positive) on assigning a literal to a std::string here.
  explicit JsonLine(std::string_view event) : out_(1, '{') { add("event", event); }
  JsonLine& add(std::string_view key, std::string_view value) {
    appendKey(key);
    appendJsonString(out_, value);
    return *this;
  }
  JsonLine& add(std::string_view key, uint64_t value) {
    appendKey(key);
    absl::StrAppend(&out_, value);
    return *this;
  }
  JsonLine& addBool(std::string_view key, bool value) {
    appendKey(key);
    out_ += value ? "true" : "false";
    return *this;
  }
  // The object, with its '\n'.
  std::string take() {
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  void appendKey(std::string_view key) {
    if (out_.size() > 1) out_.push_back(',');
    appendJsonString(out_, key);
    out_.push_back(':');
  }
  std::string out_;
};

}  // namespace siphon::cli
