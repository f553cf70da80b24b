// siphon: the command-line client of siphon-agent.
//
//   siphon --agent HOST:PORT [--agent HOST:PORT ...] [--token-file F] [--json]
//          [--client-name N] [--timeout DUR] <command>
//
// Commands are registered per area (cli/command.h): `info`, `env ...`.
// Exit codes: see cli/exit_codes.h (0 ok, 1 error, 2 usage, 3 agent
// unreachable, 4 session rejected).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exec_config.h"
#include "cli/exit_codes.h"
#include "cli/kube_session.h"
#include "cli/options.h"
#include "cli/output.h"
#include "cli/project_config.h"
#include "siphon/client/client.h"
#include "siphon/heap.h"
#include "siphon/status.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/tls.h"

namespace siphon::cli {
namespace {

struct Flags {
  std::vector<std::string> agents;
  std::string token_file;
  bool json = false;
  std::string client_name = "siphon";
  std::string timeout = "10s";
  std::string keepalive_interval;  // empty: the agent's
  std::string keepalive_timeout;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;  // empty: env, else plain TCP
};

net::awaitable<int> run(client::ClientOptions options, CommandRun command, bool json,
                        std::chrono::milliseconds timeout, KubeSession* kube) {
  auto ex = co_await net::asio::this_coro::executor;
  auto client = client::Client::create(ex, std::move(options));
  absl::Status connected = co_await client->connect();
  if (!connected.ok()) {
    Failure f = connectFailure(connected);
    printError(f.message);
    co_return f.exit_code;
  }
  if (kube != nullptr) kube->start(client);
  int rc = kExitError;
  try {
    CommandEnv env{client, client::Target::over(client), json, timeout};
    env.target.setCallTimeout(timeout);
    rc = co_await command(env);
  } catch (const std::exception& e) {
    printError(e.what());
  }
  if (kube != nullptr) co_await kube->beforeClose(client);
  // A Goaway tells the agent to drop the session now rather than keep it
  // for its resume grace period. Through a port-forward that is about to
  // go, it must have crossed it first: the agent's close says so.
  if (kube != nullptr) {
    co_await client->closeAndWait(kGoawayCrossing);
    co_await kube->afterClose();
  } else {
    client->close();
  }
  co_return rc;
}

}  // namespace

net::awaitable<absl::StatusOr<v1::Response>> callOrReport(const CommandEnv& env,
                                                          v1::Request request,
                                                          std::string_view what, int* exit_code) {
  auto response = co_await env.client->call(std::move(request), env.timeout);
  if (!response.ok()) *exit_code = reportFailure(what, response.status());
  co_return response;
}

namespace {

int realMain(int argc, char** argv) {
  keepBulkBuffers();  // fs cat and fs mount: a MiB per read answer
  Flags flags;
  // Installed as kubectl-siphon too: `kubectl siphon exec --target deploy/web -- ./app`.
  const std::string self = argc > 0 ? std::string(argv[0]) : "siphon";
  const bool plugin = self.substr(self.rfind('/') + 1) == "kubectl-siphon";
  CLI::App app{"siphon: talk to a siphon-agent (info, env of the target)",
               plugin ? "kubectl siphon" : "siphon"};
  app.fallthrough();  // global flags may also follow the command
  app.require_subcommand(1);
  app.add_option("-a,--agent", flags.agents,
                 "Agent address HOST:PORT ([v6]:PORT); repeatable, comma-separated lists "
                 "allowed; tried in order (env SIPHON_AGENT). With several, the session "
                 "moves to another agent when its agent drains or is lost")
      ->allow_extra_args(false);
  app.add_option("--token-file", flags.token_file,
                 "File holding the agent's token; trailing whitespace is ignored "
                 "(else env SIPHON_TOKEN)");
  app.add_option("--tls-ca", flags.tls_ca,
                 "Connect with TLS; PEM CA certificates the agent's certificate must chain to, "
                 "issued for the address dialled (env SIPHON_TLS_CA)");
  app.add_option("--tls-cert", flags.tls_cert,
                 "PEM client certificate, for an agent run with --tls-client-ca; needs "
                 "--tls-key (env SIPHON_TLS_CERT)");
  app.add_option("--tls-key", flags.tls_key, "PEM key of --tls-cert (env SIPHON_TLS_KEY)");
  app.add_option("--tls-server-name", flags.tls_server_name,
                 "Name (or IP) the agent's certificate must be issued for, instead of the "
                 "address dialled (env SIPHON_TLS_SERVER_NAME)");
  app.add_flag("--json", flags.json, "Machine-readable JSON output");
  app.add_option("--client-name", flags.client_name, "Name the agent shows for this session")
      ->capture_default_str();
  app.add_option("--timeout", flags.timeout,
                 "Limit for connecting, the handshake and the request (500ms, 5s, 1m...)")
      ->capture_default_str();

  app.add_option("--keepalive-interval", flags.keepalive_interval,
                 "Ask the agent to ping this often (default: the agent's, 5s)");
  app.add_option("--keepalive-timeout", flags.keepalive_timeout,
                 "Treat the connection as cut after this long without a word from the agent, "
                 "and resume on a new one (default: the agent's, 20s; the agent may hold "
                 "a lower one)");

  KubeFlags kube;
  addKubeOptions(app, kube);
  AgentsCommand agents_command;
  addAgentsCommand(app, agents_command);

  std::vector<Command> commands;
  addBasicCommands(app, commands);
  addFsCommands(app, commands);
  addDnsCommands(app, commands);
  addNetCommands(app, commands);
  addStealCommands(app, commands);
  addMirrorCommands(app, commands);
  addCaptureCommands(app, commands);
  addSessionsCommands(app, commands);
  ExecTail exec_tail;
  addExecCommand(app, commands, &exec_tail);
  app.footer(
      "Exit codes: 0 ok, 1 error, 2 usage, 3 agent unreachable, 4 session rejected by the "
      "agent.");

  try {
    // The words after exec's `--` are the program's: CLI11 never sees them.
    std::vector<std::string> args(argv + 1, argv + argc);
    args = splitExecTail(args, &exec_tail);
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help prints and exits 0; every parse error is a usage error, told in
    // one line like the other failures.
    if (e.get_exit_code() == 0) return app.exit(e);
    printError(absl::StrCat(e.what(), " (see siphon --help)"));
    return kExitUsage;
  }
  // The project's config file: what the command line did not give. An
  // --agent on the command line wins over the file's target.
  const bool target_given = kube.target_option->count() > 0;
  if (!kube.no_config) {
    std::optional<std::string> path =
        kube.config.empty() ? findProjectConfig(".") : std::optional<std::string>(kube.config);
    if (path) {
      auto config = loadProjectConfig(*path);
      absl::Status applied = config.ok() ? applyProjectConfig(*config, app) : config.status();
      if (!applied.ok()) {
        printError(sv(applied.message()));
        return kExitUsage;
      }
    }
  }
  if (!flags.agents.empty() && !target_given) kube.target.clear();
  const bool agents_listed = agents_command.agents->parsed();
  const bool kube_session = kubeWanted(kube) || agents_listed;
  if (kube_session && !flags.agents.empty()) {
    printError("--agent and --target (or --agent-mode targetless) exclude each other");
    return kExitUsage;
  }

  const char* env_agents = std::getenv("SIPHON_AGENT");
  auto agents = kube_session
                    ? absl::StatusOr<std::vector<std::string>>(std::vector<std::string>())
                    : parseAgentList(flags.agents, env_agents
                                                       ? std::optional<std::string_view>(env_agents)
                                                       : std::nullopt);
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
  // 0 asks nothing: the agent's own keepalive holds.
  options.limits.keepalive_interval = std::chrono::milliseconds(0);
  options.limits.keepalive_timeout = std::chrono::milliseconds(0);
  for (auto [text, out, name] :
       {std::tuple{&flags.keepalive_interval, &options.limits.keepalive_interval,
                   "--keepalive-interval"},
        std::tuple{&flags.keepalive_timeout, &options.limits.keepalive_timeout,
                   "--keepalive-timeout"}}) {
    if (text->empty()) continue;
    auto d = parseDuration(*text);
    if (!d.ok()) {
      printError(absl::StrCat(name, ": ", d.status().message()));
      return kExitUsage;
    }
    *out = *d;
  }
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
  for (auto [flag, out, env] :
       {std::tuple{&flags.tls_ca, &options.tls_ca, "SIPHON_TLS_CA"},
        std::tuple{&flags.tls_cert, &options.tls_cert, "SIPHON_TLS_CERT"},
        std::tuple{&flags.tls_key, &options.tls_key, "SIPHON_TLS_KEY"},
        std::tuple{&flags.tls_server_name, &options.tls_server_name, "SIPHON_TLS_SERVER_NAME"}}) {
    const char* value = std::getenv(env);
    *out = !flag->empty() ? *flag : value != nullptr ? std::string(value) : std::string();
  }
  if (!options.tls_ca.empty() || !options.tls_cert.empty() || !options.tls_key.empty() ||
      !options.tls_server_name.empty()) {
    // Unreadable or malformed files are a usage error, found before dialling.
    auto tls = net::tls::clientContext({options.tls_ca, options.tls_cert, options.tls_key});
    if (!tls.ok()) {
      printError(sv(tls.status().message()));
      return kExitUsage;
    }
  }
  options.client_name = flags.client_name;
  options.connect_timeout = *timeout;
  options.handshake_timeout = *timeout;

  if (agents_listed) return runAgentsCommand(agents_command, kube, flags.json, options);

  CommandRun command;
  // Commands that run until stopped follow a workload's pods (every pod
  // covered, moving when one goes); the others are done before it matters.
  bool long_running = false;
  for (const auto& c : commands) {
    if (!c.app->parsed()) continue;
    command = c.run;
    if (c.configure) c.configure(options);
    static const std::set<std::string> kFollowing = {"exec",    "steal",   "mirror", "capture",
                                                     "forward", "connect", "mount"};
    long_running = kFollowing.contains(c.app->get_name());
  }
  if (!command) {
    printError("no command given (see siphon --help)");
    return kExitUsage;
  }

  // --target: the agent found or started before the session, removed after.
  std::unique_ptr<KubeSession> kube_agent;
  if (kube_session) {
    armKubeSignals();
    auto opened = KubeSession::open(kube, flags.json, long_running);
    if (!opened.ok()) {
      printError(sv(opened.status().message()));
      return kubeExitCode(opened.status());
    }
    kube_agent = *std::move(opened);
  }

  net::asio::io_context io;
  int rc = kExitError;
  if (kube_agent) kube_agent->configure(options, io.get_executor());
  net::asio::co_spawn(io,
                      run(std::move(options), std::move(command), flags.json, *timeout,
                          kube_agent.get()),
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
  if (kube_agent) {
    armKubeSignals();  // a Ctrl-C now must not stop the clean-up
    kube_agent->finish();
    // Its port-forward's timers belong to `io`: gone before it is.
    kube_agent.reset();
  }
  return rc;
}

}  // namespace
}  // namespace siphon::cli

int main(int argc, char** argv) { return siphon::cli::realMain(argc, argv); }
