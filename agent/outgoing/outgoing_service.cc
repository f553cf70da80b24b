#include "agent/outgoing/outgoing_service.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/netns/netns_worker.h"
#include "agent/outgoing/address.h"
#include "agent/streams/socket_pump.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::outgoing {
namespace {

namespace asio = net::asio;
using streams::SocketPump;
using Clock = std::chrono::steady_clock;

// "10.0.0.1:80", "[::1]:80", "db.svc:5432".
std::string hostPort(const std::string& host, uint32_t port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

// getaddrinfo, for the NetnsWorker thread (see outgoing_service.h).
absl::StatusOr<std::vector<SockAddr>> resolveName(const std::string& name, uint16_t port,
                                                  int socktype) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(name.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    std::string message = absl::StrCat("resolve ", name, ": ",
                                       rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc));
    switch (rc) {
      case EAI_NONAME:
#ifdef EAI_NODATA
      case EAI_NODATA:
#endif
        return protoError(v1::NOT_FOUND, message);
      case EAI_AGAIN:
        return protoError(v1::UNAVAILABLE, message);
      default:
        return protoError(v1::INTERNAL, message);
    }
  }
  std::vector<SockAddr> out;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    SockAddr a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    bool seen = false;
    for (const auto& b : out)
      seen = seen || (b.len == a.len && std::memcmp(&b.storage, &a.storage, a.len) == 0);
    if (!seen) out.push_back(a);
  }
  freeaddrinfo(res);
  if (out.empty()) return protoError(v1::NOT_FOUND, absl::StrCat("resolve ", name, ": no address"));
  return out;
}

// One connect, from StreamOpen to Accept (or Reset). Owned by its coroutine.
class Connect {
 public:
  Connect(ServiceContext& ctx, OutgoingOptions options, HostRef host,
          std::shared_ptr<SocketPump> pump, v1::OutgoingConnect request)
      : ctx_(ctx),
        options_(options),
        host_(std::move(host)),
        pump_(std::move(pump)),
        req_(std::move(request)),
        deadline_(Clock::now() + options.connect_timeout) {}

  static net::awaitable<void> run(std::unique_ptr<Connect> connect) {
    // GCC 12 drops by-value coroutine parameters the body never names.
    const std::unique_ptr<Connect> self = std::move(connect);
    try {
      switch (self->req_.protocol()) {
        case v1::OutgoingConnect::TCP:
          co_await self->connectIp(SOCK_STREAM);
          break;
        case v1::OutgoingConnect::UDP:
          if (self->req_.host().empty()) {
            co_await self->bindUdp();
          } else {
            co_await self->connectIp(SOCK_DGRAM);
          }
          break;
        case v1::OutgoingConnect::UNIX_STREAM:
          co_await self->connectUnix(SOCK_STREAM);
          break;
        case v1::OutgoingConnect::UNIX_SEQPACKET:
          co_await self->connectUnix(SOCK_SEQPACKET);
          break;
        default:
          self->pump_->reset(wireError(v1::INTERNAL, "unexpected protocol"));
      }
    } catch (const std::exception& e) {
      self->pump_->reset(wireError(v1::INTERNAL, absl::StrCat("outgoing connect: ", e.what())));
    }
  }

 private:
  // The target's DNS answers on its own thread; the answer hops back to the
  // event loop before this coroutine resumes.
  net::awaitable<absl::StatusOr<std::vector<SockAddr>>> resolveWithTargetDns(
      const std::string& name, uint16_t port) {
    struct State {
      explicit State(net::asio::any_io_executor ex) : signal(ex) {}
      net::Signal signal;
      std::optional<absl::StatusOr<v1::DnsResponse>> result;
    };
    auto ex = co_await net::asio::this_coro::executor;
    auto state = std::make_shared<State>(ex);
    v1::DnsRequest request;
    request.mutable_lookup()->set_name(name);
    ctx_.resolve_name(std::move(request), [state, ex](absl::StatusOr<v1::DnsResponse> result) {
      net::asio::post(ex, [state, result = std::move(result)]() mutable {
        state->result = std::move(result);
        state->signal.notify();
      });
    });
    while (!state->result) co_await state->signal.wait();
    if (!state->result->ok()) co_return state->result->status();
    const v1::DnsResponse& answer = **state->result;
    if (answer.status() != v1::DNS_OK) {
      v1::ErrorCode code = answer.status() == v1::DNS_NXDOMAIN || answer.status() == v1::DNS_NODATA
                               ? v1::NOT_FOUND
                           : answer.status() == v1::DNS_TIMEOUT ? v1::TIMEOUT
                                                                : v1::UNAVAILABLE;
      co_return protoError(code, absl::StrCat("resolve ", name, " with the target's DNS: ",
                                              v1::DnsStatus_Name(answer.status())));
    }
    std::vector<SockAddr> out;
    for (const std::string& a : answer.addresses()) {
      if (auto addr = ipAddress(a, port)) out.push_back(*addr);
    }
    if (out.empty()) {
      co_return protoError(v1::NOT_FOUND, absl::StrCat("resolve ", name, ": no address"));
    }
    co_return out;
  }

