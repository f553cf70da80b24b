// The typed DNS and env APIs (siphon/client/dns.h, env.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/target_core.h"
#include "siphon/client/dns.h"
#include "siphon/client/env.h"
#include "siphon/status.h"

namespace siphon::client {

namespace {

DnsResult resultOf(v1::DnsStatus s) {
  switch (s) {
    case v1::DNS_OK:
      return DnsResult::kOk;
    case v1::DNS_NXDOMAIN:
      return DnsResult::kNxDomain;
    case v1::DNS_NODATA:
      return DnsResult::kNoData;
    case v1::DNS_TIMEOUT:
      return DnsResult::kTimeout;
    case v1::DNS_SERVFAIL:
      return DnsResult::kServFail;
    case v1::DNS_REFUSED:
      return DnsResult::kRefused;
    default:
      return DnsResult::kUnknown;
  }
}

net::awaitable<absl::StatusOr<DnsAnswer>> dnsCall(std::shared_ptr<TargetCore> core_in,
                                                  v1::DnsRequest dns) {
  const std::shared_ptr<TargetCore> core = std::move(core_in);
  v1::Request request;
  *request.mutable_dns() = std::move(dns);
  auto r = co_await core->call(std::move(request));
  if (!r.ok()) co_return r.status();
  if (!r->has_dns()) co_return wrongKind("dns");
  const v1::DnsResponse& d = r->dns();
  DnsAnswer out;
  out.result = resultOf(d.status());
  out.addresses.assign(d.addresses().begin(), d.addresses().end());
  out.names.assign(d.names().begin(), d.names().end());
  out.ttl = d.ttl();
  co_return out;
}

}  // namespace

std::string dnsResultName(DnsResult result) {
  switch (result) {
    case DnsResult::kOk:
      return "OK";
    case DnsResult::kNxDomain:
      return "NXDOMAIN";
    case DnsResult::kNoData:
      return "NODATA";
    case DnsResult::kTimeout:
      return "TIMEOUT";
    case DnsResult::kServFail:
      return "SERVFAIL";
    case DnsResult::kRefused:
      return "REFUSED";
    case DnsResult::kUnknown:
      break;
  }
  return "UNKNOWN";
}

Dns::Dns(const Target& target) : core_(target.core()) {}

net::awaitable<absl::StatusOr<DnsAnswer>> Dns::lookup(std::string name, AddressFamily family) {
  v1::DnsRequest dns;
  dns.mutable_lookup()->set_name(std::move(name));
  dns.mutable_lookup()->set_family(family == AddressFamily::kIpv4 ? v1::ADDRESS_FAMILY_INET
                                   : family == AddressFamily::kIpv6
                                       ? v1::ADDRESS_FAMILY_INET6
                                       : v1::ADDRESS_FAMILY_UNSPECIFIED);
  co_return co_await dnsCall(core_, std::move(dns));
}

net::awaitable<absl::StatusOr<DnsAnswer>> Dns::reverse(std::string address) {
  v1::DnsRequest dns;
  dns.mutable_reverse()->set_address(std::move(address));
  co_return co_await dnsCall(core_, std::move(dns));
}

Env::Env(const Target& target) : core_(target.core()) {}

net::awaitable<absl::StatusOr<std::vector<EnvVar>>> Env::get(std::vector<std::string> include,
                                                             std::vector<std::string> exclude) {
  const std::shared_ptr<TargetCore> core = core_;
  v1::Request request;
  v1::EnvRequest* env = request.mutable_env();
  for (auto& g : include) env->add_include(std::move(g));
  for (auto& g : exclude) env->add_exclude(std::move(g));
  auto r = co_await core->call(std::move(request));
  if (!r.ok()) co_return r.status();
  if (!r->has_env()) co_return wrongKind("env");
  std::vector<EnvVar> out;
  for (const v1::EnvVar& v : r->env().vars()) out.push_back({v.name(), v.value()});
  // The agent sends them sorted; sorting here keeps the promise whatever
  // the agent does (stable: a name twice keeps the agent's order).
  std::stable_sort(out.begin(), out.end(),
                   [](const EnvVar& a, const EnvVar& b) { return a.name < b.name; });
  co_return out;
}

net::awaitable<absl::StatusOr<std::string>> Env::value(std::string name) {
  // fnmatch: escape the pattern characters, so only `name` itself matches.
  std::string pattern;
  for (char c : name) {
    if (c == '*' || c == '?' || c == '[' || c == '\\') pattern.push_back('\\');
    pattern.push_back(c);
  }
  std::vector<std::string> include;
  include.push_back(std::move(pattern));
  auto vars = co_await get(std::move(include), std::vector<std::string>());
  if (!vars.ok()) co_return vars.status();
  for (auto& v : *vars) {
    if (v.name == name) {
      std::string value = std::move(v.value);
      co_return value;
    }
  }
  co_return protoError(v1::NOT_FOUND, absl::StrCat("the target has no variable ", name));
}

}  // namespace siphon::client
