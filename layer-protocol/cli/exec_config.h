// `siphon exec`'s options: the flags, and the config file (-f siphon.json)
// that holds the same names so a project can keep its set-up next to its
// code. A flag given on the command line wins over the file.
//
//   {
//     "local": ["10.0.0.0/8:5432"], "remote": ["127.0.0.1:6379"],
//     "remote-loopback": false,
//     "env": {"LOG_LEVEL": "debug"}, "env-include": ["DB_*"], "env-exclude": ["*SECRET*"],
//     "env-allow": ["JAVA_TOOL_OPTIONS"],
//     "hostname": "pod-7", "agent-lost-timeout": "60s",
//     "no-udp": false, "local-dns": false, "no-target-env": false,
//     "steal": ["80:8080"], "mirror": ["9090"], "incoming": "off",
//     "filter-header": ["x-user: ^alice$"], "filter-path": "^/api/",
//     "fs-remote": ["/var/run/secrets/kubernetes.io/serviceaccount"], "fs-root": "/tmp/pod",
//     "fs-ro": true,
//     "command": ["python3", "app.py"]
//   }
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/steal_spec.h"
#include "siphon/client/subscriptions.h"

namespace siphon::cli {

// One --steal or --mirror: the target's PORT delivered to the program's
// listener on LOCAL (the same port when not given).
struct IncomingPort {
  uint16_t port = 0;
  uint16_t local = 0;
  bool mirror = false;
  bool operator==(const IncomingPort&) const = default;
};
// "PORT" or "PORT:LOCAL", each 1-65535. INVALID_ARGUMENT says what is wrong.
absl::StatusOr<IncomingPort> parseIncomingPort(std::string_view text, bool mirror);

// --incoming: what happens to a port the program starts listening on.
enum class IncomingMode { kOff, kSteal, kMirror };

struct ExecFlags {
  std::vector<std::string> command;
  std::string config_file;
  bool remote_loopback = false;
  std::vector<std::string> local, remote;  // CIDR[:PORT]
  std::vector<std::string> env_set;        // NAME=VALUE
  std::vector<std::string> env_include, env_exclude;
  std::vector<std::string> env_allow;  // globs: exec::kCodeChoosing names taken anyway
  // Descriptors siphon was given that the program gets (besides 0, 1, 2);
  // not in the config file: they belong to one command line.
  std::vector<int> keep_fds;
  bool no_target_env = false;
  std::string hostname;  // empty: the target's
  std::string agent_lost_timeout = "60s";
  bool no_udp = false;                     // UDP stays in the program's namespace
  bool local_dns = false;                  // keep this machine's resolv.conf and hosts
  std::vector<std::string> steal, mirror;  // PORT[:LOCAL]
  std::string incoming = "off";            // steal | mirror | off
  FilterFlags filter;                      // the steals' HTTP filter
  std::vector<std::string> fs_remote;      // the target's PATH at the same path
  std::string fs_root;                     // the target's root at DIR
  bool fs_ro = false;                      // those read-only
  // Parsed by finishExecFlags().
  std::chrono::milliseconds agent_lost_timeout_ms{60000};
  std::vector<IncomingPort> incoming_ports;  // --steal, then --mirror
  IncomingMode incoming_mode = IncomingMode::kOff;
  std::optional<client::HttpFilter> http_filter;
};

// The flags on `exec` (the subcommand). The command is everything after
// `--`, or from the first word that is not an option of exec's; siphon's
// own options (--agent...) go before `exec`.
void registerExecFlags(CLI::App& exec, ExecFlags& flags);

// The command line split at the first `--` after an `exec` word: argv up to
// it (what CLI11 parses) and the words after it (the command, untouched by
// CLI11, which would take `--json` or `-a` in them for its own).
struct ExecTail {
  bool present = false;
  std::vector<std::string> words;
};
std::vector<std::string> splitExecTail(const std::vector<std::string>& args, ExecTail* tail);

// After parsing: the command (the tail, or what exec did not parse), the
// config file merged under the flags given, and every value checked.
// InvalidArgument names the flag or key and what is wrong.
absl::Status finishExecFlags(ExecFlags& flags, const CLI::App& exec, const ExecTail& tail);

// --env-allow GLOB: a name or glob without '='; a plain name must be one
// siphon leaves out (exec::choosesCode), else it is a typo. INVALID_ARGUMENT.
absl::Status checkEnvAllow(const std::string& glob);

// --keep-fd N: each 3 or more, open in this process (checked before siphon
// opens anything of its own, so an open N is one it was given), fewer than
// exec::kMaxKeptDescriptors. INVALID_ARGUMENT names the flag.
absl::Status checkKeptDescriptors(const std::vector<int>& fds);

// The config file's text merged under `flags`: only names whose flag was
// not given (`given(name)` false) are taken. For tests.
absl::Status mergeExecConfig(const std::string& json, const std::string& origin,
                             const std::function<bool(const std::string&)>& given,
                             ExecFlags& flags);

}  // namespace siphon::cli
