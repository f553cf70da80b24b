// The handover socket's plumbing (agent/server/handover_channel.h): the
// socket file (mode 0600, a stale one replaced, a live one or another file
// refused), messages with descriptors, the state's memfd, peer checks and
// timeouts. No root needed: both ends are this process.
#include "agent/server/handover_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace siphon::agent::handover {
namespace {

class HandoverChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/siphon-handover-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/h.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_, path_;
};

TEST_F(HandoverChannelTest, TheSocketIsOnlyTheOwnersAndCarriesMessagesWithDescriptors) {
  auto listener = listen(path_);
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto client = connect(path_);
  ASSERT_TRUE(client.ok()) << client.status();
  UniqueFd server(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server);
  auto cred = checkPeer(server.get());
  ASSERT_TRUE(cred.ok()) << cred.status();
  EXPECT_EQ(cred->pid, ::getpid());

  // A message with two descriptors: a pipe's ends, usable on the far side.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  v1::HandoverMessage m;
  m.mutable_fds()->set_count(2);
  ASSERT_TRUE(send(client->get(), m, std::span<const int>(p, 2)).ok());
  ::close(p[0]);
  ::close(p[1]);
  std::vector<UniqueFd> fds;
  auto got = receive(server.get(), std::chrono::seconds(1), &fds);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->fds().count(), 2u);
  ASSERT_EQ(fds.size(), 2u);
  ASSERT_EQ(::write(fds[1].get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(fds[0].get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');

  // Nothing more: a timeout, then the peer's close is UNAVAILABLE.
  auto none = receive(server.get(), std::chrono::milliseconds(20), &fds);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  client->reset();
  auto closed = receive(server.get(), std::chrono::seconds(1), &fds);
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable) << closed.status();
}

TEST_F(HandoverChannelTest, AStaleSocketIsReplacedALiveOneOrAFileIsNot) {
  {
    auto first = listen(path_);
    ASSERT_TRUE(first.ok()) << first.status();
    auto live = listen(path_);
    EXPECT_EQ(live.status().code(), absl::StatusCode::kAlreadyExists) << live.status();
    EXPECT_NE(std::string(live.status().message()).find("another agent listens there"),
              std::string::npos);
  }
  // The first is closed: its file is stale, and replaced.
  auto again = listen(path_);
  EXPECT_TRUE(again.ok()) << again.status();
  const std::string file = dir_ + "/plain";
  UniqueFd f(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  auto over_file = listen(file);
  EXPECT_EQ(over_file.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(std::string(over_file.status().message()).find("not a socket"), std::string::npos);
  auto nobody = connect(dir_ + "/none.sock");
  EXPECT_FALSE(nobody.ok());
  EXPECT_NE(std::string(nobody.status().message()).find("--handover-socket there"),
            std::string::npos)
      << nobody.status();
}

TEST_F(HandoverChannelTest, TheStateGoesThroughASealedMemfd) {
  std::string state(3 << 20, '\0');
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<char>(i * 7);
  auto fd = toMemfd(state);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(::write(fd->get(), "x", 1), -1) << "sealed against writes";
  auto back = fromMemfd(fd->get(), state.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, state);
  auto wrong = fromMemfd(fd->get(), state.size() + 1);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace siphon::agent::handover
