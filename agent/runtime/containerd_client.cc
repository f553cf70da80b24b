// containerd through siphon-containerd, the helper that speaks its gRPC API
// (containerd_query.h): one short process per resolution, so gRPC is never
// loaded into the agent.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/common/exec.h"
#include "agent/runtime/containerd_query.h"
#include "agent/runtime/inspect.h"
#include "agent/runtime/runtime_client.h"
#include "agent/runtime/unix_http.h"
#include "agent/target/environ.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

// Where siphon-containerd is: $SIPHON_CONTAINERD_HELPER, else beside the
// agent's own binary (as the image and the build tree both lay it out).
std::string helperPath() {
  if (const char* env = std::getenv("SIPHON_CONTAINERD_HELPER"); env != nullptr && *env != 0) {
    return env;
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "siphon-containerd";
  return (self.parent_path() / "siphon-containerd").string();
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
    // gRPC runs in a helper process (containerd_query.h): the agent does
    // not load it. It gets its own deadline, and a second more to start.
    const std::string helper = helperPath();
    ExecOptions options;
    options.timeout = timeout_ + std::chrono::seconds(1);
    // It needs only the agent's uid (containerd's socket is root's): no
    // capability.
    options.iptables_capabilities = false;
    auto run = execCapture({helper, "--socket", socket_, "--namespace", ns_, "--timeout-ms",
                            std::to_string(timeout_.count()), id},
                           "", options);
    if (!run.ok()) {
      if (run.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return absl::UnavailableError(
            absl::StrCat(where, ": no answer within ", timeout_.count(), "ms"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "containerd support needs siphon-containerd beside siphon-agent (or "
          "SIPHON_CONTAINERD_HELPER naming it): ",
          run.status().message()));
    }
    if (run->exit_code != 0 && run->exit_code != 1) {
      return absl::InternalError(absl::StrCat(helper, " exited ", run->exit_code, ": ",
                                              run->err.substr(0, 500)));
    }
    ASSIGN_OR_RETURN(ContainerdTask task, parseContainerdAnswer(run->out));
    std::vector<std::string> env_list;
    if (!task.oci_spec.empty()) {
      auto parsed = parseOciSpecEnv(task.oci_spec);
      if (!parsed.ok()) {
        return absl::InternalError(absl::StrCat(where, ": unreadable OCI spec of container ", id,
                                                ": ", parsed.status().message()));
      }
      env_list = std::move(*parsed);
    }
    ASSIGN_OR_RETURN(std::vector<v1::EnvVar> env, parseEnvList(env_list));
    ResolvedContainer out;
    out.pid = task.pid;
    out.env = std::move(env);
    out.runtime = std::string(runtimeName(RuntimeKind::kContainerd));
    out.container_id = id;
    out.endpoint = socket_;
    return out;
  }

 private:
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
