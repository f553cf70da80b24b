// A scratch tree for the file tests, no root needed:
//
//   BASE/outside/secret     "host" content the tests must never read
//   BASE/root/              the directory used as the target's root
//
// openat2(RESOLVE_IN_ROOT) works unprivileged on any directory fd, so BASE/root
// stands in for /proc/PID/root.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "agent/common/unique_fd.h"

namespace siphon::agent::files::testing {

// How many of this process's fds (an in-process agent's among them) are
// open on `path`.
inline int fdsOpenOn(const std::string& path) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code rec;
    if (std::filesystem::read_symlink(e.path(), rec) == path) ++n;
  }
  return n;
}

inline std::string randomToken() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 16; ++i) out.push_back("0123456789abcdef"[rd() % 16]);
  return out;
}

class ScratchTree {
 public:
  ScratchTree() {
    std::string tmpl = "/tmp/siphon-files-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return;
    }
    base_ = tmpl;
    host_secret_ = "HOST-SECRET-" + randomToken();
    std::filesystem::create_directories(base_ + "/outside");
    std::filesystem::create_directories(base_ + "/root");
    write(base_ + "/outside/secret", host_secret_);
    root_fd_ = UniqueFd(::open((base_ + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    EXPECT_TRUE(root_fd_.valid()) << std::strerror(errno);
  }
  ~ScratchTree() {
    std::error_code ec;
    // Tests chmod things; make sure everything can go.
    if (!base_.empty()) std::filesystem::remove_all(base_, ec);
  }

  const std::string& base() const { return base_; }
  std::string root() const { return base_ + "/root"; }
  // Host path of a path inside the root.
  std::string inRoot(const std::string& p) const { return root() + "/" + p; }
  int rootFd() const { return root_fd_.get(); }
  const std::string& hostSecret() const { return host_secret_; }

  static void write(const std::string& path, const std::string& content) {
    std::ofstream(path, std::ios::binary) << content;
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void file(const std::string& in_root, const std::string& content) const {
    std::filesystem::create_directories(std::filesystem::path(inRoot(in_root)).parent_path());
    write(inRoot(in_root), content);
  }
  void dir(const std::string& in_root) const {
    std::filesystem::create_directories(inRoot(in_root));
  }
  void symlink(const std::string& in_root, const std::string& target) const {
    ASSERT_EQ(::symlink(target.c_str(), inRoot(in_root).c_str()), 0) << std::strerror(errno);
  }

 private:
  std::string base_;
  std::string host_secret_;
  UniqueFd root_fd_;
};

}  // namespace siphon::agent::files::testing
