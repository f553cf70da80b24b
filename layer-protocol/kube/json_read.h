// Reading the API's JSON answers (private to layer-protocol/kube/).
//
// nlohmann::json (Debian's nlohmann-json3-dev, header-only): the kube area
// must not depend on protobuf, and it writes JSON too (the objects it asks
// kubectl to create), with integers kept integers. Only the fields Siphon
// uses are read, each checked for its type: a field of the wrong type
// throws BadJson, which each public function turns into an INTERNAL status
// naming the field (no exception leaves the area).
#pragma once

#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::kube::json_read {

using json = nlohmann::json;

struct BadJson : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The value at `path`, or nullptr when a step is missing, null or not an
// object.
inline const json* at(const json& root, std::initializer_list<std::string_view> path) {
  const json* v = &root;
  for (auto step : path) {
    if (!v->is_object()) return nullptr;
    auto it = v->find(std::string(step));
    if (it == v->end() || it->is_null()) return nullptr;
    v = &*it;
  }
  return v;
}

inline std::string name(std::initializer_list<std::string_view> path) {
  std::string s;
  for (auto step : path) absl::StrAppend(&s, s.empty() ? "" : ".", asv(step));
  return s;
}

// A string; missing or null: "".
inline std::string str(const json& root, std::initializer_list<std::string_view> path) {
  const json* v = at(root, path);
  if (v == nullptr) return "";
  if (!v->is_string()) throw BadJson(absl::StrCat(name(path), " is not a string"));
  return v->get<std::string>();
}

inline int64_t integer(const json& root, std::initializer_list<std::string_view> path,
                       int64_t otherwise = 0) {
  const json* v = at(root, path);
  if (v == nullptr) return otherwise;
  if (!v->is_number_integer()) throw BadJson(absl::StrCat(name(path), " is not an integer"));
  return v->get<int64_t>();
}

inline bool boolean(const json& root, std::initializer_list<std::string_view> path) {
  const json* v = at(root, path);
  if (v == nullptr) return false;
  if (!v->is_boolean()) throw BadJson(absl::StrCat(name(path), " is not a boolean"));
  return v->get<bool>();
}

// An array; missing or null: an empty one.
inline const json& array(const json& root, std::initializer_list<std::string_view> path) {
  static const json kEmpty = json::array();
  const json* v = at(root, path);
  if (v == nullptr) return kEmpty;
  if (!v->is_array()) throw BadJson(absl::StrCat(name(path), " is not an array"));
  return *v;
}

// A map of strings (labels, annotations); missing: empty.
inline std::map<std::string, std::string> strings(const json& root,
                                                  std::initializer_list<std::string_view> path) {
  std::map<std::string, std::string> out;
  const json* v = at(root, path);
  if (v == nullptr) return out;
  if (!v->is_object()) throw BadJson(absl::StrCat(name(path), " is not an object"));
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_string()) {
      throw BadJson(absl::StrCat(name(path), ".", it.key(), " is not a string"));
    }
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

// Parses `text` (an object). BadJson for anything else.
inline json parse(std::string_view text, std::string_view what) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw BadJson(absl::StrCat(asv(what), ": kubectl's answer is not a JSON object"));
  }
  return j;
}

inline absl::Status toStatus(const std::exception& e) { return absl::InternalError(e.what()); }

}  // namespace siphon::kube::json_read
