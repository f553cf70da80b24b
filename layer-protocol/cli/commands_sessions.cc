// `siphon sessions`: the agent's sessions (docs/OPERATIONS.md).
#include <vector>

#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/sessions_output.h"
#include "siphon/client/target.h"

namespace siphon::cli {
namespace {

net::awaitable<int> runSessions(const CommandEnv& env) {
  auto sessions = co_await env.target.sessions();
  if (!sessions.ok()) co_return reportFailure("sessions", sessions.status());
  co_return printOutput(env.json ? sessionsJson(*sessions) : sessionsText(*sessions));
}

}  // namespace

void addSessionsCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* sessions = app.add_subcommand(
      "sessions",
      "The agent's sessions: client, age, state, subscriptions, streams and bytes; * marks "
      "this one");
  out.push_back({sessions, runSessions});
}

}  // namespace siphon::cli
