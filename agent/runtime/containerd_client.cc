// containerd over its gRPC API (generated at build time from Debian's
// containerd .proto files, see CMakeLists.txt).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/runtime/inspect.h"
#include "agent/runtime/runtime_client.h"
#include "agent/runtime/unix_http.h"
#include "agent/target/environ.h"
#include "github.com/containerd/containerd/api/services/containers/v1/containers.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/tasks/v1/tasks.grpc.pb.h"
#include "siphon/status.h"

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

class ContainerdClient : public RuntimeClient {
 public:
  ContainerdClient(std::string socket, std::string ns, std::chrono::milliseconds timeout)
      : socket_(std::move(socket)), ns_(std::move(ns)), timeout_(timeout) {}

  RuntimeKind kind() const override { return RuntimeKind::kContainerd; }
  const std::string& endpoint() const override { return socket_; }

  absl::StatusOr<ResolvedContainer> resolve(std::string_view id_view) override {
    const std::string id(id_view);
    const std::string where = absl::StrCat("containerd at ", socket_);
    // gRPC reports a missing socket and a refused permission alike, as
    // UNAVAILABLE after its connect backoff: ask the socket first.
    if (auto s = probeUnixSocket(socket_); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    }
    const auto deadline = std::chrono::system_clock::now() + timeout_;
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());

    // The container: it exists, and its spec holds the configured env.
    containers::GetContainerRequest creq;
    creq.set_id(id);
    containers::GetContainerResponse cresp;
    {
      grpc::ClientContext ctx;
      prepare(ctx, deadline);
      grpc::Status s = containers::Containers::NewStub(channel)->Get(&ctx, creq, &cresp);
      if (!s.ok()) return fromGrpc(s, id, "Containers.Get");
    }
    std::vector<std::string> env_list;
    const google::protobuf::Any& spec = cresp.container().spec();
    if (absl::EndsWith(spec.type_url(), kOciSpecTypeSuffix)) {
      auto parsed = parseOciSpecEnv(spec.value());
      if (!parsed.ok()) {
        return absl::InternalError(absl::StrCat(where, ": unreadable OCI spec of container ", id,
                                                ": ", parsed.status().message()));
      }
      env_list = std::move(*parsed);
    }

    // Its task: the running process.
    tasks::GetRequest treq;
    treq.set_container_id(id);
    tasks::GetResponse tresp;
    {
      grpc::ClientContext ctx;
      prepare(ctx, deadline);
      grpc::Status s = tasks::Tasks::NewStub(channel)->Get(&ctx, treq, &tresp);
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        return absl::NotFoundError(absl::StrCat("container ", id,
                                                " has no running task in containerd namespace ",
                                                ns_, " (", socket_, ")"));
      }
      if (!s.ok()) return fromGrpc(s, id, "Tasks.Get");
    }
    const types::Process& process = tresp.process();
    // A paused task still has its process and namespaces: it can be entered.
    if (process.status() != types::RUNNING && process.status() != types::PAUSED &&
        process.status() != types::PAUSING) {
      return absl::NotFoundError(absl::StrCat(
          "container ", id, " is not running (task status ", taskStatusName(process.status()),
          ") in containerd namespace ", ns_, " (", socket_, ")"));
    }
    if (process.pid() == 0 || process.pid() > static_cast<uint32_t>(INT32_MAX)) {
      return absl::InternalError(
          absl::StrCat(where, ": task of container ", id, " has pid ", process.pid()));
    }

    ASSIGN_OR_RETURN(std::vector<v1::EnvVar> env, parseEnvList(env_list));
    ResolvedContainer out;
    out.pid = static_cast<pid_t>(process.pid());
    out.env = std::move(env);
    out.runtime = std::string(runtimeName(RuntimeKind::kContainerd));
    out.container_id = id;
    out.endpoint = socket_;
    return out;
  }

 private:
  void prepare(grpc::ClientContext& ctx, std::chrono::system_clock::time_point deadline) const {
    // containerd scopes every object by namespace, taken from this header.
    ctx.AddMetadata("containerd-namespace", ns_);
    ctx.set_deadline(deadline);
  }

  absl::Status fromGrpc(const grpc::Status& s, const std::string& id, const char* call) const {
    switch (s.error_code()) {
      case grpc::StatusCode::NOT_FOUND:
        return absl::NotFoundError(absl::StrCat(
            "container ", id, " not found in containerd namespace ", ns_, " (", socket_, ")"));
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::UNAUTHENTICATED:
        return absl::PermissionDeniedError(
            absl::StrCat("containerd at ", socket_, ": ", call, ": ", s.error_message()));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return absl::UnavailableError(absl::StrCat("containerd at ", socket_, ": no answer to ",
                                                   call, " within ", timeout_.count(), "ms"));
      case grpc::StatusCode::UNAVAILABLE:
        return absl::UnavailableError(
            absl::StrCat("containerd at ", socket_, ": ", call, ": ", s.error_message()));
      default:
        return absl::InternalError(
            absl::StrCat("containerd at ", socket_, ": ", call, " failed: ", s.error_message()));
    }
  }

  std::string socket_;
  std::string ns_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

std::unique_ptr<RuntimeClient> makeContainerdClient(std::string socket, std::string ns,
                                                    std::chrono::milliseconds timeout) {
  return std::make_unique<ContainerdClient>(std::move(socket), std::move(ns), timeout);
}

}  // namespace siphon::agent::runtime
