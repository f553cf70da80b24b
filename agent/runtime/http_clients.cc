// The runtimes that answer HTTP on their unix socket: Docker Engine and
// CRI-O. Both are read with unixHttpGet and the JSON helpers.
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/runtime/inspect.h"
#include "agent/runtime/json.h"
#include "agent/runtime/runtime_client.h"
#include "agent/runtime/unix_http.h"
#include "agent/target/environ.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {
namespace {

// `status` with "PREFIX: " before its message; the code is kept.
absl::Status prefixed(std::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(asv(prefix), ": ", status.message()));
}

// The first line of an error body, bounded: enough to quote it.
std::string quoteBody(std::string_view body) {
  body = body.substr(0, body.find('\n'));
  if (body.size() > 200) body = body.substr(0, 200);
  return std::string(body);
}

class DockerClient : public RuntimeClient {
 public:
  DockerClient(std::string socket, std::chrono::milliseconds timeout)
      : socket_(std::move(socket)), timeout_(timeout) {}

  RuntimeKind kind() const override { return RuntimeKind::kDocker; }
  const std::string& endpoint() const override { return socket_; }

  absl::StatusOr<ResolvedContainer> resolve(std::string_view id) override {
    const std::string where = absl::StrCat("docker at ", socket_);
    const std::string target = absl::StrCat("/containers/", asv(id), "/json");
    auto answer = unixHttpGet(socket_, target, "docker", timeout_);
    if (!answer.ok()) return prefixed(where, answer.status());
    if (answer->status == 404) {
      return absl::NotFoundError(
          absl::StrCat("container ", asv(id), " not found in docker (", socket_, ")"));
    }
    if (answer->status != 200) {
      return absl::InternalError(absl::StrCat(where, ": GET ", target, " answered ", answer->status,
                                              " ", answer->reason, ": ", quoteBody(answer->body)));
    }
    auto inspect = parseDockerInspect(answer->body);
    if (!inspect.ok()) {
      return absl::InternalError(absl::StrCat(where, ": unreadable answer to GET ", target, ": ",
                                              inspect.status().message()));
    }
    if (!inspect->running) {
      return absl::NotFoundError(
          absl::StrCat("container ", asv(id), " is not running in docker (", socket_, ")"));
    }
    ASSIGN_OR_RETURN(std::vector<v1::EnvVar> env, parseEnvList(inspect->env));
    ResolvedContainer out;
    out.pid = inspect->pid;
    out.env = std::move(env);
    out.runtime = std::string(runtimeName(RuntimeKind::kDocker));
    out.container_id = inspect->id.empty() ? std::string(id) : inspect->id;
    out.endpoint = socket_;
    return out;
  }

 private:
  std::string socket_;
  std::chrono::milliseconds timeout_;
};

class CrioClient : public RuntimeClient {
 public:
  CrioClient(std::string socket, std::chrono::milliseconds timeout)
      : socket_(std::move(socket)), timeout_(timeout) {}

  RuntimeKind kind() const override { return RuntimeKind::kCrio; }
  const std::string& endpoint() const override { return socket_; }

  absl::StatusOr<ResolvedContainer> resolve(std::string_view id) override {
    const std::string where = absl::StrCat("cri-o at ", socket_);
    const std::string target = absl::StrCat("/containers/", asv(id));
    auto answer = unixHttpGet(socket_, target, "crio", timeout_);
    if (!answer.ok()) return prefixed(where, answer.status());
    // CRI-O answers 404 "can't find the container with id ..." (and also for
    // a container whose pod sandbox is gone).
    if (answer->status == 404) {
      return absl::NotFoundError(
          absl::StrCat("container ", asv(id), " not found in cri-o (", socket_, ")"));
    }
    if (answer->status != 200) {
      return absl::InternalError(absl::StrCat(where, ": GET ", target, " answered ", answer->status,
                                              " ", answer->reason, ": ", quoteBody(answer->body)));
    }
    auto inspect = parseCrioInspect(answer->body);
    if (!inspect.ok()) {
      return absl::InternalError(absl::StrCat(where, ": unreadable answer to GET ", target, ": ",
                                              inspect.status().message()));
    }
    if (inspect->pid == 0) {
      return absl::NotFoundError(
          absl::StrCat("container ", asv(id), " is not running in cri-o (", socket_, ")"));
    }
    ResolvedContainer out;
    out.pid = inspect->pid;
    out.runtime = std::string(runtimeName(RuntimeKind::kCrio));
    out.container_id = std::string(id);
    out.endpoint = socket_;
    return out;
  }

 private:
  std::string socket_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

absl::StatusOr<DockerInspect> parseDockerInspect(std::string_view body) {
  ASSIGN_OR_RETURN(google::protobuf::Struct root, parseJsonObject(body));
  DockerInspect out;
  ASSIGN_OR_RETURN(out.id, jsonString(jsonAt(root, {"Id"}), "Id"));
  ASSIGN_OR_RETURN(out.running, jsonBool(jsonAt(root, {"State", "Running"}), "State.Running"));
  if (out.running) {
    ASSIGN_OR_RETURN(out.pid, jsonPid(jsonAt(root, {"State", "Pid"}), "State.Pid"));
  }
  ASSIGN_OR_RETURN(out.env, jsonStringList(jsonAt(root, {"Config", "Env"}), "Config.Env"));
  return out;
}

absl::StatusOr<CrioInspect> parseCrioInspect(std::string_view body) {
  ASSIGN_OR_RETURN(google::protobuf::Struct root, parseJsonObject(body));
  const google::protobuf::Value* pid = jsonAt(root, {"pid"});
  CrioInspect out;
  if (pid != nullptr && pid->kind_case() == google::protobuf::Value::kNumberValue &&
      pid->number_value() == 0) {
    return out;
  }
  ASSIGN_OR_RETURN(out.pid, jsonPid(pid, "pid"));
  return out;
}

absl::StatusOr<std::vector<std::string>> parseOciSpecEnv(std::string_view spec_json) {
  ASSIGN_OR_RETURN(google::protobuf::Struct root, parseJsonObject(spec_json));
  return jsonStringList(jsonAt(root, {"process", "env"}), "process.env");
}

std::unique_ptr<RuntimeClient> makeDockerClient(std::string socket,
                                                std::chrono::milliseconds timeout) {
  return std::make_unique<DockerClient>(std::move(socket), timeout);
}

std::unique_ptr<RuntimeClient> makeCrioClient(std::string socket,
                                              std::chrono::milliseconds timeout) {
  return std::make_unique<CrioClient>(std::move(socket), timeout);
}

}  // namespace siphon::agent::runtime
