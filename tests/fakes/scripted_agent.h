// An agent that speaks the protocol and serves nothing by itself: the test
// says what it sends. For client library tests that need frames the real
// agent only sends under kernel events (a mirror's records and gaps, streams
// of subscriptions). One client, one session, no resume.
//
// Threads: runs on the executor it is given, the client's (one event loop);
// queue frames on session() from there, then call wake().
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "siphon/protocol/handshake.h"
#include "siphon/protocol/limits.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/frame_io.h"
#include "siphon/transport/session_transport.h"

namespace siphon::fakes {

class ScriptedAgent : public protocol::SessionHandler {
 public:
  explicit ScriptedAgent(net::asio::any_io_executor ex)
      : acceptor_(ex, net::tcp::endpoint(net::asio::ip::make_address("127.0.0.1"), 0)),
        ready_(ex) {}

  std::string address() const {
    return absl::StrCat("127.0.0.1:", acceptor_.local_endpoint().port());
  }

  // Accepts one client, answers its Hello with a Welcome and runs the
  // session until close() or the client goes. Spawn it before the client
  // connects.
  net::awaitable<void> serve() {
    net::error_code ec;
    net::tcp::socket socket(acceptor_.get_executor());
    co_await acceptor_.async_accept(socket, net::asio::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;
    auto first = co_await net::readFirstFrame(socket, std::chrono::seconds(5),
                                              protocol::kDefaultMaxFrameSize);
    if (!first.ok() || !first->frame.has_hello()) co_return;
    const protocol::SessionLimits limits =
        protocol::negotiateLimits(first->frame.hello().requested_limits(), {});
    v1::Frame welcome;
    *welcome.mutable_welcome()->mutable_version() = protocol::currentVersion();
    welcome.mutable_welcome()->set_session_id("scripted");
    welcome.mutable_welcome()->set_resume_token("scripted-token");
    *welcome.mutable_welcome()->mutable_limits() = protocol::toProto(limits);
    if (!(co_await net::writeFrame(socket, welcome)).ok()) co_return;
    session_ = std::make_unique<protocol::Session>(protocol::Role::kAgent, limits);
    transport_ = std::make_shared<net::SessionTransport>(std::move(socket), *session_, *this,
                                                         std::move(first->leftover));
    ready_.notify();
    (void)co_await transport_->run();
  }

  // Waits until the session runs (the client connected).
  net::awaitable<void> ready() {
    while (!session_) co_await ready_.wait();
  }

  protocol::Session& session() { return *session_; }
  void wake() {
    if (transport_) transport_->wake();
  }
  void close() {
    if (transport_) transport_->close();
    net::error_code ignored;
    acceptor_.close(ignored);
  }

  // Opens a stream to the client as the agent would for a mirrored
  // connection of subscription `subscription_id`.
  uint64_t openMirrored(uint64_t subscription_id, bool mid_stream = false) {
    v1::StreamOpen open;
    auto* m = open.mutable_mirrored();
    m->set_subscription_id(subscription_id);
    setPeers(m);
    m->set_started_mid_stream(mid_stream);
    auto id = session_->openStream(std::move(open));
    wake();
    return id.ok() ? *id : 0;
  }
  // Opens a stream to the client as the agent would for one stolen HTTP/1.1
  // request of subscription `subscription_id`; its id.
  absl::StatusOr<uint64_t> openStolenRequest(uint64_t subscription_id, std::string method,
                                             std::string path) {
    v1::StreamOpen open;
    auto* r = open.mutable_stolen_request();
    r->set_subscription_id(subscription_id);
    setPeers(r);
    r->set_protocol("HTTP/1.1");
    r->set_method(std::move(method));
    r->set_path(std::move(path));
    r->set_connection_request(1);
    auto id = session_->openStream(std::move(open));
    wake();
    return id;
  }
  // One record of a mirrored stream: the direction byte, then the bytes.
  absl::Status sendRecord(uint64_t stream_id, v1::Direction d, std::string_view bytes) {
    std::string record(1, static_cast<char>(d));
    record.append(bytes);
    absl::Status s = session_->sendData(stream_id, std::move(record));
    wake();
    return s;
  }
  absl::Status sendGap(uint64_t stream_id, v1::Direction d, uint64_t bytes) {
    v1::StreamGap gap;
    gap.set_stream_id(stream_id);
    gap.set_direction(d);
    gap.set_bytes(bytes);
    absl::Status s = session_->sendGap(std::move(gap));
    wake();
    return s;
  }

  // What the client sent; set by the test.
  std::function<void(v1::Request)> on_request;
  std::function<void(v1::StreamAccept)> on_accept;
  std::function<void(uint64_t)> on_writable;
  std::function<void(uint64_t, v1::Error)> on_reset;

  void onRequest(v1::Request r) override {
    if (on_request) on_request(std::move(r));
  }
  void onStreamAccept(v1::StreamAccept a) override {
    if (on_accept) on_accept(std::move(a));
  }
  void onStreamWritable(uint64_t id) override {
    if (on_writable) on_writable(id);
  }
  void onStreamReset(uint64_t id, v1::Error error) override {
    if (on_reset) on_reset(id, std::move(error));
  }
  void onStreamData(uint64_t id, std::string_view payload) override {
    session_->consumed(id, payload.size());
  }

 private:
  // Every stream the fake opens is of one remote client's connection:
  // 10.0.0.2:51234 -> 10.0.0.1:80 (the tests' lines name these).
  template <typename Open>
  static void setPeers(Open* o) {
    o->mutable_source()->set_ip("10.0.0.2");
    o->mutable_source()->set_port(51234);
    o->mutable_destination()->set_ip("10.0.0.1");
    o->mutable_destination()->set_port(80);
  }

  net::tcp::acceptor acceptor_;
  net::Signal ready_;
  std::unique_ptr<protocol::Session> session_;
  std::shared_ptr<net::SessionTransport> transport_;
};

// Runs f() on `io`'s thread (one that runs io.run()) and returns its
// result: how a test thread reads or drives a ScriptedAgent.
template <typename F>
auto callOn(net::asio::io_context& io, F f) -> decltype(f()) {
  std::promise<decltype(f())> p;
  net::asio::post(io, [&] {
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      p.set_value();
    } else {
      p.set_value(f());
    }
  });
  return p.get_future().get();
}

}  // namespace siphon::fakes
