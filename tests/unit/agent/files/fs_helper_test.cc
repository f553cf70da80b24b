// The agent's side of the file helper against fake helpers (shell scripts
// exec'd in its place): a malformed answer, a refusal to start, a helper that
// says nothing. The agent must answer each request with a clear error, never
// crash, and start a new helper for the next request. No root.
#include "agent/files/fs_helper.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "siphon/status.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using ::testing::HasSubstr;

class FsHelperTest : public ::testing::Test {
 protected:
  // A fake helper running `body` (sh) with fd 4 its first connection; each
  // start appends a line to starts().
  // `target`: the identity source (HelperOptions::target); null for none.
  std::shared_ptr<FileSystem> fake(
      const std::string& body, std::function<absl::StatusOr<TargetIdentity>()> target = nullptr) {
    const std::string exe = tree_.base() + "/fake-helper";
    std::ofstream(exe) << "#!/bin/sh\necho \"$@\" >> " << starts_path() << "\n" << body << "\n";
    ::chmod(exe.c_str(), 0755);
    HelperOptions o;
    o.exe = exe;
    o.root_fd = tree_.rootFd();
    // No target: targetless, the ids of this process, nothing to read.
    o.target = std::move(target);
    return makeHelperFileSystem(o);
  }
  std::string startsText() const {
    std::ifstream in(starts_path());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string starts_path() const { return tree_.base() + "/starts"; }
  int starts() const {
    std::ifstream in(starts_path());
    int n = 0;
    std::string line;
    while (std::getline(in, line)) ++n;
    return n;
  }
  static v1::FileRequest statOf(const std::string& path) {
    v1::FileRequest r;
    r.mutable_stat()->set_path(path);
    return r;
  }

  testing::ScratchTree tree_;
};

TEST_F(FsHelperTest, MalformedAnswerIsEioAndTheNextRequestStartsANewHelper) {
  // Ready, then a frame length past any limit on every connection.
  auto fs = fake(
      "printf R >&4\nfor fd in 4 5 6 7; do printf '\\377\\377\\377\\377' >&$fd; done\n"
      "exec sleep 30");
  auto first = fs->path(statOf("/"), false);
  EXPECT_EQ(errnoOf(first.status()), EIO) << first.status();
  EXPECT_THAT(std::string(first.status().message()), HasSubstr("malformed")) << first.status();
  auto second = fs->path(statOf("/"), false);
  EXPECT_EQ(errnoOf(second.status()), EIO) << second.status();
  EXPECT_EQ(starts(), 2) << "one helper per request: the broken one was replaced";
}

TEST_F(FsHelperTest, AHelperThatClosesItsSocketIsEio) {
  auto fs = fake("printf R >&4\nexec 4>&- 5>&- 6>&- 7>&-\nexec sleep 30");
  auto r = fs->path(statOf("/"), false);
  EXPECT_EQ(errnoOf(r.status()), EIO) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("socket closed")) << r.status();
}

TEST_F(FsHelperTest, AHelperThatCannotStartSaysWhy) {
  auto fs = fake("printf 'Etaking the target identity: setgroups: nope' >&4\nexit 1");
  v1::FileRequest open;
  open.mutable_open()->set_path("/x");
  auto r = fs->open(open);
  EXPECT_EQ(errnoOf(r.status()), EIO) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("setgroups: nope")) << r.status();
}

TEST_F(FsHelperTest, AHelperThatSaysNothingIsAnError) {
  auto fs = fake("exit 0");
  auto r = fs->path(statOf("/"), false);
  EXPECT_EQ(errnoOf(r.status()), EIO) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("did not start")) << r.status();
}

// Issue 40, item 9: the identity comes from the target (Target::identity,
// read while its pidfd pins it) at each start, and no helper starts while
// the target is down.
TEST_F(FsHelperTest, NoHelperStartsWhileTheTargetIsDown) {
  int asked = 0;
  auto fs = fake("printf R >&4\nexec sleep 30", [&]() -> absl::StatusOr<TargetIdentity> {
    ++asked;
    return errnoRefusal(EAGAIN,
                        "the target process 4242 has exited: file access waits for its "
                        "container's next process");
  });
  auto r = fs->path(statOf("/"), false);
  EXPECT_EQ(errnoOf(r.status()), EAGAIN) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("has exited")) << r.status();
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(starts(), 0) << "a helper started while the target was down";
}

TEST_F(FsHelperTest, TheHelperTakesTheIdentityTheTargetHasAtItsStart) {
  uint32_t uid = 1234;
  auto fs = fake("printf R >&4\nexec 4>&- 5>&- 6>&- 7>&-\nexec sleep 30",
                 [&]() -> absl::StatusOr<TargetIdentity> {
                   TargetIdentity id;
                   id.pid = 4242;
                   id.credentials.uid = {uid, uid, uid, uid};
                   id.credentials.gid = {uid, uid, uid, uid};
                   return id;
                 });
  (void)fs->path(statOf("/"), false);  // the fake closes: the next call starts again
  uid = 5678;
  (void)fs->path(statOf("/"), false);
  EXPECT_EQ(starts(), 2);
  EXPECT_THAT(startsText(), HasSubstr("--uid=1234,1234,1234,1234"));
  EXPECT_THAT(startsText(), HasSubstr("--uid=5678,5678,5678,5678"));
}

TEST_F(FsHelperTest, ATargetInAnotherUserNamespaceIsRefused) {
  auto fs = fake("printf R >&4\nexec sleep 30", []() -> absl::StatusOr<TargetIdentity> {
    TargetIdentity id;
    id.pid = 4242;
    id.in_agent_user_namespace = false;
    return id;
  });
  auto r = fs->path(statOf("/"), false);
  EXPECT_EQ(errorCodeOf(r.status()), v1::UNIMPLEMENTED) << r.status();
  EXPECT_EQ(starts(), 0);
}

}  // namespace
}  // namespace siphon::agent::files
