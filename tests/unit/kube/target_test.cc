// Target parsing, and the pod and container a target comes to, from recorded
// `kubectl get -o json` answers.
#include "kube/target.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "kube/resolve.h"
#include "tests/fakes/fake_kubectl.h"

namespace siphon::kube {
namespace {

std::string testdata(const std::string& name) {
  std::ifstream in(std::string(KUBE_TESTDATA) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ParseTarget, KindsAndShortNames) {
  struct Case {
    const char* text;
    Kind kind;
    const char* name;
  } cases[] = {
      {"pod/web-0", Kind::kPod, "web-0"},
      {"po/web-0", Kind::kPod, "web-0"},
      {"web-0", Kind::kPod, "web-0"},
      {"deploy/web", Kind::kDeployment, "web"},
      {"deployment.apps/web", Kind::kDeployment, "web"},
      {"Deployments/web", Kind::kDeployment, "web"},
      {"sts/db", Kind::kStatefulSet, "db"},
      {"rs/web-7f9c", Kind::kReplicaSet, "web-7f9c"},
      {"ds/node-agent", Kind::kDaemonSet, "node-agent"},
      {"job/migrate", Kind::kJob, "migrate"},
  };
  for (const auto& c : cases) {
    auto ref = parseTarget(c.text);
    ASSERT_TRUE(ref.ok()) << c.text << ": " << ref.status();
    EXPECT_EQ(ref->kind, c.kind) << c.text;
    EXPECT_EQ(ref->name, c.name) << c.text;
  }
  EXPECT_EQ(refText(*parseTarget("deploy/web")), "deployment/web");
  EXPECT_EQ(kindResource(Kind::kStatefulSet), "statefulsets.apps");
}

TEST(ParseTarget, RefusesWhatIsNoTarget) {
  auto kind = parseTarget("service/web");
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kind.status().message().find("unknown kind 'service'"), std::string::npos);
  EXPECT_NE(kind.status().message().find("deployment"), std::string::npos);
  for (const char* bad : {"deploy/", "deploy/Web", "pod/a b", ""}) {
    EXPECT_FALSE(parseTarget(bad).ok()) << bad;
  }
}

TEST(Pods, ParsesARecordedList) {
  auto pods = parsePodList(testdata("web_pods.json"));
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 3u);
  const PodInfo& p = (*pods)[0];
  EXPECT_EQ(p.name, "web-7f9c6d8b5-2xkqp");
  EXPECT_EQ(p.ns, "shop");
  EXPECT_EQ(p.uid, "5d3e6c1a-9b7f-4d2e-8a61-2f0c9e4b7a11");
  EXPECT_EQ(p.node, "node-b");
  EXPECT_TRUE(p.ready());
  EXPECT_EQ(p.containers, (std::vector<std::string>{"istio-proxy", "app"}));
  EXPECT_EQ(p.container_ports, (std::vector<int>{15090, 8080}));
  ASSERT_NE(p.status("app"), nullptr);
  EXPECT_EQ(p.status("app")->container_id, "containerd://9f1c7e0d2b");
  EXPECT_FALSE((*pods)[1].ready());
  EXPECT_FALSE((*pods)[2].ready());
}

TEST(Pods, ADeletionTimestampIsKeptAndMakesItTerminating) {
  auto p = parsePod(
      R"({"kind":"Pod","metadata":{"name":"web-1","deletionTimestamp":"2024-05-01T10:00:00Z"},)"
      R"("status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->terminating);
  EXPECT_EQ(p->deleted_at, "2024-05-01T10:00:00Z");
  EXPECT_FALSE(p->ready());
}

TEST(Pods, AFieldOfTheWrongTypeIsAnErrorNamingIt) {
  auto p = parsePod(R"({"kind":"Pod","metadata":{"name":"x","labels":{"a":1}}})");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("metadata.labels.a is not a string"), std::string::npos);
  EXPECT_FALSE(parsePod("not json").ok());
  EXPECT_FALSE(parsePod(R"({"kind":"Service","metadata":{"name":"x"}})").ok());
}

TEST(Pods, SelectorOfAWorkload) {
  auto sel = workloadSelector(testdata("web_deployment.json"));
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_EQ(*sel, "app=web,tier in (front,edge),!canary");
  auto none = workloadSelector(R"({"kind":"Deployment","metadata":{"name":"x"},"spec":{}})");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ChoosePod, TheOldestReadyPodNeverANotReadyOne) {
  auto pods = parsePodList(testdata("web_pods.json"));
  ASSERT_TRUE(pods.ok());
  TargetRef ref{Kind::kDeployment, "web"};
  auto chosen = choosePod(ref, *pods);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  // old01 is older but crash-looping; pend1 unschedulable.
  EXPECT_EQ(chosen->name, "web-7f9c6d8b5-2xkqp");
}

