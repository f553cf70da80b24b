// The Asio client of the Siphon protocol: what the CLI and any layer link.
// Connects, authenticates, sends requests, opens and accepts streams, and
// rides through transport cuts by reconnecting and resuming the session.
//
// Failover (ClientOptions::failover, with more than one endpoint): when the
// agent drains, or its session is lost beyond resume, the client opens a
// session on another endpoint and brings back what can come back. Port
// subscriptions are made again there, under the same subscription ids (the
// ids this client hands out are its own, mapped to each agent's). Requests
// in flight on a lost session fail with AGENT_LOST, its streams are reset
// with AGENT_LOST, and its file handles stay invalid (EBADF), never reopened
// behind the caller's back: handles too are this client's own numbers. A
// draining agent keeps the streams it has until they end; only new work
// goes to the other one.
//
// Threads: a Client and its streams live on one executor; call them from
// coroutines running there.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/session_transport.h"
#include "siphon/transport/stream.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::client {

struct ClientOptions {
  // One or more agents serving the same target, "host:port" each; tried in
  // order on connect.
  std::vector<std::string> endpoints;
  std::string token;
  std::string client_name = "siphon";
  protocol::SessionLimits limits;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds handshake_timeout{5000};
  // Reconnect and resume after a transport cut, for at most the agent's
  // session grace.
  bool reconnect = true;
  std::chrono::milliseconds reconnect_backoff_initial{100};
  std::chrono::milliseconds reconnect_backoff_max{2000};
  // Move to another endpoint when the agent drains or the session is lost
  // beyond resume (needs two endpoints or more). A lost session is given up
  // when a resume is refused, when the agent's address refuses connections,
  // or after the keepalive timeout of failed resumes.
  bool failover = true;
  // How long to look for another agent before the session counts as lost.
  std::chrono::milliseconds failover_timeout{30000};
  // TLS (an agent run with --tls-cert): set tls_ca, the PEM CA certificates
  // the agent's certificate must chain to; it must also be issued for the
  // address dialled (an IP SAN for an IP, a DNS SAN for a name), or for
  // tls_server_name when set. tls_cert and tls_key (PEM, both or neither)
  // are this client's certificate, for an agent that asks for one
  // (--tls-client-ca). Empty tls_ca and tls_cert: plain TCP.
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;
  // Where to dial an endpoint, asked before every dial; unset: the endpoint
  // is the address. For an agent reached through something whose address
  // changes between attempts: a supervised `kubectl port-forward`
  // (kube/port_forward.h) that is replaced after a cut. `after_cut` is true
  // for every dial of a resume or a move: the connection through the
  // address given before was cut or failed. A failure fails that dial
  // (retried like any other within the session grace). With it, a refused
  // connection is not taken for a gone agent: what refused is the local
  // forwarder, which the next dial replaces.
  std::function<net::awaitable<absl::StatusOr<std::string>>(std::string endpoint, bool after_cut)>
      resolve_endpoint;
  // A workload's session (several agents, one per pod, at once): besides
  // the current session, sessions on other agents (addReplica) that carry
  // every steal and mirror subscription, so that connections are taken
  // whichever pod they reach. Requests and outgoing streams go to the
  // current session only. When the current agent drains or its session is
  // lost, a replica takes its place at once (promote); with none, the
  // client waits for the next addReplica (calls wait within their own
  // timeout) until abandon(), instead of moving through `endpoints`.
  bool replicas = false;
  // The token for an endpoint, when agents have tokens of their own (a
  // workload's, one agent per pod); unset: `token` for every endpoint.
  std::function<std::string(const std::string& endpoint)> token_for;
  // File handles of a session that is lost are opened again by path on the
  // current one at their next use, when the file there is the same one
  // (its type, size and modification time as when it was opened, and at
  // the same offset); else they answer ESTALE from then on. Off: they
  // answer EBADF (never reopened).
  bool reopen_files = false;
};

