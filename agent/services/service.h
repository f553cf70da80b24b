// How the agent's services plug into sessions. A RequestService answers unary
// requests of some kinds; a StreamService opens streams of some kinds; a
// StreamEndpoint is the agent side of one open stream. Services are built once
// at start-up (registry.cc) with what they need (ServiceContext).
//
// Threads: every method here is called on the event loop. Blocking work goes
// to ServiceContext::blocking and posts its result back to ServiceContext::io.
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/server/config.h"
#include "agent/services/session_host.h"
#include "agent/target/proc_fs.h"
#include "agent/target/target.h"
#include "siphon/transport/asio.h"
#include "siphon/v1/frame.pb.h"
#include "siphon/v1/handover.pb.h"
#include "agent/common/unique_fd.h"

namespace siphon::agent {

class NetnsRunner;
namespace metrics {
class AgentMetrics;
}

// Subscription ids, unique across the services that subscribe (steal,
// mirror), so an Unsubscribe names exactly one. Event loop only.
class SubscriptionIds {
 public:
  uint64_t next() { return next_++; }
  // Handover: the new agent goes on where the old one's ids were.
  uint64_t peek() const { return next_; }
  void setNext(uint64_t next) { next_ = std::max(next_, next); }

 private:
  uint64_t next_ = 1;
};

struct ServiceContext {
  net::asio::io_context& io;
  net::asio::thread_pool& blocking;  // blocking calls (files, /proc) run here
  const Target& target;
  ProcFs& procfs;
  NetnsRunner& netns;  // creates sockets inside the target's netns (a NetnsWorker)
  const AgentConfig& config;
  // Resolves a name as the target would (its resolv.conf and hosts, queries
  // from its netns). Set by the DNS service when it starts; empty otherwise.
  // `done` runs on the resolver's thread: post back to `io` before touching
  // sessions.
  std::function<void(v1::DnsRequest, std::function<void(absl::StatusOr<v1::DnsResponse>)>)>
      resolve_name;
  SubscriptionIds subscription_ids;
  // The agent's metrics (null in tests that need none).
  metrics::AgentMetrics* metrics = nullptr;
  // Called on the event loop after the target restarted (Target::adopt),
  // with its new pid: services that hold more of the old target than the
  // root fd's number (which names the new root already) start again there.
  std::vector<std::function<void(pid_t)>> target_restarted;
};

// A service's part on the new agent of a handover (docs/CONTINUITY.md,
// "Handover"): importState() before the agent serves (`sessions`: the
// imported sessions by id; take the descriptors named in `in` out of
// `fds`), startAfterHandover() once the old agent let go.
class HandoverImport {
 public:
  virtual ~HandoverImport() = default;
  virtual absl::Status importState(
      const v1::AgentState& in, std::vector<UniqueFd>& fds,
      const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) {
    (void)in;
    (void)fds;
    (void)sessions;
    return absl::OkStatus();
  }
  virtual void startAfterHandover() {}
};

class RequestService : public HandoverImport {
 public:
  // Answers `request` exactly once with session->respond(), now or later
  // (from the event loop). Errors go in Response.error (siphon::toProtoError).
  // A service that answers later holds the session (shared, or weak when the
  // answer may be dropped with it); it never learns what implements it.
  virtual void handle(std::shared_ptr<SessionHost> session, v1::Request request) = 0;
  // Services that take Request{unsubscribe}: whether subscription `id` is
  // this service's and belongs to `session_id` (the registry routes the
  // unsubscribe to its owner).
  virtual bool ownsSubscription(uint64_t id, const std::string& session_id) const {
    (void)id;
    (void)session_id;
    return false;
  }
  // The session is gone for good: release what it held (open files...).
  virtual void sessionEnded(const std::string& session_id) { (void)session_id; }
  // The agent is stopping (after every session ended): stop accepting work
  // and undo what the service did to the target. The event loop runs a
  // little longer, then stops.
  virtual void agentStopping() {}
  // The agent starts draining (SIGTERM): give the target back everything new
  // (new connections reach the application, new subscriptions are refused
  // with AGENT_DRAINING) while work in flight goes on. agentStopping()
  // follows when the drain ends.
  virtual void agentDraining() {}
  // Work in flight a drain waits for besides the sessions' streams (a
  // connection being passed through to the application, say).
  virtual size_t inFlight() const { return 0; }
  // Handover (docs/CONTINUITY.md, "Handover"), in this order on the old
  // agent: prepareHandover() (sessions still live: take no new work that
  // could not move, let what is under way finish), handoverBlocker() until
  // it is "" or the wait ends, freeze() (take no new work from the target:
  // accept loops stop; the sessions' transports are cut), handoverBlocker()
  // again, exportState(); then either thaw() (the new agent failed, or a
  // blocker stayed: go on as before; it also undoes a prepareHandover()
  // no freeze followed) or handedOver() (it took everything: let go of
  // what is the target's without undoing it). On the new agent:
  // importState() before it serves, startAfterHandover() once the old one
  // let go.
  virtual void prepareHandover() {}
  virtual void freeze() {}
  virtual void thaw() {}
  // Why this service's state cannot move now ("" when it can). Transient
  // reasons (a connect under way) clear while the agent is frozen.
  virtual std::string handoverBlocker() const { return ""; }
  virtual absl::Status exportState(v1::AgentState* out, std::vector<UniqueFd>* fds) {
    (void)out;
    (void)fds;
    return absl::OkStatus();
  }
  virtual void handedOver() {}
  // importState(), startAfterHandover(): HandoverImport.
  // `siphon sessions`: appends the subscriptions session `session_id` holds
  // with this service (steal, mirror).
  virtual void describeSubscriptions(
      const std::string& session_id,
      google::protobuf::RepeatedPtrField<v1::SubscriptionSummary>* out) const {
    (void)session_id;
    (void)out;
  }
};

// The agent side of one stream. The session routes the peer's frames here.
class StreamEndpoint {
 public:
  virtual ~StreamEndpoint() = default;
  // Payload is valid during the call. Call session.consumed(id, n) once the
  // bytes are delivered (written to the socket): that grants the peer credit.
  virtual void onData(std::string_view payload) = 0;
  virtual void onDatagram(v1::StreamDatagram datagram) { (void)datagram; }
  virtual void onHalfClose() = 0;
  virtual void onReset(const v1::Error& error) = 0;
  // Send credit is back (sendCredit() was 0 before).
  virtual void onWritable() = 0;
  // The peer accepted a stream the agent opened (a stolen connection).
  virtual void onAccept(const v1::StreamAccept& accept) { (void)accept; }
  // The session ended: close sockets now; send no frames.
  virtual void close() = 0;

