// Address helpers of outgoing connections, and unix paths resolved inside a
// root: a temporary directory plays the target's root (openat2 needs no
// privilege), with a socket inside it, one outside it, and symlinks that
// try to leave.
#include "agent/outgoing/address.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "siphon/status.h"

namespace siphon::agent::outgoing {
namespace {

TEST(AddressTest, IpLiteralsAndTheirText) {
  auto v4 = ipAddress("10.0.0.1", 80);
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(v4->family(), AF_INET);
  EXPECT_EQ(formatAddress(*v4), "10.0.0.1:80");
  auto v6 = ipAddress("::1", 443);
  ASSERT_TRUE(v6.has_value());
  EXPECT_EQ(formatAddress(*v6), "[::1]:443");
  auto bracketed = ipAddress("[fe80::1]", 1);
  ASSERT_TRUE(bracketed.has_value());
  EXPECT_EQ(bracketed->family(), AF_INET6);
  EXPECT_FALSE(ipAddress("db.svc.cluster.local", 5432).has_value());
  EXPECT_FALSE(ipAddress("", 1).has_value());
  EXPECT_FALSE(ipAddress("10.0.0.256", 1).has_value());
}

TEST(AddressTest, V4MappedForADualStackSocket) {
  auto v4 = *ipAddress("10.1.2.3", 53);
  auto mapped = forFamily(v4, AF_INET6);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->family(), AF_INET6);
  // Printed and sent on the wire as the IPv4 address it is.
  EXPECT_EQ(formatAddress(*mapped), "10.1.2.3:53");
  EXPECT_EQ(toProto(*mapped).ip(), "10.1.2.3");
  EXPECT_EQ(toProto(*mapped).port(), 53u);
  auto back = forFamily(*mapped, AF_INET);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->family(), AF_INET);
  EXPECT_EQ(errorCodeOf(forFamily(*ipAddress("::1", 1), AF_INET).status()), v1::INVALID_ARGUMENT);
}

TEST(AddressTest, WireFormRoundTrip) {
  v1::SocketAddress w;
  w.set_ip("fd00::5");
  w.set_port(8080);
  auto a = fromProto(w);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(formatAddress(*a), "[fd00::5]:8080");
  EXPECT_EQ(toProto(*a).ip(), "fd00::5");
  w.set_ip("not-an-ip");
  EXPECT_EQ(errorCodeOf(fromProto(w).status()), v1::INVALID_ARGUMENT);
  w.set_ip("1.2.3.4");
  w.set_port(70000);
  EXPECT_EQ(errorCodeOf(fromProto(w).status()), v1::INVALID_ARGUMENT);
}

TEST(AddressTest, AbstractUnixNames) {
  auto a = abstractUnixAddress("@my-socket");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(formatAddress(*a), "@my-socket");
  const auto& un = reinterpret_cast<const sockaddr_un&>(a->storage);
  EXPECT_EQ(un.sun_path[0], '\0');
  EXPECT_EQ(a->len, offsetof(sockaddr_un, sun_path) + 1 + 9);
  EXPECT_EQ(errorCodeOf(abstractUnixAddress("@").status()), v1::INVALID_ARGUMENT);
  EXPECT_EQ(errorCodeOf(abstractUnixAddress("@" + std::string(108, 'x')).status()),
            v1::INVALID_ARGUMENT);
  EXPECT_TRUE(abstractUnixAddress("@" + std::string(107, 'x')).ok());
}