// What happened to a replica session (Client::setReplicaHandler).
struct ReplicaEvent {
  enum class Kind {
    kAdded,     // its session opened, subscriptions made (subscriptions: each id's result)
    kFailed,    // a subscription made later could not be made there (status)
    kDraining,  // its agent drains: its streams finish there, no new ones come
    kLost,      // its session is gone (status: why); streams reset: streams
    kPromoted,  // it became the current session (reason); from: the one before
    // The current session (from) is lost and no replica can take its place:
    // calls wait for the next addReplica (or abandon()). reason: why.
    kWaiting,
  };
  Kind kind = Kind::kAdded;
  std::string endpoint;
  std::string from;
  std::string reason;
  absl::Status status;
  size_t streams = 0;
  std::vector<std::pair<uint64_t, absl::Status>> subscriptions;
};

// What a move to another agent did (Client::setFailoverHandler).
struct FailoverEvent {
  std::string from;    // endpoint of the agent left
  std::string to;      // endpoint of the new session
  std::string reason;  // "draining: ..." or why the session was lost
  bool draining = false;
  // Draining: streams left to finish on the old agent. Lost: streams reset
  // (AGENT_LOST) and requests failed.
  size_t streams = 0;
  size_t requests_failed = 0;
  // Every subscription this client held, by its id: OK when it is back on
  // the new agent, else why not (it is then gone: unsubscribing it is a
  // no-op).
  std::vector<std::pair<uint64_t, absl::Status>> subscriptions;
};

class Client;
struct Link;
class LinkLifecycle;
struct LinkBackoff;

// What a stream delivers, in arrival order (ClientStream::readEvent): one
// Data frame's payload, or a gap in it.
struct StreamEvent {
  // The payload of one Data frame, whole (a mirror's record): frame
  // boundaries are kept. Empty for a gap.
  std::string data;
  // Set instead of data: the peer's StreamGap, bytes that will never come
  // (a mirror's lost copy, a capture's dropped packets), at its place
  // between the payloads before and after it.
  std::optional<v1::StreamGap> gap;
};

// A stream of the session. read() yields data in order; write() waits for
// credit, so a slow peer slows only this stream.
class ClientStream {
 public:
  ClientStream(std::shared_ptr<Client> client, std::shared_ptr<Link> link, uint64_t id);
  uint64_t id() const { return id_; }
  // The next chunk (one Data frame's payload); nullopt at the peer's
  // half-close; an error status when the stream was reset (the peer's code,
  // or AGENT_LOST). read() is for contiguous bytes: when the next thing the
  // peer sent is a gap (StreamGap, sent on mirrored and capture streams
  // only), it fails with FAILED_PRECONDITION naming the gap, and keeps
  // failing, since the bytes after it would not follow the bytes before;
  // the gap stays queued for readEvent().
  net::awaitable<absl::StatusOr<std::optional<std::string>>> read();
  // Everything the peer sent, in order: data chunks (one per Data frame)
  // and gaps; nullopt at the peer's half-close (no gap can follow it); an
  // error status when the stream was reset. Data returns its credit to the
  // peer as it is taken, as read() does; a gap holds no credit.
  net::awaitable<absl::StatusOr<std::optional<StreamEvent>>> readEvent();
  net::awaitable<absl::Status> write(std::string data);
  // Sends `data` as exactly one Data frame (one datagram, one seqpacket
  // record): waits until the credit covers all of it. INVALID_ARGUMENT when
  // it never could (above 3/4 of the window the agent granted, since credit
  // returns in quarter-window steps, or above one frame).
  net::awaitable<absl::Status> writeMessage(std::string data);
  // Unconnected UDP streams: one datagram with its peer each way. read()
  // and readDatagram() consume different frames (Data vs Datagram).
  net::awaitable<absl::StatusOr<std::optional<v1::StreamDatagram>>> readDatagram();
  net::awaitable<absl::Status> writeDatagram(v1::SocketAddress peer, std::string payload);
  absl::Status halfClose();
  void reset(v1::ErrorCode code, std::string_view message);
  // The peer's StreamAccept (outgoing: the agent-side and remote addresses);
  // set once openStream() answered.
  const std::optional<v1::StreamAccept>& accepted() const { return accepted_; }

