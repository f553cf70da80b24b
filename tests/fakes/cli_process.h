// The `siphon` binary run as a user runs it, for the CLI's command tests:
// its stdout and stderr read as it runs, so a test waits for a line the
// way a script would. Plus the loopback helpers those tests share.
//
// Threads: one test thread drives a CliProcess. Include after
// tests/privileged/harness/pod_harness.h's SIPHON_AGENT_BIN is defined.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"
#include "tests/privileged/harness/traffic.h"

namespace siphon::fakes {

class CliProcess {
 public:
  // A hang guard, not a timing assertion.
  static constexpr auto kWait = std::chrono::seconds(20);

  // Spawns `argv` (argv[0]: the binary) with a clean environment. Without
  // `read_stdout` its stdout is left unread until readStdout() or finish().
  explicit CliProcess(const std::vector<std::string>& argv, bool read_stdout = true)
      : read_stdout_(read_stdout) {
    auto [out_r, out_w] = harness::makePipe();
    auto [err_r, err_w] = harness::makePipe();
    child_ = harness::spawn(argv, harness::cleanEnv(), out_w.get(), err_w.get());
    out_ = std::move(out_r);
    err_ = std::move(err_r);
  }

  // Reads stderr (and stdout, unless told not to) until `done()` holds or
  // kWait passed; whether it holds.
  bool readUntil(const std::function<bool()>& done) {
    const auto deadline = harness::Clock::now() + kWait;
    while (!done() && harness::Clock::now() < deadline) {
      if (!poll(100)) break;
    }
    return done();
  }
  void readStdout() { read_stdout_ = true; }
  void signal(int sig) { ::kill(child_.pid(), sig); }
  // Reads both to EOF; the exit code (-1: still running after kWait).
  int finish() {
    read_stdout_ = true;
    const auto deadline = harness::Clock::now() + kWait;
    while ((out_.get() >= 0 || err_.get() >= 0) && harness::Clock::now() < deadline) {
      if (!poll(100)) break;
    }
    return child_.waitUntil(deadline).value_or(-1);
  }

  std::string out, err;

 private:
  bool poll(int ms) {
    pollfd fds[2] = {{read_stdout_ ? out_.get() : -1, POLLIN, 0}, {err_.get(), POLLIN, 0}};
    if (fds[0].fd < 0 && fds[1].fd < 0) return false;
    int n = ::poll(fds, 2, ms);
    if (n < 0 && errno != EINTR) return false;
    std::string* sinks[2] = {&out, &err};
    harness::Fd* owners[2] = {&out_, &err_};
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[65536];
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        owners[i]->reset();
      }
    }
    return true;
  }

  bool read_stdout_;
  harness::Child child_;
  harness::Fd out_, err_;
};

// A port nothing listens on.
inline std::string closedAddress() {
  harness::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

// `n` bytes of harness::Pattern(seed).
inline std::string pattern(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  harness::Pattern(seed).fill(s.data(), n);
  return s;
}

}  // namespace siphon::fakes
