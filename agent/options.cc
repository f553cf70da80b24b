#include "agent/options.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/runtime/runtime_client.h"
#include "agent/steal/source_prefix.h"
#include "siphon/status.h"
#include "siphon/text.h"
#include "siphon/transport/tls.h"

namespace siphon::agent {
namespace {

ParsedOptions usage(std::ostream& err, std::string_view message) {
  err << "siphon-agent: " << message << "\n";
  return {std::nullopt, kExitUsage};
}

absl::StatusOr<std::string> readToken(const std::string& path, const char* flag = "--token-file") {
  std::ifstream in(path);
  if (!in) return lastErrnoStatus(absl::StrCat("read ", flag, " ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, " is empty"));
  }
  return token;
}

}  // namespace

ParsedOptions parseOptions(int argc, const char* const* argv, const char* env_token,
                           std::ostream& out, std::ostream& err,
                           const files::NodeInotifyLimits& inotify) {
  CLI::App app{"siphon-agent: lets a remote session act as if it ran inside a target pod",
               "siphon-agent"};
  app.set_version_flag("--version", SIPHON_VERSION);
  app.require_subcommand(1);
  // Global options may come before or after the mode.
  app.fallthrough();

  AgentOptions o;
  AgentConfig& config = o.config;
  std::string token_file, log_format = "text", log_level = "info";
  std::string first_client_timeout = "30s", idle_timeout = "0s", session_grace = "60s";
  std::string drain_timeout = "25s";
  std::string handover_timeout = "30s";
  std::string handover_wait = "3s";
  std::string handover_key_file;
  uint64_t handover_max_state_mib = config.handover_max_state_bytes >> 20;
  std::string target_restart_timeout = "30s";
  std::string handshake_timeout = "10s", handshake_first_bytes_timeout = "2s";
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
  app.add_option("--handover-socket", config.handover_socket,
                 "a unix socket (mode 0600) on which a new agent process started with "
                 "--take-over PATH takes this one over: sessions, stolen and outgoing "
                 "connections and the steal move to it, and this agent exits 0 "
                 "(docs/CONTINUITY.md, Handover). An absolute path in a directory only root "
                 "writes, never a place other containers share (/dev/shm, an emptyDir): in a "
                 "container its own /dev, e.g. /dev/siphon-handover.sock");
  app.add_option("--take-over", config.take_over,
                 "start by taking over the agent whose --handover-socket is PATH (same target) "
                 "instead of binding --listen: its listener, sessions, connections and steal; "
                 "if anything fails, that agent goes on and this one exits 1. 'auto': the one "
                 "other siphon-agent process here with a socket at this agent's "
                 "--handover-socket path in its root (/proc/PID/root/PATH: another container "
                 "of the pod)");
  app.add_option("--handover-key-file", handover_key_file,
                 "file holding the secret both agents of a handover prove they hold (default: "
                 "the client token); needed for --handover-socket or --take-over with "
                 "--insecure-no-auth");
  app.add_option("--handover-max-state", handover_max_state_mib,
                 "MiB of the largest state this agent takes over; a larger one is refused and the "
                 "old agent goes on")
      ->check(CLI::Range(uint64_t{1}, uint64_t{2047}))
      ->capture_default_str();
  app.add_option("--handover-timeout", handover_timeout,
                 "how long each agent of a handover waits for the other's next step")
      ->capture_default_str();
  app.add_option("--handover-wait", handover_wait,
                 "how long an agent being handed over lets what is under way end (an HTTP "
                 "request of a filtered steal, a connect) before it refuses the handover and "
                 "goes on")
      ->capture_default_str();
  app.add_option("--drain-timeout", drain_timeout,
                 "on SIGTERM: how long connections in flight may go on (new ones reach the "
                 "application at once) before they are reset and the agent exits 0; a second "
                 "SIGTERM or SIGINT exits at once")
      ->capture_default_str();
  app.add_option("--target-restart-timeout", target_restart_timeout,
                 "when the target's container restarts (a new process, the same pod): how long "
                 "to wait for its new process and adopt it, keeping every session and steal; "
                 "0 exits when the target exits")
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
  app.add_option("--handshake-first-bytes-timeout", handshake_first_bytes_timeout,
                 "time from accept to the client's first bytes (a TLS ClientHello or its "
                 "Hello); a connection silent that long is closed (at most "
                 "--handshake-timeout applies)")
      ->capture_default_str();
  app.add_option("--max-handshakes", config.max_handshakes,
                 "connections in their handshake at once (not yet past the Hello); one more "
                 "takes the place of the one that has waited longest without a complete Hello")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--max-handshakes-per-source", config.max_handshakes_per_source,
                 "connections in their handshake at once from one source address (at most "
                 "--max-handshakes); one more takes the place of that address's connection that "
                 "has waited longest without a complete Hello")
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
  // Agent-wide: the node's inotify limits are per user, shared with its
  // other processes of that user (agent/files/watch_limits.h).
  uint64_t max_file_watches = 0, max_file_watch_instances = 0;
  auto* max_file_watches_opt = app.add_option(
      "--max-file-watches", max_file_watches,
      absl::StrCat("file watches of all sessions together (default: a quarter of this node's "
                   "fs.inotify.max_user_watches, ",
                   inotify.max_user_watches,
                   "; at most all of it); one more is answered ENOSPC naming this limit"));
  auto* max_file_watch_instances_opt = app.add_option(
      "--max-file-watch-instances", max_file_watch_instances,
      absl::StrCat("sessions that watch files at once, each holding one inotify instance "
                   "(default: a quarter of this node's fs.inotify.max_user_instances, ",
                   inotify.max_user_instances,
                   "; at most all of it); one more session's first watch is answered EMFILE "
                   "naming this limit"));
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
  app.add_flag("--keep-capabilities", o.keep_capabilities,
               "do not drop the capabilities the mode and flags do not need (debugging only; "
               "see docs/SECURITY.md)");
  app.add_option("--steal-backend", config.steal_backend,
                 "how incoming connections are stolen: auto (sk_lookup, falling back to "
                 "iptables), sk_lookup (eBPF) or iptables (nat REDIRECT); see docs/STEAL.md")
      ->check(CLI::IsMember({"auto", "sk_lookup", "iptables"}))
      ->capture_default_str();
  app.add_option("--probe-source", config.probe_sources,
                 "CIDR (repeatable): connections from there are never stolen, filtered or not, "
                 "on either backend: where the kubelet's health probes come from (the node's "
                 "address), so a steal never fails the pod's probes")
      ->type_name("CIDR")
      ->check([](const std::string& text) -> std::string {
        auto p = steal::parseSourcePrefix(text);
        return p.ok() ? std::string() : std::string(p.status().message());
      });
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

