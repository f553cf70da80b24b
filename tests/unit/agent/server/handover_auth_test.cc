// The proofs of a handover (agent/server/handover_auth.h), both sides over
// a socket pair in this process: with the key, each side proves it; a new
// agent without the key is refused by the old one, an old side without it
// (a socket another process planted) by the new one, before either side
// says or sends anything else; a hello from before the proofs is refused
// with both versions; each proof holds only for its role, its nonces, its
// pids and its target. No root needed.
#include "agent/server/handover_auth.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <span>
#include <string>
#include <vector>

#include "agent/server/handover_channel.h"

namespace siphon::agent::handover {
namespace {

using std::chrono::seconds;

const std::string kKey = deriveKey("the-token-both-agents-hold");
const std::string kOtherKey = deriveKey("another-token");

struct Pair {
  UniqueFd old_side, new_side;
};

Pair socketPair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

v1::HandoverMessage helloMessage() {
  v1::HandoverMessage m;
  v1::HandoverHello& h = *m.mutable_hello();
  h.set_format(kFormat);
  h.set_min_format(kMinFormat);
  h.set_agent_version("9.9.9");
  h.set_pid(::getpid());
  h.set_target_pid(4242);
  h.set_target_netns_inode(4026530001);
  h.set_handshake(kHandshake);
  auto n = makeNonce();
  EXPECT_TRUE(n.ok());
  h.set_nonce(*n);
  return m;
}

// Whatever the other side sent after the step under test: a message, or
// the socket's end / nothing within a moment.
std::string nextFrom(int sock) {
  std::vector<UniqueFd> fds;
  auto m = receive(sock, std::chrono::milliseconds(200), &fds);
  if (!m.ok()) return absl::StrCat("nothing (", m.status().message(), ")");
  return absl::StrCat(m->ShortDebugString(), fds.empty() ? "" : " with descriptors");
}

TEST(HandoverAuthTest, BothSidesWithTheKeyProveIt) {
  Pair p = socketPair();
  const v1::HandoverMessage hello = helloMessage();
  auto old_side = std::async(std::launch::async, [&] {
    return answerHello(p.old_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
  });
  auto t = checkChallenge(p.new_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->new_nonce, hello.hello().nonce());
  EXPECT_EQ(t->old_nonce.size(), kNonceBytes);
  EXPECT_NE(t->old_nonce, t->new_nonce);
  ASSERT_TRUE(sendProof(p.new_side.get(), kKey, *t).ok());
  absl::Status proved = old_side.get();
  EXPECT_TRUE(proved.ok()) << proved;
}

// A new agent that reached the socket but holds another key (or none): its
// proof is refused, and the old side says nothing more.
TEST(HandoverAuthTest, ANewAgentWithoutTheKeyIsRefused) {
  Pair p = socketPair();
  const v1::HandoverMessage hello = helloMessage();
  auto old_side = std::async(std::launch::async, [&] {
    return answerHello(p.old_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
  });
  // It reads the challenge without checking it, and proves with its key.
  std::vector<UniqueFd> fds;
  auto challenge = receive(p.new_side.get(), seconds(5), &fds);
  ASSERT_TRUE(challenge.ok()) << challenge.status();
  ASSERT_TRUE(challenge->has_challenge());
  EXPECT_TRUE(fds.empty());
  Transcript t;
  t.new_nonce = hello.hello().nonce();
  t.old_nonce = challenge->challenge().nonce();
  t.new_pid = ::getpid();
  t.old_pid = challenge->challenge().pid();
  t.target_pid = 4242;
  t.target_netns_inode = 4026530001;
  ASSERT_TRUE(sendProof(p.new_side.get(), kOtherKey, t).ok());
  absl::Status proved = old_side.get();
  EXPECT_EQ(proved.code(), absl::StatusCode::kPermissionDenied) << proved;
  EXPECT_NE(std::string(proved.message()).find("does not hold this agent's handover key"),
            std::string::npos)
      << proved;
  // Nor does the old side's own proof help it: replayed as a new agent's.
  Pair q = socketPair();
  auto again = std::async(std::launch::async, [&] {
    return answerHello(q.old_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
  });
  auto c2 = receive(q.new_side.get(), seconds(5), &fds);
  ASSERT_TRUE(c2.ok() && c2->has_challenge());
  v1::HandoverMessage replay;
  replay.mutable_proof()->set_proof(c2->challenge().proof());
  ASSERT_TRUE(send(q.new_side.get(), replay).ok());
  EXPECT_EQ(again.get().code(), absl::StatusCode::kPermissionDenied);
}

// A socket another process serves (planted where a new agent looks, or a
// process named siphon-agent): its challenge proves nothing, so the new
// agent refuses it before it sends a proof or reads anything more; an
// offer without a challenge (an agent from before the proofs), or
// descriptors before the proof, likewise.
TEST(HandoverAuthTest, AnOldSideWithoutTheKeyIsRefusedBeforeAnything) {
  const v1::HandoverMessage hello = helloMessage();
  {
    Pair p = socketPair();
    // The impostor answers as an old agent would, with its own key.
    auto impostor = std::async(std::launch::async, [&] {
      return answerHello(p.old_side.get(), kOtherKey, hello.hello(), ::getpid(), seconds(1));
    });
    auto t = checkChallenge(p.new_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied) << t.status();
    EXPECT_NE(std::string(t.status().message()).find("does not prove that it holds"),
              std::string::npos)
        << t.status();
    // The new agent sent no proof: the impostor waited in vain.
    EXPECT_EQ(impostor.get().code(), absl::StatusCode::kDeadlineExceeded);
  }
  {
    Pair p = socketPair();
    v1::HandoverMessage offer;
    offer.mutable_offer()->set_format(kFormat);
    offer.mutable_offer()->set_agent_version("0.1.0");
    ASSERT_TRUE(send(p.old_side.get(), offer).ok());
    auto t = checkChallenge(p.new_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied) << t.status();
    EXPECT_NE(std::string(t.status().message()).find("offered its state without proving"),
              std::string::npos)
        << t.status();
  }
  {
    Pair p = socketPair();
    int pipe_fds[2];
    ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
    v1::HandoverMessage challenge;
    challenge.mutable_challenge()->set_nonce(std::string(kNonceBytes, 'x'));
    challenge.mutable_challenge()->set_pid(::getpid());
    ASSERT_TRUE(send(p.old_side.get(), challenge, std::span<const int>(pipe_fds, 2)).ok());
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    auto t = checkChallenge(p.new_side.get(), kKey, hello.hello(), ::getpid(), seconds(5));
    EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied) << t.status();
    EXPECT_NE(std::string(t.status().message()).find("descriptors"), std::string::npos);
  }
}

// A new agent from before the proofs: refused in one line naming both
// versions; the old side sent it nothing but that.
TEST(HandoverAuthTest, AHelloFromBeforeTheProofsIsRefusedWithBothVersions) {
  Pair p = socketPair();
  v1::HandoverMessage hello = helloMessage();
  hello.mutable_hello()->clear_handshake();
  hello.mutable_hello()->clear_nonce();
  absl::Status s = answerHello(p.old_side.get(), kKey, hello.hello(), ::getpid(), seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(std::string(s.message()).find("the new agent (version 9.9.9) does not prove"),
            std::string::npos)
      << s;
  EXPECT_NE(std::string(s.message()).find("handshake is 1"), std::string::npos) << s;
  EXPECT_EQ(nextFrom(p.new_side.get()).rfind("nothing", 0), 0u);
}

// A process that relays between a new agent and an old one shows each its
// own pid: the hello's pid is not the socket's, and the proofs, bound to
// the kernel's pids, fail either way.
TEST(HandoverAuthTest, AHelloFromAnotherPidThanTheSocketsIsRefused) {
  Pair p = socketPair();
  v1::HandoverMessage hello = helloMessage();
  hello.mutable_hello()->set_pid(::getpid() + 1);
  absl::Status s = answerHello(p.old_side.get(), kKey, hello.hello(), ::getpid(), seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(std::string(s.message()).find("one PID namespace"), std::string::npos) << s;
  EXPECT_EQ(nextFrom(p.new_side.get()).rfind("nothing", 0), 0u);
}

TEST(HandoverAuthTest, AProofHoldsOnlyForItsKeyRoleNoncesPidsAndTarget) {
  Transcript t;
  t.new_nonce = std::string(kNonceBytes, 'n');
  t.old_nonce = std::string(kNonceBytes, 'o');
  t.new_pid = 100;
  t.old_pid = 200;
  t.target_pid = 4242;
  t.target_netns_inode = 4026530001;
  const std::string proof = prove(kKey, Role::kNew, t);
  EXPECT_EQ(proof.size(), kProofBytes);
  EXPECT_TRUE(verify(kKey, Role::kNew, t, proof));
  EXPECT_FALSE(verify(kOtherKey, Role::kNew, t, proof));
  EXPECT_FALSE(verify(kKey, Role::kOld, t, proof));
  EXPECT_FALSE(verify("", Role::kNew, t, proof));
  EXPECT_FALSE(verify(kKey, Role::kNew, t, proof.substr(0, 31)));
  for (auto change : std::vector<std::function<void(Transcript&)>>{
           [](Transcript& x) { x.new_nonce[0] = 'N'; },
           [](Transcript& x) { x.old_nonce[31] = 'O'; },
           [](Transcript& x) { std::swap(x.new_nonce, x.old_nonce); },
           [](Transcript& x) { x.new_pid = 101; }, [](Transcript& x) { x.old_pid = 201; },
           [](Transcript& x) { std::swap(x.new_pid, x.old_pid); },
           [](Transcript& x) { x.target_pid = 1; },
           [](Transcript& x) { x.target_netns_inode = 1; }}) {
    Transcript other = t;
    change(other);
    EXPECT_FALSE(verify(kKey, Role::kNew, other, proof));
  }
  // The key is not the secret, and no key comes of no secret.
  EXPECT_NE(kKey, "the-token-both-agents-hold");
  EXPECT_EQ(kKey.size(), 32u);
  EXPECT_EQ(deriveKey(""), "");
  EXPECT_NE(makeNonce().value(), makeNonce().value());
}

}  // namespace
}  // namespace siphon::agent::handover
