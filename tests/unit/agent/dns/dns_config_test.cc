// RootFile and the root config source against a directory standing in for
// the target's root (openat2 needs no privilege).
#include "agent/dns/dns_config.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "agent/common/unique_fd.h"

namespace siphon::agent::dns {
namespace {

using ::testing::ElementsAre;

class DnsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "siphon-dns-root-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/etc");
    root_ = UniqueFd(::open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_.valid());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Writes a new file (a new inode, as editors and kubelet do).
  void write(const std::string& rel, const std::string& content) {
    std::string tmp = dir_ + "/" + rel + ".tmp";
    std::ofstream(tmp) << content;
    std::filesystem::rename(tmp, dir_ + "/" + rel);
  }

  std::string dir_;
  UniqueFd root_;
};

TEST_F(DnsConfigTest, ReadsTheFileAndNoticesChanges) {
  write("etc/resolv.conf", "nameserver 192.0.2.1\n");
  RootFile f(root_.get(), "/etc/resolv.conf", 1024);
  EXPECT_TRUE(f.refresh());
  EXPECT_TRUE(f.found());
  EXPECT_EQ(f.content(), "nameserver 192.0.2.1\n");
  EXPECT_FALSE(f.refresh()) << "unchanged";

  write("etc/resolv.conf", "nameserver 192.0.2.2\n");
  EXPECT_TRUE(f.refresh());
  EXPECT_EQ(f.content(), "nameserver 192.0.2.2\n");

  // Rewritten with the same bytes: nothing changed that matters.
  write("etc/resolv.conf", "nameserver 192.0.2.2\n");
  EXPECT_FALSE(f.refresh());

  std::filesystem::remove(dir_ + "/etc/resolv.conf");
  EXPECT_TRUE(f.refresh());
  EXPECT_FALSE(f.found());
  EXPECT_EQ(f.error().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(f.refresh());
}

TEST_F(DnsConfigTest, MissingAtFirst) {
  RootFile f(root_.get(), "/etc/hosts", 1024);
  EXPECT_TRUE(f.refresh()) << "the first refresh always counts";
  EXPECT_FALSE(f.found());
  EXPECT_EQ(f.content(), "");
}

TEST_F(DnsConfigTest, SymlinksResolveInsideTheRoot) {
  // An absolute symlink, as /etc/resolv.conf -> /run/systemd/resolve/...
  std::filesystem::create_directories(dir_ + "/run/resolve");
  write("run/resolve/stub.conf", "nameserver 192.0.2.53\n");
  std::filesystem::create_symlink("/run/resolve/stub.conf", dir_ + "/etc/resolv.conf");
  RootFile f(root_.get(), "/etc/resolv.conf", 1024);
  f.refresh();
  EXPECT_EQ(f.content(), "nameserver 192.0.2.53\n");

  // Escapes stay inside: ../../.. and absolute targets are the root's own.
  std::filesystem::create_symlink("../../../../../../../../etc/passwd", dir_ + "/etc/hosts");
  RootFile hosts(root_.get(), "/etc/hosts", 1024);
  hosts.refresh();
  EXPECT_FALSE(hosts.found()) << "the root has no etc/passwd; the host's must not be read";
}

TEST_F(DnsConfigTest, FifoIsNotReadAndDoesNotBlock) {
  ASSERT_EQ(::mkfifo((dir_ + "/etc/resolv.conf").c_str(), 0600), 0);
  RootFile f(root_.get(), "/etc/resolv.conf", 1024);
  f.refresh();
  EXPECT_FALSE(f.found());
  EXPECT_EQ(f.error().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(DnsConfigTest, ReadsAtMostMaxBytes) {
  write("etc/hosts", std::string(5000, 'x'));
  RootFile f(root_.get(), "/etc/hosts", 100);
  f.refresh();
  EXPECT_EQ(f.content().size(), 100u);
}

TEST_F(DnsConfigTest, SourceParsesBothFilesAndKeepsPointersWhileUnchanged) {
  write("etc/resolv.conf", "nameserver 192.0.2.1\nsearch pod.example\noptions ndots:3\n");
  write("etc/hosts", "10.0.0.1 a.example\n");
  auto source = makeRootConfigSource(root_.get());
  DnsConfig c1 = source->load();
  ASSERT_TRUE(c1.resolv && c1.hosts);
  EXPECT_THAT(c1.resolv->search, ElementsAre("pod.example"));
  EXPECT_EQ(c1.resolv->ndots, 3);
  EXPECT_TRUE(c1.hosts->lookup("a.example", Family::kAny).has_value());

  DnsConfig c2 = source->load();
  EXPECT_EQ(c1.resolv, c2.resolv);
  EXPECT_EQ(c1.hosts, c2.hosts);

  // A comment changes the file, not the configuration: same pointer.
  write("etc/resolv.conf", "# edited\nnameserver 192.0.2.1\nsearch pod.example\noptions ndots:3\n");
  EXPECT_EQ(source->load().resolv, c1.resolv);

  write("etc/resolv.conf", "nameserver 192.0.2.9\n");
  DnsConfig c3 = source->load();
  EXPECT_NE(c3.resolv, c1.resolv);
  EXPECT_EQ(c3.resolv->nameservers.front().address, "192.0.2.9");
  EXPECT_EQ(c3.hosts, c1.hosts);
}

TEST_F(DnsConfigTest, SourceWithoutFilesGivesDefaults) {
  auto source = makeRootConfigSource(root_.get());
  DnsConfig c = source->load();
  ASSERT_TRUE(c.resolv && c.hosts);
  EXPECT_EQ(*c.resolv, defaultResolvConf());
  EXPECT_TRUE(c.hosts->entries().empty());
}

TEST_F(DnsConfigTest, BadRootFdGivesDefaults) {
  auto source = makeRootConfigSource(-1);
  DnsConfig c = source->load();
  ASSERT_TRUE(c.resolv && c.hosts);
  EXPECT_EQ(*c.resolv, defaultResolvConf());
}

}  // namespace
}  // namespace siphon::agent::dns