  // Direct delivery, the zero-copy alternative to read() for a consumer
  // that can take bytes at once (a non-blocking socket): while nothing is
  // queued for read(), each arriving payload is first offered to `sink`,
  // inside the session's dispatch; it returns how many leading bytes it
  // took. Those count as delivered (their credit goes back at once); the
  // rest is queued for read(), and later payloads queue behind it until
  // read() has taken the queue. A gap never goes to the sink: it is queued
  // (readEvent() takes it), and the payloads after it queue behind it, so
  // the sink never sees bytes from after a gap before the gap is read. The
  // sink must not call back into the client.
  using Sink = std::function<size_t(std::string_view)>;
  void setSink(Sink sink) { sink_ = std::move(sink); }

 private:
  friend class Client;
  friend struct Link;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Link> link_;  // the session the stream belongs to
  uint64_t id_;
  std::deque<StreamEvent> incoming_;  // data and gaps, in arrival order
  std::deque<v1::StreamDatagram> datagrams_;
  Sink sink_;
  bool eof_ = false;
  absl::Status error_;
  net::Signal readable_;
  net::Signal writable_;
  std::optional<v1::StreamAccept> accepted_;
};

class Client : public std::enable_shared_from_this<Client> {
 public:
  static std::shared_ptr<Client> create(net::asio::any_io_executor ex, ClientOptions options);
  ~Client();

  // Opens a session on the first endpoint that answers. UNAVAILABLE names
  // every endpoint tried and why; a Reject comes back as its typed status
  // (UNAUTHENTICATED, UNSUPPORTED_VERSION, ...).
  net::awaitable<absl::Status> connect();
  // The current session's (it changes with a failover).
  const v1::Welcome& welcome() const;
  std::string endpoint() const;
  net::asio::any_io_executor executor() const { return ex_; }
  // The current session's largest file read (a pread's size above it is
  // refused by the agent).
  uint32_t maxReadSize() const;

  // File handles (this client's numbers): OK while `handle` is open on a
  // live session, else EBADF saying why (closed, or its session is lost).
  absl::Status handleStatus(uint64_t handle) const;
  // Closes `handle` (a directory's with `directory`) without waiting for
  // the answer; nothing when it is not open or its session is gone.
  void closeHandleNoWait(uint64_t handle, bool directory);

  // A unary request. The response's error (if any) comes back as a status.
  // During a failover it waits (within `timeout`) for the new session.
  // With `piped`, a file read answer's data may come in a pipe: the
  // response's FileData.data holds its first bytes and *piped the rest (or
  // *piped stays null and data holds them all). Plain TCP only: over TLS,
  // or when no pipe can be had, the bytes come in memory.
  net::awaitable<absl::StatusOr<v1::Response>> call(
      v1::Request request, std::chrono::milliseconds timeout = std::chrono::seconds(30),
      std::shared_ptr<protocol::PipedBytes>* piped = nullptr);

  // Opens a stream and waits for the agent to accept it (or reset it: the
  // reset's code comes back as the status).
  net::awaitable<absl::StatusOr<std::shared_ptr<ClientStream>>> openStream(v1::StreamOpen open);

  // Streams the agent opens (stolen connections, mirrors) go here; without
  // an acceptor they are reset with UNIMPLEMENTED. The subscription id of
  // a StreamOpen{stolen} or {mirrored} is this client's (as its Subscribed
  // answer said; 0 for a subscription it does not know). What the agent
  // sends before acceptStream() (a mirror's gaps) waits in the stream.
  using StreamAcceptor = std::function<void(std::shared_ptr<ClientStream>, v1::StreamOpen)>;
  void setStreamAcceptor(StreamAcceptor acceptor) { acceptor_ = std::move(acceptor); }
  absl::Status acceptStream(ClientStream& stream);

