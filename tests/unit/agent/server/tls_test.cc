// TLS and mutual TLS on the agent's listener, end to end in process on
// loopback (targetless agent, real client), plus the agent's and the CLI's
// binaries for their TLS flags. No root. A throwaway CA, an agent
// certificate (SAN IP:127.0.0.1, DNS:agent.test), client certificates and a
// second, foreign CA are made with the `openssl` command in a temp dir.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "agent/server/server.h"
#include "agent/target/proc_fs.h"
#include "siphon/client/client.h"
#include "siphon/status.h"
#include "siphon/transport/tls.h"
#include "tests/fakes/loopback.h"
#include "tests/fakes/echo_server.h"
#include "tests/fakes/in_process_agent.h"

namespace siphon::agent {
namespace {

namespace asio = net::asio;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr char kToken[] = "tls-test-token";

// Runs `command` with /bin/sh; its exit code and what it wrote (stdout and
// stderr together).
struct Ran {
  int code = -1;
  std::string output;
};
Ran runShell(const std::string& command) {
  Ran r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The certificates, made once for the whole test binary.
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/siphon-tls-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    ok_ = make();
  }
  ~Pki() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  bool ok() const { return ok_; }
  const std::string& log() const { return log_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  bool sh(const std::string& command) {
    Ran r = runShell("cd '" + dir_ + "' && " + command);
    log_ += command + "\n" + r.output;
    return r.code == 0;
  }
  bool ca(const std::string& name) {
    return sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
              "-subj /CN=" + name + " -keyout " + name + ".key -out " + name + ".pem");
  }
  bool leaf(const std::string& name, const std::string& ca, const std::string& ext) {
    std::ofstream(path(name + ".ext")) << ext << "\n";
    return sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" + name +
              " -keyout " + name + ".key -out " + name + ".csr") &&
           sh("openssl x509 -req -days 2 -in " + name + ".csr -CA " + ca + ".pem -CAkey " + ca +
              ".key -set_serial " + std::to_string(++serial_) + " -extfile " + name +
              ".ext -out " + name + ".pem");
  }
  bool make() {
    return ca("ca") && ca("other-ca") &&
           leaf("agent", "ca",
                "subjectAltName=IP:127.0.0.1,DNS:agent.test\nextendedKeyUsage=serverAuth") &&
           leaf("client", "ca", "extendedKeyUsage=clientAuth") &&
           leaf("stranger", "other-ca", "extendedKeyUsage=clientAuth") &&
           sh("printf 'not a certificate\\n' > garbage.pem");
  }

  std::string dir_;
  std::string log_;
  int serial_ = 0;
  bool ok_ = false;
};

const Pki& pki() {
  static const Pki p;  // removes its temp dir at exit
  return p;
}

using fakes::loopbackListener;

using fakes::randomBytes;

v1::Request infoRequest() {
  v1::Request r;
  r.mutable_info();
  return r;
}

v1::StreamOpen outgoingTcp(uint16_t port) {
  v1::StreamOpen o;
  o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
  o.mutable_outgoing()->set_host("127.0.0.1");
  o.mutable_outgoing()->set_port(port);
  return o;
}

// Reads a stream until the peer's half-close.
net::awaitable<absl::StatusOr<std::string>> readAll(std::shared_ptr<client::ClientStream> s) {
  const auto stream = std::move(s);
  std::string got;
  while (true) {
    auto chunk = co_await stream->read();
    if (!chunk.ok()) co_return chunk.status();
    if (!chunk->has_value()) co_return got;
    got += **chunk;
  }
}

