// The file service inside the real agent server, with the real client, in
// process over loopback. The "target" is targetless with its root replaced
// by a scratch directory (a FakeProcFs whose openRoot opens it). No root.
#include "agent/files/file_service.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "tests/fakes/eventually.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

namespace asio = net::asio;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::ScratchTree;

constexpr pid_t kSelfPid = 4242;
constexpr char kToken[] = "files-token";

using fakes::RootedProcFs;

using testing::fdsOpenOn;

v1::FileRequest openReq(const std::string& path, int flags, uint32_t mode = 0) {
  v1::FileRequest r;
  r.mutable_open()->set_path(path);
  r.mutable_open()->set_flags(flags);
  r.mutable_open()->set_mode(mode);
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

using Client = std::shared_ptr<client::Client>;

net::awaitable<absl::StatusOr<v1::FileResponse>> call(const Client& c, const v1::FileRequest& fr) {
  v1::Request req;
  *req.mutable_file() = fr;
  auto r = co_await c->call(std::move(req), milliseconds(10000));
  if (!r.ok()) co_return r.status();
  co_return r->file();
}

class FileServiceTest : public ::testing::Test {
 protected:
  void start(FsMode mode, milliseconds session_grace = milliseconds(60000)) {
    AgentConfig config;
    config.limits.session_grace = session_grace;
    config.listen = "127.0.0.1:0";
    config.token = kToken;
    config.fs_mode = mode;
    auto procfs = std::make_unique<RootedProcFs>(tree_.root());
    procfs->setSelfPid(kSelfPid);
    procfs->addProcess(kSelfPid, {});
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::move(procfs), spec);
    address_ = agent_.address();
  }

  client::ClientOptions options() {
    client::ClientOptions o;
    o.endpoints = {address_};
    o.token = kToken;
    o.client_name = "file-service-test";
    return o;
  }

  template <typename F>
  void runClient(F f) {
    fakes::runClient(std::move(f));
  }

  ScratchTree tree_;
  fakes::InProcessAgent agent_;
  std::string address_;
};

bool hasFeature(const v1::Welcome& w, v1::Feature f) {
  return std::find(w.features().begin(), w.features().end(), f) != w.features().end();
}

TEST_F(FileServiceTest, OpenPreadCloseInsideTheRoot) {
  tree_.file("etc/hostname", "pod-host\n");
  start(FsMode::kReadOnly);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_TRUE(hasFeature(c->welcome(), v1::FEATURE_FILES));

    auto opened = co_await call(c, openReq("/etc/hostname", O_RDONLY));
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    const uint64_t fd = opened->opened().fd();
    EXPECT_EQ(fd, 1u) << "handles count from 1 per session";
    auto data = co_await call(c, preadReq(fd, 100, 0));
    EXPECT_TRUE(data.ok()) << data.status();
    if (data.ok()) {
      EXPECT_EQ(data->data().data(), "pod-host\n");
      EXPECT_TRUE(data->data().eof());
    }
    auto st = co_await call(c, [&] {
      v1::FileRequest r;
      r.mutable_fstat()->set_fd(fd);
      return r;
    }());
    EXPECT_EQ(st.ok() ? st->stat().size() : -1, 9);
    EXPECT_TRUE((co_await call(c, closeReq(fd))).ok());
    auto again = co_await call(c, preadReq(fd, 100, 0));
    EXPECT_EQ(errnoOf(again.status()), EBADF) << "closed";
    EXPECT_EQ(errnoOf((co_await call(c, closeReq(fd))).status()), EBADF) << "closed twice";

    auto escape = co_await call(
        c, openReq("/../../../../../../" + tree_.base().substr(1) + "/outside/secret", O_RDONLY));
    EXPECT_EQ(errnoOf(escape.status()), ENOENT) << escape.status();
    auto missing = co_await call(c, openReq("/etc/shadow", O_RDONLY));
    EXPECT_EQ(errorCodeOf(missing.status()), v1::ERRNO);
    EXPECT_EQ(errnoOf(missing.status()), ENOENT);
    EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/etc/shadow"));
    c->close();
  });
}

