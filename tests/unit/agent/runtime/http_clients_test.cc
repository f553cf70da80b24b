// The Docker and CRI-O clients against a real HTTP server on a unix socket
// in a temporary directory (fake_http_server.h), answering with the bodies
// those runtimes send.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "agent/runtime/runtime_client.h"
#include "agent/runtime/unix_http.h"
#include "tests/unit/agent/runtime/fake_http_server.h"
#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using testing::FakeHttpServer;
using ::testing::HasSubstr;
using testing::msg;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kClientId[] = "9b2e6f1c0d8a7e6f5d4c3b2a19081726354f6e5d4c3b2a190817263544f6e5d4";

using testing::TempDir;
using Reply = FakeHttpServer::Reply;

Reply json(std::string body, bool chunked = false) {
  Reply r;
  r.body = std::move(body);
  r.chunked = chunked;
  return r;
}
Reply status(unsigned code, std::string body, std::string content_type = "application/json") {
  Reply r;
  r.status = code;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}
// `bytes` as the whole answer, then the connection closes.
Reply raw(std::string bytes) {
  Reply r;
  r.body = std::move(bytes);
  r.raw = true;
  return r;
}
Reply silence() {
  Reply r;
  r.hang = true;
  return r;
}

// What `docker inspect` of a running container looks like, cut down but with
// the nesting, nulls, big numbers and escapes of the real thing.
std::string dockerRunning(int pid) {
  return std::string(R"({"Id":")") + kClientId +
         R"(","Created":"2024-05-01T10:00:00.123456789Z","Path":"sleep","Args":["600"],)"
         R"("State":{"Status":"running","Running":true,"Paused":false,"Restarting":false,)"
         R"("OOMKilled":false,"Dead":false,"Pid":)" +
         std::to_string(pid) +
         R"(,"ExitCode":0,"Error":"","StartedAt":"2024-05-01T10:00:01Z"},)"
         R"("Name":"/web","RestartCount":0,"HostConfig":{"Memory":0,"NanoCpus":0,)"
         R"("ShmSize":67108864,"BlkioWeight":0,"MemorySwap":-1,"Ulimits":null,)"
         R"("KernelMemory":9223372036854775807},)"
         R"("Config":{"Hostname":"3f4c2a1b9e8d","Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)"
         R"("GREETING=caf\u00e9 \"quoted\"\nline2","EMPTY=","EQ=a=b"],)"
         R"("Cmd":["sleep","600"],"Labels":{"a":"b"}},"NetworkSettings":{"Networks":{}}})";
}

class DockerClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    socket_ = dir_.path("docker.sock");
    server_ = std::make_unique<FakeHttpServer>(socket_);
  }
  std::unique_ptr<RuntimeClient> client(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return makeDockerClient(socket_, timeout);
  }
  std::string target() const { return std::string("/containers/") + kClientId + "/json"; }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<FakeHttpServer> server_;
};

TEST_F(DockerClientTest, RunningContainerGivesPidEnvAndFullId) {
  server_->on(target(), json(dockerRunning(4242)));
  auto r = client()->resolve(kClientId);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 4242);
  EXPECT_EQ(r->runtime, "docker");
  EXPECT_EQ(r->container_id, kClientId);
  EXPECT_EQ(r->endpoint, socket_);
  // Sorted by name, escapes decoded.
  ASSERT_EQ(r->env.size(), 4u);
  EXPECT_EQ(r->env[0].name(), "EMPTY");
  EXPECT_EQ(r->env[0].value(), "");
  EXPECT_EQ(r->env[1].name(), "EQ");
  EXPECT_EQ(r->env[1].value(), "a=b");
  EXPECT_EQ(r->env[2].name(), "GREETING");
  EXPECT_EQ(r->env[2].value(), "caf\xC3\xA9 \"quoted\"\nline2");
  EXPECT_EQ(r->env[3].name(), "PATH");
}