class TlsTest : public testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(pki().ok()) << "making certificates:\n" << pki().log(); }

  // A targetless agent with TLS; `mutual`: clients need a certificate.
  void start(bool tls = true, bool mutual = true) {
    AgentConfig config;
    config.token = kToken;
    if (tls) {
      config.tls_cert = pki().path("agent.pem");
      config.tls_key = pki().path("agent.key");
      if (mutual) config.tls_client_ca = pki().path("ca.pem");
    }
    TargetSpec spec;
    spec.mode = TargetMode::kTargetless;
    agent_.start(config, std::make_unique<RealProcFs>(), spec);
  }

  // A client with the test CA and, when `cert` names one, that certificate.
  client::ClientOptions options(const std::string& cert = "client") {
    client::ClientOptions o;
    o.endpoints = {agent_.address()};
    o.token = kToken;
    o.client_name = "tls-test";
    o.tls_ca = pki().path("ca.pem");
    if (!cert.empty()) {
      o.tls_cert = pki().path(cert + ".pem");
      o.tls_key = pki().path(cert + ".key");
    }
    return o;
  }

  // What connect() says for `o`; the session is closed if one opened.
  absl::Status connectWith(client::ClientOptions o) {
    absl::Status out = absl::InternalError("not run");
    fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
      auto c = client::Client::create(ex, o);
      out = co_await c->connect();
      if (out.ok()) out = (co_await c->call(infoRequest(), milliseconds(10000))).status();
      c->close();
    });
    return out;
  }

  fakes::InProcessAgent agent_;
};

TEST_F(TlsTest, MutualTlsServesRequestsAndStreamsByteExact) {
  start();
  fakes::EchoServer echo(loopbackListener(), fakes::EchoServer::Kind::kStream);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    absl::Status s = co_await c->connect();
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) co_return;
    auto info = co_await c->call(infoRequest(), milliseconds(10000));
    EXPECT_TRUE(info.ok()) << info.status();
    if (info.ok()) {
      EXPECT_EQ(info->info().session_id(), c->welcome().session_id());
    }
    v1::Request env;
    env.mutable_env()->add_include("PATH");
    auto r = co_await c->call(env, milliseconds(10000));
    EXPECT_TRUE(r.ok()) << r.status();

    auto stream = co_await c->openStream(outgoingTcp(echo.port()));
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) co_return;
    const std::string data = randomBytes(2 << 20, 3);
    EXPECT_TRUE((co_await (*stream)->write(data)).ok());
    EXPECT_TRUE((*stream)->halfClose().ok());
    auto got = co_await readAll(*stream);
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) {
      EXPECT_TRUE(*got == data) << "echo differs: " << got->size() << " bytes";
    }
    c->close();
  });
}

// A cut of the TCP connection under TLS resumes on a new TLS connection:
// the same session, a stream carried across with nothing lost.
TEST_F(TlsTest, ResumeOverTlsAfterTheConnectionIsCut) {
  start();
  fakes::EchoServer echo(loopbackListener(), fakes::EchoServer::Kind::kStream);
  fakes::runClient([&](const asio::any_io_executor& ex) -> net::awaitable<void> {
    auto c = client::Client::create(ex, options());
    EXPECT_TRUE((co_await c->connect()).ok());
    auto stream = co_await c->openStream(outgoingTcp(echo.port()));
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) co_return;
    const std::string data = randomBytes(1 << 20, 5);
    const size_t half = data.size() / 2;
    EXPECT_TRUE((co_await (*stream)->write(data.substr(0, half))).ok());
    c->cutTransportForTest();
    EXPECT_TRUE((co_await (*stream)->write(data.substr(half))).ok());
    EXPECT_TRUE((*stream)->halfClose().ok());
    auto got = co_await readAll(*stream);
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) {
      EXPECT_TRUE(*got == data) << "echo differs: " << got->size() << " bytes";
    }
    auto info = co_await c->call(infoRequest(), milliseconds(10000));
    EXPECT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(c->resumeCountForTest(), 1u);
    if (info.ok()) {
      EXPECT_EQ(info->info().session_id(), c->welcome().session_id());
      EXPECT_EQ(info->info().sessions(), 1u);
    }
    c->close();
  });
}