// Large reads of a regular file go by splice end to end over plain TCP:
// the agent splices the file into a pipe and that into the socket, and a
// caller that asks for a pipe gets the answer's bytes past its head in one.
// The bytes are the file's either way, at aligned and unaligned offsets,
// and the pipes are all closed once the answers are taken.
TEST_F(FileServiceTest, LargeReadsComePipedToACallerThatAsks) {
  std::string content(3 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 11 + i / 65536);
  tree_.file("data/big", content);
  start(FsMode::kReadOnly);
  size_t piped_answers = 0;
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    auto opened = co_await call(c, openReq("/data/big", O_RDONLY));
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    const uint64_t fd = opened->opened().fd();
    const uint32_t max = c->maxReadSize() / 4096 * 4096;
    for (auto [offset, size] : std::vector<std::pair<int64_t, uint32_t>>{
             {0, max}, {int64_t{max}, max}, {12345, 200000}, {(3 << 20) - 50000, max}}) {
      SCOPED_TRACE(::testing::Message() << "offset " << offset << " size " << size);
      for (bool want_pipe : {true, false}) {
        v1::Request req;
        *req.mutable_file() = preadReq(fd, size, offset);
        std::shared_ptr<protocol::PipedBytes> piped;
        auto r = co_await c->call(std::move(req), milliseconds(10000),
                                  want_pipe ? &piped : nullptr);
        EXPECT_TRUE(r.ok()) << r.status();
        if (!r.ok()) co_return;
        std::string got = r->file().data().data();
        // Only to a caller that asks. (A read gives the decoder up to 64 KiB
        // past a frame's end, so a small answer may be whole in memory; so
        // is a large one whose pipe filled up: TCP cuts pages in two at
        // its segments' ends, a buffer each.)
        if (!want_pipe) {
          EXPECT_EQ(piped, nullptr);
        }
        // The 200,000-byte read's pipe (2x its bytes) holds it however TCP
        // cut its pages; a 1 MiB read's may fill (the largest pipe here is
        // 1 MiB) and come in memory.
        if (want_pipe && size == 200000) {
          EXPECT_NE(piped, nullptr) << "a read its pipe holds came in memory";
        }
        if (piped) {
          ++piped_answers;
          auto rest = piped->materialize();
          EXPECT_TRUE(rest.ok()) << rest.status();
          if (rest.ok()) got += *rest;
        }
        const std::string want = content.substr(offset, size);
        EXPECT_TRUE(got == want) << got.size() << " bytes, " << want.size() << " wanted";
        EXPECT_EQ(r->file().data().eof(), offset + static_cast<int64_t>(want.size()) ==
                                              static_cast<int64_t>(content.size()));
      }
    }
    EXPECT_TRUE((co_await call(c, closeReq(fd))).ok());
    c->close();
  });
  EXPECT_GE(piped_answers, 1u) << "the large asked-for pipes came";
  EXPECT_TRUE(fakes::eventually([] { return protocol::PipedBytes::live() == 0; },
                                std::chrono::seconds(10)))
      << protocol::PipedBytes::live() << " pipes left open";
}

TEST_F(FileServiceTest, HandlesOfAnotherSessionAreEbadf) {
  tree_.file("f", "x");
  start(FsMode::kReadOnly);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client a = client::Client::create(ex, options());
    Client b = client::Client::create(ex, options());
    EXPECT_TRUE((co_await a->connect()).ok());
    EXPECT_TRUE((co_await b->connect()).ok());
    auto opened = co_await call(a, openReq("/f", O_RDONLY));
    EXPECT_TRUE(opened.ok());
    const uint64_t fd = opened.ok() ? opened->opened().fd() : 1;
    EXPECT_EQ(errnoOf((co_await call(b, preadReq(fd, 1, 0))).status()), EBADF);
    EXPECT_EQ(errnoOf((co_await call(b, closeReq(fd))).status()), EBADF);
    EXPECT_TRUE((co_await call(a, preadReq(fd, 1, 0))).ok()) << "still A's";
    a->close();
    b->close();
  });
}

TEST_F(FileServiceTest, ReadOnlyModeAnswersErofsToWrites) {
  tree_.file("f", "keep");
  start(FsMode::kReadOnly);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    for (int flags : {O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC, O_WRONLY | O_CREAT}) {
      auto r = co_await call(c, openReq("/f", flags, 0644));
      EXPECT_EQ(errnoOf(r.status()), EROFS) << flags;
    }
    v1::FileRequest mk;
    mk.mutable_mkdir()->set_path("/d");
    EXPECT_EQ(errnoOf((co_await call(c, mk)).status()), EROFS);
    v1::FileRequest acc;
    acc.mutable_access()->set_path("/f");
    acc.mutable_access()->set_mode(W_OK);
    EXPECT_EQ(errnoOf((co_await call(c, acc)).status()), EROFS);
    c->close();
  });
  EXPECT_EQ(ScratchTree::read(tree_.inRoot("f")), "keep");
  EXPECT_FALSE(std::filesystem::exists(tree_.inRoot("d")));
}

