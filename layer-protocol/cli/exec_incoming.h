// `siphon exec`'s incoming traffic: the target's connections (--steal),
// HTTP requests (--steal with --filter-*) or copies of connections
// (--mirror) on a port, delivered to the program's own listener inside its
// namespace; with --incoming, every port the program listens on, for as
// long as it listens.
//
// The program's listeners are in its network namespace, which siphon is
// not in: each delivery is a connection the connector makes there
// (exec/sandbox.h, connectInside()), joined to the stream as `siphon steal`
// joins its own (Bridge, Exchange, Replay). A listener that is not up yet
// (the program still starting) is tried again until the connect timeout.
//
// Call order: construct; subscribe() the --steal/--mirror ports before the
// program starts (a refusal fails the run before anything ran; connections
// that come meanwhile wait in their subscription); start() once the
// program runs; onMoved() from the session's kMoved event; releaseAll()
// when the program ended (or the run ends).
//
// Threads: the client's event loop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/bridge.h"
#include "cli/exec_config.h"
#include "cli/json_writer.h"
#include "siphon/client/subscriptions.h"
#include "siphon/client/target.h"
#include "siphon/transport/asio.h"

namespace siphon::cli {

// What the incoming side tells its command.
struct IncomingHooks {
  std::function<void(std::string)> line;                // a line for people (stderr)
  std::function<void(JsonLine)> event;                  // a --json event
  std::function<void(const absl::Status&)> check_lost;  // a call or stream failed
  std::function<void()> changed;                        // a delivery ended
};

// Reaches the program's listener on `port` at the first of `addresses`
// that accepts, from inside its namespace (the connector). A refusal
// everywhere is tried again every 50 ms until `timeout`: the program may
// not listen yet. UNAVAILABLE "connect to the program's port 8080:
// Connection refused".
net::awaitable<absl::Status> dialInside(net::tcp::socket& socket,
                                        std::shared_ptr<const int> connector,
                                        std::vector<std::string> addresses, uint16_t port,
                                        std::chrono::milliseconds timeout);

class ExecIncoming : public std::enable_shared_from_this<ExecIncoming> {
 public:
  ExecIncoming(const client::Target& target, std::chrono::milliseconds connect_timeout,
               std::optional<client::HttpFilter> filter, IncomingHooks hooks);
  ~ExecIncoming();

  // Steals or mirrors `p.port`. An error says which port and why (PORT_BUSY
  // for a port another session steals); nothing is kept of it then.
  net::awaitable<absl::Status> subscribe(IncomingPort p);
  // The program runs: deliveries start (to `connector`, which this object
  // now owns), and with `mode` other than kOff every port the program
  // listens on (read from /proc/PID/net/tcp{,6}) is subscribed while it
  // listens; `own_ports` (siphon's own listeners there) are not its.
  void start(int connector, pid_t pid, IncomingMode mode, std::set<uint16_t> own_ports);
  // After a move to another agent: a line for each port that did not come
  // back there.
  void onMoved(const std::string& agent);
  // Gives every port back and stops watching. A lost session has none to
  // give back.
  net::awaitable<void> releaseAll(bool session_lost);

  // Deliveries under way (connections, requests, copies).
  size_t open() const { return open_; }

 private:
  struct Route;

  net::awaitable<absl::Status> subscribeRoute(std::shared_ptr<Route> route);
  static net::awaitable<void> serve(std::shared_ptr<ExecIncoming> self,
                                    std::shared_ptr<Route> route);
  static net::awaitable<void> serveConnection(std::shared_ptr<ExecIncoming> self,
                                              std::shared_ptr<Route> route,
                                              client::SubscriptionEvent e);
  static net::awaitable<void> serveMirrored(std::shared_ptr<ExecIncoming> self,
                                            std::shared_ptr<Route> route,
                                            client::SubscriptionEvent e);
  void serveRequest(const std::shared_ptr<Route>& route, client::SubscriptionEvent e);
  static net::awaitable<void> watch(std::shared_ptr<ExecIncoming> self);
  net::awaitable<void> rescan();
  LocalDialer dialerFor(const Route& route) const;
  void deliveryEvent(const Route& route, const std::string& from, const absl::Status& s);
  void done();
  std::string subscribedLine(const Route& route) const;

  net::asio::any_io_executor executor_;
  client::Subscriptions subscriptions_;
  std::chrono::milliseconds connect_timeout_;
  std::optional<client::HttpFilter> filter_;
  IncomingHooks hooks_;
  std::shared_ptr<int> connector_;  // -1 until start()
  pid_t pid_ = -1;
  IncomingMode mode_ = IncomingMode::kOff;
  std::set<uint16_t> own_ports_;
  std::map<uint16_t, std::shared_ptr<Route>> routes_;  // by the target's port
  // Ports the program listens on that could not be taken (PORT_BUSY...):
  // said once, tried again only once the program listened anew.
  std::set<uint16_t> refused_;
  bool started_ = false;
  bool released_ = false;
  size_t open_ = 0;
  net::asio::steady_timer watch_timer_;
};

}  // namespace siphon::cli
