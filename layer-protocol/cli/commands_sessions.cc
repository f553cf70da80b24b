// `siphon sessions`: the agent's sessions (docs/OPERATIONS.md).
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/sessions_output.h"

namespace siphon::cli {

void addSessionsCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* sessions = app.add_subcommand(
      "sessions",
      "The agent's sessions: client, age, state, subscriptions, streams and bytes; * marks "
      "this one");
  out.push_back({sessions, [](const CommandEnv& env) -> net::awaitable<int> {
                   v1::Request req;
                   req.mutable_sessions();
                   int rc = kExitOk;
                   auto r = co_await callOrReport(env, std::move(req), "sessions", &rc);
                   if (!r.ok()) co_return rc;
                   if (!r->has_sessions()) {
                     printError(
                         "sessions failed: the agent answered with another kind of response");
                     co_return kExitError;
                   }
                   co_return printOutput(env.json ? sessionsJson(r->sessions())
                                                  : sessionsText(r->sessions()));
                 }});
}

}  // namespace siphon::cli
