// siphon-agent: the privileged node-local agent. See README.md for the modes,
// flags and exit codes.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "agent/common/capabilities.h"
#include "agent/common/log.h"
#include "agent/files/fs_helper.h"
#include "agent/runtime/resolver.h"
#include "agent/runtime/runtime_target.h"
#include "agent/server/admission.h"
#include "agent/server/config.h"
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

absl::StatusOr<std::string> readToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) return lastErrnoStatus(absl::StrCat("read --token-file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", path, " is empty"));
  }
  return token;
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
  CLI::App app{"siphon-agent: lets a remote session act as if it ran inside a target pod",
               "siphon-agent"};
  app.set_version_flag("--version", SIPHON_VERSION);
  app.require_subcommand(1);
  // Global options may come before or after the mode.
  app.fallthrough();

  AgentConfig config;
  std::string token_file, log_format = "text", log_level = "info";
  std::string first_client_timeout = "30s", idle_timeout = "0s", session_grace = "60s";
  std::string drain_timeout = "25s";
  std::string handshake_timeout = "10s";
  std::string keepalive_interval = "5s", keepalive_timeout = "20s";
  app.add_option("--listen", config.listen, "HOST:PORT to serve clients on (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--metrics", config.metrics_listen,
                 "HOST:PORT to serve Prometheus /metrics, /healthz and /readyz on over HTTP (port "
                 "0 picks one, shown as metrics= in the ready line); off by default");
  app.add_option("--token-file", token_file, "file holding the client token (or env SIPHON_TOKEN)");
  app.add_flag("--insecure-no-auth", config.insecure_no_auth,
               "accept clients without a token (never on a shared network)");
  app.add_option("--tls-cert", config.tls_cert,
                 "PEM certificate chain (leaf first): the listener speaks TLS (1.2 or later); "
                 "needs --tls-key");
  app.add_option("--tls-key", config.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-client-ca", config.tls_client_ca,
                 "PEM CA certificates: require a client certificate they signed (mutual TLS, "
                 "in addition to the token)");
  app.add_option("--log-format", log_format, "text or json")->capture_default_str();
  app.add_option("--log-level", log_level, "debug, info, warn or error")->capture_default_str();
  app.add_option("--first-client-timeout", first_client_timeout,
                 "exit (code 6) when no client connects within this time; 0 waits forever")
      ->capture_default_str();
  app.add_option("--idle-timeout", idle_timeout,
                 "exit once the last session has been gone this long; 0 never")
      ->capture_default_str();
  app.add_option("--session-grace", session_grace,
                 "how long a disconnected session waits for its client to resume")
      ->capture_default_str();
  app.add_option("--drain-timeout", drain_timeout,
                 "on SIGTERM: how long connections in flight may go on (new ones reach the "
                 "application at once) before they are reset and the agent exits 0; a second "
                 "SIGTERM or SIGINT exits at once")
      ->capture_default_str();
  app.add_option("--keepalive-interval", keepalive_interval,
                 "ping a silent client this often (a client may ask for less)")
      ->capture_default_str();
  app.add_option("--keepalive-timeout", keepalive_timeout,
                 "a client silent this long is cut off; its session waits --session-grace for "
                 "a resume (a client may ask for less)")
      ->capture_default_str();
  // Unauthenticated connections (docs/SECURITY.md#handshake-admission).
  app.add_option("--handshake-timeout", handshake_timeout,
                 "time from accept to a checked Hello, TLS handshake included; a connection "
                 "still in its handshake then is closed")
      ->capture_default_str();
  app.add_option("--max-handshakes", config.max_handshakes,
                 "connections in their handshake at once (not yet past the Hello); one more is "
                 "closed at once")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--max-handshakes-per-source", config.max_handshakes_per_source,
                 "connections in their handshake at once from one source address (at most "
                 "--max-handshakes); one more is closed at once")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  // Limits (docs/SECURITY.md#limits): each one hit is a typed error naming
  // its flag, and a log line.
  app.add_option("--max-sessions", config.max_sessions,
                 "concurrent sessions; one more client is rejected with TOO_MANY_SESSIONS")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--max-streams", config.limits.max_streams,
                 "streams open at once in one session (a client may ask for fewer); one more is "
                 "refused with TOO_MANY_STREAMS, the session goes on")
      ->check(CLI::Range(1u, protocol::kMaxStreamsCeiling))
      ->capture_default_str();
  app.add_option("--max-pending-requests", config.limits.max_pending_requests,
                 "requests one session may have unanswered; one more is answered "
                 "TOO_MANY_PENDING_REQUESTS")
      ->check(CLI::Range(1u, protocol::kMaxPendingRequestsCeiling))
      ->capture_default_str();
  uint32_t max_frame_kib = config.limits.max_frame_size / 1024;
  uint64_t max_session_buffer_kib = config.limits.replay_buffer_bytes / 1024;
  uint32_t max_read_kib = 0;
  app.add_option("--max-frame-size", max_frame_kib,
                 "KiB of one protocol frame; a larger frame is a protocol error (Goaway "
                 "FRAME_TOO_LARGE) that ends the session")
      ->check(CLI::Range(protocol::kMinFrameSize / 1024, protocol::kMaxFrameSizeCeiling / 1024))
      ->capture_default_str();
  app.add_option("--max-session-buffer", max_session_buffer_kib,
                 "KiB the agent holds for one session's client until it acknowledges them (at "
                 "least two frames): streams stop at it (backpressure), answers may take twice "
                 "it (a file read is shortened, or refused with SESSION_BUFFER_FULL); a client "
                 "that reads nothing is cut off past twice it")
      ->check(CLI::Range(uint64_t{8}, protocol::kMaxSessionBufferCeiling / 1024))
      ->capture_default_str();
  auto* max_read_opt =
      app.add_option("--max-read-size", max_read_kib,
                     "KiB of one file read or readdir answer (default: --max-frame-size less 1 "
                     "KiB); a larger read is clamped to it, a short read as read(2) may give");
  app.add_option("--max-open-files", config.max_open_files,
                 "file and directory handles one session may hold open; one more open is "
                 "answered EMFILE naming this limit, a close frees a slot")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  std::string fs_mode = "ro";
  app.add_option("--fs-mode", fs_mode,
                 "file access inside the target: ro (writes answer EROFS), rw, or off")
      ->check(CLI::IsMember({"ro", "rw", "off"}))
      ->capture_default_str();
  std::string fs_identity = "target";
  app.add_option("--fs-identity", fs_identity,
                 "whose powers file access has: target (the target's uid, gids and "
                 "capabilities) or root (uid 0 in the target with only the file capabilities); "
                 "never any process's memory, environment or fds (docs/SECURITY.md)")
      ->check(CLI::IsMember({"target", "root"}))
      ->capture_default_str();
  bool keep_capabilities = false;
  app.add_flag("--keep-capabilities", keep_capabilities,
               "do not drop the capabilities the mode and flags do not need (debugging only; "
               "see docs/SECURITY.md)");
  app.add_option("--steal-backend", config.steal_backend,
                 "how incoming connections are stolen: auto (sk_lookup, falling back to "
                 "iptables), sk_lookup (eBPF) or iptables (nat REDIRECT); see docs/STEAL.md")
      ->check(CLI::IsMember({"auto", "sk_lookup", "iptables"}))
      ->capture_default_str();
  app.add_option("--iptables", config.iptables_mode,
                 "iptables flavour of the iptables backend: auto (the one the target already "
                 "uses), nft or legacy")
      ->check(CLI::IsMember({"auto", "nft", "legacy"}))
      ->capture_default_str();
  uint32_t mirror_ring_kib = config.mirror_ring_bytes / 1024;
  size_t mirror_buffer_kib = config.mirror_buffer_bytes / 1024;
  app.add_option("--mirror-ring-size", mirror_ring_kib,
                 "KiB of the ring buffer the mirror's TC program copies packets into (a power of "
                 "two, at least 4); a burst larger than it is lost, and reported as gaps")
      ->check(CLI::Range(4u, 1u << 20))
      ->capture_default_str();
  app.add_option("--mirror-buffer", mirror_buffer_kib,
                 "KiB a mirroring session may hold while its client is slower than the traffic; "
                 "past it the session's copy loses bytes, reported as gaps (the application "
                 "never waits)")
      ->check(CLI::Range(size_t{64}, size_t{1} << 22))
      ->capture_default_str();

  std::string http_detect_timeout = "500ms";
  size_t http_max_head_kib = config.http_max_head_bytes / 1024;
  uint64_t http_max_request_mib = 0, http_max_response_mib = 0;
  std::string http_idle_timeout = "60s";
  app.add_option("--http-detect-timeout", http_detect_timeout,
                 "how long a connection to a port with filtered steals may stay silent before "
                 "it is taken for a server-first protocol (SMTP, MySQL...) and passed through "
                 "untouched")
      ->capture_default_str();
  app.add_option("--http-max-head", http_max_head_kib,
                 "KiB of a request's or response's head (request line and headers) in a filtered "
                 "steal; a larger request is answered 431, a larger response 502")
      ->check(CLI::Range(size_t{1}, size_t{16384}))
      ->capture_default_str();
  app.add_option("--http-max-request-body", http_max_request_mib,
                 "MiB of a request body in a filtered steal, 0 for no limit; a larger one is "
                 "answered 413 (bodies are streamed, never held whole)")
      ->capture_default_str();
  app.add_option("--http-max-response-body", http_max_response_mib,
                 "MiB of a response body in a filtered steal, 0 for no limit; a larger one ends "
                 "in 502, or the connection aborted once the response has begun")
      ->capture_default_str();
  app.add_option("--http-idle-timeout", http_idle_timeout,
                 "how long a client connection of a filtered steal may stay idle between requests")
      ->capture_default_str();

  int pid = 0;
  std::string container_id;
  std::string runtime_name = "auto";
  runtime::RuntimeOptions runtime_options;
  auto* targeted = app.add_subcommand("targeted", "serve inside a target process's namespaces");
  auto* pid_opt = targeted->add_option("--pid", pid, "the target's PID on this node");
  auto* cid_opt = targeted->add_option(
      "--container-id", container_id,
      "the target container, resolved through its runtime (ID, or containerd://ID, "
      "docker://ID, cri-o://ID as Kubernetes shows it)");
  pid_opt->excludes(cid_opt);
  auto* runtime_opt =
      targeted
          ->add_option("--runtime", runtime_name,
                       "runtime to ask for --container-id: auto tries the known sockets")
          ->check(CLI::IsMember({"auto", "containerd", "docker", "cri-o"}))
          ->capture_default_str();
  auto* endpoint_opt = targeted->add_option("--runtime-endpoint", runtime_options.endpoint,
                                            "the runtime's unix socket (default: its known paths)");
  auto* ns_opt = targeted
                     ->add_option("--containerd-namespace", runtime_options.containerd_namespace,
                                  "containerd namespace of the container")
                     ->capture_default_str();
  for (auto* o : {runtime_opt, endpoint_opt, ns_opt}) o->needs(cid_opt);

  std::string ephemeral_container_id;
  auto* ephemeral = app.add_subcommand(
      "ephemeral", "an ephemeral container in the target pod: the target is found in /proc");
  ephemeral->add_option("--container-id", ephemeral_container_id,
                        "the target container, found by its cgroup (default: PID 1)");
  auto* targetless = app.add_subcommand("targetless", "no target: the agent's own namespaces");
  (void)targetless;

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }

  log::Format format;
  if (auto s = log::parseFormat(log_format, &format); !s.ok())
    return fail(kExitUsage, sv(s.message()));
  if (auto s = log::init(format, log_level); !s.ok()) return fail(kExitUsage, sv(s.message()));
  net::setSpawnFailureReporter(&log::coroutineFailed);
  for (auto [text, out] : {std::pair{&first_client_timeout, &config.first_client_timeout},
                           std::pair{&idle_timeout, &config.idle_timeout},
                           std::pair{&session_grace, &config.limits.session_grace},
                           std::pair{&drain_timeout, &config.drain_timeout},
                           std::pair{&handshake_timeout, &config.handshake_timeout},
                           std::pair{&keepalive_interval, &config.limits.keepalive_interval},
                           std::pair{&keepalive_timeout, &config.limits.keepalive_timeout},
                           std::pair{&http_detect_timeout, &config.http_detect_timeout},
                           std::pair{&http_idle_timeout, &config.http_idle_timeout}}) {
    auto d = parseDuration(*text);
    if (!d.ok()) return fail(kExitUsage, sv(d.status().message()));
    *out = *d;
  }
  if (config.handshake_timeout.count() <= 0) {
    return fail(kExitUsage,
                absl::StrCat("--handshake-timeout ", handshake_timeout, ": must be positive"));
  }
  if (config.max_handshakes_per_source > config.max_handshakes) {
    return fail(kExitUsage,
                absl::StrCat("--max-handshakes-per-source ", config.max_handshakes_per_source,
                             ": must be at most --max-handshakes (", config.max_handshakes, ")"));
  }
  if (config.http_detect_timeout.count() <= 0 || config.http_idle_timeout.count() <= 0) {
    return fail(kExitUsage, "--http-detect-timeout and --http-idle-timeout must be positive");
  }
  if (config.limits.keepalive_timeout.count() <= 0 ||
      config.limits.keepalive_interval.count() <= 0 ||
      config.limits.keepalive_interval * 2 > config.limits.keepalive_timeout) {
    return fail(kExitUsage,
                absl::StrCat("--keepalive-interval (", config.limits.keepalive_interval.count(),
                             " ms) must be positive and at most half of "
                             "--keepalive-timeout (",
                             config.limits.keepalive_timeout.count(), " ms)"));
  }

  config.limits.max_frame_size = max_frame_kib * 1024;
  config.limits.replay_buffer_bytes = max_session_buffer_kib * 1024;
  config.limits.max_read_size = max_read_opt->count() > 0
                                    ? max_read_kib * 1024
                                    : config.limits.max_frame_size - protocol::kReadSizeHeadroom;
  if (max_read_kib > protocol::kMaxFrameSizeCeiling / 1024) {
    config.limits.max_read_size = protocol::kMaxFrameSizeCeiling;  // refused just below
  }
  if (auto s = protocol::validateAgentLimits(config.limits); !s.ok()) {
    return fail(kExitUsage, sv(s.message()));
  }

  if ((mirror_ring_kib & (mirror_ring_kib - 1)) != 0) {
    return fail(kExitUsage, absl::StrCat("--mirror-ring-size ", mirror_ring_kib,
                                         ": must be a power of two (KiB)"));
  }
  config.mirror_ring_bytes = mirror_ring_kib * 1024;
  config.mirror_buffer_bytes = mirror_buffer_kib * 1024;
  config.http_max_head_bytes = http_max_head_kib * 1024;
  config.http_max_request_body = http_max_request_mib << 20;
  config.http_max_response_body = http_max_response_mib << 20;

  config.fs_mode = fs_mode == "rw"    ? FsMode::kReadWrite
                   : fs_mode == "off" ? FsMode::kOff
                                      : FsMode::kReadOnly;

  config.fs_identity = fs_identity == "root" ? FsIdentity::kRoot : FsIdentity::kTarget;
  // File work runs in the file helper, this binary re-executed
  // (agent/files/fs_helper.h).
  config.fs_helper_exe = "/proc/self/exe";

  if (!token_file.empty()) {
    auto token = readToken(token_file);
    if (!token.ok()) return fail(kExitUsage, sv(token.status().message()));
    config.token = *token;
  } else if (const char* env = std::getenv("SIPHON_TOKEN"); env != nullptr && *env != '\0') {
    config.token = env;
  }
  if (config.token.empty() && !config.insecure_no_auth) {
    return fail(kExitUsage,
                "refusing to start without client authentication: give --token-file PATH or "
                "SIPHON_TOKEN, or --insecure-no-auth to accept anyone who can reach the port");
  }
  // Bad TLS files are a usage error, told before anything is opened.
  if (!config.tls_cert.empty() || !config.tls_key.empty() || !config.tls_client_ca.empty()) {
    auto tls = net::tls::serverContext({config.tls_cert, config.tls_key, config.tls_client_ca});
    if (!tls.ok()) return fail(kExitUsage, sv(tls.status().message()));
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
  if (auto s = applyCapabilityDrop(config,
                                   targeted->parsed()    ? TargetMode::kTargeted
                                   : ephemeral->parsed() ? TargetMode::kEphemeral
                                                         : TargetMode::kTargetless,
                                   keep_capabilities);
      !s.ok()) {
    log::error("capabilities_failed", {{"error", sv(s.message())}});
    return fail(kExitInternal, sv(s.message()));
  }

  auto procfs = std::make_unique<RealProcFs>();
  absl::StatusOr<std::unique_ptr<Target>> target;
  if (targeted->parsed() && cid_opt->count() > 0) {
    if (runtime_name != "auto") {
      auto kind = runtime::parseRuntimeName(runtime_name);
      if (!kind.ok()) return fail(kExitUsage, sv(kind.status().message()));
      runtime_options.runtime = *kind;
    }
    // Blocking calls to the runtime: fine here, before the event loop runs.
    runtime::RuntimeResolver resolver(runtime_options, runtime::realClientFactory(runtime_options));
    target = runtime::openContainerTarget(*procfs, resolver, container_id);
  } else if (targeted->parsed()) {
    if (pid_opt->count() == 0)
      return fail(kExitUsage, "targeted needs --pid PID or --container-id ID");
    if (pid <= 0) return fail(kExitUsage, absl::StrCat("--pid ", pid, " is not a valid PID"));
    TargetSpec spec;
    spec.mode = TargetMode::kTargeted;
    spec.pid = pid;
    target = Target::open(*procfs, std::move(spec));
  } else if (ephemeral->parsed()) {
    target = runtime::openEphemeralTarget(*procfs, ephemeral_container_id);
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
  if (auto s = server.init(); !s.ok()) {
    log::error("init_failed", {{"error", sv(s.message())}});
    return fail(s.code() == absl::StatusCode::kPermissionDenied ? kExitPermission : kExitInternal,
                sv(s.message()));
  }
  if (auto s = server.listen(); !s.ok()) {
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
  if (argc > 1 && std::string_view(argv[1]) == siphon::agent::steal::kIptablesGuardCommand)
    return siphon::agent::steal::iptablesGuardMain(argc, argv);
  if (argc > 1 && std::string_view(argv[1]) == siphon::agent::files::kFsHelperCommand)
    return siphon::agent::files::fsHelperMain(argc, argv);
  // Not dumpable: the agent's /proc/PID/* (memory, environment, fds) then
  // need CAP_SYS_PTRACE of whoever opens them, which the file helper, and a
  // target of the same uid, never have (docs/SECURITY.md, "File identity").
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
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
