// Reading the runtimes' JSON answers (Docker inspect, CRI-O inspect, the OCI
// runtime spec in containerd) without a JSON library of our own: protobuf's
// JSON parser fills a google.protobuf.Struct, a faithful JSON tree (numbers
// are doubles, exact for every integer up to 2^53, so for every pid).
//
// Only the few fields the agent needs are read, each checked for its type:
// a field of the wrong type is an error, never a silent default. The parser
// is a little more lenient than JSON (a trailing comma, single-quoted
// strings), which does no harm when reading what a runtime wrote.
#pragma once

#include <sys/types.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/struct.pb.h"

namespace siphon::agent::runtime {

// Parses a JSON object (the top level must be an object). InvalidArgument
// with the parser's message for malformed JSON, another top-level type, or
// invalid UTF-8.
absl::StatusOr<google::protobuf::Struct> parseJsonObject(std::string_view json);

// The value at `path` ({"State", "Pid"}), or nullptr when a step is missing
// or is not an object.
const google::protobuf::Value* jsonAt(const google::protobuf::Struct& root,
                                      std::initializer_list<std::string_view> path);

// "State.Pid" for messages.
std::string jsonPathName(std::initializer_list<std::string_view> path);

// A pid: an integral number in [1, 2^31). `what` names the field in errors
// (InvalidArgument: missing, not a number, fractional, out of range).
absl::StatusOr<pid_t> jsonPid(const google::protobuf::Value* value, std::string_view what);

// A list of strings; a missing field or null is an empty list (Docker writes
// "Env": null for an image without env). InvalidArgument for any other type,
// or an element that is not a string.
absl::StatusOr<std::vector<std::string>> jsonStringList(const google::protobuf::Value* value,
                                                        std::string_view what);

// A string; missing or null is empty. InvalidArgument for another type.
absl::StatusOr<std::string> jsonString(const google::protobuf::Value* value, std::string_view what);

// A bool; InvalidArgument when missing or of another type.
absl::StatusOr<bool> jsonBool(const google::protobuf::Value* value, std::string_view what);

}  // namespace siphon::agent::runtime
