// Steering: what makes new TCP connections to a subscribed port of the
// target reach the agent's listeners instead of the application. Two
// backends implement it:
//
//   sk_lookup (sk_lookup_steering.h): a BPF sk_lookup program on the
//     target's netns, held by a bpf_link only the agent's fd owns; the
//     kernel drops it with the agent, whatever kills it.
//   iptables (iptables_steering.h): nat chains named after the target with
//     REDIRECT rules, removed by a guard process when the agent dies.
//
// The steal service (steal_service.h) creates the listeners inside the
// target's netns and owns subscriptions; a Steering only moves ports.
//
// Threads: addPort, removePort and stop may block (a process to run, a map
// to update) and are called from the agent's blocking pool, one call at a
// time per object (the service serialises them on a strand). exempt,
// unexempt and originalDestination are called on the event loop, and may
// overlap those pool calls: they must touch only what the pool calls never
// change (the sk_lookup backend: the passthrough map, which lives until the
// object is destroyed, and its own exemption table; iptables: socket
// options of the given fd). name() is read once, on the pool, when the
// steering is made (steal_service.cc keeps a copy for the loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/outgoing/address.h"

namespace siphon::agent::steal {

using outgoing::SockAddr;

// The agent's TCP listeners, created in the target's netns, that stolen
// connections are steered to. Bound to the wildcard address (iptables'
// REDIRECT delivers to the address the packet arrived on).
struct Listeners {
  int v4 = -1;           // AF_INET listener
  int v6 = -1;           // AF_INET6 listener with IPV6_V6ONLY; -1 without IPv6
  uint16_t v4_port = 0;  // their bound ports
  uint16_t v6_port = 0;
};

class Steering {
 public:
  virtual ~Steering() = default;

  // "sk_lookup" or "iptables" (Subscribed.backend, logs).
  virtual std::string_view name() const = 0;

  // From now on, new TCP connections to `port` on any address of the target
  // (IPv4, and IPv6 when it has IPv6) reach the listeners. Connections
  // already established are not touched. Adding a port twice is a no-op.
  virtual absl::Status addPort(uint16_t port) = 0;
  // New connections to `port` reach the application again. Removing a port
  // that is not steered is a no-op.
  virtual absl::Status removePort(uint16_t port) = 0;

  // Prepares `fd` (a TCP socket created in the target's netns, not yet
  // connected) so that its connect() to a steered port reaches the
  // application, not the agent: a passthrough. Call unexempt() once the
  // connect is over (either way), before closing the socket.
  virtual absl::Status exempt(int fd) = 0;
  virtual void unexempt(int fd) = 0;

  // Where the client of an accepted connection meant to go.
  virtual absl::StatusOr<SockAddr> originalDestination(int fd) = 0;

  // Removes every trace of the steering from the target now (the
  // destructor does it too). Errors are logged, not returned: there is
  // nothing better to do at that point.
  virtual void stop() = 0;
};

}  // namespace siphon::agent::steal
