#include "agent/netns/netns_worker.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <future>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent {

absl::StatusOr<std::unique_ptr<NetnsWorker>> NetnsWorker::start(int netns_fd) {
  std::unique_ptr<NetnsWorker> w(new NetnsWorker());
  NetnsWorker* self = w.get();
  ASSIGN_OR_RETURN(
      w->thread_,
      NetnsThread::start(
          netns_fd, "netns worker",
          [self] {
            struct stat st;
            if (::stat("/proc/thread-self/ns/net", &st) == 0) self->inode_ = st.st_ino;
            return absl::OkStatus();
          },
          [self] { self->loop(); }));
  return w;
}

NetnsWorker::~NetnsWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void NetnsWorker::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void NetnsWorker::loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

absl::StatusOr<UniqueFd> NetnsRunner::socketSync(int domain, int type, int protocol) {
  return run<absl::StatusOr<UniqueFd>>([=]() -> absl::StatusOr<UniqueFd> {
    int fd = ::socket(domain, type | SOCK_CLOEXEC | SOCK_NONBLOCK, protocol);
    if (fd < 0) return lastErrnoStatus("socket in the target's network namespace");
    return UniqueFd(fd);
  });
}

net::awaitable<absl::StatusOr<UniqueFd>> NetnsRunner::socket(int domain, int type, int protocol) {
  co_return co_await runAsync<absl::StatusOr<UniqueFd>>(
      [=]() -> absl::StatusOr<UniqueFd> {
        int fd = ::socket(domain, type | SOCK_CLOEXEC | SOCK_NONBLOCK, protocol);
        if (fd < 0) return lastErrnoStatus("socket in the target's network namespace");
        return UniqueFd(fd);
      });
}

}  // namespace siphon::agent