  net::awaitable<void> connectIp(int type) {
    const auto port = static_cast<uint16_t>(req_.port());
    std::vector<SockAddr> addrs;
    if (auto literal = ipAddress(req_.host(), port)) {
      addrs.push_back(*literal);
    } else {
      absl::StatusOr<std::vector<SockAddr>> resolved;
      if (ctx_.resolve_name) {
        // As the target resolves it: its resolv.conf and hosts, from its netns.
        resolved = co_await resolveWithTargetDns(req_.host(), port);
      } else {
        // No DNS service: getaddrinfo on the NetnsWorker (the agent's own
        // resolver configuration, queries from the target's netns). A named
        // function object, not a temporary in the co_await expression: GCC 12
        // destroys such temporaries twice.
        std::function<absl::StatusOr<std::vector<SockAddr>>()> resolve =
            [name = req_.host(), port, type] { return resolveName(name, port, type); };
        resolved = co_await ctx_.netns.runAsync(std::move(resolve));
      }
      if (pump_->dead()) co_return;
      if (!resolved.ok()) {
        v1::Error e = toProtoError(resolved.status());
        e.set_message(absl::StrCat("connect ", hostPort(req_.host(), port),
                                   " from the target: ", resolved.status().message()));
        pump_->reset(std::move(e));
        co_return;
      }
      addrs = *std::move(resolved);
    }
    v1::Error last;
    for (const SockAddr& addr : addrs) {
      // A name's addresses share the deadline, tried in order.
      std::string what = ipAddress(req_.host(), port)
                             ? absl::StrCat("connect ", formatAddress(addr), " from the target")
                             : absl::StrCat("connect ", hostPort(req_.host(), port), " (",
                                            formatAddress(addr), ") from the target");
      if (co_await connectSocket(addr, type, what, &last)) {
        auto local = localAddress(pump_->fd());
        auto remote = peerAddress(pump_->fd());
        accepted(local.ok() ? &*local : nullptr, remote.ok() ? &*remote : &addr);
        co_return;
      }
      if (pump_->dead() || Clock::now() >= deadline_) break;
    }
    pump_->reset(std::move(last));
  }

