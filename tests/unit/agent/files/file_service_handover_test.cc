// The file service across a handover (docs/CONTINUITY.md, "Handover"): one
// service (the old agent's) exports a session's open files, directories and
// watches; another (the new agent's, its own harness and file helper)
// imports them for the same session id. The client's handles go on where
// they were: a read at the file's offset, a listing at the entry after the
// last one given (none twice, none missed), a write at the end of what was
// written, a watch's events from the new agent only once it starts; a
// closed handle's number is not given again. A freeze that is thawed (the
// new agent failed) leaves the old service as it was. Both file systems:
// the file helper (siphon-agent fs-helper, the agent's own) and this
// process. No root.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/files/file_service.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using fakes::FakePeer;
using fakes::FakeSessionHost;
using fakes::ServiceHarness;
using R = v1::FileRequest;

// The requests, named apart from the other tests of this binary (a unity
// build puts them in one file).
struct Req {
  static R open(const std::string& path, int flags) {
    R r;
    r.mutable_open()->set_path(path);
    r.mutable_open()->set_flags(flags);
    return r;
  }
  static R read(uint64_t fd, uint32_t size) {
    R r;
    r.mutable_read()->set_fd(fd);
    r.mutable_read()->set_size(size);
    return r;
  }
  static R write(uint64_t fd, const std::string& data) {
    R r;
    r.mutable_write()->set_fd(fd);
    r.mutable_write()->set_data(data);
    return r;
  }
  static R opendir(const std::string& path) {
    R r;
    r.mutable_opendir()->set_path(path);
    return r;
  }
  static R readdir(uint64_t dir, uint32_t max_entries) {
    R r;
    r.mutable_readdir()->set_dir(dir);
    r.mutable_readdir()->set_max_entries(max_entries);
    return r;
  }
  static R close(uint64_t fd) {
    R r;
    r.mutable_close()->set_fd(fd);
    return r;
  }
  static R watch(const std::string& path) {
    R r;
    r.mutable_watch()->set_path(path);
    return r;
  }
};

std::string digits(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('0' + i % 10));
  return s;
}

// One agent's file service, on its own loop and pool.
struct Side {
  Side(const std::string& root, bool helper) {
    AgentConfig c;
    c.fs_mode = FsMode::kReadWrite;
    c.max_open_files = 64;
    if (helper) c.fs_helper_exe = SIPHON_AGENT_BIN;
    harness = std::make_unique<ServiceHarness>(std::move(c), root);
    service = makeFileService(harness->ctx());
    host = std::make_shared<FakeSessionHost>("moving-session");
    peer = std::make_unique<FakePeer>(*host);
  }
  ~Side() {
    peer.reset();
    service.reset();
    harness.reset();
  }

  v1::Response call(R f) {
    v1::Request r;
    r.set_request_id(next_id);
    *r.mutable_file() = std::move(f);
    const uint64_t id = next_id++;
    service->handle(host, std::move(r));
    EXPECT_TRUE(harness->runUntil([&] { return host->response(id).has_value(); }))
        << "no answer to request " << id;
    auto answer = host->response(id);
    return answer ? *answer : v1::Response{};
  }

  // Names the listing gives from here to its end.
  std::vector<std::string> listRest(uint64_t dir) {
    std::vector<std::string> names;
    for (int i = 0; i < 1000; ++i) {
      v1::Response r = call(Req::readdir(dir, 7));
      EXPECT_TRUE(r.file().has_entries()) << r.DebugString();
      for (const auto& e : r.file().entries().entries()) names.push_back(e.name());
      if (!r.file().has_entries() || r.file().entries().eof()) break;
    }
    return names;
  }

  // Whether an event for `name` under `watch` came within the hang guard.
  bool eventFor(uint64_t watch, const std::string& name) {
    return harness->runUntil([&] {
      peer->pipe();
      for (const auto& batch : peer->file_events) {
        for (const auto& e : batch.events()) {
          if (e.watch() == watch && e.name() == name) return true;
        }
      }
      return false;
    });
  }

  std::unique_ptr<ServiceHarness> harness;
  std::shared_ptr<RequestService> service;
  std::shared_ptr<FakeSessionHost> host;
  std::unique_ptr<FakePeer> peer;
  uint64_t next_id = 1;
};

class FileServiceHandoverTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    tree_.file("big", digits(1000));
    for (int i = 0; i < 40; ++i) tree_.file("d/entry-" + std::to_string(i), "x");
    tree_.file("out", "");
    old_ = std::make_unique<Side>(tree_.root(), GetParam());
    if (GetParam()) {
      R probe;
      probe.mutable_stat()->set_path("/");
      v1::Response r = old_->call(probe);
      // Without CAP_SETGID (not root) the helper cannot take an identity.
      if (r.has_error()) GTEST_SKIP() << "the file helper does not start here: " << r.DebugString();
    }
  }
  void TearDown() override {
    new_.reset();
    old_.reset();
  }

  // The old side's state, frozen and exported; `fds` gets its descriptors.
  v1::AgentState exportOld(std::vector<UniqueFd>* fds) {
    old_->service->freeze();
    v1::AgentState state;
    absl::Status s = old_->service->exportState(&state, fds);
    EXPECT_TRUE(s.ok()) << s;
    return state;
  }

  testing::ScratchTree tree_;
  std::unique_ptr<Side> old_, new_;
};

TEST_P(FileServiceHandoverTest, OpenFilesDirectoriesAndWatchesGoOnWhereTheyWere) {
  const std::string all = digits(1000);
  const uint64_t file = old_->call(Req::open("/big", O_RDONLY)).file().opened().fd();
  ASSERT_NE(file, 0u);
  v1::Response first = old_->call(Req::read(file, 300));
  ASSERT_EQ(first.file().data().data(), all.substr(0, 300)) << first.DebugString();

  const uint64_t dir = old_->call(Req::opendir("/d")).file().opened().fd();
  ASSERT_NE(dir, 0u);
  std::vector<std::string> names;
  for (int i = 0; i < 2; ++i) {
    v1::Response r = old_->call(Req::readdir(dir, 7));
    ASSERT_TRUE(r.file().has_entries()) << r.DebugString();
    for (const auto& e : r.file().entries().entries()) names.push_back(e.name());
  }
  ASSERT_EQ(names.size(), 14u);

  const uint64_t out = old_->call(Req::open("/out", O_WRONLY)).file().opened().fd();
  ASSERT_NE(out, 0u);
  ASSERT_EQ(old_->call(Req::write(out, "before-")).file().written().written(), 7u);

  // A handle closed before: its number stays used.
  const uint64_t closed = old_->call(Req::open("/big", O_RDONLY)).file().opened().fd();
  ASSERT_TRUE(old_->call(Req::close(closed)).file().has_done());

  v1::Response watched = old_->call(Req::watch("/d"));
  ASSERT_TRUE(watched.file().has_watched()) << watched.DebugString();
  const uint64_t watch = watched.file().watched().watch();
  // Seen by the old agent, sent before the freeze ends its reading.
  tree_.file("d/seen-before", "1");
  ASSERT_TRUE(old_->eventFor(watch, "seen-before"));

  std::vector<UniqueFd> fds;
  v1::AgentState state = exportOld(&fds);
  ASSERT_EQ(state.files_size(), 1);
  EXPECT_EQ(state.files(0).handles_size(), 3);
  EXPECT_GE(state.files(0).inotify(), 0);
  // A change while no agent reads: queued in the instance, for the new one.
  tree_.file("d/while-frozen", "2");

  new_ = std::make_unique<Side>(tree_.root(), GetParam());
  absl::Status imported = new_->service->importState(
      state, fds, {{"moving-session", std::shared_ptr<SessionHost>(new_->host)}});
  ASSERT_TRUE(imported.ok()) << imported;
  // The old agent lets go of everything (it exits): what moved is apart.
  old_->host->end();
  old_->service->sessionEnded("moving-session");
  old_.reset();
  new_->service->startAfterHandover();

  v1::Response rest = new_->call(Req::read(file, 1000));
  ASSERT_TRUE(rest.file().has_data()) << rest.DebugString();
  EXPECT_EQ(rest.file().data().data(), all.substr(300)) << "the read goes on at its offset";

  std::vector<std::string> after = new_->listRest(dir);
  std::multiset<std::string> listed(names.begin(), names.end());
  listed.insert(after.begin(), after.end());
  std::multiset<std::string> want = {".", ".."};
  for (const auto& e : std::filesystem::directory_iterator(tree_.inRoot("d"))) {
    want.insert(e.path().filename().string());
  }
  // The listing may or may not show entries made after it began; each
  // name shows once at most, and every one there from the start shows.
  for (const std::string& n : listed) EXPECT_EQ(listed.count(n), 1u) << n << " listed twice";
  for (const std::string& n : want) {
    if (n != "seen-before" && n != "while-frozen") {
      EXPECT_EQ(listed.count(n), 1u) << n;
    }
  }

  ASSERT_EQ(new_->call(Req::write(out, "after")).file().written().written(), 5u);
  EXPECT_TRUE(new_->call(Req::close(out)).file().has_done());
  EXPECT_EQ(testing::ScratchTree::read(tree_.inRoot("out")), "before-after");

  EXPECT_EQ(new_->call(Req::read(closed, 1)).error().errno_value(), EBADF);
  const uint64_t fresh = new_->call(Req::open("/big", O_RDONLY)).file().opened().fd();
  EXPECT_GT(fresh, closed) << "a handle number is never given twice in a session";

  EXPECT_TRUE(new_->eventFor(watch, "while-frozen"))
      << "queued while frozen, read by the new agent";
  tree_.file("d/after", "3");
  EXPECT_TRUE(new_->eventFor(watch, "after")) << "the watch goes on";
  for (const auto& batch : new_->peer->file_events) {
    for (const auto& e : batch.events()) EXPECT_NE(e.name(), "seen-before") << "sent twice";
  }
  // The new agent's file system places watches in the instance that moved:
  // the same object answers the same id, a new one its own.
  EXPECT_EQ(new_->call(Req::watch("/d")).file().watched().watch(), watch);
  tree_.dir("e");
  const uint64_t other = new_->call(Req::watch("/e")).file().watched().watch();
  EXPECT_NE(other, 0u);
  EXPECT_NE(other, watch);
  tree_.file("e/later", "4");
  EXPECT_TRUE(new_->eventFor(other, "later"));
}

