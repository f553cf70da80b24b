// The proofs of a handover (docs/SECURITY.md, "The handover socket gives
// everything: only to the agent's own"): before the old agent prepares,
// freezes, exports or sends a descriptor, and before the new agent trusts
// an offer or imports anything, each side proves that it holds the secret
// both agents were started with (the client token, or --handover-key-file),
// which the pod's other containers do not have. Reaching the socket is not
// enough: root in the pod's namespaces, or a process that planted a socket
// where a new agent looks, learns nothing and gets nothing.
//
// A mutual challenge-response over the connected socket:
//
//   new -> old   Hello{handshake 2, nonce N}
//   old -> new   Challenge{nonce O, proof(old)}     new checks it
//   new -> old   Proof{proof(new)}                  old checks it
//
// proof(role) = HMAC-SHA256(key, label, role, N, O, the new and the old
// agent's pid, the hello's target pid and netns inode), key =
// HMAC-SHA256(secret, label): neither the secret nor the key crosses the
// socket. Fresh nonces on both sides make every proof good for one
// connection only; the role keeps the old agent's proof from being played
// back as a new agent's. The pids are the kernel's (SO_PEERCRED on one
// side, getpid() on the other), so a process that relays between a real
// new agent and a real old one (each of which sees the relay's pid, not
// the other's) makes both proofs fail: both agents must run in one PID
// namespace, which the ephemeral form and the Job form give.
//
// Threads: blocking calls on the socket, each bounded by its timeout; any
// thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "siphon/v1/handover.pb.h"

namespace siphon::agent::handover {

// The handshake this agent speaks: 2, the proofs. A hello without it (0,
// an agent from before the proofs) is refused: it cannot prove anything.
inline constexpr uint32_t kHandshake = 2;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256

// The key the proofs are made with, from the secret both agents hold. Empty
// for an empty secret (no key: no handover).
std::string deriveKey(std::string_view secret);

enum class Role { kOld, kNew };

// What a proof covers.
struct Transcript {
  std::string new_nonce;
  std::string old_nonce;
  int64_t new_pid = 0;
  int64_t old_pid = 0;
  int64_t target_pid = 0;
  uint64_t target_netns_inode = 0;
};

// HMAC-SHA256 of `t` for `role` under `key` (kProofBytes).
std::string prove(std::string_view key, Role role, const Transcript& t);
// Whether `proof` is prove(key, role, t); compared in constant time.
bool verify(std::string_view key, Role role, const Transcript& t, std::string_view proof);
// kNonceBytes of getrandom.
absl::StatusOr<std::string> makeNonce();

// Old side, on a socket whose peer (`peer_pid`, SO_PEERCRED) sent `hello`:
// sends the challenge and waits up to `timeout` for the new agent's proof.
// OK once the peer proved it holds `key`. Otherwise the reason, to send as
// the refusal and log: FAILED_PRECONDITION for a hello from before the
// proofs, PERMISSION_DENIED for a wrong proof, another pid than the
// kernel's, or descriptors where none belong; the channel's own errors
// (DEADLINE_EXCEEDED, UNAVAILABLE) as they come.
absl::Status answerHello(int sock, std::string_view key, const v1::HandoverHello& hello,
                         pid_t peer_pid, std::chrono::milliseconds timeout);

// New side, once `hello` went to the old agent (`peer_pid`, SO_PEERCRED):
// waits up to `timeout` for its challenge and checks its proof. The
// transcript to prove with (sendProof) once the old agent proved it holds
// `key`. FAILED_PRECONDITION with the old agent's reason when it refused;
// PERMISSION_DENIED when it answered without a proof (an offer: an agent
// from before the proofs) or with a wrong one, with another pid than the
// kernel's, or with descriptors.
absl::StatusOr<Transcript> checkChallenge(int sock, std::string_view key,
                                          const v1::HandoverHello& hello, pid_t peer_pid,
                                          std::chrono::milliseconds timeout);
// New side: the proof of `t` as the new agent.
absl::Status sendProof(int sock, std::string_view key, const Transcript& t);

}  // namespace siphon::agent::handover
