// The pod watch (layer-protocol/kube/pod_watch.h): the splitter of
// kubectl's concatenated, pretty-printed watch events, and the supervised
// `kubectl get pods --watch` against a fake kubectl written by the test (a
// Python script that prints its events in small chunks, exits, and is
// started again): the events come in order, the restart's list turns a pod
// gone meanwhile into a DELETED, failures are reported with kubectl's own
// line, and stop() leaves no process behind.
#include "kube/pod_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace siphon::kube {
namespace {

namespace asio = net::asio;

// Strings holding braces, brackets, escaped quotes and a final escaped
// backslash; nested arrays; compact and pretty-printed objects back to back.
const std::string kObjects[] = {
    R"({
    "type": "ADDED",
    "object": {
        "metadata": {
            "name": "web-1",
            "annotations": {"note": "a } and a { and a \"quoted }\" one [", "x": "]"}
        },
        "list": [1, [2, {"y": "}}"}], []]
    }
})",
    R"({"type":"MODIFIED","object":{"s":"ends in a backslash \\","t":"{\\\"{"}})",
    R"({
  "type": "DELETED",
  "object": {}
})",
};

std::string stream() { return "\n" + kObjects[0] + "\n" + kObjects[1] + kObjects[2] + "\n  \n"; }

TEST(JsonObjectSplitter, SplitsAtEveryByteBoundary) {
  const std::string text = stream();
  const std::vector<std::string> want(std::begin(kObjects), std::end(kObjects));
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    JsonObjectSplitter s;
    auto got = s.feed(std::string_view(text).substr(0, cut));
    for (auto& o : s.feed(std::string_view(text).substr(cut))) got.push_back(std::move(o));
    ASSERT_EQ(got, want) << "cut at " << cut;
  }
  JsonObjectSplitter bytes;
  std::vector<std::string> got;
  for (char c : text) {
    for (auto& o : bytes.feed(std::string_view(&c, 1))) got.push_back(std::move(o));
  }
  EXPECT_EQ(got, want);
}

TEST(JsonObjectSplitter, GivesNothingOfAnUnfinishedObject) {
  JsonObjectSplitter s;
  EXPECT_TRUE(s.feed(R"({"a": "}", "b": {"c": 1})").empty());
  EXPECT_EQ(s.feed("}{"), std::vector<std::string>{R"({"a": "}", "b": {"c": 1}})"});
}

// The fake kubectl: every call appended to `calls`; the watch prints what
// watch-N.json holds (events, pretty-printed) in chunks of 37 bytes, then
// says stderr-N.txt's lines and exits with exit-N.txt's code; without one,
// it starts a grandchild first and waits to be killed. The list prints
// list.json.
constexpr char kScript[] = R"PY(#!/usr/bin/env python3
import json, os, subprocess, sys, time
state = os.path.dirname(os.path.abspath(__file__))
def path(name): return os.path.join(state, name)
with open(path("calls"), "a") as f: f.write(" ".join(sys.argv[1:]) + "\n")
if "--watch" not in sys.argv:
    sys.stdout.write(open(path("list.json")).read())
    sys.exit(0)
n = 1
while os.path.exists(path("ran-%d" % n)): n += 1
open(path("ran-%d" % n), "w").close()
if not os.path.exists(path("exit-%d.txt" % n)):
    child = subprocess.Popen(["sleep", "1000"])
    with open(path("grandchild"), "w") as f: f.write(str(child.pid))
events = json.load(open(path("watch-%d.json" % n))) if os.path.exists(path("watch-%d.json" % n)) else []
text = "".join(json.dumps(e, indent=4) + "\n" for e in events)
for i in range(0, len(text), 37):
    sys.stdout.write(text[i:i + 37])
    sys.stdout.flush()
    time.sleep(0.001)
if os.path.exists(path("stderr-%d.txt" % n)):
    sys.stderr.write(open(path("stderr-%d.txt" % n)).read())
if os.path.exists(path("exit-%d.txt" % n)):
    sys.exit(int(open(path("exit-%d.txt" % n)).read()))
time.sleep(1000)
)PY";

std::string podJson(const std::string& name, const std::string& uid, const std::string& note = "") {
  std::ostringstream o;
  o << R"({"kind":"Pod","apiVersion":"v1","metadata":{"name":")" << name
    << R"(","namespace":"shop","uid":")" << uid
    << R"(","creationTimestamp":"2024-05-01T09:00:00Z","annotations":{"note":")" << note
    << R"("}},"spec":{"containers":[{"name":"app"}]},"status":{"phase":"Running"}})";
  return o.str();
}

std::string event(const std::string& type, const std::string& object) {
  return R"({"type":")" + type + R"(","object":)" + object + "}";
}

std::string typeName(PodEvent::Type t) {
  switch (t) {
    case PodEvent::Type::kAdded:
      return "ADDED";
    case PodEvent::Type::kModified:
      return "MODIFIED";
    case PodEvent::Type::kDeleted:
      return "DELETED";
  }
  return "?";
}

// Gone, or a zombie waiting for init (whose reaping is not ours to wait for).
bool dead(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto paren = line.rfind(')');
  return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
}

class PodWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("siphon-pod-watch-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    write("kubectl", kScript);
    std::filesystem::permissions(dir_ / "kubectl", std::filesystem::perms::owner_all);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::vector<std::string> calls() {
    std::ifstream in(dir_ / "calls");
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }

  // Runs a watch until `done` says so (from a callback, which then stops
  // it) and everything it started has ended.
  void run(PodWatch::Options options, std::function<bool(PodWatch&)> done) {
    asio::io_context io;
    std::shared_ptr<PodWatch> watch;
    auto check = [&] {
      if (watch && done(*watch)) watch->stop();
    };
    watch = PodWatch::create(
        io.get_executor(),
        [this](const std::vector<std::string>& args) {
          std::vector<std::string> v{(dir_ / "kubectl").string()};
          v.insert(v.end(), args.begin(), args.end());
          return v;
        },
        std::move(options),
        [&](const PodEvent& e) {
          events_.push_back(typeName(e.type) + " " + e.pod.name);
          pods_.push_back(e.pod);
          last_pid_ = watch->pidForTest();
          check();
        },
        [&](const std::string& line) {
          reports_.push_back(line);
          check();
        });
    io.run_for(std::chrono::seconds(60));
    EXPECT_TRUE(io.stopped()) << "the watch did not end";
    watch->stop();
  }

  std::filesystem::path dir_;
  std::vector<std::string> events_;
  std::vector<PodInfo> pods_;
  std::vector<std::string> reports_;
  pid_t last_pid_ = -1;
};

TEST_F(PodWatchTest, EventsInOrderAcrossARestartWithTheGoneOnesDeleted) {
  const std::string tricky = R"(a } and a { and a \"quoted }\" one)";
  write("watch-1.json",
        "[" + event("ADDED", podJson("web-a", "ua")) + "," +
            event("ADDED", podJson("web-b", "ub", tricky)) + "," +
            event("BOOKMARK", R"({"kind":"Pod","metadata":{"resourceVersion":"7"}})") + "]");
  write("exit-1.txt", "0");
  // Between the two watches web-b went, web-c came.
  write("list.json", R"({"apiVersion":"v1","kind":"List","items":[)" + podJson("web-a", "ua") +
                         "," + podJson("web-c", "uc") + R"(],"metadata":{"resourceVersion":""}})");
  write("watch-2.json", "[" + event("ADDED", podJson("web-a", "ua")) + "," +
                            event("ADDED", podJson("web-c", "uc")) + "," +
                            event("MODIFIED", podJson("web-c", "uc")) + "]");
  PodWatch::Options o;
  o.ns = "shop";
  o.selector = "app=web";
  run(o, [this](PodWatch&) { return events_.size() == 6; });
  EXPECT_EQ(events_, (std::vector<std::string>{"ADDED web-a", "ADDED web-b", "DELETED web-b",
                                               "ADDED web-a", "ADDED web-c", "MODIFIED web-c"}));
  ASSERT_EQ(pods_.size(), 6u);
  EXPECT_EQ(pods_[1].annotations["note"], R"(a } and a { and a "quoted }" one)");
  EXPECT_EQ(pods_[2].uid, "ub");
  EXPECT_EQ(calls(), (std::vector<std::string>{
                         "get pods -n shop -l app=web --watch --output-watch-events -o json",
                         "get pods -n shop -l app=web -o json",
                         "get pods -n shop -l app=web --watch --output-watch-events -o json"}));
  EXPECT_TRUE(reports_.empty()) << reports_[0];
  // stop(): kubectl and what it started are gone, kubectl reaped by us.
  ASSERT_GT(last_pid_, 0);
  const int killed = ::kill(last_pid_, 0);
  const int err = errno;
  EXPECT_EQ(killed, -1);
  EXPECT_EQ(err, ESRCH);
  std::ifstream grandchild(dir_ / "grandchild");
  pid_t g = -1;
  ASSERT_TRUE(grandchild >> g);
  for (int i = 0; i < 1000 && !dead(g); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(dead(g)) << "the sleep kubectl started is still alive: " << g;
}

TEST_F(PodWatchTest, RepeatedFailuresAreReportedWithKubectlsOwnLine) {
  for (int n = 1; n <= 3; ++n) {
    write("exit-" + std::to_string(n) + ".txt", "1");
    write("stderr-" + std::to_string(n) + ".txt",
          "E0501 reflector noise\nerror: You must be logged in to the server (Unauthorized)\n");
  }
  PodWatch::Options o;
  o.ns = "shop";
  o.pod = "web-0";
  run(o, [this](PodWatch&) { return !reports_.empty(); });
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0],
            "the pod watch in namespace shop failed 3 times in a row, retrying: error: You must be "
            "logged in to the server (Unauthorized)");
  EXPECT_TRUE(events_.empty());
  // Nothing was known: no list before the restarts.
  EXPECT_EQ(calls(), std::vector<std::string>(
                         3,
                         "get pods -n shop --field-selector metadata.name=web-0 --watch "
                         "--output-watch-events -o json"));
}

}  // namespace
}  // namespace siphon::kube
