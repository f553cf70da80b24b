// The steal service's thread rule: the steering is driven from the blocking
// pool (a strand), one call at a time, as steering.h promises its
// implementations; the event loop never calls into it for what it can keep
// a copy of (its name, for a session listing).
//
// The fake below takes steering.h at its word: no locking. Its addPort()
// for one port holds the strand while a session listing runs on the event
// loop; a service that asks the steering for its name there calls it
// concurrently with addPort(). The overlap counter says so in any build;
// under TSan (scripts/sanitize.sh tsan) the unlocked `calls` vector, which
// name() on the event loop and addPort() on the pool both append to, is
// reported as a data race.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/server/server.h"
#include "agent/steal/steal_service.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent::steal {
namespace {

namespace asio = net::asio;
using fakes::eventually;

constexpr char kThreadsToken[] = "steal-threads-test-token";
constexpr uint16_t kFirstPort = 7001;
constexpr uint16_t kHeldPort = 7002;  // its addPort() waits for the test

struct SerialState {
  // Written by every call without a lock, as steering.h allows.
  std::vector<std::string> calls;
  // Calls in progress and calls that began while another was in progress.
  std::atomic<int> in_call{0};
  std::atomic<int> overlaps{0};
  std::mutex overlap_mu;
  std::string overlap_what;

  // addPort(kHeldPort) says it began and waits until released. Relaxed
  // atomics and a sleep, no lock: the wait must not order the event loop's
  // work before the rest of addPort() for TSan (a mutex would, through the
  // test's thread and the sockets to the agent, which TSan counts as
  // synchronisation).
  std::atomic<bool> held{false};
  std::atomic<bool> released{false};

  void enter(const std::string& what) {
    if (in_call.fetch_add(1, std::memory_order_relaxed) != 0) {
      overlaps.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> l(overlap_mu);
      overlap_what = what;
    }
  }
  void leave(std::string what) {
    calls.push_back(std::move(what));
    in_call.fetch_sub(1, std::memory_order_relaxed);
  }
  bool isHeld() const { return held.load(std::memory_order_relaxed); }
  void release() { released.store(true, std::memory_order_relaxed); }
};

class SerialOnlySteering : public Steering {
 public:
  explicit SerialOnlySteering(std::shared_ptr<SerialState> s) : s_(std::move(s)) {}
  std::string_view name() const override {
    s_->enter("name");
    s_->leave("name");
    return "fake";
  }
  absl::Status addPort(uint16_t port) override {
    const std::string what = absl::StrCat("add ", port);
    s_->enter(what);
    if (port == kHeldPort) {
      s_->held.store(true, std::memory_order_relaxed);
      while (!s_->released.load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    s_->leave(what);
    return absl::OkStatus();
  }
  absl::Status removePort(uint16_t port) override {
    const std::string what = absl::StrCat("remove ", port);
    s_->enter(what);
    s_->leave(what);
    return absl::OkStatus();
  }
  absl::Status exempt(int) override { return absl::OkStatus(); }
  void unexempt(int) override {}
  absl::StatusOr<SockAddr> originalDestination(int fd) override {
    return outgoing::localAddress(fd);
  }
  void stop() override {
    s_->enter("stop");
    s_->leave("stop");
  }

 private:
  std::shared_ptr<SerialState> s_;
};

class StealServiceThreadsTest : public testing::Test {
 protected:
  void SetUp() override {
    AgentConfig config;
    config.token = kThreadsToken;
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    auto state = state_;
    agent_.start(config, std::make_unique<RealProcFs>(), spec, [state](Server& server) {
      auto service = makeStealService(
          server.serviceContext(),
          [state](const Listeners&) -> absl::StatusOr<std::unique_ptr<Steering>> {
            return std::make_unique<SerialOnlySteering>(state);
          },
          [](uint16_t) -> absl::StatusOr<int> { return 0; });
      server.services().addRequest(v1::Request::kSteal, service);
      server.services().addRequest(v1::Request::kUnsubscribe, service);
    });
  }
  void TearDown() override { state_->release(); }

  std::shared_ptr<client::Client> newClient(const asio::any_io_executor& ex, std::string name) {
    client::ClientOptions o;
    o.endpoints = {agent_.address()};
    o.token = kThreadsToken;
    o.client_name = std::move(name);
    return client::Client::create(ex, o);
  }

  std::shared_ptr<SerialState> state_ = std::make_shared<SerialState>();
  fakes::InProcessAgent agent_;
};

net::awaitable<absl::StatusOr<v1::Response>> steal(std::shared_ptr<client::Client> c,
                                                   uint32_t port) {
  v1::Request r;
  r.mutable_steal()->set_port(port);
  co_return co_await c->call(r);
}

// A session listing (event loop) while another session's subscribe holds
// the steering in addPort() (pool): the listing still names the backend of
// the active subscription, and the steering never sees two calls at once.
TEST_F(StealServiceThreadsTest, ListingSessionsDoesNotCallTheSteeringFromTheEventLoop) {
  fakes::runClient([&](const asio::any_io_executor& io) -> net::awaitable<void> {
    auto alice = newClient(io, "alice");
    auto bob = newClient(io, "bob");
    EXPECT_TRUE((co_await alice->connect()).ok());
    EXPECT_TRUE((co_await bob->connect()).ok());
    auto first = co_await steal(alice, kFirstPort);
    EXPECT_TRUE(first.ok()) << first.status();

    // Bob's subscribe creates no steering (it exists) but holds the strand
    // in addPort(kHeldPort).
    auto bob_done = std::make_shared<std::atomic<bool>>(false);
    net::spawn(
        io,
        [](std::shared_ptr<client::Client> c,
           std::shared_ptr<std::atomic<bool>> done) -> net::awaitable<void> {
          auto r = co_await steal(c, kHeldPort);
          EXPECT_TRUE(r.ok()) << r.status();
          *done = true;
        }(bob, bob_done),
        "bob_steal");
    EXPECT_TRUE(co_await eventually([&] { return state_->isHeld(); }));

    v1::Request list;
    list.mutable_sessions();
    auto sessions = co_await alice->call(list);
    EXPECT_TRUE(sessions.ok()) << sessions.status();
    bool found = false;
    if (sessions.ok()) {
      for (const auto& s : sessions->sessions().sessions()) {
        for (const auto& sub : s.subscriptions()) {
          if (sub.port() != kFirstPort) continue;
          found = true;
          EXPECT_EQ(sub.backend(), "fake");
        }
      }
    }
    EXPECT_TRUE(found) << "alice's subscription of " << kFirstPort << " is not listed";

    state_->release();
    EXPECT_TRUE(co_await eventually([&] { return bob_done->load(); }));
    alice->close();
    bob->close();
  });
  std::lock_guard<std::mutex> l(state_->overlap_mu);
  EXPECT_EQ(state_->overlaps.load(), 0)
      << "the steering was called while another call was in progress (last: "
      << state_->overlap_what << ")";
}

}  // namespace
}  // namespace siphon::agent::steal
