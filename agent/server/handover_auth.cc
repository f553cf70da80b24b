#include "agent/server/handover_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/unique_fd.h"
#include "agent/server/handover_channel.h"
#include "siphon/status.h"

#ifndef SIPHON_VERSION
#define SIPHON_VERSION "0.0.0"
#endif

namespace siphon::agent::handover {

namespace {

// Labels: a key or a proof of this protocol is never one of anything else.
constexpr std::string_view kKeyLabel = "siphon-agent handover key v1";
constexpr std::string_view kProofLabel = "siphon-agent handover proof v1";

std::string hmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
             &len) == nullptr) {
    // Only an OpenSSL without SHA-256: nothing to go on with.
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

void appendBigEndian(std::string* out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out->push_back(static_cast<char>(v >> shift));
}

// Fixed-width fields, each nonce with its length: one byte string per
// transcript, none the prefix of another's.
std::string encode(Role role, const Transcript& t) {
  std::string m(kProofLabel);
  m.push_back('\0');
  m.append(role == Role::kOld ? "old" : "new");
  m.push_back('\0');
  for (const std::string* n : {&t.new_nonce, &t.old_nonce}) {
    appendBigEndian(&m, n->size());
    m.append(*n);
  }
  appendBigEndian(&m, static_cast<uint64_t>(t.new_pid));
  appendBigEndian(&m, static_cast<uint64_t>(t.old_pid));
  appendBigEndian(&m, static_cast<uint64_t>(t.target_pid));
  appendBigEndian(&m, t.target_netns_inode);
  return m;
}

const char* kWhichSecret =
    "the same --token-file or SIPHON_TOKEN as this agent, or the same --handover-key-file";

}  // namespace

std::string deriveKey(std::string_view secret) {
  if (secret.empty()) return "";
  return hmacSha256(secret, kKeyLabel);
}

std::string prove(std::string_view key, Role role, const Transcript& t) {
  return hmacSha256(key, encode(role, t));
}

bool verify(std::string_view key, Role role, const Transcript& t, std::string_view proof) {
  if (key.empty() || proof.size() != kProofBytes) return false;
  const std::string want = prove(key, role, t);
  return want.size() == proof.size() && CRYPTO_memcmp(want.data(), proof.data(), want.size()) == 0;
}

absl::StatusOr<std::string> makeNonce() {
  std::string n(kNonceBytes, '\0');
  if (::RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1) {
    return absl::InternalError("handover: no random bytes for a nonce");
  }
  return n;
}

absl::Status answerHello(int sock, std::string_view key, const v1::HandoverHello& hello,
                         pid_t peer_pid, std::chrono::milliseconds timeout) {
  if (hello.handshake() < kHandshake || hello.nonce().size() != kNonceBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the new agent (version ", hello.agent_version(),
                     ") does not prove that it holds the handover key (its handover handshake is ",
                     std::max<uint32_t>(hello.handshake(), 1), "; this agent, version ",
                     SIPHON_VERSION, ", needs ", kHandshake,
                     "): take over with an agent of version ", SIPHON_VERSION, " or later"));
  }
  if (key.empty()) {
    return absl::FailedPreconditionError(
        "this agent has no handover key (no token and no --handover-key-file)");
  }
  if (hello.pid() != peer_pid) {
    return absl::PermissionDeniedError(absl::StrCat("the new agent says it is pid ", hello.pid(),
                                                    ", its socket says pid ", peer_pid,
                                                    ": both agents must run in one PID namespace"));
  }
  Transcript t;
  t.new_nonce = hello.nonce();
  ASSIGN_OR_RETURN(t.old_nonce, makeNonce());
  t.new_pid = peer_pid;
  t.old_pid = ::getpid();
  t.target_pid = hello.target_pid();
  t.target_netns_inode = hello.target_netns_inode();
  v1::HandoverMessage challenge;
  challenge.mutable_challenge()->set_nonce(t.old_nonce);
  challenge.mutable_challenge()->set_proof(prove(key, Role::kOld, t));
  challenge.mutable_challenge()->set_pid(static_cast<int32_t>(t.old_pid));
  RETURN_IF_ERROR(send(sock, challenge));
  std::vector<UniqueFd> fds;
  auto answer = receive(sock, timeout, &fds);
  if (!answer.ok()) {
    return absl::Status(answer.status().code(),
                        absl::StrCat("no proof from the new agent: ", answer.status().message()));
  }
  if (!fds.empty()) {
    return absl::PermissionDeniedError("the new agent sent descriptors with its proof");
  }
  if (answer->has_refused()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the new agent refused: ", answer->refused().reason()));
  }
  if (!answer->has_proof()) {
    return absl::PermissionDeniedError("the new agent answered the challenge without a proof");
  }
  if (!verify(key, Role::kNew, t, answer->proof().proof())) {
    return absl::PermissionDeniedError(
        absl::StrCat("the new agent's proof is wrong: it does not hold this agent's handover key (",
                     kWhichSecret, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Transcript> checkChallenge(int sock, std::string_view key,
                                          const v1::HandoverHello& hello, pid_t peer_pid,
                                          std::chrono::milliseconds timeout) {
  std::vector<UniqueFd> fds;
  ASSIGN_OR_RETURN(v1::HandoverMessage m, receive(sock, timeout, &fds));
  // Whatever came with it is closed with `fds`, unused.
  if (!fds.empty()) {
    return absl::PermissionDeniedError(
        "it sent descriptors before it proved that it holds the handover key");
  }
  if (m.has_refused()) return absl::FailedPreconditionError(m.refused().reason());
  if (m.has_offer()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "it offered its state without proving that it holds the handover key (version ",
        m.offer().agent_version(),
        ", from before the proofs: such an agent hands over to anyone and is not taken over; "
        "restart it instead)"));
  }
  if (!m.has_challenge()) return absl::PermissionDeniedError("it answered out of turn");
  const v1::HandoverChallenge& c = m.challenge();
  if (c.pid() != peer_pid) {
    return absl::PermissionDeniedError(absl::StrCat("it says it is pid ", c.pid(),
                                                    ", its socket says pid ", peer_pid,
                                                    ": both agents must run in one PID namespace"));
  }
  Transcript t;
  t.new_nonce = hello.nonce();
  t.old_nonce = c.nonce();
  t.new_pid = ::getpid();
  t.old_pid = peer_pid;
  t.target_pid = hello.target_pid();
  t.target_netns_inode = hello.target_netns_inode();
  if (t.old_nonce.size() != kNonceBytes || !verify(key, Role::kOld, t, c.proof())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "it does not prove that it holds this agent's handover key (a socket of another "
        "process, or an agent started without ",
        kWhichSecret, ")"));
  }
  return t;
}

absl::Status sendProof(int sock, std::string_view key, const Transcript& t) {
  v1::HandoverMessage m;
  m.mutable_proof()->set_proof(prove(key, Role::kNew, t));
  return send(sock, m);
}

}  // namespace siphon::agent::handover
