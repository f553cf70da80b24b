// The AgentSession a pump's stream lives on (socket_pump.h's PumpHost).
// Weak: a stream never keeps an ended session alive. Shared by every
// service that pumps a socket over a stream (outgoing, steal).
#pragma once

#include <memory>

#include "agent/outgoing/socket_pump.h"
#include "agent/server/server.h"

namespace siphon::agent::outgoing {

class SessionHost : public PumpHost {
 public:
  explicit SessionHost(std::weak_ptr<AgentSession> session) : session_(std::move(session)) {}

  protocol::Session* session() override {
    auto s = session_.lock();
    return s && !s->ended() ? &s->session() : nullptr;
  }
  void wake() override {
    if (auto s = session_.lock()) s->wake();
  }
  void reset(uint64_t stream_id, const v1::Error& error) override {
    if (auto s = session_.lock()) s->resetStream(stream_id, error);
  }
  void release(uint64_t stream_id) override {
    if (auto s = session_.lock()) s->unregisterStream(stream_id);
  }
  void sent(uint64_t stream_id, uint64_t n) override {
    if (auto s = session_.lock()) s->countSent(stream_id, n);
  }
  void gap(uint64_t stream_id, uint64_t bytes) override {
    if (auto s = session_.lock()) s->countGap(stream_id, bytes);
  }

 private:
  std::weak_ptr<AgentSession> session_;
};

}  // namespace siphon::agent::outgoing
