#include "agent/dns/dns_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/dns/dns_config.h"
#include "agent/dns/resolver.h"
#include "agent/netns/netns_worker.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

// "lookup example.com" / "reverse 10.0.0.1", for logs.
std::string describe(const v1::DnsRequest& r) {
  switch (r.query_case()) {
    case v1::DnsRequest::kLookup:
      return absl::StrCat("lookup ", r.lookup().name());
    case v1::DnsRequest::kReverse:
      return absl::StrCat("reverse ", r.reverse().address());
    default:
      return "(no query)";
  }
}

class DnsService : public RequestService {
 public:
  DnsService(ServiceContext& ctx, absl::StatusOr<std::unique_ptr<dns::Resolver>> resolver)
      : ctx_(ctx), resolver_(std::move(resolver)) {}

  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    const uint64_t id = request.request_id();
    if (!resolver_.ok()) {
      reply(session, id, "", resolver_.status());
      return;
    }
    std::string what = describe(request.dns());
    // The resolver answers on its own thread; the session is only touched
    // back on the event loop.
    (*resolver_)
        ->resolve(std::move(*request.mutable_dns()),
                  [io = &ctx_.io, session, id,
                   what = std::move(what)](absl::StatusOr<v1::DnsResponse> result) mutable {
                    net::asio::post(*io, [session = std::move(session), id, what = std::move(what),
                                          result = std::move(result)]() mutable {
                      reply(session, id, what, std::move(result));
                    });
                  });
  }

 private:
  static void reply(const std::shared_ptr<SessionHost>& session, uint64_t id,
                    const std::string& what, absl::StatusOr<v1::DnsResponse> result) {
    v1::Response r;
    r.set_request_id(id);
    if (result.ok()) {
      *r.mutable_dns() = *std::move(result);
    } else {
      if (errorCodeOf(result.status()) != v1::INVALID_ARGUMENT) {
        log::warn("dns_failed", {{"session", session->id()},
                                 {"query", what},
                                 {"error", sv(result.status().message())}});
      }
      *r.mutable_error() = toProtoError(result.status());
    }
    session->respond(std::move(r));
  }

  ServiceContext& ctx_;
  absl::StatusOr<std::unique_ptr<dns::Resolver>> resolver_;
};

}  // namespace

std::shared_ptr<RequestService> makeDnsService(ServiceContext& ctx) {
  // Sockets come from the NetnsWorker, so they live in the target's network
  // namespace. socketSync blocks, which is fine here: it is called on the
  // resolver's thread, never on the event loop.
  NetnsRunner& netns = ctx.netns;
  auto resolver = dns::Resolver::start(dns::makeRootConfigSource(ctx.target.rootFd()),
                                       [&netns](int domain, int type, int protocol) {
                                         return netns.socketSync(domain, type, protocol);
                                       });
  if (resolver.ok()) {
    // Other services (outgoing connections to a host name) resolve through
    // the same resolver. It lives as long as this service, which the server
    // destroys before the context.
    dns::Resolver* raw = resolver->get();
    ctx.resolve_name = [raw](v1::DnsRequest request,
                             std::function<void(absl::StatusOr<v1::DnsResponse>)> done) {
      raw->resolve(std::move(request), std::move(done));
    };
  }
  if (!resolver.ok()) {
    log::error("dns_unavailable", {{"error", sv(resolver.status().message())}});
    resolver = absl::UnavailableError(
        absl::StrCat("the agent's DNS resolver did not start: ", resolver.status().message()));
  }
  return std::make_shared<DnsService>(ctx, std::move(resolver));
}

}  // namespace siphon::agent
