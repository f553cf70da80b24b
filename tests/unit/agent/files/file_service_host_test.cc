// The file service against a fake session host (tests/fakes/agent/): no
// server, no client, no socket. Requests go straight to handle(); the
// answers come back through the host once the blocking pool has run them.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>

#include "agent/files/file_service.h"
#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using fakes::FakeSessionHost;
using fakes::ServiceHarness;

v1::Request fileReq(uint64_t id, v1::FileRequest f) {
  v1::Request r;
  r.set_request_id(id);
  *r.mutable_file() = std::move(f);
  return r;
}
v1::FileRequest openReq(const std::string& path, int flags) {
  v1::FileRequest r;
  r.mutable_open()->set_path(path);
  r.mutable_open()->set_flags(flags);
  return r;
}
v1::FileRequest preadReq(uint64_t fd, uint32_t size, int64_t offset) {
  v1::FileRequest r;
  r.mutable_pread()->set_fd(fd);
  r.mutable_pread()->set_size(size);
  r.mutable_pread()->set_offset(offset);
  return r;
}
v1::FileRequest closeReq(uint64_t fd) {
  v1::FileRequest r;
  r.mutable_close()->set_fd(fd);
  return r;
}

using testing::fdsOpenOn;

AgentConfig withMode(FsMode mode, size_t max_open_files = 64) {
  AgentConfig c;
  c.fs_mode = mode;
  c.max_open_files = max_open_files;
  return c;
}

class FileServiceHostTest : public ::testing::Test {
 protected:
  void build(AgentConfig config) {
    harness_ = std::make_unique<ServiceHarness>(std::move(config), tree_.root());
    service_ = makeFileService(harness_->ctx());
  }
  void TearDown() override {
    service_.reset();
    harness_.reset();
  }

  // Sends `f` as request `id` from `host` and waits for its answer.
  v1::Response call(const std::shared_ptr<FakeSessionHost>& host, uint64_t id, v1::FileRequest f) {
    EXPECT_FALSE(host->response(id).has_value()) << "request ids are unique per host";
    service_->handle(host, fileReq(id, std::move(f)));
    EXPECT_TRUE(harness_->runUntil([&] { return host->response(id).has_value(); }))
        << "no answer to request " << id;
    auto r = host->response(id);
    return r ? *r : v1::Response{};
  }

  testing::ScratchTree tree_;
  std::unique_ptr<ServiceHarness> harness_;
  std::shared_ptr<RequestService> service_;
};

TEST_F(FileServiceHostTest, OpenPreadCloseAnswerThroughTheHost) {
  tree_.file("etc/hostname", "pod-host\n");
  build(withMode(FsMode::kReadOnly));
  auto host = std::make_shared<FakeSessionHost>("s1");
  v1::Response opened = call(host, 1, openReq("/etc/hostname", O_RDONLY));
  ASSERT_TRUE(opened.file().has_opened()) << opened.DebugString();
  const uint64_t fd = opened.file().opened().fd();

  v1::Response data = call(host, 2, preadReq(fd, 4, 4));
  ASSERT_TRUE(data.file().has_data()) << data.DebugString();
  EXPECT_EQ(data.file().data().data(), "host");

  EXPECT_TRUE(call(host, 3, closeReq(fd)).file().has_done());
  v1::Response again = call(host, 4, preadReq(fd, 1, 0));
  EXPECT_EQ(again.error().errno_value(), EBADF) << "closed";
  EXPECT_EQ(host->responses.size(), 4u) << "one answer per request";
}

TEST_F(FileServiceHostTest, HandlesBelongToTheirSessionAndEndWithIt) {
  tree_.file("a", "alpha");
  build(withMode(FsMode::kReadOnly));
  auto a = std::make_shared<FakeSessionHost>("session-a");
  auto b = std::make_shared<FakeSessionHost>("session-b");
  const uint64_t fd = call(a, 1, openReq("/a", O_RDONLY)).file().opened().fd();
  ASSERT_NE(fd, 0u);
  EXPECT_EQ(call(b, 1, preadReq(fd, 1, 0)).error().errno_value(), EBADF)
      << "another session's handle";
  service_->sessionEnded("session-a");
  EXPECT_EQ(call(a, 2, preadReq(fd, 1, 0)).error().errno_value(), EBADF)
      << "closed with its session";
}

TEST_F(FileServiceHostTest, ModesRefuseBeforeAnythingRuns) {
  tree_.file("w", "x");
  build(withMode(FsMode::kReadOnly));
  auto host = std::make_shared<FakeSessionHost>();
  EXPECT_EQ(call(host, 1, openReq("/w", O_WRONLY)).error().errno_value(), EROFS);

  service_.reset();
  harness_.reset();
  build(withMode(FsMode::kOff));
  auto other = std::make_shared<FakeSessionHost>();
  EXPECT_EQ(call(other, 1, openReq("/w", O_RDONLY)).error().code(), v1::PERMISSION_DENIED);

  v1::Response none = call(other, 2, v1::FileRequest{});
  EXPECT_NE(none.error().code(), v1::OK) << "a request with no op is refused";
}