TEST_F(DockerClientTest, SendsAGetWithAHostHeaderToTheInspectPath) {
  server_->on(target(), json(dockerRunning(1)));
  ASSERT_TRUE(client()->resolve(kClientId).ok());
  auto requests = server_->requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[0].target, target());
  EXPECT_EQ(requests[0].host, "docker");
}

TEST_F(DockerClientTest, ChunkedAnswerIsReadWhole) {
  server_->on(target(), json(dockerRunning(77), true));
  auto r = client()->resolve(kClientId);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 77);
}

TEST_F(DockerClientTest, NameResolvesToTheFullId) {
  server_->on("/containers/web/json", json(dockerRunning(5)));
  auto r = client()->resolve("web");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->container_id, kClientId);
}

TEST_F(DockerClientTest, NotFoundNamesTheRuntimeTheSocketAndTheId) {
  server_->on("/containers/nope/json", status(404, R"({"message":"No such container: nope"})"));
  auto r = client()->resolve("nope");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_EQ(r.status().message(), "container nope not found in docker (" + socket_ + ")");
}

TEST_F(DockerClientTest, StoppedContainerIsNotFound) {
  server_->on(
      target(),
      json(std::string(R"({"Id":")") + kClientId +
           R"(","State":{"Status":"exited","Running":false,"Pid":0},"Config":{"Env":null}})"));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("is not running in docker"));
}

TEST_F(DockerClientTest, NullEnvIsEmpty) {
  server_->on(target(),
              json(R"({"Id":"x","State":{"Running":true,"Pid":9},"Config":{"Env":null}})"));
  auto r = client()->resolve(kClientId);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->env.empty());
}

TEST_F(DockerClientTest, ServerErrorIsInternalAndQuotesTheBody) {
  server_->on(target(), status(500, "{\"message\":\"daemon is sad\"}\nmore"));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("answered 500 Internal Server Error"));
  EXPECT_THAT(msg(r.status()), HasSubstr("daemon is sad"));
  EXPECT_THAT(msg(r.status()), Not(HasSubstr("more")));
}

TEST_F(DockerClientTest, MalformedJsonIsInternal) {
  server_->on(target(), json(R"({"Id":"x","State":{"Running":true,"Pid":9})"));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(msg(r.status()), StartsWith("docker at " + socket_ + ": unreadable answer"));
}

TEST_F(DockerClientTest, PidOfTheWrongTypeIsInternalAndNamesTheField) {
  server_->on(target(), json(R"({"Id":"x","State":{"Running":true,"Pid":"9"}})"));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("State.Pid is a string, not a number"));
}

TEST_F(DockerClientTest, GarbageInsteadOfHttpIsInternal) {
  server_->on(target(), raw("SSH-2.0-OpenSSH_9.2\r\n\r\n"));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("malformed HTTP answer"));
}

TEST_F(DockerClientTest, ConnectionClosedBeforeAnAnswerIsUnavailable) {
  server_->on(target(), raw(""));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("closed the connection"));
}

TEST_F(DockerClientTest, TruncatedBodyIsUnavailable) {
  server_->on(target(), raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"Id\":"));
  auto r = client()->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST_F(DockerClientTest, SilentServerTimesOutAsUnavailable) {
  server_->on(target(), silence());
  auto r = client(std::chrono::milliseconds(200))->resolve(kClientId);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(r.status().message(),
            "docker at " + socket_ + ": no answer within 200ms (waiting for the answer)");
}

TEST(UnixHttpTest, MissingSocketIsUnavailable) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto r = makeDockerClient(dir.path("none.sock"))->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), "docker at " + dir.path("none.sock") + ": no such socket");
  EXPECT_EQ(probeUnixSocket(dir.path("none.sock")).code(), absl::StatusCode::kUnavailable);
}

TEST(UnixHttpTest, MissingDirectoryIsUnavailable) {
  auto s = probeUnixSocket("/nonexistent-siphon-dir/x.sock");
  ASSERT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "no such socket");
}

TEST(UnixHttpTest, RegularFileIsConnectionRefused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::ofstream(dir.path("file.sock")) << "not a socket";
  auto r = makeCrioClient(dir.path("file.sock"))->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(msg(r.status()), HasSubstr("connection refused"));
}

