// The env service against a fake session host: /proc/PID/environ from a
// fake /proc, the filters, the error path. No server, no client.
#include "agent/services/env_service.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>

#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"

namespace siphon::agent {
namespace {

using fakes::FakeSessionHost;
using fakes::ServiceHarness;

v1::Request envReq(uint64_t id, std::vector<std::string> include = {},
                   std::vector<std::string> exclude = {}) {
  v1::Request r;
  r.set_request_id(id);
  for (auto& i : include) r.mutable_env()->add_include(i);
  for (auto& e : exclude) r.mutable_env()->add_exclude(e);
  return r;
}

std::string names(const v1::EnvResponse& env) {
  std::string out;
  for (const auto& v : env.vars()) out += v.name() + "=" + v.value() + ";";
  return out;
}

class EnvServiceTest : public ::testing::Test {
 protected:
  v1::Response call(v1::Request request) {
    const uint64_t id = request.request_id();
    EXPECT_FALSE(host_->response(id).has_value()) << "request ids are unique per host";
    service_->handle(host_, std::move(request));
    EXPECT_TRUE(harness_.runUntil([&] { return host_->response(id).has_value(); }));
    auto r = host_->response(id);
    return r ? *r : v1::Response{};
  }

  ServiceHarness harness_{AgentConfig{}, "",
                          std::string("PATH=/bin\0HOME=/root\0APP_MODE=debug\0", 36)};
  std::shared_ptr<RequestService> service_ = makeEnvService(harness_.ctx());
  std::shared_ptr<FakeSessionHost> host_ = std::make_shared<FakeSessionHost>();
};

TEST_F(EnvServiceTest, AnswersTheTargetsEnvironmentSortedByName) {
  v1::Response r = call(envReq(7));
  ASSERT_TRUE(r.has_env()) << r.DebugString();
  EXPECT_EQ(names(r.env()), "APP_MODE=debug;HOME=/root;PATH=/bin;");
  EXPECT_EQ(host_->responses.size(), 1u);
}

TEST_F(EnvServiceTest, FiltersIncludeThenExclude) {
  v1::Response r = call(envReq(1, {"*A*"}, {"PATH"}));
  ASSERT_TRUE(r.has_env()) << r.DebugString();
  EXPECT_EQ(names(r.env()), "APP_MODE=debug;");
}

TEST_F(EnvServiceTest, AnUnreadableEnvironIsATypedError) {
  harness_.process().environ_errno = EACCES;
  v1::Response r = call(envReq(3));
  ASSERT_TRUE(r.has_error()) << r.DebugString();
  // The kernel's errno reaches the client as is.
  EXPECT_EQ(r.error().code(), v1::ERRNO) << r.error().message();
  EXPECT_EQ(r.error().errno_value(), EACCES);
  EXPECT_NE(r.error().message().find("environ"), std::string::npos) << r.error().message();
}

TEST_F(EnvServiceTest, AnEndedSessionGetsNothingSent) {
  host_->end();
  call(envReq(4));  // recorded by the fake, never queued on the session
  EXPECT_FALSE(host_->session().hasWrites());
}

}  // namespace
}  // namespace siphon::agent
