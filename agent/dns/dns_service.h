// dns: names resolved as the target would resolve them (its resolv.conf and
// hosts file, sockets in its network namespace). See resolver.h.
#pragma once

#include <memory>

#include "agent/services/service.h"

namespace siphon::agent {

// The resolver thread starts here; its sockets are made by ctx.netns and
// its files are read under ctx.target.rootFd().
std::shared_ptr<RequestService> makeDnsService(ServiceContext& ctx);

}  // namespace siphon::agent
