// NetnsRunner and NetnsWorker: a thread that entered the target's network
// namespace once (setns, through NetnsThread) and creates sockets there. A socket keeps the namespace it was
// created in for life, so everything after creation (connect, read, write)
// happens on the ordinary event loop. Never call setns on an event-loop
// thread: it would move every socket that loop creates afterwards.
//
// Threads: start() and the destructor on any thread; run()/runAsync() from
// any thread; the worker runs tasks one at a time, in order.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <future>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/netns/netns_thread.h"
#include "siphon/transport/asio.h"

namespace siphon::agent {

// What the agent's services see of the netns thread (ServiceContext::netns):
// tasks run inside the target's network namespace, one at a time, in order.
// NetnsWorker is the agent's; a test may inject another.
class NetnsRunner {
 public:
  virtual ~NetnsRunner() = default;

  // Runs `task` inside the namespace and blocks until it is done. For
  // start-up code and blocking-pool threads, never the event loop.
  template <typename T>
  T run(std::function<T()> task) {
    std::promise<T> p;
    auto f = p.get_future();
    post([&] { p.set_value(task()); });
    return f.get();
  }

  // Runs `task` inside the namespace and resumes the calling coroutine on
  // `ex` with its result. The event loop does not block.
  // `task` by reference: GCC 12 destroys a by-value parameter built from a
  // temporary lambda twice. The caller's temporary lives through co_await.
  template <typename T>
  net::awaitable<T> runAsync(const std::function<T()>& task) {
    auto ex = co_await net::asio::this_coro::executor;
    struct State {
      explicit State(net::asio::any_io_executor e) : signal(e) {}
      net::Signal signal;
      std::optional<T> result;
    };
    auto state = std::make_shared<State>(ex);
    post([state, ex, task]() mutable {
      T value = task();
      net::asio::post(ex, [state, value = std::move(value)]() mutable {
        state->result = std::move(value);
        state->signal.notify();
      });
    });
    while (!state->result) co_await state->signal.wait();
    co_return std::move(*state->result);
  }

  // socket(2) inside the namespace, close-on-exec and non-blocking.
  absl::StatusOr<UniqueFd> socketSync(int domain, int type, int protocol);
  net::awaitable<absl::StatusOr<UniqueFd>> socket(int domain, int type, int protocol);

  // The namespace's inode, as the runner's thread sees it
  // (/proc/thread-self/ns/net).
  virtual uint64_t netnsInode() const = 0;

 protected:
  // Queues `task` for the thread inside the namespace.
  virtual void post(std::function<void()> task) = 0;
};

// The agent's NetnsRunner: one thread (a NetnsThread) that entered the
// target's network namespace once and runs the queued tasks.
class NetnsWorker final : public NetnsRunner {
 public:
  // Starts the worker in the namespace of `netns_fd` (an fd of
  // /proc/PID/ns/net); -1 keeps the caller's namespace (targetless).
  // PERMISSION_DENIED when setns is not allowed (needs CAP_SYS_ADMIN).
  static absl::StatusOr<std::unique_ptr<NetnsWorker>> start(int netns_fd);
  ~NetnsWorker() override;

  NetnsWorker(const NetnsWorker&) = delete;
  NetnsWorker& operator=(const NetnsWorker&) = delete;

  uint64_t netnsInode() const override { return inode_; }

 private:
  NetnsWorker() = default;
  void post(std::function<void()> task) override;
  void loop();

  NetnsThread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  uint64_t inode_ = 0;
};

}  // namespace siphon::agent
