// siphon-agent: the privileged node-local agent. See README.md for the modes,
// flags and exit codes. The command line is agent/options.*; this file is
// start-up: logs, fd limit, capabilities, the target, then the server.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "agent/common/capabilities.h"
#include "agent/common/log.h"
#include "agent/files/fs_helper.h"
#include "agent/options.h"
#include "agent/runtime/resolver.h"
#include "agent/runtime/runtime_target.h"
#include "agent/server/admission.h"
#include "agent/server/config.h"
#include "agent/server/handover_channel.h"
#include "agent/server/server.h"
#include "agent/steal/iptables/guard.h"
#include "agent/target/proc_fs.h"
#include "agent/target/target.h"
#include "siphon/status.h"
#include "siphon/text.h"
#include "siphon/transport/spawn.h"
#include "siphon/transport/tls.h"

namespace siphon::agent {
namespace {

int fail(int code, std::string_view message) {
  std::fprintf(stderr, "siphon-agent: %.*s\n", static_cast<int>(message.size()), message.data());
  return code;
}

int exitCodeForTarget(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:  // ephemeral: the target is not visible
      return kExitTargetNotFound;
    case absl::StatusCode::kPermissionDenied:
      return kExitPermission;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitRuntimeUnavailable;
    default:
      return kExitInternal;
  }
}

// Keeps only the capabilities `config` and `mode` need and logs the result.
// A capability the agent was not given is only reported: the feature that
// needs it fails later with the kernel's EPERM.
absl::Status applyCapabilityDrop(const AgentConfig& config, TargetMode mode, bool keep_all) {
  caps::Needs needs{mode, config.fs_mode, config.steal_backend, config.iptables_mode, 0};
  if (size_t colon = config.listen.rfind(':'); colon != std::string::npos) {
    needs.listen_port = std::atoi(config.listen.c_str() + colon + 1);
  }
  ASSIGN_OR_RETURN(caps::Plan plan, caps::planCapabilities(needs));
  if (keep_all) {
    log::warn("capabilities_kept_all", {{"would_keep", caps::formatCapSet(plan.keep)}});
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(caps::DropResult dropped, caps::dropCapabilities(plan));
  for (const std::string& w : dropped.warnings) log::warn("capabilities_warning", {{"detail", w}});
  if (dropped.missing != 0) {
    log::warn("capabilities_missing", {{"missing", caps::formatCapSet(dropped.missing)}});
  }
  log::info("capabilities_dropped",
            {{"kept", caps::formatCapSet(dropped.kept)},
             {"children", caps::formatCapSet(plan.inheritable & dropped.kept)},
             {"bounding", dropped.bounding_dropped ? "dropped" : "unchanged"},
             {"securebits", dropped.securebits_set ? "noroot_locked" : "unchanged"}});
  return absl::OkStatus();
}

int realMain(int argc, char** argv) {
  ParsedOptions parsed =
      parseOptions(argc, argv, std::getenv("SIPHON_TOKEN"), std::cout, std::cerr);
  if (!parsed.options) return parsed.exit_code;
  AgentOptions& options = *parsed.options;
  const AgentConfig& config = options.config;
  if (auto s = log::init(options.log_format, options.log_level); !s.ok())
    return fail(kExitUsage, sv(s.message()));
  net::setSpawnFailureReporter(&log::coroutineFailed);
  // The handover socket only where no other container reaches it
  // (docs/SECURITY.md, "The handover socket"): told before anything starts.
  if (!config.handover_socket.empty()) {
    if (auto s = handover::checkSocketPlace(config.handover_socket); !s.ok()) {
      return fail(kExitUsage, sv(s.message()));
    }
  }

  // Room for sessions' files and sockets beside a flood of connections
  // (docs/SECURITY.md#handshake-admission): the soft RLIMIT_NOFILE goes up
  // to kFdLimitTarget, or the hard limit when lower.
  if (auto fds = raiseFdLimit(); fds.ok()) {
    log::info("fd_limit", {{"soft", static_cast<uint64_t>(fds->soft)},
                           {"hard", static_cast<uint64_t>(fds->hard)},
                           {"before", static_cast<uint64_t>(fds->before)}});
  } else {
    log::warn("fd_limit_failed", {{"error", sv(fds.status().message())}});
  }

  // Least privilege (docs/SECURITY.md, "Capabilities"): before anything
  // starts a thread (the runtime's gRPC client, the server's pools), since
  // capabilities are per thread; what opening the target needs is kept.
  if (auto s = applyCapabilityDrop(config, options.mode, options.keep_capabilities); !s.ok()) {
    log::error("capabilities_failed", {{"error", sv(s.message())}});
    return fail(kExitInternal, sv(s.message()));
  }

  auto procfs = std::make_unique<RealProcFs>();
  absl::StatusOr<std::unique_ptr<Target>> target;
  // What opens the target's container again after a restart
  // (--target-restart-timeout): the runtime's next task, or the next
  // process in the container's cgroup. A bare --pid names no container.
  Server::TargetReopener reopen;
  if (options.container_id) {
    // Blocking calls to the runtime: fine here, before the event loop runs.
    auto resolver = std::make_shared<runtime::RuntimeResolver>(
        options.runtime_options, runtime::realClientFactory(options.runtime_options));
    target = runtime::openContainerTarget(*procfs, *resolver, *options.container_id);
    reopen = [resolver, id = *options.container_id, proc = std::make_shared<RealProcFs>()] {
      return runtime::openContainerTarget(*proc, *resolver, id);
    };
  } else if (options.mode == TargetMode::kTargeted) {
    TargetSpec spec;
    spec.mode = TargetMode::kTargeted;
    spec.pid = options.pid;
    target = Target::open(*procfs, std::move(spec));
  } else if (options.mode == TargetMode::kEphemeral) {
    target = runtime::openEphemeralTarget(*procfs, options.ephemeral_container_id);
    // PID 1 of the pod does not restart alone (its exit ends the pod's
    // PID namespace, this agent with it).
    if (!options.ephemeral_container_id.empty()) {
      reopen = [id = options.ephemeral_container_id, proc = std::make_shared<RealProcFs>()] {
        return runtime::openEphemeralTarget(*proc, id);
      };
    }
  } else {
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    target = Target::open(*procfs, std::move(spec));
  }
  if (!target.ok()) {
    log::error("target_failed", {{"error", sv(target.status().message())}});
    return fail(exitCodeForTarget(target.status()), sv(target.status().message()));
  }
  if (const TargetSpec& spec = (*target)->spec(); !spec.container_id.empty()) {
    log::info("container_resolved",
              {{"container_id", spec.container_id},
               {"runtime", spec.runtime},
               {"pid", static_cast<int64_t>((*target)->pid())},
               {"runtime_env_vars", static_cast<int64_t>(spec.runtime_env.size())}});
  }
  log::info("target_entered", {{"mode", targetModeName((*target)->mode())},
                               {"pid", static_cast<int64_t>((*target)->pid())},
                               {"netns", (*target)->netnsLabel()}});

  Server server(config, std::move(*target), std::move(procfs));
  if (reopen) server.followTargetRestarts(std::move(reopen));
  if (auto s = server.init(); !s.ok()) {
    log::error("init_failed", {{"error", sv(s.message())}});
    return fail(s.code() == absl::StatusCode::kPermissionDenied ? kExitPermission : kExitInternal,
                sv(s.message()));
  }
  if (!config.take_over.empty()) {
    // A handover (docs/CONTINUITY.md): the old agent's listener, sessions
    // and steal become ours; if it fails, the old agent goes on.
    if (auto s = server.takeOver(); !s.ok()) {
      log::error("handover_failed", {{"from", config.take_over}, {"error", sv(s.message())}});
      return fail(kExitInternal, sv(s.message()));
    }
  } else if (auto s = server.listen(); !s.ok()) {
    log::error("listen_failed", {{"error", sv(s.message())}});
    return fail(kExitListen, sv(s.message()));
  }
  if (config.insecure_no_auth) {
    log::warn("insecure_no_auth", {{"listen", server.listenAddress()}});
  }
  std::string ready = server.readyLine();
  std::fprintf(stdout, "%s\n", ready.c_str());
  std::fflush(stdout);
  log::info("ready", {{"listen", server.listenAddress()}});
  return server.run();
}

}  // namespace
}  // namespace siphon::agent

int main(int argc, char** argv) {
  // Not dumpable: the agent's /proc/PID/* (memory, environment, fds, and
  // root: its own file system, where its handover socket is) then need
  // CAP_SYS_PTRACE of whoever opens them, which the file helper, a target
  // of the same uid and the pod's other root processes do not have
  // (docs/SECURITY.md, "File identity", "The handover socket"). Its
  // helpers (the iptables guard) too: each one's /proc/PID/root is the
  // agent's.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  if (argc > 1 && std::string_view(argv[1]) == siphon::agent::steal::kIptablesGuardCommand)
    return siphon::agent::steal::iptablesGuardMain(argc, argv);
  if (argc > 1 && std::string_view(argv[1]) == siphon::agent::files::kFsHelperCommand)
    return siphon::agent::files::fsHelperMain(argc, argv);
  // A write to a socket its peer has reset must fail with EPIPE, not kill
  // the agent: Asio's descriptor writes (the passthrough splice, tunnels)
  // use write(), which raises SIGPIPE where send(MSG_NOSIGNAL) would not.
  ::signal(SIGPIPE, SIG_IGN);
  try {
    return siphon::agent::realMain(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "siphon-agent: internal error: %s\n", e.what());
    return siphon::agent::kExitInternal;
  }
}