TEST_F(FileServiceHostTest, TheOpenFilesLimitIsLoggedOnTheHost) {
  tree_.file("f", "1");
  build(withMode(FsMode::kReadOnly, /*max_open_files=*/1));
  auto host = std::make_shared<FakeSessionHost>();
  ASSERT_TRUE(call(host, 1, openReq("/f", O_RDONLY)).file().has_opened());
  v1::Response full = call(host, 2, openReq("/f", O_RDONLY));
  EXPECT_EQ(full.error().errno_value(), EMFILE) << full.DebugString();
  ASSERT_EQ(host->limit_hits.size(), 1u) << "the service reports its own limit";
  EXPECT_EQ(errnoOf(host->limit_hits[0]), EMFILE);
}

TEST_F(FileServiceHostTest, TheEndOfTheSessionClosesItsFiles) {
  tree_.file("held", "x");
  build(withMode(FsMode::kReadOnly));
  const std::string path = tree_.inRoot("held");
  auto host = std::make_shared<FakeSessionHost>("ending");
  ASSERT_TRUE(call(host, 1, openReq("/held", O_RDONLY)).file().has_opened());
  ASSERT_EQ(fdsOpenOn(path), 1);
  host->end();
  service_->sessionEnded("ending");
  // The close runs on the blocking pool.
  EXPECT_TRUE(harness_->runUntil([&] { return fdsOpenOn(path) == 0; }));
}

// An opendir that reads at once: the first entries come with the handle;
// with close_at_eof a whole listing closes the directory itself (no handle
// kept, none of the session's open-files limit taken).
TEST_F(FileServiceHostTest, AnOpendirAnswersItsFirstEntriesAndClosesAWholeListing) {
  tree_.file("d/a", "1");
  tree_.file("d/b", "22");
  build(withMode(FsMode::kReadOnly, /*max_open_files=*/1));
  auto host = std::make_shared<FakeSessionHost>("lister");
  v1::FileRequest whole;
  whole.mutable_opendir()->set_path("/d");
  whole.mutable_opendir()->set_read_entries(100);
  whole.mutable_opendir()->set_with_stat(true);
  whole.mutable_opendir()->set_close_at_eof(true);
  v1::Response r = call(host, 1, whole);
  ASSERT_TRUE(r.file().has_opened()) << r.DebugString();
  EXPECT_TRUE(r.file().opened().closed());
  EXPECT_EQ(r.file().opened().fd(), 0u);
  EXPECT_TRUE(r.file().opened().entries().eof());
  std::map<std::string, int64_t> sizes;
  for (const auto& e : r.file().opened().entries().entries()) sizes[e.name()] = e.stat().size();
  EXPECT_EQ(sizes["a"], 1);
  EXPECT_EQ(sizes["b"], 2);
  EXPECT_EQ(sizes.size(), 4u) << ". and .. too";
  // The one handle the session may hold is still free.
  v1::Response file = call(host, 2, openReq("/d/a", O_RDONLY));
  ASSERT_TRUE(file.file().has_opened()) << file.DebugString();
  EXPECT_TRUE(call(host, 3, closeReq(file.file().opened().fd())).file().has_done());

  // Two entries at once, then the handle reads on.
  v1::FileRequest part;
  part.mutable_opendir()->set_path("/d");
  part.mutable_opendir()->set_read_entries(2);
  part.mutable_opendir()->set_close_at_eof(true);
  v1::Response p = call(host, 4, part);
  ASSERT_TRUE(p.file().has_opened()) << p.DebugString();
  EXPECT_FALSE(p.file().opened().closed());
  EXPECT_EQ(p.file().opened().entries().entries_size(), 2);
  EXPECT_FALSE(p.file().opened().entries().eof());
  v1::FileRequest more;
  more.mutable_readdir()->set_dir(p.file().opened().fd());
  v1::Response rest = call(host, 5, more);
  EXPECT_EQ(rest.file().entries().entries_size(), 2) << rest.DebugString();
  EXPECT_TRUE(rest.file().entries().eof());

  // A plain opendir is as before: the handle alone.
  v1::FileRequest plain;
  plain.mutable_opendir()->set_path("/d");
  v1::Response h = call(host, 6, plain);
  EXPECT_EQ(h.error().errno_value(), EMFILE) << "the partial listing's handle is held";
  v1::FileRequest closedir;
  closedir.mutable_closedir()->set_dir(p.file().opened().fd());
  EXPECT_TRUE(call(host, 7, closedir).file().has_done());
  v1::Response h2 = call(host, 8, plain);
  ASSERT_TRUE(h2.file().has_opened()) << h2.DebugString();
  EXPECT_FALSE(h2.file().opened().has_entries());
  EXPECT_NE(h2.file().opened().fd(), 0u);
  closedir.mutable_closedir()->set_dir(h2.file().opened().fd());
  EXPECT_TRUE(call(host, 10, closedir).file().has_done());
  // A missing directory is its errno, with or without the read.
  EXPECT_EQ(call(host, 9, [] {
              v1::FileRequest f;
              f.mutable_opendir()->set_path("/missing");
              f.mutable_opendir()->set_read_entries(10);
              return f;
            }()).error().errno_value(),
            ENOENT);
}

}  // namespace
}  // namespace siphon::agent::files
