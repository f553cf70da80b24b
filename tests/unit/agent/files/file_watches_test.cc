// File watches (agent/files/file_watches.h) through the file service, against
// a fake session host: FileWatch answers an id, the target's changes come to
// the client as FileEvents frames (FakePeer receives them), merged per entry,
// and a watch ends with its directory and with the session. No root: inotify
// on a scratch directory.
#include "agent/files/file_watches.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "agent/files/file_service.h"
#include "agent/files/file_system.h"
#include "agent/files/fs_helper.h"
#include "siphon/status.h"
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

// The inodes the inotify instances of this process watch, from their
// fdinfo ("inotify wd:1 ino:1a2b sdev:... mask:...").
std::set<uint64_t> watchedInodes() {
  std::set<uint64_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code rec;
    if (std::filesystem::read_symlink(e.path(), rec) != "anon_inode:inotify") continue;
    std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
    std::string line;
    while (std::getline(info, line)) {
      const size_t at = line.find(" ino:");
      if (line.rfind("inotify ", 0) != 0 || at == std::string::npos) continue;
      out.insert(std::stoull(line.substr(at + 5), nullptr, 16));
    }
  }
  return out;
}

uint64_t inodeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return st.st_ino;
}

// A file system whose directory changes under a watch (issue 40, item 8):
// just after `/p/d` was looked at for a watch (checked, or watched), the
// target renames `/p` away to `/p-checked` and its `/q` to `/p`, so that
// `/p/d` is `/q/d` from then on, as a target renaming in a loop may
// between two lookups of one path, here at exactly that point. (The
// parents move, not the directory watched: a watched directory moved away
// ends its watch.)
class RenamingFileSystem : public FileSystem {
 public:
  RenamingFileSystem(std::shared_ptr<FileSystem> inner, std::string root)
      : inner_(std::move(inner)), root_(std::move(root)) {}
  absl::StatusOr<Handle> open(const v1::FileRequest& req) override { return inner_->open(req); }
  absl::StatusOr<v1::FileResponse> path(const v1::FileRequest& req, bool writes_refused) override {
    auto r = inner_->path(req, writes_refused);
    if (req.op_case() == v1::FileRequest::kAccess && req.access().path() == "/p/d") rename();
    return r;
  }
  absl::StatusOr<Handle> adopt(UniqueFd fd, bool dir) override {
    return inner_->adopt(std::move(fd), dir);
  }
  absl::StatusOr<UniqueFd> newWatchInstance() override { return inner_->newWatchInstance(); }
  absl::StatusOr<int> addWatch(int instance, const std::string& path, uint32_t mask) override {
    auto r = inner_->addWatch(instance, path, mask);
    if (path == "/p/d") rename();
    return r;
  }

 private:
  void rename() {
    if (renamed_.exchange(true)) return;
    EXPECT_EQ(::rename((root_ + "/p").c_str(), (root_ + "/p-checked").c_str()), 0);
    EXPECT_EQ(::rename((root_ + "/q").c_str(), (root_ + "/p").c_str()), 0);
  }
  std::shared_ptr<FileSystem> inner_;
  std::string root_;
  std::atomic<bool> renamed_{false};
};

class FileWatchesTest : public ::testing::Test {
 protected:
  void build(FsMode mode, std::shared_ptr<FileSystem> fs = nullptr,
             std::optional<WatchLimits> limits = std::nullopt) {
    AgentConfig c;
    c.fs_mode = mode;
    c.max_open_files = 64;
    if (limits) {
      c.max_file_watches = static_cast<uint32_t>(limits->watches);
      c.max_file_watch_instances = static_cast<uint32_t>(limits->instances);
    }
    peer_.reset();
    service_.reset();
    harness_ = std::make_unique<ServiceHarness>(std::move(c), tree_.root());
    FileServiceOptions options;
    options.fs = std::move(fs);
    service_ = makeFileService(harness_->ctx(), options);
    host_ = std::make_shared<FakeSessionHost>("watcher");
    peer_ = std::make_unique<FakePeer>(*host_);
  }
  // The real file helper (siphon-agent fs-helper, targetless: this
  // process's ids without capabilities) on the tree, or null when it
  // cannot start here (it needs CAP_SETGID for its setgroups).
  std::shared_ptr<FileSystem> helper() {
    HelperOptions o;
    o.exe = SIPHON_AGENT_BIN;
    o.root_fd = tree_.rootFd();
    auto fs = makeHelperFileSystem(o);
    v1::FileRequest probe;
    probe.mutable_stat()->set_path("/");
    return fs->path(probe, false).ok() ? fs : nullptr;
  }
  void TearDown() override {
    peer_.reset();
    service_.reset();
    harness_.reset();
  }

