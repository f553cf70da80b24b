// Loads the probe socket filter into the running kernel, attaches it to a real
// UDP socket on loopback and counts real datagrams. Needs root; skips without.
#include "loader/probe_program.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "siphon/status.h"

namespace siphon::bpf {
namespace {

// Owns a file descriptor and closes it on every path, failed assertions
// included.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// A UDP socket bound to 127.0.0.1 on a port the kernel picks.
struct UdpSocket {
  Fd fd;
  uint16_t port;
};

UdpSocket udpSocket() {
  Fd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  EXPECT_GE(fd.get(), 0) << std::strerror(errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0)
      << std::strerror(errno);
  // Only so that a lost datagram fails the test instead of hanging it; no
  // result depends on this timeout.
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  EXPECT_EQ(setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)), 0);
  return UdpSocket{std::move(fd), ntohs(addr.sin_port)};
}

// Sends `size` bytes from `from` to 127.0.0.1:`port`.
void sendDatagram(const UdpSocket& from, uint16_t port, size_t size) {
  std::vector<char> payload(size, 'x');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(port);
  ASSERT_EQ(sendto(from.fd.get(), payload.data(), payload.size(), 0,
                   reinterpret_cast<sockaddr*>(&to), sizeof(to)),
            static_cast<ssize_t>(size))
      << std::strerror(errno);
}

// Receives one datagram and returns its size. Once a datagram is received,
// the filter has run for it: socket filters run before the queueing.
ssize_t receiveDatagram(const UdpSocket& on) {
  char buf[2048];
  ssize_t n = recv(on.fd.get(), buf, sizeof(buf), 0);
  EXPECT_GE(n, 0) << std::strerror(errno);
  return n;
}

class ProbeProgramTest : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "needs root (CAP_BPF/CAP_SYS_ADMIN) to load BPF programs";
    }
  }
};

TEST_F(ProbeProgramTest, CountsDatagramsQueuedToAttachedSocket) {
  absl::StatusOr<std::unique_ptr<ProbeProgram>> program = ProbeProgram::load({});
  ASSERT_TRUE(program.ok()) << program.status();
  UdpSocket receiver = udpSocket();
  UdpSocket sender = udpSocket();

  // Queued before the attach: the filter never sees it.
  sendDatagram(sender, receiver.port, 5);
  ASSERT_EQ(receiveDatagram(receiver), 5);
  absl::StatusOr<uint64_t> before = (*program)->count();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, 0u);

  ASSERT_TRUE((*program)->attachToSocket(receiver.fd.get()).ok());
  for (size_t size : {1u, 100u, 1000u}) {
    sendDatagram(sender, receiver.port, size);
    // The filter keeps whole datagrams.
    ASSERT_EQ(receiveDatagram(receiver), static_cast<ssize_t>(size));
  }

  absl::StatusOr<ProbeCounters> counters = (*program)->counters();
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_EQ(counters->packets, 3u);
  EXPECT_EQ(counters->payload_bytes, 1101u);
  EXPECT_EQ(counters->ignored, 0u);
  absl::StatusOr<uint64_t> after = (*program)->count();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, 3u);
}

TEST_F(ProbeProgramTest, SourcePortOptionCountsOnlyThatSender) {
  UdpSocket receiver = udpSocket();
  UdpSocket counted = udpSocket();
  UdpSocket other = udpSocket();
  absl::StatusOr<std::unique_ptr<ProbeProgram>> program =
      ProbeProgram::load({.source_port = counted.port});
  ASSERT_TRUE(program.ok()) << program.status();
  ASSERT_TRUE((*program)->attachToSocket(receiver.fd.get()).ok());

  sendDatagram(counted, receiver.port, 10);
  sendDatagram(other, receiver.port, 20);
  sendDatagram(other, receiver.port, 30);
  sendDatagram(counted, receiver.port, 40);
  sendDatagram(other, receiver.port, 50);
  for (int i = 0; i < 5; ++i) ASSERT_GT(receiveDatagram(receiver), 0);

  absl::StatusOr<ProbeCounters> counters = (*program)->counters();
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_EQ(counters->packets, 2u);
  EXPECT_EQ(counters->payload_bytes, 50u);
  EXPECT_EQ(counters->ignored, 3u);
}

TEST_F(ProbeProgramTest, DetachStopsCounting) {
  absl::StatusOr<std::unique_ptr<ProbeProgram>> program = ProbeProgram::load({});
  ASSERT_TRUE(program.ok()) << program.status();
  UdpSocket receiver = udpSocket();
  UdpSocket sender = udpSocket();
  ASSERT_TRUE((*program)->attachToSocket(receiver.fd.get()).ok());

  sendDatagram(sender, receiver.port, 8);
  ASSERT_EQ(receiveDatagram(receiver), 8);
  absl::Status detached = (*program)->detachFromSocket(receiver.fd.get());
  ASSERT_TRUE(detached.ok()) << detached;
  sendDatagram(sender, receiver.port, 8);
  ASSERT_EQ(receiveDatagram(receiver), 8);

  absl::StatusOr<uint64_t> count = (*program)->count();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 1u);

  // Nothing left to detach.
  absl::Status again = (*program)->detachFromSocket(receiver.fd.get());
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_EQ(errnoOf(again), ENOENT) << again;
}

TEST_F(ProbeProgramTest, AttachToWhatIsNotASocketFailsWithTheErrno) {
  absl::StatusOr<std::unique_ptr<ProbeProgram>> program = ProbeProgram::load({});
  ASSERT_TRUE(program.ok()) << program.status();

  Fd not_socket(eventfd(0, EFD_CLOEXEC));
  ASSERT_GE(not_socket.get(), 0) << std::strerror(errno);
  absl::Status status = (*program)->attachToSocket(not_socket.get());
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(errnoOf(status), ENOTSOCK) << status;
  EXPECT_NE(std::string(status.message()).find("attach probe to socket fd"), std::string::npos)
      << status;

  status = (*program)->attachToSocket(-1);
  EXPECT_EQ(errnoOf(status), EBADF) << status;
}

}  // namespace
}  // namespace siphon::bpf