  net::awaitable<void> bindUdp() {
    const auto port = static_cast<uint16_t>(req_.port());
    v1::Error last;
    // IPv6 dual-stack first: one socket then reaches IPv4 and IPv6 peers.
    for (int family : {AF_INET6, AF_INET}) {
      auto fd = co_await ctx_.netns.socket(family, SOCK_DGRAM, 0);
      if (pump_->dead()) co_return;
      std::string what = absl::StrCat("bind UDP port ", port, " in the target");
      if (!fd.ok()) {
        last = socketError(errnoOf(fd.status()), what);
        continue;
      }
      if (family == AF_INET6) {
        int off = 0;
        ::setsockopt(fd->get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
      }
      SockAddr any = *ipAddress(family == AF_INET6 ? "::" : "0.0.0.0", port);
      if (::bind(fd->get(), any.get(), any.len) != 0) {
        const int err = errno;
        last = socketError(err, what);
        // No IPv6 in the target: try IPv4. A port in use is in use for both.
        if (family == AF_INET6 && err != EADDRINUSE && err != EACCES) continue;
        break;
      }
      absl::Status st = pump_->attach(*std::move(fd));
      if (!st.ok()) co_return;  // the stream ended meanwhile
      auto local = localAddress(pump_->fd());
      accepted(local.ok() ? &*local : nullptr, nullptr);
      co_return;
    }
    pump_->reset(std::move(last));
  }

  net::awaitable<void> connectUnix(int type) {
    const std::string& path = req_.unix_path();
    const std::string what = absl::StrCat("connect unix ", path, " from the target");
    SockAddr addr;
    UniqueFd path_fd;  // held until connect() returns: the address names it
    if (path.starts_with('@')) {
      auto a = abstractUnixAddress(path);
      if (!a.ok()) {
        pump_->reset(
            wireError(v1::INVALID_ARGUMENT, absl::StrCat(what, ": ", a.status().message())));
        co_return;
      }
      addr = *a;
    } else {
      auto fd = co_await openInRootAsync(path);
      if (pump_->dead()) co_return;
      if (!fd.ok()) {
        int err = errnoOf(fd.status());
        pump_->reset(err != 0 ? socketError(err, what)
                              : wireError(errorCodeOf(fd.status()),
                                          absl::StrCat(what, ": ", fd.status().message())));
        co_return;
      }
      struct stat st {};
      if (::fstat(fd->get(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
        pump_->reset(wireError(v1::INVALID_ARGUMENT, absl::StrCat(what, ": not a socket")));
        co_return;
      }
      path_fd = *std::move(fd);
      addr = procFdUnixAddress(path_fd.get());
    }
    v1::Error error;
    if (co_await connectSocket(addr, type, what, &error)) {
      accepted(nullptr, nullptr);
      co_return;
    }
    pump_->reset(std::move(error));
  }

  // A socket of `addr`'s family in the target's netns, attached to the pump
  // and connected. false with *error set (or the pump dead) otherwise.
  net::awaitable<bool> connectSocket(const SockAddr& addr, int type, const std::string& what,
                                     v1::Error* error) {
    auto fd = co_await ctx_.netns.socket(addr.family(), type, 0);
    if (pump_->dead()) co_return false;
    if (!fd.ok()) {
      *error = socketError(errnoOf(fd.status()), what);
      co_return false;
    }
    if (type == SOCK_STREAM && addr.family() != AF_UNIX) {
      // The session's frames already batch; Nagle would only hold a small
      // request back waiting for an ACK.
      int one = 1;
      ::setsockopt(fd->get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    if (!pump_->attach(*std::move(fd)).ok()) co_return false;
    int err = 0;
    if (::connect(pump_->fd(), addr.get(), addr.len) != 0) err = errno;
    if (err == EINPROGRESS || err == EINTR) {
      absl::Status w = co_await pump_->waitWritable(deadline_);
      if (pump_->dead()) co_return false;
      if (absl::IsDeadlineExceeded(w)) {
        v1::Error e = socketError(ETIMEDOUT, what);
        e.set_code(v1::TIMEOUT);
        e.set_message(
            absl::StrCat(what, ": no answer within ", options_.connect_timeout.count(), " ms"));
        *error = std::move(e);
        co_return false;
      }
      err = 0;
      socklen_t len = sizeof(err);
      if (!w.ok()) {
        err = errnoOf(w) != 0 ? errnoOf(w) : EIO;
      } else if (::getsockopt(pump_->fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
    }
    if (err != 0) {
      *error = socketError(err, what);
      co_return false;
    }
    co_return true;
  }

  // openInRoot() on the blocking pool: a path walk may block (FUSE, NFS).
  net::awaitable<absl::StatusOr<UniqueFd>> openInRootAsync(const std::string& path) {
    struct State {
      explicit State(asio::any_io_executor ex) : signal(std::move(ex)) {}
      net::Signal signal;
      std::optional<absl::StatusOr<UniqueFd>> result;
    };
    auto state = std::make_shared<State>(ctx_.io.get_executor());
    asio::post(ctx_.blocking, [state, root = ctx_.target.rootFd(), path, &io = ctx_.io] {
      auto fd = std::make_shared<absl::StatusOr<UniqueFd>>(openInRoot(root, path));
      asio::post(io, [state, fd] {
        state->result = std::move(*fd);
        state->signal.notify();
      });
    });
    while (!state->result) co_await state->signal.wait();
    co_return std::move(*state->result);
  }

  void accepted(const SockAddr* local, const SockAddr* remote) {
    protocol::Session* s = host_.session();
    if (s == nullptr || pump_->dead()) {
      pump_->close();
      return;
    }
    v1::StreamAccept accept;
    accept.set_stream_id(pump_->streamId());
    if (local != nullptr) *accept.mutable_local() = toProto(*local);
    if (remote != nullptr) *accept.mutable_remote() = toProto(*remote);
    if (!s->acceptStream(std::move(accept)).ok()) {
      // The client reset it meanwhile.
      host_.release(pump_->streamId());
      pump_->close();
      return;
    }
    host_.wake();
    log::debug("outgoing_connected",
               {{"stream", pump_->streamId()},
                {"to", remote != nullptr ? formatAddress(*remote) : req_.unix_path()}});
    pump_->start();
  }

  ServiceContext& ctx_;
  OutgoingOptions options_;
  HostRef host_;
  std::shared_ptr<SocketPump> pump_;
  v1::OutgoingConnect req_;
  Clock::time_point deadline_;
};

// What is wrong with the request, or nullopt.
std::optional<std::string> invalid(const v1::OutgoingConnect& o) {
  switch (o.protocol()) {
    case v1::OutgoingConnect::TCP:
    case v1::OutgoingConnect::UDP: {
      const char* name = o.protocol() == v1::OutgoingConnect::TCP ? "TCP" : "UDP";
      if (o.host().empty()) {
        if (o.protocol() == v1::OutgoingConnect::TCP) return "outgoing TCP: no host given";
        if (o.port() > 65535)
          return absl::StrCat("outgoing UDP: port ", o.port(), " is out of range");
        return std::nullopt;  // unconnected UDP
      }
      if (o.port() == 0 || o.port() > 65535) {
        return absl::StrCat("outgoing ", name, ": port ", o.port(), " is out of range (1-65535)");
      }
      return std::nullopt;
    }
    case v1::OutgoingConnect::UNIX_STREAM:
    case v1::OutgoingConnect::UNIX_SEQPACKET:
      if (o.unix_path().empty()) return "outgoing unix: no unix_path given";
      return std::nullopt;
    default:
      return "outgoing: protocol is not set (TCP, UDP, UNIX_STREAM or UNIX_SEQPACKET)";
  }
}

class OutgoingService : public StreamService {
 public:
  OutgoingService(ServiceContext& ctx, OutgoingOptions options) : ctx_(ctx), options_(options) {}

  void open(std::shared_ptr<SessionHost> session, v1::StreamOpen open) override {
    const uint64_t id = open.stream_id();
    v1::OutgoingConnect req = std::move(*open.mutable_outgoing());
    if (auto why = invalid(req)) {
      session->resetStream(id, wireError(v1::INVALID_ARGUMENT, *why));
      session->wake();
      return;
    }
    SocketPump::Options po;
    po.peer_window = open.initial_window();
    switch (req.protocol()) {
      case v1::OutgoingConnect::TCP:
        po.kind = SocketPump::Kind::kStream;
        po.tcp = true;
        po.label = hostPort(req.host(), req.port());
        break;
      case v1::OutgoingConnect::UDP:
        po.kind = req.host().empty() ? SocketPump::Kind::kDatagram : SocketPump::Kind::kMessage;
        po.udp = true;
        po.label = req.host().empty() ? absl::StrCat("UDP port ", req.port())
                                      : hostPort(req.host(), req.port());
        break;
      case v1::OutgoingConnect::UNIX_STREAM:
        po.kind = SocketPump::Kind::kStream;
        po.label = req.unix_path();
        break;
      default:  // UNIX_SEQPACKET (invalid() let nothing else through)
        po.kind = SocketPump::Kind::kMessage;
        po.label = req.unix_path();
        break;
    }
    HostRef host(session);
    auto pump = std::make_shared<SocketPump>(ctx_.io.get_executor(), id, session, std::move(po));
    // Registered before the connect finishes, so a Reset or the session's
    // end during the connect closes the socket at once.
    session->registerStream(id, pump);
    log::debug("outgoing_open", {{"session", session->id()},
                                 {"stream", id},
                                 {"protocol", v1::OutgoingConnect::Protocol_Name(req.protocol())},
                                 {"to", req.unix_path().empty() ? hostPort(req.host(), req.port())
                                                                : req.unix_path()}});
    // A failure resets this stream only.
    std::weak_ptr<SocketPump> weak = pump;
    ++*connecting_;
    std::shared_ptr<void> counted(nullptr, [n = connecting_](void*) { --*n; });
    net::spawn(ctx_.io,
               counting(Connect::run(std::make_unique<Connect>(ctx_, options_, std::move(host),
                                                               std::move(pump), std::move(req))),
                        std::move(counted)),
               "outgoing_connect", [weak] {
                 if (auto p = weak.lock()) {
                   p->reset(wireError(v1::INTERNAL, "outgoing connect failed"));
                 }
               });
  }

  // A connect under way is a coroutine of this process: a handover waits
  // for it to end (it is bounded by the connect timeout).
  std::string handoverBlocker() const override {
    if (*connecting_ == 0) return "";
    return absl::StrCat(*connecting_, " outgoing connects under way");
  }

 private:
  static net::awaitable<void> counting(net::awaitable<void> work, std::shared_ptr<void> counted) {
    const auto held = std::move(counted);
    co_await std::move(work);
  }

  ServiceContext& ctx_;
  OutgoingOptions options_;
  std::shared_ptr<size_t> connecting_ = std::make_shared<size_t>(0);
};

}  // namespace

std::shared_ptr<StreamService> makeOutgoingService(ServiceContext& ctx, OutgoingOptions options) {
  return std::make_shared<OutgoingService>(ctx, options);
}

void registerOutgoing(ServiceRegistry& registry, ServiceContext& ctx) {
  registry.addStream(v1::StreamOpen::kOutgoing, makeOutgoingService(ctx));
  registry.addFeature(v1::FEATURE_OUTGOING_TCP);
  registry.addFeature(v1::FEATURE_OUTGOING_UDP);
  registry.addFeature(v1::FEATURE_OUTGOING_UNIX);
}

}  // namespace siphon::agent::outgoing
