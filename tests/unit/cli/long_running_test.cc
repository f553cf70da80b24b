// cli/long_running.h, the helper of steal, mirror, capture, connect and
// forward, against a scripted agent (tests/fakes/scripted_agent.h) in
// process: SIGTERM then SIGINT as the orderly stop and the end of what is
// open, the session lost for good as the run's end and exit code 3, the
// first reason counting, a failed stream that is not the session's loss, and
// the lost-session line on stderr. No root.
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/long_running.h"
#include "siphon/client/client.h"
#include "siphon/client/errors.h"
#include "siphon/client/target.h"
#include "siphon/status.h"
#include "tests/fakes/run_coroutine.h"
#include "tests/fakes/scripted_agent.h"

namespace siphon::cli {
namespace {

namespace asio = net::asio;
using client::ErrorCode;
using client::LinkEvent;
using client::Target;
using client::TargetOptions;
using fakes::ScriptedAgent;

// Runs `body(ex, env)` with a CommandEnv connected to a scripted agent (no
// reconnect: the agent's close is the session's loss).
template <typename F>
void withCommandEnv(F body) {
  fakes::runCoroutine([&](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = std::make_shared<ScriptedAgent>(ex);
    asio::co_spawn(
        ex, [agent]() { return agent->serve(); }, asio::detached);
    TargetOptions o;
    o.endpoints = {agent->address()};
    o.reconnect = false;
    Target target = Target::create(ex, o);
    absl::Status connected = co_await target.connect();
    EXPECT_TRUE(connected.ok()) << connected;
    if (connected.ok()) {
      CommandEnv env{target.client(), target, false, std::chrono::milliseconds(5000)};
      co_await body(*agent, env);
    }
    target.close();
    agent->close();
  });
}

asio::steady_timer::time_point in(std::chrono::milliseconds d) {
  return asio::steady_timer::clock_type::now() + d;
}

TEST(LongRunningTest, FirstSignalStopsTheSecondEndsWhatIsOpen) {
  withCommandEnv([](ScriptedAgent&, const CommandEnv& env) -> net::awaitable<void> {
    LongRunning lr(env, "steal");
    std::vector<int> stops;
    std::vector<int> ends;
    lr.on_stop = [&](int s) { stops.push_back(s); };
    lr.on_end = [&](int s) { ends.push_back(s); };
    lr.start();
    EXPECT_TRUE(lr.running());

    ::raise(SIGTERM);
    const auto deadline = in(std::chrono::seconds(5));
    while (!lr.stopRequested() && asio::steady_timer::clock_type::now() < deadline) {
      co_await lr.wait(deadline);
    }
    EXPECT_TRUE(lr.stopRequested());
    EXPECT_FALSE(lr.ending());
    EXPECT_FALSE(lr.running());
    EXPECT_EQ(stops, std::vector<int>{SIGTERM});
    EXPECT_TRUE(ends.empty());
    EXPECT_EQ(lr.lastSignal(), SIGTERM);

    ::raise(SIGINT);
    while (!lr.ending() && asio::steady_timer::clock_type::now() < deadline) {
      co_await lr.wait(deadline);
    }
    EXPECT_TRUE(lr.ending());
    EXPECT_EQ(lr.signals(), 2);
    EXPECT_EQ(stops, std::vector<int>{SIGTERM});
    EXPECT_EQ(ends, std::vector<int>{SIGINT});
    // A stop by signal is no loss: the command's own code stands.
    EXPECT_TRUE(lr.lost().ok());
    EXPECT_EQ(lr.exitCode(kExitOk), kExitOk);
    // The signals stay caught until finish(): a third one ends again.
    ::raise(SIGTERM);
    while (lr.signals() < 3 && asio::steady_timer::clock_type::now() < deadline) {
      co_await lr.wait(deadline);
    }
    EXPECT_EQ(ends, (std::vector<int>{SIGINT, SIGTERM}));
    lr.finish();
  });
}

TEST(LongRunningTest, TheSessionLostForGoodEndsTheRunWithExitCode3) {
  withCommandEnv([](ScriptedAgent& agent, const CommandEnv& env) -> net::awaitable<void> {
    LongRunning lr(env, "mirror");
    std::vector<LinkEvent::Kind> events;
    lr.on_event = [&](const LinkEvent& e) { events.push_back(e.kind); };
    lr.start();
    agent.close();
    const auto deadline = in(std::chrono::seconds(10));
    while (lr.lost().ok() && asio::steady_timer::clock_type::now() < deadline) {
      co_await lr.wait(deadline);
    }
    EXPECT_EQ(client::errorCode(lr.lost()), ErrorCode::kAgentLost) << lr.lost();
    EXPECT_FALSE(lr.running());
    EXPECT_FALSE(lr.stopRequested());
    EXPECT_EQ(events, std::vector<LinkEvent::Kind>{LinkEvent::Kind::kLost});
    EXPECT_EQ(lr.exitCode(kExitOk), kExitUnreachable);

    testing::internal::CaptureStderr();
    lr.reportLost();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, "siphon: mirror: " + std::string(lr.lost().message()) + "\n");

    // The first reason counts: a later end() does not replace it.
    lr.end(protoError(v1::INVALID_ARGUMENT, "later"));
    EXPECT_EQ(client::errorCode(lr.lost()), ErrorCode::kAgentLost);
  });
}

TEST(LongRunningTest, AFailedStreamIsNotTheSessionsLossWhileTheTargetLives) {
  withCommandEnv([](ScriptedAgent&, const CommandEnv& env) -> net::awaitable<void> {
    LongRunning lr(env, "forward");
    lr.start();
    // AGENT_LOST of one stream, with the Target itself alive (a failover
    // may have moved it): not the end of the run.
    lr.checkLost(protoError(v1::AGENT_LOST, "stream 5 lost with the old agent"));
    EXPECT_TRUE(lr.lost().ok()) << lr.lost();
    // Anything else the agent said about one stream: not the end either.
    lr.checkLost(protoError(v1::PORT_BUSY, "port 80 is stolen"));
    EXPECT_TRUE(lr.lost().ok()) << lr.lost();
    EXPECT_TRUE(lr.running());
    // Nothing to report while the run goes on.
    testing::internal::CaptureStderr();
    lr.reportLost();
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

    // What the command itself ends the run with, and its exit code.
    lr.end(absl::OkStatus());  // not a reason
    EXPECT_TRUE(lr.lost().ok());
    lr.end(protoError(v1::NOT_FOUND, "no port came back after the move"));
    EXPECT_EQ(client::errorCode(lr.lost()), ErrorCode::kNotFound);
    EXPECT_EQ(lr.exitCode(kExitOk), kExitError);
    lr.finish();
    lr.finish();  // idempotent
    co_return;
  });
}

TEST(LongRunningTest, StreamExitCodes) {
  EXPECT_EQ(streamExitCode(protoError(v1::AGENT_LOST, "gone")), kExitUnreachable);
  EXPECT_EQ(streamExitCode(protoError(v1::PORT_BUSY, "busy")), kExitError);
  EXPECT_EQ(streamExitCode(errnoStatus(ECONNREFUSED, "connect 127.0.0.1:1")), kExitError);
}

}  // namespace
}  // namespace siphon::cli
