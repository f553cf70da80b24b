// A container as the operator names it: a bare ID, or the Kubernetes form of
// a pod's status.containerStatuses[].containerID ("containerd://ID",
// "docker://ID", "cri-o://ID"), which also picks the runtime.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/runtime/runtime_client.h"

namespace siphon::agent::runtime {

struct ContainerRef {
  std::string id;
  std::optional<RuntimeKind> runtime;  // set by a "NAME://" prefix
};

// The longest ID accepted: containerd allows 76 characters, Docker names
// and CRI-O IDs are shorter; the margin costs nothing.
inline constexpr size_t kMaxContainerIdLength = 128;

// Splits and checks `text`. The ID must start with a letter or digit and
// hold only letters, digits, '_', '.' and '-' (what containerd, Docker and
// CRI-O accept), at most kMaxContainerIdLength characters: it goes into URL
// paths and gRPC requests, and cgroup paths are matched against it, so
// anything else ("../x", "a/b", spaces) is refused up front.
// InvalidArgument for an empty ID, a bad character, or an unknown prefix
// ("rkt://x"), with the offending text in the message.
absl::StatusOr<ContainerRef> parseContainerRef(std::string_view text);

}  // namespace siphon::agent::runtime
