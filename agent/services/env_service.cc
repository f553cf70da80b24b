#include "agent/services/env_service.h"

#include "agent/common/log.h"
#include "agent/target/environ.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

class EnvService : public RequestService {
 public:
  explicit EnvService(ServiceContext& ctx) : ctx_(ctx) {}

  void handle(std::shared_ptr<SessionHost> session, v1::Request request) override {
    // /proc reads block: never on the event loop.
    net::asio::post(ctx_.blocking, [this, session, request = std::move(request)]() mutable {
      // The runtime's env was resolved when the target's process was
      // entered (agent/runtime/: at start-up, and again when a restarted
      // container was adopted); the process's is read now.
      auto env = envFor(ctx_.procfs, ctx_.target.pid(), request.env(), ctx_.target.runtimeEnv());
      net::asio::post(
          ctx_.io, [session, id = request.request_id(), env = std::move(env)]() mutable {
            v1::Response r;
            r.set_request_id(id);
            if (env.ok()) {
              *r.mutable_env() = std::move(*env);
            } else {
              log::warn("env_failed",
                        {{"session", session->id()}, {"error", sv(env.status().message())}});
              *r.mutable_error() = toProtoError(env.status());
            }
            session->respond(std::move(r));
          });
    });
  }

 private:
  ServiceContext& ctx_;
};

}  // namespace

std::shared_ptr<RequestService> makeEnvService(ServiceContext& ctx) {
  return std::make_shared<EnvService>(ctx);
}

}  // namespace siphon::agent
