// NetnsWorker: a thread that entered the target's network namespace once
// (setns) and creates sockets there. A socket keeps the namespace it was
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
#include "siphon/transport/asio.h"

namespace siphon::agent {

class NetnsWorker {
 public:
  // Starts the worker in the namespace of `netns_fd` (an fd of
  // /proc/PID/ns/net); -1 keeps the caller's namespace (targetless).
  // PERMISSION_DENIED when setns is not allowed (needs CAP_SYS_ADMIN).
  static absl::StatusOr<std::unique_ptr<NetnsWorker>> start(int netns_fd);
  ~NetnsWorker();

  NetnsWorker(const NetnsWorker&) = delete;
  NetnsWorker& operator=(const NetnsWorker&) = delete;

  // Runs `task` on the worker (inside the namespace) and blocks until it is
  // done. For start-up code and blocking-pool threads, never the event loop.
  template <typename T>
  T run(std::function<T()> task) {
    std::promise<T> p;
    auto f = p.get_future();
    post([&] { p.set_value(task()); });
    return f.get();
  }

  // Runs `task` on the worker and resumes the calling coroutine on `ex`
  // with its result. The event loop does not block.
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

  // The namespace's inode, as the worker sees it (/proc/thread-self/ns/net).
  uint64_t netnsInode() const { return inode_; }

 private:
  NetnsWorker() = default;
  void post(std::function<void()> task);
  void loop();

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  uint64_t inode_ = 0;
};

}  // namespace siphon::agent
