// A SessionHost for service unit tests, without the agent's server: it
// records what a service does to the session (responses, registered and
// unregistered streams, resets, wake-ups, operations counts) and gives the
// service a real protocol::Session (agent role) to accept, open and send on.
//
// FakePeer is the client at the other end of that protocol::Session: pipe()
// moves the frames both ways in memory (no socket) until neither side has
// any, the host routing what the client sends to the registered endpoints
// as AgentSession does (and Requests / StreamOpens to the service under
// test, through on_request / on_stream_open). The peer accepts the streams
// the agent opens and records what arrives.
//
// Everything runs on the test's thread; services that post to an
// io_context need that context run (ServiceHarness::settle()).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/services/service.h"
#include "agent/services/session_host.h"
#include "siphon/protocol/session.h"

namespace siphon::fakes {

class FakeSessionHost : public agent::SessionHost,
                        public protocol::SessionHandler,
                        public std::enable_shared_from_this<FakeSessionHost> {
 public:
  explicit FakeSessionHost(std::string id = "fake-session", std::string client_name = "fake-client",
                           protocol::SessionLimits limits = {})
      : id_(std::move(id)),
        client_name_(std::move(client_name)),
        session_(protocol::Role::kAgent, limits) {}

  // ---- SessionHost ----
  const std::string& id() const override { return id_; }
  const std::string& clientName() const override { return client_name_; }
  bool ended() const override { return ended_; }
  protocol::Session& session() override { return session_; }

  void respond(v1::Response response) override {
    responses.push_back(response);
    // Through the protocol session, as AgentSession does: that releases
    // the room reserveResponse() held, and the peer receives it.
    if (!ended_) session_.sendResponse(std::move(response));
  }
  void registerStream(uint64_t stream_id,
                      std::shared_ptr<agent::StreamEndpoint> endpoint) override {
    if (ended_) {
      endpoint->close();
      return;
    }
    registered.push_back(stream_id);
    streams[stream_id] = std::move(endpoint);
  }
  void unregisterStream(uint64_t stream_id) override {
    unregistered.push_back(stream_id);
    streams.erase(stream_id);
  }
  absl::StatusOr<uint64_t> openStream(v1::StreamOpen open) override {
    opened.push_back(open);
    return session_.openStream(std::move(open));
  }
  void resetStream(uint64_t stream_id, const v1::Error& error) override {
    resets.emplace_back(stream_id, error);
    if (!ended_) session_.resetStream(stream_id, error);
  }
  void wake() override { ++wakes; }
  void countSent(uint64_t stream_id, uint64_t n) override { sent[stream_id] += n; }
  void countGap(uint64_t stream_id, uint64_t bytes) override { gap_bytes[stream_id] += bytes; }
  void logLimitHit(const absl::Status& hit) override { limit_hits.push_back(hit); }

  // ---- the test's side ----

  // The session ends as AgentSession::end() does: endpoints closed, no
  // frame sent from here on.
  void end() {
    ended_ = true;
    auto doomed = std::move(streams);
    streams.clear();
    for (auto& [id, e] : doomed) e->close();
  }

  // The answer to `request_id`, if it came.
  std::optional<v1::Response> response(uint64_t request_id) const {
    for (const auto& r : responses)
      if (r.request_id() == request_id) return r;
    return std::nullopt;
  }
  // The last reset of `stream_id`, if any.
  std::optional<v1::Error> resetOf(uint64_t stream_id) const {
    std::optional<v1::Error> out;
    for (const auto& [id, e] : resets)
      if (id == stream_id) out = e;
    return out;
  }
  agent::StreamEndpoint* endpoint(uint64_t stream_id) const {
    auto it = streams.find(stream_id);
    return it == streams.end() ? nullptr : it->second.get();
  }

  // What the client sent that is not stream traffic goes here; unset, it
  // is recorded (requests_seen, opens_seen).
  std::function<void(v1::Request)> on_request;
  std::function<void(v1::StreamOpen)> on_stream_open;

  // ---- protocol::SessionHandler: the client's frames, routed ----
  void onRequest(v1::Request request) override {
    if (on_request) {
      on_request(std::move(request));
    } else {
      requests_seen.push_back(std::move(request));
    }
  }
  void onStreamOpen(v1::StreamOpen open) override {
    if (on_stream_open) {
      on_stream_open(std::move(open));
    } else {
      opens_seen.push_back(std::move(open));
    }
  }
  void onStreamAccept(v1::StreamAccept accept) override {
    if (auto* e = endpoint(accept.stream_id())) e->onAccept(accept);
  }
  void onStreamData(uint64_t stream_id, std::string_view payload) override {
    if (auto* e = endpoint(stream_id)) {
      e->onData(payload);
    } else {
      session_.consumed(stream_id, payload.size());
    }
  }
  void onStreamDatagram(v1::StreamDatagram datagram) override {
    if (auto* e = endpoint(datagram.stream_id())) e->onDatagram(std::move(datagram));
  }
  void onStreamHalfClose(uint64_t stream_id) override {
    if (auto* e = endpoint(stream_id)) e->onHalfClose();
  }
  void onStreamReset(uint64_t stream_id, v1::Error error) override {
    auto it = streams.find(stream_id);
    if (it == streams.end()) return;
    auto e = std::move(it->second);
    streams.erase(it);
    e->onReset(error);
  }
  void onStreamWritable(uint64_t stream_id) override {
    if (auto* e = endpoint(stream_id)) e->onWritable();
  }

  // Recorded.
  std::vector<v1::Response> responses;
  std::map<uint64_t, std::shared_ptr<agent::StreamEndpoint>> streams;
  std::vector<uint64_t> registered;
  std::vector<uint64_t> unregistered;
  std::vector<v1::StreamOpen> opened;  // by the agent (openStream)
  std::vector<std::pair<uint64_t, v1::Error>> resets;
  std::map<uint64_t, uint64_t> sent;
  std::map<uint64_t, uint64_t> gap_bytes;
  std::vector<absl::Status> limit_hits;
  std::vector<v1::Request> requests_seen;
  std::vector<v1::StreamOpen> opens_seen;
  int wakes = 0;

 private:
  std::string id_;
  std::string client_name_;
  protocol::Session session_;
  bool ended_ = false;
};

// The client end of a FakeSessionHost's protocol session.
class FakePeer : public protocol::SessionHandler {
 public:
  explicit FakePeer(FakeSessionHost& host)
      : host_(host), session_(protocol::Role::kClient, host.session().limits()) {}

