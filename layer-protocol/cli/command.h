// The CLI's commands. Each area registers its subcommands (and the options
// they parse) on the CLI11 app, with the coroutine that runs them once the
// client is connected. main.cc parses, connects, runs the chosen command and
// closes the session.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "siphon/client/client.h"
#include "siphon/client/target.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

// What a command gets to work with.
struct CommandEnv {
  std::shared_ptr<client::Client> client;
  // The typed API over `client` (its calls time out after `timeout`);
  // commands call the library through it.
  client::Target target;
  bool json = false;
  std::chrono::milliseconds timeout{10000};  // per request
};

// Returns the process exit code (cli/exit_codes.h). The env is passed by
// reference (it outlives the call): GCC 12 destroys by-value parameters of
// lambda coroutines twice.
using CommandRun = std::function<net::awaitable<int>(const CommandEnv&)>;

struct Command {
  Command(CLI::App* a, CommandRun r,
          std::function<void(client::ClientOptions&)> c = nullptr)
      : app(a), run(std::move(r)), configure(std::move(c)) {}
  CLI::App* app = nullptr;  // the (sub)subcommand whose parsed() selects it
  CommandRun run;
  // What the command sets in the client's options before it connects
  // (exec: how long to look for another agent); may be empty.
  std::function<void(client::ClientOptions&)> configure;
};

// Registration, one function per area (commands_<area>.cc).
void addBasicCommands(CLI::App& app, std::vector<Command>& out);  // info, env
void addFsCommands(CLI::App& app, std::vector<Command>& out);     // fs stat, ls, cat, write...
void addFsMountCommand(CLI::App& fs, std::vector<Command>& out);  // fs mount (commands_mount.cc)
void addNetCommands(CLI::App& app, std::vector<Command>& out);    // connect, forward
void addDnsCommands(CLI::App& app, std::vector<Command>& out);    // dns lookup, dns reverse
void addStealCommands(CLI::App& app, std::vector<Command>& out);  // steal
void addMirrorCommands(CLI::App& app, std::vector<Command>& out);  // mirror
void addCaptureCommands(CLI::App& app, std::vector<Command>& out);  // capture
void addSessionsCommands(CLI::App& app, std::vector<Command>& out);  // sessions
struct ExecTail;
// exec (commands_exec.cc); `tail`: the words after its `--` (exec_config.h),
// filled before parsing.
void addExecCommand(CLI::App& app, std::vector<Command>& out, const ExecTail* tail);

// One line on stderr: "siphon: <message>".
void printError(std::string_view message);
// Writes `out` to stdout; kExitError when stdout fails.
int printOutput(const std::string& out);
// Reports a failed call of the typed API (env.target, client::Dns...):
// prints "<what> failed: CODE: message" (requestFailure(), exit_codes.h) and
// returns its exit code. `what` names the operation ("env", "fs stat /etc").
int reportFailure(std::string_view what, const absl::Status& status);
// Sends one request and maps a failure to a message and an exit code
// (printed here). `what` names the operation ("env", "fs stat /etc").
// For commands not on the typed API yet; new code calls env.target.
net::awaitable<absl::StatusOr<v1::Response>> callOrReport(const CommandEnv& env,
                                                          v1::Request request,
                                                          std::string_view what, int* exit_code);

}  // namespace siphon::cli
