// The containerd client (and the siphon-containerd helper it runs) against
// a real gRPC server on a unix socket that implements the two calls it makes (Containers.Get, Tasks.Get) the way
// containerd does: objects scoped by the "containerd-namespace" metadata,
// NOT_FOUND for what a namespace lacks, the OCI spec as JSON in an Any.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "agent/runtime/containerd_query.h"
#include "agent/runtime/runtime_client.h"
#include "github.com/containerd/containerd/api/services/containers/v1/containers.grpc.pb.h"
#include "github.com/containerd/containerd/api/services/tasks/v1/tasks.grpc.pb.h"
#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using ::testing::HasSubstr;
using testing::msg;
namespace containers = ::containerd::services::containers::v1;
namespace tasks = ::containerd::services::tasks::v1;
namespace types = ::containerd::v1::types;

constexpr char kSpecType[] = "types.containerd.io/opencontainers/runtime-spec/1/Spec";

struct FakeContainer {
  std::string spec_json;
  std::string spec_type = kSpecType;
  bool has_task = true;
  uint32_t pid = 0;
  types::Status status = types::RUNNING;
};

FakeContainer task(std::string spec_json, uint32_t pid, types::Status status = types::RUNNING) {
  FakeContainer c;
  c.spec_json = std::move(spec_json);
  c.pid = pid;
  c.status = status;
  return c;
}

// Containers in namespace -> id.
using World = std::map<std::string, std::map<std::string, FakeContainer>>;

std::string namespaceOf(grpc::ServerContext* ctx) {
  auto it = ctx->client_metadata().find("containerd-namespace");
  if (it == ctx->client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

class FakeContainers final : public containers::Containers::Service {
 public:
  explicit FakeContainers(const World& world) : world_(world) {}
  grpc::Status Get(grpc::ServerContext* ctx, const containers::GetContainerRequest* req,
                   containers::GetContainerResponse* resp) override {
    const std::string ns = namespaceOf(ctx);
    if (ns.empty())
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "namespace is required");
    auto n = world_.find(ns);
    if (n == world_.end() || n->second.count(req->id()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "container \"" + req->id() + "\" in namespace \"" + ns + "\": not found");
    }
    const FakeContainer& c = n->second.at(req->id());
    resp->mutable_container()->set_id(req->id());
    resp->mutable_container()->mutable_spec()->set_type_url(c.spec_type);
    resp->mutable_container()->mutable_spec()->set_value(c.spec_json);
    return grpc::Status::OK;
  }

 private:
  const World& world_;
};

class FakeTasks final : public tasks::Tasks::Service {
 public:
  explicit FakeTasks(const World& world) : world_(world) {}
  grpc::Status Get(grpc::ServerContext* ctx, const tasks::GetRequest* req,
                   tasks::GetResponse* resp) override {
    auto n = world_.find(namespaceOf(ctx));
    if (n == world_.end() || n->second.count(req->container_id()) == 0 ||
        !n->second.at(req->container_id()).has_task) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no running task found");
    }
    const FakeContainer& c = n->second.at(req->container_id());
    resp->mutable_process()->set_container_id(req->container_id());
    resp->mutable_process()->set_pid(c.pid);
    resp->mutable_process()->set_status(c.status);
    return grpc::Status::OK;
  }

 private:
  const World& world_;
};

class ContainerdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The helper the client runs (containerd_query.h), as built.
    ::setenv("SIPHON_CONTAINERD_HELPER", SIPHON_CONTAINERD_HELPER_BIN, 1);
    std::string tmpl = "/tmp/siphon-ctrd-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/containerd.sock";
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(&containers_);
    builder.RegisterService(&tasks_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  std::unique_ptr<RuntimeClient> client(const std::string& ns = "k8s.io") {
    return makeContainerdClient(socket_, ns, std::chrono::seconds(10));
  }

  World world_;
  FakeContainers containers_{world_};
  FakeTasks tasks_{world_};
  std::unique_ptr<grpc::Server> server_;
  std::string dir_;
  std::string socket_;
};

TEST_F(ContainerdClientTest, RunningTaskGivesPidAndSpecEnv) {
  world_["k8s.io"]["abc"] =
      task(R"({"ociVersion":"1.0.2-dev","process":{"args":["sleep","600"],)"
           R"("env":["PATH=/bin","RUNTIME_ONLY_VAR=from-image","FROM_CTR_RUN=1"]}})",
           4242);
  start();
  auto r = client()->resolve("abc");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 4242);
  EXPECT_EQ(r->runtime, "containerd");
  EXPECT_EQ(r->container_id, "abc");
  EXPECT_EQ(r->endpoint, socket_);
  ASSERT_EQ(r->env.size(), 3u);
  EXPECT_EQ(r->env[0].name(), "FROM_CTR_RUN");
  EXPECT_EQ(r->env[1].name(), "PATH");
  EXPECT_EQ(r->env[2].name(), "RUNTIME_ONLY_VAR");
  EXPECT_EQ(r->env[2].value(), "from-image");
}

