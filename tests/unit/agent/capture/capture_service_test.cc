// The capture service end to end, in process and without root: a
// targetless agent whose capture service opens fake sources (the real one
// needs CAP_NET_RAW: tests/privileged/capture), driven by the real client.
#include "agent/capture/capture_service.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent/capture/pcap_file.h"
#include "agent/netns/netns_worker.h"
#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"
#include "tests/fakes/eventually.h"
#include "tests/fakes/fake_packet_source.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent::capture {
namespace {

namespace asio = net::asio;
using fakes::FakePacketSource;
using fakes::FakePacketSourceState;
using ::testing::HasSubstr;

constexpr char kToken[] = "capture-test-token";

v1::StreamOpen captureOpen(std::string interface, std::string filter) {
  v1::StreamOpen o;
  o.mutable_capture()->set_interface(std::move(interface));
  o.mutable_capture()->set_filter(std::move(filter));
  return o;
}

// Reads `stream` until it ends; then `*end` is how (OK: its end of stream)
// and `*ended` is true. A function rather than a coroutine lambda capturing
// the stream by copy from the enclosing coroutine: built by GCC 12, that
// lambda released the stream once too often (ASan: heap-use-after-free when
// the enclosing coroutine's copy was destroyed).
net::awaitable<void> readToTheEnd(std::shared_ptr<client::ClientStream> stream_in,
                                  absl::Status* end, bool* ended) {
  const std::shared_ptr<client::ClientStream> stream = std::move(stream_in);
  while (true) {
    auto r = co_await stream->read();
    if (!r.ok() || !r->has_value()) {
      *end = r.ok() ? absl::OkStatus() : r.status();
      break;
    }
  }
  *ended = true;
}

class CaptureServiceTest : public testing::Test {
 protected:
  // The agent with its capture service opening fake sources, or failing
  // with `open_error` when it is set.
  void startAgent(size_t max_captures = 32, FilterCompileFunction compile = {},
                  std::chrono::milliseconds compile_deadline = kFilterCompileDeadline) {
    AgentConfig config;
    config.token = kToken;
    // Far above any wait of the tests: a drain that waited for a capture
    // would outlast their hang guards.
    config.drain_timeout = std::chrono::seconds(60);
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(
        config, std::make_unique<RealProcFs>(), spec,
        [this, max_captures, compile, compile_deadline](Server& s) {
          CaptureOptions o;
          o.max_captures = max_captures;
          o.filter_compile_deadline = compile_deadline;
          // The fake source has no kernel: a "compiled" filter is its words.
          o.compile_filter =
              compile ? compile : [](const std::string& e, int, uint32_t) -> CompiledFilterOr {
            return std::make_shared<const CompiledFilter>(e);
          };
          o.open_source =
              [this](const CaptureSpec& spec) -> absl::StatusOr<std::unique_ptr<PacketSource>> {
            ++opens_;
            std::lock_guard<std::mutex> l(mu_);
            last_spec_ = spec;
            if (!open_error_.ok()) return open_error_;
            return std::make_unique<FakePacketSource>(source_, spec.snaplen);
          };
          s.services().addStream(v1::StreamOpen::kCapture,
                                 makeCaptureService(s.serviceContext(), o));
        });
  }

  // Runs `f(client)` with a connected client on a fresh io_context.
  template <typename F>
  void withClient(F f) {
    fakes::withClient(agent_.address(), kToken, std::move(f));
  }

  fakes::InProcessAgent agent_;
  std::shared_ptr<FakePacketSourceState> source_ = std::make_shared<FakePacketSourceState>();
  std::atomic<int> opens_{0};
  std::mutex mu_;
  CaptureSpec last_spec_;  // written on the agent's netns thread

  CaptureSpec lastSpec() {
    std::lock_guard<std::mutex> l(mu_);
    return last_spec_;
  }
  absl::Status open_error_;
};

TEST_F(CaptureServiceTest, TheRealAgentAdvertisesCapture) {
  AgentConfig config;
  config.token = kToken;
  TargetSpec spec;
  spec.mode = TargetMode::kTargetless;
  agent_.start(config, std::make_unique<RealProcFs>(), spec);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    const auto& features = c->welcome().features();
    EXPECT_NE(std::find(features.begin(), features.end(), v1::FEATURE_CAPTURE), features.end());
    co_return;
  });
}

