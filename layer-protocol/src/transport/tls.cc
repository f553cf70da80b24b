#include "siphon/transport/tls.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::net::tls {
namespace {

// OpenSSL's reason for the last failure on this thread's error queue (then
// cleared, so it does not leak into the next operation's error).
std::string lastOpensslError() {
  unsigned long code = ERR_peek_last_error();  // NOLINT(runtime/int): OpenSSL's type
  std::string out;
  if (code == 0) {
    out = "unknown OpenSSL error";
  } else if (const char* reason = ERR_reason_error_string(code)) {
    out = reason;
  } else {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    out = buf;
  }
  ERR_clear_error();
  return out;
}

absl::Status bad(std::string_view flag, const std::string& path, std::string_view what) {
  return protoError(v1::INVALID_ARGUMENT, absl::StrCat(asv(flag), " ", path, ": ", asv(what)));
}

// A clear "cannot read" before OpenSSL's vaguer "system lib" for a missing
// or unreadable file.
absl::Status checkReadable(std::string_view flag, const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return bad(flag, path, absl::StrCat("cannot read: ", std::strerror(errno)));
  char c;
  ssize_t n = ::read(fd, &c, 1);
  int err = errno;
  ::close(fd);
  if (n < 0) return bad(flag, path, absl::StrCat("cannot read: ", std::strerror(err)));
  if (n == 0) return bad(flag, path, "the file is empty");
  return absl::OkStatus();
}

// Never prompts on the terminal for an encrypted key's passphrase: an
// encrypted key fails to load ("bad decrypt") instead.
int noPassphrase(char*, int, int, void*) { return 0; }

absl::StatusOr<std::shared_ptr<ssl::context>> newContext(ssl::context::method method) {
  auto ctx = std::make_shared<ssl::context>(method);
  SSL_CTX* native = ctx->native_handle();
  if (SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION) != 1) {
    return protoError(v1::INTERNAL, absl::StrCat("TLS 1.2 minimum: ", lastOpensslError()));
  }
  SSL_CTX_set_default_passwd_cb(native, noPassphrase);
  return ctx;
}

// The certificate chain (leaf first) and its key.
absl::Status loadIdentity(SSL_CTX* ctx, std::string_view cert_flag, const std::string& cert,
                          std::string_view key_flag, const std::string& key) {
  RETURN_IF_ERROR(checkReadable(cert_flag, cert));
  RETURN_IF_ERROR(checkReadable(key_flag, key));
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) {
    return bad(cert_flag, cert, absl::StrCat("not a PEM certificate: ", lastOpensslError()));
  }
  // Read the key on its own first, so that a file that is not a key and a
  // key that belongs to another certificate get different messages.
  BIO* bio = BIO_new_file(key.c_str(), "r");
  if (bio == nullptr) return bad(key_flag, key, absl::StrCat("cannot open: ", lastOpensslError()));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(bio, nullptr, noPassphrase, nullptr);
  BIO_free(bio);
  if (pkey == nullptr) {
    return bad(key_flag, key, absl::StrCat("not a PEM private key: ", lastOpensslError()));
  }
  int used = SSL_CTX_use_PrivateKey(ctx, pkey);
  EVP_PKEY_free(pkey);
  if (used != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    return bad(key_flag, key,
               absl::StrCat("does not match the certificate in ", cert, ": ", lastOpensslError()));
  }
  return absl::OkStatus();
}

absl::Status loadCa(SSL_CTX* ctx, std::string_view flag, const std::string& ca) {
  RETURN_IF_ERROR(checkReadable(flag, ca));
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) {
    return bad(flag, ca, absl::StrCat("not PEM CA certificates: ", lastOpensslError()));
  }
  return absl::OkStatus();
}

// Ends the operations on a stream at a deadline by cancelling them.
class Deadline {
 public:
  Deadline(Stream& stream, std::chrono::milliseconds timeout)
      : timer_(stream.get_executor()), state_(std::make_shared<State>()) {
    timer_.expires_after(timeout);
    // The state is shared: a completion already queued may run after we
    // are gone; it then sees `done` and leaves the socket alone.
    timer_.async_wait([state = state_, &socket = stream.socket()](error_code ec) {
      if (ec || state->done) return;
      state->fired = true;
      error_code ignored;
      socket.cancel(ignored);
    });
  }
  ~Deadline() {
    state_->done = true;
    timer_.cancel();
  }
  bool fired() const { return state_->fired; }

 private:
  struct State {
    bool fired = false;
    bool done = false;
  };
  asio::steady_timer timer_;
  std::shared_ptr<State> state_;
};