TEST(UnixHttpTest, SocketWithoutWriteAccessIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root passes every permission check on a socket";
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  FakeHttpServer server(dir.path("closed.sock"));
  ASSERT_EQ(::chmod(dir.path("closed.sock").c_str(), 0), 0);
  auto r = makeDockerClient(dir.path("closed.sock"))->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("permission denied"));
}

TEST(UnixHttpTest, TooLongSocketPathIsInvalidArgument) {
  auto s = probeUnixSocket("/" + std::string(200, 'a'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  auto r = makeDockerClient("/" + std::string(200, 'a'))->resolve("abc");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UnixHttpTest, BodyAboveTheLimitIsRefused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  FakeHttpServer server(dir.path("big.sock"));
  server.on("/big", json(std::string(4096, 'x')));
  auto r = unixHttpGet(dir.path("big.sock"), "/big", "docker", std::chrono::seconds(10), 1024);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(msg(r.status()), HasSubstr("larger than 1024 bytes"));
  auto fits = unixHttpGet(dir.path("big.sock"), "/big", "docker", std::chrono::seconds(10), 4096);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->body.size(), 4096u);
  EXPECT_EQ(fits->status, 200u);
}

TEST(UnixHttpTest, ChunkedBodyAboveTheLimitIsRefused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  FakeHttpServer server(dir.path("big.sock"));
  server.on("/big", json(std::string(4096, 'x'), /*chunked=*/true));
  auto r = unixHttpGet(dir.path("big.sock"), "/big", "docker", std::chrono::seconds(10), 1024);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
  EXPECT_THAT(msg(r.status()), HasSubstr("larger than 1024 bytes"));
}

class CrioClientTest : public DockerClientTest {
 protected:
  std::unique_ptr<RuntimeClient> crio() { return makeCrioClient(socket_); }
};

// CRI-O's /containers/{id}: its ContainerInfo (there is no env in it).
constexpr char kCrioInfo[] =
    R"({"name":"k8s_web_web-0_default_0a1b2c3d_0","pid":31337,"image":"docker.io/library/nginx:1.25",)"
    R"("image_ref":"docker.io/library/nginx@sha256:0123","created_time":1714557600123456789,)"
    R"("labels":{"io.kubernetes.pod.name":"web-0"},"annotations":{"io.kubernetes.container.restartCount":"0"},)"
    R"("crio_annotations":{},"log_path":"/var/log/pods/x/web/0.log","root":"/var/lib/containers/storage/overlay/abc/merged",)"
    R"("sandbox":"4d5e6f","ip_addresses":["10.85.0.12"]})";

TEST_F(CrioClientTest, RunningContainerGivesPidAndNoEnv) {
  server_->on(std::string("/containers/") + kClientId, json(kCrioInfo));
  auto r = crio()->resolve(kClientId);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 31337);
  EXPECT_EQ(r->runtime, "cri-o");
  EXPECT_EQ(r->container_id, kClientId);
  EXPECT_TRUE(r->env.empty());
  auto requests = server_->requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].target, std::string("/containers/") + kClientId);
  EXPECT_EQ(requests[0].host, "crio");
}

TEST_F(CrioClientTest, NotFoundAsCrioSaysIt) {
  server_->on("/containers/nope",
              status(404, "can't find the container with id nope\n", "text/plain; charset=utf-8"));
  auto r = crio()->resolve("nope");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "container nope not found in cri-o (" + socket_ + ")");
}

TEST_F(CrioClientTest, PidZeroIsNotRunning) {
  server_->on("/containers/abc", json(R"({"name":"x","pid":0,"sandbox":"s"})"));
  auto r = crio()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(msg(r.status()), HasSubstr("is not running in cri-o"));
}

TEST_F(CrioClientTest, MissingPidIsInternal) {
  server_->on("/containers/abc", json(R"({"name":"x"})"));
  auto r = crio()->resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(msg(r.status()), HasSubstr("pid is missing"));
}

}  // namespace
}  // namespace siphon::agent::runtime
