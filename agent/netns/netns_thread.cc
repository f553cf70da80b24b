#include "agent/netns/netns_thread.h"

#include <sched.h>

#include <cerrno>

#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

absl::Status enter(int netns_fd, std::string_view what) {
  if (netns_fd >= 0 && ::setns(netns_fd, CLONE_NEWNET) != 0) {
    const int err = errno;
    return errnoStatus(
        err, absl::StrCat(asv(what), ": enter the target's network namespace (needs CAP_SYS_ADMIN)"));
  }
  return absl::OkStatus();
}

}  // namespace

NetnsThread& NetnsThread::operator=(NetnsThread&& other) {
  if (this != &other) {
    join();
    thread_ = std::move(other.thread_);
  }
  return *this;
}

NetnsThread::~NetnsThread() { join(); }

void NetnsThread::join() {
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<NetnsThread> NetnsThread::start(int netns_fd, std::string what,
                                                std::function<absl::Status()> setup,
                                                std::function<void()> body) {
  std::promise<absl::Status> set_up;
  auto ready = set_up.get_future();
  std::thread t([netns_fd, what = std::move(what), setup = std::move(setup),
                 body = std::move(body), &set_up]() mutable {
    absl::Status s = enter(netns_fd, what);
    if (s.ok() && setup) s = setup();
    const bool ok = s.ok();
    set_up.set_value(std::move(s));  // `set_up` is not touched after this
    if (ok && body) body();
  });
  absl::Status s = ready.get();
  if (!s.ok()) {
    t.join();
    return s;
  }
  return NetnsThread(std::move(t));
}

absl::Status runInNetns(int netns_fd, std::string_view what,
                        const std::function<absl::Status()>& task) {
  absl::Status result;
  std::thread t([&] {
    result = enter(netns_fd, what);
    if (result.ok()) result = task();
  });
  t.join();
  return result;
}

}  // namespace siphon::agent
