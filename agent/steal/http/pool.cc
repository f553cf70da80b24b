#include "agent/steal/http/pool.h"

#include <sys/socket.h>

#include "agent/steal/http/engine_state.h"

namespace siphon::agent::steal::http {

namespace asio = net::asio;

namespace {

// A pooled connection is usable when nothing is waiting on it: EOF means
// the application closed it, bytes mean it answered something nobody asked
// (either way the next response would be misread).
bool stillIdle(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

Http1AppPool::Http1AppPool(asio::any_io_executor ex, size_t max_idle,
                           std::chrono::milliseconds idle_timeout)
    : ex_(ex), max_idle_(max_idle), idle_timeout_(idle_timeout), sweeper_(ex) {}

Http1AppPool::~Http1AppPool() = default;

std::shared_ptr<Http1AppPool> Http1AppPool::of(EngineState& state) {
  if (!state.h1_pool) {
    state.h1_pool = std::make_shared<Http1AppPool>(state.ex, state.options.pool_max_idle,
                                                   state.options.pool_idle_timeout);
  }
  return state.h1_pool;
}

net::awaitable<absl::StatusOr<AppConnection>> Http1AppPool::acquire(HttpRouter& router,
                                                                    SockAddr destination,
                                                                    bool fresh) {
  const SockAddr dest = destination;
  if (!fresh && !closed_) {
    auto it = idle_.find(formatAddress(dest));
    const auto now = std::chrono::steady_clock::now();
    while (it != idle_.end() && !it->second.empty()) {
      Idle idle = std::move(it->second.back());
      it->second.pop_back();
      if (it->second.empty()) {
        idle_.erase(it);
        it = idle_.end();
      }
      if (now - idle.since < idle_timeout_ && stillIdle(idle.socket.native_handle())) {
        co_return AppConnection{std::move(idle.socket), true};
      }
      // Closed by the application, or expired (the sweeper had not come
      // yet): dropped.
    }
  }
  // The pool may be destroyed while the router connects.
  auto self = shared_from_this();
  absl::StatusOr<UniqueFd> fd = co_await router.connectApplication(dest);
  if (!fd.ok()) co_return fd.status();
  ++connects_;
  co_return AppConnection{adoptSocket(ex_, fd->release()), false};
}

void Http1AppPool::release(const SockAddr& destination, Descriptor socket) {
  if (closed_ || max_idle_ == 0 || !socket.is_open()) return;
  auto& list = idle_[formatAddress(destination)];
  if (list.size() >= max_idle_) {
    // The coldest goes: the warm ones are likelier to be alive.
    list.pop_front();
  }
  list.push_back(Idle{std::move(socket), std::chrono::steady_clock::now()});
  armSweeper();
}

void Http1AppPool::close() {
  closed_ = true;
  idle_.clear();
  sweeper_.cancel();
}

size_t Http1AppPool::idleForTest() const {
  size_t n = 0;
  for (const auto& [key, list] : idle_) n += list.size();
  return n;
}

void Http1AppPool::sweep() {
  const auto deadline = std::chrono::steady_clock::now() - idle_timeout_;
  for (auto it = idle_.begin(); it != idle_.end();) {
    auto& list = it->second;
    while (!list.empty() && list.front().since <= deadline) list.pop_front();
    it = list.empty() ? idle_.erase(it) : std::next(it);
  }
}

void Http1AppPool::armSweeper() {
  if (sweeper_armed_ || closed_) return;
  // Wakes when the oldest idle connection expires (each list is in
  // release order, so the oldest is some list's front).
  auto oldest = std::chrono::steady_clock::time_point::max();
  for (const auto& [key, list] : idle_) {
    if (!list.empty() && list.front().since < oldest) oldest = list.front().since;
  }
  if (oldest == std::chrono::steady_clock::time_point::max()) return;
  sweeper_armed_ = true;
  sweeper_.expires_at(oldest + idle_timeout_);
  sweeper_.async_wait([weak = weak_from_this()](net::error_code) {
    auto self = weak.lock();
    if (!self) return;
    self->sweeper_armed_ = false;
    if (self->closed_) return;
    self->sweep();
    if (!self->idle_.empty()) self->armSweeper();
  });
}

}  // namespace siphon::agent::steal::http
