// The supervised port-forward (layer-protocol/kube/port_forward.h) with a
// fake kubectl (tests/fakes/kubectl/fake_kubectl.py) that prints the
// Forwarding line and relays to a real agent in process, then exits ("lost
// connection to pod") or stalls mid-transfer: the session resumes over a new
// port-forward and the file read through it comes back byte for byte.
#include "kube/port_forward.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "siphon/client/client.h"
#include "siphon/client/files.h"
#include "siphon/client/target.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::kube {
namespace {

namespace asio = net::asio;
using agent::files::testing::ScratchTree;

constexpr char kToken[] = "port-forward-test-token";

TEST(ForwardingLine, Parsed) {
  EXPECT_EQ(PortForward::parseForwardingLine("Forwarding from 127.0.0.1:43567 -> 7140"), 43567);
  EXPECT_FALSE(PortForward::parseForwardingLine("Forwarding from [::1]:43567 -> 7140"));
  EXPECT_FALSE(PortForward::parseForwardingLine("Handling connection for 7140"));
  EXPECT_FALSE(PortForward::parseForwardingLine("Forwarding from 127.0.0.1:0 -> 7140"));
  EXPECT_FALSE(PortForward::parseForwardingLine("Forwarding from 127.0.0.1:x -> 7140"));
}

class PortForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = std::filesystem::temp_directory_path() /
             ("siphon-fake-kube-" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(state_);
    std::filesystem::create_directories(state_);
    ::setenv("FAKE_KUBE_STATE", state_.c_str(), 1);
    ::unsetenv("FAKE_PF_CUT_AFTER_BYTES");
    ::unsetenv("FAKE_PF_STALL_AFTER_BYTES");
  }
  void TearDown() override { std::filesystem::remove_all(state_); }

  void startAgent() {
    agent::AgentConfig config;
    config.token = kToken;
    config.fs_mode = agent::FsMode::kReadOnly;
    auto procfs = std::make_unique<fakes::RootedProcFs>(tree_.root());
    procfs->setSelfPid(4242);
    procfs->addProcess(4242, fakes::FakeProcess{});
    agent::TargetSpec spec;
    spec.mode = agent::TargetMode::kTargetless;
    agent_.start(config, std::move(procfs), spec);
    // The fake cluster: one pod whose "log" says where its agent listens.
    std::ofstream(state_ / "cluster.json")
        << R"({"pods":{"siphon/agent-0":{"kind":"Pod","metadata":{"name":"agent-0","namespace":"siphon"},"spec":{"containers":[{"name":"siphon-agent"}]},"status":{"phase":"Running"}}}})";
    std::ofstream(state_ / "log-siphon-agent-0")
        << "siphon-agent ready version=0.1.0 listen=" << agent_.address() << "\n";
  }

  std::shared_ptr<PortForward> forward(const asio::any_io_executor& ex,
                                       std::string pod = "agent-0") {
    PortForward::Options o;
    o.ns = "siphon";
    o.pod = std::move(pod);
    o.start_timeout = std::chrono::seconds(20);
    return PortForward::create(
        ex,
        [](const std::vector<std::string>& args) {
          std::vector<std::string> v{FAKE_KUBECTL};
          v.insert(v.end(), args.begin(), args.end());
          return v;
        },
        o, [this](const std::string& line) { reports_.push_back(line); });
  }

  client::ClientOptions options(const std::shared_ptr<PortForward>& f) {
    client::ClientOptions o;
    o.endpoints = {"kube:siphon/agent-0"};
    o.token = kToken;
    o.resolve_endpoint = [f](std::string, bool cut) -> net::awaitable<absl::StatusOr<std::string>> {
      co_return co_await f->address(cut);
    };
    return o;
  }

  // Reads /data/big through a port-forward that fails once mid-transfer.
  void readThroughAFault(const char* fault, bool keepalive) {
    std::string big(4 * 1024 * 1024 + 11, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131) ^ (i >> 9));
    tree_.file("data/big", big);
    startAgent();
    ::setenv(fault, "1500000", 1);
    fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
      auto f = forward(ex);
      client::ClientOptions o = options(f);
      if (keepalive) {
        // A stall is seen by the keepalive: no word from the agent for 1 s.
        o.limits.keepalive_interval = std::chrono::milliseconds(200);
        o.limits.keepalive_timeout = std::chrono::milliseconds(1000);
      }
      auto c = client::Client::create(ex, o);
      absl::Status s = co_await c->connect();
      EXPECT_TRUE(s.ok()) << s;
      if (s.ok()) {
        client::Target target = client::Target::over(c);
        client::Files files(target);
        auto whole = co_await files.readFile("/data/big", 4, 256 * 1024);
        EXPECT_TRUE(whole.ok()) << whole.status();
        if (whole.ok()) {
          EXPECT_TRUE(*whole == big) << "sizes " << whole->size() << " " << big.size();
        }
        EXPECT_GE(c->resumeCountForTest(), 1u);
        EXPECT_TRUE(c->lostStatus().ok()) << c->lostStatus();
      }
      c->close();
      EXPECT_GE(f->started(), 2);
      f->stop();
    });
    ASSERT_FALSE(reports_.empty());
    EXPECT_NE(reports_[0].find("port-forward to pod/agent-0 restarted ("), std::string::npos)
        << reports_[0];
  }

  std::filesystem::path state_;
  ScratchTree tree_;
  fakes::InProcessAgent agent_;
  std::vector<std::string> reports_;
};

TEST_F(PortForwardTest, AKubectlThatExitsMidTransferIsReplacedAndNothingIsLost) {
  readThroughAFault("FAKE_PF_CUT_AFTER_BYTES", false);
  EXPECT_NE(reports_[0].find("lost connection to pod"), std::string::npos) << reports_[0];
}

TEST_F(PortForwardTest, AStalledOneIsReplacedAfterTheKeepaliveTimeout) {
  readThroughAFault("FAKE_PF_STALL_AFTER_BYTES", true);
  EXPECT_NE(reports_[0].find("the connection through it was cut"), std::string::npos)
      << reports_[0];
}

TEST_F(PortForwardTest, KubectlsOwnErrorIsTheAnswer) {
  startAgent();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto f = forward(ex, "gone-0");
    auto a = co_await f->address(false);
    EXPECT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(a.status().message().find("pods \"gone-0\" not found"), std::string::npos)
        << a.status();
    f->stop();
  });
}

std::set<std::string> socketsOf(const std::string& pid) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + pid + "/fd", ec)) {
    std::error_code lec;
    auto target = std::filesystem::read_symlink(e.path(), lec).string();
    if (target.rfind("socket:", 0) == 0) out.insert(target);
  }
  return out;
}

TEST_F(PortForwardTest, KubectlGetsNoDescriptorOfOursAndItsOwnProcessGroup) {
  startAgent();
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto f = forward(ex);
    auto a = co_await f->address(false);
    EXPECT_TRUE(a.ok()) << a.status();
    const pid_t pid = f->pidForTest();
    // A Ctrl-C at the terminal is Siphon's to handle, not kubectl's.
    EXPECT_EQ(::getpgid(pid), pid);
    // None of our sockets (the agent's listener among them) is kubectl's.
    auto ours = socketsOf("self");
    EXPECT_FALSE(ours.empty());
    for (const auto& s : socketsOf(std::to_string(pid))) EXPECT_EQ(ours.count(s), 0u) << s;
    f->stop();
  });
}

}  // namespace
}  // namespace siphon::kube