TEST(ChoosePod, NoneReadyNamesEachPodAndWhy) {
  auto pods = parsePodList(testdata("web_pods.json"));
  ASSERT_TRUE(pods.ok());
  pods->erase(pods->begin());
  auto chosen = choosePod({Kind::kDeployment, "web"}, *pods);
  ASSERT_FALSE(chosen.ok());
  const std::string m(chosen.status().message());
  EXPECT_NE(m.find("deployment/web has no Ready pod"), std::string::npos) << m;
  EXPECT_NE(m.find("web-7f9c6d8b5-old01: phase Running, container app waiting: CrashLoopBackOff"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("Unschedulable: 0/2 nodes are available: 2 Insufficient cpu."),
            std::string::npos)
      << m;
  EXPECT_NE(choosePod({Kind::kDeployment, "web"}, {}).status().message().find("has no pods"),
            std::string::npos);
}

TEST(ChooseContainer, AnnotationElseFirstNeverASidecar) {
  PodInfo p;
  p.name = "web";
  p.containers = {"istio-proxy", "app", "worker"};
  EXPECT_EQ(*chooseContainer(p, ""), "app");  // the first that is not a sidecar
  p.annotations["kubectl.kubernetes.io/default-container"] = "worker";
  EXPECT_EQ(*chooseContainer(p, ""), "worker");
  p.annotations["kubectl.kubernetes.io/default-container"] = "istio-proxy";
  EXPECT_EQ(*chooseContainer(p, ""), "app");  // a sidecar only when named
  EXPECT_EQ(*chooseContainer(p, "istio-proxy"), "istio-proxy");
  p.containers = {"only"};
  p.annotations.clear();
  EXPECT_EQ(*chooseContainer(p, ""), "only");
  p.containers = {"linkerd-proxy"};
  EXPECT_EQ(chooseContainer(p, "").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ChooseContainer, AWrongNameListsTheNames) {
  PodInfo p;
  p.name = "web-0";
  p.containers = {"istio-proxy", "app"};
  auto c = chooseContainer(p, "api");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(),
            "pod/web-0 has no container 'api'; its containers: istio-proxy, app");
}

TEST(Runtime, KnownRuntimesAndTheOthers) {
  EXPECT_EQ(*runtimeOf("containerd://abc"), "containerd");
  EXPECT_EQ(*runtimeOf("cri-o://abc"), "cri-o");
  EXPECT_EQ(*runtimeOf("docker://abc"), "docker");
  auto other = runtimeOf("rkt://abc");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("runs under the runtime 'rkt'"), std::string::npos);
  EXPECT_NE(other.status().message().find("--agent-mode ephemeral"), std::string::npos);
  EXPECT_EQ(bareContainerId("containerd://abc"), "abc");
}

TEST(Resolve, ADeploymentThroughKubectl) {
  fakes::FakeKubectl k;
  k.on("get deployments.apps web -o json -n shop",
       fakes::FakeKubectl::ok(testdata("web_deployment.json")));
  k.on("get pods -l", fakes::FakeKubectl::ok(testdata("web_pods.json")));
  auto t = resolveTarget(k, {{Kind::kDeployment, "web"}, "shop", "", true});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->pod.name, "web-7f9c6d8b5-2xkqp");
  EXPECT_EQ(t->container, "app");
  EXPECT_EQ(t->container_id, "containerd://9f1c7e0d2b");
  EXPECT_EQ(t->runtime, "containerd");
  EXPECT_EQ(t->summary,
            "deployment/web: pod web-7f9c6d8b5-2xkqp (1 of 3 Ready), container app on node-b");
  auto pods = k.callsStarting("get pods");
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].text(), "get pods -l app=web,tier in (front,edge),!canary -o json -n shop");
}

TEST(Resolve, NotFoundForbiddenAndNotRunningAreOneLineEach) {
  fakes::FakeKubectl k;
  k.on("get pods gone",
       fakes::FakeKubectl::fail("Error from server (NotFound): pods \"gone\" not found\n"));
  auto gone = resolveTarget(k, {{Kind::kPod, "gone"}, "shop", "", true});
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message(), "pod/gone not found in namespace shop");

  k.on("get deployments.apps web",
       fakes::FakeKubectl::fail(
           "Error from server (Forbidden): deployments.apps \"web\" is forbidden: User \"dev\" "
           "cannot "
           "get resource \"deployments\" in API group \"apps\" in the namespace \"shop\"\n"));
  auto forbidden = resolveTarget(k, {{Kind::kDeployment, "web"}, "shop", "", true});
  EXPECT_EQ(forbidden.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(forbidden.status().message().find(
                "forbidden: you may not get deployments.apps in namespace shop"),
            std::string::npos)
      << forbidden.status();
  EXPECT_NE(forbidden.status().message().find("images/k8s/rbac.yaml"), std::string::npos);

  // The pod is Ready but the named container waits.
  std::string pod = testdata("web_pods.json");
  auto list = parsePodList(pod);
  ASSERT_TRUE(list.ok());
  k.on("get pods web-7f9c6d8b5-2xkqp",
       fakes::FakeKubectl::ok(R"({"kind":"Pod","metadata":{"name":"w","namespace":"shop","uid":"u"},
    "spec":{"containers":[{"name":"app"},{"name":"side"}],"nodeName":"n"},
    "status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}],
    "containerStatuses":[{"name":"app","ready":true,"containerID":"containerd://1","state":{"running":{}}},
                         {"name":"side","ready":false,"state":{"waiting":{"reason":"CrashLoopBackOff"}}}]}})"));
  auto waiting = resolveTarget(k, {{Kind::kPod, "web-7f9c6d8b5-2xkqp"}, "", "side", true});
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(waiting.status().message(),
            "container side of pod/w is not running (waiting: CrashLoopBackOff)");
  auto wrong = resolveTarget(k, {{Kind::kPod, "web-7f9c6d8b5-2xkqp"}, "", "api", true});
  EXPECT_EQ(wrong.status().message(), "pod/w has no container 'api'; its containers: app, side");
}

}  // namespace
}  // namespace siphon::kube
