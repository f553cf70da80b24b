#include "agent/runtime/json.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

using google::protobuf::Value;

const char* kindName(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return "a number";
    case Value::kStringValue:
      return "a string";
    case Value::kBoolValue:
      return "a bool";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    case Value::KIND_NOT_SET:
      break;
  }
  return "empty";
}

absl::Status wrongType(std::string_view what, const char* expected, const Value& v) {
  return absl::InvalidArgumentError(
      absl::StrCat(asv(what), " is ", kindName(v), ", not ", expected));
}

}  // namespace

absl::StatusOr<google::protobuf::Struct> parseJsonObject(std::string_view json) {
  // The Struct parser would take any JSON value at the top and fail with a
  // vague message; say what is wrong instead.
  size_t first = json.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos || json[first] != '{') {
    return absl::InvalidArgumentError("JSON answer is not an object");
  }
  google::protobuf::Struct out;
  google::protobuf::util::JsonParseOptions options;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &out, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed JSON: ", std::string(status.message())));
  }
  return out;
}

const google::protobuf::Value* jsonAt(const google::protobuf::Struct& root,
                                      std::initializer_list<std::string_view> path) {
  const google::protobuf::Struct* object = &root;
  const Value* value = nullptr;
  for (std::string_view key : path) {
    if (object == nullptr) return nullptr;
    auto it = object->fields().find(std::string(key));
    if (it == object->fields().end()) return nullptr;
    value = &it->second;
    object = value->kind_case() == Value::kStructValue ? &value->struct_value() : nullptr;
  }
  return value;
}

std::string jsonPathName(std::initializer_list<std::string_view> path) {
  std::vector<std::string> parts(path.begin(), path.end());
  return absl::StrJoin(parts, ".");
}

absl::StatusOr<pid_t> jsonPid(const google::protobuf::Value* value, std::string_view what) {
  if (value == nullptr) return absl::InvalidArgumentError(absl::StrCat(asv(what), " is missing"));
  if (value->kind_case() != Value::kNumberValue) return wrongType(what, "a number", *value);
  const double d = value->number_value();
  if (!std::isfinite(d) || d != std::floor(d) || d < 1 ||
      d > static_cast<double>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(asv(what), " is ", d, ", not a pid"));
  }
  return static_cast<pid_t>(d);
}

absl::StatusOr<std::vector<std::string>> jsonStringList(const google::protobuf::Value* value,
                                                        std::string_view what) {
  std::vector<std::string> out;
  if (value == nullptr || value->kind_case() == Value::kNullValue) return out;
  if (value->kind_case() != Value::kListValue) return wrongType(what, "a list", *value);
  for (int i = 0; i < value->list_value().values_size(); ++i) {
    const Value& e = value->list_value().values(i);
    if (e.kind_case() != Value::kStringValue) {
      return wrongType(absl::StrCat(asv(what), "[", i, "]"), "a string", e);
    }
    out.push_back(e.string_value());
  }
  return out;
}

absl::StatusOr<std::string> jsonString(const google::protobuf::Value* value,
                                       std::string_view what) {
  if (value == nullptr || value->kind_case() == Value::kNullValue) return std::string();
  if (value->kind_case() != Value::kStringValue) return wrongType(what, "a string", *value);
  return value->string_value();
}

absl::StatusOr<bool> jsonBool(const google::protobuf::Value* value, std::string_view what) {
  if (value == nullptr) return absl::InvalidArgumentError(absl::StrCat(asv(what), " is missing"));
  if (value->kind_case() != Value::kBoolValue) return wrongType(what, "a bool", *value);
  return value->bool_value();
}

}  // namespace siphon::agent::runtime
