// The client library's inside: one session with one agent (a Link) and the
// requests in flight on it. Private to src/client/: the public surface is
// siphon/client/client.h and the typed headers beside it.
//
// Where the rest is: link.cc dials, handshakes, resumes and runs a Link's
// transports (its decisions in link_lifecycle.*, which does no I/O);
// streams.cc is ClientStream and the stream frames of a Link;
// failover.cc moves the client to another agent and ends it; calls.cc sends
// requests and maps handles and subscription ids.
//
// Threads: everything here runs on the client's executor.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "siphon/client/client.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/session_transport.h"

namespace siphon::client {

struct Client::Pending {
  explicit Pending(net::asio::any_io_executor ex) : done(ex) {}
  net::Signal done;
  std::optional<absl::StatusOr<v1::Response>> result;
  // A subscribe (steal, mirror): its answer is mapped to a client id as it
  // arrives, before any stream of the subscription can be handed out.
  bool subscribe = false;
  uint64_t subscription = 0;  // the client id to keep (a failover's resubscribe); 0: a new one
  v1::Request request;        // kept for a later failover
  std::shared_ptr<protocol::PipedBytes> piped;  // a piped read's data (Client::call)
};

// One session with one agent: the protocol state, the transport that carries
// it, and what is in flight on it.
struct Link : protocol::SessionHandler, std::enable_shared_from_this<Link> {
  Link(Client& c, uint64_t gen, std::string ep)
      : client(c), generation(gen), endpoint(std::move(ep)) {}

  Client& client;
  const uint64_t generation;
  const std::string endpoint;
  std::unique_ptr<protocol::Session> session;
  std::shared_ptr<net::SessionTransport> transport;
  v1::Welcome welcome;
  absl::Status lost;    // non-OK once this session is gone
  absl::Status goaway;  // the agent ended the session
  bool retiring = false;       // its agent drains: it serves its streams until they end
  bool resubscribing = false;  // a failover is making the subscriptions again here
  uint64_t resumes = 0;
  bool handed_over = false;  // the last resume met a new agent process (a handover)
  std::map<uint64_t, std::shared_ptr<Client::Pending>> pending;
  std::map<uint64_t, std::weak_ptr<ClientStream>> streams;
  std::map<uint64_t, uint64_t> subscription_ids;  // the agent's id -> the client's
  std::set<uint64_t> subscribing;  // client ids being made here (replicas)
  // Streams of subscriptions (stolen, mirrored) that arrived before their
  // resubscription's answer. The streams are registered already, so what
  // comes for them meanwhile waits in them.
  std::vector<std::pair<std::shared_ptr<ClientStream>, v1::StreamOpen>> parked;
  size_t prune_at = 64;

  void wake() {
    if (transport) transport->wake();
  }
  std::shared_ptr<ClientStream> stream(uint64_t id) {
    auto it = streams.find(id);
    return it == streams.end() ? nullptr : it->second.lock();
  }
  // Streams that end cleanly stay in the map until their owner lets go:
  // sweep those now and then, so a long session does not grow it.
  void add(uint64_t id, const std::shared_ptr<ClientStream>& s) {
    if (streams.size() >= prune_at) {
      std::erase_if(streams, [](const auto& e) { return e.second.expired(); });
      prune_at = std::max<size_t>(64, 2 * streams.size());
    }
    streams[id] = s;
  }
  // Streams still open on the session (what a move leaves or resets).
  size_t openStreams() const {
    size_t n = 0;
    for (const auto& [id, weak] : streams) {
      if (!weak.expired() && session && session->streamOpen(id)) ++n;
    }
    return n;
  }
  // Fails every request and stream in flight with `why`; returns how many
  // of each (streams.cc).
  std::pair<size_t, size_t> failAll(const absl::Status& why);

  // protocol::SessionHandler. Requests, opens and notices go to the Client
  // (calls.cc); stream frames to their ClientStream (streams.cc).
  void onResponse(v1::Response response) override { client.onResponse(*this, std::move(response)); }
  void onResponse(v1::Response response, std::shared_ptr<protocol::PipedBytes> piped) override {
    client.onResponse(*this, std::move(response), std::move(piped));
  }
  void onStreamOpen(v1::StreamOpen open) override { client.onStreamOpen(*this, std::move(open)); }
  void onDraining(v1::Draining draining) override {
    client.onDraining(*this, std::move(draining));
  }
  void onNotice(v1::SubscriptionNotice notice) override { client.onNotice(*this, std::move(notice)); }
  void onFileEvents(v1::FileEvents events) override {
    client.onFileEvents(*this, std::move(events));
  }
  void onTargetRestarted(v1::TargetRestarted restarted) override {
    client.onTargetRestarted(*this, std::move(restarted));
  }
  void onStreamAccept(v1::StreamAccept accept) override;
  void onStreamData(uint64_t id, std::string_view payload) override;
  void onStreamGap(v1::StreamGap gap) override;
  void onStreamDatagram(v1::StreamDatagram datagram) override;
  void onStreamHalfClose(uint64_t id) override;
  void onStreamReset(uint64_t id, v1::Error error) override;
  void onStreamWritable(uint64_t id) override;
  void onGoaway(v1::Goaway g) override;
};

// What Client::runLifecycle reached: the Link, its socket and the bytes
// read past the Welcome.
struct Client::Reached {
  std::shared_ptr<Link> link;
  net::Stream socket;
  std::string leftover;
};

}  // namespace siphon::client
