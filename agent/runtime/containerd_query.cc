#include "agent/runtime/containerd_query.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "github.com/containerd/containerd/api/services/containers/v1/containers.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/tasks/v1/tasks.grpc.pb.h"

namespace siphon::agent::runtime {

namespace {

namespace containers = ::containerd::services::containers::v1;
namespace tasks = ::containerd::services::tasks::v1;
namespace types = ::containerd::v1::types;

// How containerd stores the OCI spec in Container.spec: the JSON of
// config.json in an Any with this type URL (typeurl's registration of
// specs.Spec).
constexpr char kOciSpecTypeSuffix[] = "opencontainers/runtime-spec/1/Spec";

const char* taskStatusName(types::Status s) {
  switch (s) {
    case types::UNKNOWN:
      return "UNKNOWN";
    case types::CREATED:
      return "CREATED";
    case types::RUNNING:
      return "RUNNING";
    case types::STOPPED:
      return "STOPPED";
    case types::PAUSED:
      return "PAUSED";
    case types::PAUSING:
      return "PAUSING";
    default:
      return "?";
  }
}

// containerd scopes every object by namespace, taken from this header.
void prepare(grpc::ClientContext& ctx, const std::string& ns,
             std::chrono::system_clock::time_point deadline) {
  ctx.AddMetadata("containerd-namespace", ns);
  ctx.set_deadline(deadline);
}

absl::Status fromGrpc(const grpc::Status& s, const std::string& socket, const std::string& ns,
                      const std::string& id, const char* call, std::chrono::milliseconds timeout) {
  switch (s.error_code()) {
    case grpc::StatusCode::NOT_FOUND:
      return absl::NotFoundError(absl::StrCat("container ", id, " not found in containerd namespace ",
                                              ns, " (", socket, ")"));
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::PermissionDeniedError(
          absl::StrCat("containerd at ", socket, ": ", call, ": ", s.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::UnavailableError(absl::StrCat("containerd at ", socket, ": no answer to ", call,
                                                 " within ", timeout.count(), "ms"));
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(
          absl::StrCat("containerd at ", socket, ": ", call, ": ", s.error_message()));
    default:
      return absl::InternalError(
          absl::StrCat("containerd at ", socket, ": ", call, " failed: ", s.error_message()));
  }
}

}  // namespace

absl::StatusOr<ContainerdTask> queryContainerd(const std::string& socket, const std::string& ns,
                                               const std::string& id,
                                               std::chrono::milliseconds timeout) {
  const std::string where = absl::StrCat("containerd at ", socket);
  const auto deadline = std::chrono::system_clock::now() + timeout;
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());

  // The container: it exists, and its spec holds the configured env.
  containers::GetContainerRequest creq;
  creq.set_id(id);
  containers::GetContainerResponse cresp;
  {
    grpc::ClientContext ctx;
    prepare(ctx, ns, deadline);
    grpc::Status s = containers::Containers::NewStub(channel)->Get(&ctx, creq, &cresp);
    if (!s.ok()) return fromGrpc(s, socket, ns, id, "Containers.Get", timeout);
  }
  ContainerdTask out;
  const google::protobuf::Any& spec = cresp.container().spec();
  if (absl::EndsWith(spec.type_url(), kOciSpecTypeSuffix)) out.oci_spec = spec.value();

  // Its task: the running process.
  tasks::GetRequest treq;
  treq.set_container_id(id);
  tasks::GetResponse tresp;
  {
    grpc::ClientContext ctx;
    prepare(ctx, ns, deadline);
    grpc::Status s = tasks::Tasks::NewStub(channel)->Get(&ctx, treq, &tresp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::NotFoundError(absl::StrCat("container ", id,
                                              " has no running task in containerd namespace ", ns,
                                              " (", socket, ")"));
    }
    if (!s.ok()) return fromGrpc(s, socket, ns, id, "Tasks.Get", timeout);
  }
  const types::Process& process = tresp.process();
  // A paused task still has its process and namespaces: it can be entered.
  if (process.status() != types::RUNNING && process.status() != types::PAUSED &&
      process.status() != types::PAUSING) {
    return absl::NotFoundError(absl::StrCat("container ", id, " is not running (task status ",
                                            taskStatusName(process.status()),
                                            ") in containerd namespace ", ns, " (", socket, ")"));
  }
  if (process.pid() == 0 || process.pid() > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InternalError(
        absl::StrCat(where, ": task of container ", id, " has pid ", process.pid()));
  }
  out.pid = static_cast<pid_t>(process.pid());
  return out;
}

}  // namespace siphon::agent::runtime
