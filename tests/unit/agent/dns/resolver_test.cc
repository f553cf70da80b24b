// The Resolver against fake DNS servers on 127.0.0.1 (no root): the search
// list, families, typed failures, server failover, hosts first, config
// changes, limits and shutdown.
#include "agent/dns/resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/fakes/fake_dns_server.h"

namespace siphon::agent::dns {
namespace {

using ::siphon::fakes::FakeDnsServer;
using ::siphon::fakes::FakeZone;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Only turns a hang into a failure.
constexpr auto kDeadline = std::chrono::seconds(30);

// A configuration the test changes at will (the resolver reads it on its
// own thread before each request).
class TestConfig : public DnsConfigSource {
 public:
  void set(ResolvConf conf, std::string hosts = "") {
    std::lock_guard<std::mutex> lock(mu_);
    config_.resolv = std::make_shared<const ResolvConf>(std::move(conf));
    config_.hosts = std::make_shared<const HostsFile>(HostsFile::parse(hosts));
  }
  DnsConfig load() override {
    std::lock_guard<std::mutex> lock(mu_);
    return config_;
  }

 private:
  std::mutex mu_;
  DnsConfig config_;
};

ResolvConf confFor(std::vector<uint16_t> ports, std::vector<std::string> search = {},
                   int ndots = 1) {
  ResolvConf c;
  for (uint16_t p : ports) c.nameservers.push_back({AF_INET, "127.0.0.1", p});
  c.search = std::move(search);
  c.ndots = ndots;
  c.timeout_ms = 200;  // only the silent names wait for it
  c.attempts = 1;
  return c;
}

// A UDP port where nothing listens (bound, then closed).
uint16_t closedPort() {
  FakeDnsServer s{FakeZone{}};
  return s.port();
}

v1::DnsRequest lookup(const std::string& name, v1::AddressFamily family = {}) {
  v1::DnsRequest r;
  r.mutable_lookup()->set_name(name);
  r.mutable_lookup()->set_family(family);
  return r;
}

v1::DnsRequest reverse(const std::string& address) {
  v1::DnsRequest r;
  r.mutable_reverse()->set_address(address);
  return r;
}

class ResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    zone_.a["short.pod.example"] = {"10.20.30.40"};
    zone_.a["dual.pod.example"] = {"10.5.5.5"};
    zone_.aaaa["dual.pod.example"] = {"fd00::5"};
    zone_.aaaa["v6only.example"] = {"fd00::6"};
    zone_.a["x.y"] = {"10.1.1.1"};
    zone_.a["x.y.pod.example"] = {"10.2.2.2"};
    zone_.cname["alias.pod.example"] = "short.pod.example";
    zone_.ptr["13.12.11.10.in-addr.arpa"] = {"only-in-pod.test"};
    zone_.ptr["5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa"] = {
        "dual.pod.example"};
    zone_.rcode["servfail.example"] = fakes::kRcodeServFail;
    zone_.rcode["refused.example"] = fakes::kRcodeRefused;
    zone_.rcode["sf.pod.example"] = fakes::kRcodeServFail;
    zone_.a["sf.other.example"] = {"10.3.3.3"};
    zone_.silent.insert("silent.example");
    server_ = std::make_unique<FakeDnsServer>(zone_);
    config_ = new TestConfig();
    config_->set(confFor({server_->port()}, {"pod.example", "other.example"}));
    startResolver();
  }

  void startResolver(ResolverLimits limits = {}) {
    auto r = Resolver::start(
        std::unique_ptr<DnsConfigSource>(config_),
        [this](int domain, int type, int protocol) {
          ++sockets_made_;
          return makeSocket(domain, type, protocol);
        },
        limits);
    ASSERT_TRUE(r.ok()) << r.status();
    resolver_ = *std::move(r);
  }

  static absl::StatusOr<UniqueFd> makeSocket(int domain, int type, int protocol) {
    int fd = ::socket(domain, type | SOCK_CLOEXEC | SOCK_NONBLOCK, protocol);
    if (fd < 0) return absl::InternalError("socket");
    return UniqueFd(fd);
  }

  // Sends `request` and waits for the answer.
  absl::StatusOr<v1::DnsResponse> resolve(v1::DnsRequest request) {
    auto done = std::make_shared<std::promise<absl::StatusOr<v1::DnsResponse>>>();
    auto result = done->get_future();
    resolver_->resolve(std::move(request), [done](absl::StatusOr<v1::DnsResponse> r) {
      done->set_value(std::move(r));
    });
    if (result.wait_for(kDeadline) != std::future_status::ready) {
      return absl::DeadlineExceededError("no answer from the resolver");
    }
    return result.get();
  }

  v1::DnsResponse ok(v1::DnsRequest request) {
    auto r = resolve(std::move(request));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1::DnsResponse();
  }

