// A handover's two sides in the real Server, against peers without the
// handover key (docs/SECURITY.md, "The handover socket gives everything:
// only to the agent's own"). No root: in process, a fake /proc target.
//
// Old side: an agent with --handover-socket and a client session. A peer
// from before the proofs, and one that proves with another key, each get a
// refusal and nothing else (no offer, no descriptor), and the agent never
// prepared or froze: its client's connection was never cut. A peer with
// the key gets the offer, which does cut the client (the control that
// shows the first two would have seen a freeze).
//
// New side: Server::takeOver() against an old side served by the test. One
// without the key (a planted socket) is refused before the new agent sends
// its proof or reads a state; one with the key whose state is out of
// bounds (too many descriptors, above --handover-max-state, a memfd that is
// not sealed) is refused before any descriptor or byte of it is taken.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include "agent/server/handover_auth.h"
#include "agent/server/handover_channel.h"
#include "agent/server/server.h"
#include "siphon/client/client.h"
#include "tests/fakes/fake_proc_fs.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
using std::chrono::seconds;

constexpr pid_t kPodPid = 4242;
constexpr uint64_t kPodNetns = 4026530001;
constexpr char kToken[] = "handover-test-token";

std::unique_ptr<fakes::FakeProcFs> fakeProc() {
  auto procfs = std::make_unique<fakes::FakeProcFs>();
  procfs->setSelfPid(kPodPid);
  fakes::FakeProcess pod;
  pod.netns_inode = kPodNetns;
  procfs->addProcess(kPodPid, pod);
  return procfs;
}

TargetSpec targetless() {
  TargetSpec spec;
  spec.mode = TargetMode::kTargetless;
  return spec;
}

v1::HandoverMessage hello(bool with_proofs) {
  v1::HandoverMessage m;
  v1::HandoverHello& h = *m.mutable_hello();
  h.set_format(handover::kFormat);
  h.set_min_format(handover::kMinFormat);
  h.set_agent_version("9.9.9");
  h.set_pid(::getpid());
  h.set_target_pid(kPodPid);
  h.set_target_netns_inode(kPodNetns);
  if (with_proofs) {
    h.set_handshake(handover::kHandshake);
    h.set_nonce(handover::makeNonce().value());
  }
  return m;
}

// Everything the old side sends until it closes or stays silent a moment:
// the messages, and how many descriptors came with them.
struct Heard {
  std::vector<v1::HandoverMessage> messages;
  size_t descriptors = 0;
  bool any(bool (v1::HandoverMessage::*has)() const) const {
    for (const auto& m : messages) {
      if ((m.*has)()) return true;
    }
    return false;
  }
};

// The old agent said one thing, a refusal naming `reason`, passed no
// descriptor, never froze (its client was not cut) and still answers.
void expectRefusedUnfrozen(const Heard& heard, uint64_t resumes, bool answers,
                           const std::string& reason) {
  ASSERT_EQ(heard.messages.size(), 1u) << "the old agent said more than a refusal";
  EXPECT_TRUE(heard.messages[0].has_refused()) << heard.messages[0].ShortDebugString();
  EXPECT_NE(heard.messages[0].refused().reason().find(reason), std::string::npos)
      << heard.messages[0].ShortDebugString();
  EXPECT_EQ(heard.descriptors, 0u);
  EXPECT_EQ(resumes, 0u) << "the client was cut: the agent froze";
  EXPECT_TRUE(answers);
}

Heard listen(int sock) {
  Heard h;
  while (true) {
    std::vector<UniqueFd> fds;
    auto m = handover::receive(sock, std::chrono::milliseconds(500), &fds);
    h.descriptors += fds.size();
    if (!m.ok()) return h;
    h.messages.push_back(*m);
  }
}

class HandoverServerTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/siphon-handover-server-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    socket_ = dir_ + "/handover.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The old agent: in process, with a handover socket.
  void startOld() {
    AgentConfig config;
    config.token = kToken;
    config.handover_socket = socket_;
    config.first_client_timeout = std::chrono::milliseconds(0);
    agent_.start(config, fakeProc(), targetless());
  }

  // Runs `peer` (blocking, on its own thread) while a client session of
  // the old agent stays connected; the client's resumes meanwhile, and
  // whether it still answers after.
  template <typename F>
  uint64_t withClient(F peer, bool* answers) {
    uint64_t resumes = ~uint64_t{0};
    fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
      client::ClientOptions o;
      o.endpoints = {agent_.address()};
      o.token = kToken;
      auto c = client::Client::create(ex, o);
      absl::Status s = co_await c->connect();
      EXPECT_TRUE(s.ok()) << s;
      auto done = std::async(std::launch::async, peer);
      asio::steady_timer t(ex);
      while (done.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
        t.expires_after(std::chrono::milliseconds(10));
        co_await t.async_wait(net::use_awaitable);
      }
      done.get();
      // A client the freeze cut has noticed by now (the peer listened
      // half a second past the old agent's last word), and is resumed once
      // the call is answered.
      v1::Request info;
      info.mutable_info();
      auto r = co_await c->call(info);
      *answers = r.ok();
      resumes = c->resumeCountForTest();
      c->close();
    });
    return resumes;
  }

  std::string dir_, socket_;
  fakes::InProcessAgent agent_;
};

TEST_F(HandoverServerTest, AHelloWithoutAProofGetsARefusalAndNothingIsFrozen) {
  startOld();
  Heard heard;
  bool answers = false;
  const uint64_t resumes = withClient(
      [&] {
        auto conn = handover::connect(socket_);
        ASSERT_TRUE(conn.ok()) << conn.status();
        ASSERT_TRUE(handover::send(conn->get(), hello(/*with_proofs=*/false)).ok());
        heard = listen(conn->get());
      },
      &answers);
  expectRefusedUnfrozen(heard, resumes, answers, "does not prove that it holds the handover key");
  EXPECT_FALSE(heard.any(&v1::HandoverMessage::has_offer));
  EXPECT_FALSE(heard.any(&v1::HandoverMessage::has_state));
}

TEST_F(HandoverServerTest, AProofWithAnotherKeyGetsARefusalAndNothingIsFrozen) {
  startOld();
  Heard heard;
  bool answers = false;
  const uint64_t resumes = withClient(
      [&] {
        auto conn = handover::connect(socket_);
        ASSERT_TRUE(conn.ok()) << conn.status();
        const v1::HandoverMessage h = hello(/*with_proofs=*/true);
        ASSERT_TRUE(handover::send(conn->get(), h).ok());
        std::vector<UniqueFd> fds;
        auto challenge = handover::receive(conn->get(), seconds(5), &fds);
        ASSERT_TRUE(challenge.ok()) << challenge.status();
        ASSERT_TRUE(challenge->has_challenge()) << challenge->ShortDebugString();
        EXPECT_TRUE(fds.empty());
        handover::Transcript t;
        t.new_nonce = h.hello().nonce();
        t.old_nonce = challenge->challenge().nonce();
        t.new_pid = ::getpid();
        t.old_pid = challenge->challenge().pid();
        t.target_pid = kPodPid;
        t.target_netns_inode = kPodNetns;
        ASSERT_TRUE(handover::sendProof(conn->get(), handover::deriveKey("not-the-token"), t).ok());
        heard = listen(conn->get());
      },
      &answers);
  expectRefusedUnfrozen(heard, resumes, answers, "does not hold this agent's handover key");
}

