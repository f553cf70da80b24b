// Handover (docs/CONTINUITY.md, "Handover"): the Server's side of it.
//
// The old agent serves its --handover-socket on a thread of its own; each
// step that touches the agent's state runs on the event loop (onLoop), so
// the loop keeps serving timers and answers while the new agent works. The
// new agent takes over in takeOver(), before its event loop runs.
//
// Nothing happens before both sides proved that they hold the handover key
// (handover_auth.h): the old agent prepares, freezes, exports and sends a
// descriptor only to a new agent that proved it, and the new agent trusts
// an offer and imports only from an old agent that proved it first.
//
// The old agent's commit point is reading HandoverConfirm: before it, any
// failure (the new agent refuses, dies, or is too slow) thaws it and it
// goes on as if nothing happened; the frozen agent read no socket and wrote
// none meanwhile, so the state it exported is still exactly its own. After
// it, the old agent removes its steering, says HandoverReleased and exits.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/common/log.h"
#include "agent/outgoing/address.h"
#include "agent/server/handover_auth.h"
#include "agent/server/handover_channel.h"
#include "agent/server/server.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

#ifndef SIPHON_VERSION
#define SIPHON_VERSION "0.0.0"
#endif

namespace siphon::agent {

namespace asio = net::asio;
using Clock = std::chrono::steady_clock;

namespace {

int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// --take-over auto: the other siphon-agent processes of this PID namespace
// with a socket at `socket` (this agent's own --handover-socket path) in
// their root: /proc/PID/root/SOCKET. Two agents in containers of one pod
// (ephemeral containers of the same target) each see the other's files
// that way; the pod's other processes do not (a non-dumpable agent's root
// takes CAP_SYS_PTRACE). Which of them is the agent to take over is for
// the proofs to say (takeOver): a process that names itself siphon-agent
// and serves a socket there proves nothing.
absl::StatusOr<std::vector<std::string>> findAgentsToTakeOver(const std::string& socket) {
  if (socket.empty() || socket[0] != '/') {
    return absl::InvalidArgumentError(
        "--take-over auto looks for the old agent's socket at this agent's --handover-socket "
        "path, which must be given (an absolute path)");
  }
  std::vector<std::string> found;
  std::vector<std::pair<dev_t, ino_t>> seen;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    if (std::stol(name) == ::getpid()) continue;
    std::error_code lec;
    const std::string exe = std::filesystem::read_symlink(it->path() / "exe", lec).filename();
    // "siphon-agent", or "siphon-agent (deleted)" once its binary was replaced.
    if (lec || exe.rfind("siphon-agent", 0) != 0) continue;
    const std::string candidate = it->path().string() + "/root" + socket;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    // One socket file seen through several processes (the old agent's
    // helpers run from its binary too, in its root): once.
    if (std::find(seen.begin(), seen.end(), std::pair{st.st_dev, st.st_ino}) != seen.end()) {
      continue;
    }
    seen.emplace_back(st.st_dev, st.st_ino);
    found.push_back(candidate);
  }
  if (found.empty()) {
    return absl::NotFoundError(
        absl::StrCat("--take-over auto: no other siphon-agent process here "
                     "has a handover socket at ",
                     socket));
  }
  return found;
}

// The key of this agent's proofs: from --handover-key-file, else the token.
std::string handoverKey(const AgentConfig& config) {
  return handover::deriveKey(config.handover_secret.empty() ? config.token
                                                            : config.handover_secret);
}

// Whether process `pid` is gone within `wait` (pidfd: no pid reuse race).
bool processGone(pid_t pid, std::chrono::milliseconds wait) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) return errno == ESRCH;
  pollfd p{pidfd.get(), POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(wait.count())) > 0;
}

}  // namespace

template <class F>
auto Server::onLoop(F f) -> std::optional<decltype(f())> {
  using R = decltype(f());
  auto task = std::make_shared<std::packaged_task<R()>>(std::move(f));
  std::future<R> result = task->get_future();
  asio::post(io_, [task] { (*task)(); });
  while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (io_.stopped() || handover_stop_) return std::nullopt;
  }
  return result.get();
}

