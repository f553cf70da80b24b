// env: the target's environment (/proc/PID/environ), include/exclude globs.
#pragma once

#include <memory>

#include "agent/services/service.h"

namespace siphon::agent {

std::shared_ptr<RequestService> makeEnvService(ServiceContext& ctx);

}  // namespace siphon::agent
