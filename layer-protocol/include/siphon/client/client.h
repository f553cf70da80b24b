// The Asio client of the Siphon protocol: what the CLI and any layer link.
// Connects, authenticates, sends requests, opens and accepts streams, and
// rides through transport cuts by reconnecting and resuming the session.
//
// Threads: a Client and its streams live on one executor; call them from
// coroutines running there.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "siphon/protocol/session.h"
#include "siphon/transport/asio.h"
#include "siphon/transport/session_transport.h"
#include "siphon/v1/frame.pb.h"

namespace siphon::client {

struct ClientOptions {
  // One or more agents serving the same target, "host:port" each; tried in
  // order on connect.
  std::vector<std::string> endpoints;
  std::string token;
  std::string client_name = "siphon";
  protocol::SessionLimits limits;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds handshake_timeout{5000};
  // Reconnect and resume after a transport cut, for at most the agent's
  // session grace.
  bool reconnect = true;
  std::chrono::milliseconds reconnect_backoff_initial{100};
  std::chrono::milliseconds reconnect_backoff_max{2000};
};

class Client;

// A stream of the session. read() yields data in order; write() waits for
// credit, so a slow peer slows only this stream.
class ClientStream {
 public:
  ClientStream(std::shared_ptr<Client> client, uint64_t id);
  uint64_t id() const { return id_; }
  // The next chunk; nullopt at the peer's half-close; an error status when
  // the stream was reset (the peer's code, or AGENT_LOST).
  net::awaitable<absl::StatusOr<std::optional<std::string>>> read();
  net::awaitable<absl::Status> write(std::string data);
  // Sends `data` as exactly one Data frame (one datagram, one seqpacket
  // record): waits until the credit covers all of it. INVALID_ARGUMENT when
  // it never could (above 3/4 of the window the agent granted, since credit
  // returns in quarter-window steps, or above one frame).
  net::awaitable<absl::Status> writeMessage(std::string data);
  // Unconnected UDP streams: one datagram with its peer each way. read()
  // and readDatagram() consume different frames (Data vs Datagram).
  net::awaitable<absl::StatusOr<std::optional<v1::StreamDatagram>>> readDatagram();
  net::awaitable<absl::Status> writeDatagram(v1::SocketAddress peer, std::string payload);
  absl::Status halfClose();
  void reset(v1::ErrorCode code, std::string_view message);

  // Direct delivery, the zero-copy alternative to read() for a consumer
  // that can take bytes at once (a non-blocking socket): while nothing is
  // queued for read(), each arriving payload is first offered to `sink`,
  // inside the session's dispatch; it returns how many leading bytes it
  // took. Those count as delivered (their credit goes back at once); the
  // rest is queued for read(), and later payloads queue behind it until
  // read() has taken the queue. The sink must not call back into the client.
  using Sink = std::function<size_t(std::string_view)>;
  void setSink(Sink sink) { sink_ = std::move(sink); }

 private:
  friend class Client;
  std::shared_ptr<Client> client_;
  uint64_t id_;
  std::deque<std::string> incoming_;
  std::deque<v1::StreamDatagram> datagrams_;
  Sink sink_;
  bool eof_ = false;
  absl::Status error_;
  net::Signal readable_;
  net::Signal writable_;
  std::optional<v1::StreamAccept> accepted_;
};

class Client : public std::enable_shared_from_this<Client>, private protocol::SessionHandler {
 public:
  static std::shared_ptr<Client> create(net::asio::any_io_executor ex, ClientOptions options);
  ~Client() override;

  // Opens a session on the first endpoint that answers. UNAVAILABLE names
  // every endpoint tried and why; a Reject comes back as its typed status
  // (UNAUTHENTICATED, UNSUPPORTED_VERSION, ...).
  net::awaitable<absl::Status> connect();
  const v1::Welcome& welcome() const { return welcome_; }
  std::string endpoint() const { return endpoint_; }

  // A unary request. The response's error (if any) comes back as a status.
  net::awaitable<absl::StatusOr<v1::Response>> call(
      v1::Request request, std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // Opens a stream and waits for the agent to accept it (or reset it: the
  // reset's code comes back as the status).
  net::awaitable<absl::StatusOr<std::shared_ptr<ClientStream>>> openStream(v1::StreamOpen open);

  // Streams the agent opens (stolen connections, mirrors) go here; without
  // an acceptor they are reset with UNIMPLEMENTED.
  using StreamAcceptor = std::function<void(std::shared_ptr<ClientStream>, v1::StreamOpen)>;
  void setStreamAcceptor(StreamAcceptor acceptor) { acceptor_ = std::move(acceptor); }
  absl::Status acceptStream(ClientStream& stream);

  // Draining notices from the agent.
  void setDrainingHandler(std::function<void(const v1::Draining&)> h) {
    on_draining_ = std::move(h);
  }

  // The session is gone for good (the agent's Goaway, SESSION_EXPIRED, no
  // resume within the grace period): `h` gets the AGENT_LOST status once,
  // even when no call or stream is there to notice. Not called for close().
  void setLostHandler(std::function<void(const absl::Status&)> h) { on_lost_ = std::move(h); }

  // Ends the session (the agent drops it at once).
  void close();
  // Cuts the transport without ending the session (tests; a network blip).
  void cutTransportForTest();
  uint64_t resumeCountForTest() const { return resumes_; }

 private:
  friend class ClientStream;
  explicit Client(net::asio::any_io_executor ex, ClientOptions options);

  struct Pending {
    explicit Pending(net::asio::any_io_executor ex) : done(ex) {}
    net::Signal done;
    std::optional<absl::StatusOr<v1::Response>> result;
  };

  net::awaitable<absl::StatusOr<net::tcp::socket>> dial(const std::string& endpoint);
  net::awaitable<absl::Status> handshake(net::tcp::socket& socket, bool resume,
                                         std::string* leftover);
  net::awaitable<void> runTransports(std::shared_ptr<Client> self, net::tcp::socket socket,
                                     std::string leftover);
  net::awaitable<absl::StatusOr<std::pair<net::tcp::socket, std::string>>> reconnect();
  void sessionLost(const absl::Status& why);
  void wake();

  // SessionHandler
  void onResponse(v1::Response response) override;
  void onStreamOpen(v1::StreamOpen open) override;
  void onStreamAccept(v1::StreamAccept accept) override;
  void onStreamData(uint64_t id, std::string_view payload) override;
  void onStreamDatagram(v1::StreamDatagram datagram) override;
  void onStreamHalfClose(uint64_t id) override;
  void onStreamReset(uint64_t id, v1::Error error) override;
  void onStreamWritable(uint64_t id) override;
  void onDraining(v1::Draining draining) override;
  void onGoaway(v1::Goaway goaway) override;

  net::asio::any_io_executor ex_;
  ClientOptions options_;
  std::unique_ptr<protocol::Session> session_;
  std::shared_ptr<net::SessionTransport> transport_;
  v1::Welcome welcome_;
  std::string endpoint_;
  absl::Status lost_;    // non-OK once the session is gone for good
  absl::Status goaway_;  // the agent ended the session
  bool closing_ = false;
  uint64_t resumes_ = 0;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;
  std::map<uint64_t, std::weak_ptr<ClientStream>> streams_;
  StreamAcceptor acceptor_;
  std::function<void(const v1::Draining&)> on_draining_;
  std::function<void(const absl::Status&)> on_lost_;
};

}  // namespace siphon::client