// The new namespace and attribute ops are refused the same way; reads of
// attributes and fsync of a read handle are not.
TEST_F(FileServiceTest, ReadOnlyModeAnswersErofsToLinksNodesAndXattrWrites) {
  tree_.file("f", "keep");
  start(FsMode::kReadOnly);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    std::vector<v1::FileRequest> writes(5);
    writes[0].mutable_symlink()->set_target("/f");
    writes[0].mutable_symlink()->set_linkpath("/l");
    writes[1].mutable_link()->set_existing("/f");
    writes[1].mutable_link()->set_newpath("/g");
    writes[2].mutable_mknod()->set_path("/p");
    writes[2].mutable_mknod()->set_mode(S_IFIFO | 0600);
    writes[3].mutable_setxattr()->set_path("/f");
    writes[3].mutable_setxattr()->set_name("user.a");
    writes[4].mutable_removexattr()->set_path("/f");
    writes[4].mutable_removexattr()->set_name("user.a");
    for (const auto& w : writes) {
      auto r = co_await call(c, w);
      EXPECT_EQ(errnoOf(r.status()), EROFS) << w.ShortDebugString();
      EXPECT_THAT(std::string(r.status().message()), HasSubstr("--fs-mode ro"));
    }
    v1::FileRequest get;
    get.mutable_getxattr()->set_path("/f");
    get.mutable_getxattr()->set_name("user.none");
    auto got = co_await call(c, get);
    EXPECT_NE(errnoOf(got.status()), EROFS) << got.status();
    EXPECT_NE(errnoOf(got.status()), 0) << "no such attribute";

    auto opened = co_await call(c, openReq("/f", O_RDONLY));
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    v1::FileRequest sync;
    sync.mutable_fsync()->set_fd(opened->opened().fd());
    auto synced = co_await call(c, sync);
    EXPECT_TRUE(synced.ok() && synced->has_done()) << synced.status();
    sync.mutable_fsync()->set_fd(99);
    EXPECT_EQ(errnoOf((co_await call(c, sync)).status()), EBADF) << "a handle is still checked";
    c->close();
  });
  for (const char* name : {"l", "g", "p"}) {
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(tree_.inRoot(name))))
        << name;
  }
}

// Readdir with_stat over the wire, and fsync of a write handle in rw mode.
TEST_F(FileServiceTest, ReaddirWithStatAndFsync) {
  tree_.file("d/f", "abc");
  tree_.symlink("d/l", "f");
  start(FsMode::kReadWrite);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    v1::FileRequest od;
    od.mutable_opendir()->set_path("/d");
    auto opened = co_await call(c, od);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    v1::FileRequest rd;
    rd.mutable_readdir()->set_dir(opened->opened().fd());
    rd.mutable_readdir()->set_with_stat(true);
    auto batch = co_await call(c, rd);
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) co_return;
    EXPECT_EQ(batch->entries().entries_size(), 4);
    for (const auto& e : batch->entries().entries()) {
      EXPECT_TRUE(e.has_stat()) << e.name();
      if (e.name() == "l") {
        EXPECT_TRUE(S_ISLNK(e.stat().mode()));
      }
      if (e.name() == "f") {
        EXPECT_EQ(e.stat().size(), 3);
      }
    }

    auto file = co_await call(c, openReq("/d/f", O_WRONLY));
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) co_return;
    v1::FileRequest sync;
    sync.mutable_fsync()->set_fd(file->opened().fd());
    sync.mutable_fsync()->set_datasync(true);
    EXPECT_TRUE((co_await call(c, sync)).ok());
    c->close();
  });
}

TEST_F(FileServiceTest, OffModeAnswersPermissionDeniedAndHidesTheFeature) {
  tree_.file("f", "x");
  start(FsMode::kOff);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_FALSE(hasFeature(c->welcome(), v1::FEATURE_FILES));
    auto r = co_await call(c, openReq("/f", O_RDONLY));
    EXPECT_EQ(errorCodeOf(r.status()), v1::PERMISSION_DENIED);
    EXPECT_EQ(r.status().message(), "file access is off (--fs-mode off)");
    c->close();
  });
}

