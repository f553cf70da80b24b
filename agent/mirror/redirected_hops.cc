#include "agent/mirror/redirected_hops.h"

namespace siphon::agent::mirror {
namespace {

// How long an answer about a port's listener is reused: steals come and
// go, a mesh's proxy stays.
constexpr Timestamp kListenerAnswerLife = std::chrono::seconds(1);

}  // namespace

RedirectedHops::RedirectedHops(std::unique_ptr<NatLookup> nat) : nat_(std::move(nat)) {}

bool RedirectedHops::decide(uint16_t server_port, std::optional<uint16_t> port, Timestamp now) {
  if (!port || *port == server_port) return false;
  auto it = own_listener_.find(*port);
  if (it == own_listener_.end() || now - it->second.second >= kListenerAnswerLife) {
    it = own_listener_.insert_or_assign(*port, std::make_pair(nat_->ownListener(*port), now)).first;
  }
  return !it->second.first;
}

void RedirectedHops::release(Connection& c, const Deliver& deliver) {
  std::vector<std::string> held;
  held.swap(c.held);
  for (const std::string& packet : held) {
    if (c.leave_out.value_or(false)) {
      ++counters_.packets_left_out;
    } else {
      deliver(packet);
    }
  }
}

void RedirectedHops::onPacket(std::string_view packet, bool loopback, Timestamp now,
                              const Deliver& deliver) {
  if (loopback) return deliver(packet);
  auto segment = parsePacket(packet, LinkType::kRawIp);
  // Malformed: the table counts it. A port no longer mirrored: the table
  // ignores it.
  if (!segment.ok()) return deliver(packet);
  const bool to_server = ports_.contains(segment->destination.port);
  if (!to_server && !ports_.contains(segment->source.port)) return deliver(packet);
  const Endpoint& client = to_server ? segment->source : segment->destination;
  const Endpoint& server = to_server ? segment->destination : segment->source;
  const bool closing = segment->has(tcp::kFin) || segment->has(tcp::kRst);

  auto it = connections_.find({client, server});
  if (it == connections_.end() && connections_.size() >= kMaxConnections) {
    return deliver(packet);  // too many to remember: shown, maybe twice
  }
  if (it != connections_.end() && it->second.leave_out) {
    Connection& c = it->second;
    c.last_seen = now;
    c.closed = c.closed || closing;
    if (*c.leave_out) {
      ++counters_.packets_left_out;
      return;
    }
    return deliver(packet);
  }

  std::optional<uint16_t> port = nat_->translatedPort(client, server);
  Connection& c = connections_[{client, server}];
  c.last_seen = now;
  c.closed = c.closed || closing;
  const bool bare_syn = segment->has(tcp::kSyn) && !segment->has(tcp::kAck);
  if (!port && bare_syn && c.held.size() < kMaxHeld) {
    // Not confirmed by conntrack yet: wait for the next packet.
    if (c.held.empty()) c.first_held = now;
    c.held.emplace_back(packet);
    return;
  }
  c.leave_out = decide(server.port, port, now);
  if (*c.leave_out) ++counters_.connections_left_out;
  release(c, deliver);
  if (*c.leave_out) {
    ++counters_.packets_left_out;
    return;
  }
  deliver(packet);
}

void RedirectedHops::advanceTime(Timestamp now, const Deliver& deliver) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& c = it->second;
    if (!c.held.empty() && now - c.first_held >= kHoldLimit) {
      // No second look came: conntrack's answer now, or deliver.
      c.leave_out = decide(it->first.second.port,
                           nat_->translatedPort(it->first.first, it->first.second), now);
      if (*c.leave_out) ++counters_.connections_left_out;
      release(c, deliver);
    }
    const Timestamp idle = now - c.last_seen;
    if (c.held.empty() && ((c.closed && idle >= kClosedLinger) || idle >= kIdleLimit)) {
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace siphon::agent::mirror
