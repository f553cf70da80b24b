// `siphon dns lookup NAME [--family 4|6]` and `siphon dns reverse IP`:
// names resolved by the agent as the target would resolve them.
//
// Text output: one address (lookup) or name (reverse) per line. --json:
//   {"name": ..., "status": "ok", "canonical_name": ..., "addresses": [...], "ttl": N}
//   {"address": ..., "status": "ok", "names": [...], "ttl": N}
// A DNS failure (NXDOMAIN, NODATA, TIMEOUT, SERVFAIL, REFUSED) is one line on
// stderr, "siphon: dns lookup NAME: NXDOMAIN", and exit code 1; with --json
// the document (with its status) is printed as well.
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/json_writer.h"
#include "siphon/status.h"

namespace siphon::cli {
namespace {

// "NXDOMAIN" for DNS_NXDOMAIN; "OK" for DNS_OK.
std::string statusName(v1::DnsStatus status) {
  if (!v1::DnsStatus_IsValid(status) || status == v1::DNS_STATUS_UNSPECIFIED) {
    return absl::StrCat("UNKNOWN_", static_cast<int>(status));
  }
  std::string name = v1::DnsStatus_Name(status);
  constexpr std::string_view kPrefix = "DNS_";
  if (name.compare(0, kPrefix.size(), kPrefix) == 0) name.erase(0, kPrefix.size());
  return name;
}

std::string lines(const google::protobuf::RepeatedPtrField<std::string>& items) {
  std::string out;
  for (const auto& i : items) absl::StrAppend(&out, i, "\n");
  return out;
}

std::string lookupJson(const std::string& name, const v1::DnsResponse& r) {
  JsonWriter w;
  w.beginObject();
  w.key("name").value(name);
  w.key("status").value(absl::AsciiStrToLower(statusName(r.status())));
  w.key("canonical_name").value(r.names_size() > 0 ? r.names(0) : std::string());
  w.key("addresses").beginArray();
  for (const auto& a : r.addresses()) w.value(a);
  w.endArray();
  w.key("ttl").value(r.ttl());
  w.endObject();
  return w.take();
}

std::string reverseJson(const std::string& address, const v1::DnsResponse& r) {
  JsonWriter w;
  w.beginObject();
  w.key("address").value(address);
  w.key("status").value(absl::AsciiStrToLower(statusName(r.status())));
  w.key("names").beginArray();
  for (const auto& n : r.names()) w.value(n);
  w.endArray();
  w.key("ttl").value(r.ttl());
  w.endObject();
  return w.take();
}

// Sends the request and prints its answer. `what` is "dns lookup NAME".
net::awaitable<int> runDns(const CommandEnv& env, v1::Request req, std::string what, bool reverse,
                           std::string subject) {
  int rc = kExitOk;
  auto r = co_await callOrReport(env, std::move(req), what, &rc);
  if (!r.ok()) co_return rc;
  if (!r->has_dns()) {
    printError(absl::StrCat(what, " failed: the agent answered with another kind of response"));
    co_return kExitError;
  }
  const v1::DnsResponse& dns = r->dns();
  const bool ok = dns.status() == v1::DNS_OK;
  std::string out;
  if (env.json) {
    out = reverse ? reverseJson(subject, dns) : lookupJson(subject, dns);
  } else if (ok) {
    out = reverse ? lines(dns.names()) : lines(dns.addresses());
  }
  rc = out.empty() ? kExitOk : printOutput(out);
  if (!ok) {
    printError(absl::StrCat(what, ": ", statusName(dns.status())));
    co_return kExitError;
  }
  co_return rc;
}

}  // namespace

void addDnsCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* dns = app.add_subcommand(
      "dns", "Resolve names as the target resolves them (its resolv.conf, hosts file and network)");
  dns->require_subcommand(1);

  struct Flags {
    std::string name;
    std::string family;
    std::string address;
  };
  auto flags = std::make_shared<Flags>();

  CLI::App* lookup = dns->add_subcommand(
      "lookup", "Addresses of NAME (search domains and ndots applied, /etc/hosts first)");
  lookup->add_option("NAME", flags->name, "Name to resolve")->required();
  lookup->add_option("--family", flags->family, "4 (A) or 6 (AAAA); both when not given")
      ->check(CLI::IsMember({"4", "6"}));
  out.push_back({lookup, [flags](const CommandEnv& env) -> net::awaitable<int> {
                   v1::Request req;
                   auto* l = req.mutable_dns()->mutable_lookup();
                   l->set_name(flags->name);
                   if (flags->family == "4") l->set_family(v1::ADDRESS_FAMILY_INET);
                   if (flags->family == "6") l->set_family(v1::ADDRESS_FAMILY_INET6);
                   co_return co_await runDns(env, std::move(req),
                                             absl::StrCat("dns lookup ", flags->name), false,
                                             flags->name);
                 }});

  CLI::App* reverse =
      dns->add_subcommand("reverse", "Names of the address IP (/etc/hosts first, then PTR)");
  reverse->add_option("IP", flags->address, "IPv4 or IPv6 address")->required();
  out.push_back({reverse, [flags](const CommandEnv& env) -> net::awaitable<int> {
                   v1::Request req;
                   req.mutable_dns()->mutable_reverse()->set_address(flags->address);
                   co_return co_await runDns(env, std::move(req),
                                             absl::StrCat("dns reverse ", flags->address), true,
                                             flags->address);
                 }});
}

}  // namespace siphon::cli