// The new agent failed: the old one thaws and everything goes on there.
TEST_P(FileServiceHandoverTest, AThawedServiceGoesOnAsBefore) {
  const std::string all = digits(1000);
  const uint64_t file = old_->call(Req::open("/big", O_RDONLY)).file().opened().fd();
  ASSERT_EQ(old_->call(Req::read(file, 100)).file().data().data(), all.substr(0, 100));
  const uint64_t dir = old_->call(Req::opendir("/d")).file().opened().fd();
  std::vector<std::string> names;
  v1::Response listing = old_->call(Req::readdir(dir, 5));
  for (const auto& e : listing.file().entries().entries()) names.push_back(e.name());
  const uint64_t watch = old_->call(Req::watch("/d")).file().watched().watch();
  ASSERT_NE(watch, 0u);

  std::vector<UniqueFd> fds;
  v1::AgentState state = exportOld(&fds);
  tree_.file("d/while-frozen", "1");
  fds.clear();  // the new agent died with its copies
  old_->service->thaw();

  EXPECT_EQ(old_->call(Req::read(file, 1000)).file().data().data(), all.substr(100));
  std::vector<std::string> after = old_->listRest(dir);
  std::set<std::string> listed(names.begin(), names.end());
  for (const std::string& n : after) EXPECT_TRUE(listed.insert(n).second) << n << " listed twice";
  EXPECT_GE(listed.size(), 42u);
  EXPECT_TRUE(old_->eventFor(watch, "while-frozen"));
}

// A state that names a session that did not come, or a descriptor that is
// missing, is refused with what is wrong; nothing is taken.
TEST_P(FileServiceHandoverTest, AStateThatDoesNotHoldIsRefused) {
  const uint64_t file = old_->call(Req::open("/big", O_RDONLY)).file().opened().fd();
  ASSERT_NE(file, 0u);
  std::vector<UniqueFd> fds;
  v1::AgentState state = exportOld(&fds);
  new_ = std::make_unique<Side>(tree_.root(), GetParam());
  absl::Status other = new_->service->importState(
      state, fds, {{"another-session", std::shared_ptr<SessionHost>(new_->host)}});
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.message().find("moving-session, which did not come"), std::string::npos) << other;
  std::vector<UniqueFd> none;
  absl::Status missing = new_->service->importState(
      state, none, {{"moving-session", std::shared_ptr<SessionHost>(new_->host)}});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("is missing"), std::string::npos) << missing;
}

INSTANTIATE_TEST_SUITE_P(FileSystems, FileServiceHandoverTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? std::string("FileHelper") : std::string("InProcess");
                         });

}  // namespace
}  // namespace siphon::agent::files
