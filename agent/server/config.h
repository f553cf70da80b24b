// The agent's configuration, from the command line (agent/main.cc).
#pragma once

#include <chrono>
#include <string>

#include "siphon/protocol/limits.h"

namespace siphon::agent {

// --fs-mode: what file requests may do inside the target's root.
enum class FsMode { kReadOnly, kReadWrite, kOff };
// --fs-identity: whose powers the file helper (agent/files/fs_helper.h) has.
// kTarget: the target's uid, gids and capabilities; kRoot: uid 0 with only
// the file capabilities. Either way no /proc entry of another process's
// memory, environment or fds (docs/SECURITY.md, "File identity").
enum class FsIdentity { kTarget, kRoot };

struct AgentConfig {
  std::string listen = "0.0.0.0:7140";
  std::string token;  // empty only with insecure_no_auth
  bool insecure_no_auth = false;
  // --tls-cert/--tls-key (PEM): the listener speaks TLS; --tls-client-ca:
  // and asks every client for a certificate signed by it (mutual TLS). In
  // addition to the token. Empty: plain TCP.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::chrono::milliseconds first_client_timeout{30000};
  std::chrono::milliseconds idle_timeout{0};  // 0: never
  // --handshake-timeout: one deadline from accept() to the checked Hello,
  // across the TLS handshake and the Hello.
  std::chrono::milliseconds handshake_timeout{10000};
  // --handshake-first-bytes-timeout: from accept to the peer's first bytes
  // (a TLS ClientHello or the Hello's); a peer silent that long is closed.
  // The smaller of it and handshake_timeout applies.
  std::chrono::milliseconds handshake_first_bytes_timeout{2000};
  // --max-handshakes, --max-handshakes-per-source: connections that have
  // not finished the handshake, in all and from one source address; one
  // more takes the place of the one of that cap that has waited longest
  // without a complete Hello (docs/SECURITY.md#handshake-admission).
  uint32_t max_handshakes = 128;
  uint32_t max_handshakes_per_source = 16;
  std::chrono::milliseconds drain_timeout{25000};
  // --target-restart-timeout: when the target's process exits and it came
  // from a container (--container-id, ephemeral), how long the agent waits
  // for the container's next process in the same network namespace and
  // adopts it (docs/CONTINUITY.md#a-restarting-target); 0: exit at once.
  std::chrono::milliseconds target_restart_timeout{30000};
  uint32_t max_sessions = 64;
  // Handover (docs/CONTINUITY.md, "Handover"). --handover-socket: where a
  // new agent may take this one over (empty: nowhere). --take-over: start
  // by taking over the agent listening there, instead of binding --listen.
  // --handover-timeout: how long each side waits for the other's next step
  // (the new agent's import: its steering, every session); the freeze wait
  // (--handover-wait) is how long answers, connects and HTTP requests
  // under way may take to end, before the freeze and again after it.
  std::string handover_socket;
  std::string take_over;
  std::chrono::milliseconds handover_timeout{30000};
  std::chrono::milliseconds handover_freeze_wait{3000};
  // What the handover's proofs are keyed from (agent/server/handover_auth.h):
  // --handover-key-file's content; empty: the client token. Both agents of
  // a handover must hold the same.
  std::string handover_secret;
  // --handover-max-state: the largest state a new agent imports.
  uint64_t handover_max_state_bytes = 1ull << 30;
  // --metrics HOST:PORT: /metrics, /healthz, /readyz (docs/OPERATIONS.md);
  // empty: off.
  std::string metrics_listen;
  // --max-open-files: file and directory handles one session may hold.
  uint32_t max_open_files = 1024;
  // --max-file-watches, --max-file-watch-instances: inotify watches and
  // instances of all sessions together (agent/files/watch_limits.h). The
  // command line sets a quarter of the node's limits when not given; these
  // are a quarter of the kernel's defaults.
  uint32_t max_file_watches = 2048;
  uint32_t max_file_watch_instances = 32;
  FsMode fs_mode = FsMode::kReadOnly;
  FsIdentity fs_identity = FsIdentity::kTarget;
  // The binary the file helper is exec'd from (siphon-agent sets
  // "/proc/self/exe"). Empty: file calls run in the agent's own process
  // (in-process tests only: the agent's powers, guarded by fs_guard.h alone).
  std::string fs_helper_exe;
  // --steal-backend: auto (sk_lookup, else iptables), sk_lookup, iptables.
  std::string steal_backend = "auto";
  // --iptables: which iptables the iptables backend uses: auto, nft, legacy.
  std::string iptables_mode = "auto";
  // --probe-source: source prefixes (CIDR, checked at parse time) no steal
  // takes: the kubelet's probes (agent/steal/source_prefix.h).
  std::vector<std::string> probe_sources;
  // --mirror-ring-size: the TC program's ring buffer (a power of two).
  uint32_t mirror_ring_bytes = 32u << 20;
  // --mirror-buffer: bytes a mirror subscription may hold for a slow client.
  size_t mirror_buffer_bytes = 32u << 20;
  // Filtered steal (--http-*; docs/STEAL.md): how long a connection may stay
  // silent before it is taken for a server-first protocol and passed
  // through, the head and body limits (0: none) and the idle timeout of
  // client connections.
  std::chrono::milliseconds http_detect_timeout{500};
  size_t http_max_head_bytes = 64u << 10;
  uint64_t http_max_request_body = 0;
  uint64_t http_max_response_body = 0;
  std::chrono::milliseconds http_idle_timeout{60000};
  // limits.session_grace is --session-grace; max_streams --max-streams,
  // max_pending_requests --max-pending-requests, max_frame_size
  // --max-frame-size, replay_buffer_bytes --max-session-buffer,
  // max_read_size --max-read-size (docs/SECURITY.md#limits).
  protocol::SessionLimits limits;
};

// Exit codes of siphon-agent (documented in README.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,
  kExitUsage = 2,
  kExitTargetNotFound = 3,
  kExitPermission = 4,
  kExitListen = 5,
  kExitNoClient = 6,
  kExitRuntimeUnavailable = 7,  // no container runtime answered (--container-id)
  // The target came back in another network namespace (its pod was deleted
  // or recreated): what the agent steered there serves no one; it drained.
  kExitTargetNetnsGone = 8,
};

}  // namespace siphon::agent
