// The helper's answer as text and back (containerd_query.h): the agent and
// siphon-containerd both compile it, and neither needs gRPC for it.
#include <charconv>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/runtime/containerd_query.h"

namespace siphon::agent::runtime {

namespace {

// The number at the front of `s` up to `end`, and `s` moved past `end`.
template <class T>
bool takeNumber(std::string_view& s, char end, T* out) {
  const size_t stop = s.find(end);
  if (stop == std::string_view::npos) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + stop, *out);
  if (ec != std::errc() || ptr != s.data() + stop) return false;
  s.remove_prefix(stop + 1);
  return true;
}

bool takePrefix(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

absl::Status garbled(std::string_view out) {
  return absl::InternalError(absl::StrCat("siphon-containerd answered something unreadable: \"",
                                          std::string(out.substr(0, 200)), "\""));
}

}  // namespace

std::string formatContainerdAnswer(const absl::StatusOr<ContainerdTask>& answer) {
  if (!answer.ok()) {
    return absl::StrCat("error ", static_cast<int>(answer.status().code()), " ",
                        answer.status().message());
  }
  return absl::StrCat("pid ", answer->pid, "\nspec ", answer->oci_spec.size(), "\n",
                      answer->oci_spec);
}

absl::StatusOr<ContainerdTask> parseContainerdAnswer(std::string_view out) {
  std::string_view s = out;
  if (takePrefix(s, "error ")) {
    int code = 0;
    if (!takeNumber(s, ' ', &code) || code <= 0 || code > 16) return garbled(out);
    return absl::Status(static_cast<absl::StatusCode>(code), std::string(s));
  }
  ContainerdTask task;
  size_t spec_len = 0;
  if (!takePrefix(s, "pid ") || !takeNumber(s, '\n', &task.pid) || task.pid <= 0 ||
      !takePrefix(s, "spec ") || !takeNumber(s, '\n', &spec_len) || s.size() != spec_len) {
    return garbled(out);
  }
  task.oci_spec = std::string(s);
  return task;
}

}  // namespace siphon::agent::runtime
