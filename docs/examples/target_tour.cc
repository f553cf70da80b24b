// A tour of a target through the typed client API: read one of its files,
// resolve a name as it does, and talk to a server through a connection it
// makes. Only the public typed headers, no protobuf.
//
//   target_tour AGENT_HOST:PORT [FILE [NAME [HOST:PORT]]]
//   (the token in SIPHON_TOKEN; defaults: /etc/hostname, kubernetes.default,
//   no connection)
//
// Built with the tree (docs/examples/CMakeLists.txt); link siphon_client.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "siphon/client/connections.h"
#include "siphon/client/dns.h"
#include "siphon/client/errors.h"
#include "siphon/client/files.h"
#include "siphon/client/target.h"

// The typed headers are the surface for programs: no protobuf in them.
#ifdef GOOGLE_PROTOBUF_VERSION
#error "a public typed client header includes protobuf"
#endif

namespace client = siphon::client;
namespace net = siphon::net;

namespace {

struct Args {
  std::string agent;
  std::string file = "/etc/hostname";
  std::string name = "kubernetes.default";
  std::string peer;  // HOST:PORT, optional
};

void fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s (%s)\n", what, std::string(s.message()).c_str(),
               client::errorName(client::errorCode(s)).c_str());
}

// GCC 12: a coroutine takes its arguments by value.
net::awaitable<int> tour(client::Target target, Args args) {
  client::Target session = std::move(target);  // copies share one session
  const Args a = std::move(args);
  session.setEventHandler([](const client::LinkEvent& e) {
    if (e.kind == client::LinkEvent::Kind::kMoved) {
      std::fprintf(stderr, "moved from %s to %s: %s\n", e.from.c_str(), e.to.c_str(),
                   e.reason.c_str());
    }
  });
  if (absl::Status s = co_await session.connect(); !s.ok()) {
    fail("connect", s);
    co_return 2;
  }
  int rc = 0;

  // 1. A file of the target, under its root.
  client::Files files(session);
  auto contents = co_await files.readFile(a.file);
  if (contents.ok()) {
    std::printf("%s: %zu bytes\n%s\n", a.file.c_str(), contents->size(), contents->c_str());
  } else {
    fail(a.file.c_str(), contents.status());  // errnoValue() has the errno
    rc = 1;
  }

  // 2. A name, as the target's resolver sees it.
  client::Dns dns(session);
  auto answer = co_await dns.lookup(a.name);
  if (!answer.ok()) {
    fail("dns", answer.status());
    rc = 1;
  } else if (!answer->ok()) {
    std::printf("%s: %s\n", a.name.c_str(), client::dnsResultName(answer->result).c_str());
  } else {
    for (const auto& ip : answer->addresses) std::printf("%s: %s\n", a.name.c_str(), ip.c_str());
  }

  // 3. A connection made from inside the target: one request, the answer.
  if (!a.peer.empty()) {
    const size_t colon = a.peer.rfind(':');
    const std::string host = a.peer.substr(0, colon);
    const auto port = static_cast<uint16_t>(std::atoi(a.peer.c_str() + colon + 1));
    client::Connections connections(session);
    auto conn = co_await connections.connectTcp(host, port);
    if (!conn.ok()) {
      fail("connect", conn.status());
      rc = 1;
    } else {
      std::printf("connected %s -> %s\n", conn->local().text().c_str(),
                  conn->remote().text().c_str());
      absl::Status w = co_await conn->write("HEAD / HTTP/1.0\r\nHost: " + host + "\r\n\r\n");
      if (w.ok()) w = conn->halfClose();  // FIN; the answer still comes
      while (w.ok()) {
        auto chunk = co_await conn->read();
        if (!chunk.ok()) w = chunk.status();
        if (!chunk.ok() || !chunk->has_value()) break;
        std::fwrite((*chunk)->data(), 1, (*chunk)->size(), stdout);
      }
      if (!w.ok()) {
        fail("connection", w);
        rc = 1;
      }
    }
  }
  session.close();
  co_return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s AGENT_HOST:PORT [FILE [NAME [HOST:PORT]]]\n", argv[0]);
    return 2;
  }
  Args args;
  args.agent = argv[1];
  if (argc > 2) args.file = argv[2];
  if (argc > 3) args.name = argv[3];
  if (argc > 4) args.peer = argv[4];
  client::TargetOptions options;
  options.endpoints = {args.agent};
  if (const char* token = std::getenv("SIPHON_TOKEN")) options.token = token;
  options.client_name = "target-tour";

  net::asio::io_context io;
  int rc = 0;
  net::asio::co_spawn(io, tour(client::Target::create(io.get_executor(), options), args),
                      [&rc](std::exception_ptr e, int r) { rc = e ? 3 : r; });
  io.run();
  return rc;
}
