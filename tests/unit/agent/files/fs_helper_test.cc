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
  std::shared_ptr<FileSystem> fake(const std::string& body) {
    const std::string exe = tree_.base() + "/fake-helper";
    std::ofstream(exe) << "#!/bin/sh\necho x >> " << starts_path() << "\n" << body << "\n";
    ::chmod(exe.c_str(), 0755);
    HelperOptions o;
    o.exe = exe;
    o.root_fd = tree_.rootFd();
    o.target_pid = 0;  // targetless: the ids of this process, nothing to read
    return makeHelperFileSystem(o);
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

}  // namespace
}  // namespace siphon::agent::files
