// Which runtimes and sockets the resolver asks, in which order, and the error
// it makes of their answers. The runtimes are fakes (fake_runtime_clients.h).
#include "agent/runtime/resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/agent/runtime/fake_runtime_clients.h"
#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::msg;
using ::testing::StartsWith;

constexpr char kCtrd[] = "/run/containerd/containerd.sock";
constexpr char kHostCtrd[] = "/host/run/containerd/containerd.sock";
constexpr char kK3s[] = "/run/k3s/containerd/containerd.sock";
constexpr char kDocker[] = "/var/run/docker.sock";
constexpr char kHostDocker[] = "/host/var/run/docker.sock";
constexpr char kCrio[] = "/var/run/crio/crio.sock";
constexpr char kHostCrio[] = "/host/var/run/crio/crio.sock";

RuntimeOptions autoOptions() { return RuntimeOptions{}; }

RuntimeOptions only(RuntimeKind kind, std::string endpoint = "") {
  RuntimeOptions o;
  o.runtime = kind;
  o.endpoint = std::move(endpoint);
  return o;
}

TEST(KnownSocketsTest, AreTheDocumentedPathsInOrder) {
  EXPECT_THAT(knownSockets(RuntimeKind::kContainerd), ElementsAre(kCtrd, kHostCtrd, kK3s));
  EXPECT_THAT(knownSockets(RuntimeKind::kDocker), ElementsAre(kDocker, kHostDocker));
  EXPECT_THAT(knownSockets(RuntimeKind::kCrio), ElementsAre(kCrio, kHostCrio));
}

TEST(RealClientFactoryTest, MakesTheClientOfEachRuntimeAtTheSocket) {
  RuntimeClientFactory factory = realClientFactory(RuntimeOptions{});
  for (RuntimeKind k : {RuntimeKind::kContainerd, RuntimeKind::kDocker, RuntimeKind::kCrio}) {
    auto client = factory(k, "/tmp/x.sock");
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->kind(), k);
    EXPECT_EQ(client->endpoint(), "/tmp/x.sock");
  }
}

