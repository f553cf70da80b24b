// What the `siphon fs mount` tests share (mount_test.cc, fault_test.cc): a
// "pod" whose root is a prepared directory (a process in its own network
// and mount namespaces, chrooted there), the real siphon-agent targeting it
// by PID, and the real `siphon fs mount` serving it at a local directory.
//
// Every kernel object has a unique name and an RAII owner (the mount too:
// the mount process is killed, auto_unmount unmounts, and TearDown detaches
// what is left); without root every test skips with the reason. A test that
// includes this defines SIPHON_AGENT_BIN and SIPHON_CLI_BIN (CMake passes
// the binaries' paths).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"

namespace siphon::fuse_test {

using namespace siphon::harness;  // NOLINT: test header

inline constexpr const char* kSkipReason =
    "needs root: /dev/fuse, network and mount namespaces, a chrooted pod and siphon-agent";

inline bool isMounted(const std::string& path) {
  return readFile("/proc/self/mountinfo").find(" " + path + " ") != std::string::npos;
}

inline void writeHost(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// Runs `script` with sh -c, the given words as $1, $2...
inline Result sh(const std::string& script, const std::vector<std::string>& args = {}) {
  std::vector<std::string> argv = {"sh", "-c", script, "sh"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

// Runs `fn` with the calling thread in the named network namespace ("":
// ours, as it is): a process forked there (an agent, the CLI) lives in that
// namespace, and in the host's mount namespace, unlike under `ip netns
// exec`, which makes a mount namespace of its own where the FUSE mount
// would be out of the test's sight.
template <typename Fn>
void inNetnsOrHere(const std::string& netns, Fn fn) {
  if (netns.empty()) {
    fn();
  } else {
    inNetns(netns, fn);
  }
}

class MountFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << kSkipReason;
    unshare_ = firstExisting({"/usr/bin/unshare", "/bin/unshare"});
    chroot_ = firstExisting({"/usr/sbin/chroot", "/sbin/chroot", "/usr/bin/chroot"});
    if (unshare_.empty() || chroot_.empty() || access("/bin/busybox", X_OK) != 0 ||
        access("/dev/fuse", R_OK | W_OK) != 0 ||
        firstExisting({"/usr/bin/fusermount3", "/bin/fusermount3"}).empty()) {
      GTEST_SKIP() << "needs unshare, chroot, a static /bin/busybox, /dev/fuse and fusermount3";
    }
    dir_.emplace();
    token_ = "tok-" + randomHex(32);
    token_file_ = dir_->file("token", token_ + "\n");
    mnt_ = dir_->path() + "/mnt";
    std::filesystem::create_directories(mnt_);
    root_ = dir_->path() + "/root";
    netns_.emplace();
    ASSERT_TRUE(netns_->created());
    ASSERT_NO_FATAL_FAILURE(startPod(root_, *netns_, &pod_));
  }

  void TearDown() override {
    if (HasFailure() && mount_) {
      mount_->signal(SIGTERM);
      (void)mount_->finish();
      std::cerr << "--- mount stderr\n" << mount_->err << "---\n";
    }
    mount_.reset();
    if (!mnt_.empty() && isMounted(mnt_)) {
      (void)run({"fusermount3", "-uz", mnt_});
      (void)run({"umount", "-l", mnt_});
    }
    if (HasFailure() && agent_) std::cerr << "--- agent log\n" << agent_->log() << "---\n";
  }

  // A pod: `root` made (bin with busybox, proc, etc, tmp, data) and a
  // process chrooted there in `netns` and a mount namespace of its own,
  // running once /proc/PID/root is `root`.
  void startPod(const std::string& root, const NetNs& netns, Child* pod) {
    for (const char* d : {"bin", "proc", "etc", "tmp", "data"}) {
      std::filesystem::create_directories(root + "/" + d);
    }
    std::filesystem::copy_file("/bin/busybox", root + "/bin/busybox");
    chmod((root + "/bin/busybox").c_str(), 0755);
    *pod = spawn({"ip", "netns", "exec", netns.name(), unshare_, "--mount", "--propagation",
                  "private", chroot_, root, "/bin/busybox", "sh", "-c",
                  "/bin/busybox mount -t proc proc /proc && exec /bin/busybox sleep 600"},
                 std::nullopt, -1, -1);
    ASSERT_GT(pod->pid(), 0);
    // Running chrooted once /proc/PID/root is the pod's root.
    const std::string proc = "/proc/" + std::to_string(pod->pid());
    const auto deadline = Clock::now() + kProcessDeadline;
    std::error_code ec;
    while (Clock::now() < deadline &&
           !(std::filesystem::read_symlink(proc + "/root", ec) == root &&
             readFile(proc + "/cmdline").find("sleep") != std::string::npos)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // An agent serving `pod` with `--fs-mode fs_mode` and the `extra` flags,
  // listening on 127.0.0.1:0 of `netns` ("": ours); its log is
  // `log_name` in the test's directory.
  void launchAgent(std::optional<Agent>* agent, std::string* endpoint, pid_t pod,
                   const std::string& fs_mode, const std::vector<std::string>& extra = {},
                   const std::string& netns = "", const std::string& log_name = "agent.log") {
    std::vector<std::string> args = {
        "--listen",  "127.0.0.1:0", "--token-file",           token_file_,
        "--fs-mode", fs_mode,       "--first-client-timeout", "30s"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"targeted", "--pid", std::to_string(pod)});
    inNetnsOrHere(netns, [&] { agent->emplace(args, cleanEnv(), dir_->path() + "/" + log_name); });
    ASSERT_TRUE((*agent)->ready(endpoint));
  }

  void startAgent(const std::string& fs_mode) {
    ASSERT_NO_FATAL_FAILURE(launchAgent(&agent_, &endpoint_, pod_.pid(), fs_mode));
  }

  std::vector<std::string> cliArgs(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {SIPHON_CLI_BIN, "--agent",   endpoint_, "--token-file",
                                     token_file_,    "--timeout", "3s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Starts `argv` (a `siphon ... fs mount mnt_ ...`) in `netns` ("": ours)
  // and waits for its mounted line.
  void startMount(const std::vector<std::string>& argv, const std::string& netns = "") {
    inNetnsOrHere(netns, [&] { mount_.emplace(argv, cleanEnv()); });
    ASSERT_TRUE(mount_->readUntil([](const std::string& out, const std::string&) {
      return out.find('\n') != std::string::npos;
    })) << "no mounted line; stderr: "
        << mount_->err;
    EXPECT_THAT(mount_->out, ::testing::HasSubstr("mounted "));
    EXPECT_THAT(mount_->out, ::testing::HasSubstr(" at " + mnt_ + " ("));
    ASSERT_TRUE(isMounted(mnt_));
  }

  // Starts `siphon fs mount` and waits for its mounted line.
  void mount(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"fs", "mount", mnt_};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_NO_FATAL_FAILURE(startMount(cliArgs(args)));
  }

  std::string root_, mnt_, token_, token_file_, unshare_, chroot_, endpoint_;
  std::optional<TempDir> dir_;
  std::optional<NetNs> netns_;
  Child pod_;
  std::optional<Agent> agent_;
  std::optional<Proc> mount_;
};

}  // namespace siphon::fuse_test
