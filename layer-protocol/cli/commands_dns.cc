// `siphon dns lookup NAME [--family 4|6]` and `siphon dns reverse IP`:
// names resolved by the agent as the target would resolve them.
//
// Text output: one address (lookup) or name (reverse) per line. --json:
//   {"name": ..., "status": "ok", "canonical_name": ..., "addresses": [...], "ttl": N}
//   {"address": ..., "status": "ok", "names": [...], "ttl": N}
// A DNS failure (NXDOMAIN, NODATA, TIMEOUT, SERVFAIL, REFUSED) is one line on
// stderr, "siphon: dns lookup NAME: NXDOMAIN", and exit code 1; with --json
// the document (with its status) is printed as well.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/format.h"
#include "cli/json_writer.h"
#include "siphon/client/dns.h"

namespace siphon::cli {
namespace {

struct DnsFlags {
  std::string name;
  std::string family;
  std::string address;
};

std::string lookupJson(const std::string& name, const client::DnsAnswer& a) {
  JsonWriter w;
  w.beginObject();
  w.key("name").value(name);
  w.key("status").value(absl::AsciiStrToLower(client::dnsResultName(a.result)));
  w.key("canonical_name").value(a.names.empty() ? std::string() : a.names.front());
  w.key("addresses").beginArray();
  for (const auto& address : a.addresses) w.value(address);
  w.endArray();
  w.key("ttl").value(a.ttl);
  w.endObject();
  return w.take();
}

std::string reverseJson(const std::string& address, const client::DnsAnswer& a) {
  JsonWriter w;
  w.beginObject();
  w.key("address").value(address);
  w.key("status").value(absl::AsciiStrToLower(client::dnsResultName(a.result)));
  w.key("names").beginArray();
  for (const auto& n : a.names) w.value(n);
  w.endArray();
  w.key("ttl").value(a.ttl);
  w.endObject();
  return w.take();
}

// Prints an answer. `what` is "dns lookup NAME"; `subject` the name or address.
int printAnswer(const CommandEnv& env, const absl::StatusOr<client::DnsAnswer>& answer,
                const std::string& what, bool reverse, const std::string& subject) {
  if (!answer.ok()) return reportFailure(what, answer.status());
  std::string out;
  if (env.json) {
    out = reverse ? reverseJson(subject, *answer) : lookupJson(subject, *answer);
  } else if (answer->ok()) {
    out = reverse ? joinLines(answer->names) : joinLines(answer->addresses);
  }
  const int rc = out.empty() ? kExitOk : printOutput(out);
  if (!answer->ok()) {
    printError(absl::StrCat(what, ": ", client::dnsResultName(answer->result)));
    return kExitError;
  }
  return rc;
}

net::awaitable<int> runLookup(const CommandEnv& env, std::shared_ptr<DnsFlags> flags) {
  const client::AddressFamily family = flags->family == "4"   ? client::AddressFamily::kIpv4
                                       : flags->family == "6" ? client::AddressFamily::kIpv6
                                                              : client::AddressFamily::kAny;
  client::Dns dns(env.target);
  auto answer = co_await dns.lookup(flags->name, family);
  co_return printAnswer(env, answer, absl::StrCat("dns lookup ", flags->name), false, flags->name);
}

net::awaitable<int> runReverse(const CommandEnv& env, std::shared_ptr<DnsFlags> flags) {
  client::Dns dns(env.target);
  auto answer = co_await dns.reverse(flags->address);
  co_return printAnswer(env, answer, absl::StrCat("dns reverse ", flags->address), true,
                        flags->address);
}

}  // namespace

void addDnsCommands(CLI::App& app, std::vector<Command>& out) {
  CLI::App* dns = app.add_subcommand(
      "dns", "Resolve names as the target resolves them (its resolv.conf, hosts file and network)");
  dns->require_subcommand(1);

  auto flags = std::make_shared<DnsFlags>();

  CLI::App* lookup = dns->add_subcommand(
      "lookup", "Addresses of NAME (search domains and ndots applied, /etc/hosts first)");
  lookup->add_option("NAME", flags->name, "Name to resolve")->required();
  lookup->add_option("--family", flags->family, "4 (A) or 6 (AAAA); both when not given")
      ->check(CLI::IsMember({"4", "6"}));
  // Plain lambdas: the coroutines are free functions with by-value
  // parameters (GCC 12 and lambda coroutines, cli/command.h).
  out.push_back({lookup, [flags](const CommandEnv& env) { return runLookup(env, flags); }});

  CLI::App* reverse =
      dns->add_subcommand("reverse", "Names of the address IP (/etc/hosts first, then PTR)");
  reverse->add_option("IP", flags->address, "IPv4 or IPv6 address")->required();
  out.push_back({reverse, [flags](const CommandEnv& env) { return runReverse(env, flags); }});
}

}  // namespace siphon::cli