  FakeZone zone_;
  std::unique_ptr<FakeDnsServer> server_;
  TestConfig* config_ = nullptr;  // owned by the resolver
  std::atomic<int> sockets_made_{0};
  std::unique_ptr<Resolver> resolver_;
};

TEST_F(ResolverTest, SearchDomainExpansion) {
  v1::DnsResponse r = ok(lookup("short"));
  EXPECT_EQ(r.status(), v1::DNS_OK);
  EXPECT_THAT(r.addresses(), ElementsAre("10.20.30.40"));
  EXPECT_THAT(r.names(), ElementsAre("short.pod.example"));
  EXPECT_EQ(r.ttl(), 300u);
  EXPECT_THAT(server_->questions(),
              UnorderedElementsAre("short.pod.example/A", "short.pod.example/AAAA"));
  EXPECT_GT(sockets_made_.load(), 0) << "sockets come from the SocketFn";
}

TEST_F(ResolverTest, NdotsDecidesWhatIsTriedFirst) {
  EXPECT_THAT(ok(lookup("x.y", v1::ADDRESS_FAMILY_INET)).addresses(), ElementsAre("10.1.1.1"));
  config_->set(confFor({server_->port()}, {"pod.example", "other.example"}, 2));
  EXPECT_THAT(ok(lookup("x.y", v1::ADDRESS_FAMILY_INET)).addresses(), ElementsAre("10.2.2.2"));
  // A trailing dot: the name only, whatever ndots says.
  EXPECT_THAT(ok(lookup("x.y.", v1::ADDRESS_FAMILY_INET)).addresses(), ElementsAre("10.1.1.1"));
}

TEST_F(ResolverTest, Families) {
  v1::DnsResponse any = ok(lookup("dual.pod.example"));
  EXPECT_EQ(any.status(), v1::DNS_OK);
  EXPECT_THAT(any.addresses(), ElementsAre("10.5.5.5", "fd00::5")) << "A first";

  v1::DnsResponse v4 = ok(lookup("dual.pod.example", v1::ADDRESS_FAMILY_INET));
  EXPECT_THAT(v4.addresses(), ElementsAre("10.5.5.5"));
  v1::DnsResponse v6 = ok(lookup("dual.pod.example", v1::ADDRESS_FAMILY_INET6));
  EXPECT_THAT(v6.addresses(), ElementsAre("fd00::5"));
  EXPECT_THAT(server_->questions(), ElementsAre("dual.pod.example/A", "dual.pod.example/AAAA",
                                                "dual.pod.example/A", "dual.pod.example/AAAA"))
      << "one query type per family";

  // Only AAAA exists: a lookup of both families still answers.
  EXPECT_THAT(ok(lookup("v6only.example.")).addresses(), ElementsAre("fd00::6"));
}

TEST_F(ResolverTest, CanonicalNameThroughCname) {
  v1::DnsResponse r = ok(lookup("alias.pod.example", v1::ADDRESS_FAMILY_INET));
  EXPECT_THAT(r.addresses(), ElementsAre("10.20.30.40"));
  EXPECT_THAT(r.names(), ElementsAre("short.pod.example"));
  EXPECT_EQ(r.ttl(), 200u) << "the CNAME's TTL is smaller";
}

TEST_F(ResolverTest, NxdomainAfterTheWholeSearchList) {
  v1::DnsResponse r = ok(lookup("nosuch", v1::ADDRESS_FAMILY_INET));
  EXPECT_EQ(r.status(), v1::DNS_NXDOMAIN);
  EXPECT_THAT(r.addresses(), IsEmpty());
  EXPECT_THAT(server_->questions(),
              ElementsAre("nosuch.pod.example/A", "nosuch.other.example/A", "nosuch/A"));
}

TEST_F(ResolverTest, NodataWhenTheNameExistsWithoutThatFamily) {
  v1::DnsResponse r = ok(lookup("short.pod.example.", v1::ADDRESS_FAMILY_INET6));
  EXPECT_EQ(r.status(), v1::DNS_NODATA);
  // Across the search list NODATA wins over a later NXDOMAIN, as in glibc.
  EXPECT_EQ(ok(lookup("short", v1::ADDRESS_FAMILY_INET6)).status(), v1::DNS_NODATA);
}

TEST_F(ResolverTest, ServfailTriesTheNextNameThenIsReported) {
  EXPECT_EQ(ok(lookup("servfail.example.")).status(), v1::DNS_SERVFAIL);
  v1::DnsResponse r = ok(lookup("sf", v1::ADDRESS_FAMILY_INET));
  EXPECT_EQ(r.status(), v1::DNS_OK);
  EXPECT_THAT(r.addresses(), ElementsAre("10.3.3.3"));
  EXPECT_THAT(r.names(), ElementsAre("sf.other.example"));
}