  // Handover (docs/CONTINUITY.md, "Handover"): freeze() stops every read
  // and write until thaw(); exportState() describes a frozen endpoint for a
  // new agent process (its descriptors appended to `fds`, named by index).
  // The default: an endpoint that cannot move, and says what it is.
  virtual void freeze() {}
  virtual void thaw() {}
  virtual absl::Status exportState(v1::PumpExport* out, std::vector<UniqueFd>* fds) {
    (void)out;
    (void)fds;
    return absl::FailedPreconditionError("a stream of a kind that does not move yet");
  }
};

class StreamService : public HandoverImport {
 public:
  // Opens the stream: accept it (session->session().acceptStream) and
  // register an endpoint (session->registerStream), or reset it with a
  // typed error. May finish later, from the event loop.
  virtual void open(std::shared_ptr<SessionHost> session, v1::StreamOpen open) = 0;
  // The agent starts draining (SIGTERM): streams that hold nothing the
  // target needs (a capture) end now, so the drain does not wait for them;
  // new ones are refused with AGENT_DRAINING.
  virtual void agentDraining() {}
  // Handover: why this service's streams cannot move now ("" when they
  // can; RequestService::handoverBlocker).
  virtual std::string handoverBlocker() const { return ""; }
  // Handover, on the new agent (HandoverImport): the endpoints of streams
  // the old agent's sessions exported with this service's name
  // (PumpExport::service), registered with their sessions before the agent
  // serves; started once the old agent let go.
};

class ServiceRegistry {
 public:
  void addRequest(v1::Request::BodyCase kind, std::shared_ptr<RequestService> service);
  void addStream(v1::StreamOpen::KindCase kind, std::shared_ptr<StreamService> service);
  void addFeature(v1::Feature feature) { features_.push_back(feature); }
  // Request{unsubscribe} goes to the service that owns the subscription
  // (RequestService::ownsSubscription); call once every service is added.
  void routeUnsubscribe();

  RequestService* request(v1::Request::BodyCase kind) const;
  StreamService* stream(v1::StreamOpen::KindCase kind) const;
  const std::vector<v1::Feature>& features() const { return features_; }
  void sessionEnded(const std::string& session_id);
  void agentStopping();
  void agentDraining();
  size_t inFlight() const;
  void describeSubscriptions(
      const std::string& session_id,
      google::protobuf::RepeatedPtrField<v1::SubscriptionSummary>* out) const;
  // Handover: RequestService's calls, on every service.
  void prepareHandover();
  void freeze();
  void thaw();
  std::string handoverBlocker() const;
  absl::Status exportState(v1::AgentState* out, std::vector<UniqueFd>* fds);
  absl::Status importState(const v1::AgentState& in, std::vector<UniqueFd>& fds,
                           const std::map<std::string, std::shared_ptr<SessionHost>>& sessions);
  void handedOver();
  void startAfterHandover();

 private:
  std::map<int, std::shared_ptr<RequestService>> requests_;
  std::map<int, std::shared_ptr<StreamService>> streams_;
  std::vector<std::shared_ptr<RequestService>> unique_requests_;
  std::vector<v1::Feature> features_;
};

// Builds every service the agent offers (registry.cc).
std::unique_ptr<ServiceRegistry> buildServices(ServiceContext& ctx);

}  // namespace siphon::agent
