// Outgoing connections made from inside the target: a client opens a stream
// with StreamOpen{outgoing: OutgoingConnect{...}} and the agent connects a
// socket created in the target's network namespace (NetnsWorker), accepts
// the stream with StreamAccept{local, remote} once connected, and pumps
// bytes both ways with flow control (socket_pump.h). A failure resets the
// stream with a typed error ("connect 10.0.0.1:80 from the target:
// Connection refused", UNAVAILABLE).
//
//   TCP             host (IP literal or name) + port.
//   UDP             host + port: a connected socket, one Data frame = one
//                   datagram. No host: an unconnected socket bound to
//                   `port` (0: any) on all addresses of the target (IPv6
//                   dual-stack when the target has IPv6), StreamDatagram
//                   frames carry the peer address each way.
//   UNIX_STREAM,    unix_path: a path inside the target's root (resolved by
//   UNIX_SEQPACKET  openat2 RESOLVE_IN_ROOT, see address.h) or "@name" for
//                   an abstract socket of the target's network namespace.
//                   Seqpacket: one Data frame = one record.
//
// Names are resolved as the target resolves them, through the DNS service
// (ServiceContext::resolve_name: its resolv.conf and hosts, queries from its
// netns). Without a DNS service, getaddrinfo on the NetnsWorker thread is the
// fallback (the agent's own resolver configuration).
//
// Threads: open() and everything after it on the event loop; blocking parts
// (the path walk, getaddrinfo) run elsewhere and come back.
#pragma once

#include <chrono>
#include <memory>

#include "agent/services/service.h"

namespace siphon::agent::outgoing {

struct OutgoingOptions {
  // From StreamOpen to connected (resolution included); TIMEOUT after.
  std::chrono::milliseconds connect_timeout{10000};
};

std::shared_ptr<StreamService> makeOutgoingService(ServiceContext& ctx,
                                                   OutgoingOptions options = {});

// Adds the service and its features (FEATURE_OUTGOING_TCP, _UDP, _UNIX).
void registerOutgoing(ServiceRegistry& registry, ServiceContext& ctx);

}  // namespace siphon::agent::outgoing
