// What `siphon exec` decides without touching the system: where each of the
// program's connections is made (the target, through the agent, or this
// machine), the program's environment (the local one overlaid by the
// target's), and the exit code for how the program ended. Pure functions and
// values, unit-tested (tests/unit/exec/policy_test.cc).
#pragma once

#include <array>
#include <cstdint>
#include <map>
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
// from the target. Other lines are kept as they are. With no nameserver
// line (an empty text: the target has no resolv.conf) the resolver asks
// 127.0.0.1 (glibc, musl and c-ares alike): the target's, so a stand-in for
// it is added.
struct ShownResolvConf {
  std::string text;
  std::map<std::string, std::string> stand_ins;  // stand-in -> the target's address
};
ShownResolvConf standInNameservers(std::string_view resolv_conf);

// Whether the target's resolv.conf or hosts that could not be read with
// `err` is, to libc, as if absent (no hosts entries; the resolver's
// defaults): glibc's res_init ignores a resolv.conf that fails to open with
// these (the file system's contents, which stay), and nss_files skips a
// hosts it cannot open. Other errors (EIO, ENOMEM, EMFILE...) are failures
// of the moment, which libc reports to the program.
bool absentToTheResolver(int err);

// The names that stay local even when the target has them: the developer's
// own tools and terminal.
inline constexpr std::array<std::string_view, 5> kKeepLocal = {"PATH", "HOME", "TERM", "DISPLAY",
                                                               "SSH_AUTH_SOCK"};

// Variables whose value chooses code that runs on this machine, as the
// developer, with their kubeconfig and keys in reach (issue 40): the
// dynamic loader's, a shell's start-up files, prompts and exported
// functions, interpreters' preloads and search paths, and the commands
// tools run for an editor, a pager or a password. A pod sets them (or its
// process rewrites its own environ, which the agent reads) as it likes, so
// the target's value of one of these is not taken: the local value (or
// none) stays, and siphon says which it left out, unless --env-allow GLOB
// names it. fnmatch globs; the list is docs/EXEC.md's.
inline constexpr std::string_view kCodeChoosing[] = {
    // The dynamic loader (LD_PRELOAD, LD_AUDIT, LD_LIBRARY_PATH...) and
    // glibc's own loadable modules.
    "LD_*", "GCONV_PATH",
    // Shells: a file sourced at start, exported functions, prompts whose
    // expansions run commands, options (xtrace with PS4).
    "BASH_ENV", "ENV", "BASH_FUNC_*", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "PS0", "PS1",
    "PS2", "PS4", "ZDOTDIR",
    // Interpreters: options, preloads and module search paths.
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONBREAKPOINT",
    "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB", "PERLLIB", "PERL5DB", "RUBYOPT", "RUBYLIB",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "LUA_INIT*", "LUA_PATH*",
    "LUA_CPATH*", "PHPRC", "PHP_INI_SCAN_DIR", "GOFLAGS",
    // Libraries that load modules named in their configuration.
    "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES",
    // Commands that tools run.
    "GIT_*", "EDITOR", "VISUAL", "PAGER", "MANPAGER", "LESSOPEN", "LESSCLOSE", "SSH_ASKPASS",
    "SUDO_ASKPASS", "BROWSER"};

// Whether `name` is one of kCodeChoosing.
bool choosesCode(std::string_view name);

struct EnvOverlay {
  std::vector<std::string> include;  // fnmatch globs on the target's names; none: all
  std::vector<std::string> exclude;  // globs: these stay local
  std::vector<std::string> set;      // NAME=VALUE, over both
  std::vector<std::string> allow;    // globs: kCodeChoosing names taken from the target anyway
};

struct OverlaidEnvironment {
  std::vector<std::string> env;       // NAME=VALUE, sorted by name
  std::vector<std::string> left_out;  // kCodeChoosing names whose target value was not taken
};

// `local` ("NAME=VALUE" each, as environ) overlaid by `target` (name, value
// pairs): the target's value wins except for kKeepLocal and excluded names,
// names no include glob matches, and kCodeChoosing names no allow glob
// matches; then every `set` entry. `left_out` names the kCodeChoosing ones
// the target had with another value than the program gets, which no
// exclude or include glob or `set` entry already decided: what the user is
// told about.
OverlaidEnvironment overlayEnvironment(
    const std::vector<std::string>& local,
    const std::vector<std::pair<std::string, std::string>>& target, const EnvOverlay& overlay);

// "NAME=VALUE" with a non-empty name without '='; InvalidArgument otherwise.
absl::Status checkEnvAssignment(std::string_view text);

// The exit code of a program from its wait(2) status: its own code, or
// 128+N when signal N killed it (as a shell reports it).
int exitCodeOf(int wait_status);

}  // namespace siphon::exec