  // Draining notices from the agent. With a failover to make, the failover
  // handler is told instead (and this one only if no other agent answers).
  void setDrainingHandler(std::function<void(const v1::Draining&)> h) {
    on_draining_ = std::move(h);
  }

  // Notices about this client's subscriptions (a filtered steal's requests
  // that went to an earlier subscription), with this client's subscription
  // id (FilterOverlap.taken_by is the agent's id of the other one).
  void setNoticeHandler(std::function<void(const v1::SubscriptionNotice&)> h) {
    on_notice_ = std::move(h);
  }
  // The target's container restarted and the agent adopted its new process
  // (TargetRestarted, protocol 1.1): the session, its subscriptions and
  // streams go on; files opened before are gone.
  void setTargetRestartedHandler(std::function<void(const v1::TargetRestarted&)> h) {
    on_target_restarted_ = std::move(h);
  }
  // What this client's file watches saw (FileEvents), from the current
  // session only: a watch id is its session's.
  void setFileEventsHandler(std::function<void(const v1::FileEvents&)> h) {
    on_file_events_ = std::move(h);
  }

  // The session is gone for good (the agent's Goaway, SESSION_EXPIRED, no
  // resume within the grace period) and no failover found another agent:
  // `h` gets the AGENT_LOST status once, even when no call or stream is
  // there to notice. Not called for close().
  void setLostHandler(std::function<void(const absl::Status&)> h) { on_lost_ = std::move(h); }
  // Non-OK once the client has no session and will not get one again. A
  // stream or request failing with AGENT_LOST alone does not mean that: a
  // failover may have moved the client on.
  const absl::Status& lostStatus() const { return lost_; }

  // Called after each resume of the session over a new connection, with why
  // the previous one was lost.
  void setResumedHandler(std::function<void(const absl::Status&)> h) {
    on_resumed_ = std::move(h);
  }

  // Called after each move to another agent, once its subscriptions are
  // made again.
  void setFailoverHandler(std::function<void(const FailoverEvent&)> h) {
    on_failover_ = std::move(h);
  }

  // Replicas (ClientOptions::replicas). Opens a session on `endpoint` and
  // makes every subscription there under this client's ids; its streams
  // come to the acceptor like the current session's. OK once the session
  // is open (a subscription that failed there is in the kAdded event). With
  // no live current session (lost, or draining), the new one becomes the
  // current at once.
  net::awaitable<absl::Status> addReplica(std::string endpoint);
  // Makes the replica at `endpoint` the current session: requests, file
  // opens and outgoing streams go there from now on. The one before stays
  // a replica (its subscriptions and streams go on until its agent ends).
  // NOT_FOUND when no live replica is there.
  absl::Status promote(const std::string& endpoint, const std::string& reason);
  // Ends the session at `endpoint` (a Goaway: the agent drops it and its
  // subscriptions; its streams are reset): a replica, or the current one,
  // whose place a replica then takes (or the client waits for one, as
  // when it is lost). Nothing when there is none.
  void dropSession(const std::string& endpoint, const std::string& reason);
  // The live replica sessions' endpoints (the current one not included).
  std::vector<std::string> replicaEndpoints() const;
  // A request to the session at `endpoint` (the current one or a replica):
  // what a workload's session asks each agent (how many sessions it has).
  // NOT_FOUND when no live session is there.
  net::awaitable<absl::StatusOr<v1::Response>> callAt(std::string endpoint, v1::Request request,
                                                      std::chrono::milliseconds timeout);
  // No agent will come (a workload left without pods): the session ends
  // as lost with `why` (AGENT_LOST).
  void abandon(const absl::Status& why);
  void setReplicaHandler(std::function<void(const ReplicaEvent&)> h) {
    on_replica_ = std::move(h);
  }
  // The current session is lost (or draining) and no replica has taken
  // its place yet.
  bool waitingForAgent() const { return moving_ && options_.replicas; }

