// NetnsThread and runInNetns, the one way a thread of the agent enters the
// target's network namespace, and the NetnsWorker built on them. Without
// root: -1 keeps the caller's namespace, and an fd that is no namespace
// shows setns's error path.
#include "agent/netns/netns_thread.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <thread>
#include <vector>

#include "agent/common/unique_fd.h"
#include "agent/netns/netns_worker.h"

namespace siphon::agent {
namespace {

uint64_t ownNetnsInode() {
  struct stat st {};
  EXPECT_EQ(::stat("/proc/thread-self/ns/net", &st), 0);
  return st.st_ino;
}

TEST(NetnsThreadTest, SetupRunsOnTheNewThreadBeforeStartReturnsThenTheBody) {
  std::atomic<bool> stop{false};
  std::thread::id setup_thread;
  std::atomic<int> body_runs{0};
  auto t = NetnsThread::start(
      -1, "test",
      [&] {
        setup_thread = std::this_thread::get_id();
        return absl::OkStatus();
      },
      [&] {
        body_runs.fetch_add(1);
        while (!stop.load()) std::this_thread::yield();
      });
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE(setup_thread, std::thread::id());  // set before start() returned
  EXPECT_NE(setup_thread, std::this_thread::get_id());
  EXPECT_TRUE(t->joinable());
  stop.store(true);
  t->join();
  EXPECT_EQ(body_runs.load(), 1);
  EXPECT_FALSE(t->joinable());
}

TEST(NetnsThreadTest, AFailedSetupIsReturnedAndTheBodyNeverRuns) {
  bool body_ran = false;
  auto t = NetnsThread::start(
      -1, "test", [] { return absl::FailedPreconditionError("no ring buffer"); },
      [&] { body_ran = true; });
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.status().message(), "no ring buffer");
  EXPECT_FALSE(body_ran);
}

TEST(NetnsThreadTest, AnFdThatIsNoNamespaceFailsNamingTheUserAndRunsNothing) {
  UniqueFd not_a_netns(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_GE(not_a_netns.get(), 0);
  bool setup_ran = false;
  bool body_ran = false;
  auto t = NetnsThread::start(
      not_a_netns.get(), "mirror",
      [&] {
        setup_ran = true;
        return absl::OkStatus();
      },
      [&] { body_ran = true; });
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("mirror: enter the target's network namespace"),
            absl::string_view::npos)
      << t.status();
  EXPECT_FALSE(setup_ran);
  EXPECT_FALSE(body_ran);
}

TEST(NetnsThreadTest, RunInNetnsReturnsTheTasksStatusFromAnotherThread) {
  std::thread::id ran_on;
  absl::Status s = runInNetns(-1, "test", [&] {
    ran_on = std::this_thread::get_id();
    return absl::NotFoundError("nothing there");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, std::this_thread::get_id());

  UniqueFd not_a_netns(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  bool ran = false;
  s = runInNetns(not_a_netns.get(), "iptables owner lock", [&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("iptables owner lock: enter"), absl::string_view::npos) << s;
  EXPECT_FALSE(ran);
}

TEST(NetnsWorkerTest, RunsTasksInOrderOnItsThreadInTheNamespaceItEntered) {
  auto w = NetnsWorker::start(-1);
  ASSERT_TRUE(w.ok()) << w.status();
  NetnsRunner& runner = **w;  // what services get
  EXPECT_EQ(runner.netnsInode(), ownNetnsInode());
  std::vector<int> order;
  std::thread::id worker_thread;
  for (int i = 0; i < 5; ++i) {
    runner.run<int>([&, i] {
      order.push_back(i);
      worker_thread = std::this_thread::get_id();
      return i;
    });
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(worker_thread, std::this_thread::get_id());
  auto fd = runner.socketSync(AF_INET, SOCK_STREAM, 0);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const int flags = ::fcntl(fd->get(), F_GETFL);
  EXPECT_NE(flags & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST(NetnsWorkerTest, ABadNamespaceIsAnErrorNotAWorker) {
  UniqueFd not_a_netns(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  auto w = NetnsWorker::start(not_a_netns.get());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("netns worker: enter the target's network namespace"),
            absl::string_view::npos)
      << w.status();
}

}  // namespace
}  // namespace siphon::agent