// ---------------------------------------------------------------- old side

absl::Status Server::listenHandover(bool replace) {
  if (config_.handover_socket.empty()) return absl::OkStatus();
  if (replace) ::unlink(config_.handover_socket.c_str());
  ASSIGN_OR_RETURN(handover_listener_, handover::listen(config_.handover_socket));
  struct stat st {};
  if (::stat(config_.handover_socket.c_str(), &st) == 0) handover_inode_ = st.st_ino;
  log::info("handover_listening", {{"socket", config_.handover_socket}});
  handover_thread_ = std::thread([this] { handoverThread(); });
  return absl::OkStatus();
}

void Server::stopHandover() {
  handover_stop_ = true;
  if (int c = handover_conn_.load(); c >= 0) ::shutdown(c, SHUT_RDWR);
  if (handover_thread_.joinable()) handover_thread_.join();
  if (handover_listener_ && handover_inode_ != 0) {
    // Ours still (an agent that took over from us binds it anew).
    struct stat st {};
    if (::stat(config_.handover_socket.c_str(), &st) == 0 && st.st_ino == handover_inode_) {
      ::unlink(config_.handover_socket.c_str());
    }
  }
}

void Server::handoverThread() {
  while (!handover_stop_) {
    pollfd p{handover_listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    UniqueFd conn(::accept4(handover_listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) continue;
    handover_conn_ = conn.get();
    serveHandover(std::move(conn));
    handover_conn_ = -1;
  }
}

void Server::serveHandover(UniqueFd conn) {
  const auto began = Clock::now();
  // The metrics are the event loop's.
  auto countOnLoop = [this](const char* result) {
    asio::post(io_, [this, result] { metrics_.handover(result); });
  };
  const int sock = conn.get();
  std::vector<UniqueFd> none;
  int64_t peer_pid = -1;
  auto refuse = [&](const std::string& reason) {
    (void)handover::send(sock, handover::refusal(reason));
    log::warn("handover_refused", {{"peer_pid", peer_pid}, {"reason", reason}});
    countOnLoop("refused");
  };
  auto peer = handover::checkPeer(sock);
  if (!peer.ok()) {
    refuse(std::string(peer.status().message()));
    return;
  }
  peer_pid = peer->pid;
  auto hello = handover::receive(sock, std::chrono::seconds(5), &none);
  if (!hello.ok() || !hello->has_hello()) {
    log::warn("handover_refused", {{"peer_pid", peer_pid},
                                   {"reason", hello.ok() ? "the first message is not a hello"
                                                         : std::string(hello.status().message())}});
    return;
  }
  const v1::HandoverHello& h = hello->hello();
  // Before anything is prepared, frozen or said beyond the hello's public
  // values: the peer proves that it holds the key (a root process of the
  // pod that reached the socket does not).
  if (absl::Status proved =
          handover::answerHello(sock, handoverKey(config_), h, peer->pid, std::chrono::seconds(10));
      !proved.ok()) {
    refuse(std::string(proved.message()));
    return;
  }
  if (h.min_format() > handover::kFormat || h.format() < handover::kFormat) {
    refuse(absl::StrCat("the new agent (version ", h.agent_version(), ") reads state formats ",
                        h.min_format(), " to ", h.format(), "; this agent (version ",
                        SIPHON_VERSION, ") writes format ", handover::kFormat,
                        ": take over with an agent that reads it"));
    return;
  }
  if (h.target_pid() != target_->pid() || h.target_netns_inode() != target_->netnsInode()) {
    refuse(absl::StrCat("the new agent was started for target pid ", h.target_pid(),
                        "; this agent serves target pid ", target_->pid(), " (",
                        target_->netnsLabel(), ")"));
    return;
  }
  log::info("handover_started", {{"peer_pid", peer_pid}, {"peer_version", h.agent_version()}});
  // What this agent holds that cannot move refuses the handover before
  // anything is disturbed; what is under way (answers owed, connects,
  // handshakes) may end first, before the freeze and again after it.
  auto waitForBlockers = [&]() -> std::optional<std::string> {
    const auto wait_until = Clock::now() + config_.handover_freeze_wait;
    while (true) {
      auto b = onLoop([this] { return handoverBlocker(); });
      if (!b) return std::nullopt;
      if (b->empty() || Clock::now() >= wait_until) return b;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  // Sessions still live: what would not move finishes first (an HTTP
  // request of a filtered steal is answered, then its connection parks).
  if (!onLoop([this] {
        services_->prepareHandover();
        return true;
      })) {
    return;
  }
  auto before = waitForBlockers();
  if (!before) return;
  if (!before->empty()) {
    refuse(absl::StrCat("this agent holds what cannot move: ", *before));
    (void)onLoop([this] {
      services_->thaw();  // undoes the preparation
      return true;
    });
    return;
  }

  auto frozen = onLoop([this] {
    if (draining_ || stopping_) return std::string("the agent is draining");
    freezeForHandover();
    return std::string();
  });
  if (!frozen) return;
  if (!frozen->empty()) {
    refuse(*frozen);
    return;
  }
  auto thaw = [&](const std::string& why) {
    (void)onLoop([this, why] {
      thawAfterHandover(why);
      return true;
    });
  };
  v1::HandoverMessage offer;
  offer.mutable_offer()->set_format(handover::kFormat);
  offer.mutable_offer()->set_agent_version(SIPHON_VERSION);
  offer.mutable_offer()->set_pid(::getpid());
  if (absl::Status s = handover::send(sock, offer); !s.ok()) {
    thaw(std::string(s.message()));
    return;
  }
  // Answers to requests that came before the transports were cut.
  auto blocker = waitForBlockers();
  if (!blocker) return;
  if (!blocker->empty()) {
    const std::string reason = absl::StrCat("this agent holds what cannot move: ", *blocker);
    refuse(reason);
    thaw(reason);
    return;
  }
  std::vector<UniqueFd> fds;
  auto state = onLoop([this, &fds] { return exportHandover(&fds); });
  if (!state) return;
  if (!state->ok()) {
    const std::string reason = absl::StrCat("export failed: ", state->status().message());
    refuse(reason);
    thaw(reason);
    return;
  }
  const uint64_t state_bytes = (*state)->size();
  absl::Status sent = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(UniqueFd memfd, handover::toMemfd(**state));
    v1::HandoverMessage m;
    m.mutable_state()->set_state_bytes(state_bytes);
    m.mutable_state()->set_fd_count(static_cast<uint32_t>(fds.size()));
    const int memfd_raw = memfd.get();
    RETURN_IF_ERROR(handover::send(sock, m, std::span<const int>(&memfd_raw, 1)));
    for (size_t i = 0; i < fds.size(); i += handover::kMaxFdsPerPacket) {
      const size_t n = std::min(handover::kMaxFdsPerPacket, fds.size() - i);
      std::vector<int> raw;
      for (size_t j = 0; j < n; ++j) raw.push_back(fds[i + j].get());
      v1::HandoverMessage f;
      f.mutable_fds()->set_count(static_cast<uint32_t>(n));
      RETURN_IF_ERROR(handover::send(sock, f, raw));
    }
    return absl::OkStatus();
  }();
  // Our copies: the new agent has its own now (or never will).
  fds.clear();
  if (!sent.ok()) {
    const std::string reason = absl::StrCat("sending the state failed: ", sent.message());
    log::warn("handover_failed", {{"reason", reason}});
    countOnLoop("failed");
    thaw(reason);
    return;
  }
  auto reply = handover::receive(sock, config_.handover_timeout, &none);
  if (!reply.ok() || !reply->has_confirm()) {
    std::string reason;
    if (!reply.ok()) {
      reason = absl::StrCat("the new agent did not confirm: ", reply.status().message());
      // Too slow, or gone: it must not go on with what it has.
      (void)handover::send(sock, handover::refusal(reason));
    } else if (reply->has_refused()) {
      reason = absl::StrCat("the new agent refused: ", reply->refused().reason());
    } else {
      reason = "the new agent answered out of turn";
    }
    log::warn("handover_failed",
              {{"peer_pid", static_cast<int64_t>(peer->pid)}, {"reason", reason}});
    countOnLoop("failed");
    thaw(reason);
    return;
  }
  // Committed: the new agent holds everything. It serves once it reads
  // `released`; our steering goes meanwhile (the new agent's steers the
  // same listeners already, as both did during its import), so removing it
  // (iptables-restore, the guard's last look: seconds on a loaded node) is
  // no pause for anyone. Then we exit; closing our copies of the sockets
  // touches none of them, and if we die first our guard removes our chains
  // (sk_lookup: our link goes with the process).
  v1::HandoverMessage released;
  released.mutable_released();
  (void)handover::send(sock, released);
  auto counts = onLoop([this] {
    services_->handedOver();
    size_t streams = 0;
    for (const auto& [id, s] : sessions_) streams += s->streamCount();
    return std::pair<size_t, size_t>{sessions_.size(), streams};
  });
  log::info("handover_done", {{"to_pid", static_cast<int64_t>(peer->pid)},
                              {"sessions", static_cast<uint64_t>(counts ? counts->first : 0)},
                              {"streams", static_cast<uint64_t>(counts ? counts->second : 0)},
                              {"state_bytes", state_bytes},
                              {"took_ms", msSince(began)}});
  std::fflush(stdout);
  // No destructor runs: the sockets, the steering's listeners and the
  // sessions are the new agent's now.
  ::_exit(kExitOk);
}

void Server::freezeForHandover() {
  handover_frozen_ = true;
  net::error_code ignored;
  acceptor_.cancel(ignored);
  services_->freeze();
  for (auto& [id, s] : sessions_) s->freezeForHandover();
}

void Server::thawAfterHandover(std::string_view why) {
  if (!handover_frozen_) return;
  handover_frozen_ = false;
  services_->thaw();
  for (auto& [id, s] : sessions_) s->thawAfterHandover();
  if (!stopping_) {
    net::spawn(io_, acceptLoop(), "accept_loop",
               [this] { shutdown(kExitInternal, "the accept loop failed"); });
  }
  log::info("handover_thawed", {{"reason", why}});
}

std::string Server::handoverBlocker() const {
  if (stopping_ || draining_) return "the agent is draining";
  if (uint32_t n = handshake_slots_.pending(); n > 0) {
    return absl::StrCat(n, " client handshakes under way");
  }
  if (std::string why = services_->handoverBlocker(); !why.empty()) return why;
  for (const auto& [id, s] : sessions_) {
    if (std::string why = s->handoverBlocker(); !why.empty()) return why;
  }
  return "";
}

absl::StatusOr<std::string> Server::exportHandover(std::vector<UniqueFd>* fds) {
  v1::AgentState state;
  state.set_format(handover::kFormat);
  state.set_agent_version(SIPHON_VERSION);
  int listener = ::fcntl(acceptor_.native_handle(), F_DUPFD_CLOEXEC, 3);
  if (listener < 0) return lastErrnoStatus("handover: dup the listener");
  state.set_listener(static_cast<int32_t>(fds->size()));
  fds->emplace_back(listener);
  state.set_next_subscription_id(service_ctx_->subscription_ids.peek());
  state.set_handovers(handovers_ + 1);
  for (auto& [id, s] : sessions_) {
    if (s->ended()) continue;
    RETURN_IF_ERROR(s->exportState(state.add_sessions(), fds));
  }
  RETURN_IF_ERROR(services_->exportState(&state, fds));
  std::string bytes;
  if (!state.SerializeToString(&bytes)) return absl::InternalError("handover: serialize");
  return bytes;
}

// ---------------------------------------------------------------- new side

absl::Status Server::takeOver() {
  const auto began = Clock::now();
  const std::string key = handoverKey(config_);
  if (key.empty()) {
    return absl::FailedPreconditionError(
        "--take-over: no handover key (give --token-file, SIPHON_TOKEN or --handover-key-file)");
  }
  const bool automatic = config_.take_over == "auto";
  std::vector<std::string> paths = {config_.take_over};
  if (automatic) {
    ASSIGN_OR_RETURN(paths, findAgentsToTakeOver(config_.handover_socket));
  }
  RETURN_IF_ERROR(setUpTls());
  v1::HandoverMessage hello;
  v1::HandoverHello& h = *hello.mutable_hello();
  h.set_format(handover::kFormat);
  h.set_min_format(handover::kMinFormat);
  h.set_agent_version(SIPHON_VERSION);
  h.set_pid(::getpid());
  h.set_target_pid(target_->pid());
  h.set_target_netns_inode(target_->netnsInode());
  h.set_handshake(handover::kHandshake);
  ASSIGN_OR_RETURN(*h.mutable_nonce(), handover::makeNonce());

  // The hello to each candidate first, then each one's challenge: one that
  // answers late or never (a socket another process serves) holds up no
  // other. Only an agent that proves it holds the key is taken over; the
  // others learn the hello's public values and nothing else.
  struct Candidate {
    std::string path;
    UniqueFd conn;
    ucred peer{};
    absl::Status status;
    bool asked = false;  // the hello went out
    handover::Transcript transcript;
  };
  std::vector<Candidate> candidates;
  for (const std::string& p : paths) {
    Candidate c;
    c.path = p;
    c.status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(c.conn, handover::connect(p));
      ASSIGN_OR_RETURN(c.peer, handover::checkPeer(c.conn.get()));
      RETURN_IF_ERROR(handover::send(c.conn.get(), hello));
      c.asked = true;
      return absl::OkStatus();
    }();
    candidates.push_back(std::move(c));
  }
  const auto challenge_deadline =
      Clock::now() + (automatic ? std::chrono::seconds(3) : std::chrono::seconds(10));
  std::vector<Candidate*> proven;
  for (Candidate& c : candidates) {
    if (!c.status.ok()) continue;
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(challenge_deadline - Clock::now());
    auto t = handover::checkChallenge(c.conn.get(), key, h, c.peer.pid,
                                      std::max(left, std::chrono::milliseconds(0)));
    if (t.ok()) {
      c.transcript = *std::move(t);
      proven.push_back(&c);
      continue;
    }
    c.status = t.status();
    // An old agent from before the proofs froze for its offer: it thaws
    // at once on this.
    (void)handover::send(c.conn.get(), handover::refusal(absl::StrCat("the new agent refused: ",
                                                                      t.status().message())));
    c.conn.reset();
  }
  auto why = [](const Candidate& c) {
    return c.status.code() == absl::StatusCode::kFailedPrecondition
               ? absl::StrCat("the agent at ", c.path,
                              " refused the handover: ", c.status.message())
               : absl::StrCat("the agent at ", c.path, " is not taken over: ", c.status.message());
  };
  if (proven.empty()) {
    // Not reached (no socket there, another uid): as the channel says it.
    if (candidates.size() == 1 && !candidates[0].asked) return candidates[0].status;
    if (candidates.size() == 1) {
      return absl::Status(candidates[0].status.code() == absl::StatusCode::kPermissionDenied
                              ? absl::StatusCode::kPermissionDenied
                              : absl::StatusCode::kFailedPrecondition,
                          why(candidates[0]));
    }
    std::vector<std::string> all;
    for (const Candidate& c : candidates) all.push_back(why(c));
    return absl::NotFoundError(absl::StrCat(
        "--take-over auto: no siphon-agent here proves that it holds this agent's handover key: ",
        absl::StrJoin(all, "; ")));
  }
  if (proven.size() > 1) {
    std::vector<std::string> all;
    for (const Candidate* c : proven) all.push_back(c->path);
    return absl::FailedPreconditionError(absl::StrCat(
        "--take-over auto: several agents with this agent's handover key have a "
        "handover socket at ",
        config_.handover_socket, " (", absl::StrJoin(all, ", "), "): give --take-over the path"));
  }
  Candidate& chosen = *proven[0];
  for (Candidate& c : candidates) {
    if (&c != &chosen) c.conn.reset();
  }
  const std::string path = chosen.path;
  if (automatic) log::info("handover_found", {{"socket", path}});
  UniqueFd conn = std::move(chosen.conn);
  const int sock = conn.get();
  const ucred old = chosen.peer;
  auto refused = [&](const std::string& reason) {
    return absl::FailedPreconditionError(
        absl::StrCat("the agent at ", path, " refused the handover: ", reason));
  };
  RETURN_IF_ERROR(handover::sendProof(sock, key, chosen.transcript));
  std::vector<UniqueFd> fds;
  ASSIGN_OR_RETURN(v1::HandoverMessage offer,
                   handover::receive(sock, std::chrono::seconds(10), &fds));
  if (offer.has_refused()) return refused(offer.refused().reason());
  if (!offer.has_offer()) return refused("it answered out of turn");
  if (offer.offer().format() < handover::kMinFormat || offer.offer().format() > handover::kFormat) {
    const std::string reason =
        absl::StrCat("the old agent (version ", offer.offer().agent_version(),
                     ") writes state format ", offer.offer().format(), "; this agent (version ",
                     SIPHON_VERSION, ") reads ", handover::kMinFormat, " to ", handover::kFormat);
    (void)handover::send(sock, handover::refusal(reason));
    return absl::FailedPreconditionError(absl::StrCat("handover refused: ", reason));
  }
  auto fail = [&](const absl::Status& s) {
    const std::string reason = absl::StrCat("the new agent could not take over: ", s.message());
    (void)handover::send(sock, handover::refusal(reason));
    metrics_.handover("failed");
    return absl::FailedPreconditionError(absl::StrCat("handover failed: ", s.message()));
  };
  // No descriptor rides on the offer.
  if (!fds.empty()) return fail(absl::DataLossError("descriptors came with the offer"));
  ASSIGN_OR_RETURN(
      v1::HandoverMessage head,
      handover::receive(sock, config_.handover_freeze_wait + std::chrono::seconds(10), &fds));
  if (head.has_refused()) return refused(head.refused().reason());
  if (!head.has_state() || fds.size() != 1) return fail(absl::DataLossError("no state came"));
  UniqueFd memfd = std::move(fds[0]);
  fds.clear();
  // What the state may cost this agent, before any of it is received.
  if (head.state().state_bytes() > config_.handover_max_state_bytes) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "the state holds ", head.state().state_bytes(), " bytes, above --handover-max-state (",
        config_.handover_max_state_bytes >> 20, " MiB)")));
  }
  if (const size_t room = handover::descriptorRoom(); head.state().fd_count() > room) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("the state names ", head.state().fd_count(),
                     " descriptors; this agent has room for ", room, " (RLIMIT_NOFILE)")));
  }
  while (fds.size() < head.state().fd_count()) {
    ASSIGN_OR_RETURN(v1::HandoverMessage more,
                     handover::receive(sock, std::chrono::seconds(10), &fds));
    if (!more.has_fds()) return refused("descriptors missing");
  }
  if (fds.size() != head.state().fd_count()) return fail(absl::DataLossError("descriptor count"));
  auto bytes = handover::fromMemfd(memfd.get(), head.state().state_bytes(),
                                   config_.handover_max_state_bytes);
  if (!bytes.ok()) return fail(bytes.status());
  v1::AgentState state;
  if (!state.ParseFromString(*bytes)) return fail(absl::DataLossError("the state does not parse"));
  handover::clampImportedLimits(&state);
  const auto imported_at = Clock::now();
  if (absl::Status s = importHandover(state, fds); !s.ok()) return fail(s);
  // Test hook (tests/privileged/steal/handover_test.cc): stop here, with
  // everything imported and nothing confirmed, for the test to kill us.
  if (const char* at = std::getenv("SIPHON_TEST_HANDOVER_STOP");
      at != nullptr && std::string_view(at) == "before-confirm") {
    ::raise(SIGSTOP);
  }
  v1::HandoverMessage confirm;
  confirm.mutable_confirm();
  RETURN_IF_ERROR(handover::send(sock, confirm));
  auto released = handover::receive(sock, config_.handover_timeout, &fds);
  if (!released.ok() || !released->has_released()) {
    if (released.ok() && released->has_refused()) return refused(released->refused().reason());
    // The old agent closed without a word after our confirm: it went on
    // only if it is still there (it thawed); if it died, what it handed
    // over is ours and nothing touched it since.
    if (!processGone(old.pid, std::chrono::seconds(2))) {
      return refused("it did not release what it handed over");
    }
    log::warn("handover_old_agent_gone", {{"pid", static_cast<int64_t>(old.pid)}});
  }
  // The socket path is ours from now on; the metrics address once the old
  // agent, which exits now, let go of it. Everything is ours already: a
  // metrics endpoint that cannot bind is said, not a reason to stop.
  RETURN_IF_ERROR(listenHandover(/*replace=*/true));
  (void)processGone(old.pid, std::chrono::seconds(5));
  if (absl::Status m = listenMetrics(); !m.ok()) {
    log::warn("metrics_listen_failed",
              {{"address", config_.metrics_listen}, {"error", sv(m.message())}});
    http_.reset();
  }
  for (auto& [id, s] : sessions_) s->startAfterHandover();
  services_->startAfterHandover();
  had_client_ = true;
  metrics_.handover("taken");
  size_t streams = 0;
  for (const auto& [id, s] : sessions_) streams += s->streamCount();
  log::info("handover_taken", {{"from_pid", static_cast<int64_t>(old.pid)},
                               {"from_version", state.agent_version()},
                               {"sessions", static_cast<uint64_t>(sessions_.size())},
                               {"streams", static_cast<uint64_t>(streams)},
                               {"state_bytes", static_cast<uint64_t>(bytes->size())},
                               {"import_ms", msSince(imported_at)},
                               {"took_ms", msSince(began)}});
  return absl::OkStatus();
}