  // Ends the session (the agent drops it at once). The handlers set above
  // are dropped then, and when the session is lost for good: whatever they
  // hold is released, even a stream of this client.
  void close();
  // close(), then waits until the agent has closed each connection, which
  // it does once it has read everything, the Goaway included, or until
  // `bound`. For a relayed path (a kubectl port-forward) the caller is
  // about to end: the relay may go once this returns.
  net::awaitable<void> closeAndWait(std::chrono::milliseconds bound);
  // Cuts the transport without ending the session (tests; a network blip).
  void cutTransportForTest();
  uint64_t resumeCountForTest() const;
  uint64_t failoverCountForTest() const { return failovers_; }

 private:
  friend class ClientStream;
  friend struct Link;
  explicit Client(net::asio::any_io_executor ex, ClientOptions options);
  // Sends each live link its Goaway and closes it after the flush (with
  // `linger`: after the agent's close, within it); the transports closing.
  std::vector<std::shared_ptr<net::SessionTransport>> closeLinks(
      std::optional<std::chrono::milliseconds> linger);

  struct Pending;
  // A subscription (steal, mirror) under this client's id.
  struct Subscription {
    v1::Request request;  // to make it again on another agent
    // The Links it lives on (their generation) and its id on each agent;
    // empty: it is gone.
    std::map<uint64_t, uint64_t> agents;
  };
  // A file or directory handle under this client's number.
  struct Handle {
    uint64_t generation = 0;
    uint64_t agent_fd = 0;
    std::string endpoint;
    // ClientOptions::reopen_files: what it takes to open it again.
    std::string path;  // empty: a directory, or not reopenable
    int32_t flags = 0;
    v1::FileStat identity;
    int64_t offset = 0;  // of read/write/seek
    bool stale = false;  // its file changed on the agent it moved to
  };

  // TCP connect, then the TLS handshake when options ask for TLS. `limit`
  // (when non-zero) shortens the connect or handshake timeout.
  // `after_cut`: for ClientOptions::resolve_endpoint.
  net::awaitable<absl::StatusOr<net::Stream>> dial(
      const std::string& endpoint, bool* refused = nullptr,
      std::chrono::milliseconds limit = std::chrono::milliseconds(0), bool after_cut = false);
  net::awaitable<absl::Status> handshake(
      Link& link, net::Stream& socket, bool resume, std::string* leftover,
      std::chrono::milliseconds limit = std::chrono::milliseconds(0));
  // Carries out a LinkLifecycle's steps (dial, handshake, wait): the Link
  // it reached (`resuming`, or a new one), or why not.
  struct Reached;
  net::awaitable<absl::StatusOr<Reached>> runLifecycle(LinkLifecycle plan,
                                                       std::shared_ptr<Link> resuming);
  LinkBackoff backoff() const;
  void start(std::shared_ptr<Link> link, net::Stream socket, std::string leftover);
  net::awaitable<void> runTransports(std::shared_ptr<Client> self, std::shared_ptr<Link> link,
                                     net::Stream socket, std::string leftover);
  bool canFailover() const;
  std::shared_ptr<Link> linkOf(uint64_t generation) const;
  // Starts failover() detached (net::spawn); an exception ends the session.
  void spawnFailover(std::shared_ptr<Link> from, FailoverEvent event,
                     std::optional<v1::Draining> draining);
  net::awaitable<void> failover(std::shared_ptr<Client> self, std::shared_ptr<Link> from,
                                FailoverEvent event, std::optional<v1::Draining> draining);
  net::awaitable<absl::StatusOr<v1::Response>> callOn(
      std::shared_ptr<Link> link, v1::Request request, std::chrono::milliseconds timeout,
      uint64_t subscription, std::shared_ptr<protocol::PipedBytes>* piped = nullptr);
  // Fails what `link` carries; the current link's loss moves the client to
  // another agent or ends it.
  void linkLost(const std::shared_ptr<Link>& link, const absl::Status& why);
  // After the current link's loss: a failover, or the end.
  void moveOn(const std::shared_ptr<Link>& link, std::string reason, size_t streams,
              size_t requests);
  // Terminal: fails what is pending, tells the lost handler (not on close()),
  // then drops every handler (releaseHandlers).
  void sessionLost(const absl::Status& why);
  void releaseHandlers();
  net::awaitable<bool> waitForMove(std::chrono::steady_clock::time_point deadline);
  // Replicas (replicas.cc): makes subscription `id` on `link` (once; its
  // answer maps it), the result; the live replica to take the current
  // one's place; promotion itself; a replica's loss or drain.
  net::awaitable<absl::Status> subscribeOn(std::shared_ptr<Link> link, uint64_t id);
  net::awaitable<void> fanOut(uint64_t id);
  std::shared_ptr<Link> nextReplica() const;
  void promoteLink(std::shared_ptr<Link> next, std::string reason, bool keep_old);
  // A new replica with no live current session takes its place.
  void takeOverIfNoCurrent(const std::shared_ptr<Link>& link);
  // The current link is gone or drains: a replica takes its place, or the
  // client waits for one (ClientOptions::replicas).
  void replaceCurrent(const std::shared_ptr<Link>& link, std::string reason, bool draining,
                      size_t streams, size_t requests);
  bool replicaLost(const std::shared_ptr<Link>& link, const absl::Status& why);
  void emitReplica(ReplicaEvent event) {
    if (on_replica_) on_replica_(event);
  }
  // reopen_files: the handle's file opened again on the current link, or
  // ESTALE (and the handle stays stale) when it is not the same file.
  net::awaitable<absl::Status> reopen(uint64_t handle, std::chrono::milliseconds timeout);
  // reopen_files: the offset a read, write or seek answer moves the handle to.
  // `piped`: the bytes of a read's answer that came in a pipe.
  void trackOffset(uint64_t handle, const v1::Response& response, size_t piped);
  // Client handles <-> agent handles in file requests and answers.
  absl::Status mapHandleOut(v1::Request& request);
  void mapHandleIn(const v1::Request& request, v1::Response& response);
  absl::Status mapUnsubscribe(v1::Request& request, bool* gone);

