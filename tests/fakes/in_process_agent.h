// An agent Server on loopback, run on its own thread, for tests that drive it
// with the real client: start() builds the target from a (fake) ProcFs, inits
// the services and listens; the destructor stops it and checks it exited 0.
// runClient() runs one client coroutine on a fresh io_context to completion.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>

#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/transport/asio.h"

namespace siphon::fakes {

class InProcessAgent {
 public:
  InProcessAgent() = default;
  InProcessAgent(const InProcessAgent&) = delete;
  InProcessAgent& operator=(const InProcessAgent&) = delete;
  ~InProcessAgent() { stop(); }

  // Starts the agent on 127.0.0.1:0 (config.listen is overridden).
  // `before_run` may replace services (server().services()) between init
  // and the first client.
  void start(agent::AgentConfig config, std::unique_ptr<agent::ProcFs> procfs,
             agent::TargetSpec spec, std::function<void(agent::Server&)> before_run = {}) {
    config.listen = "127.0.0.1:0";
    auto target = agent::Target::open(*procfs, spec);
    ASSERT_TRUE(target.ok()) << target.status();
    server_ = std::make_unique<agent::Server>(config, std::move(*target), std::move(procfs));
    absl::Status init = server_->init();
    ASSERT_TRUE(init.ok()) << init;
    if (before_run) before_run(*server_);
    absl::Status listen = server_->listen();
    ASSERT_TRUE(listen.ok()) << listen;
    address_ = server_->listenAddress();
    exit_code_ = std::async(std::launch::async, [this] { return server_->run(); });
  }

  void stop() {
    if (!server_ || !exit_code_.valid()) return;
    server_->requestStop();
    EXPECT_EQ(exit_code_.get(), agent::kExitOk);
  }

  agent::Server& server() { return *server_; }
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<agent::Server> server_;
  std::string address_;
  std::future<int> exit_code_;
};

// Runs `f(executor)` (a coroutine) on a fresh io_context until it finishes.
// `f` takes its executor by const reference (GCC 12: by-value parameters of
// lambda coroutines are destroyed twice).
template <typename F>
void runClient(F f) {
  net::asio::io_context io;
  bool done = false;
  net::asio::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        co_await f(io.get_executor());
        done = true;
        io.stop();
      },
      net::asio::detached);
  io.run();
  ASSERT_TRUE(done);
}

// Runs `f(client)` (a coroutine) with a client connected to `address` on a
// fresh io_context, then closes the client.
template <typename F>
void withClient(const std::string& address, const std::string& token, F f) {
  net::asio::io_context io;
  bool done = false;
  net::asio::co_spawn(
      io,
      [&]() -> net::awaitable<void> {
        client::ClientOptions o;
        o.endpoints = {address};
        o.token = token;
        auto c = client::Client::create(io.get_executor(), o);
        absl::Status s = co_await c->connect();
        EXPECT_TRUE(s.ok()) << s;
        if (s.ok()) co_await f(c);
        c->close();
        done = true;
      },
      net::asio::detached);
  io.run();
  ASSERT_TRUE(done);
}

// Polls `pred` on the calling coroutine's executor until it holds or about
// 10 s passed (a hang guard, not a timing assertion); returns pred().
inline net::awaitable<bool> eventually(std::function<bool()> pred) {
  net::asio::steady_timer t(co_await net::asio::this_coro::executor);
  for (int i = 0; i < 1000; ++i) {
    if (pred()) co_return true;
    t.expires_after(std::chrono::milliseconds(10));
    co_await t.async_wait(net::use_awaitable);
  }
  co_return pred();
}

}  // namespace siphon::fakes