  std::string container_id;
  std::string runtime_name = "auto";
  runtime::RuntimeOptions& runtime_options = o.runtime_options;
  auto* targeted = app.add_subcommand("targeted", "serve inside a target process's namespaces");
  auto* pid_opt = targeted->add_option("--pid", o.pid, "the target's PID on this node");
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

  auto* ephemeral = app.add_subcommand(
      "ephemeral", "an ephemeral container in the target pod: the target is found in /proc");
  ephemeral->add_option("--container-id", o.ephemeral_container_id,
                        "the target container, found by its cgroup (default: PID 1)");
  app.add_subcommand("targetless", "no target: the agent's own namespaces");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e, out, err);
    return {std::nullopt, rc == 0 ? kExitOk : kExitUsage};
  }

  if (auto s = log::parseFormat(log_format, &o.log_format); !s.ok())
    return usage(err, sv(s.message()));
  log::Level level;
  if (auto s = log::parseLevel(log_level, &level); !s.ok()) return usage(err, sv(s.message()));
  o.log_level = log_level;
  for (auto [text, field] : {std::pair{&first_client_timeout, &config.first_client_timeout},
                             std::pair{&idle_timeout, &config.idle_timeout},
                             std::pair{&session_grace, &config.limits.session_grace},
                             std::pair{&drain_timeout, &config.drain_timeout},
                             std::pair{&handover_timeout, &config.handover_timeout},
                             std::pair{&handover_wait, &config.handover_freeze_wait},
                             std::pair{&target_restart_timeout, &config.target_restart_timeout},
                             std::pair{&handshake_timeout, &config.handshake_timeout},
                             std::pair{&keepalive_interval, &config.limits.keepalive_interval},
                             std::pair{&keepalive_timeout, &config.limits.keepalive_timeout},
                             std::pair{&http_detect_timeout, &config.http_detect_timeout},
                             std::pair{&http_idle_timeout, &config.http_idle_timeout}}) {
    auto d = parseDuration(*text);
    if (!d.ok()) return usage(err, sv(d.status().message()));
    *field = *d;
  }
  if (config.handover_timeout.count() <= 0) {
    return usage(err, absl::StrCat("--handover-timeout ", handover_timeout, ": must be positive"));
  }
  if (config.handover_freeze_wait.count() <= 0) {
    return usage(err, absl::StrCat("--handover-wait ", handover_wait, ": must be positive"));
  }
  if (config.handshake_timeout.count() <= 0) {
    return usage(err,
                 absl::StrCat("--handshake-timeout ", handshake_timeout, ": must be positive"));
  }
  // Parsed here, not with the durations above: its message names the flag.
  auto first_bytes = parseDuration(handshake_first_bytes_timeout);
  if (!first_bytes.ok() || first_bytes->count() <= 0) {
    return usage(
        err, absl::StrCat("--handshake-first-bytes-timeout ", handshake_first_bytes_timeout, ": ",
                          first_bytes.ok() ? "must be positive" : first_bytes.status().message()));
  }
  config.handshake_first_bytes_timeout = *first_bytes;
  if (config.max_handshakes_per_source > config.max_handshakes) {
    return usage(err,
                 absl::StrCat("--max-handshakes-per-source ", config.max_handshakes_per_source,
                              ": must be at most --max-handshakes (", config.max_handshakes, ")"));
  }
  if (config.http_detect_timeout.count() <= 0 || config.http_idle_timeout.count() <= 0) {
    return usage(err, "--http-detect-timeout and --http-idle-timeout must be positive");
  }
  if (config.limits.keepalive_timeout.count() <= 0 ||
      config.limits.keepalive_interval.count() <= 0 ||
      config.limits.keepalive_interval * 2 > config.limits.keepalive_timeout) {
    return usage(err,
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
    return usage(err, sv(s.message()));
  }

  if ((mirror_ring_kib & (mirror_ring_kib - 1)) != 0) {
    return usage(err, absl::StrCat("--mirror-ring-size ", mirror_ring_kib,
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

  auto watch_budget = files::watchBudget(
      max_file_watches_opt->count() > 0 ? std::optional<uint64_t>(max_file_watches) : std::nullopt,
      max_file_watch_instances_opt->count() > 0 ? std::optional<uint64_t>(max_file_watch_instances)
                                                : std::nullopt,
      inotify);
  if (!watch_budget.ok()) return usage(err, sv(watch_budget.status().message()));
  config.max_file_watches = watch_budget->watches;
  config.max_file_watch_instances = watch_budget->instances;

  config.fs_identity = fs_identity == "root" ? FsIdentity::kRoot : FsIdentity::kTarget;
  // File work runs in the file helper, this binary re-executed
  // (agent/files/fs_helper.h).
  config.fs_helper_exe = "/proc/self/exe";

  if (!token_file.empty()) {
    auto token = readToken(token_file);
    if (!token.ok()) return usage(err, sv(token.status().message()));
    config.token = *token;
  } else if (env_token != nullptr && *env_token != '\0') {
    config.token = env_token;
  }
  if (config.token.empty() && !config.insecure_no_auth) {
    return usage(err,
                 "refusing to start without client authentication: give --token-file PATH or "
                 "SIPHON_TOKEN, or --insecure-no-auth to accept anyone who can reach the port");
  }
  // A handover hands over everything: both agents prove that they hold one
  // secret (docs/SECURITY.md), the token unless a key file is given.
  config.handover_max_state_bytes = handover_max_state_mib << 20;
  if (!handover_key_file.empty()) {
    auto key = readToken(handover_key_file, "--handover-key-file");
    if (!key.ok()) return usage(err, sv(key.status().message()));
    config.handover_secret = *key;
  }
  if (config.token.empty() && config.handover_secret.empty() &&
      (!config.handover_socket.empty() || !config.take_over.empty())) {
    return usage(err, absl::StrCat(config.take_over.empty() ? "--handover-socket" : "--take-over",
                                   " needs a secret both agents hold, to prove it to each other: "
                                   "give --token-file or SIPHON_TOKEN, or --handover-key-file"));
  }
  // Bad TLS files are a usage error, told before anything is opened.
  if (!config.tls_cert.empty() || !config.tls_key.empty() || !config.tls_client_ca.empty()) {
    auto tls = net::tls::serverContext({config.tls_cert, config.tls_key, config.tls_client_ca});
    if (!tls.ok()) return usage(err, sv(tls.status().message()));
  }

  if (targeted->parsed()) {
    o.mode = TargetMode::kTargeted;
    if (cid_opt->count() > 0) {
      o.container_id = container_id;
      if (runtime_name != "auto") {
        auto kind = runtime::parseRuntimeName(runtime_name);
        if (!kind.ok()) return usage(err, sv(kind.status().message()));
        runtime_options.runtime = *kind;
      }
    } else if (pid_opt->count() == 0) {
      return usage(err, "targeted needs --pid PID or --container-id ID");
    } else if (o.pid <= 0) {
      return usage(err, absl::StrCat("--pid ", o.pid, " is not a valid PID"));
    }
  } else if (ephemeral->parsed()) {
    o.mode = TargetMode::kEphemeral;
  } else {
    o.mode = TargetMode::kTargetless;
  }
  return {std::move(o), kExitOk};
}

}  // namespace siphon::agent