// The control: with the key, the old agent prepares, freezes (the client
// is cut) and offers; refused by the peer, it thaws and the client resumes.
TEST_F(HandoverServerTest, AProofWithTheKeyGetsTheOfferAndTheFreeze) {
  startOld();
  Heard heard;
  bool answers = false;
  const uint64_t resumes = withClient(
      [&] {
        auto conn = handover::connect(socket_);
        ASSERT_TRUE(conn.ok()) << conn.status();
        const v1::HandoverMessage h = hello(/*with_proofs=*/true);
        ASSERT_TRUE(handover::send(conn->get(), h).ok());
        auto ucred = handover::checkPeer(conn->get());
        ASSERT_TRUE(ucred.ok());
        auto t = handover::checkChallenge(conn->get(), handover::deriveKey(kToken), h.hello(),
                                          ucred->pid, seconds(5));
        ASSERT_TRUE(t.ok()) << t.status();
        ASSERT_TRUE(handover::sendProof(conn->get(), handover::deriveKey(kToken), *t).ok());
        std::vector<UniqueFd> fds;
        auto offer = handover::receive(conn->get(), seconds(10), &fds);
        ASSERT_TRUE(offer.ok()) << offer.status();
        heard.messages.push_back(*offer);
        (void)handover::send(conn->get(), handover::refusal("the test goes no further"));
      },
      &answers);
  ASSERT_EQ(heard.messages.size(), 1u);
  EXPECT_TRUE(heard.messages[0].has_offer()) << heard.messages[0].ShortDebugString();
  EXPECT_GE(resumes, 1u) << "the offer came without a freeze";
  EXPECT_TRUE(answers);
}

// ---------------------------------------------------------------- new side