TEST_F(CaptureServiceTest, StreamsAPcapFileUntilTheClientHalfCloses) {
  startAgent();
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto stream = co_await c->openStream(captureOpen("", "tcp port 80"));
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) co_return;
    EXPECT_EQ(opens_, 1);
    const CaptureSpec spec = lastSpec();
    EXPECT_EQ(spec.interface, "any");
    EXPECT_EQ(spec.filter, "tcp port 80");
    EXPECT_EQ(source_->installedFilter(), "tcp port 80");
    auto header = co_await (*stream)->read();
    EXPECT_TRUE(header.ok() && header->has_value());
    if (!header.ok() || !header->has_value()) co_return;
    EXPECT_EQ(**header, globalHeader(FakePacketSource::kLinkType, spec.snaplen));

    std::vector<std::string> sent = {"first packet", std::string(3000, 'p'), "last"};
    for (const auto& p : sent) source_->push(p);
    for (size_t i = 0; i < sent.size(); ++i) {
      auto r = co_await (*stream)->read();
      EXPECT_TRUE(r.ok() && r->has_value());
      if (!r.ok() || !r->has_value()) co_return;
      EXPECT_EQ(**r, record(FakePacketSource::packetFor(i, sent[i])));
    }
    EXPECT_TRUE((*stream)->halfClose().ok());
    auto end = co_await (*stream)->read();
    EXPECT_TRUE(end.ok()) << end.status();
    EXPECT_TRUE(end.ok() && !end->has_value()) << "the agent half-closes back";
  });
  EXPECT_TRUE(source_->closed);
}

TEST_F(CaptureServiceTest, AnOpenFailureIsTheResetWithItsWords) {
  startAgent();
  open_error_ = protoError(
      v1::NOT_FOUND,
      "capture on interface 'nosuch0' in the target: No such device exists (SIOCGIFINDEX)");
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto stream = co_await c->openStream(captureOpen("nosuch0", ""));
    EXPECT_EQ(errorCodeOf(stream.status()), v1::NOT_FOUND) << stream.status();
    EXPECT_THAT(std::string(stream.status().message()), HasSubstr("'nosuch0'"));
    // The session serves on.
    open_error_ = absl::OkStatus();
    auto again = co_await c->openStream(captureOpen("lo", ""));
    EXPECT_TRUE(again.ok()) << again.status();
  });
}

TEST_F(CaptureServiceTest, AMalformedInterfaceNeverReachesLibpcap) {
  startAgent();
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto stream = co_await c->openStream(captureOpen("../../etc", ""));
    EXPECT_EQ(errorCodeOf(stream.status()), v1::INVALID_ARGUMENT) << stream.status();
  });
  EXPECT_EQ(opens_, 0);
}

TEST_F(CaptureServiceTest, CapturesAreLimitedAndTheLimitFreesUp) {
  startAgent(/*max_captures=*/1);
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto first = co_await c->openStream(captureOpen("any", ""));
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) co_return;
    auto second = co_await c->openStream(captureOpen("any", ""));
    EXPECT_EQ(errorCodeOf(second.status()), v1::RESOURCE_EXHAUSTED) << second.status();
    // The first ends: room for another.
    EXPECT_TRUE((*first)->halfClose().ok());
    while (true) {
      auto r = co_await (*first)->read();
      if (!r.ok() || !r->has_value()) break;
    }
    auto third = co_await c->openStream(captureOpen("any", ""));
    EXPECT_TRUE(third.ok()) << third.status();
  });
}

TEST_F(CaptureServiceTest, TheSessionsEndClosesTheCapture) {
  startAgent();
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto stream = co_await c->openStream(captureOpen("any", ""));
    EXPECT_TRUE(stream.ok()) << stream.status();
    co_return;  // withClient closes the session
  });
  // The agent handles the Goaway on its own thread.
  fakes::eventually([&] { return source_->closed.load(); }, std::chrono::seconds(5));
  EXPECT_TRUE(source_->closed);
}

