// The target's /etc/hosts, consulted before DNS as the target's nsswitch
// "hosts: files dns" does (glibc nss_files). Pure: text in, answers out.
//
// c-ares would read the agent's own /etc/hosts; the channel is told to use
// DNS only (lookups "b") and this class answers from the target's file.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/dns/dns_names.h"

namespace siphon::agent::dns {

class HostsFile {
 public:
  struct Entry {
    IpAddress address;
    std::vector<std::string> names;  // canonical name first, then aliases
  };

  struct Match {
    std::string canonical;               // of the first matching line
    std::vector<std::string> addresses;  // every matching line, in file order
  };

  // One entry per line "ADDRESS NAME [ALIAS...]"; '#' starts a comment
  // anywhere. Lines whose address is not an IPv4 or IPv6 literal, or that
  // have no name, are skipped.
  static HostsFile parse(std::string_view text);

  // Every address of the lines naming `name` (canonical name or alias, case
  // insensitive) whose family `family` accepts; nullopt when there is none,
  // so the caller asks DNS (nss_files says NOTFOUND then).
  std::optional<Match> lookup(std::string_view name, Family family) const;

  // The names of the first line with `address`; nullopt when none has it.
  std::optional<std::vector<std::string>> reverse(const IpAddress& address) const;

  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

}  // namespace siphon::agent::dns