TEST_F(TlsTest, PlainClientIsToldTheAgentSpeaksTlsAndOthersAreServed) {
  start();
  client::ClientOptions plain = options("");
  plain.tls_ca.clear();
  absl::Status s = connectWith(plain);
  EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  EXPECT_NE(s.message().find(absl::StrCat("the agent at ", agent_.address(),
                                          " speaks TLS: give --tls-ca")),
            std::string::npos)
      << s;
  // The agent is still up and serves a good client.
  absl::Status good = connectWith(options());
  EXPECT_TRUE(good.ok()) << good;
}

TEST_F(TlsTest, ClientWithoutACertificateIsRefusedUnderMutualTls) {
  start();
  absl::Status s = connectWith(options(""));
  EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  EXPECT_NE(s.message().find("certificate"), std::string::npos) << s;
  EXPECT_TRUE(connectWith(options()).ok());
}

TEST_F(TlsTest, ClientCertificateOfAnotherCaIsRefused) {
  start();
  absl::Status s = connectWith(options("stranger"));
  EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  EXPECT_NE(s.message().find("unknown ca"), std::string::npos) << s;
  EXPECT_TRUE(connectWith(options()).ok());
}

TEST_F(TlsTest, WithoutClientCaNoClientCertificateIsNeeded) {
  start(/*tls=*/true, /*mutual=*/false);
  absl::Status s = connectWith(options(""));
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(TlsTest, TheTokenIsStillRequiredOverTls) {
  start();
  client::ClientOptions o = options();
  o.token = "not-the-token";
  absl::Status s = connectWith(o);
  EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  EXPECT_NE(s.message().find("token"), std::string::npos) << s;
}

TEST_F(TlsTest, AgentCertificateIsCheckedForTheNameAndTheCa) {
  start();
  client::ClientOptions wrong_name = options();
  wrong_name.tls_server_name = "someone-else.test";
  absl::Status s = connectWith(wrong_name);
  EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  EXPECT_NE(s.message().find("certificate verify failed"), std::string::npos) << s;
  EXPECT_NE(s.message().find("mismatch"), std::string::npos) << s;

  client::ClientOptions dns_name = options();
  dns_name.tls_server_name = "agent.test";  // the certificate's DNS SAN
  EXPECT_TRUE(connectWith(dns_name).ok());

  client::ClientOptions foreign_ca = options();
  foreign_ca.tls_ca = pki().path("other-ca.pem");
  s = connectWith(foreign_ca);
  EXPECT_EQ(errorCodeOf(s), v1::UNAUTHENTICATED) << s;
  EXPECT_NE(s.message().find("certificate verify failed"), std::string::npos) << s;
}

TEST_F(TlsTest, TlsClientToAPlainAgentFailsClearly) {
  start(/*tls=*/false);
  absl::Status s = connectWith(options());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("TLS"), std::string::npos) << s;
}

TEST_F(TlsTest, BadFilesAreNamedWithTheReason) {
  using net::tls::serverContext;
  auto missing = serverContext({pki().path("nope.pem"), pki().path("agent.key"), ""});
  EXPECT_EQ(errorCodeOf(missing.status()), v1::INVALID_ARGUMENT);
  EXPECT_NE(missing.status().message().find(pki().path("nope.pem") + ": cannot read: No such file"),
            std::string::npos)
      << missing.status();

  auto garbage = serverContext({pki().path("garbage.pem"), pki().path("agent.key"), ""});
  EXPECT_NE(garbage.status().message().find("--tls-cert " + pki().path("garbage.pem") +
                                            ": not a PEM certificate"),
            std::string::npos)
      << garbage.status();

  auto mismatch = serverContext({pki().path("agent.pem"), pki().path("client.key"), ""});
  EXPECT_NE(mismatch.status().message().find("--tls-key " + pki().path("client.key") +
                                             ": does not match the certificate"),
            std::string::npos)
      << mismatch.status();

  auto not_a_key = serverContext({pki().path("agent.pem"), pki().path("agent.pem"), ""});
  EXPECT_NE(not_a_key.status().message().find("not a PEM private key"), std::string::npos)
      << not_a_key.status();

  auto bad_ca =
      serverContext({pki().path("agent.pem"), pki().path("agent.key"), pki().path("garbage.pem")});
  EXPECT_NE(bad_ca.status().message().find("--tls-client-ca " + pki().path("garbage.pem")),
            std::string::npos)
      << bad_ca.status();

  auto no_key = serverContext({pki().path("agent.pem"), "", ""});
  EXPECT_EQ(no_key.status().message(), "--tls-cert needs --tls-key");
  auto ca_alone = serverContext({"", "", pki().path("ca.pem")});
  EXPECT_EQ(ca_alone.status().message(), "--tls-client-ca needs --tls-cert and --tls-key");

  EXPECT_TRUE(serverContext({pki().path("agent.pem"), pki().path("agent.key"),
                             pki().path("ca.pem")})
                  .ok());
  auto client_no_ca = net::tls::clientContext({"", pki().path("client.pem"),
                                               pki().path("client.key")});
  EXPECT_EQ(errorCodeOf(client_no_ca.status()), v1::INVALID_ARGUMENT);
}