  v1::Response call(uint64_t id, v1::FileRequest f) { return callFrom(host_, id, std::move(f)); }
  v1::Response callFrom(const std::shared_ptr<FakeSessionHost>& host, uint64_t id,
                        v1::FileRequest f) {
    v1::Request r;
    r.set_request_id(id);
    *r.mutable_file() = std::move(f);
    service_->handle(host, std::move(r));
    EXPECT_TRUE(harness_->runUntil([&] { return host->response(id).has_value(); }))
        << "no answer to request " << id;
    auto answer = host->response(id);
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

  { std::ofstream(tree_.inRoot("logs/app.log"), std::ios::app) << "2\n"; }
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
  ASSERT_TRUE(
      eventCame([&](const v1::FileEvent& e) { return e.name() == "later" && e.created(); }));
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

// Issue 40, item 8: the watch goes on the object the file system resolved
// with the target's identity, and the agent never resolves the path again.
// Before, the file helper checked access to `/p/d` and the agent then
// resolved `/p/d` once more with its own powers: the rename in between put
// the watch on `/q/d`, and its events named entries of a directory the
// target could not list.
class WatchPlacementTest : public FileWatchesTest, public ::testing::WithParamInterface<bool> {};

TEST_P(WatchPlacementTest, TheWatchIsOnTheDirectoryResolvedNotOneRenamedInAfter) {
  const bool with_helper = GetParam();
  tree_.dir("p/d");
  tree_.dir("q/d");
  std::shared_ptr<FileSystem> inner;
  if (with_helper) {
    inner = helper();
    if (!inner) GTEST_SKIP() << "the file helper does not start here (it needs CAP_SETGID)";
    // Root without capabilities, as the helper is here, cannot enter or
    // list directories of another user's mode 0700: the target could not.
    if (::geteuid() == 0) {
      for (const char* d : {"q/d", "q"}) {
        ASSERT_EQ(::chown(tree_.inRoot(d).c_str(), 4321, 4321), 0);
        ASSERT_EQ(::chmod(tree_.inRoot(d).c_str(), 0700), 0);
      }
    }
  } else {
    inner = std::make_shared<LocalFileSystem>(tree_.rootFd(), GuardOptions{});
  }
  const uint64_t checked = inodeOf(tree_.inRoot("p/d"));
  const uint64_t hidden = inodeOf(tree_.inRoot("q/d"));
  build(FsMode::kReadOnly, std::make_shared<RenamingFileSystem>(inner, tree_.root()));

  v1::Response w = call(1, watchReq("/p/d"));
  ASSERT_TRUE(w.file().has_watched()) << w.DebugString();
  ASSERT_EQ(inodeOf(tree_.inRoot("p/d")), hidden) << "the rename happened";
  EXPECT_EQ(watchedInodes(), std::set<uint64_t>{checked})
      << "the watch must be on the directory resolved for it (inode " << checked
      << "), not on the one renamed to its path afterwards (inode " << hidden << ")";

  tree_.file("p/d/secret-entry", "x");  // in the hidden directory, now at /p/d
  tree_.file("p-checked/d/seen", "x");
  EXPECT_TRUE(eventCame([](const v1::FileEvent& e) { return e.name() == "seen"; }))
      << "the watched directory's own change";
  for (const auto& batch : peer_->file_events) {
    for (const auto& e : batch.events()) {
      EXPECT_NE(e.name(), "secret-entry") << "an entry of the hidden directory was named";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(InProcessAndHelper, WatchPlacementTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Helper" : "InProcess"; });

TEST_F(FileWatchesTest, WithTheHelperADirectoryTheTargetCannotReadIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a directory of another user";
  tree_.dir("private");
  ASSERT_EQ(::chown(tree_.inRoot("private").c_str(), 4321, 4321), 0);
  ASSERT_EQ(::chmod(tree_.inRoot("private").c_str(), 0700), 0);
  auto fs = helper();
  if (!fs) GTEST_SKIP() << "the file helper does not start here";
  build(FsMode::kReadOnly, fs);
  v1::Response w = call(1, watchReq("/private"));
  EXPECT_EQ(w.error().errno_value(), EACCES) << w.DebugString();
  EXPECT_TRUE(watchedInodes().empty());
}

// Issue 40, item 5: the watches of every session together, and the
// instances, are held to the agent's limits; each refusal names its flag.
TEST_F(FileWatchesTest, TheAgentWideWatchLimitIsEnospcNamingItsFlag) {
  for (const char* d : {"a", "b", "c"}) tree_.dir(d);
  WatchLimits limits;
  limits.watches = 2;
  limits.instances = 8;
  build(FsMode::kReadOnly, nullptr, limits);
  auto other = std::make_shared<FakeSessionHost>("other");
  const uint64_t a = call(1, watchReq("/a")).file().watched().watch();
  ASSERT_NE(a, 0u);
  ASSERT_TRUE(callFrom(other, 1, watchReq("/b")).file().has_watched());
  v1::Response full = call(2, watchReq("/c"));
  EXPECT_EQ(full.error().errno_value(), ENOSPC) << full.DebugString();
  EXPECT_EQ(full.error().message(),
            "file watch limit of 2 reached, all sessions together (siphon-agent "
            "--max-file-watches raises it)");
  EXPECT_EQ(callFrom(other, 2, watchReq("/c")).error().errno_value(), ENOSPC)
      << "every session meets it";
  // An unwatch makes room at once.
  ASSERT_TRUE(call(3, unwatchReq(a)).file().has_done());
  EXPECT_TRUE(callFrom(other, 3, watchReq("/c")).file().has_watched());
}

TEST_F(FileWatchesTest, TheInstanceLimitIsEmfileNamingItsFlag) {
  for (const char* d : {"a", "b"}) tree_.dir(d);
  WatchLimits limits;
  limits.watches = 100;
  limits.instances = 1;
  build(FsMode::kReadOnly, nullptr, limits);
  auto other = std::make_shared<FakeSessionHost>("other");
  ASSERT_TRUE(call(1, watchReq("/a")).file().has_watched());
  v1::Response refused = callFrom(other, 1, watchReq("/a"));
  EXPECT_EQ(refused.error().errno_value(), EMFILE) << refused.DebugString();
  EXPECT_EQ(refused.error().message(),
            "file watch instance limit of 1 reached: that many sessions watch files already "
            "(siphon-agent --max-file-watch-instances raises it)");
  EXPECT_TRUE(call(2, watchReq("/b")).file().has_watched()) << "a session's own instance serves on";
  // A session that ends gives its instance back.
  host_->end();
  service_->sessionEnded("watcher");
  EXPECT_TRUE(callFrom(other, 2, watchReq("/a")).file().has_watched());
}

// The instance is the file system's (the helper's, with the target's
// identity: the kernel charges it and its watches to the target's user);
// the agent makes none of its own and places no watch itself.
TEST_F(FileWatchesTest, InstancesAndWatchesAreTheFileSystems) {
  tree_.dir("a");
  tree_.dir("b");
  struct Counting : LocalFileSystem {
    using LocalFileSystem::LocalFileSystem;
    absl::StatusOr<UniqueFd> newWatchInstance() override {
      ++instances;
      return LocalFileSystem::newWatchInstance();
    }
    absl::StatusOr<int> addWatch(int instance, const std::string& path, uint32_t mask) override {
      ++watches;
      return LocalFileSystem::addWatch(instance, path, mask);
    }
    std::atomic<int> instances{0}, watches{0};
  };
  auto fs = std::make_shared<Counting>(tree_.rootFd(), GuardOptions{});
  build(FsMode::kReadOnly, fs);
  const int before = inotifyFds();
  ASSERT_TRUE(call(1, watchReq("/a")).file().has_watched());
  ASSERT_TRUE(call(2, watchReq("/b")).file().has_watched());
  ASSERT_TRUE(call(3, watchReq("/a")).file().has_watched());
  EXPECT_EQ(fs->instances.load(), 1) << "one per session";
  EXPECT_EQ(fs->watches.load(), 3);
  EXPECT_EQ(inotifyFds(), before + 1);
}

}  // namespace
}  // namespace siphon::agent::files
