// TLS for the protocol's connections (docs/SECURITY.md, "Authentication and
// transport"): the agent's and the client's OpenSSL contexts, built from PEM
// files with errors that name the file and OpenSSL's reason, and the two
// handshakes, each bounded by a deadline. TLS 1.2 at least; 1.3 is chosen
// whenever both ends have it (OpenSSL's highest common version).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "siphon/transport/stream.h"

namespace siphon::net::tls {

// The agent's side. `cert` (a PEM chain, leaf first) and `key` are
// required; with `client_ca` every client must present a certificate that
// it signed (mutual TLS). INVALID_ARGUMENT, naming the flag, the file and
// the reason, when a file cannot be read, is not PEM of the right kind, or
// the key does not belong to the certificate.
struct ServerFiles {
  std::string cert;
  std::string key;
  std::string client_ca;  // empty: no client certificate asked for
};
absl::StatusOr<std::shared_ptr<ssl::context>> serverContext(const ServerFiles& files);

// The client's side: `ca` verifies the agent's certificate (required);
// `cert` and `key` (both or neither) are the client's certificate.
// INVALID_ARGUMENT as for serverContext.
struct ClientFiles {
  std::string ca;
  std::string cert;
  std::string key;
};
absl::StatusOr<std::shared_ptr<ssl::context>> clientContext(const ClientFiles& files);

// The first byte of every TLS ClientHello (a handshake record). A protocol
// frame starts with its length's high byte, 0 for anything a Hello can be.
constexpr unsigned char kHandshakeRecord = 0x16;

// What the agent answers (in plain, as a Reject) a client that sends a
// plain protocol frame to its TLS listener.
inline constexpr std::string_view kPlainClientMessage =
    "this agent speaks TLS only: give the client --tls-ca FILE (and --tls-cert/--tls-key "
    "if it asks for a client certificate)";

// Agent side of the handshake on `stream` (tls()). Waits at most `timeout`
// for the client's first byte and the whole handshake. FAILED_PRECONDITION
// when the first bytes are not a TLS handshake (a plain client: nothing was
// read, the caller may answer in plain on stream.socket()); TIMEOUT past the
// deadline; UNAUTHENTICATED when the handshake fails (a bad or missing
// client certificate, no common version...) with OpenSSL's reason;
// UNAVAILABLE when the connection closes first.
awaitable<absl::Status> accept(Stream& stream, std::chrono::milliseconds timeout);

// Client side, on `stream` (tls()): sends `server_name` as SNI when it is a
// name, and checks the agent's certificate for it (a DNS name, or an IP
// address against the certificate's IP SANs). UNAUTHENTICATED with the
// verification failure ("certificate verify failed: hostname mismatch") or
// the alert the agent sent; TIMEOUT; UNAVAILABLE when the connection closes
// first.
awaitable<absl::Status> connect(Stream& stream, const std::string& server_name,
                                std::chrono::milliseconds timeout);

// OpenSSL's reason for a failed TLS operation on `stream` ("certificate
// verify failed: unable to get local issuer certificate", "tlsv13 alert
// certificate required"), else ec.message().
std::string reason(Stream& stream, const error_code& ec);

// Whether `ec` is a TLS-level failure (an alert received or sent, a bad
// record), as opposed to the TCP connection failing under it.
bool isTlsError(const error_code& ec);

}  // namespace siphon::net::tls