TEST_F(ResolverTest, Refused) {
  EXPECT_EQ(ok(lookup("refused.example.")).status(), v1::DNS_REFUSED);
  EXPECT_EQ(ok(lookup("refused.example")).status(), v1::DNS_REFUSED)
      << "REFUSED ends the search: no other name is tried";
  EXPECT_THAT(server_->questions(), ElementsAre("refused.example/A", "refused.example/AAAA",
                                                "refused.example/A", "refused.example/AAAA"));
}

TEST_F(ResolverTest, TimeoutWhenTheServerIsSilent) {
  EXPECT_EQ(ok(lookup("silent.example.")).status(), v1::DNS_TIMEOUT);
}

TEST_F(ResolverTest, TimeoutWhenNothingListens) {
  config_->set(confFor({closedPort()}));
  EXPECT_EQ(ok(lookup("short.pod.example")).status(), v1::DNS_TIMEOUT);
  EXPECT_EQ(ok(reverse("10.11.12.13")).status(), v1::DNS_TIMEOUT);
}

TEST_F(ResolverTest, FailsOverToTheNextServer) {
  FakeZone refusing;
  refusing.rcode["short.pod.example"] = fakes::kRcodeRefused;
  FakeDnsServer first(refusing);
  config_->set(confFor({closedPort(), first.port(), server_->port()}));
  v1::DnsResponse r = ok(lookup("short.pod.example", v1::ADDRESS_FAMILY_INET));
  EXPECT_EQ(r.status(), v1::DNS_OK);
  EXPECT_THAT(r.addresses(), ElementsAre("10.20.30.40"));
  EXPECT_THAT(first.questions(), ElementsAre("short.pod.example/A"));

  // Every server refuses or is silent: the answer a server gave wins.
  config_->set(confFor({first.port(), closedPort()}));
  EXPECT_EQ(ok(lookup("short.pod.example", v1::ADDRESS_FAMILY_INET)).status(), v1::DNS_REFUSED);
}

TEST_F(ResolverTest, AttemptsGoRoundTheServersAgain) {
  ResolvConf c = confFor({server_->port()});
  c.attempts = 3;
  config_->set(c);
  EXPECT_EQ(ok(lookup("silent.example.", v1::ADDRESS_FAMILY_INET)).status(), v1::DNS_TIMEOUT);
  EXPECT_THAT(server_->questions(),
              ElementsAre("silent.example/A", "silent.example/A", "silent.example/A"));
  // A SERVFAIL server is not asked again within the same query.
  EXPECT_EQ(ok(lookup("servfail.example.", v1::ADDRESS_FAMILY_INET)).status(), v1::DNS_SERVFAIL);
  EXPECT_EQ(server_->questions().size(), 4u);
}

TEST_F(ResolverTest, Reverse) {
  v1::DnsResponse r = ok(reverse("10.11.12.13"));
  EXPECT_EQ(r.status(), v1::DNS_OK);
  EXPECT_THAT(r.names(), ElementsAre("only-in-pod.test"));
  EXPECT_EQ(r.ttl(), 300u);
  EXPECT_THAT(ok(reverse("fd00::5")).names(), ElementsAre("dual.pod.example"));
  EXPECT_EQ(ok(reverse("10.99.99.99")).status(), v1::DNS_NXDOMAIN);
}

TEST_F(ResolverTest, HostsFileComesFirst) {
  config_->set(confFor({server_->port()}, {"pod.example"}),
               "10.77.0.1 hosts-only.internal hostsalias\n"
               "10.77.0.2 short.pod.example\n"
               "fd00::77 hosts-only.internal\n");
  v1::DnsResponse r = ok(lookup("hostsalias"));
  EXPECT_THAT(r.addresses(), ElementsAre("10.77.0.1"));
  EXPECT_THAT(r.names(), ElementsAre("hosts-only.internal"));
  EXPECT_EQ(r.ttl(), 0u);
  EXPECT_THAT(ok(lookup("hosts-only.internal")).addresses(), ElementsAre("10.77.0.1", "fd00::77"));
  EXPECT_THAT(ok(lookup("hosts-only.internal", v1::ADDRESS_FAMILY_INET6)).addresses(),
              ElementsAre("fd00::77"));
  EXPECT_THAT(ok(lookup("short.pod.example")).addresses(), ElementsAre("10.77.0.2"));
  EXPECT_THAT(ok(reverse("10.77.0.1")).names(), ElementsAre("hosts-only.internal", "hostsalias"));
  EXPECT_THAT(server_->questions(), IsEmpty()) << "all answered from the hosts file";

  // The hosts file has no IPv6 address for it: DNS is asked.
  EXPECT_EQ(ok(lookup("short.pod.example", v1::ADDRESS_FAMILY_INET6)).status(), v1::DNS_NODATA);
}

