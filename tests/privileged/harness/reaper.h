// What an aborted privileged test leaves behind, found and removed.
//
// A test killed by a signal, a timeout or a crash never runs its
// destructors: its named network namespaces stay mounted under
// /var/run/netns, and links or iptables chains it made outside a test
// namespace stay where it made them. So every such name carries the pid of
// the test process that made it:
//
//   network namespace  siphon-test-PID-HEX   (NetNs, pod_harness.h)
//   link               sxPID-HEX             (ownedLinkName(), 15 characters at most)
//   iptables chain     STEST_PID_HEX         (ownedChainName(), filter and nat tables)
//
// and the reaper removes those whose PID no longer runs. A live PID's
// objects are never touched, whoever it is (another test binary running at
// the same time, another build tree's run): at worst a PID reused since
// keeps a leftover until that process ends too.
//
// Links and namespaces a test makes inside a test namespace go with it, so
// reaping namespaces is most of the work. reapNamespaces() works on the
// machine's list; reapLinks() and reapChains() on the network namespace of
// the calling thread (the tests run them inside a scratch namespace).
//
// tests/privileged/harness/reap_leftovers.cc runs all three as the ctest
// fixture every privileged test requires (tests/CMakeLists.txt).
#pragma once

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tests/privileged/harness/pod_harness.h"

namespace siphon::harness {

inline constexpr std::string_view kNetnsPrefix = "siphon-test-";
inline constexpr std::string_view kLinkPrefix = "sx";
inline constexpr std::string_view kChainPrefix = "STEST_";

// A link name that carries our pid: "sx" + pid + "-" + hex, 15 characters
// (IFNAMSIZ - 1).
inline std::string ownedLinkName(pid_t pid = getpid()) {
  std::string name = std::string(kLinkPrefix) + std::to_string(pid) + "-";
  return name + randomHex(static_cast<int>(15 - name.size()));
}

// An iptables chain name that carries our pid (28 characters at most).
inline std::string ownedChainName(pid_t pid = getpid()) {
  return std::string(kChainPrefix) + std::to_string(pid) + "_" + randomHex(6);
}

// The pid in `name` after `prefix`, up to `sep`; nullopt when `name` is not
// of that form.
inline std::optional<pid_t> pidAfter(std::string_view name, std::string_view prefix, char sep) {
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  const size_t end = name.find(sep);
  if (end == 0 || end == std::string_view::npos || end + 1 == name.size()) return std::nullopt;
  pid_t pid = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + end, pid);
  if (ec != std::errc() || p != name.data() + end || pid <= 0) return std::nullopt;
  return pid;
}

// Whether `pid` runs (a zombie counts: its parent has not reaped it yet).
inline bool pidAlive(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// A pid that no process has now: a child that exited and was reaped.
inline pid_t deadPid() {
  for (;;) {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    if (pid < 0) return -1;
    waitpid(pid, nullptr, 0);
    if (!pidAlive(pid)) return pid;
  }
}

struct Reaped {
  std::vector<std::string> removed;  // "netns NAME", "link NAME", "chain TABLE/NAME"
  std::vector<std::string> errors;
};

// Deletes the named network namespaces of dead test processes.
inline void reapNamespaces(Reaped* out) {
  DIR* d = opendir("/var/run/netns");
  if (d == nullptr) return;  // none was ever made
  std::vector<std::string> dead;
  while (dirent* e = readdir(d)) {
    auto pid = pidAfter(e->d_name, kNetnsPrefix, '-');
    if (pid && !pidAlive(*pid)) dead.emplace_back(e->d_name);
  }
  closedir(d);
  for (const std::string& name : dead) {
    Result r = run({"ip", "netns", "del", name});
    if (r.exit_code == 0) {
      out->removed.push_back("netns " + name);
    } else {
      out->errors.push_back("netns " + name + ": " + r.err);
    }
  }
}

// Deletes the links of dead test processes in this thread's namespace
// (a veth's peer goes with it).
inline void reapLinks(Reaped* out) {
  Result list = run({"ip", "-o", "link", "show"});
  std::istringstream in(list.out);
  std::string line;
  while (std::getline(in, line)) {
    // "7: sx123-abcdef@sx123-012345: <BROADCAST,...": the name ends at ':' or '@'.
    const size_t start = line.find(": ");
    if (start == std::string::npos) continue;
    const size_t end = line.find_first_of(":@", start + 2);
    const std::string name = line.substr(start + 2, end - start - 2);
    auto pid = pidAfter(name, kLinkPrefix, '-');
    if (!pid || pidAlive(*pid)) continue;
    Result r = run({"ip", "link", "del", name});
    // The peer of a veth deleted just before is gone already.
    if (r.exit_code == 0) {
      out->removed.push_back("link " + name);
    } else if (r.err.find("Cannot find device") == std::string::npos) {
      out->errors.push_back("link " + name + ": " + r.err);
    }
  }
}

// Removes the iptables chains of dead test processes in this thread's
// namespace (filter and nat, IPv4 and IPv6): the rules that jump to them
// first, then the chains.
inline void reapChains(Reaped* out) {
  for (const char* tool : {"iptables", "ip6tables"}) {
    for (const char* table : {"filter", "nat"}) {
      Result rules = run({tool, "-w", "-t", table, "-S"});
      if (rules.exit_code != 0) continue;  // no such tool or table here
      std::vector<std::string> dead_chains;
      std::vector<std::vector<std::string>> jumps;
      std::istringstream in(rules.out);
      std::string line;
      auto isDead = [](const std::string& chain) {
        auto pid = pidAfter(chain, kChainPrefix, '_');
        return pid && !pidAlive(*pid);
      };
      while (std::getline(in, line)) {
        std::istringstream words(line);
        std::vector<std::string> w;
        for (std::string word; words >> word;) w.push_back(word);
        if (w.size() == 2 && w[0] == "-N" && isDead(w[1])) dead_chains.push_back(w[1]);
        if (w.size() > 2 && w[0] == "-A" && !isDead(w[1])) {
          for (size_t i = 2; i + 1 < w.size(); ++i) {
            if ((w[i] == "-j" || w[i] == "-g") && isDead(w[i + 1])) jumps.push_back(w);
          }
        }
      }
      for (std::vector<std::string> rule : jumps) {
        rule[0] = "-D";
        rule.insert(rule.begin(), {tool, "-w", "-t", table});
        Result r = run(rule);
        if (r.exit_code != 0) out->errors.push_back(std::string(tool) + " -D: " + r.err);
      }
      // Flush every dead chain before deleting any: they may jump to each other.
      for (const std::string& chain : dead_chains) run({tool, "-w", "-t", table, "-F", chain});
      for (const std::string& chain : dead_chains) {
        Result r = run({tool, "-w", "-t", table, "-X", chain});
        const std::string what = std::string("chain ") + tool + "/" + table + "/" + chain;
        if (r.exit_code == 0) {
          out->removed.push_back(what);
        } else {
          out->errors.push_back(what + ": " + r.err);
        }
      }
    }
  }
}

inline Reaped reapLeftovers() {
  Reaped out;
  reapNamespaces(&out);
  reapLinks(&out);
  reapChains(&out);
  return out;
}

}  // namespace siphon::harness