class TakeOverTest : public HandoverServerTest {
 protected:
  // A new agent taking over from `socket_`, served by `old_side` (given
  // the accepted connection) on a thread; takeOver()'s result.
  template <typename F>
  absl::Status takeOver(F old_side, uint64_t max_state_bytes = 1ull << 30) {
    auto listener = handover::listen(socket_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    if (!listener.ok()) return listener.status();
    auto served = std::async(std::launch::async, [&] {
      pollfd p{listener->get(), POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;
      UniqueFd conn(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conn) old_side(conn.get());
    });
    AgentConfig config;
    config.token = kToken;
    config.take_over = socket_;
    config.handover_max_state_bytes = max_state_bytes;
    auto procfs = fakeProc();
    auto target = Target::open(*procfs, targetless());
    EXPECT_TRUE(target.ok());
    Server server(config, std::move(*target), std::move(procfs));
    EXPECT_TRUE(server.init().ok());
    absl::Status s = server.takeOver();
    served.get();
    return s;
  }

  // The old agent's side up to the new agent's proof, with the key.
  static void proveAsOld(int sock) {
    std::vector<UniqueFd> fds;
    auto h = handover::receive(sock, seconds(5), &fds);
    ASSERT_TRUE(h.ok() && h->has_hello());
    absl::Status s = handover::answerHello(sock, handover::deriveKey(kToken), h->hello(),
                                           ::getpid(), seconds(5));
    EXPECT_TRUE(s.ok()) << s;
  }

  // An offer, then a state of `bytes` in `memfd` naming `fd_count`
  // descriptors, none of which is sent unless asked.
  static void offerState(int sock, int memfd, uint64_t bytes, uint32_t fd_count) {
    v1::HandoverMessage offer;
    offer.mutable_offer()->set_format(handover::kFormat);
    offer.mutable_offer()->set_agent_version("9.9.9");
    offer.mutable_offer()->set_pid(::getpid());
    (void)handover::send(sock, offer);
    v1::HandoverMessage head;
    head.mutable_state()->set_state_bytes(bytes);
    head.mutable_state()->set_fd_count(fd_count);
    (void)handover::send(sock, head, std::span<const int>(&memfd, 1));
  }
};

// A socket another process serves where the new agent looks: it does not
// prove that it holds the key, so the new agent sends no proof, reads no
// offer or state (the impostor sends one eagerly, descriptors and all) and
// exits with the reason.
TEST_F(TakeOverTest, APlantedOldSideWithoutTheKeyGetsNothingAndGivesNothing) {
  Heard heard;
  absl::Status s = takeOver([&](int sock) {
    std::vector<UniqueFd> fds;
    auto h = handover::receive(sock, seconds(5), &fds);
    ASSERT_TRUE(h.ok() && h->has_hello());
    // A challenge as an old agent makes it, with a key of its own; then,
    // without waiting for a proof, an offer and a state.
    handover::Transcript t;
    t.new_nonce = h->hello().nonce();
    t.old_nonce = std::string(handover::kNonceBytes, 'i');
    t.new_pid = h->hello().pid();
    t.old_pid = ::getpid();
    t.target_pid = h->hello().target_pid();
    t.target_netns_inode = h->hello().target_netns_inode();
    v1::HandoverMessage challenge;
    challenge.mutable_challenge()->set_nonce(t.old_nonce);
    challenge.mutable_challenge()->set_pid(::getpid());
    challenge.mutable_challenge()->set_proof(
        handover::prove(handover::deriveKey("the-impostors-own"), handover::Role::kOld, t));
    ASSERT_TRUE(handover::send(sock, challenge).ok());
    auto memfd = handover::toMemfd(std::string(64, 'x'));
    ASSERT_TRUE(memfd.ok());
    offerState(sock, memfd->get(), 64, 0);
    heard = listen(sock);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(std::string(s.message()).find("is not taken over: it does not prove that it holds"),
            std::string::npos)
      << s;
  EXPECT_FALSE(heard.any(&v1::HandoverMessage::has_proof)) << "the new agent proved itself";
  EXPECT_FALSE(heard.any(&v1::HandoverMessage::has_confirm));
  EXPECT_EQ(heard.descriptors, 0u);
}

// A proven old side whose state names more descriptors than the new agent
// can hold: refused before one is received (none was even sent).
TEST_F(TakeOverTest, TooManyDescriptorsAreRefusedBeforeAnyIsReceived) {
  Heard heard;
  absl::Status s = takeOver([&](int sock) {
    proveAsOld(sock);
    auto memfd = handover::toMemfd(std::string(64, 'x'));
    ASSERT_TRUE(memfd.ok());
    offerState(sock, memfd->get(), 64, 1u << 30);
    heard = listen(sock);
  });
  EXPECT_NE(std::string(s.message()).find("the state names 1073741824 descriptors"),
            std::string::npos)
      << s;
  ASSERT_FALSE(heard.messages.empty());
  EXPECT_TRUE(heard.messages.back().has_refused()) << "the old agent is not told to go on";
}

TEST_F(TakeOverTest, AStateAboveTheCapIsRefusedBeforeItIsRead) {
  Heard heard;
  absl::Status s = takeOver(
      [&](int sock) {
        proveAsOld(sock);
        // Sparse: 4 GiB that cost the sender nothing.
        UniqueFd memfd(::memfd_create("big", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        ASSERT_EQ(::ftruncate(memfd.get(), 4ll << 30), 0);
        ASSERT_EQ(::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
        offerState(sock, memfd.get(), 4ull << 30, 0);
        heard = listen(sock);
      },
      /*max_state_bytes=*/1 << 20);
  EXPECT_NE(std::string(s.message()).find("above --handover-max-state (1 MiB)"), std::string::npos)
      << s;
  ASSERT_FALSE(heard.messages.empty());
  EXPECT_TRUE(heard.messages.back().has_refused());
}

TEST_F(TakeOverTest, AStateInAnUnsealedMemfdIsNotRead) {
  Heard heard;
  absl::Status s = takeOver([&](int sock) {
    proveAsOld(sock);
    UniqueFd memfd(::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(::write(memfd.get(), "0123456789", 10), 10);
    offerState(sock, memfd.get(), 10, 0);
    heard = listen(sock);
  });
  EXPECT_NE(std::string(s.message()).find("not sealed"), std::string::npos) << s;
  ASSERT_FALSE(heard.messages.empty());
  EXPECT_TRUE(heard.messages.back().has_refused());
}

}  // namespace
}  // namespace siphon::agent
