// The DNS service against a fake session host: the target's hosts file
// (through its root) answers, the answer comes back on the event loop, bad
// requests get typed errors, and other services resolve through the same
// resolver (ServiceContext::resolve_name). No server, no client, no
// network: every name here is in the hosts file.
#include "agent/dns/dns_service.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "siphon/status.h"
#include "tests/fakes/agent/fake_session_host.h"
#include "tests/fakes/agent/service_harness.h"

namespace siphon::agent {
namespace {

using fakes::FakeSessionHost;
using fakes::ServiceHarness;

// A target root with etc/hosts and etc/resolv.conf.
class TargetRoot {
 public:
  TargetRoot() {
    std::string tmpl = "/tmp/siphon-dns-service-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/etc");
    std::ofstream(dir_ + "/etc/hosts") << "10.1.2.3 db.internal db\n"
                                          "fd00::7 v6only.internal\n";
    // Nothing answers there; no test asks a name the hosts file lacks.
    std::ofstream(dir_ + "/etc/resolv.conf") << "nameserver 127.0.0.1\n"
                                                "options timeout:1 attempts:1\n";
  }
  ~TargetRoot() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

v1::Request lookup(uint64_t id, const std::string& name) {
  v1::Request r;
  r.set_request_id(id);
  r.mutable_dns()->mutable_lookup()->set_name(name);
  return r;
}

class DnsServiceTest : public ::testing::Test {
 protected:
  v1::Response call(v1::Request request) {
    const uint64_t id = request.request_id();
    EXPECT_FALSE(host_->response(id).has_value()) << "request ids are unique per host";
    service_->handle(host_, std::move(request));
    EXPECT_TRUE(harness_.runUntil([&] { return host_->response(id).has_value(); }));
    auto r = host_->response(id);
    return r ? *r : v1::Response{};
  }

  TargetRoot root_;
  ServiceHarness harness_{AgentConfig{}, root_.path()};
  std::shared_ptr<RequestService> service_ = makeDnsService(harness_.ctx());
  std::shared_ptr<FakeSessionHost> host_ = std::make_shared<FakeSessionHost>();
};

TEST_F(DnsServiceTest, ALookupIsAnsweredFromTheTargetsHostsFile) {
  v1::Response r = call(lookup(5, "db.internal"));
  ASSERT_TRUE(r.has_dns()) << r.DebugString();
  EXPECT_EQ(r.dns().status(), v1::DNS_OK);
  ASSERT_EQ(r.dns().addresses_size(), 1) << r.DebugString();
  EXPECT_EQ(r.dns().addresses(0), "10.1.2.3");
  EXPECT_EQ(host_->responses.size(), 1u);
}

TEST_F(DnsServiceTest, ARequestWithoutAQueryIsInvalid) {
  v1::Request r;
  r.set_request_id(9);
  r.mutable_dns();
  v1::Response answer = call(std::move(r));
  ASSERT_TRUE(answer.has_error()) << answer.DebugString();
  EXPECT_EQ(answer.error().code(), v1::INVALID_ARGUMENT);
}

TEST_F(DnsServiceTest, OtherServicesResolveThroughTheSameResolver) {
  ASSERT_TRUE(harness_.ctx().resolve_name) << "set by the DNS service when it starts";
  std::optional<absl::StatusOr<v1::DnsResponse>> got;
  v1::DnsRequest q;
  q.mutable_lookup()->set_name("v6only.internal");
  harness_.ctx().resolve_name(std::move(q), [&](absl::StatusOr<v1::DnsResponse> r) {
    // On the resolver's thread: hop to the loop, as services do.
    net::asio::post(harness_.io(), [&, r = std::move(r)]() mutable { got = std::move(r); });
  });
  ASSERT_TRUE(harness_.runUntil([&] { return got.has_value(); }));
  ASSERT_TRUE(got->ok()) << got->status();
  ASSERT_EQ((*got)->addresses_size(), 1);
  EXPECT_EQ((*got)->addresses(0), "fd00::7");
  EXPECT_TRUE(host_->responses.empty()) << "no session was answered";
}

}  // namespace
}  // namespace siphon::agent