TEST(ResolverTest, AutoTriesEverySocketInOrderAndSaysSoWhenNoneAnswers) {
  FakeRuntimes world;
  RuntimeResolver resolver(autoOptions(), world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(world.calls(), ElementsAre(std::string("containerd ") + kCtrd + " abc",
                                         std::string("containerd ") + kHostCtrd + " abc",
                                         std::string("containerd ") + kK3s + " abc",
                                         std::string("docker ") + kDocker + " abc",
                                         std::string("docker ") + kHostDocker + " abc",
                                         std::string("cri-o ") + kCrio + " abc",
                                         std::string("cri-o ") + kHostCrio + " abc"));
  EXPECT_EQ(r.status().message(),
            "no container runtime answered for container abc; tried: "
            "containerd at /run/containerd/containerd.sock: no such socket; "
            "containerd at /host/run/containerd/containerd.sock: no such socket; "
            "containerd at /run/k3s/containerd/containerd.sock: no such socket; "
            "docker at /var/run/docker.sock: no such socket; "
            "docker at /host/var/run/docker.sock: no such socket; "
            "cri-o at /var/run/crio/crio.sock: no such socket; "
            "cri-o at /host/var/run/crio/crio.sock: no such socket");
}

TEST(ResolverTest, AutoStopsAtTheFirstRuntimeThatHasIt) {
  FakeRuntimes world;
  world.empty(RuntimeKind::kContainerd, kCtrd);
  world.runs(RuntimeKind::kDocker, kHostDocker, "abc", 4242, {{"A", "1"}});
  world.runs(RuntimeKind::kCrio, kCrio, "abc", 999);  // never asked
  RuntimeResolver resolver(autoOptions(), world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 4242);
  EXPECT_EQ(r->runtime, "docker");
  EXPECT_EQ(r->endpoint, kHostDocker);
  ASSERT_EQ(r->env.size(), 1u);
  EXPECT_EQ(r->env[0].name(), "A");
  EXPECT_EQ(world.calls().size(), 5u);
  EXPECT_THAT(world.calls().back(), StartsWith("docker /host/var/run/docker.sock"));
}

TEST(ResolverTest, NotFoundLeadsAndTheOtherAttemptsFollow) {
  FakeRuntimes world;
  world.empty(RuntimeKind::kContainerd, kCtrd);
  RuntimeResolver resolver(autoOptions(), world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(msg(r.status()),
              StartsWith("container abc not found in containerd "
                         "(/run/containerd/containerd.sock); also tried: containerd at "
                         "/host/run/containerd/containerd.sock: no such socket; "));
  EXPECT_THAT(msg(r.status()), HasSubstr("cri-o at /host/var/run/crio/crio.sock"));
}

TEST(ResolverTest, PermissionDeniedOutranksNotFound) {
  FakeRuntimes world;
  world.empty(RuntimeKind::kContainerd, kCtrd);
  world.fails(RuntimeKind::kDocker, kDocker,
              absl::PermissionDeniedError("docker at /var/run/docker.sock: permission denied"));
  RuntimeResolver resolver(autoOptions(), world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_THAT(msg(r.status()),
              StartsWith("docker at /var/run/docker.sock: permission denied; also tried: "
                         "container abc not found in containerd"));
}

TEST(ResolverTest, NotFoundOutranksAMalformedAnswerWhichOutranksUnavailable) {
  FakeRuntimes world;
  world.fails(RuntimeKind::kContainerd, kCtrd, absl::InternalError("containerd: garbage"));
  {
    RuntimeResolver resolver(autoOptions(), world.factory());
    auto r = resolver.resolve("abc");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
    EXPECT_THAT(msg(r.status()), StartsWith("containerd: garbage; also tried: "));
  }
  world.empty(RuntimeKind::kCrio, kHostCrio);
  {
    RuntimeResolver resolver(autoOptions(), world.factory());
    auto r = resolver.resolve("abc");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
    EXPECT_THAT(msg(r.status()), HasSubstr("containerd: garbage"));
  }
}

TEST(ResolverTest, KubernetesPrefixLimitsTheSearchToThatRuntime) {
  FakeRuntimes world;
  world.runs(RuntimeKind::kContainerd, kCtrd, "abc", 1);  // must not be asked
  world.runs(RuntimeKind::kCrio, kHostCrio, "abc", 77);
  RuntimeResolver resolver(autoOptions(), world.factory());
  auto r = resolver.resolve("cri-o://abc");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 77);
  EXPECT_EQ(r->container_id, "abc");
  EXPECT_THAT(world.calls(), ElementsAre(std::string("cri-o ") + kCrio + " abc",
                                         std::string("cri-o ") + kHostCrio + " abc"));
}

TEST(ResolverTest, ExplicitRuntimeWithoutEndpointSaysWhichRuntimeWasMissing) {
  FakeRuntimes world;
  RuntimeResolver resolver(only(RuntimeKind::kDocker), world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(msg(r.status()),
              StartsWith("no docker socket answered for container abc; tried: docker at "
                         "/var/run/docker.sock: no such socket; docker at "
                         "/host/var/run/docker.sock: no such socket"));
  EXPECT_EQ(world.calls().size(), 2u);
}

TEST(ResolverTest, EndpointIsTheOnlySocketAskedAndItsErrorIsPassedAsIs) {
  FakeRuntimes world;
  world.empty(RuntimeKind::kContainerd, "/tmp/x/containerd.sock");
  RuntimeResolver resolver(only(RuntimeKind::kContainerd, "/tmp/x/containerd.sock"),
                           world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "container abc not found in containerd (/tmp/x/containerd.sock)");
  EXPECT_THAT(world.calls(), ElementsAre("containerd /tmp/x/containerd.sock abc"));
}

TEST(ResolverTest, UnreachableEndpointSaysWhichContainerWasWanted) {
  FakeRuntimes world;
  RuntimeResolver resolver(only(RuntimeKind::kContainerd, "/tmp/x/none.sock"), world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(),
            "no containerd socket answered for container abc; tried: containerd at "
            "/tmp/x/none.sock: no such socket");
}

TEST(ResolverTest, EndpointWithAPrefixedIdNeedsNoRuntimeFlag) {
  FakeRuntimes world;
  world.runs(RuntimeKind::kDocker, "/tmp/d.sock", "abc", 5);
  RuntimeOptions o;
  o.endpoint = "/tmp/d.sock";
  RuntimeResolver resolver(o, world.factory());
  auto r = resolver.resolve("docker://abc");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pid, 5);
}

TEST(ResolverTest, EndpointWithoutARuntimeIsAUsageError) {
  FakeRuntimes world;
  RuntimeOptions o;
  o.endpoint = "/tmp/d.sock";
  RuntimeResolver resolver(o, world.factory());
  auto r = resolver.resolve("abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(r.status()), HasSubstr("--runtime-endpoint /tmp/d.sock needs --runtime"));
  EXPECT_TRUE(world.calls().empty());
}

TEST(ResolverTest, PrefixThatContradictsRuntimeFlagIsAUsageError) {
  FakeRuntimes world;
  RuntimeResolver resolver(only(RuntimeKind::kDocker), world.factory());
  auto r = resolver.resolve("containerd://abc");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(r.status()), HasSubstr("names runtime containerd but --runtime is docker"));
  EXPECT_TRUE(world.calls().empty());
}

TEST(ResolverTest, MalformedIdAsksNobody) {
  FakeRuntimes world;
  RuntimeResolver resolver(autoOptions(), world.factory());
  EXPECT_EQ(resolver.resolve("../x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(world.calls().empty());
}

TEST(ResolverTest, ResolveAgainAsksTheSameRuntimeAndSocket) {
  FakeRuntimes world;
  world.runs(RuntimeKind::kContainerd, kK3s, "abc", 10);
  RuntimeResolver resolver(autoOptions(), world.factory());
  auto first = resolver.resolve("abc");
  ASSERT_TRUE(first.ok()) << first.status();
  const size_t before = world.calls().size();
  auto again = resolver.resolveAgain(*first);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->pid, 10);
  ASSERT_EQ(world.calls().size(), before + 1);
  EXPECT_EQ(world.calls().back(), std::string("containerd ") + kK3s + " abc");
}

}  // namespace
}  // namespace siphon::agent::runtime
