// Every service the agent offers, in one place. Each area adds its own lines.
#include "agent/capture/capture_service.h"
#include "agent/dns/dns_service.h"
#include "agent/files/file_service.h"
#include "agent/mirror/mirror_service.h"
#include "agent/outgoing/outgoing_service.h"
#include "agent/services/env_service.h"
#include "agent/services/service.h"
#include "agent/steal/steal_service.h"

namespace siphon::agent {

std::unique_ptr<ServiceRegistry> buildServices(ServiceContext& ctx) {
  auto r = std::make_unique<ServiceRegistry>();
  r->addFeature(v1::FEATURE_INFO);  // served by the Server itself
  r->addFeature(v1::FEATURE_RESUME);

  r->addRequest(v1::Request::kEnv, makeEnvService(ctx));
  r->addFeature(v1::FEATURE_ENV);

  // Registered even with --fs-mode off, to answer PERMISSION_DENIED.
  r->addRequest(v1::Request::kFile, makeFileService(ctx));
  if (ctx.config.fs_mode != FsMode::kOff) {
    r->addFeature(v1::FEATURE_FILES);
    r->addFeature(v1::FEATURE_FILE_WATCH);
  }

  r->addRequest(v1::Request::kDns, makeDnsService(ctx));
  r->addFeature(v1::FEATURE_DNS);

  outgoing::registerOutgoing(*r, ctx);  // TCP, UDP, unix streams from the target

  steal::registerSteal(*r, ctx);  // incoming TCP of subscribed ports, as streams

  capture::registerCapture(*r, ctx);  // pcap of the target's packets, as streams

  mirror::registerMirror(*r, ctx);  // copies of the TCP connections of subscribed ports

  r->routeUnsubscribe();  // to the steal or mirror subscription it names

  return r;
}

}  // namespace siphon::agent
