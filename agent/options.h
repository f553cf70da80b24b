// siphon-agent's command line: the CLI11 app (flags, modes, help text), the
// parse of argv into AgentOptions, and the checks between flags. Start-up
// (logs, fd limit, capabilities, the target, the server) is main.cc's.
//
// The only I/O is what a usage error must be told from before anything is
// opened: reading --token-file and loading the TLS files. What goes on
// stdout (--help, --version) and stderr (the error) is written to the
// streams given, so tests read it.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "agent/common/log.h"
#include "agent/files/watch_limits.h"
#include "agent/runtime/resolver.h"
#include "agent/server/config.h"
#include "agent/target/target.h"

namespace siphon::agent {

// Everything the command line says, checked.
struct AgentOptions {
  AgentConfig config;
  log::Format log_format = log::Format::kText;
  std::string log_level = "info";  // a name log::parseLevel() takes
  bool keep_capabilities = false;  // --keep-capabilities
  TargetMode mode = TargetMode::kTargetless;
  // targeted: --pid (> 0), or --container-id with how to ask its runtime
  // (runtime_options.runtime unset: --runtime auto).
  int pid = 0;
  std::optional<std::string> container_id;
  runtime::RuntimeOptions runtime_options;
  // ephemeral: --container-id (empty: PID 1).
  std::string ephemeral_container_id;
};

// What parseOptions() decided: start with `options`, or exit with
// `exit_code` (0 after --help or --version, kExitUsage for a usage error)
// once what it wrote on `out` and `err` is shown.
struct ParsedOptions {
  std::optional<AgentOptions> options;
  int exit_code = kExitOk;
};

// Parses siphon-agent's argv. `env_token` is SIPHON_TOKEN (nullptr when
// unset), the token when there is no --token-file. A usage error is one line
// on `err`: "siphon-agent: MESSAGE" (or CLI11's own text for a flag it
// refuses). `inotify`: the node's inotify limits, which the file watch
// flags are derived from and checked against (files::watchBudget).
ParsedOptions parseOptions(
    int argc, const char* const* argv, const char* env_token, std::ostream& out, std::ostream& err,
    const files::NodeInotifyLimits& inotify = files::readNodeInotifyLimits());

}  // namespace siphon::agent
