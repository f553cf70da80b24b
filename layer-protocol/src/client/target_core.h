// The typed API's inside (siphon/client/target.h and the service headers):
// a TargetCore is the Client and the routing of what it hands on (streams
// of subscriptions, failover, draining, loss) to typed objects. Protobuf
// stays here and in the .cc files.
//
// Ownership: the Client's handlers hold the core weakly (the Client drops
// them when it closes or is lost); typed objects hold the core. A
// subscription's state is held by the core until unsubscribed. When the
// program lets go of its Subscription the state is marked abandoned
// (streams for it are then reset rather than queued) and an Unsubscribe
// goes to the agent; the state is forgotten once that is answered.
//
// Threads: the Client's executor.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "siphon/client/client.h"
#include "siphon/client/connections.h"
#include "siphon/client/files.h"
#include "siphon/client/subscriptions.h"
#include "siphon/client/target.h"

namespace siphon::client {

struct SubscriptionState {
  explicit SubscriptionState(net::asio::any_io_executor ex) : wake(std::move(ex)) {}
  uint64_t id = 0;
  std::string backend;
  // Events not taken yet; a stream's is accepted as next() hands it out.
  std::deque<SubscriptionEvent> events;
  std::deque<std::shared_ptr<ClientStream>> streams;  // of the events that carry one, in order
  net::Signal wake;
  absl::Status ended;      // non-OK once over: next() answers it after the events
  bool claimed = false;    // a Subscription object was made for it
  bool abandoned = false;  // ... and dropped
};

struct TargetCore : std::enable_shared_from_this<TargetCore> {
  explicit TargetCore(std::shared_ptr<Client> c);

  std::shared_ptr<Client> client;
  net::asio::any_io_executor ex;
  std::chrono::milliseconds timeout{30000};
  std::function<void(const LinkEvent&)> on_event;
  std::map<uint64_t, std::shared_ptr<SubscriptionState>> subscriptions;
  // Files::setChangesHandler.
  std::function<void(const FileChanges&)> on_file_changes;

  // Sets the Client's acceptor and handlers, holding this core weakly.
  void install();
  // `piped`: Client::call's.
  net::awaitable<absl::StatusOr<v1::Response>> call(
      v1::Request request, std::shared_ptr<protocol::PipedBytes>* piped = nullptr);
  // The state of subscription `id`, made when it is not known yet (a stream
  // may come before the Subscribed answer reached its caller).
  std::shared_ptr<SubscriptionState> subscription(uint64_t id);

  void onStream(std::shared_ptr<ClientStream> stream, v1::StreamOpen open);
  void onFailover(const FailoverEvent& event);
  void onDraining(const v1::Draining& draining);
  void onTargetRestarted(const v1::TargetRestarted& restarted);
  void onLost(const absl::Status& why);
  void onResumed(const absl::Status& why);
  void onNotice(const v1::SubscriptionNotice& notice);
  void onFileEvents(const v1::FileEvents& events);
  void emit(const LinkEvent& event) {
    if (on_event) on_event(event);
  }
  static void push(SubscriptionState& s, SubscriptionEvent event,
                   std::shared_ptr<ClientStream> stream = nullptr);

  // For the typed objects' private parts.
  static Connection makeConnection(Connection::Kind kind, std::shared_ptr<ClientStream> stream,
                                   SocketAddress local, SocketAddress remote) {
    return Connection(kind, std::move(stream), std::move(local), std::move(remote));
  }
  static void setMirrored(MirroredConnection& m, std::shared_ptr<ClientStream> stream,
                          SocketAddress source, SocketAddress destination, bool mid_stream) {
    m.stream_ = std::move(stream);
    m.source_ = std::move(source);
    m.destination_ = std::move(destination);
    m.mid_stream_ = mid_stream;
  }
};

SocketAddress fromProto(const v1::SocketAddress& a);
v1::SocketAddress toProto(const SocketAddress& a);

// A Response's body of the expected kind, or INTERNAL naming what came.
absl::Status wrongKind(std::string_view what);

}  // namespace siphon::client