// The agent binary refuses bad TLS files at start-up with a usage error
// (exit 2) naming the file, before it opens anything.
TEST_F(TlsTest, AgentBinaryRefusesBadTlsFilesWithExitTwo) {
  const std::string agent = SIPHON_AGENT_BIN;
  const std::string base = "env -i " + agent + " --insecure-no-auth --listen 127.0.0.1:0 ";
  Ran no_key = runShell(base + "--tls-cert " + pki().path("agent.pem") + " targetless");
  EXPECT_EQ(no_key.code, 2) << no_key.output;
  EXPECT_NE(no_key.output.find("--tls-cert needs --tls-key"), std::string::npos) << no_key.output;

  Ran mismatch = runShell(base + "--tls-cert " + pki().path("agent.pem") + " --tls-key " +
                     pki().path("client.key") + " targetless");
  EXPECT_EQ(mismatch.code, 2) << mismatch.output;
  EXPECT_NE(mismatch.output.find("does not match the certificate"), std::string::npos)
      << mismatch.output;

  Ran garbage = runShell(base + "--tls-cert " + pki().path("agent.pem") + " --tls-key " +
                    pki().path("agent.key") + " --tls-client-ca " + pki().path("garbage.pem") +
                    " targetless");
  EXPECT_EQ(garbage.code, 2) << garbage.output;
  EXPECT_NE(garbage.output.find("--tls-client-ca " + pki().path("garbage.pem")),
            std::string::npos)
      << garbage.output;

  Ran unreadable = runShell(base + "--tls-cert /nonexistent/agent.pem --tls-key " +
                       pki().path("agent.key") + " targetless");
  EXPECT_EQ(unreadable.code, 2) << unreadable.output;
  EXPECT_NE(unreadable.output.find("/nonexistent/agent.pem: cannot read"), std::string::npos)
      << unreadable.output;
}

// The CLI's TLS flags against the in-process agent.
TEST_F(TlsTest, CliConnectsWithTlsFlagsAndExplainsAPlainAttempt) {
  start();
  std::ofstream(pki().path("token")) << kToken << "\n";
  const std::string cli = std::string("env -i ") + SIPHON_CLI_BIN + " --agent " +
                          agent_.address() + " --token-file " + pki().path("token") + " --json ";
  Ran ok = runShell(cli + "--tls-ca " + pki().path("ca.pem") + " --tls-cert " + pki().path("client.pem") +
               " --tls-key " + pki().path("client.key") + " info");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("targetless"), std::string::npos) << ok.output;

  Ran plain = runShell(cli + "info");
  EXPECT_EQ(plain.code, 4) << plain.output;
  EXPECT_NE(plain.output.find("speaks TLS: give --tls-ca"), std::string::npos) << plain.output;

  Ran bad_ca = runShell(cli + "--tls-ca " + pki().path("garbage.pem") + " info");
  EXPECT_EQ(bad_ca.code, 2) << bad_ca.output;
  EXPECT_NE(bad_ca.output.find("--tls-ca " + pki().path("garbage.pem")), std::string::npos)
      << bad_ca.output;
}

}  // namespace
}  // namespace siphon::agent
