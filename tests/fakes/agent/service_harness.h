// What a service is built with (ServiceContext), without the agent's server:
// an event loop run by the test's thread, a blocking pool, a targetless
// Target over a FakeProcFs (its root: a directory of the test's choosing),
// the NetnsWorker of the agent's own namespace, and a config. Pair it with
// FakeSessionHost (fake_session_host.h) to unit-test a service.
//
// Declare the harness before the services under test: the services go
// first, while what they use still exists.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "agent/netns/netns_worker.h"
#include "agent/server/config.h"
#include "agent/services/service.h"
#include "agent/target/target.h"
#include "siphon/transport/asio.h"
#include "tests/fakes/fake_proc_fs.h"

namespace siphon::fakes {

class ServiceHarness {
 public:
  static constexpr pid_t kSelfPid = 4242;

  // `root` (a directory) is the target's root; "/" when empty. `environ`
  // is the target's /proc/PID/environ.
  explicit ServiceHarness(agent::AgentConfig config = {}, std::string root = {},
                          std::string environ = {})
      : config_(std::move(config)) {
    auto procfs = std::make_unique<RootedProcFs>(root.empty() ? "/" : root);
    procfs->setSelfPid(kSelfPid);
    FakeProcess self;
    self.environ = std::move(environ);
    procfs_process_ = &procfs->addProcess(kSelfPid, std::move(self));
    procfs_ = std::move(procfs);
    agent::TargetSpec spec;
    spec.mode = agent::TargetMode::kTargetless;
    auto target = agent::Target::open(*procfs_, spec);
    EXPECT_TRUE(target.ok()) << target.status();
    if (target.ok()) target_ = *std::move(target);
    auto netns = agent::NetnsWorker::start(-1);
    EXPECT_TRUE(netns.ok()) << netns.status();
    if (netns.ok()) netns_ = *std::move(netns);
    ctx_ = std::make_unique<agent::ServiceContext>(
        agent::ServiceContext{io_, pool_, *target_, *procfs_, *netns_, config_, {}, {}, nullptr, {}});
  }

  ~ServiceHarness() {
    // Jobs on the pool post to the loop: let them finish, then drop what
    // they posted.
    pool_.join();
    if (netns_) netns_->run<bool>([] { return true; });
    io_.restart();
    io_.poll();
  }

  agent::ServiceContext& ctx() { return *ctx_; }
  net::asio::io_context& io() { return io_; }
  agent::AgentConfig& config() { return config_; }
  // The target's process in the fake /proc (its environ, errnos).
  FakeProcess& process() { return *procfs_process_; }

  // Runs the loop until `pred` holds or about 10 s passed (a hang guard,
  // not a timing assertion: work on the pool and the netns worker posts
  // back here); returns pred().
  bool runUntil(const std::function<bool()>& pred) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!pred() && std::chrono::steady_clock::now() < give_up) {
      io_.restart();
      io_.run_for(std::chrono::milliseconds(5));
    }
    return pred();
  }
  // Runs what is ready on the loop now.
  void poll() {
    io_.restart();
    io_.poll();
  }

 private:
  agent::AgentConfig config_;
  std::unique_ptr<agent::ProcFs> procfs_;
  FakeProcess* procfs_process_ = nullptr;
  std::unique_ptr<agent::Target> target_;
  net::asio::thread_pool pool_{2};
  std::unique_ptr<agent::NetnsWorker> netns_;
  net::asio::io_context io_{1};
  std::unique_ptr<agent::ServiceContext> ctx_;
};

}  // namespace siphon::fakes