absl::Status Server::importHandover(const v1::AgentState& state, std::vector<UniqueFd>& fds) {
  if (state.format() < handover::kMinFormat || state.format() > handover::kFormat) {
    return absl::InvalidArgumentError(absl::StrCat("state format ", state.format()));
  }
  const int32_t li = state.listener();
  if (li < 0 || static_cast<size_t>(li) >= fds.size() || !fds[li]) {
    return absl::InvalidArgumentError("the client listener is missing");
  }
  UniqueFd listener = std::move(fds[static_cast<size_t>(li)]);
  auto bound = outgoing::localAddress(listener.get());
  if (!bound.ok()) return bound.status();
  net::error_code ec;
  acceptor_.assign(bound->family() == AF_INET6 ? net::tcp::v6() : net::tcp::v4(), listener.get(),
                   ec);
  if (ec) return absl::InternalError(absl::StrCat("the client listener: ", ec.message()));
  (void)listener.release();
  setFdBudget();
  handovers_ = state.handovers();
  std::map<std::string, std::shared_ptr<SessionHost>> hosts;
  for (const v1::SessionExport& e : state.sessions()) {
    ASSIGN_OR_RETURN(std::shared_ptr<AgentSession> s, AgentSession::restore(*this, e, fds));
    hosts[s->id()] = s;
    sessions_[s->id()] = std::move(s);
  }
  service_ctx_->subscription_ids.setNext(state.next_subscription_id());
  RETURN_IF_ERROR(services_->importState(state, fds, hosts));
  // Every stream a service exported (a mirror's) has its endpoint again:
  // one left without would be open to the client and silent for good.
  for (const v1::SessionExport& e : state.sessions()) {
    const auto& session = sessions_.at(e.id());
    for (const v1::PumpExport& p : e.pumps()) {
      if (!p.service().empty() && !session->hasEndpoint(p.stream_id())) {
        return absl::InvalidArgumentError(absl::StrCat("session ", e.id(), ", stream ",
                                                       p.stream_id(), ": the ", p.service(),
                                                       " service did not take it"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace siphon::agent