  protocol::Session& session() { return session_; }

  // Moves frames both ways until neither side has any.
  void pipe() {
    for (bool moved = true; moved;) {
      moved = false;
      const auto now = protocol::Clock::now();
      while (host_.session().hasWrites()) {
        std::string bytes;
        const protocol::WriteBatch batch = host_.session().takeWrites();  // owns the buffers
        for (auto b : batch.buffers()) bytes.append(b);
        absl::Status s = session_.onBytes(bytes, *this, now);
        EXPECT_TRUE(s.ok()) << s;
        moved = true;
      }
      while (session_.hasWrites()) {
        std::string bytes;
        const protocol::WriteBatch batch = session_.takeWrites();
        for (auto b : batch.buffers()) bytes.append(b);
        absl::Status s = host_.session().onBytes(bytes, host_, now);
        EXPECT_TRUE(s.ok()) << s;
        moved = true;
      }
    }
  }

  // Sends a request (answered through the host's on_request); its id.
  uint64_t request(v1::Request request) {
    auto id = session_.sendRequest(std::move(request));
    EXPECT_TRUE(id.ok()) << id.status();
    pipe();
    return id.ok() ? *id : 0;
  }
  // Opens a stream (reaching the host's on_stream_open); its id.
  uint64_t open(v1::StreamOpen open) {
    auto id = session_.openStream(std::move(open));
    EXPECT_TRUE(id.ok()) << id.status();
    pipe();
    return id.ok() ? *id : 0;
  }

  // What arrived.
  std::vector<v1::Response> responses;
  std::vector<v1::StreamOpen> opens;  // streams the agent opened (accepted)
  std::set<uint64_t> accepted;        // streams the agent accepted
  std::map<uint64_t, v1::StreamAccept> accepts;
  std::map<uint64_t, std::string> data;
  std::vector<v1::StreamDatagram> datagrams;
  std::set<uint64_t> half_closed;
  std::map<uint64_t, v1::Error> resets;
  std::vector<v1::StreamGap> gaps;
  std::vector<v1::SubscriptionNotice> notices;
  std::vector<v1::FileEvents> file_events;
  // Accept the streams the agent opens (a stolen connection, a mirror).
  bool accept_opens = true;

  void onResponse(v1::Response response) override { responses.push_back(std::move(response)); }
  void onStreamOpen(v1::StreamOpen open) override {
    if (accept_opens) {
      v1::StreamAccept a;
      a.set_stream_id(open.stream_id());
      EXPECT_TRUE(session_.acceptStream(std::move(a)).ok());
    }
    opens.push_back(std::move(open));
  }
  void onStreamAccept(v1::StreamAccept accept) override {
    accepted.insert(accept.stream_id());
    accepts[accept.stream_id()] = std::move(accept);
  }
  void onStreamData(uint64_t id, std::string_view payload) override {
    data[id].append(payload);
    session_.consumed(id, payload.size());
  }
  void onStreamDatagram(v1::StreamDatagram d) override {
    session_.consumed(d.stream_id(), d.payload().size());
    datagrams.push_back(std::move(d));
  }
  void onStreamHalfClose(uint64_t id) override { half_closed.insert(id); }
  void onStreamReset(uint64_t id, v1::Error e) override { resets[id] = std::move(e); }
  void onStreamGap(v1::StreamGap gap) override { gaps.push_back(std::move(gap)); }
  void onNotice(v1::SubscriptionNotice n) override { notices.push_back(std::move(n)); }
  void onFileEvents(v1::FileEvents e) override { file_events.push_back(std::move(e)); }

  std::optional<v1::Response> response(uint64_t request_id) const {
    for (const auto& r : responses)
      if (r.request_id() == request_id) return r;
    return std::nullopt;
  }

 private:
  FakeSessionHost& host_;
  protocol::Session session_;
};

}  // namespace siphon::fakes
