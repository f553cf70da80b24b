// What `siphon exec` decides without touching the system: where each of the
// program's connections is made (the target, through the agent, or this
// machine), the program's environment (the local one overlaid by the
// target's), and the exit code for how the program ended. Pure functions and
// values, unit-tested (tests/unit/exec/policy_test.cc).
#pragma once

#include <array>
#include <map>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::exec {

enum class Via { kTarget, kLocal };

// "CIDR[:PORT]" as --local/--remote take it: 10.0.0.0/8, 10.1.2.3 (a /32),
// 10.0.0.0/8:5432, fd00::/8, [fd00::/8]:80, [::1]:6379.
struct AddressRule {
  bool v6 = false;
  std::array<uint8_t, 16> prefix{};  // network byte order; IPv4 in the first 4
  int bits = 0;
  uint16_t port = 0;  // 0: every port
  Via via = Via::kTarget;
  std::string text;  // as given
};
absl::StatusOr<AddressRule> parseAddressRule(std::string_view text, Via via);

// Where a connection to ADDRESS:PORT goes. The most specific rule wins: the
// longest prefix, then a rule with a port over one without; a tie between
// --local and --remote goes to --local (this machine: nothing leaves it by
// surprise). With no rule, loopback is local unless `remote_loopback`, and
// everything else goes to the target.
class Routes {
 public:
  Routes() = default;
  Routes(std::vector<AddressRule> rules, bool remote_loopback)
      : rules_(std::move(rules)), remote_loopback_(remote_loopback) {}
  // `address` is numeric (IPv4 or IPv6, as originalDestination() gives it);
  // an address that does not parse goes to the target.
  Via route(std::string_view address, uint16_t port) const;

 private:
  std::vector<AddressRule> rules_;
  bool remote_loopback_ = false;
};

// The target's resolv.conf as the program is shown it. A nameserver on the
// target's loopback (a DNS sidecar, a local cache at 127.0.0.x or ::1)
// would be the program's own loopback, which UDP never leaves: it is
// replaced by a stand-in address (198.18.0.53 on, fd5e:5e00::53 on: ranges
// no pod uses), which the program's namespace routes to siphon like any
// other, and siphon sends what goes there to the nameserver it stands for,
// from the target. Other lines are kept as they are.
struct ShownResolvConf {
  std::string text;
  std::map<std::string, std::string> stand_ins;  // stand-in -> the target's address
};
ShownResolvConf standInNameservers(std::string_view resolv_conf);

// The names that stay local even when the target has them: the developer's
// own tools and terminal.
inline constexpr std::array<std::string_view, 5> kKeepLocal = {"PATH", "HOME", "TERM", "DISPLAY",
                                                                "SSH_AUTH_SOCK"};

struct EnvOverlay {
  std::vector<std::string> include;  // fnmatch globs on the target's names; none: all
  std::vector<std::string> exclude;  // globs: these stay local
  std::vector<std::string> set;      // NAME=VALUE, over both
};

// `local` ("NAME=VALUE" each, as environ) overlaid by `target` (name, value
// pairs): the target's value wins except for kKeepLocal and excluded names,
// or names no include glob matches; then every `set` entry. Sorted by name.
std::vector<std::string> overlayEnvironment(
    const std::vector<std::string>& local,
    const std::vector<std::pair<std::string, std::string>>& target, const EnvOverlay& overlay);

// "NAME=VALUE" with a non-empty name without '='; InvalidArgument otherwise.
absl::Status checkEnvAssignment(std::string_view text);

// The exit code of a program from its wait(2) status: its own code, or
// 128+N when signal N killed it (as a shell reports it).
int exitCodeOf(int wait_status);

}  // namespace siphon::exec
