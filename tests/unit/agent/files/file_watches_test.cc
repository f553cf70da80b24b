// File watches (agent/files/file_watches.h) through the file service, against
// a fake session host: FileWatch answers an id, the target's changes come to
// the client as FileEvents frames (FakePeer receives them), merged per entry,
// and a watch ends with its directory and with the session. No root: inotify
// on a scratch directory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "agent/files/file_service.h"
#include "agent/files/file_watches.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using fakes::FakePeer;
using fakes::FakeSessionHost;
using fakes::ServiceHarness;

v1::FileRequest watchReq(const std::string& path) {
  v1::FileRequest r;
  r.mutable_watch()->set_path(path);
  return r;
}
v1::FileRequest unwatchReq(uint64_t watch) {
  v1::FileRequest r;
  r.mutable_unwatch()->set_watch(watch);
  return r;
}

// How many inotify instances this process holds.
int inotifyFds() {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code rec;
    if (std::filesystem::read_symlink(e.path(), rec) == "anon_inode:inotify") ++n;
  }
  return n;
}

class FileWatchesTest : public ::testing::Test {
 protected:
  void build(FsMode mode) {
    AgentConfig c;
    c.fs_mode = mode;
    c.max_open_files = 64;
    harness_ = std::make_unique<ServiceHarness>(std::move(c), tree_.root());
    service_ = makeFileService(harness_->ctx());
    host_ = std::make_shared<FakeSessionHost>("watcher");
    peer_ = std::make_unique<FakePeer>(*host_);
  }
  void TearDown() override {
    peer_.reset();
    service_.reset();
    harness_.reset();
  }

  v1::Response call(uint64_t id, v1::FileRequest f) {
    v1::Request r;
    r.set_request_id(id);
    *r.mutable_file() = std::move(f);
    service_->handle(host_, std::move(r));
    EXPECT_TRUE(harness_->runUntil([&] { return host_->response(id).has_value(); }))
        << "no answer to request " << id;
    auto answer = host_->response(id);
    return answer ? *answer : v1::Response{};
  }

  // Runs the loop and moves frames until an event matching `pred` came;
  // the events that came, merged in arrival order.
  template <typename Pred>
  bool eventCame(Pred pred) {
    return harness_->runUntil([&] {
      peer_->pipe();
      for (const auto& batch : peer_->file_events) {
        for (const auto& e : batch.events()) {
          if (pred(e)) return true;
        }
      }
      return false;
    });
  }

  testing::ScratchTree tree_;
  std::unique_ptr<ServiceHarness> harness_;
  std::shared_ptr<RequestService> service_;
  std::shared_ptr<FakeSessionHost> host_;
  std::unique_ptr<FakePeer> peer_;
};

TEST_F(FileWatchesTest, ADirectorysEntriesChangesComeAsEventsByName) {
  tree_.file("logs/app.log", "1\n");
  build(FsMode::kReadOnly);  // a watch reads: allowed read-only
  v1::Response w = call(1, watchReq("/logs"));
  ASSERT_TRUE(w.file().has_watched()) << w.DebugString();
  const uint64_t watch = w.file().watched().watch();
  EXPECT_NE(watch, 0u);

  {
    std::ofstream(tree_.inRoot("logs/app.log"), std::ios::app) << "2\n";
  }
  EXPECT_TRUE(eventCame([&](const v1::FileEvent& e) {
    return e.watch() == watch && e.name() == "app.log" && e.content() && !e.created();
  })) << "no content event for the appended log";

  tree_.file("logs/new.log", "x");
  EXPECT_TRUE(eventCame([&](const v1::FileEvent& e) {
    return e.watch() == watch && e.name() == "new.log" && e.created();
  }));
  std::filesystem::remove(tree_.inRoot("logs/app.log"));
  EXPECT_TRUE(eventCame([&](const v1::FileEvent& e) {
    return e.watch() == watch && e.name() == "app.log" && e.removed();
  }));
  ASSERT_EQ(::chmod(tree_.inRoot("logs/new.log").c_str(), 0600), 0);
  EXPECT_TRUE(eventCame([&](const v1::FileEvent& e) {
    return e.watch() == watch && e.name() == "new.log" && e.attributes();
  }));
  for (const auto& batch : peer_->file_events) EXPECT_FALSE(batch.overflow());
}

