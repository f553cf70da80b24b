// siphon: the command-line client of siphon-agent.
//
//   siphon --agent HOST:PORT [--agent HOST:PORT ...] [--token-file F] [--json]
//          [--client-name N] [--timeout DUR] <command>
//
// Commands: `info`, `env [--include GLOB]... [--exclude GLOB]...`.
// Exit codes: see cli/exit_codes.h (0 ok, 1 error, 2 usage, 3 agent
// unreachable, 4 session rejected).
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/exit_codes.h"
#include "cli/options.h"
#include "cli/output.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {
namespace {

struct Flags {
  std::vector<std::string> agents;
  std::string token_file;
  bool json = false;
  std::string client_name = "siphon";
  std::string timeout = "10s";
  std::vector<std::string> include;
  std::vector<std::string> exclude;
};

enum class Command { kInfo, kEnv };

void printError(std::string_view message) { fmt::print(stderr, "siphon: {}\n", message); }

int printOutput(const std::string& out) {
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    printError("cannot write the output");
    return kExitError;
  }
  return kExitOk;
}

// Sends the command's one request and prints the answer. The caller closes
// the client.
net::awaitable<int> request(std::shared_ptr<client::Client> client, Command command, Flags flags,
                            std::chrono::milliseconds timeout) {
  v1::Request req;
  const char* what = command == Command::kInfo ? "info" : "env";
  if (command == Command::kInfo) {
    req.mutable_info();
  } else {
    auto* env = req.mutable_env();
    for (const auto& g : flags.include) env->add_include(g);
    for (const auto& g : flags.exclude) env->add_exclude(g);
  }
  auto response = co_await client->call(std::move(req), timeout);
  if (!response.ok()) {
    Failure f = requestFailure(what, response.status());
    printError(f.message);
    co_return f.exit_code;
  }
  if (command == Command::kInfo) {
    if (!response->has_info()) {
      printError("info failed: the agent answered with another kind of response");
      co_return kExitError;
    }
    co_return printOutput(flags.json ? infoJson(response->info()) : infoText(response->info()));
  }
  if (!response->has_env()) {
    printError("env failed: the agent answered with another kind of response");
    co_return kExitError;
  }
  co_return printOutput(flags.json ? envJson(response->env()) : envText(response->env()));
}

net::awaitable<int> run(client::ClientOptions options, Command command, Flags flags,
                        std::chrono::milliseconds timeout) {
  auto ex = co_await net::asio::this_coro::executor;
  auto client = client::Client::create(ex, std::move(options));
  absl::Status connected = co_await client->connect();
  if (!connected.ok()) {
    Failure f = connectFailure(connected);
    printError(f.message);
    co_return f.exit_code;
  }
  int rc = kExitError;
  try {
    rc = co_await request(client, command, std::move(flags), timeout);
  } catch (const std::exception& e) {
    printError(e.what());
  }
  // A Goaway tells the agent to drop the session now rather than keep it
  // for its resume grace period.
  client->close();
  co_return rc;
}

int realMain(int argc, char** argv) {
  Flags flags;
  CLI::App app{"siphon: talk to a siphon-agent (info, env of the target)", "siphon"};
  app.fallthrough();  // global flags may also follow the command
  app.require_subcommand(1);
  app.add_option("-a,--agent", flags.agents,
                 "Agent address HOST:PORT ([v6]:PORT); repeatable, comma-separated lists "
                 "allowed; tried in order (env SIPHON_AGENT)")
      ->allow_extra_args(false);
  app.add_option("--token-file", flags.token_file,
                 "File holding the agent's token; trailing whitespace is ignored "
                 "(else env SIPHON_TOKEN)");
  app.add_flag("--json", flags.json, "Machine-readable JSON output");
  app.add_option("--client-name", flags.client_name, "Name the agent shows for this session")
      ->capture_default_str();
  app.add_option("--timeout", flags.timeout,
                 "Limit for connecting, the handshake and the request (500ms, 5s, 1m...)")
      ->capture_default_str();

  CLI::App* info = app.add_subcommand("info", "The agent, its target and its sessions");
  CLI::App* env = app.add_subcommand("env", "The target process's environment");
  env->add_option("--include", flags.include,
                  "Only variables whose name matches this glob (fnmatch); repeatable")
      ->allow_extra_args(false);
  env->add_option("--exclude", flags.exclude,
                  "Leave out variables whose name matches this glob; repeatable; wins over "
                  "--include")
      ->allow_extra_args(false);
  app.footer(
      "Exit codes: 0 ok, 1 error, 2 usage, 3 agent unreachable, 4 session rejected by the "
      "agent.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every parse error is a usage error, told in
    // one line like the other failures.
    if (e.get_exit_code() == 0) return app.exit(e);
    printError(absl::StrCat(e.what(), " (see siphon --help)"));
    return kExitUsage;
  }

  const char* env_agents = std::getenv("SIPHON_AGENT");
  auto agents = parseAgentList(
      flags.agents, env_agents ? std::optional<std::string_view>(env_agents) : std::nullopt);
  if (!agents.ok()) {
    printError(sv(agents.status().message()));
    return kExitUsage;
  }
  auto timeout = parseDuration(flags.timeout);
  if (!timeout.ok()) {
    printError(absl::StrCat("--timeout: ", timeout.status().message()));
    return kExitUsage;
  }

  client::ClientOptions options;
  options.endpoints = *std::move(agents);
  if (!flags.token_file.empty()) {
    auto token = readTokenFile(flags.token_file);
    if (!token.ok()) {
      printError(sv(token.status().message()));
      return kExitUsage;
    }
    options.token = *std::move(token);
  } else if (const char* t = std::getenv("SIPHON_TOKEN")) {
    options.token = trimTrailingWhitespace(t);
  }
  options.client_name = flags.client_name;
  options.connect_timeout = *timeout;
  options.handshake_timeout = *timeout;

  Command command = info->parsed() ? Command::kInfo : Command::kEnv;

  net::asio::io_context io;
  int rc = kExitError;
  net::asio::co_spawn(io, run(std::move(options), command, std::move(flags), *timeout),
                      [&rc](std::exception_ptr e, int result) {
                        if (e) {
                          try {
                            std::rethrow_exception(e);
                          } catch (const std::exception& ex) {
                            printError(ex.what());
                          } catch (...) {
                            printError("internal error");
                          }
                          rc = kExitError;
                          return;
                        }
                        rc = result;
                      });
  io.run();
  return rc;
}

}  // namespace
}  // namespace siphon::cli

int main(int argc, char** argv) { return siphon::cli::realMain(argc, argv); }
