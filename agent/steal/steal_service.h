// The steal service: sessions subscribe ports of the target
// (Request{steal}) and receive each new TCP connection to them as a stream
// the agent opens (StreamOpen{stolen}); the application no longer sees
// those connections. Request{unsubscribe}, or the session's end, gives the
// port back to the application at once; connections already stolen keep
// flowing until they close.
//
//   subscribe   reserve the port (PORT_BUSY when held) -> start the
//               steering if this is the first subscription (listeners in
//               the target's netns + backend) -> Steering::addPort ->
//               optionally destroy established connections to the port
//               (--flush-connections) -> Subscribed{id, backend}.
//   connection  accepted on a listener -> original destination
//               (Steering::originalDestination) -> the subscription of its
//               port -> StreamOpen{stolen{id, source, destination}} to the
//               session; once accepted, a SocketPump moves bytes with flow
//               control both ways (a slow session backs up this TCP
//               connection only). No active subscription (it was just
//               removed): passthrough to the application (passthrough.h).
//
// Steering changes run on the blocking pool, one at a time (a strand): the
// iptables backend runs processes. Ports are reference counted there, so a
// late "give the port back" never removes a port another session took
// meanwhile.
//
// Threads: handle(), sessionEnded() and the accept loops on the event loop.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/services/service.h"
#include "agent/steal/steering.h"

namespace siphon::agent::steal {

// Builds the steering for the listeners (the backend choice lives here).
// Runs on the blocking pool.
using SteeringFactory =
    std::function<absl::StatusOr<std::unique_ptr<Steering>>(const Listeners& listeners)>;

// Destroys established connections to a port of the target (inet_diag
// SOCK_DESTROY); returns how many. Runs on the blocking pool.
using FlushFunction = std::function<absl::StatusOr<int>(uint16_t port)>;

class StealService;

// The service with the real backends (--steal-backend, --iptables).
std::shared_ptr<StealService> makeStealService(ServiceContext& ctx);
// The same with injected backends (tests).
std::shared_ptr<StealService> makeStealService(ServiceContext& ctx, SteeringFactory factory,
                                               FlushFunction flush);

// Adds the service for Request{steal} and Request{unsubscribe}, and
// FEATURE_STEAL.
void registerSteal(ServiceRegistry& registry, ServiceContext& ctx);

class StealService : public RequestService {
 public:
  // Connects to `destination` from inside the target around the steering:
  // the application gets this connection even while its port is stolen.
  // Resumes on the event loop with a connected non-blocking socket.
  virtual net::awaitable<absl::StatusOr<UniqueFd>> connectPassthrough(SockAddr destination) = 0;

  // Removes the steering now (drain, shutdown): new connections reach the
  // application; subscriptions stay but receive nothing more.
  virtual void stopSteering() = 0;
};

}  // namespace siphon::agent::steal
