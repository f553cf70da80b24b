// The one way a thread of the agent enters the target's network namespace.
// setns(CLONE_NEWNET) moves only the calling thread, and a socket keeps the
// namespace it was created in for life; so the agent never calls setns on an
// event-loop thread (it would move every socket that loop makes afterwards)
// but on a thread made for it here:
//  - NetnsWorker (netns_worker.h): the shared task queue that makes sockets
//    for DNS, outgoing, steal and capture;
//  - the mirror engine's own thread (its epoll loop blocks);
//  - runInNetns(): one task on a short-lived thread, for start-up work done
//    before a worker exists (the iptables owner lock).
// The iptables guard and the iptables commands are processes, not threads:
// they setns in the child they fork (steal/iptables/guard.cc, common/exec.cc).
//
// Threads: start() and join() from any thread but the started one.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"

namespace siphon::agent {

class NetnsThread {
 public:
  NetnsThread() = default;
  NetnsThread(NetnsThread&&) = default;
  NetnsThread& operator=(NetnsThread&& other);
  ~NetnsThread();  // joins

  // Starts a thread that enters the namespace of `netns_fd` (an fd of
  // /proc/PID/ns/net; -1 keeps the caller's, for targetless), runs `setup`
  // there and, when both succeeded, goes on to run `body`. Returns once setup
  // has run: its status, or setns's error, which names `what` ("mirror: enter
  // the target's network namespace: Operation not permitted"). On error the
  // thread has ended. `body` ends when the owner tells it to (its own stop
  // flag); join() waits for that.
  static absl::StatusOr<NetnsThread> start(int netns_fd, std::string what,
                                           std::function<absl::Status()> setup,
                                           std::function<void()> body);

  void join();
  bool joinable() const { return thread_.joinable(); }

 private:
  explicit NetnsThread(std::thread t) : thread_(std::move(t)) {}
  std::thread thread_;
};

// Runs `task` on a short-lived thread inside `netns_fd` and returns its
// status once the thread has ended (setns's error, naming `what`, if it
// could not enter). Blocks the caller: start-up code only.
absl::Status runInNetns(int netns_fd, std::string_view what, const std::function<absl::Status()>& task);

}  // namespace siphon::agent