  // From the Links' SessionHandler.
  void onResponse(Link& link, v1::Response response,
                  std::shared_ptr<protocol::PipedBytes> piped = nullptr);
  void onStreamOpen(Link& link, v1::StreamOpen open);
  // Maps the stream's subscription id and gives it to the acceptor.
  void handOver(Link& link, std::shared_ptr<ClientStream> stream, v1::StreamOpen open);
  void onDraining(Link& link, v1::Draining draining);
  void onNotice(Link& link, v1::SubscriptionNotice notice);
  void onTargetRestarted(Link& link, v1::TargetRestarted restarted);
  void onFileEvents(Link& link, v1::FileEvents events);

  net::asio::any_io_executor ex_;
  ClientOptions options_;
  std::shared_ptr<net::ssl::context> tls_;  // built from options_ on the first dial
  std::shared_ptr<Link> link_;  // the current session
  std::vector<std::weak_ptr<Link>> retiring_;  // draining agents' sessions
  std::vector<std::shared_ptr<Link>> replicas_;  // ClientOptions::replicas
  uint64_t generations_ = 0;
  absl::Status lost_;  // non-OK once the client is gone for good
  bool closing_ = false;
  bool moving_ = false;  // a failover is under way
  net::Signal moved_;
  uint64_t failovers_ = 0;
  std::map<uint64_t, Subscription> subscriptions_;
  uint64_t next_subscription_ = 0;
  std::map<uint64_t, Handle> handles_;
  uint64_t next_handle_ = 0;
  StreamAcceptor acceptor_;
  std::function<void(const v1::Draining&)> on_draining_;
  std::function<void(const v1::SubscriptionNotice&)> on_notice_;
  std::function<void(const v1::TargetRestarted&)> on_target_restarted_;
  std::function<void(const v1::FileEvents&)> on_file_events_;
  std::function<void(const absl::Status&)> on_lost_;
  std::function<void(const FailoverEvent&)> on_failover_;
  std::function<void(const absl::Status&)> on_resumed_;
  std::function<void(const ReplicaEvent&)> on_replica_;
};

}  // namespace siphon::client
