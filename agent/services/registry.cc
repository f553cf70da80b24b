// Every service the agent offers, in one place. Each area adds its own lines.
#include "agent/services/env_service.h"
#include "agent/services/service.h"

namespace siphon::agent {

std::unique_ptr<ServiceRegistry> buildServices(ServiceContext& ctx) {
  auto r = std::make_unique<ServiceRegistry>();
  r->addFeature(v1::FEATURE_INFO);  // served by the Server itself
  r->addFeature(v1::FEATURE_RESUME);

  r->addRequest(v1::Request::kEnv, makeEnvService(ctx));
  r->addFeature(v1::FEATURE_ENV);

  return r;
}

}  // namespace siphon::agent
