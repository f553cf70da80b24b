// Which copy of a meshed connection the mirror follows.
//
// In a pod with a service mesh's sidecar (Istio, Linkerd), a client's
// connection to port P crosses the pod's namespace twice: on eth0 from the
// client (the mesh-facing hop: with a real mesh, mTLS bytes), REDIRECTed by
// the mesh's nat PREROUTING rule to its proxy; then from the proxy to the
// application over lo, with the same destination port P (the
// application-facing hop: the plain bytes). The TC program copies both. The
// application-facing hop is the one a mirror of P must deliver, once, so a
// connection seen on an interface other than lo whose destination the
// pod's conntrack translated to another port, a port that is not a
// listener of this agent (the iptables steal backend REDIRECTs to its own
// listener: that connection is what the steal delivers), is left out.
// Packets on lo are never left out.
//
// The question goes to conntrack at the connection's first packet; a bare
// SYN comes before conntrack has confirmed it (TC ingress runs before
// netfilter), so an unanswered SYN is held until the connection's next
// packet (the SYN-ACK leaves after the SYN passed netfilter) or for 1 s,
// then delivered or dropped with the verdict. Anything unknown (no
// conntrack, a failed lookup) delivers: a mirror may show a hop twice,
// never lose one.
//
// Call order: setPorts() whenever the mirrored ports change, onPacket() for
// every copied packet in ring order, advanceTime() on each tick.
// Threads: one (the mirror engine's, inside the target's netns).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/mirror/reassembly.h"

namespace siphon::agent::mirror {

// The kernel's answers, behind a seam (tests pass a fake).
class NatLookup {
 public:
  virtual ~NatLookup() = default;
  // The destination port conntrack gave the connection client -> server
  // (the source port of its reply tuple): server.port when it was not
  // translated; nullopt when conntrack has no such connection (yet, or no
  // conntrack in the namespace) or could not be asked.
  virtual std::optional<uint16_t> translatedPort(const Endpoint& client,
                                                 const Endpoint& server) = 0;
  // Whether a TCP listener on `port` in the namespace is a socket of this
  // process.
  virtual bool ownListener(uint16_t port) = 0;
};

// The real one: ctnetlink and /proc, in the calling thread's netns (make it
// on the engine's thread). Fails open: no socket, no answer.
std::unique_ptr<NatLookup> makeKernelNatLookup();

struct RedirectedHopsCounters {
  uint64_t connections_left_out = 0;
  uint64_t packets_left_out = 0;
};

class RedirectedHops {
 public:
  using Deliver = std::function<void(std::string_view packet)>;

  explicit RedirectedHops(std::unique_ptr<NatLookup> nat);

  void setPorts(std::set<uint16_t> ports) { ports_ = std::move(ports); }
  // A copied raw IP packet, seen on lo (`loopback`) or another interface:
  // calls `deliver` for what goes on to reassembly now (held packets of
  // the connection first, in order).
  void onPacket(std::string_view packet, bool loopback, Timestamp now, const Deliver& deliver);
  // Releases SYNs held past their bound, forgets connections closed or
  // idle for long.
  void advanceTime(Timestamp now, const Deliver& deliver);

  const RedirectedHopsCounters& counters() const { return counters_; }
  size_t sizeForTest() const { return connections_.size(); }

  static constexpr Timestamp kHoldLimit = std::chrono::seconds(1);
  static constexpr Timestamp kClosedLinger = std::chrono::seconds(10);
  static constexpr Timestamp kIdleLimit = std::chrono::minutes(5);
  static constexpr size_t kMaxConnections = 65536;
  static constexpr size_t kMaxHeld = 4;

 private:
  struct Connection {
    std::optional<bool> leave_out;  // the verdict, once known
    std::vector<std::string> held;  // SYNs waiting for it
    Timestamp first_held{0};
    Timestamp last_seen{0};
    bool closed = false;  // a FIN or RST went by
  };
  using Key = std::pair<Endpoint, Endpoint>;  // client, server

  // Whether a connection to `server_port` that conntrack translated to
  // `port` is left out.
  bool decide(uint16_t server_port, std::optional<uint16_t> port, Timestamp now);
  void release(Connection& c, const Deliver& deliver);

  std::unique_ptr<NatLookup> nat_;
  std::set<uint16_t> ports_;
  std::map<Key, Connection> connections_;
  std::map<uint16_t, std::pair<bool, Timestamp>> own_listener_;  // port -> answer, asked at
  RedirectedHopsCounters counters_;
};

}  // namespace siphon::agent::mirror
