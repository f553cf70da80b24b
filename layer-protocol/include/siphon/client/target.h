// A program's session with the agents of one target: the typed client API.
// A Target connects (to the first of its endpoints that answers), keeps the
// session through transport cuts (resume) and agents that go (failover to
// the next endpoint), and tells the program what happened as LinkEvents,
// never asking it to reconnect. The services are typed objects made from a
// Target: Files (files.h), Dns (dns.h), Env (env.h), Connections
// (connections.h), Subscriptions (subscriptions.h), Capture (capture.h).
//
// Continuity, as the program sees it:
//  - A cut the session survives: calls made meanwhile wait and are
//    answered after the resume; kResumed.
//  - An agent that drains or is lost beyond resume: the session moves to
//    another endpoint (kMoved); steal and mirror subscriptions are made
//    again there under the same ids (their own kMoved event says how).
//    Calls and streams in flight on a lost agent fail with kAgentLost; file
//    handles opened there answer EBADF from then on (they die with their
//    session: never reopened behind the program's back).
//  - No agent left: kLost, and every call fails with kAgentLost.
//
// Threads: a Target and everything made from it live on the executor it
// was created with; call them from coroutines running there. Errors:
// errors.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/client/errors.h"
#include "siphon/transport/asio.h"

namespace siphon::client {

class Client;
struct TargetCore;

struct TargetOptions {
  // One or more agents serving the same target, "host:port" each.
  std::vector<std::string> endpoints;
  std::string token;
  std::string client_name = "siphon";
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds handshake_timeout{5000};
  bool reconnect = true;  // resume after a transport cut
  bool failover = true;   // move to another endpoint (with two or more)
  std::chrono::milliseconds failover_timeout{30000};
  // How long one call (a file operation, a lookup, a subscribe...) may take
  // before it fails with kTimeout; Target::setCallTimeout changes it.
  std::chrono::milliseconds call_timeout{30000};
  // TLS: PEM CA certificates the agent's certificate must chain to, and this
  // client's certificate and key for an agent that asks for one. Empty: TCP.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
};

// What happened to the session (Target::setEventHandler).
struct LinkEvent {
  enum class Kind {
    kResumed,   // a transport cut, survived; status: why the connection was lost
    kDraining,  // the agent drains and no other took over; deadline_unix_ms, reason
    kMoved,     // now on another agent: from, to, reason, streams, requests_failed
    kLost,      // the session is gone for good; status: kAgentLost and why
    // The target's container restarted and the agent adopted its new
    // process (same pod): pid, previous_pid, restarts, down_ms; reason: the
    // container ID. Subscriptions go on; files opened before are gone.
    kTargetRestarted,
  };
  Kind kind = Kind::kLost;
  absl::Status status;
  std::string from;
  std::string to;
  std::string reason;
  int64_t deadline_unix_ms = 0;
  bool draining = false;  // kMoved: the old agent drains (its streams finish there)
  size_t streams = 0;     // kMoved: left to finish (draining) or reset (lost)
  size_t requests_failed = 0;
  int32_t pid = 0;           // kTargetRestarted
  int32_t previous_pid = 0;  // kTargetRestarted
  uint32_t restarts = 0;     // kTargetRestarted
  int64_t down_ms = 0;       // kTargetRestarted
};

// "the target restarted: pid 4242 -> 4301 (container abc, down 812 ms,
// restart 1); sessions, steals and mirrors go on" for a kTargetRestarted.
std::string targetRestartedText(const LinkEvent& e);

struct TargetInfo {
  std::string agent_version;
  std::string protocol_version;  // the session's, "1.0"
  std::string session_id;
  std::string hostname;
  std::string mode;          // "targeted", "ephemeral", "targetless"
  int32_t pid = 0;           // targetless: the agent's own
  uint64_t netns_inode = 0;  // of the target's network namespace
  std::string container_id;
  std::string runtime;
  uint32_t sessions = 0;  // live sessions on the agent, this one included
  int64_t uptime_ms = 0;
  // "FEATURE_FILES", ... as the protocol names them; "UNKNOWN_<n>" for a
  // feature this build does not know (an agent newer than the client).
  std::vector<std::string> features;
};

// A steal or mirror subscription of a session (SessionInfo).
struct SessionSubscription {
  uint64_t id = 0;
  std::string kind;  // "steal" or "mirror"
  uint32_t port = 0;
  std::string filter;            // a filtered steal's, readable ("header x-user: ^me$"); else empty
  std::string backend;           // "sk_lookup", "iptables", "tc"
  bool both_directions = false;  // mirror: the responses too
};

// A session on the agent (Target::sessions()).
struct SessionInfo {
  std::string session_id;
  std::string client_name;
  std::string state;  // "attached" or "detached"
  int64_t age_ms = 0;
  bool current = false;    // the session that asked
  uint32_t streams = 0;    // open streams
  uint64_t bytes_in = 0;   // stream payload from its client
  uint64_t bytes_out = 0;  // stream payload to its client
  std::vector<uint32_t> stolen_ports;
  std::vector<uint32_t> mirrored_ports;
  std::vector<SessionSubscription> subscriptions;
  uint64_t handovers = 0;  // times it moved to a new agent process
};

class Target {
 public:
  static Target create(net::asio::any_io_executor ex, TargetOptions options);
  // Over a Client made with siphon/client/client.h (the CLI's): the Target
  // takes that client's stream acceptor and event handlers.
  static Target over(std::shared_ptr<Client> client);

  // Opens the session. UNAVAILABLE names every endpoint tried and why; a
  // Reject comes back as its code (kUnauthenticated, kUnsupportedVersion...).
  net::awaitable<absl::Status> connect();
  // Ends the session; every call and stream then fails with kCancelled.
  void close();

  void setEventHandler(std::function<void(const LinkEvent&)> handler);
  // Non-OK (kAgentLost) once the session is gone for good.
  absl::Status lostStatus() const;
  std::string endpoint() const;  // of the current agent
  // For the calls made from now on (TargetOptions::call_timeout).
  void setCallTimeout(std::chrono::milliseconds timeout);

  // The agent, its target and this session. Fails as any call does
  // (kTimeout after the call timeout, kAgentLost...).
  net::awaitable<absl::StatusOr<TargetInfo>> info() const;
  // Every session the agent holds, attached or detached, this one marked
  // `current`.
  net::awaitable<absl::StatusOr<std::vector<SessionInfo>>> sessions() const;

  // The generic requests and streams underneath (siphon/client/client.h).
  std::shared_ptr<Client> client() const;
  const std::shared_ptr<TargetCore>& core() const { return core_; }

 private:
  explicit Target(std::shared_ptr<TargetCore> core) : core_(std::move(core)) {}
  std::shared_ptr<TargetCore> core_;
};

}  // namespace siphon::client