TEST(AddressTest, SocketErrorsAreTypedAndNamed) {
  v1::Error e = socketError(ECONNREFUSED, "connect 10.0.0.1:80 from the target");
  EXPECT_EQ(e.code(), v1::UNAVAILABLE);
  EXPECT_EQ(e.message(), "connect 10.0.0.1:80 from the target: Connection refused");
  EXPECT_EQ(e.errno_value(), ECONNREFUSED);
  EXPECT_EQ(socketError(EHOSTUNREACH, "x").code(), v1::UNAVAILABLE);
  EXPECT_EQ(socketError(ETIMEDOUT, "x").code(), v1::UNAVAILABLE);
  EXPECT_EQ(socketError(ENOENT, "x").code(), v1::NOT_FOUND);
  EXPECT_EQ(socketError(EACCES, "x").code(), v1::PERMISSION_DENIED);
  EXPECT_EQ(socketError(EPROTOTYPE, "x").code(), v1::INVALID_ARGUMENT);
  EXPECT_EQ(socketError(EMFILE, "x").code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_EQ(socketError(EIO, "x").code(), v1::ERRNO);
}

// root/run/app.sock (listening), root/run/link.sock -> /run/app.sock,
// root/escape.sock -> <dir>/outside.sock (a host path), root/up -> ../../..,
// and <dir>/outside.sock (listening) outside the root.
class InRootTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/siphon-outgoing-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    root_ = dir_ + "/root";
    std::filesystem::create_directories(root_ + "/run");
    inside_ = listenAt(root_ + "/run/app.sock");
    outside_ = listenAt(dir_ + "/outside.sock");
    std::filesystem::create_symlink("/run/app.sock", root_ + "/run/link.sock");
    std::filesystem::create_symlink(dir_ + "/outside.sock", root_ + "/escape.sock");
    std::filesystem::create_symlink("../../../../../..", root_ + "/up");
    root_fd_ = UniqueFd(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_fd_.valid());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  static UniqueFd listenAt(const std::string& path) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << path;
    EXPECT_EQ(::listen(fd.get(), 4), 0);
    return fd;
  }

  // Connects through the /proc/self/fd route; true when `listener` got it.
  bool reaches(int path_fd, int listener) {
    UniqueFd c(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    SockAddr a = procFdUnixAddress(path_fd);
    if (::connect(c.get(), a.get(), a.len) != 0) return false;
    UniqueFd accepted(::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    return accepted.valid();
  }

  std::string dir_, root_;
  UniqueFd inside_, outside_, root_fd_;
};

TEST_F(InRootTest, APathInsideTheRootIsReached) {
  auto fd = openInRoot(root_fd_.get(), "/run/app.sock");
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE(reaches(fd->get(), inside_.get()));
  auto relative = openInRoot(root_fd_.get(), "run/app.sock");
  ASSERT_TRUE(relative.ok()) << relative.status();
  EXPECT_TRUE(reaches(relative->get(), inside_.get()));
}

TEST_F(InRootTest, SymlinksResolveInsideTheRoot) {
  // An absolute symlink means the root's /run, not the agent's.
  auto link = openInRoot(root_fd_.get(), "/run/link.sock");
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_TRUE(reaches(link->get(), inside_.get()));
  // ".." never climbs above the root.
  auto up = openInRoot(root_fd_.get(), "/up/run/app.sock");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(reaches(up->get(), inside_.get()));
}

TEST_F(InRootTest, NothingOutsideTheRootIsReached) {
  auto escape = openInRoot(root_fd_.get(), "/escape.sock");
  EXPECT_EQ(errorCodeOf(escape.status()), v1::ERRNO) << escape.status();
  EXPECT_EQ(errnoOf(escape.status()), ENOENT);
  auto dotdot = openInRoot(root_fd_.get(), "/../../../../" + dir_ + "/outside.sock");
  EXPECT_EQ(errnoOf(dotdot.status()), ENOENT) << dotdot.status();
  auto relative = openInRoot(root_fd_.get(), "../outside.sock");
  EXPECT_EQ(errnoOf(relative.status()), ENOENT) << relative.status();
}

TEST_F(InRootTest, BadPaths) {
  EXPECT_EQ(errorCodeOf(openInRoot(root_fd_.get(), "").status()), v1::INVALID_ARGUMENT);
  EXPECT_EQ(errorCodeOf(openInRoot(root_fd_.get(), std::string("a\0b", 3)).status()),
            v1::INVALID_ARGUMENT);
  EXPECT_EQ(errnoOf(openInRoot(root_fd_.get(), "/run/missing.sock").status()), ENOENT);
}

}  // namespace
}  // namespace siphon::agent::outgoing
