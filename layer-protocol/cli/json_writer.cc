#include "cli/json_writer.h"

#include <cstdio>
#include <cstdlib>

namespace siphon::cli {
namespace {

void die(const char* what) {
  std::fprintf(stderr, "JsonWriter: %s\n", what);
  std::abort();
}

}  // namespace

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
