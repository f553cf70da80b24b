// `siphon info` and `siphon env`.
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/output.h"

namespace siphon::cli {

void addBasicCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* info = app.add_subcommand("info", "The agent, its target and its sessions");
  out.push_back({info, [](const CommandEnv& env) -> net::awaitable<int> {
                   v1::Request req;
                   req.mutable_info();
                   int rc = kExitOk;
                   auto r = co_await callOrReport(env, std::move(req), "info", &rc);
                   if (!r.ok()) co_return rc;
                   if (!r->has_info()) {
                     printError("info failed: the agent answered with another kind of response");
                     co_return kExitError;
                   }
                   co_return printOutput(env.json ? infoJson(r->info()) : infoText(r->info()));
                 }});

  struct EnvFlags {
    std::vector<std::string> include, exclude;
  };
  auto flags = std::make_shared<EnvFlags>();
  CLI::App* env = app.add_subcommand("env", "The target process's environment");
  env->add_option("--include", flags->include,
                  "Only variables whose name matches this glob (fnmatch); repeatable")
      ->allow_extra_args(false);
  env->add_option("--exclude", flags->exclude,
                  "Leave out variables whose name matches this glob; repeatable; wins over "
                  "--include")
      ->allow_extra_args(false);
  out.push_back({env, [flags](const CommandEnv& e) -> net::awaitable<int> {
                   v1::Request req;
                   for (const auto& g : flags->include) req.mutable_env()->add_include(g);
                   for (const auto& g : flags->exclude) req.mutable_env()->add_exclude(g);
                   if (!req.has_env()) req.mutable_env();
                   int rc = kExitOk;
                   auto r = co_await callOrReport(e, std::move(req), "env", &rc);
                   if (!r.ok()) co_return rc;
                   if (!r->has_env()) {
                     printError("env failed: the agent answered with another kind of response");
                     co_return kExitError;
                   }
                   co_return printOutput(e.json ? envJson(r->env()) : envText(r->env()));
                 }});
}

}  // namespace siphon::cli