TEST_F(FileWatchesTest, ManyWritesOfOneFileAreMergedIntoFewEvents) {
  tree_.file("d/f", "");
  build(FsMode::kReadOnly);
  const uint64_t watch = call(1, watchReq("/d")).file().watched().watch();
  ASSERT_NE(watch, 0u);
  {
    // 200 separate writes, well within one gathering delay.
    int fd = ::open(tree_.inRoot("d/f").c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    for (int i = 0; i < 200; ++i) ASSERT_EQ(::write(fd, "x", 1), 1);
    ::close(fd);
  }
  ASSERT_TRUE(eventCame([&](const v1::FileEvent& e) { return e.name() == "f" && e.content(); }));
  // Let whatever else is coming come: ten gathering delays.
  harness_->io().restart();
  harness_->io().run_for(10 * kGatherDelay);
  peer_->pipe();
  size_t events = 0;
  for (const auto& batch : peer_->file_events) events += static_cast<size_t>(batch.events_size());
  EXPECT_LT(events, 20u) << "200 writes should merge per gathering delay, not one event each";
}

TEST_F(FileWatchesTest, WatchesAreCountedUnwatchedAndEndWithTheirDirectory) {
  tree_.dir("a/b");
  build(FsMode::kReadWrite);
  const uint64_t first = call(1, watchReq("/a/b")).file().watched().watch();
  const uint64_t again = call(2, watchReq("/a/../a/b")).file().watched().watch();
  ASSERT_NE(first, 0u);
  EXPECT_EQ(again, first) << "one object, one watch id";
  EXPECT_TRUE(call(3, unwatchReq(first)).file().has_done());
  EXPECT_TRUE(call(4, unwatchReq(first)).file().has_done()) << "watched twice: two unwatches";
  v1::Response third = call(5, unwatchReq(first));
  EXPECT_EQ(third.error().errno_value(), EINVAL) << third.DebugString();

  const uint64_t w = call(6, watchReq("/a/b")).file().watched().watch();
  ASSERT_NE(w, 0u);
  std::filesystem::remove(tree_.inRoot("a/b"));
  EXPECT_TRUE(eventCame([&](const v1::FileEvent& e) { return e.watch() == w && e.watch_ended(); }))
      << "removing the directory ends its watch";
  v1::Response gone = call(7, unwatchReq(w));
  EXPECT_EQ(gone.error().errno_value(), EINVAL) << "an ended watch needs no unwatch";
}

TEST_F(FileWatchesTest, PathsResolveInTheRootAndBadOnesAreErrnos) {
  tree_.dir("etc");
  tree_.symlink("escape", "/../../../../outside");
  build(FsMode::kReadOnly);
  EXPECT_EQ(call(1, watchReq("/no/such")).error().errno_value(), ENOENT);
  // The link resolves inside the root, where there is no "outside".
  EXPECT_EQ(call(2, watchReq("/escape")).error().errno_value(), ENOENT);
  EXPECT_EQ(call(3, unwatchReq(12345)).error().errno_value(), EINVAL);
  // The host's own directory next to the root is never watched: a change
  // there sends nothing.
  const uint64_t w = call(4, watchReq("/")).file().watched().watch();
  ASSERT_NE(w, 0u);
  testing::ScratchTree::write(tree_.base() + "/outside/new", "x");
  tree_.dir("later");  // after the outside change: its event comes after any for that one
  ASSERT_TRUE(eventCame([&](const v1::FileEvent& e) { return e.name() == "later" && e.created(); }));
  for (const auto& batch : peer_->file_events) {
    for (const auto& e : batch.events()) EXPECT_NE(e.name(), "new") << e.DebugString();
  }
}

TEST_F(FileWatchesTest, FileAccessOffRefusesAndTheSessionsEndClosesItsInstance) {
  tree_.dir("d");
  build(FsMode::kOff);
  EXPECT_EQ(call(1, watchReq("/d")).error().code(), v1::PERMISSION_DENIED);

  build(FsMode::kReadOnly);
  const int before = inotifyFds();
  ASSERT_NE(call(2, watchReq("/d")).file().watched().watch(), 0u);
  EXPECT_EQ(inotifyFds(), before + 1) << "one instance per watching session";
  host_->end();
  service_->sessionEnded("watcher");
  EXPECT_EQ(inotifyFds(), before);
}

}  // namespace
}  // namespace siphon::agent::files
