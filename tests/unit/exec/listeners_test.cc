// /proc/net/tcp{,6} as the kernel writes it (lines copied from this
// kernel's files), and the same for a listener the test makes itself.
#include "exec/listeners.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace siphon::exec {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;

constexpr char kTcp[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "1167 1 00000000d593826b 100 0 0 10 0\n"
    "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 "
    "1168 1 00000000d593826b 100 0 0 10 0\n"
    // An established connection is not a listener.
    "   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 "
    "1169 1 00000000d593826b 20 4 30 10 -1\n"
    "   3: 0A00FBFF:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "1170 1 00000000d593826b 100 0 0 10 0\n"
    "   4: garbage\n";

constexpr char kTcp6[] =
    "  sl  local_address                         remote_address                        st "
    "tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:E301 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000     0        0 17078 1 00000000d12fa540 100 0 0 10 "
    "0\n"
    "   1: 00000000000000000000000001000000:D2F1 00000000000000000000000000000000:0000 0A "
    "00000000:00000000 00:00000000 00000000     0        0 17077 1 00000000bfadb834 100 0 0 10 "
    "0\n";

TEST(ListenersTest, TheListeningSocketsOfTcp) {
  EXPECT_THAT(parseListeners(kTcp, false),
              ElementsAre(Listener{"0.0.0.0", 2024, false}, Listener{"127.0.0.1", 8080, false},
                          Listener{"255.251.0.10", 80, false}));
}

TEST(ListenersTest, TheListeningSocketsOfTcp6) {
  EXPECT_THAT(parseListeners(kTcp6, true),
              ElementsAre(Listener{"::", 58113, true}, Listener{"::1", 54001, true}));
}

TEST(ListenersTest, AWildcardIsReachedOnItsLoopback) {
  EXPECT_EQ((Listener{"0.0.0.0", 1, false}.dialAddress()), "127.0.0.1");
  EXPECT_EQ((Listener{"::", 1, true}.dialAddress()), "::1");
  EXPECT_EQ((Listener{"198.18.0.1", 1, false}.dialAddress()), "198.18.0.1");
}

TEST(ListenersTest, NothingFromAnEmptyOrForeignText) {
  EXPECT_TRUE(parseListeners("", false).empty());
  EXPECT_TRUE(parseListeners("not a proc file\nat all\n", true).empty());
  // A v4 line read as v6 has the wrong address width.
  EXPECT_TRUE(parseListeners(kTcp, true).empty());
}

TEST(ListenersTest, AListenerOfThisProcessIsFound) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  std::stringstream text;
  text << std::ifstream("/proc/self/net/tcp").rdbuf();
  EXPECT_THAT(parseListeners(text.str(), false),
              Contains(Listener{"127.0.0.1", ntohs(a.sin_port), false}));
  ::close(fd);
}

}  // namespace
}  // namespace siphon::exec
