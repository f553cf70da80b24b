#include "agent/runtime/resolver.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

constexpr RuntimeKind kAutoOrder[] = {RuntimeKind::kContainerd, RuntimeKind::kDocker,
                                      RuntimeKind::kCrio};

// How telling a failed attempt is (see resolver.h): higher wins.
int rank(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kPermissionDenied:
      return 3;
    case absl::StatusCode::kNotFound:
      return 2;
    case absl::StatusCode::kUnavailable:
      return 0;
    default:
      return 1;
  }
}

struct Attempt {
  RuntimeKind kind;
  std::string endpoint;
};

}  // namespace

const std::vector<std::string>& knownSockets(RuntimeKind kind) {
  static const std::vector<std::string> kContainerd = {
      "/run/containerd/containerd.sock",
      "/host/run/containerd/containerd.sock",
      "/run/k3s/containerd/containerd.sock",
  };
  static const std::vector<std::string> kDocker = {
      "/var/run/docker.sock",
      "/host/var/run/docker.sock",
  };
  static const std::vector<std::string> kCrio = {
      "/var/run/crio/crio.sock",
      "/host/var/run/crio/crio.sock",
  };
  switch (kind) {
    case RuntimeKind::kContainerd:
      return kContainerd;
    case RuntimeKind::kDocker:
      return kDocker;
    case RuntimeKind::kCrio:
      return kCrio;
  }
  return kContainerd;
}

RuntimeClientFactory realClientFactory(const RuntimeOptions& options) {
  return [ns = options.containerd_namespace, timeout = options.timeout](
             RuntimeKind kind, const std::string& endpoint) -> std::unique_ptr<RuntimeClient> {
    switch (kind) {
      case RuntimeKind::kContainerd:
        return makeContainerdClient(endpoint, ns, timeout);
      case RuntimeKind::kDocker:
        return makeDockerClient(endpoint, timeout);
      case RuntimeKind::kCrio:
        return makeCrioClient(endpoint, timeout);
    }
    return nullptr;
  };
}

RuntimeResolver::RuntimeResolver(RuntimeOptions options, RuntimeClientFactory factory)
    : options_(std::move(options)), factory_(std::move(factory)) {}

absl::StatusOr<ResolvedContainer> RuntimeResolver::resolve(std::string_view container) {
  ASSIGN_OR_RETURN(ContainerRef ref, parseContainerRef(container));
  std::optional<RuntimeKind> kind = options_.runtime;
  if (ref.runtime) {
    if (kind && *kind != *ref.runtime) {
      return absl::InvalidArgumentError(absl::StrCat(
          "container ID \"", asv(container), "\" names runtime ", asv(runtimeName(*ref.runtime)),
          " but --runtime is ", asv(runtimeName(*kind))));
    }
    kind = ref.runtime;
  }
  if (!options_.endpoint.empty() && !kind) {
    return absl::InvalidArgumentError(
        absl::StrCat("--runtime-endpoint ", options_.endpoint,
                     " needs --runtime containerd|docker|cri-o (or an ID such as "
                     "containerd://ID): which API to speak on it is not guessed"));
  }

  std::vector<Attempt> attempts;
  if (!options_.endpoint.empty()) {
    attempts.push_back({*kind, options_.endpoint});
  } else {
    for (RuntimeKind k : kAutoOrder) {
      if (kind && k != *kind) continue;
      for (const std::string& socket : knownSockets(k)) attempts.push_back({k, socket});
    }
  }

  std::vector<absl::Status> failures;
  for (const Attempt& a : attempts) {
    std::unique_ptr<RuntimeClient> client = factory_(a.kind, a.endpoint);
    if (client == nullptr) {
      return absl::InternalError(absl::StrCat("no client for ", asv(runtimeName(a.kind))));
    }
    auto resolved = client->resolve(ref.id);
    if (resolved.ok()) return resolved;
    failures.push_back(resolved.status());
  }

  // The most telling failure leads; the others follow, in the order tried.
  size_t lead = 0;
  for (size_t i = 1; i < failures.size(); ++i) {
    if (rank(failures[i]) > rank(failures[lead])) lead = i;
  }
  if (rank(failures[lead]) == 0) {
    // Nobody answered: no message so far names the container.
    std::vector<std::string> all;
    for (const absl::Status& f : failures) all.emplace_back(f.message());
    const std::string which = kind
                                  ? absl::StrCat("no ", asv(runtimeName(*kind)), " socket answered")
                                  : std::string("no container runtime answered");
    return absl::UnavailableError(
        absl::StrCat(which, " for container ", ref.id, "; tried: ", absl::StrJoin(all, "; ")));
  }
  if (failures.size() == 1) return failures.front();
  std::vector<std::string> others;
  for (size_t i = 0; i < failures.size(); ++i) {
    if (i != lead) others.emplace_back(failures[i].message());
  }
  return absl::Status(
      failures[lead].code(),
      absl::StrCat(failures[lead].message(), "; also tried: ", absl::StrJoin(others, "; ")));
}

absl::StatusOr<ResolvedContainer> RuntimeResolver::resolveAgain(
    const ResolvedContainer& container) {
  ASSIGN_OR_RETURN(RuntimeKind kind, parseRuntimeName(container.runtime));
  std::unique_ptr<RuntimeClient> client = factory_(kind, container.endpoint);
  if (client == nullptr) {
    return absl::InternalError(absl::StrCat("no client for ", container.runtime));
  }
  return client->resolve(container.container_id);
}

}  // namespace siphon::agent::runtime