TEST_F(ResolverTest, LiteralAddressesResolveToThemselves) {
  v1::DnsResponse r = ok(lookup("10.1.2.3"));
  EXPECT_EQ(r.status(), v1::DNS_OK);
  EXPECT_THAT(r.addresses(), ElementsAre("10.1.2.3"));
  EXPECT_EQ(ok(lookup("10.1.2.3", v1::ADDRESS_FAMILY_INET6)).status(), v1::DNS_NODATA);
  EXPECT_THAT(ok(lookup("FD00:0::1", v1::ADDRESS_FAMILY_INET6)).addresses(),
              ElementsAre("fd00::1"));
  EXPECT_THAT(server_->questions(), IsEmpty());
}

TEST_F(ResolverTest, InvalidRequests) {
  auto code = [this](v1::DnsRequest r) { return resolve(std::move(r)).status().code(); };
  EXPECT_EQ(code(lookup("")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(lookup("a..b")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(lookup(std::string(254, 'a'))), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(lookup("ok.example", static_cast<v1::AddressFamily>(99))),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(reverse("not-an-ip")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(reverse("")), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(v1::DnsRequest()), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(resolve(reverse("nope")).status().message()),
              HasSubstr("not an IPv4 or IPv6 address"));
  EXPECT_THAT(server_->questions(), IsEmpty());
}

TEST_F(ResolverTest, NewResolvConfTakesEffectAtOnce) {
  FakeZone other;
  other.a["short.pod.example"] = {"10.99.0.1"};
  FakeDnsServer second(other);
  EXPECT_THAT(ok(lookup("short.pod.example", v1::ADDRESS_FAMILY_INET)).addresses(),
              ElementsAre("10.20.30.40"));
  config_->set(confFor({second.port()}));
  EXPECT_THAT(ok(lookup("short.pod.example", v1::ADDRESS_FAMILY_INET)).addresses(),
              ElementsAre("10.99.0.1"));
}

TEST_F(ResolverTest, ManyRequestsAtOnce) {
  // 50 requests are 100 datagrams or so each way: well within the default
  // socket buffers, so none is dropped and no answer depends on a retry.
  constexpr int kCount = 50;
  ResolvConf c = confFor({server_->port()}, {"pod.example", "other.example"});
  c.timeout_ms = 5000;
  config_->set(c);
  std::vector<std::future<absl::StatusOr<v1::DnsResponse>>> results;
  for (int i = 0; i < kCount; ++i) {
    auto done = std::make_shared<std::promise<absl::StatusOr<v1::DnsResponse>>>();
    results.push_back(done->get_future());
    resolver_->resolve(
        lookup(i % 2 ? "short" : "nosuch.example."),
        [done](absl::StatusOr<v1::DnsResponse> r) { done->set_value(std::move(r)); });
  }
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(results[i].wait_for(kDeadline), std::future_status::ready);
    auto r = results[i].get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status(), i % 2 ? v1::DNS_OK : v1::DNS_NXDOMAIN) << i;
  }
}

TEST_F(ResolverTest, TooManyPendingRequests) {
  resolver_.reset();
  config_ = new TestConfig();
  ResolvConf slow = confFor({server_->port()});
  slow.timeout_ms = 30000;  // the silent query stays pending for the test
  config_->set(slow);
  startResolver(ResolverLimits{1});
  auto first = std::make_shared<std::promise<absl::StatusOr<v1::DnsResponse>>>();
  auto first_result = first->get_future();
  resolver_->resolve(lookup("silent.example."), [first](absl::StatusOr<v1::DnsResponse> r) {
    first->set_value(std::move(r));
  });
  EXPECT_EQ(resolve(lookup("short.pod.example")).status().code(),
            absl::StatusCode::kResourceExhausted);

  // Stopping the resolver answers what is pending.
  resolver_.reset();
  ASSERT_EQ(first_result.wait_for(kDeadline), std::future_status::ready);
  EXPECT_EQ(first_result.get().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ResolverTest, SocketsThatCannotBeMadeAreNoAnswer) {
  resolver_.reset();
  config_ = new TestConfig();
  config_->set(confFor({server_->port()}));
  std::atomic<int> calls{0};
  auto r = Resolver::start(std::unique_ptr<DnsConfigSource>(config_),
                           [&calls](int, int, int) -> absl::StatusOr<UniqueFd> {
                             ++calls;
                             return absl::PermissionDeniedError("no namespace");
                           });
  ASSERT_TRUE(r.ok()) << r.status();
  resolver_ = *std::move(r);
  EXPECT_EQ(ok(lookup("short.pod.example")).status(), v1::DNS_TIMEOUT);
  EXPECT_GT(calls.load(), 0);
  EXPECT_THAT(server_->questions(), IsEmpty());
}

}  // namespace
}  // namespace siphon::agent::dns
