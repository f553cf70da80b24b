// `siphon info` and `siphon env`.
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/output.h"
#include "siphon/client/env.h"
#include "siphon/client/target.h"

namespace siphon::cli {
namespace {

struct EnvFlags {
  std::vector<std::string> include, exclude;
};

net::awaitable<int> runInfo(const CommandEnv& env) {
  auto info = co_await env.target.info();
  if (!info.ok()) co_return reportFailure("info", info.status());
  co_return printOutput(env.json ? infoJson(*info) : infoText(*info));
}

net::awaitable<int> runEnv(const CommandEnv& env, std::shared_ptr<EnvFlags> flags) {
  client::Env target_env(env.target);
  auto vars = co_await target_env.get(flags->include, flags->exclude);
  if (!vars.ok()) co_return reportFailure("env", vars.status());
  co_return printOutput(env.json ? envJson(*vars) : envText(*vars));
}

}  // namespace

void addBasicCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* info = app.add_subcommand("info", "The agent, its target and its sessions");
  out.push_back({info, runInfo});

  auto flags = std::make_shared<EnvFlags>();
  CLI::App* env = app.add_subcommand("env", "The target process's environment");
  env->add_option("--include", flags->include,
                  "Only variables whose name matches this glob (fnmatch); repeatable")
      ->allow_extra_args(false);
  env->add_option("--exclude", flags->exclude,
                  "Leave out variables whose name matches this glob; repeatable; wins over "
                  "--include")
      ->allow_extra_args(false);
  // A plain lambda: the coroutine is a free function with by-value
  // parameters (GCC 12 and lambda coroutines' captures, cli/command.h).
  out.push_back({env, [flags](const CommandEnv& e) { return runEnv(e, flags); }});
}

}  // namespace siphon::cli