// A drain does not wait for captures (they hold nothing the target needs):
// each ends at once with AGENT_DRAINING after the records sent so far, and
// the agent exits without waiting for --drain-timeout.
TEST_F(CaptureServiceTest, ADrainEndsCapturesAtOnce) {
  startAgent();
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto stream = co_await c->openStream(captureOpen("any", ""));
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) co_return;
    auto header = co_await (*stream)->read();
    EXPECT_TRUE(header.ok() && header->has_value());
    source_->push("before the drain");
    auto first = co_await (*stream)->read();
    EXPECT_TRUE(first.ok() && first->has_value());
    agent_.server().requestDrain("test");
    absl::Status end;
    bool ended = false;
    asio::co_spawn(co_await asio::this_coro::executor, readToTheEnd(*stream, &end, &ended),
                   asio::detached);
    EXPECT_TRUE(co_await fakes::eventually([&] { return ended; }))
        << "the drain waited for the capture";
    EXPECT_EQ(errorCodeOf(end), v1::AGENT_DRAINING) << end;
  });
  EXPECT_TRUE(source_->closed);
}

// The filter compiles on a thread of its own, not on the NetnsWorker that
// every netns operation shares: while a compile hangs, a netns job queued
// after it runs; past the deadline the capture is refused with TIMEOUT, and
// the next capture works.
TEST_F(CaptureServiceTest, AHangingFilterCompileBlocksNoNetnsOperation) {
  struct Held {
    std::mutex mu;
    std::condition_variable cv;
    bool started = false;
    bool released = false;
  };
  auto held = std::make_shared<Held>();
  startAgent(
      32,
      [held](const std::string& e, int, uint32_t) -> CompiledFilterOr {
        if (e == "host 1.2.3.4") {
          std::unique_lock<std::mutex> l(held->mu);
          held->started = true;
          held->cv.wait(l, [&] { return held->released; });
        }
        return std::make_shared<const CompiledFilter>(e);
      },
      std::chrono::milliseconds(200));
  auto release = [held] {
    std::lock_guard<std::mutex> l(held->mu);
    held->released = true;
    held->cv.notify_all();
  };
  auto started = [held] {
    std::lock_guard<std::mutex> l(held->mu);
    return held->started;
  };
  NetnsRunner& netns = agent_.server().serviceContext().netns;
  withClient([&](const std::shared_ptr<client::Client>& c) -> net::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    absl::Status refused;
    bool answered = false;
    net::spawn(
        ex,
        [](std::shared_ptr<client::Client> client, absl::Status* out,
           bool* done) -> net::awaitable<void> {
          auto s = co_await client->openStream(captureOpen("any", "host 1.2.3.4"));
          *out = s.status();
          *done = true;
        }(c, &refused, &answered),
        "hanging_capture");
    EXPECT_TRUE(co_await fakes::eventually(started));

    // A netns job behind it: it runs while the compile still hangs.
    std::atomic<bool> ran{false};
    std::function<int()> job = [&ran] {
      ran = true;
      return 0;
    };
    net::spawn(
        ex,
        [](NetnsRunner* w, std::function<int()>* j) -> net::awaitable<void> {
          co_await w->runAsync(*j);
        }(&netns, &job),
        "netns_job");
    EXPECT_TRUE(co_await fakes::eventually([&] { return ran.load(); }))
        << "the netns worker is blocked by a filter compile";
    EXPECT_TRUE(started());

    EXPECT_TRUE(co_await fakes::eventually([&] { return answered; }));
    EXPECT_EQ(errorCodeOf(refused), v1::TIMEOUT) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("did not compile within 200 ms"));
    EXPECT_TRUE(source_->closed) << "a refused capture closes its source";

    auto next = co_await c->openStream(captureOpen("any", "udp port 53"));
    EXPECT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(source_->installedFilter(), "udp port 53");
    release();
  });
  release();
}

}  // namespace
}  // namespace siphon::agent::capture
