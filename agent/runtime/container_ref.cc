#include "agent/runtime/container_ref.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

constexpr RuntimeKind kAllKinds[] = {RuntimeKind::kContainerd, RuntimeKind::kDocker,
                                     RuntimeKind::kCrio};

bool isAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

std::string_view runtimeName(RuntimeKind kind) {
  switch (kind) {
    case RuntimeKind::kContainerd:
      return "containerd";
    case RuntimeKind::kDocker:
      return "docker";
    case RuntimeKind::kCrio:
      return "cri-o";
  }
  return "unknown";
}

absl::StatusOr<RuntimeKind> parseRuntimeName(std::string_view name) {
  for (RuntimeKind k : kAllKinds) {
    if (runtimeName(k) == name) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown container runtime \"", asv(name),
                                                 "\" (expected containerd, docker or cri-o)"));
}

absl::StatusOr<ContainerRef> parseContainerRef(std::string_view text) {
  ContainerRef ref;
  std::string_view id = text;
  if (const size_t sep = text.find("://"); sep != std::string_view::npos) {
    auto kind = parseRuntimeName(text.substr(0, sep));
    if (!kind.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("container ID \"", asv(text), "\": ", kind.status().message()));
    }
    ref.runtime = *kind;
    id = text.substr(sep + 3);
  }
  if (id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("container ID \"", asv(text), "\" is empty"));
  }
  if (id.size() > kMaxContainerIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("container ID is longer than ", kMaxContainerIdLength, " characters"));
  }
  if (!isAlnum(id.front())) {
    return absl::InvalidArgumentError(
        absl::StrCat("container ID \"", asv(id), "\" must start with a letter or a digit"));
  }
  for (char c : id) {
    if (!isAlnum(c) && c != '_' && c != '.' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "container ID \"", asv(id), "\" may hold only letters, digits, '_', '.' and '-'"));
    }
  }
  ref.id = std::string(id);
  return ref;
}

}  // namespace siphon::agent::runtime