TEST_F(ContainerdClientTest, NamespaceTravelsAsMetadata) {
  world_["moby"]["abc"] = task("{}", 7);
  start();
  EXPECT_EQ(client("moby")->resolve("abc")->pid, 7);
  auto r = client("k8s.io")->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ContainerdClientTest, UnknownContainerNamesRuntimeNamespaceSocketAndId) {
  start();
  auto r = client()->resolve("nope");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(),
            "container nope not found in containerd namespace k8s.io (" + socket_ + ")");
}

TEST_F(ContainerdClientTest, ContainerWithoutTaskIsNotFound) {
  world_["k8s.io"]["abc"] = task("{}", 0);
  world_["k8s.io"]["abc"].has_task = false;
  start();
  auto r = client()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(),
            "container abc has no running task in containerd namespace k8s.io (" + socket_ + ")");
}

TEST_F(ContainerdClientTest, StoppedTaskIsNotFound) {
  world_["k8s.io"]["abc"] = task("{}", 9, types::STOPPED);
  start();
  auto r = client()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(msg(r.status()), HasSubstr("is not running (task status STOPPED)"));
}

TEST_F(ContainerdClientTest, PausedTaskCanBeEntered) {
  world_["k8s.io"]["abc"] = task("{}", 9, types::PAUSED);
  start();
  EXPECT_EQ(client()->resolve("abc")->pid, 9);
}

TEST_F(ContainerdClientTest, SpecOfAnotherTypeGivesNoEnv) {
  world_["k8s.io"]["abc"] = task("\x08\x01", 3);
  world_["k8s.io"]["abc"].spec_type = "types.example/other";
  start();
  auto r = client()->resolve("abc");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->env.empty());
}

TEST_F(ContainerdClientTest, MalformedSpecIsInternal) {
  world_["k8s.io"]["abc"] = task("{\"process\":", 3);
  start();
  auto r = client()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(msg(r.status()), HasSubstr("unreadable OCI spec of container abc"));
}

TEST_F(ContainerdClientTest, MissingSocketIsUnavailable) {
  auto r = client()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "containerd at " + socket_ + ": no such socket");
}

TEST_F(ContainerdClientTest, SocketWithNoServerBehindIsUnavailable) {
  start();
  server_->Shutdown();
  server_.reset();
  // gRPC leaves the socket file behind: connect() is refused now.
  auto r = client()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

// Without the helper the agent says what is missing and where it looked.
TEST_F(ContainerdClientTest, AMissingHelperIsOneClearError) {
  world_["k8s.io"]["abc"] = task("{}", 7);
  start();
  ::setenv("SIPHON_CONTAINERD_HELPER", "/nonexistent/siphon-containerd", 1);
  auto r = client()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("siphon-containerd beside siphon-agent"));
  EXPECT_THAT(msg(r.status()), HasSubstr("/nonexistent/siphon-containerd"));
}

TEST(ContainerdAnswer, ATaskAndAnErrorReadBackAsWritten) {
  ContainerdTask t;
  t.pid = 31;
  t.oci_spec = "{\"process\":{\"env\":[\"A=1\\nerror 5 x\"]}}\npid 9\n";
  auto back = parseContainerdAnswer(formatContainerdAnswer(t));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pid, 31);
  EXPECT_EQ(back->oci_spec, t.oci_spec);

  const absl::Status e = absl::PermissionDeniedError("containerd at /s: Tasks.Get: denied\nmore");
  auto err = parseContainerdAnswer(formatContainerdAnswer(e));
  EXPECT_EQ(err.status(), e);
}

TEST(ContainerdAnswer, AnythingElseIsUnreadable) {
  for (std::string_view garbled : {"", "pid x\nspec 0\n", "pid 3\nspec 5\nabc", "pid 0\nspec 0\n",
                                   "error 99 nope", "error x nope", "hello"}) {
    auto r = parseContainerdAnswer(garbled);
    ASSERT_FALSE(r.ok()) << garbled;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << garbled;
    EXPECT_THAT(msg(r.status()), HasSubstr("siphon-containerd answered something unreadable"));
  }
}

}  // namespace
}  // namespace siphon::agent::runtime