TEST_F(FileServiceTest, ReadWriteModeWritesAndReadsAreClampedToTheSessionLimit) {
  start(FsMode::kReadWrite);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto o = options();
    o.limits.max_read_size = 4096;  // negotiated down from the agent's
    Client c = client::Client::create(ex, o);
    EXPECT_TRUE((co_await c->connect()).ok());
    EXPECT_EQ(c->welcome().limits().max_read_size(), 4096u);
    auto opened = co_await call(c, openReq("/big", O_RDWR | O_CREAT | O_TRUNC, 0600));
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    const uint64_t fd = opened->opened().fd();
    v1::FileRequest w;
    w.mutable_pwrite()->set_fd(fd);
    w.mutable_pwrite()->set_data(std::string(10000, 'z'));
    auto written = co_await call(c, w);
    EXPECT_EQ(written.ok() ? written->written().written() : 0u, 10000u);
    auto data = co_await call(c, preadReq(fd, 1 << 20, 0));
    EXPECT_TRUE(data.ok());
    if (data.ok()) {
      EXPECT_EQ(data->data().data().size(), 4096u) << "clamped, not refused";
      EXPECT_FALSE(data->data().eof());
    }
    EXPECT_TRUE((co_await call(c, closeReq(fd))).ok());
    c->close();
  });
  EXPECT_EQ(std::filesystem::file_size(tree_.inRoot("big")), 10000u);
}

TEST_F(FileServiceTest, ReaddirInBatches) {
  for (int i = 0; i < 5; ++i) tree_.file("d/f" + std::to_string(i), "");
  start(FsMode::kReadOnly);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    v1::FileRequest od;
    od.mutable_opendir()->set_path("/d");
    auto opened = co_await call(c, od);
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) co_return;
    const uint64_t dir = opened->opened().fd();
    // A dir handle is not a file handle.
    EXPECT_EQ(errnoOf((co_await call(c, preadReq(dir, 1, 0))).status()), EBADF);
    int entries = 0;
    for (int i = 0; i < 10; ++i) {
      v1::FileRequest rd;
      rd.mutable_readdir()->set_dir(dir);
      rd.mutable_readdir()->set_max_entries(2);
      auto batch = co_await call(c, rd);
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok()) break;
      EXPECT_LE(batch->entries().entries_size(), 2);
      entries += batch->entries().entries_size();
      if (batch->entries().eof()) break;
    }
    EXPECT_EQ(entries, 7);
    v1::FileRequest cd;
    cd.mutable_closedir()->set_dir(dir);
    EXPECT_TRUE((co_await call(c, cd)).ok());
    EXPECT_EQ(errnoOf((co_await call(c, cd)).status()), EBADF);
    c->close();
  });
}

TEST_F(FileServiceTest, PathRequestsAndNoOp) {
  tree_.file("f", "abc");
  tree_.symlink("l", "/f");
  start(FsMode::kReadOnly);
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    v1::FileRequest st;
    st.mutable_stat()->set_path("/l");
    st.mutable_stat()->set_follow_symlinks(true);
    auto s = co_await call(c, st);
    EXPECT_EQ(s.ok() ? s->stat().size() : -1, 3);
    v1::FileRequest rl;
    rl.mutable_readlink()->set_path("/l");
    auto l = co_await call(c, rl);
    EXPECT_EQ(l.ok() ? l->link().target() : "?", "/f");
    v1::FileRequest sf;
    sf.mutable_statfs()->set_path("/");
    EXPECT_TRUE((co_await call(c, sf)).ok());
    auto none = co_await call(c, v1::FileRequest());
    EXPECT_EQ(errorCodeOf(none.status()), v1::INVALID_ARGUMENT);
    c->close();
  });
}

TEST_F(FileServiceTest, SessionEndClosesItsFiles) {
  tree_.file("held", "x");
  const std::string held = tree_.inRoot("held");
  // runClient stops its loop right after the body, before a Goaway could
  // be flushed: the session then ends when its (short) grace runs out.
  start(FsMode::kReadOnly, milliseconds(100));
  runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    Client c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    for (int i = 0; i < 3; ++i) EXPECT_TRUE((co_await call(c, openReq("/held", O_RDONLY))).ok());
    EXPECT_EQ(fdsOpenOn(held), 3);
    c->close();
  });
  // The agent closes them on its own threads; 20 s only turns a hang into
  // a failure.
  fakes::eventually([&] { return fdsOpenOn(held) == 0; }, std::chrono::seconds(20));
  EXPECT_EQ(fdsOpenOn(held), 0);
}

}  // namespace
}  // namespace siphon::agent::files
