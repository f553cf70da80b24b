// The handover socket's plumbing (agent/server/handover_channel.h): the
// socket file (mode 0600, a stale one replaced, a live one or another file
// refused), where it may be (never a place others share: /dev/shm, a
// directory others may write), messages with descriptors, the state's
// memfd (sealed, within its cap), the limits of an imported session, peer
// checks and timeouts. No root needed: both ends are this process.
#include "agent/server/handover_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "siphon/protocol/limits.h"

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
  auto back = fromMemfd(fd->get(), state.size(), 4 << 20);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, state);
  auto wrong = fromMemfd(fd->get(), state.size() + 1, 4 << 20);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
}

// What a new agent reads as a state: only a memfd its sender can no longer
// change, and no more than its cap, checked before a byte is allocated (a
// sparse memfd claims any size for free).
TEST_F(HandoverChannelTest, OnlyASealedMemfdWithinTheCapIsRead) {
  UniqueFd unsealed(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::write(unsealed.get(), "state", 5), 5);
  auto u = fromMemfd(unsealed.get(), 5, 1 << 20);
  EXPECT_EQ(u.status().code(), absl::StatusCode::kPermissionDenied) << u.status();
  EXPECT_NE(std::string(u.status().message()).find("not sealed"), std::string::npos);
  // Sealed against growing and shrinking only: still writable.
  ASSERT_EQ(::fcntl(unsealed.get(), F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK), 0);
  EXPECT_EQ(fromMemfd(unsealed.get(), 5, 1 << 20).status().code(),
            absl::StatusCode::kPermissionDenied);

  const std::string file = dir_ + "/state";
  UniqueFd plain(::open(file.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  ASSERT_EQ(::write(plain.get(), "state", 5), 5);
  auto p = fromMemfd(plain.get(), 5, 1 << 20);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kPermissionDenied) << p.status();
  EXPECT_NE(std::string(p.status().message()).find("not a memfd"), std::string::npos);

  UniqueFd sparse(::memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(::ftruncate(sparse.get(), 8ll << 30), 0);
  ASSERT_EQ(::fcntl(sparse.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK), 0);
  auto big = fromMemfd(sparse.get(), 8ull << 30, 1 << 20);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_NE(std::string(big.status().message()).find("above --handover-max-state (1 MiB)"),
            std::string::npos)
      << big.status();
}

// The socket only where no one else can put a socket or a file first.
TEST_F(HandoverChannelTest, TheSocketIsOnlyWhereNoOneElseWrites) {
  // Ours: a 0700 directory of ours under a sticky /tmp.
  EXPECT_TRUE(checkSocketPlace(path_).ok()) << checkSocketPlace(path_);
  auto bad = [](const std::string& path) {
    absl::Status s = checkSocketPlace(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
    return std::string(s.message());
  };
  // The pod's shared memory, by name or through a directory under it.
  EXPECT_NE(bad("/dev/shm/siphon-handover.sock").find("the pod's /dev/shm"), std::string::npos);
  // A place others write (an emptyDir is 0777): the directory itself, or
  // one above it that is not sticky.
  const std::string open_dir = dir_ + "/shared";
  ASSERT_EQ(::mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open_dir.c_str(), 0777), 0);
  std::string m = bad(open_dir + "/h.sock");
  EXPECT_NE(m.find(open_dir + " is writable by others (mode 0777"), std::string::npos) << m;
  ASSERT_EQ(::mkdir((open_dir + "/mine").c_str(), 0700), 0);
  m = bad(open_dir + "/mine/h.sock");
  EXPECT_NE(m.find(open_dir + " is writable by others"), std::string::npos) << m;
  // Sticky, but the socket's own directory: others may still create there.
  ASSERT_EQ(::chmod(open_dir.c_str(), 01777), 0);
  EXPECT_TRUE(checkSocketPlace(open_dir + "/mine/h.sock").ok());
  EXPECT_NE(bad(open_dir + "/h.sock").find("writable by others (mode 1777"), std::string::npos);
  // Not an abstract name, not relative, not nowhere.
  EXPECT_NE(bad("@siphon-handover").find("absolute path"), std::string::npos);
  EXPECT_NE(bad("handover.sock").find("absolute path"), std::string::npos);
  EXPECT_NE(bad(dir_ + "/missing/h.sock").find("No such file or directory"), std::string::npos);
  // A directory of another uid (root only can make one).
  if (::geteuid() == 0) {
    const std::string theirs = dir_ + "/theirs";
    ASSERT_EQ(::mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    EXPECT_NE(bad(theirs + "/h.sock").find("belongs to uid 65534"), std::string::npos);
  }
}

// An imported session's limits: what a Hello may get, whatever the state
// says (protocol::clampLimits), and the receive windows within bounds.
TEST_F(HandoverChannelTest, AnImportedSessionsLimitsAreClampedAsAHellos) {
  v1::AgentState state;
  v1::SessionState& wild = *state.add_sessions()->mutable_protocol();
  wild.set_max_frame_size(1);
  wild.set_initial_stream_window(1u << 30);
  wild.set_max_streams(0);
  wild.set_max_pending_requests(0xffffffffu);
  wild.set_replay_buffer_bytes(1ull << 60);
  wild.set_keepalive_interval_ms(0);
  wild.set_keepalive_timeout_ms(1);
  wild.set_session_grace_ms(1ull << 50);
  wild.set_max_read_size(0xffffffffu);
  wild.set_max_stream_window(0xffffffffu);
  wild.set_window_growth_budget(1ull << 62);
  v1::SessionState& sane = *state.add_sessions()->mutable_protocol();
  const protocol::SessionLimits defaults;
  sane.set_max_frame_size(defaults.max_frame_size);
  sane.set_initial_stream_window(defaults.initial_stream_window);
  sane.set_max_streams(defaults.max_streams);
  sane.set_max_pending_requests(defaults.max_pending_requests);
  sane.set_replay_buffer_bytes(defaults.replay_buffer_bytes);
  sane.set_keepalive_interval_ms(defaults.keepalive_interval.count());
  sane.set_keepalive_timeout_ms(defaults.keepalive_timeout.count());
  sane.set_session_grace_ms(defaults.session_grace.count());
  sane.set_max_read_size(defaults.max_read_size);
  sane.set_max_stream_window(defaults.max_stream_window);
  sane.set_window_growth_budget(defaults.window_growth_budget);
  const v1::SessionState before = sane;

  clampImportedLimits(&state);
  const v1::SessionState& w = state.sessions(0).protocol();
  EXPECT_EQ(w.max_frame_size(), protocol::kMinFrameSize);
  EXPECT_EQ(w.initial_stream_window(), protocol::kMaxStreamWindowCeiling);
  EXPECT_EQ(w.max_streams(), 1u);
  EXPECT_EQ(w.max_pending_requests(), protocol::kMaxPendingRequestsCeiling);
  EXPECT_EQ(w.replay_buffer_bytes(), protocol::kMaxSessionBufferCeiling);
  EXPECT_EQ(w.keepalive_interval_ms(), uint64_t(protocol::kMinKeepaliveInterval.count()));
  EXPECT_EQ(w.keepalive_timeout_ms(), uint64_t(2 * protocol::kMinKeepaliveInterval.count()));
  EXPECT_EQ(w.session_grace_ms(), uint64_t(protocol::kMaxSessionGrace.count()));
  EXPECT_EQ(w.max_read_size(), protocol::kMinFrameSize - protocol::kReadSizeHeadroom);
  EXPECT_EQ(w.max_stream_window(), protocol::kMaxStreamWindowCeiling);
  EXPECT_EQ(w.window_growth_budget(), defaults.window_growth_budget);
  // What an agent wrote is left as it was.
  EXPECT_EQ(state.sessions(1).protocol().SerializeAsString(), before.SerializeAsString());
}

}  // namespace
}  // namespace siphon::agent::handover