absl::Status handshakeError(Stream& stream, const error_code& ec, std::string_view peer_side) {
  if (ec == asio::error::eof || ec == ssl::error::stream_truncated) {
    return protoError(v1::UNAVAILABLE,
                      absl::StrCat("the ", asv(peer_side),
                                   " closed the connection during the TLS handshake"));
  }
  if (isTlsError(ec)) {
    return protoError(v1::UNAUTHENTICATED,
                      absl::StrCat("TLS handshake failed: ", reason(stream, ec)));
  }
  return protoError(v1::UNAVAILABLE, absl::StrCat("TLS handshake: ", ec.message()));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ssl::context>> serverContext(const ServerFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return protoError(v1::INVALID_ARGUMENT,
                      files.cert.empty() ? "--tls-key needs --tls-cert"
                                         : "--tls-cert needs --tls-key");
  }
  if (files.cert.empty()) {
    return protoError(v1::INVALID_ARGUMENT, "--tls-client-ca needs --tls-cert and --tls-key");
  }
  ASSIGN_OR_RETURN(auto ctx, newContext(ssl::context::tls_server));
  SSL_CTX* native = ctx->native_handle();
  RETURN_IF_ERROR(loadIdentity(native, "--tls-cert", files.cert, "--tls-key", files.key));
  // Clients connect anew on every resume and never resume TLS sessions:
  // TLS 1.3 session tickets would be bytes for nothing.
  SSL_CTX_set_num_tickets(native, 0);
  if (!files.client_ca.empty()) {
    RETURN_IF_ERROR(loadCa(native, "--tls-client-ca", files.client_ca));
    // Tell clients which CAs are accepted, so one with several identities
    // can pick.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca.c_str())) {
      SSL_CTX_set_client_CA_list(native, names);
    }
    ERR_clear_error();
    SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

absl::StatusOr<std::shared_ptr<ssl::context>> clientContext(const ClientFiles& files) {
  if (files.ca.empty()) {
    return protoError(v1::INVALID_ARGUMENT,
                      "TLS needs --tls-ca FILE (the CA that signed the agent's certificate)");
  }
  if (files.cert.empty() != files.key.empty()) {
    return protoError(v1::INVALID_ARGUMENT,
                      files.cert.empty() ? "--tls-key needs --tls-cert" : "--tls-cert needs --tls-key");
  }
  ASSIGN_OR_RETURN(auto ctx, newContext(ssl::context::tls_client));
  SSL_CTX* native = ctx->native_handle();
  RETURN_IF_ERROR(loadCa(native, "--tls-ca", files.ca));
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER, nullptr);
  if (!files.cert.empty()) {
    RETURN_IF_ERROR(loadIdentity(native, "--tls-cert", files.cert, "--tls-key", files.key));
  }
  return ctx;
}

bool isTlsError(const error_code& ec) {
  return ec.category() == asio::error::get_ssl_category();
}

std::string reason(Stream& stream, const error_code& ec) {
  std::string out = ec.message();
  if (stream.tls()) {
    // The verification's own reason says more than "certificate verify
    // failed" ("hostname mismatch", "unable to get local issuer
    // certificate").
    long result = SSL_get_verify_result(stream.tlsStream().native_handle());  // NOLINT
    if (result != X509_V_OK) absl::StrAppend(&out, ": ", X509_verify_cert_error_string(result));
  }
  return out;
}

awaitable<absl::Status> accept(Stream& stream, std::chrono::milliseconds timeout) {
  Deadline deadline(stream, timeout);
  // Peek: a plain client's Hello stays unread, for a plain answer.
  unsigned char first = 0;
  error_code ec;
  size_t n = co_await stream.socket().async_receive(asio::buffer(&first, 1),
                                                    tcp::socket::message_peek,
                                                    asio::redirect_error(use_awaitable, ec));
  if (deadline.fired()) {
    co_return protoError(v1::TIMEOUT,
                         absl::StrCat("no TLS handshake within ", timeout.count(), " ms"));
  }
  if (ec || n == 0) {
    co_return protoError(v1::UNAVAILABLE,
                         ec && ec != asio::error::eof
                             ? absl::StrCat("read before the TLS handshake: ", ec.message())
                             : std::string("the client closed the connection before the TLS "
                                           "handshake"));
  }
  if (first != kHandshakeRecord) {
    co_return protoError(v1::FAILED_PRECONDITION,
                         "the client sent plain bytes, not a TLS handshake (a client without "
                         "--tls-ca?)");
  }
  ERR_clear_error();
  co_await stream.tlsStream().async_handshake(ssl::stream_base::server,
                                              asio::redirect_error(use_awaitable, ec));
  if (deadline.fired()) {
    co_return protoError(v1::TIMEOUT,
                         absl::StrCat("no TLS handshake within ", timeout.count(), " ms"));
  }
  if (ec) co_return handshakeError(stream, ec, "client");
  co_return absl::OkStatus();
}

awaitable<absl::Status> connect(Stream& stream, const std::string& server_name,
                                std::chrono::milliseconds timeout) {
  SSL* ssl = stream.tlsStream().native_handle();
  error_code ec;
  auto ip = asio::ip::make_address(server_name, ec);
  if (!ec) {
    // An address is checked against the certificate's IP SANs; SNI is for
    // names only (RFC 6066).
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), ip.to_string().c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, server_name.c_str());
    SSL_set1_host(ssl, server_name.c_str());
  }
  Deadline deadline(stream, timeout);
  ERR_clear_error();
  ec.clear();
  co_await stream.tlsStream().async_handshake(ssl::stream_base::client,
                                              asio::redirect_error(use_awaitable, ec));
  if (deadline.fired()) {
    co_return protoError(v1::TIMEOUT,
                         absl::StrCat("no TLS handshake within ", timeout.count(), " ms"));
  }
  if (ec) co_return handshakeError(stream, ec, "agent");
  co_return absl::OkStatus();
}

}  // namespace siphon::net::tls
