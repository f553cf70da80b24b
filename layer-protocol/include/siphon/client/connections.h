// Connections the agent makes from inside the target's network namespace
// (TCP, UDP, unix stream and seqpacket), and the stolen connections a steal
// hands over (subscriptions.h): a Connection is a flow-controlled stream of
// the session. A reader that stops stops the agent reading the socket on
// the other side (TCP backpressure), and nothing else.
//
// Byte streams (TCP, unix stream, stolen): read() yields chunks in order,
// write() sends bytes, halfClose() is a FIN (replies keep coming) and the
// peer's FIN is read()'s nullopt. Message kinds (connected UDP, seqpacket):
// one read() is one datagram or record, one write() sends one. Unconnected
// UDP: receiveFrom() and sendTo() carry the peer of each datagram.
// A connect that fails answers the agent's typed status (kUnavailable
// "connect HOST:PORT from the target: Connection refused", kNotFound for a
// name that does not resolve...). A connection that ends badly ends read()
// and write() with the peer's reset status, or kAgentLost when its agent
// went (a stream is never moved to another agent).
//
// Threads: as the Target's (target.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "siphon/client/target.h"

namespace siphon::client {

class ClientStream;

struct SocketAddress {
  std::string ip;  // "10.0.0.1", "::1"; empty when unknown
  uint16_t port = 0;
  std::string text() const;  // "10.0.0.1:80", "[::1]:80"
};

struct Datagram {
  SocketAddress peer;
  std::string payload;
};

class Connection {
 public:
  enum class Kind { kTcp, kUdp, kUnconnectedUdp, kUnixStream, kUnixSeqpacket, kStolen };
  Connection() = default;

  Kind kind() const { return kind_; }
  // The agent's end and the peer (outgoing: as the agent's socket has them).
  const SocketAddress& local() const { return local_; }
  const SocketAddress& remote() const { return remote_; }
  uint64_t streamId() const;

  // The next chunk, or message; nullopt at the peer's FIN.
  net::awaitable<absl::StatusOr<std::optional<std::string>>> read();
  // Message kinds: one datagram or record (kInvalidArgument above what one
  // frame carries).
  net::awaitable<absl::Status> write(std::string data);
  absl::Status halfClose();
  // Ends both directions at once (an RST to a TCP peer). `code` and `why`
  // go to the agent (its logs, the reset's reason).
  void reset();
  void reset(ErrorCode code, std::string_view why);

  // Direct delivery for a reader that can take bytes at once (a
  // non-blocking socket): while read() has nothing queued, each arriving
  // chunk is first offered to `sink`, which returns how many leading bytes
  // it took; the rest waits for read(), and so do the chunks after it. The
  // sink runs inside the session's dispatch: it must not call back into
  // the library. Byte streams only.
  using Sink = std::function<size_t(std::string_view)>;
  void setSink(Sink sink);

  net::awaitable<absl::StatusOr<std::optional<Datagram>>> receiveFrom();
  net::awaitable<absl::Status> sendTo(SocketAddress peer, std::string payload);

  // The stream underneath (siphon/client/client.h).
  const std::shared_ptr<ClientStream>& stream() const { return stream_; }

 private:
  friend class Connections;
  friend struct TargetCore;
  Connection(Kind kind, std::shared_ptr<ClientStream> stream, SocketAddress local,
             SocketAddress remote)
      : kind_(kind),
        stream_(std::move(stream)),
        local_(std::move(local)),
        remote_(std::move(remote)) {}
  Kind kind_ = Kind::kTcp;
  std::shared_ptr<ClientStream> stream_;
  SocketAddress local_;
  SocketAddress remote_;
};

class Connections {
 public:
  explicit Connections(const Target& target);
  // `host` is an IP or a name the target's DNS resolves.
  net::awaitable<absl::StatusOr<Connection>> connectTcp(std::string host, uint16_t port);
  net::awaitable<absl::StatusOr<Connection>> connectUdp(std::string host, uint16_t port);
  // A UDP socket with no fixed peer: sendTo() and receiveFrom().
  net::awaitable<absl::StatusOr<Connection>> openUdp();
  // `path` inside the target's root, or "@name" for an abstract socket.
  net::awaitable<absl::StatusOr<Connection>> connectUnix(std::string path);
  net::awaitable<absl::StatusOr<Connection>> connectSeqpacket(std::string path);

 private:
  std::shared_ptr<TargetCore> core_;
};

}  // namespace siphon::client
